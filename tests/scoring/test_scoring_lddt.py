"""lDDT (NumPy path): OpenStructure-convention and biotite reference values, invariances, edge cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protgpu.errors import InputError
from protgpu.io import load
from protgpu.scoring import lddt, lddt_residue_labels
from protgpu.scoring.lddt import lddt_counts_numpy, lddt_inputs, lddt_scores, resolve_symmetry_numpy
from protgpu.structure import AtomTable, Structure

PAIRS = ("7SGN_C", "7W1F_B", "T1118v1_LG035_1")


def _opt(values):
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


@pytest.fixture(scope="module")
def prepared(shared_datasets, reference_values):
    """(ref, coords) per pair and atom set, prepared once (the pair search is the slow part)."""
    out = {}
    for key in PAIRS:
        v = reference_values["model_native_pairs"][key]
        for atoms in ("heavy", "ca"):
            out[key, atoms] = lddt_inputs(shared_datasets / v["model"], shared_datasets / v["native"], atoms=atoms)
    return out


def _scores(prepared, key, atoms, symmetry):
    ref, coords, _ = prepared[key, atoms]
    g, per = lddt_scores(lddt_counts_numpy(coords, ref, symmetry=symmetry), ref, 4)
    return g[0], per[0], ref, coords


@pytest.mark.parametrize("key", PAIRS)
def test_global_reference_values(key, prepared, reference_values):
    L = reference_values["model_native_pairs"][key]["lddt"]
    g, _, ref, coords = _scores(prepared, key, "heavy", True)
    assert g == pytest.approx(L["all_atom_ost_like_with_symmetry"], abs=1e-9)
    g, _, _, _ = _scores(prepared, key, "heavy", False)
    assert g == pytest.approx(L["all_atom_ost_like_no_symmetry"], abs=1e-9)
    assert g == pytest.approx(L["all_atom_biotite"], abs=1e-9)
    g, _, ref_ca, _ = _scores(prepared, key, "ca", True)
    assert g == pytest.approx(L["ca_ost_like"], abs=1e-9) and g == pytest.approx(L["ca_biotite"], abs=1e-9)
    # the counts behind them
    assert len(ref.dref) == L["n_ref_pairs_all_atom"] and len(ref_ca.dref) == L["n_ref_pairs_ca"]
    assert ref.n_atoms == L["n_ref_atoms_all_atom"]
    assert int(np.isnan(coords[0, :, 0]).sum()) == L["n_ref_atoms_missing_in_model"]
    x = coords.copy()
    assert int(resolve_symmetry_numpy(x, ref, (0.5, 1, 2, 4)).sum()) == L["n_symmetry_swaps"]


def test_per_residue_reference_values(prepared, reference_values):
    P = reference_values["model_native_pairs"]["7SGN_C"]["lddt_per_residue"]
    # values are stored rounded to 6 decimals
    _, per, _, _ = _scores(prepared, "7SGN_C", "heavy", True)
    exp = _opt(P["all_atom_ost_like_with_symmetry"])
    np.testing.assert_array_equal(np.isnan(per), np.isnan(exp))
    np.testing.assert_allclose(per, exp, atol=6e-7)
    # biotite gives 0 to residues absent from the model; protgpu gives NaN (OpenStructure's None)
    _, per, _, _ = _scores(prepared, "7SGN_C", "heavy", False)
    np.testing.assert_allclose(np.nan_to_num(per, nan=0.0), np.asarray(P["all_atom_biotite"], float), atol=6e-7)
    _, per, _, _ = _scores(prepared, "7SGN_C", "ca", True)
    exp = _opt(P["ca_ost_like"])
    np.testing.assert_array_equal(np.isnan(per), np.isnan(exp))
    np.testing.assert_allclose(per, exp, atol=6e-7)


def test_public_function_and_labels(shared_datasets, reference_values):
    v = reference_values["model_native_pairs"]["7SGN_C"]
    g, per = lddt(shared_datasets / v["model"], shared_datasets / v["native"], per_residue=True, device="cpu")
    assert isinstance(g, float) and g == pytest.approx(v["lddt"]["all_atom_ost_like_with_symmetry"], abs=1e-12)
    assert per.shape == (108,)
    assert lddt_residue_labels(shared_datasets / v["native"]) == v["lddt_per_residue"]["residue_keys"]


def test_nmr_ensemble_matches_biotite_values(shared_datasets, reference_values):
    ens = reference_values["nmr_ensemble"]
    s = load(shared_datasets / ens["file"])
    heavy = lddt(s, s.frames(0), symmetry=False, device="cpu")
    np.testing.assert_allclose(heavy, ens["biotite_lddt_vs_model0_heavy"], atol=1e-9)
    ca = lddt(s, s.frames(0), atoms="ca", symmetry=False, device="cpu")
    np.testing.assert_allclose(ca, ens["biotite_lddt_vs_model0_ca"], atol=1e-9)


def test_against_biotite_itself(shared_datasets):
    biotite_structure = pytest.importorskip("biotite.structure")
    pdb = pytest.importorskip("biotite.structure.io.pdb")
    path = shared_datasets / "mdtraj" / "2EQQ.pdb"
    stack = pdb.PDBFile.read(str(path)).get_structure()
    stack = stack[:, stack.element != "H"]
    rng = np.random.default_rng(0)
    coords = stack.coord[:5] + rng.normal(scale=0.7, size=stack.coord[:5].shape).astype(np.float32)
    coords[1, 10:20] = np.nan  # missing atoms
    exp_g = biotite_structure.lddt(stack[0], coords)
    exp_r = biotite_structure.lddt(stack[0], coords, aggregation="residue")
    s = load(path).select("heavy").frames(0)
    # biotite marks missing atoms with NaN; here the model files simply lack them
    models = [Structure(np.nan_to_num(c), s.atoms, source=f"m{i}").select(~np.isnan(c[:, 0]))
              for i, c in enumerate(coords)]
    g, per = lddt(models, s, symmetry=False, per_residue=True, device="cpu")
    np.testing.assert_allclose(g, exp_g, atol=1e-6)
    np.testing.assert_allclose(per, exp_r, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# invariances and edge cases


@pytest.fixture(scope="module")
def adk(datasets):
    s = load(datasets / "adk_open.pdb")
    return s.select("resid 1-40")


def _rotation(q):
    q = np.asarray(q, dtype=np.float64)
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([[w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z]])


@settings(max_examples=10, deadline=None)
@given(q=st.lists(st.floats(-1, 1), min_size=4, max_size=4).filter(lambda q: np.linalg.norm(q) > 0.1),
       t=st.lists(st.floats(-100, 100), min_size=3, max_size=3), noise=st.floats(0.1, 3.0),
       seed=st.integers(0, 1000), symmetry=st.booleans())
def test_rigid_motion_invariance(adk, q, t, noise, seed, symmetry):
    x = adk.coords[0].astype(np.float64) + np.random.default_rng(seed).normal(scale=noise, size=adk.coords[0].shape)
    moved = x @ _rotation(q).T + np.asarray(t)
    a = lddt(Structure(x, adk.atoms), adk, symmetry=symmetry, per_residue=True, device="cpu")
    b = lddt(Structure(moved, adk.atoms), adk, symmetry=symmetry, per_residue=True, device="cpu")
    # coordinates are float32 in a Structure: a distance can move across a threshold by 1e-5 A
    assert b[0] == pytest.approx(a[0], abs=2e-3)
    assert 0.0 <= a[0] <= 1.0


@settings(max_examples=5, deadline=None)
@given(n=st.integers(4, 60), seed=st.integers(0, 100))
def test_identity_is_one(n, seed):
    x = np.cumsum(np.random.default_rng(seed).normal(size=(n, 3)) * 2.5, axis=0)
    g, per = lddt(x, x, per_residue=True, device="cpu")
    assert g == pytest.approx(1.0)
    assert np.all((per == 1.0) | np.isnan(per))


def test_symmetry_swap_is_found(adk):
    # swap OD1/OD2 of every ASP in the model: with symmetry that is undone, without it costs score
    a = adk.atoms
    name = a.name.copy()
    asp = a.resname == "ASP"
    name[asp & (a.name == "OD1")] = "OD2"
    name[asp & (a.name == "OD2")] = "OD1"
    assert asp.any()
    swapped = Structure(adk.coords, AtomTable(name=name, element=a.element, resname=a.resname, resid=a.resid,
                                              icode=a.icode, chain=a.chain, segid=a.segid, hetero=a.hetero))
    assert lddt(swapped, adk, device="cpu") == pytest.approx(1.0)
    assert lddt(swapped, adk, symmetry=False, device="cpu") < 0.999


def test_missing_atoms_count_as_not_conserved(adk):
    keep = ~((adk.atoms.resid == 13) & ~np.isin(adk.atoms.name, ["N", "CA", "C", "O"]))  # LYS13 side chain
    g, per = lddt(adk.select(keep), adk, per_residue=True, device="cpu")
    ref, coords, _ = lddt_inputs(adk.select(keep), adk)
    missing = np.isnan(coords[0, :, 0])
    assert 5 <= missing.sum() < 10
    lost = missing[ref.pairs[:, 0]] | missing[ref.pairs[:, 1]]
    assert g == pytest.approx(1.0 - lost.sum() / len(ref.pairs))
    labels = lddt_residue_labels(adk)  # chain is blank in this file: the segid labels it
    assert 0 < per[labels.index("4AKE:13")] < per.min() + 1e-12 and np.nanmax(per) == 1.0
    # a residue absent from the model is NaN per residue, and its pairs still count globally
    g2, per2 = lddt(adk.select("not resid 5"), adk, per_residue=True, device="cpu")
    assert np.isnan(per2[labels.index("4AKE:5")]) and g2 < 1.0


def test_md_names_and_float32_twin(adk):
    a = adk.atoms
    resname = np.where(a.resname == "HIS", "HSD", a.resname)
    name = np.where((a.resname == "ILE") & (a.name == "CD1"), "CD", a.name)
    charmm = Structure(adk.coords, AtomTable(name=name, element=a.element, resname=resname, resid=a.resid,
                                             icode=a.icode, chain=a.chain, segid=a.segid, hetero=a.hetero))
    assert (a.resname == "ILE").any()
    assert lddt(charmm, adk, device="cpu") == pytest.approx(1.0)
    x = adk.coords[0] + np.random.default_rng(3).normal(scale=1.0, size=adk.coords[0].shape)
    ref, coords, _ = lddt_inputs(Structure(x, adk.atoms), adk)
    c64 = lddt_counts_numpy(coords, ref)
    c32 = lddt_counts_numpy(coords.astype(np.float32), ref)
    assert np.abs(c64 - c32).sum() <= 4  # a pair on a threshold within float32 rounding, at most


def test_options_and_errors(adk):
    x = adk.coords[0] + np.random.default_rng(4).normal(scale=1.0, size=adk.coords[0].shape)
    m = Structure(x, adk.atoms)
    wide = lddt(m, adk, thresholds=(8.0,), device="cpu")
    assert wide > lddt(m, adk, device="cpu")
    assert lddt(m, adk, inclusion_radius=6.0, device="cpu") != lddt(m, adk, device="cpu")
    stacked = lddt(np.stack([x, adk.coords[0]]), adk, device="cpu")  # arrays with the reference's atoms
    assert stacked.shape == (2,) and stacked[1] == pytest.approx(1.0)
    with pytest.raises(InputError, match="atoms"):
        lddt(m, adk, atoms="backbone", device="cpu")
    with pytest.raises(InputError, match="thresholds"):
        lddt(m, adk, thresholds=(), device="cpu")
    with pytest.raises(InputError, match="atoms"):
        lddt(np.zeros((5, 3)), adk, device="cpu")
    renum = Structure(adk.coords, AtomTable(name=adk.atoms.name, element=adk.atoms.element,
                                            resname=adk.atoms.resname, resid=adk.atoms.resid + 500,
                                            icode=adk.atoms.icode, chain=adk.atoms.chain, segid=adk.atoms.segid,
                                            hetero=adk.atoms.hetero), source="renumbered.pdb")
    with pytest.raises(InputError, match="renumbered.pdb: no residue in common"):
        lddt(renum, adk, device="cpu")
    assert lddt(renum, adk, mapping="sequence", device="cpu") == pytest.approx(1.0)
