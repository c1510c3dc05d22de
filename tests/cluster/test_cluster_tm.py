"""metric="tm": 1 - TM-score rows between the frames of a trajectory, against the twins on the full matrix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.cluster.hierarchy import linkage
from scipy.spatial.distance import squareform

import protgpu as pg
from protgpu.cluster import gromos
from protgpu.errors import InputError

DATA = Path(__file__).resolve().parents[2] / "datasets"


@pytest.fixture(scope="module")
def adk():
    traj = pg.load(DATA / "adk_dims.dcd", top=DATA / "adk_closed.pdb")
    frames = traj.frames(np.arange(0, 98, 7))  # 14 frames along the closing transition
    ca = np.flatnonzero(frames.atoms.name == "CA")
    x = np.ascontiguousarray(frames.coords[:, ca], dtype=np.float64)
    d = np.stack([1.0 - np.asarray(pg.tm_score(x, x[i], device="cpu").tm) for i in range(len(x))])
    np.fill_diagonal(d, 0.0)
    return frames, x, d


def test_tm_rows_symmetric(adk):
    _, _, d = adk
    assert d.shape == (14, 14) and d.max() > 0.05  # the frames differ
    np.testing.assert_allclose(d, d.T, atol=1e-12)  # TM-score of equal lengths is the same either way round


@pytest.mark.parametrize("cutoff", [0.02, 0.05, 0.1])
def test_tm_gromos_equals_twin(adk, cutoff):
    frames, x, d = adk
    lab0, cen0 = gromos.gromos_numpy(d, cutoff)
    for inp in (frames, x):  # a Structure (its CA atoms) and a CA array
        c = pg.cluster(inp, metric="tm", cutoff=cutoff, device="cpu")
        assert c.labels.tolist() == lab0.tolist() and c.medoids.tolist() == cen0.tolist()


def test_tm_hierarchical_equals_scipy(adk):
    _, x, d = adk
    c = pg.cluster(x, metric="tm", method="hierarchical", linkage="average", k=3, device="cpu")
    z = linkage(squareform(d, checks=False), method="average")
    np.testing.assert_allclose(c.linkage, z, atol=1e-12)
    assert len(c.sizes) == 3


def test_tm_too_few_residues():
    with pytest.raises(InputError, match="at least 5 residues"):
        pg.cluster(np.random.default_rng(0).normal(size=(6, 4, 3)), metric="tm", cutoff=0.5, device="cpu")
