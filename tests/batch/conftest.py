"""Fixtures shared by the batch tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def long_ca_dcd(tmp_path_factory, datasets):
    """adk_dims.dcd's CA atoms repeated 20 times: 1,960 frames in one DCD, and its CA topology."""
    md = pytest.importorskip("mdtraj")
    d = tmp_path_factory.mktemp("long")
    t = md.load(str(datasets / "adk_dims.dcd"), top=str(datasets / "adk_open.pdb"))
    t = t.atom_slice(t.topology.select("name CA"))
    for a in t.topology.atoms:  # adk_open.pdb has no element column: mdtraj would guess calcium
        a.element = md.element.carbon
    t[0].save_pdb(str(d / "ca.pdb"))
    md.join([t] * 20).save_dcd(str(d / "long.dcd"))
    return d / "long.dcd", d / "ca.pdb"
