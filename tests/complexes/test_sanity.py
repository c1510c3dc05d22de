"""Design sanity metrics: clashes counted against brute force on a real complex with planted
overlaps, radius of gyration against its formula, interface counts against pg.contacts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import protgpu as pg
from protgpu.complexes import design_sanity
from protgpu.errors import InputError
from protgpu.structure import Structure

DATA = Path(__file__).resolve().parents[2] / "datasets"


@pytest.fixture(scope="module")
def dimer():
    return pg.load(DATA / "openstructure" / "1eud_ref.pdb")


def _brute_clashes(s, cutoff):
    a = s.atoms
    heavy = np.flatnonzero((a.element != "H") & ~np.isin(a.resname, ["HOH", "WAT"]))
    x = s.coords[0][heavy].astype(np.float64)
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    intra = inter = 0
    for i, j in zip(*np.nonzero(np.triu(d < cutoff, 1)), strict=True):
        ai, aj = heavy[i], heavy[j]
        same = a.chain[ai] == a.chain[aj]
        if same and abs(int(a.residue_index[ai]) - int(a.residue_index[aj])) <= 1:
            continue
        if a.name[ai] == "SG" and a.name[aj] == "SG":
            continue
        intra += same
        inter += not same
    return intra, inter


def test_planted_clashes_counted(dimer):
    s = dimer.select("chain A B and resid 1-60")  # small enough for the brute force
    x = s.coords.copy()
    a = s.atoms
    # move a chain B atom onto a chain A atom (inter) and a chain A atom near a far one (intra)
    ia = np.flatnonzero((a.chain == "A") & (a.name == "CA"))
    ib = np.flatnonzero((a.chain == "B") & (a.name == "CA"))
    x[0, ib[5]] = x[0, ia[10]] + [1.0, 0, 0]
    x[0, ia[40]] = x[0, ia[3]] + [0, 1.5, 0]
    s2 = Structure(x, a, source="planted")
    m = design_sanity(s2, clash_cutoff=2.2)
    intra, inter = _brute_clashes(s2, 2.2)
    assert (m["clashes_intra"], m["clashes_inter"]) == (intra, inter)
    assert m["clashes"] == intra + inter and inter >= 1 and intra >= 1
    assert design_sanity(s)["clashes"] == sum(_brute_clashes(s, 2.2))


def test_counts_rg_and_interface(dimer):
    m = design_sanity(dimer, interface_cutoff=5.0)
    a = dimer.atoms
    heavy = (a.element != "H") & ~np.isin(a.resname, ["HOH", "WAT"])
    x = dimer.coords[0][heavy].astype(np.float64)
    assert m["radius_of_gyration"] == pytest.approx(np.sqrt(((x - x.mean(0)) ** 2).sum(1).mean()))
    res = dimer.residues
    for c, n in m["chain_residues"].items():
        assert n == len(np.unique(a.residue_index[heavy & (a.chain == c)]))
    cm = pg.contacts(dimer.select(np.flatnonzero(heavy)), scheme="closest-heavy", cutoff=5.0, min_separation=1,
                     residues="all", device="cpu")
    sub_chain = dimer.select(np.flatnonzero(heavy)).residues.chain
    between = cm.contacts[0] & (sub_chain[:, None] != sub_chain[None, :])
    assert m["interface_contacts"] == int(np.triu(between).sum())
    assert m["n_interface_residues"] == int(between.any(axis=1).sum())
    assert 0 < m["buried_interface_contacts"] <= m["interface_contacts"]
    assert m["n_chains"] == len(set(res.chain[~np.isin(res.resname, ["HOH", "WAT"])].tolist()))


def test_bad_arguments_one_line(dimer):
    with pytest.raises(InputError, match="must be positive"):
        design_sanity(dimer, clash_cutoff=0)
    with pytest.raises(InputError, match="frame 3 out of range"):
        design_sanity(dimer, frame=3)
