"""Fixtures of the complexes tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def eud(datasets):
    """OpenStructure's 1eud pair: (model path, reference path)."""
    d = datasets / "openstructure"
    return d / "1eud_mdl_partial-dimer.pdb", d / "1eud_ref.pdb"
