"""The compiled CPU scoring paths are optional: an installed numba that cannot be imported turns them off
with one warning, and the scores are the NumPy twins' (runs with or without numba installed)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import protgpu as pg
from protgpu.scoring import _fast


def test_a_numba_that_fails_to_import_falls_back_to_numpy(monkeypatch, datasets):
    model, ref = pg.load(datasets / "adk_open.pdb"), pg.load(datasets / "adk_closed.pdb")
    monkeypatch.setattr(_fast, "ENABLED", False)
    want_tm, want_lddt = pg.tm_score(model, ref, device="cpu").tm, pg.lddt(model, ref, device="cpu")
    monkeypatch.setattr(_fast, "ENABLED", True)
    monkeypatch.setattr(_fast, "AVAILABLE", True)
    monkeypatch.setattr(_fast, "_IMPORTABLE", None)
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba -> ImportError, as a broken install
    with pytest.warns(UserWarning, match="numba is installed but cannot be imported"):
        assert not _fast.enabled()
    np.testing.assert_array_equal(pg.tm_score(model, ref, device="cpu").tm, want_tm)
    np.testing.assert_array_equal(pg.lddt(model, ref, device="cpu"), want_lddt)
