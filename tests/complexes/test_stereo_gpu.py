"""Stereochecked lDDT and interface lDDT on the GPU against the CPU: models of one atom table whose
stereochecks remove different atoms (each row of the batch its own missing atoms on the device), and
1eud's OpenStructure values (lddt 0.539, ilddt 0.282)."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg
from protgpu.complexes import stereo
from protgpu.complexes._cleanup import clean

pytestmark = pytest.mark.gpu


def test_stereochecked_lddt_gpu_matches_cpu(gpu, datasets):
    d = datasets / "openstructure"
    model = clean(pg.load(d / "1eud_mdl_partial-dimer.pdb"))
    x0 = model.coords[0].astype(np.float64)
    xs = np.stack([x0] + [x0 + np.random.default_rng(k).normal(0, 0.05, x0.shape) for k in (1, 2, 3)])
    assert len({stereo.stereo_drop(model, x).tobytes() for x in xs}) == 4  # every row removes others
    stack = pg.Structure(xs.astype(np.float32), model.atoms, source="noisy")
    cpu = pg.score_complex(stack, d / "1eud_ref.pdb", metrics=("lddt", "bb_lddt", "ilddt"), device="cpu")
    dev = pg.score_complex(stack, d / "1eud_ref.pdb", metrics=("lddt", "bb_lddt", "ilddt"), device="gpu")
    for col in ("lddt", "bb_lddt", "ilddt"):
        np.testing.assert_allclose(dev[col], cpu[col], rtol=0, atol=1e-4, err_msg=col)
    assert round(float(dev["lddt"][0]), 3) == 0.539 and round(float(dev["ilddt"][0]), 3) == 0.282
