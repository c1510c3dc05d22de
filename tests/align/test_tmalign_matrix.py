"""pg.tm_align_matrix against per-pair pg.tm_align: values and both normalisations, the diagonal,
out= (np.memmap, float64), tiling independence, bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg
from protgpu.align.chains import one_chain
from protgpu.errors import InputError

SMALL = ("d1t3ba2.pdb", "d2nwta1.pdb", "d2a6ca1.pdb", "d1neqa_.pdb")  # 61-76 residues: fast pairs


@pytest.fixture(scope="module")
def paths(datasets):
    return [str(datasets / "tmalign" / f) for f in SMALL]


@pytest.fixture(scope="module")
def reference(paths):
    """Per pair i < j: pg.tm_align(i, j) one pair at a time."""
    return {(i, j): pg.tm_align(paths[i], paths[j], device="cpu")
            for i in range(len(paths)) for j in range(i + 1, len(paths))}


@pytest.fixture(scope="module")
def matrix(paths):
    return pg.tm_align_matrix(paths, device="cpu")


def test_matrix_is_tm_align_of_each_pair_both_normalisations(matrix, reference):
    n = len(SMALL)
    assert matrix.shape == (n, n) and matrix.dtype == np.float32
    np.testing.assert_array_equal(np.diag(matrix), np.ones(n))
    for (i, j), r in reference.items():
        # M[i, j]: normalised by chain j (the column) = TM-align's first score with i as Chain_1
        assert matrix[i, j] == pytest.approx(float(r.tm_target[0]), abs=1e-7)
        assert matrix[j, i] == pytest.approx(float(r.tm_mobile[0]), abs=1e-7)
    assert not np.allclose(matrix, matrix.T)  # chains of different lengths: not symmetric


def test_out_memmap_and_tiling_do_not_change_values(tmp_path, paths, matrix, reference):
    mm = np.lib.format.open_memmap(tmp_path / "tm.npy", mode="w+", dtype=np.float64, shape=(4, 4))
    got = pg.tm_align_matrix(paths, out=mm, device="cpu", tile=3)  # a diagonal and off-diagonal tiles
    assert got is mm
    mm.flush()
    back = np.load(tmp_path / "tm.npy")
    for (i, j), r in reference.items():
        assert back[i, j] == float(r.tm_target[0]) and back[j, i] == float(r.tm_mobile[0])
    for tile in (1, 2):
        np.testing.assert_array_equal(pg.tm_align_matrix(paths, device="cpu", tile=tile), matrix)


def test_chains_read_once_and_chain_objects_pass_through(paths, matrix, monkeypatch):
    import protgpu.align.chains as chains_mod

    chains = [one_chain(p, p) for p in paths]
    calls = []
    real = chains_mod._structure_chains
    monkeypatch.setattr(chains_mod, "_structure_chains", lambda *a, **k: calls.append(1) or real(*a, **k))
    np.testing.assert_array_equal(pg.tm_align_matrix(chains, device="cpu", tile=2), matrix)
    assert calls == []  # Chain objects are taken as they are: no file is read again


def test_single_chain_and_array_traces():
    t = np.linspace(0, 6 * np.pi, 40)
    helix = np.stack([2.3 * np.cos(t), 2.3 * np.sin(t), 1.5 * t], axis=1)
    np.testing.assert_array_equal(pg.tm_align_matrix([helix], device="cpu"), [[1.0]])
    m = pg.tm_align_matrix(np.stack([helix, helix + 3.0]), device="cpu")
    np.testing.assert_allclose(m, np.ones((2, 2)), atol=1e-12)


@pytest.mark.parametrize("kwargs, words", [
    ({"out": np.zeros((3, 3))}, "needs (2, 2)"),
    ({"out": np.zeros((2, 2), np.int32)}, "float32 or float64"),
    ({"out": [[0, 0], [0, 0]]}, "array-like"),
    ({"tile": 0}, "tile must be"),
    ({"device": "tpu"}, "device must be"),
])
def test_bad_arguments_are_one_line(kwargs, words):
    t = np.linspace(0, 4 * np.pi, 20)
    helix = np.stack([2.3 * np.cos(t), 2.3 * np.sin(t), 1.5 * t], axis=1)
    with pytest.raises(InputError, match=None) as e:
        pg.tm_align_matrix([helix, helix], **kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)
