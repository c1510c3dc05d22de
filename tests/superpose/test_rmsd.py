"""CPU tests of protgpu.superpose.rmsd / superpose (to_reference): QCP against a float64 Kabsch (SVD)
reference, MDTraj and the shared reference values, the CPU path's task groups, errors."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
from superpose_helpers import (
    kabsch,
    kabsch_rmsd_matrix,
    load_adk,
    load_nmr,
    random_rotation,
    threads_input,
)

from protgpu.errors import InputError
from protgpu.superpose import (
    pairwise,
    pairwise_rmsd,
    qcp,
    rmsd,
    superpose,
    to_reference,
)


@pytest.fixture(scope="module")
def nmr(shared_datasets):
    return load_nmr(shared_datasets)


@pytest.fixture(scope="module")
def adk(datasets):
    return load_adk(datasets)


# --------------------------------------------------------------------------------------------------
# Basic accuracy


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_kabsch_on_random_frames(dtype):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(25, 40, 3)) * 6 + 30).astype(dtype)
    y = (rng.normal(size=(40, 3)) * 6 - 10).astype(dtype)
    r = rmsd(x, y, device="cpu")
    ref = np.array([kabsch(f, y)[0] for f in x])
    assert r.dtype == np.float64 and r.shape == (25,)
    np.testing.assert_allclose(r, ref, atol=1e-9)


def test_superpose_maps_mobile_onto_reference():
    rng = np.random.default_rng(1)
    y = rng.normal(size=(30, 3)) * 5
    rots = np.stack([random_rotation(rng) for _ in range(6)])
    x = np.einsum("fij,nj->fni", rots, y) + rng.normal(size=(6, 1, 3)) * 20 + rng.normal(size=(6, 30, 3)) * 0.1
    res = superpose(x, y, device="cpu")
    assert res.coords.shape == x.shape and res.rotation.shape == (6, 3, 3) and res.translation.shape == (6, 3)
    np.testing.assert_allclose(np.linalg.det(res.rotation), 1.0, atol=1e-12)
    moved = np.einsum("fni,fji->fnj", x, res.rotation) + res.translation[:, None]
    np.testing.assert_allclose(res.coords, moved, atol=1e-9)
    for f in range(6):
        r_ref, rot_ref, t_ref = kabsch(x[f], y)
        np.testing.assert_allclose(res.rotation[f], rot_ref, atol=1e-9)
        np.testing.assert_allclose(res.translation[f], t_ref, atol=1e-8)
        assert res.rmsd[f] == pytest.approx(r_ref, abs=1e-10)
        direct = np.sqrt(((res.coords[f] - y) ** 2).sum(1).mean())
        assert res.rmsd[f] == pytest.approx(direct, abs=1e-10)


def test_superpose_keeps_float32_and_2d_input():
    rng = np.random.default_rng(2)
    y = rng.normal(size=(12, 3)).astype(np.float32)
    res = superpose(y @ random_rotation(rng).T.astype(np.float32), y, device="cpu")
    assert res.coords.dtype == np.float32 and res.coords.shape == (1, 12, 3)
    assert res.rotation.dtype == np.float64
    assert res.rmsd[0] < 1e-5


def test_weights_match_weighted_kabsch():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(8, 20, 3)) * 4
    y = rng.normal(size=(20, 3)) * 4
    w = rng.uniform(0.1, 5.0, size=20)
    res = superpose(x, y, weights=w, device="cpu")
    for f in range(8):
        r_ref, rot_ref, t_ref = kabsch(x[f], y, w)
        assert res.rmsd[f] == pytest.approx(r_ref, abs=1e-10)
        np.testing.assert_allclose(res.rotation[f], rot_ref, atol=1e-9)
        np.testing.assert_allclose(res.translation[f], t_ref, atol=1e-8)
    np.testing.assert_allclose(rmsd(x, y, weights=w, device="cpu"), res.rmsd, atol=1e-12)


def test_fit_on_some_atoms_measure_on_others():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(5, 30, 3)) * 4
    y = rng.normal(size=(30, 3)) * 4
    fit, meas = np.arange(0, 30, 3), np.arange(1, 30, 2)
    w = rng.uniform(0.5, 2, size=30)
    r = rmsd(x, y, fit=fit, atoms=meas, device="cpu")
    rw = rmsd(x, y, fit=fit, atoms=meas, weights=w, device="cpu")
    for f in range(5):
        _, rot, t = kabsch(x[f, fit], y[fit])
        d = x[f, meas] @ rot.T + t - y[meas]
        assert r[f] == pytest.approx(np.sqrt((d**2).sum(1).mean()), abs=1e-10)
        _, rot, t = kabsch(x[f, fit], y[fit], w[fit])
        d = x[f, meas] @ rot.T + t - y[meas]
        assert rw[f] == pytest.approx(np.sqrt((w[meas] * (d**2).sum(1)).sum() / w[meas].sum()), abs=1e-10)
    # boolean masks select the same atoms
    mask = np.zeros(30, bool)
    mask[fit] = True
    np.testing.assert_allclose(rmsd(x, y, fit=mask, device="cpu"), rmsd(x, y, fit=fit, device="cpu"))


def test_self_rmsd_far_from_origin():
    rng = np.random.default_rng(5)
    x = (rng.normal(size=(300, 3)) * 15 + 1000).astype(np.float32)
    rot = random_rotation(rng)
    moved = (x.astype(np.float64) @ rot.T + 500).astype(np.float64)
    assert rmsd(x, x, device="cpu")[0] <= 1e-12  # re-measured on the coordinates, no cancellation
    w = rng.uniform(0.5, 2.0, 300)
    assert superpose(np.stack([x, moved]), x, weights=w, device="cpu").rmsd[0] <= 1e-12
    assert rmsd(moved, x.astype(np.float64), device="cpu")[0] <= 1e-4
    assert pairwise_rmsd(np.stack([x, x]), device="cpu")[0, 1] <= 1e-4


def test_rmsd_qcp_groups_do_not_change_results(monkeypatch):
    """rmsd()/superpose()'s CPU path runs the QCP on groups of frames (and the moments on chunks): the
    same bits with groups of 7 frames and chunks of 4 as with one of each, and with tasks of 6 frames
    on a pool of 3 threads, with a self frame (re-measured), weights, fit and measured atoms."""
    x = threads_input().astype(np.float32)
    ref = np.asarray(x[3], dtype=np.float64)
    w = np.random.default_rng(4).uniform(0.5, 2, 24)
    fit, meas = np.arange(0, 24, 2), np.arange(5, 20)
    cases = (((x, (ref, None)), {}),
             ((x, (ref[fit], ref[meas])), {"fit": fit, "meas": meas, "w_fit": w[fit], "w_meas": w[meas]}))
    whole = [to_reference.rmsd_numpy(*args, **kw, want_coords=True, threads=1) for args, kw in cases]
    monkeypatch.setattr(qcp, "CACHE_CHUNK_BYTES", 24 * 3 * 8 * 3 * 4)
    monkeypatch.setattr(qcp, "CHUNK_PAIRS", 7)
    for (args, kw), want in zip(cases, whole, strict=True):
        for got, exp in zip(to_reference.rmsd_numpy(*args, **kw, want_coords=True, threads=1), want, strict=True):
            np.testing.assert_array_equal(got, exp)
    # tasks of 6 frames on a pool of 3 threads
    monkeypatch.setattr(to_reference, "CPU_CHUNK_BYTES", 24 * 3 * 8 * 3 * 6)

    seen = set()
    real = to_reference.rmsd_numpy_frames
    monkeypatch.setattr(to_reference, "rmsd_numpy_frames", lambda *a: seen.add(threading.get_ident()) or real(*a))
    for (args, kw), want in zip(cases, whole, strict=True):
        for got, exp in zip(to_reference.rmsd_numpy(*args, **kw, want_coords=True, threads=3), want, strict=True):
            np.testing.assert_array_equal(got, exp)
    assert seen and threading.get_ident() not in seen  # on the pool
    assert whole[0][0].shape == (45,) and whole[0][0][3] < 1e-12


# --------------------------------------------------------------------------------------------------
# Real structures: MDTraj and the reference values


def test_nmr_ensemble_reference_values(nmr, reference_values):
    ref = reference_values["nmr_ensemble"]
    assert nmr.n_frames == ref["n_models"] and nmr.n_atoms == ref["n_atoms"]
    for sel, key in (("ca", "ca"), ("heavy", "heavy")):
        r = rmsd(nmr, nmr, fit=sel, device="cpu")
        own = np.array(ref[f"own_qcp_float64_rmsd_to_model0_{key}_nm"]) * 10
        md_ = np.array(ref[f"mdtraj_rmsd_to_model0_{key}_nm"]) * 10
        np.testing.assert_allclose(r, own, atol=1e-4)
        # MDTraj (float32, nm) agrees to 1e-3 A except on its own self-RMSD (3.75e-3 A for heavy atoms).
        np.testing.assert_allclose(r[1:], md_[1:], atol=1e-3)
        assert r[0] <= 1e-4
    assert len(nmr.select_indices("heavy")) == ref["n_heavy"]


def test_nmr_ensemble_vs_mdtraj(nmr, shared_datasets):
    md = pytest.importorskip("mdtraj")
    t = md.load(str(shared_datasets / "mdtraj" / "2EQQ.pdb"))
    ca = t.topology.select("name CA")
    for j in (0, 7):
        expect = md.rmsd(t, t, j, atom_indices=ca) * 10
        got = rmsd(nmr, nmr, fit="ca", ref_frame=j, device="cpu")
        mask = np.arange(t.n_frames) != j
        np.testing.assert_allclose(got[mask], expect[mask], atol=1e-3)
    d = pairwise_rmsd(nmr, fit=ca, device="cpu")
    mdm = np.stack([md.rmsd(t, t, j, atom_indices=ca) for j in range(t.n_frames)], axis=1) * 10
    off = ~np.eye(t.n_frames, dtype=bool)
    np.testing.assert_allclose(d[off], mdm[off], atol=1e-3)
    # fit on CA, measure heavy: against an explicit superposition
    heavy = t.topology.select("not element H")
    x = nmr.coords.astype(np.float64)
    r = rmsd(nmr, nmr, fit="ca", atoms="heavy", device="cpu")
    for f in (1, 5):
        _, rot, tr = kabsch(x[f, ca], x[0, ca])
        dd = x[f, heavy] @ rot.T + tr - x[0, heavy]
        assert r[f] == pytest.approx(np.sqrt((dd**2).sum(1).mean()), abs=1e-5)


def test_alanine_dipeptide_trajectory(shared_datasets, reference_values):
    from protgpu.io import load

    ref = reference_values["trajectory_frame0_ala_dipeptide"]
    t = load(shared_datasets / "mdtraj" / "frame0.xtc", top=shared_datasets / "mdtraj" / "native.pdb")
    assert t.n_frames == ref["n_frames"] and t.n_atoms == ref["n_atoms"]
    r = rmsd(t, t, device="cpu") / 10  # nm
    np.testing.assert_allclose(r[:10], ref["mdtraj_rmsd_all_atoms_to_frame0_nm_xtc_first10"], atol=1e-4)
    assert r.sum() == pytest.approx(ref["mdtraj_rmsd_all_atoms_to_frame0_nm_xtc_sum"], abs=501 * 1e-5)
    assert r[0] <= 1e-12  # re-measured on the coordinates: float64 rounding only


def test_adk_trajectory_vs_mdtraj(adk, datasets):
    md = pytest.importorskip("mdtraj")
    t = md.load(str(datasets / "adk_dims.dcd"), top=str(datasets / "adk_open.pdb"))
    for j in (0, 60):
        got = rmsd(adk, adk, ref_frame=j, device="cpu")
        mask = np.arange(t.n_frames) != j
        np.testing.assert_allclose(got[mask], (md.rmsd(t, t, j) * 10)[mask], atol=1e-3)
    ca = adk.select_indices("ca")
    x = adk.coords[::7, ca]
    d = pairwise_rmsd(x, device="cpu")
    np.testing.assert_allclose(d, kabsch_rmsd_matrix(x, x), atol=1e-4)
    d32 = pairwise_rmsd(x, precision="float32", device="cpu")
    np.testing.assert_allclose(d32, kabsch_rmsd_matrix(x, x), atol=1e-3)


def test_structure_inputs(nmr):
    frames = [nmr.frames(i) for i in range(4)]
    r_list = rmsd(frames, nmr.frames(0), fit="ca", device="cpu")
    np.testing.assert_allclose(r_list, rmsd(nmr, nmr, fit="ca", device="cpu")[:4])
    res = superpose(nmr, nmr, fit="backbone", device="cpu")
    assert isinstance(res.coords, np.ndarray) and res.coords.dtype == np.float32
    assert res.coords.shape == nmr.coords.shape
    # an array reference with the same atoms borrows the Structure's selection
    np.testing.assert_allclose(rmsd(nmr, nmr.coords[0], fit="ca", device="cpu"), rmsd(nmr, nmr, fit="ca", device="cpu"))


def test_mdtraj_object_input(shared_datasets):
    md = pytest.importorskip("mdtraj")
    t = md.load(str(shared_datasets / "mdtraj" / "frame0.xtc"), top=str(shared_datasets / "mdtraj" / "native.pdb"))
    np.testing.assert_allclose(rmsd(t[:20], t[0], device="cpu"), md.rmsd(t[:20], t, 0) * 10, atol=1e-3)


# --------------------------------------------------------------------------------------------------
# Errors


def test_errors():
    rng = np.random.default_rng(12)
    x = rng.normal(size=(3, 10, 3))
    with pytest.raises(InputError, match=r"10.*9|9.*10"):
        rmsd(x, x[0, :9], device="cpu")
    with pytest.raises(InputError, match="out of range"):
        rmsd(x, x[0, :8], fit=np.arange(9), device="cpu")
    # a 12-atom reference: the same 5 fitted atoms line up, all 10 vs 12 measured do not
    ref12 = np.vstack([x[0], x[0, :2] + 1])
    assert rmsd(x, ref12, fit=np.arange(5), device="cpu").shape == (3,)
    bad = x.copy()
    bad[2, 4, 1] = np.nan
    with pytest.raises(InputError, match="frame 2"):
        rmsd(bad, x[0], device="cpu")
    with pytest.raises(InputError, match="frame 2"):
        pairwise_rmsd(bad, device="cpu")
    with pytest.raises(InputError, match="reference"):
        rmsd(x, bad[2], device="cpu")
    with pytest.raises(InputError, match="at least 3"):
        superpose(x[:, :2], x[0, :2], device="cpu")
    with pytest.raises(InputError, match="at least 3"):
        rmsd(x, x[0], fit=[0, 1], atoms=np.arange(10), device="cpu")
    assert rmsd(x[:, :2], x[0, :2], device="cpu").shape == (3,)  # 1-2 atoms are fine for rmsd
    with pytest.raises(InputError, match="Structure"):
        rmsd(x, x[0], fit="ca", device="cpu")
    with pytest.raises(InputError, match="empty"):
        rmsd(x, x[0], fit=np.array([], dtype=int), device="cpu")
    with pytest.raises(InputError, match="shape"):
        rmsd(x[..., :2], x[0], device="cpu")
    with pytest.raises(InputError, match="weights"):
        rmsd(x, x[0], weights=np.ones(7), device="cpu")
    with pytest.raises(InputError, match="ref_frame"):
        rmsd(x, x, ref_frame=5, device="cpu")
    with pytest.raises(InputError, match="x and y"):
        pairwise_rmsd(x, x[:, :9], device="cpu")


def test_selection_errors(nmr):
    with pytest.raises(InputError, match="no atoms"):
        rmsd(nmr, nmr, fit="resname XYZ", device="cpu")
    heavy = nmr.select("heavy")
    assert rmsd(nmr, heavy, fit="ca", atoms="heavy", device="cpu").shape == (20,)
    with pytest.raises(InputError, match=r"atoms selection.*423.*217"):
        rmsd(nmr, heavy, fit="ca", atoms="protein", device="cpu")
    with pytest.raises(InputError, match=r"fit selection.*423.*217"):
        rmsd(nmr, heavy, device="cpu")


def test_docstring_examples():
    import doctest

    for module in (to_reference, pairwise):
        res = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert res.failed == 0 and res.attempted > 0, module.__name__


def test_cpu_path_imports_no_cupy():
    code = ("import numpy as np, sys; from protgpu import superpose as s; s = sys.modules['protgpu.superpose']; "
            "s.rmsd(np.ones((2,4,3)), np.ones((4,3)), device='cpu'); "
            "s.pairwise_rmsd(np.ones((2,4,3)), device='cpu'); assert 'cupy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("atom, fit, atoms", [(0, None, None), (7, None, None), (11, None, None),
                                              (3, np.arange(6), None), (9, np.arange(6), np.arange(6, 12)),
                                              (0, np.arange(4, 10), np.arange(10))])
def test_cpu_rmsd_names_the_frame_of_a_non_finite_used_coordinate(value, atom, fit, atoms):
    """The CPU rmsd() checks its result instead of scanning the coordinates: a NaN or infinite
    coordinate of any fitted or measured atom (the first atom, whose position shifts the frame's sums,
    included) still gives the one-line error naming the frame; one of an unused atom does not."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 12, 3)) * 5
    bad = x.copy()
    bad[3, atom, 2] = value
    with pytest.raises(InputError, match="frame 3"):
        rmsd(bad, x[0], fit=fit, atoms=atoms, device="cpu")
    unused = x.copy()
    unused[3, 11, 0] = value
    if fit is not None and atoms is None:  # atom 11 is neither fitted nor measured
        np.testing.assert_allclose(rmsd(unused, x[0], fit=fit, device="cpu"), rmsd(x, x[0], fit=fit, device="cpu"))
