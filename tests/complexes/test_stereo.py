"""The stereochecks of pg.score_complex (protgpu/complexes/stereo.py, OpenStructure's StereoCheck):
problems found in distorted real residues, none in clean structures, invariance under rigid motion, the
compiled loops against their NumPy twin, and what the removed atoms do to lDDT (OpenStructure's own
test of the Scorer: modules/mol/alg/tests/test_scoring.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protgpu as pg
from protgpu.complexes import stereo
from protgpu.complexes._cleanup import clean
from protgpu.scoring import _fast


@pytest.fixture(scope="module")
def eud(datasets):
    d = datasets / "openstructure"
    return clean(pg.load(d / "1eud_mdl_partial-dimer.pdb")), clean(pg.load(d / "1eud_ref.pdb"))


def _atom(s, chain, resid, name) -> int:
    a = s.atoms
    (k,) = np.flatnonzero((a.chain == chain) & (a.resid == resid) & (a.name == name))
    return int(k)


def _residue(s, chain, resid) -> np.ndarray:
    a = s.atoms
    return np.flatnonzero((a.chain == chain) & (a.resid == resid))


def _names(s, atoms) -> set:
    a = s.atoms
    return {f"{a.chain[k]}{a.resid[k]}.{a.name[k]}" for k in np.asarray(atoms).reshape(-1)}


def _all(problems: dict) -> int:
    return sum(len(v) for v in problems.values())


def test_clean_model_has_no_problem(eud):
    model, _ = eud
    assert _all(stereo.stereo_problems(model)) == 0
    assert stereo.stereo_drop(model).size == 0


def test_reference_problems_are_its_two_long_met_bonds(eud):
    """1eud's MET A292 and A310 have SD-CE bonds of 1.923 and 1.946 A, 1.792 +- 0.010 in the monomer
    library: beyond 12 sd; their side chains go, the backbone stays."""
    _, ref = eud
    p = stereo.stereo_problems(ref)
    assert _names(ref, p["bad_bonds"]) == {"A292.SD", "A292.CE", "A310.SD", "A310.CE"}
    assert len(p["bad_angles"]) == 0 and len(p["clashes"]) == 0
    assert _names(ref, stereo.stereo_drop(ref)) == {f"A{r}.{n}" for r in (292, 310) for n in ("CB", "CG", "SD", "CE")}


def test_stretched_side_chain_bond_drops_the_side_chain(eud):
    """OpenStructure's test: model B42's CD moved 1 A: its side chain goes, not its backbone."""
    model, _ = eud
    x = model.coords[0].astype(np.float64)
    x[_atom(model, "B", 42, "CD"), 2] += 1.0
    p = stereo.stereo_problems(model, x)
    assert "B42.CD" in _names(model, p["bad_bonds"])
    drop = stereo.stereo_drop(model, x)
    res = _residue(model, "B", 42)
    side = [k for k in res if model.atoms.name[k] not in stereo.BACKBONE]
    np.testing.assert_array_equal(drop, side)


def test_moved_backbone_atom_drops_the_residue(eud):
    """... and its CA moved too: the whole residue goes (and a neighbour whose backbone atom is in a
    bad angle across the peptide bond, such as CA(42)-C(42)-N(43): OpenStructure flags all three)."""
    model, _ = eud
    x = model.coords[0].astype(np.float64)
    x[_atom(model, "B", 42, "CD"), 2] += 1.0
    x[_atom(model, "B", 42, "CA"), 2] += 1.0
    drop = set(stereo.stereo_drop(model, x).tolist())
    assert set(_residue(model, "B", 42)) <= drop
    assert drop <= set(np.concatenate([_residue(model, "B", r) for r in (41, 42, 43)]).tolist())


def test_created_clash_is_found(eud):
    """An atom put 1 A from a non-bonded atom of another residue (C-C: a clash below 1.9 A)."""
    model, _ = eud
    x = model.coords[0].astype(np.float64)
    a, b = _atom(model, "A", 100, "CB"), _atom(model, "A", 200, "CB")
    x[a] = x[b] + [1.0, 0.0, 0.0]
    clashes = {tuple(p) for p in stereo.stereo_problems(model, x)["clashes"].tolist()}
    assert (min(a, b), max(a, b)) in clashes
    x[a] = x[b] + [2.0, 0.0, 0.0]  # 2 A: above C-C's 1.9 A
    clashes = {tuple(p) for p in stereo.stereo_problems(model, x)["clashes"].tolist()}
    assert (min(a, b), max(a, b)) not in clashes


def test_stretched_peptide_bond_is_bad_and_a_chain_break_is_none(eud):
    """C(i)-N(i+1) at 1.7 A (1.336 +- 12 x 0.023 A: up to 1.612) is a bad bond: both residues go (backbone
    atoms); at 2.5 A there is no bond (OpenStructure's processor connects up to 1.99 A): neither atom is
    flagged (no bond, no angle across it, no clash: C-N clashes below 1.75 A)."""
    model, _ = eud
    x0 = model.coords[0].astype(np.float64)
    c, n = _atom(model, "A", 100, "C"), _atom(model, "A", 101, "N")
    later = np.flatnonzero((model.atoms.chain == "A") & (model.atoms.resid > 100))
    u = (x0[n] - x0[c]) / np.linalg.norm(x0[n] - x0[c])
    for length, bad in ((1.7, True), (2.5, False)):
        x = x0.copy()
        x[later] += u * (length - np.linalg.norm(x0[n] - x0[c]))  # the rest of the chain moves rigidly
        p = stereo.stereo_problems(model, x)
        assert ((c, n) in {tuple(b) for b in p["bad_bonds"].tolist()}) is bad
        if bad:
            drop = set(stereo.stereo_drop(model, x).tolist())
            assert set(_residue(model, "A", 100)) | set(_residue(model, "A", 101)) <= drop
        else:  # (the moved chain may touch the other chain somewhere: only C and N are asserted)
            flagged = np.concatenate([v.reshape(-1) for v in p.values()])
            assert c not in flagged and n not in flagged


def _noisy(s, sigma: float, seed: int) -> np.ndarray:
    return s.coords[0].astype(np.float64) + np.random.default_rng(seed).normal(0, sigma, (s.n_atoms, 3))


@pytest.mark.skipif(not _fast.enabled(), reason="numba not available")
@pytest.mark.parametrize("sigma", [0.0, 0.05, 0.3])
def test_compiled_loops_equal_the_numpy_twin(eud, sigma):
    for s in eud:
        x = _noisy(s, sigma, 7)
        fast = stereo.stereo_problems(s, x, compiled=True)
        twin = stereo.stereo_problems(s, x, compiled=False)
        for k in fast:
            np.testing.assert_array_equal(fast[k], twin[k], err_msg=k)
    assert _all(stereo.stereo_problems(eud[0], _noisy(eud[0], 0.3, 7))) > 100  # the noise made many


def _rotation(q) -> np.ndarray:
    q = np.asarray(q, np.float64)
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


@settings(max_examples=15, deadline=None)
@given(q=st.lists(st.floats(-1, 1), min_size=4, max_size=4).filter(lambda v: np.linalg.norm(v) > 0.1),
       t=st.lists(st.floats(-100, 100), min_size=3, max_size=3))
def test_rigid_motion_changes_nothing(eud, q, t):
    """The problems of a distorted model (0.05 A noise: a few dozen, near their thresholds, as real
    problems are) are the same after any rotation and translation."""
    model, _ = eud
    x = _noisy(model, 0.05, 3)
    moved = x @ _rotation(q).T + np.asarray(t)
    before, after = stereo.stereo_problems(model, x), stereo.stereo_problems(model, moved)
    for k in before:
        # a problem within rounding of its threshold may flip: none here (checked by the exact equality)
        np.testing.assert_array_equal(before[k], after[k], err_msg=k)
    np.testing.assert_array_equal(stereo.stereo_drop(model, x), stereo.stereo_drop(model, moved))


def test_removed_model_atoms_lower_lddt_not_bb_lddt(datasets, tmp_path):
    """The model's B42 with a distorted side chain: lddt drops below the undistorted value (its side
    chain counts as missing), bb_lddt (no stereochecks, CA only) stays; with stereochecks off the
    distortion costs less (the moved CD scores as it lies)."""
    d = datasets / "openstructure"
    raw = pg.load(d / "1eud_mdl_partial-dimer.pdb")
    x = raw.coords.copy()
    x[0, _atom(raw, "B", 42, "CD"), 2] += 1.0
    bad = pg.Structure(x, raw.atoms)
    ref = d / "1eud_ref.pdb"
    good_t = pg.score_complex(raw, ref, metrics=("lddt", "bb_lddt"))
    bad_t = pg.score_complex(bad, ref, metrics=("lddt", "bb_lddt"))
    off_t = pg.score_complex(bad, ref, metrics=("lddt", "bb_lddt"), stereochecks=False)
    assert float(bad_t["lddt"][0]) < float(off_t["lddt"][0]) < float(good_t["lddt"][0])
    assert float(bad_t["bb_lddt"][0]) == float(good_t["bb_lddt"][0])


def test_stereochecks_off_keeps_every_atom(datasets):
    d = datasets / "openstructure"
    t = pg.score_complex(d / "1eud_mdl_partial-dimer.pdb", d / "1eud_ref.pdb", metrics=("lddt", "ilddt"),
                         stereochecks=False)
    # the two MET side chains of the reference stay: OpenStructure's lddt_no_stereochecks
    assert round(float(t["lddt"][0]), 4) == 0.5382
    assert round(float(t["ilddt"][0]), 4) == 0.2807


def test_batched_stereochecked_lddt_equals_one_by_one(eud):
    """Models of one atom table with different removed atoms, scored as one batch (each row its own
    missing atoms) == each alone."""
    model, ref = eud
    xs = np.stack([_noisy(model, 0.05, seed) for seed in (1, 2, 3)])
    drops = [stereo.stereo_drop(model, x) for x in xs]
    assert len({d.tobytes() for d in drops}) == 3 and all(len(d) for d in drops)  # different, not none
    stack = pg.Structure(xs.astype(np.float32), model.atoms, source="noisy")
    whole = pg.score_complex(stack, ref, metrics=("lddt", "ilddt"), device="cpu")
    for k in range(3):
        one = pg.score_complex(stack.frames(k), ref, metrics=("lddt", "ilddt"), device="cpu")
        for col in ("lddt", "ilddt"):
            assert float(whole[col][k]) == float(one[col][0]), col
    off = pg.score_complex(stack, ref, metrics=("lddt",), device="cpu", stereochecks=False)
    assert np.all(whole["lddt"] < off["lddt"]) and np.ptp(whole["lddt"]) > 0
