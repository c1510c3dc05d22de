"""Tests of protgpu.structure: the Structure container, the atom/residue tables and selections."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protgpu.errors import InputError
from protgpu.io import load
from protgpu.structure import AtomTable, Structure, guess_elements, standardize_resnames

REPO = Path(__file__).resolve().parents[2]
ADK = REPO / "datasets" / "adk_open.pdb"


@pytest.fixture(scope="module")
def adk() -> Structure:
    return load(ADK)


def _table(n: int, **overrides) -> AtomTable:
    fields = dict(
        name=np.array(["N", "CA", "C", "O", "CB"] * (n // 5) + ["X"] * (n % 5)),
        element=np.array(["N", "C", "C", "O", "C"] * (n // 5) + ["X"] * (n % 5)),
        resname=np.full(n, "ALA"),
        resid=np.repeat(np.arange(n // 5 + 1), 5)[:n] + 1,
        icode=np.full(n, ""),
        chain=np.full(n, "A"),
        segid=np.full(n, ""),
        hetero=np.zeros(n, bool),
    )
    fields.update(overrides)
    return AtomTable(**fields)


# ----------------------------------------------------------------------------------------------------
# Structure construction and validation
# ----------------------------------------------------------------------------------------------------


def test_coords_become_float32_contiguous_frames():
    s = Structure(np.arange(30, dtype=np.float64).reshape(10, 3), _table(10), source="t")
    assert s.coords.shape == (1, 10, 3)
    assert s.coords.dtype == np.float32 and s.coords.flags.c_contiguous
    assert (s.n_frames, s.n_atoms, s.n_residues) == (1, 10, 2)


def test_no_copy_when_already_float32():
    x = np.zeros((2, 10, 3), np.float32)
    assert Structure(x, _table(10)).coords is x


def test_atom_count_mismatch():
    with pytest.raises(InputError, match=r"t\.pdb: 4 atoms in the coordinates but 10"):
        Structure(np.zeros((4, 3)), _table(10), source="t.pdb")


def test_wrong_shape():
    with pytest.raises(InputError, match="shape"):
        Structure(np.zeros((2, 10, 2)), _table(10), source="t")


def test_nonfinite_names_source_frame_and_atom():
    x = np.zeros((3, 10, 3))
    x[2, 7, 1] = np.nan
    x[2, 8, 0] = np.inf
    with pytest.raises(InputError, match=r"bad\.pdb: NaN or infinite coordinates in frame 2 \(atom 7\)"):
        Structure(x, _table(10), source="bad.pdb")


def test_overflow_to_float32_inf_is_caught():
    x = np.zeros((10, 3))
    x[0, 0] = 1e300
    with pytest.raises(InputError, match="NaN or infinite coordinates in frame 0 \\(atom 0\\)"):
        Structure(x, _table(10))


def test_box_and_time_shapes():
    t = _table(5)
    s = Structure(np.zeros((2, 5, 3)), t, box=np.eye(3) * 10, time=[0.0, 2.0])
    assert s.box.shape == (2, 3, 3) and s.box.dtype == np.float32
    s = Structure(np.zeros((2, 5, 3)), t, box=[10, 20, 30])
    np.testing.assert_allclose(s.box[1], np.diag([10, 20, 30]))
    s = Structure(np.zeros((2, 5, 3)), t, box=[[10, 20, 30], [11, 21, 31]])
    np.testing.assert_allclose(s.box[1], np.diag([11, 21, 31]))
    with pytest.raises(InputError, match="box"):
        Structure(np.zeros((2, 5, 3)), t, box=np.zeros((3, 3, 3)))
    with pytest.raises(InputError, match="time"):
        Structure(np.zeros((2, 5, 3)), t, time=[1.0])


def test_from_coords():
    s = Structure.from_coords(np.ones((4, 6, 3)), source="arr")
    assert (s.n_frames, s.n_atoms, s.n_residues) == (4, 6, 6)
    assert set(s.atoms.name) == {"X"} and set(s.atoms.chain) == {"A"} and set(s.atoms.resname) == {"UNK"}
    assert s.select("index 1-2").n_atoms == 2
    assert repr(s) == "<Structure arr: 4 frames, 6 atoms, 6 residues>"


def test_repr_and_sizes(adk):
    assert repr(adk) == "<Structure adk_open.pdb: 1 frame, 3341 atoms, 214 residues>"
    assert adk.atom_residue is adk.atoms.residue_index


def test_residue_table(adk):
    res = adk.residues
    assert len(res) == 214
    assert res.atom_count.sum() == adk.n_atoms
    np.testing.assert_array_equal(res.atom_start[1:], np.cumsum(res.atom_count)[:-1])
    assert res.resname[0] == "MET" and res.resid[0] == 1
    labels = res.labels()
    # blank chain: the segid (4AKE) prefixes the label
    assert labels[0] == "4AKE:MET1" and len(labels) == 214
    assert "HSD" in set(res.resname) and "HSD" not in set(res.std_resname)


def test_labels_with_chain_and_icode():
    t = AtomTable.build(["CA", "CA"], ["LYS", "GLY"], [12, 12], ["A", "A"], icode=["", "B"])
    s = Structure(np.zeros((2, 3)), t)
    assert s.residues.labels() == ["A:LYS12", "A:GLY12B"]


def test_residue_index_rule():
    # new residue when chain, resid, icode or resname changes
    t = AtomTable.build(
        name=["N", "CA", "N", "N", "N", "N"],
        resname=["ALA", "ALA", "GLY", "GLY", "GLY", "GLY"],
        resid=[1, 1, 1, 2, 2, 2],
        chain=["A", "A", "A", "A", "A", "B"],
        icode=["", "", "", "", "A", ""],
    )
    np.testing.assert_array_equal(t.residue_index, [0, 0, 1, 2, 3, 4])


def test_std_resname():
    names = np.array(["HSD", "HIE", "CYX", "MSE", "ALA", "ASH", "GLH", "LYN", "HOH", "HISE"])
    np.testing.assert_array_equal(
        standardize_resnames(names), ["HIS", "HIS", "CYS", "MET", "ALA", "ASP", "GLU", "LYS", "HOH", "HIS"]
    )


@pytest.mark.parametrize(
    ("name", "resname", "element"),
    [
        (" CA ", "ALA", "C"),
        ("CA  ", "CA", "CA"),
        ("HG12", "ILE", "H"),
        ("1HB ", "ALA", "H"),
        ("SE  ", "MSE", "SE"),
        ("ZN  ", "ZN", "ZN"),
        ("FE  ", "HEM", "FE"),
        (" C1 ", "HEM", "C"),
        ("CL  ", "CL", "CL"),
        ("SOD ", "SOD", "NA"),
        (" OW ", "SOL", "O"),
        ("HW1 ", "SOL", "H"),
    ],
)
def test_guess_elements(name, resname, element):
    assert guess_elements(np.array([name]), np.array([resname]))[0] == element


def test_atom_table_equality_and_take(adk):
    assert adk.atoms == load(ADK).atoms
    sub = adk.atoms.take(np.arange(10, 20))
    assert len(sub) == 10 and sub.residue_index[0] == 0
    assert sub != adk.atoms


def test_atom_table_validation():
    with pytest.raises(InputError, match="resname"):
        AtomTable.build(["CA", "CB"], ["ALA"], [1, 1], ["A", "A"])


# ----------------------------------------------------------------------------------------------------
# Frames
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def traj() -> Structure:
    rng = np.random.default_rng(0)
    return Structure(rng.normal(size=(6, 10, 3)), _table(10), source="traj", box=np.eye(3), time=np.arange(6.0))


def test_frame_indexing(traj):
    assert traj[2].n_frames == 1
    np.testing.assert_array_equal(traj[-1].coords[0], traj.coords[5])
    assert traj[1:4].n_frames == 3 and traj[1:4].time.tolist() == [1, 2, 3]
    assert traj[[0, 5]].box.shape == (2, 3, 3)
    mask = np.array([True, False, True, False, False, False])
    np.testing.assert_array_equal(traj.frames(mask).time, [0, 2])
    assert traj.frames(np.int64(3)).time.tolist() == [3.0]


def test_frame_errors(traj):
    with pytest.raises(InputError, match="traj: frame 6 out of range"):
        traj[6]
    with pytest.raises(InputError, match="selects no frames"):
        traj[3:3]
    with pytest.raises(InputError, match="mask"):
        traj.frames(np.ones(2, bool))
    with pytest.raises(InputError):
        traj.frames([0, 99])


def test_copy_is_independent(traj):
    c = traj.copy()
    c.coords[0, 0, 0] = 1e3
    assert traj.coords[0, 0, 0] != 1e3
    assert c.atoms is traj.atoms


# ----------------------------------------------------------------------------------------------------
# Selections
# ----------------------------------------------------------------------------------------------------


def test_keyword_counts_adk(adk):
    a = adk.atoms
    is_h = np.char.startswith(a.name, "H")  # CHARMM naming: every hydrogen name starts with H
    assert adk.select("ca").n_atoms == 214
    # CHARMM names the C-terminal oxygens OT1/OT2, so the last residue has no "O"
    assert adk.select("backbone").n_atoms == 4 * 214 - 1
    assert adk.select("heavy").n_atoms == int((~is_h).sum())
    assert adk.select("hydrogen").n_atoms == int(is_h.sum())
    assert adk.select("protein").n_atoms == adk.n_atoms
    assert adk.select_indices("water").size == 0
    assert adk.select_indices("hetero").size == 0
    assert adk.select("all").n_atoms == adk.n_atoms
    assert adk.select_indices("none").size == 0


def test_value_keywords(adk):
    a = adk.atoms
    r1 = adk.select_indices("resid 10-50")
    np.testing.assert_array_equal(r1, np.flatnonzero((a.resid >= 10) & (a.resid <= 50)))
    np.testing.assert_array_equal(r1, adk.select_indices("resid 10:50"))
    np.testing.assert_array_equal(r1, adk.select_indices("resid 10 to 50"))
    np.testing.assert_array_equal(r1, adk.select_indices("RESID 10 - 50"))
    np.testing.assert_array_equal(adk.select_indices("resid 5 7 9"), np.flatnonzero(np.isin(a.resid, [5, 7, 9])))
    np.testing.assert_array_equal(adk.select_indices("name CA CB"), np.flatnonzero(np.isin(a.name, ["CA", "CB"])))
    np.testing.assert_array_equal(adk.select_indices("name ca"), adk.select_indices("name CA"))
    np.testing.assert_array_equal(
        adk.select_indices("resname ALA gly"), np.flatnonzero(np.isin(a.resname, ["ALA", "GLY"]))
    )
    np.testing.assert_array_equal(adk.select_indices("element N O"), np.flatnonzero(np.isin(a.element, ["N", "O"])))
    np.testing.assert_array_equal(adk.select_indices("index 0-9"), np.arange(10))
    np.testing.assert_array_equal(adk.select_indices("index 3 1"), [1, 3])
    assert adk.select_indices("segid 4AKE").size == adk.n_atoms
    # resname matches the name as written (HSD), std names go through "protein"
    assert adk.select_indices("resname HSD").size > 0


def test_chain_selection_on_multichain():
    t = AtomTable.build(["CA"] * 6, ["ALA"] * 6, [1, 2, 3, 1, 2, 3], ["A", "A", "A", "B", "B", "a"])
    s = Structure(np.zeros((6, 3)), t, source="mc")
    np.testing.assert_array_equal(s.select_indices("chain A"), [0, 1, 2])
    np.testing.assert_array_equal(s.select_indices("chain B a"), [3, 4, 5])
    np.testing.assert_array_equal(s.select_indices("chain a"), [5])  # chain ids are case-sensitive
    np.testing.assert_array_equal(s.select_indices("chain A and resid 2-3"), [1, 2])


def test_combinations(adk):
    ca = adk.select_indices("ca")
    np.testing.assert_array_equal(adk.select_indices("ca and resid 1-10"), ca[:10])
    np.testing.assert_array_equal(
        adk.select_indices("(name CA or name CB) and not resid 2-214"),
        adk.select_indices("resid 1 and name CA CB"),
    )
    # precedence: not > and > or
    np.testing.assert_array_equal(
        adk.select_indices("name N or name CA and resid 1"),
        adk.select_indices("name N or (name CA and resid 1)"),
    )
    np.testing.assert_array_equal(adk.select_indices("not not ca"), ca)


def test_select_result(adk):
    sub = adk.select("ca and resid 5-9")
    assert (sub.n_atoms, sub.n_residues, sub.n_frames) == (5, 5, 1)
    np.testing.assert_array_equal(sub.coords[0], adk.coords[0, adk.select_indices("ca and resid 5-9")])
    np.testing.assert_array_equal(sub.atoms.residue_index, np.arange(5))
    assert sub.source == adk.source


def test_index_array_and_mask(adk):
    idx = np.array([5, 1, 3])
    np.testing.assert_array_equal(adk.select_indices(idx), [1, 3, 5])
    np.testing.assert_array_equal(adk.select_indices([0, 2]), [0, 2])
    mask = np.zeros(adk.n_atoms, bool)
    mask[[4, 8]] = True
    assert adk.select(mask).n_atoms == 2
    with pytest.raises(InputError, match="out of range"):
        adk.select_indices([adk.n_atoms])
    with pytest.raises(InputError, match="out of range"):
        adk.select_indices([-1])
    with pytest.raises(InputError, match="mask"):
        adk.select_indices(np.ones(3, bool))
    with pytest.raises(InputError):
        adk.select_indices(np.array([0.5]))


def test_empty_selection_error_names_source_and_expression(adk):
    with pytest.raises(InputError, match=r"adk_open\.pdb: selection 'chain A' matches no atoms"):
        adk.select("chain A")


@pytest.mark.parametrize(
    ("expr", "pattern"),
    [
        ("calpha", r"unknown word 'calpha'; valid keywords: all, none, ca"),
        ("", "empty selection"),
        ("(ca", r"missing '\)'"),
        ("ca and", "ends too early"),
        ("ca)", r"unexpected '\)'"),
        ("resid x", "resid needs integers"),
        ("name", "needs at least one value"),
        ("ca ca", "unexpected 'ca'"),
    ],
)
def test_selection_syntax_errors(adk, expr, pattern):
    with pytest.raises(InputError, match=pattern) as err:
        adk.select_indices(expr)
    assert "adk_open.pdb" in str(err.value) and "\n" not in str(err.value)


def test_ca_excludes_calcium():
    t = AtomTable.build(["CA", "CA"], ["GLY", "CA"], [1, 2], ["A", "A"], element=["C", "CA"], hetero=[False, True])
    s = Structure(np.zeros((2, 3)), t)
    np.testing.assert_array_equal(s.select_indices("ca"), [0])
    np.testing.assert_array_equal(s.select_indices("name CA"), [0, 1])
    np.testing.assert_array_equal(s.select_indices("hetero"), [1])


def test_protein_includes_md_and_modified_names():
    names = ["HSD", "HIE", "CYX", "MSE", "ACE", "HOH", "ZN"]
    t = AtomTable.build(["CA"] * 7, names, np.arange(7), ["A"] * 7)
    s = Structure(np.zeros((7, 3)), t)
    np.testing.assert_array_equal(s.select_indices("protein"), [0, 1, 2, 3])
    np.testing.assert_array_equal(s.select_indices("water"), [5])


def test_deuterium_is_not_heavy():
    t = AtomTable.build(["D1", "C1"], ["LIG", "LIG"], [1, 1], ["A", "A"], element=["D", "C"])
    s = Structure(np.zeros((2, 3)), t)
    np.testing.assert_array_equal(s.select_indices("heavy"), [1])


def test_selection_speed_100k_atoms(adk):
    reps = 30  # ~100k atoms
    idx = np.tile(np.arange(adk.n_atoms), reps)
    big_atoms = adk.atoms.take(idx)
    big = Structure(np.zeros((len(big_atoms), 3), np.float32), big_atoms, source="big")
    big.select_indices("ca")  # builds the per-field caches once
    t0 = time.perf_counter()
    for expr in ("heavy and not backbone", "resid 10-50 and name CA CB", "protein or water", "index 5-50000"):
        big.select_indices(expr)
    # vectorised masks: a few ms each; a per-atom Python loop would take seconds
    assert time.perf_counter() - t0 < 2.0


# ----------------------------------------------------------------------------------------------------
# Property tests of the parser
# ----------------------------------------------------------------------------------------------------

ATOMIC = [
    "ca",
    "heavy",
    "backbone",
    "protein",
    "hydrogen",
    "water",
    "resid 10-40",
    "resid 3 5 120",
    "name CA CB N",
    "resname LYS ARG",
    "element O",
    "index 100-900",
    "segid 4AKE",
    "none",
]


def _mask(s: Structure, expr: str) -> np.ndarray:
    m = np.zeros(s.n_atoms, bool)
    m[s.select_indices(expr)] = True
    return m


exprs = st.recursive(
    st.sampled_from(ATOMIC),
    lambda inner: st.one_of(
        st.builds(lambda a: f"not {a}", inner.map(lambda x: f"({x})")),
        st.builds(lambda a, b: f"({a}) and ({b})", inner, inner),
        st.builds(lambda a, b: f"({a}) or ({b})", inner, inner),
    ),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None)
@given(x=exprs, y=exprs)
def test_parser_set_algebra(adk, x, y):
    mx, my = _mask(adk, x), _mask(adk, y)
    np.testing.assert_array_equal(_mask(adk, f"not ({x})"), ~mx)
    np.testing.assert_array_equal(_mask(adk, f"({x}) and ({y})"), mx & my)
    np.testing.assert_array_equal(_mask(adk, f"({x}) or ({y})"), mx | my)
    np.testing.assert_array_equal(_mask(adk, f"not (({x}) or ({y}))"), ~mx & ~my)  # De Morgan
    np.testing.assert_array_equal(_mask(adk, f"(({x}))"), mx)


@settings(max_examples=40, deadline=None)
@given(x=exprs)
def test_parser_case_and_whitespace_insensitive(adk, x):
    variant = x.upper().replace("(", " ( ").replace(")", " ) ").replace(" ", "  ")
    np.testing.assert_array_equal(_mask(adk, variant), _mask(adk, x))


@settings(max_examples=40, deadline=None)
@given(lo=st.integers(-5, 230), hi=st.integers(-5, 230))
def test_resid_range_matches_numpy(adk, lo, hi):
    expected = np.flatnonzero((adk.atoms.resid >= min(lo, hi)) & (adk.atoms.resid <= max(lo, hi)))
    np.testing.assert_array_equal(adk.select_indices(f"resid {lo}:{hi}"), expected)


def test_internal_constructors_equal_the_checked_ones(adk):
    # The PDB reader builds tables and structures from parts it knows are valid, skipping the
    # checks; the results must be indistinguishable from the checked constructors' ones.
    a = adk.atoms
    fields = {f: getattr(a, f) for f in ("name", "element", "resname", "resid", "icode", "chain", "segid", "hetero")}
    fast = AtomTable._from_arrays(**fields, residue_index=a.residue_index)
    checked = AtomTable(**fields)
    assert fast == checked and len(fast) == len(checked) and fast.n_residues == checked.n_residues
    np.testing.assert_array_equal(fast.std_resname, checked.std_resname)
    assert fast.codes("name")[0].tolist() == checked.codes("name")[0].tolist()
    s = Structure._from_parts(adk.coords, fast, adk.source)
    assert repr(s) == repr(adk) and s.box is None and s.time is None
    assert s.select("ca").atoms == adk.select("ca").atoms
    np.testing.assert_array_equal(s.frames(0).coords, adk.coords)
