"""CPU tests of protgpu.superpose: QCP against a float64 Kabsch (SVD) reference, MDTraj and the shared
reference values; invariances and degenerate inputs with hypothesis; the all-vs-all tiling; errors;
the CLI; and the CUDA kernel's logic, compiled as plain C++ (one thread per block) and held equal to
the NumPy twin."""

from __future__ import annotations

import ctypes
import importlib
import shutil
import subprocess
import sys
import threading
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from protgpu.errors import InputError
from protgpu.superpose import pairwise_rmsd, rmsd, superpose

# the module itself (protgpu.superpose the attribute is the function of that name)
sp = importlib.import_module("protgpu.superpose")

# --------------------------------------------------------------------------------------------------
# References


def kabsch(x, y, w=None):
    """float64 weighted Kabsch: (rmsd, R, t) with y ~ x @ R.T + t."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.ones(len(x)) if w is None else np.asarray(w, dtype=np.float64)
    cx = w @ x / w.sum()
    cy = w @ y / w.sum()
    a, b = x - cx, y - cy
    u, s, vt = np.linalg.svd((a * w[:, None]).T @ b)
    d = np.sign(np.linalg.det(u @ vt)) or 1.0
    r = (u @ np.diag([1, 1, d]) @ vt).T
    diff = a @ r.T - b
    return float(np.sqrt((w * (diff**2).sum(1)).sum() / w.sum())), r, cy - r @ cx


def random_rotation(rng):
    q = rng.normal(size=4)
    return sp._quaternion_to_rotation((q / np.linalg.norm(q))[None])[0]


def kabsch_rmsd_matrix(x, y):
    return np.array([[kabsch(a, b)[0] for b in y] for a in x])


@pytest.fixture(scope="module")
def nmr(shared_datasets):
    from protgpu.io import load

    return load(shared_datasets / "mdtraj" / "2EQQ.pdb")


@pytest.fixture(scope="module")
def adk(datasets):
    from protgpu.io import load

    return load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb")


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


# --------------------------------------------------------------------------------------------------
# Degenerate inputs


def _check_proper(rot):
    assert np.isfinite(rot).all()
    np.testing.assert_allclose(np.linalg.det(rot), 1.0, atol=1e-9)
    np.testing.assert_allclose(rot @ rot.transpose(0, 2, 1), np.broadcast_to(np.eye(3), rot.shape), atol=1e-9)


@pytest.mark.parametrize("case", ["identical", "collinear", "collinear-moved", "collinear-different", "planar",
                                  "two-atoms", "one-atom", "mirror-tetrahedron", "mirror-random", "all-same-point"])
def test_degenerate_inputs(case):
    rng = np.random.default_rng(6)
    rot = random_rotation(rng)
    line = np.outer(np.arange(8.0), [1, 2, 3]) + 5
    tet = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1.0]])
    pts = rng.normal(size=(12, 3))
    planar = pts * [1, 1, 0]
    x, y = {
        "identical": (pts, pts),
        "collinear": (line, line),
        "collinear-moved": (line @ rot.T + 3, line),
        "collinear-different": (line, np.outer(np.arange(8.0) ** 1.2, [3, 1, 0])),
        "planar": (planar @ rot.T - 2, planar),
        "two-atoms": (pts[:2], pts[2:4]),
        "one-atom": (pts[:1], pts[1:2]),
        "mirror-tetrahedron": (tet, tet * [1, 1, -1]),
        "mirror-random": (pts, pts * [1, 1, -1]),
        "all-same-point": (np.ones((4, 3)), np.full((4, 3), 2.0)),
    }[case]
    r = rmsd(x, y, device="cpu")
    expected = kabsch(x, y)[0]
    assert np.isfinite(r).all()
    assert r[0] == pytest.approx(expected, abs=1e-7)
    assert pairwise_rmsd(np.stack([x, y]), device="cpu")[0, 1] == pytest.approx(expected, abs=1e-6)
    if len(x) >= 3:
        res = superpose(x, y, device="cpu")
        _check_proper(res.rotation)
        direct = np.sqrt(((res.coords[0] - y) ** 2).sum(1).mean())
        assert direct == pytest.approx(expected, abs=1e-7)
        assert res.rmsd[0] == pytest.approx(direct, abs=1e-7)


def test_jacobi_fallback_matches_eigh():
    rng = np.random.default_rng(7)
    a = rng.normal(size=(50, 4, 4))
    a = a + a.transpose(0, 2, 1)
    a[:10] = np.diag([1.0, 3.0, 3.0, -7.0])  # repeated top eigenvalue
    k = [a[:, i, j] for i, j in ((0, 0), (0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (3, 3))]
    q = sp._jacobi_top_eigenvector(k)
    ev = np.linalg.eigvalsh(a)[:, -1]
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(np.einsum("pi,pij,pj->p", q, a, q), ev, atol=1e-10)


# --------------------------------------------------------------------------------------------------
# Hypothesis: invariances and the rotation's meaning

coord = st.floats(min_value=-50, max_value=50, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def structures(draw, min_atoms=3, max_atoms=12):
    n = draw(st.integers(min_atoms, max_atoms))
    pts = np.array(draw(st.lists(st.tuples(coord, coord, coord), min_size=n, max_size=n)), dtype=np.float64)
    return pts


@st.composite
def rigid_motions(draw):
    q = np.array(draw(st.tuples(*[st.floats(-1, 1, allow_nan=False)] * 4)))
    assume(np.linalg.norm(q) > 0.1)
    t = np.array(draw(st.tuples(coord, coord, coord)))
    return sp._quaternion_to_rotation((q / np.linalg.norm(q))[None])[0], t


def _scale(x):
    return max(1.0, float(np.abs(x - x.mean(0)).max()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(structures(), st.data(), rigid_motions(), rigid_motions())
def test_rmsd_invariant_under_rigid_motion(x, data, m1, m2):
    noise = np.array(data.draw(st.lists(st.tuples(*[st.floats(-2, 2, allow_nan=False)] * 3),
                                        min_size=len(x), max_size=len(x))))
    y = x + noise
    (r1, t1), (r2, t2) = m1, m2
    base = rmsd(x, y, device="cpu")[0]
    moved = rmsd(x @ r1.T + t1, y @ r2.T + t2, device="cpu")[0]
    assert np.isfinite(base)
    tol = 1e-7 * _scale(x) + 1e-9 * max(1.0, np.abs(t1).max(), np.abs(t2).max()) * _scale(x)
    assert abs(moved - base) <= max(tol, 2e-6)
    assert abs(base - kabsch(x, y)[0]) <= max(tol, 2e-6)


@settings(max_examples=60, deadline=None)
@given(structures(), rigid_motions())
def test_rotation_maps_mobile_onto_reference(y, motion):
    r, t = motion
    x = y @ r.T + t  # mobile is a moved copy: superposition must undo the motion
    res = superpose(x, y, device="cpu")
    _check_proper(res.rotation)
    scale = _scale(y)
    assert res.rmsd[0] <= 1e-6 * scale + 1e-9
    np.testing.assert_allclose(res.coords[0], y, atol=1e-6 * scale + 1e-6 * np.abs(t).max())


@settings(max_examples=40, deadline=None)
@given(structures(min_atoms=1, max_atoms=6), st.sampled_from(["self", "mirror", "collinear", "planar"]))
def test_degenerate_never_nan(x, kind):
    if kind == "mirror":
        y = x * [1, 1, -1]
    elif kind == "collinear":
        x = np.outer(x[:, 0], [1, -2, 0.5])
        y = np.outer(np.sort(x[:, 0]), [0, 1, 0])
    elif kind == "planar":
        x = x * [1, 1, 0]
        y = x[::-1] * [1, 0, 1]
    else:
        y = x
    r = rmsd(x, y, device="cpu")
    assert np.isfinite(r).all()
    assert r[0] == pytest.approx(kabsch(x, y)[0], abs=1e-6 * _scale(np.vstack([x, y])))
    if len(x) >= 3:
        _check_proper(superpose(x, y, device="cpu").rotation)


# --------------------------------------------------------------------------------------------------
# All-vs-all


@pytest.mark.parametrize("precision,tol", [("float64", 1e-6), ("float32", 1e-3)])
def test_pairwise_matches_kabsch(precision, tol):
    rng = np.random.default_rng(8)
    base = rng.normal(size=(50, 3)) * 8
    x = (base + rng.normal(size=(23, 50, 3)) * rng.uniform(0.001, 2, size=(23, 1, 1))).astype(np.float32)
    x = np.einsum("fij,fnj->fni", np.stack([random_rotation(rng) for _ in range(23)]), x).astype(np.float32)
    d = pairwise_rmsd(x, precision=precision, device="cpu")
    ref = kabsch_rmsd_matrix(x, x)
    assert d.dtype == np.float32 and d.shape == (23, 23)
    assert np.abs(d - ref).max() <= tol
    assert (d == d.T).all() and (np.diag(d) == 0).all()


@pytest.mark.parametrize("tile", [1, 4, 7, 64])
def test_tile_size_does_not_change_results(tile):
    rng = np.random.default_rng(9)
    x = rng.normal(size=(19, 15, 3)) * 3
    y = rng.normal(size=(11, 15, 3)) * 3
    full = sp._pairwise_numpy(x, tile=1000)
    np.testing.assert_array_equal(sp._pairwise_numpy(x, tile=tile), full)
    np.testing.assert_array_equal(sp._pairwise_numpy(x, y, tile=tile), sp._pairwise_numpy(x, y, tile=1000))
    cond = sp._pairwise_numpy(x, tile=tile, condensed=True)
    from scipy.spatial.distance import squareform

    np.testing.assert_array_equal(squareform(cond), full)


def _threads_input():
    rng = np.random.default_rng(21)
    base = rng.normal(size=(24, 3)) * 6
    x = base + rng.normal(size=(45, 24, 3)) * rng.uniform(0.01, 2, size=(45, 1, 1))
    x[7] = x[3] @ random_rotation(rng).T + 5  # a duplicate: its pair sits at a near-repeated root
    line = np.outer(np.arange(24.0), [1, 2, 0.5])
    x[20], x[21] = line, line[::-1] * 1.01  # collinear: the refine (Jacobi) path inside a worker
    return x


@pytest.mark.parametrize("threads", [2, 5, 16])
def test_thread_count_does_not_change_results(threads, monkeypatch, tmp_path):
    """The CPU path's pool: QCP row groups (here of ~150 pairs: several per tile, so the pool is used
    even on small data) and centring chunks on worker threads, the next tile's GEMM overlapping them,
    tiles written in order from the calling thread. Bitwise equal to one thread, for every output form."""
    import threading

    monkeypatch.setattr(sp, "_QCP_CHUNK_PAIRS", 150)
    monkeypatch.setattr(sp, "_CACHE_CHUNK_BYTES", 24 * 3 * 8 * 3 * 4)  # centring chunks of 4 frames
    x = _threads_input()
    y = x[::3] + 0.5
    w = np.random.default_rng(2).uniform(0.5, 2, 24)
    main = threading.get_ident()
    seen = set()
    qcp = sp._qcp_rmsd_only

    def spy(*args):
        seen.add(threading.get_ident())
        return qcp(*args)

    monkeypatch.setattr(sp, "_qcp_rmsd_only", spy)
    for kw, tile in (({}, None), ({}, 16), ({"weights": w[::2], "fit": np.arange(0, 24, 2)}, 16),
                     ({"precision": "float32"}, None)):
        seen.clear()
        one = sp._pairwise_numpy(x, tile=tile, out_dtype=np.float64, threads=1, **kw)
        assert seen == {main}
        seen.clear()
        many = sp._pairwise_numpy(x, tile=tile, out_dtype=np.float64, threads=threads, **kw)
        assert seen and main not in seen  # the groups ran on the pool
        np.testing.assert_array_equal(many, one)
        if not kw:
            np.testing.assert_array_equal(sp._pairwise_numpy(x, y, tile=tile, threads=threads),
                                          sp._pairwise_numpy(x, y, tile=tile, threads=1))
    # Tiles of 8 frames into memmaps (dense and condensed): every tile lands where it belongs.
    one = sp._pairwise_numpy(x, tile=8, out_dtype=np.float64, threads=1)
    mm = np.lib.format.open_memmap(tmp_path / "d.npy", mode="w+", dtype=np.float64, shape=(45, 45))
    assert sp._pairwise_numpy(x, tile=8, out=mm, threads=threads) is mm
    np.testing.assert_array_equal(np.load(tmp_path / "d.npy"), one)
    cm = np.lib.format.open_memmap(tmp_path / "c.npy", mode="w+", dtype=np.float64, shape=(45 * 44 // 2,))
    sp._pairwise_numpy(x, tile=8, out=cm, condensed=True, threads=threads)
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), one[np.triu_indices(45, 1)])


def test_cpu_split_never_oversubscribes():
    """The CPU all-vs-all's QCP pool and BLAS threads together fit the cores (from 2 up), each >= 1."""
    for n in range(1, 129):
        q, b = sp._cpu_split(n)
        assert q >= 1 and b >= 1 and (q + b <= n or n == 1), n
    assert sp._cpu_split(16) == (4, 12)


def test_blas_threads_limits_blas_inside_the_block():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    blas = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    if not blas:
        pytest.skip("no BLAS library found by threadpoolctl")
    with sp._blas_threads(1):
        # the BLAS libraries loaded when protgpu first limited them: NumPy's among them
        assert all(lib.num_threads == 1 for lib in sp._BLAS_CONTROLLER[0].select(user_api="blas").lib_controllers)
        info = threadpoolctl.threadpool_info()
        assert all(i["num_threads"] == 1 for i in info if i["user_api"] == "blas" and "numpy" in i["filepath"])


def test_rmsd_qcp_groups_do_not_change_results(monkeypatch):
    """rmsd()/superpose()'s CPU path runs the QCP on groups of frames (and the moments on chunks): the
    same bits with groups of 7 frames and chunks of 4 as with one of each, and with tasks of 6 frames
    on a pool of 3 threads, with a self frame (re-measured), weights, fit and measured atoms."""
    x = _threads_input().astype(np.float32)
    ref = np.asarray(x[3], dtype=np.float64)
    w = np.random.default_rng(4).uniform(0.5, 2, 24)
    fit, meas = np.arange(0, 24, 2), np.arange(5, 20)
    cases = (((x, (ref, None)), {}),
             ((x, (ref[fit], ref[meas])), {"fit": fit, "meas": meas, "w_fit": w[fit], "w_meas": w[meas]}))
    whole = [sp._rmsd_numpy(*args, **kw, want_coords=True, threads=1) for args, kw in cases]
    monkeypatch.setattr(sp, "_CACHE_CHUNK_BYTES", 24 * 3 * 8 * 3 * 4)
    monkeypatch.setattr(sp, "_QCP_CHUNK_PAIRS", 7)
    for (args, kw), want in zip(cases, whole, strict=True):
        for got, exp in zip(sp._rmsd_numpy(*args, **kw, want_coords=True, threads=1), want, strict=True):
            np.testing.assert_array_equal(got, exp)
    # tasks of 6 frames on a pool of 3 threads
    monkeypatch.setattr(sp, "_CPU_CHUNK_BYTES", 24 * 3 * 8 * 3 * 6)
    import threading

    seen = set()
    real = sp._rmsd_numpy_frames
    monkeypatch.setattr(sp, "_rmsd_numpy_frames", lambda *a: seen.add(threading.get_ident()) or real(*a))
    for (args, kw), want in zip(cases, whole, strict=True):
        for got, exp in zip(sp._rmsd_numpy(*args, **kw, want_coords=True, threads=3), want, strict=True):
            np.testing.assert_array_equal(got, exp)
    assert seen and threading.get_ident() not in seen  # on the pool
    assert whole[0][0].shape == (45,) and whole[0][0][3] < 1e-12


def test_pairwise_worker_error_propagates(monkeypatch):
    monkeypatch.setattr(sp, "_QCP_CHUNK_PAIRS", 150)

    def boom(*args):
        raise FloatingPointError("in a worker")

    monkeypatch.setattr(sp, "_qcp_rmsd_only", boom)
    with pytest.raises(FloatingPointError, match="in a worker"):
        sp._pairwise_numpy(_threads_input(), tile=16, threads=2)


def test_pairwise_cpu_twin_unchanged_on_real_frames(adk):
    """Pairs of AdK frames (real spectra, self pairs, a moved copy of a frame) on the pool against a
    float64 Kabsch reference; the copy keeps the QCP formula's noise (module notes)."""
    x = np.asarray(adk.coords[:12], dtype=np.float64)[:, ::7]
    x = np.concatenate([x, x[4:5] @ random_rotation(np.random.default_rng(3)).T + 9])
    d = sp._pairwise_numpy(x, out_dtype=np.float64, threads=2)
    np.testing.assert_allclose(d, kabsch_rmsd_matrix(x, x), atol=1e-6)
    assert d[4, 12] < 1e-5 and (np.diag(d) == 0).all() and (d == d.T).all()


def test_scoring_kabsch_uses_this_qcp():
    """protgpu.scoring._kabsch (the TM-score search's fits from sums, the RMSD column) is this module's
    QCP twin with per-model weights and references: equal to rmsd()/superpose() model by model and to
    a float64 Kabsch; an empty subset gives the identity (and RMSD NaN, as the aligned_rmsd kernel)."""
    from protgpu.scoring import _kabsch

    rng = np.random.default_rng(22)
    x = rng.normal(size=(6, 30, 3)) * 7 + 40
    y = np.stack([a @ random_rotation(rng).T + rng.normal(size=(30, 3)) * s for a, s in
                  zip(x, [0, 0.3, 1, 2, 3, 4], strict=True)])
    w = (rng.random((6, 30)) < 0.6).astype(float)
    w[0] = 1.0  # a model identical to its reference up to a rotation: re-measured on the coordinates
    w[5] = 0.0
    rot, t, r = _kabsch.superpose(x, y, w)
    for s in range(5):
        m = w[s] > 0
        ref_r, ref_rot, ref_t = kabsch(x[s][m], y[s][m])
        assert r[s] == pytest.approx(ref_r, abs=1e-9)
        assert r[s] == pytest.approx(float(rmsd(x[s][m], y[s][m], device="cpu")[0]), abs=1e-12)
        np.testing.assert_allclose(rot[s], ref_rot, atol=1e-9)
        np.testing.assert_allclose(t[s], ref_t, atol=1e-7)
    assert r[0] < 1e-12 and np.isnan(r[5]) and (rot[5] == np.eye(3)).all()
    n = w.sum(1)
    rs, ts = _kabsch.superpose_from_sums(n, np.einsum("sn,sni->si", w, x), np.einsum("sn,sni->si", w, y),
                                         np.einsum("sn,sni,snj->sij", w, x, y))
    np.testing.assert_allclose(rs, rot, atol=1e-9)
    np.testing.assert_allclose(ts, t, atol=1e-6)
    _check_proper(rs)
    with pytest.raises(TypeError, match="NumPy only"):
        _kabsch.superpose(x, y, xp=object())


def test_pairwise_equals_loop_of_rmsd_and_xy():
    rng = np.random.default_rng(10)
    x = rng.normal(size=(9, 20, 3)) * 5
    y = rng.normal(size=(4, 20, 3)) * 5
    loop = np.stack([rmsd(x, y[j], device="cpu") for j in range(4)], axis=1)
    np.testing.assert_allclose(pairwise_rmsd(x, y, device="cpu"), loop, atol=2e-6)
    w = rng.uniform(0.5, 3, 20)
    loopw = np.stack([rmsd(x, y[j], weights=w, device="cpu") for j in range(4)], axis=1)
    np.testing.assert_allclose(pairwise_rmsd(x, y, weights=w, device="cpu"), loopw, atol=2e-6)
    fit = np.arange(0, 20, 2)
    loopf = np.stack([rmsd(x, y[j], fit=fit, device="cpu") for j in range(4)], axis=1)
    np.testing.assert_allclose(pairwise_rmsd(x, y, fit=fit, device="cpu"), loopf, atol=2e-6)


def test_pairwise_out_memmap_and_condensed(tmp_path):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(13, 10, 3))
    mm = np.lib.format.open_memmap(tmp_path / "d.npy", mode="w+", dtype=np.float64, shape=(13, 13))
    ret = pairwise_rmsd(x, out=mm, device="cpu")
    assert ret is mm
    ref = kabsch_rmsd_matrix(x, x)
    np.testing.assert_allclose(np.load(tmp_path / "d.npy"), ref, atol=1e-9)
    c = pairwise_rmsd(x, condensed=True, device="cpu")
    assert c.shape == (78,)
    np.testing.assert_allclose(c, ref[np.triu_indices(13, 1)], atol=1e-5)
    with pytest.raises(InputError, match="shape"):
        pairwise_rmsd(x, out=np.empty((13, 12), np.float32), device="cpu")
    with pytest.raises(InputError, match="condensed"):
        pairwise_rmsd(x, x, condensed=True, device="cpu")
    with pytest.raises(InputError, match="precision"):
        pairwise_rmsd(x, precision="float16", device="cpu")


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


def test_torch_cpu_roundtrip():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    x = rng.normal(size=(4, 10, 3))
    out = rmsd(torch.from_numpy(x), x[0], device="cpu")
    assert isinstance(out, torch.Tensor)
    np.testing.assert_allclose(out.numpy(), rmsd(x, x[0], device="cpu"))


def test_docstring_examples():
    import doctest

    res = doctest.testmod(sp, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.failed == 0


def test_cpu_path_imports_no_cupy():
    code = ("import numpy as np, sys; from protgpu import superpose as s; s = sys.modules['protgpu.superpose']; "
            "s.rmsd(np.ones((2,4,3)), np.ones((4,3)), device='cpu'); "
            "s.pairwise_rmsd(np.ones((2,4,3)), device='cpu'); assert 'cupy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------------------------------
# CLI


def _cli(argv):
    import argparse

    from protgpu.cli import _common_parsers
    from protgpu.commands import rmsd as cmd

    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers(dest="command"), _common_parsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_rmsd(shared_datasets, tmp_path, capsys):
    pdb = str(shared_datasets / "mdtraj" / "2EQQ.pdb")
    out = tmp_path / "r.npz"
    aligned = tmp_path / "aligned.pdb"
    assert _cli(["rmsd", pdb, "--ref", pdb, "--fit", "ca", "--select", "heavy", "--out", str(out),
                 "--superpose-out", str(aligned), "-q"]) == 0
    got = np.load(out)
    from protgpu.io import load

    s = load(pdb)
    np.testing.assert_allclose(got["rmsd"], rmsd(s, s, fit="ca", atoms="heavy", device="cpu"), atol=1e-6)
    assert list(got["frame"]) == list(range(20))
    moved = load(aligned)
    assert moved.n_frames == 20 and moved.n_atoms == s.n_atoms
    ca = s.select_indices("ca")
    # aligned CA atoms sit on the reference's (PDB keeps 3 decimals)
    d = np.sqrt(((moved.coords[:, ca] - s.coords[0, ca]) ** 2).sum(-1).mean(-1))
    np.testing.assert_allclose(d, rmsd(s, s, fit="ca", device="cpu"), atol=2e-3)
    assert _cli(["rmsd", pdb, "--ref", pdb, "--select", "ca", "--out", str(tmp_path / "r.csv"), "-q"]) == 0
    assert (tmp_path / "r.csv").read_text().startswith("input,frame,rmsd_angstrom\n")
    with pytest.raises(InputError, match="--out"):
        _cli(["rmsd", pdb, "--ref", pdb, "--out", str(tmp_path / "r.txt")])


def test_cli_pairwise(datasets, tmp_path, capsys):
    dcd, top = str(datasets / "adk_dims.dcd"), str(datasets / "adk_open.pdb")
    out = tmp_path / "d.npy"
    assert _cli(["pairwise-rmsd", dcd, "--top", top, "--select", "ca", "--out", str(out), "-q"]) == 0
    d = np.load(out)
    from protgpu.io import load

    s = load(dcd, top=top).select("ca")
    np.testing.assert_allclose(d, pairwise_rmsd(s, device="cpu"), atol=1e-6)
    assert _cli(["pairwise-rmsd", dcd, "--top", top, "--select", "ca", "--condensed", "--out",
                 str(tmp_path / "c.npz"), "-q"]) == 0
    c = np.load(tmp_path / "c.npz")
    assert c["rmsd"].shape == (98 * 97 // 2,) and len(c["frame"]) == 98
    pytest.importorskip("matplotlib")
    png = tmp_path / "h.png"
    assert _cli(["pairwise-rmsd", dcd, "--top", top, "--select", "ca", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "98 frames" in capsys.readouterr().out


def test_cli_pairwise_zarr_equals_npy(datasets, tmp_path):
    try:
        import zarr
    except ImportError:  # without zarr (the test extra installs it): a clear error instead
        with pytest.raises(InputError, match="zarr"):
            _cli(["pairwise-rmsd", str(datasets / "adk_open.pdb"), "--out", str(tmp_path / "d.zarr")])
        return
    for out in ("d.zarr", "d.npy"):
        assert _cli(["pairwise-rmsd", str(datasets / "adk_closed.pdb"), str(datasets / "adk_open.pdb"), "--select",
                     "ca", "--out", str(tmp_path / out), "-q"]) == 0
    z = zarr.open_array(str(tmp_path / "d.zarr"), mode="r")
    assert z.shape == (2, 2) and z[0, 1] > 1
    np.testing.assert_array_equal(z[:], np.load(tmp_path / "d.npy"))


# --------------------------------------------------------------------------------------------------
# qcp.cu itself on the host: compiled as C++20 with one std::thread per CUDA thread (warp shuffles and
# __syncthreads through barriers), blocks one after the other. Each entry point gets a generated
# wrapper host_<entry>(gx, gy, bx, by, <its parameters>) that runs it over a grid.


_PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
using std::sqrt; using std::fabs; using std::fmin; using std::fmax; using std::copysign; using std::isnan;
using std::fma;
struct pg_dim3 { unsigned x, y, z; };
static thread_local pg_dim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0};
static pg_dim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
static std::barrier<>* g_block_bar = nullptr;
static std::vector<std::barrier<>*> g_warp_bar;
static double g_xchg[64][32];
static inline int pg_tid() { return (int)(threadIdx.y * blockDim.x + threadIdx.x); }
static inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
static inline double __shfl_xor_sync(unsigned, double v, int off) {
    const int t = pg_tid(), lane = t & 31, w = t >> 5;
    g_xchg[w][lane] = v;
    g_warp_bar[w]->arrive_and_wait();
    const double r = g_xchg[w][lane ^ off];
    g_warp_bar[w]->arrive_and_wait();
    return r;
}
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
static inline double2 make_double2(double x, double y) { return {x, y}; }
// One std::thread per thread of a block, each walking all the blocks in order; a barrier closes each
// block (its __shared__ arrays are statics, reused by the next block).
static void run_grid(int gx, int gy, int bx, int by, const std::function<void()>& body) {
    const int nt = bx * by;
    blockDim = {(unsigned)bx, (unsigned)by, 1};
    gridDim = {(unsigned)gx, (unsigned)gy, 1};
    std::barrier<> bb(nt);
    g_block_bar = &bb;
    std::vector<std::unique_ptr<std::barrier<>>> own;
    g_warp_bar.clear();
    for (int w = 0; w < (nt + 31) / 32; ++w) {
        own.emplace_back(new std::barrier<>(nt - 32 * w < 32 ? nt - 32 * w : 32));
        g_warp_bar.push_back(own.back().get());
    }
    std::vector<std::thread> th;
    for (int t = 0; t < nt; ++t)
        th.emplace_back([&, t] {
            threadIdx = {(unsigned)(t % bx), (unsigned)(t / bx), 0};
            for (int yb = 0; yb < gy; ++yb)
                for (int xb = 0; xb < gx; ++xb) {
                    blockIdx = {(unsigned)xb, (unsigned)yb, 0};
                    body();
                    bb.arrive_and_wait();
                }
        });
    for (auto& x : th) x.join();
}
"""


def _host_wrappers():
    """``extern "C" host_<entry>(int gx, int gy, int bx, int by, <params>)`` for every entry point."""
    import re

    from protgpu._cuda import loader

    src = loader.read_source("qcp")
    out = []
    for m in loader._ENTRY.finditer(src):
        name, params = m.group(1), m.group(2)
        names = [loader._parse_param(q).name for q in params.split(",") if q.strip()]
        out.append(f'extern "C" void host_{name}(int gx, int gy, int bx, int by, {params}) '
                   f'{{ run_grid(gx, gy, bx, by, [=] {{ {name}({", ".join(names)}); }}); }}')
    assert out and not re.search(r"\bhost_\w+\(int gx, int gy, int bx, int by, \)", "\n".join(out))
    return "\n".join(out)


class _HostKernels:
    """The host build: ``kernels.<entry>(grid, block, *args)`` runs an entry point (arguments: NumPy
    arrays or None for pointers, Python numbers for scalars, as protgpu._cuda.launch takes them)."""

    def __init__(self, so):
        from protgpu._cuda import loader

        self.so, self.params = so, loader.entry_points("qcp")
        for entry, params in self.params.items():
            fn = getattr(so, f"host_{entry}")
            types = [ctypes.c_int] * 4
            for prm in params:
                if prm.pointer:
                    types.append(ctypes.c_void_p)
                else:
                    types.append({np.float64: ctypes.c_double, np.float32: ctypes.c_float, np.int32: ctypes.c_int,
                                  np.int64: ctypes.c_longlong}[prm.dtype])
            fn.argtypes = types

    def run(self, entry, grid, block, *args):
        grid, block = tuple(grid) + (1,) * (2 - len(grid)), tuple(block) + (1,) * (2 - len(block))
        conv = []
        for prm, v in zip(self.params[entry], args, strict=True):
            if prm.pointer:
                if v is not None:
                    assert isinstance(v, np.ndarray) and v.dtype == np.dtype(prm.dtype) and v.flags.c_contiguous, \
                        (entry, prm.name)
                conv.append(None if v is None else v.ctypes.data)
            else:
                conv.append(v)
        getattr(self.so, f"host_{entry}")(grid[0], grid[1], block[0], block[1], *conv)


_HOST_PAIR_BLOCK = (32, 2)  # the host build's pair blocks: 64 threads (the GPU's are 32 x 8)


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the host emulation of qcp.cu")
    from protgpu._cuda.loader import build_source

    d = tmp_path_factory.mktemp("qcp_host")
    defines = {**sp._qcp_defines(), "PAIR_BY": _HOST_PAIR_BLOCK[1]}
    src = _PRELUDE + build_source("qcp", defines).replace("#pragma once", "") + "\n" + _host_wrappers()
    (d / "qcp.cpp").write_text(src)
    lib = d / "qcp.so"
    proc = subprocess.run([cxx, "-O1", "-std=c++20", "-pthread", "-shared", "-fPIC", str(d / "qcp.cpp"), "-o",
                           str(lib)], capture_output=True, text=True)
    if proc.returncode != 0:
        if "barrier" in proc.stderr:
            pytest.skip(f"{cxx} lacks C++20 <barrier>")
        raise AssertionError(proc.stderr[-3000:])
    return _HostKernels(ctypes.CDLL(str(lib)))


def _host_rmsd(hk, x, y, w=None, fit=None, block=64):
    """The three frame kernels in sequence, as _rmsd_cuda launches them (small blocks: few threads)."""
    yc, cy, gb, inv_w = sp._centre_reference(np.asarray(y, np.float64), w)
    f, n_atoms = x.shape[:2]
    n = len(yc)
    ref, wyc = sp._reference_operands(yc, w)
    idx = None if fit is None else np.asarray(fit, np.int32)
    sfx = "f32" if x.dtype == np.float32 else "f64"
    x = np.ascontiguousarray(x)
    mom = np.full((f, 13), np.nan)
    grid = (-(-f // (block // 32)),)
    hk.run(f"frame_moments_{sfx}", grid, (block,), x, idx, ref, mom, f, n_atoms, n, int(w is not None), inv_w,
           *map(float, wyc))
    r, rot, t = np.full(f, np.nan), np.full((f, 3, 3), np.nan), np.full((f, 3), np.nan)
    hk.run("qcp_frames", (-(-f // 32),), (32,), mom, r, rot, t, f, gb, inv_w, *map(float, cy))
    hk.run(f"frame_direct_{sfx}", grid, (block,), x, idx, ref, mom, rot, r, f, n_atoms, n, int(w is not None), gb,
           inv_w, sp._DIRECT_TAU)
    return r, rot, t, mom


def _host_aligned_rmsd(hk, x, y, n_ali, warps=2):
    m, lmax = x.shape[:2]
    out = np.full(m, -1.0)
    sfx = "f32" if x.dtype == np.float32 else "f64"
    hk.run(f"aligned_rmsd_{sfx}", (-(-m // warps),), (32 * warps,), np.ascontiguousarray(x), np.ascontiguousarray(y),
           1 if y.shape[0] == m and m > 1 else 0, np.asarray(n_ali, np.int32), lmax, m, sp._DIRECT_TAU, out)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_host_kernel_aligned_rmsd_equals_twin_whatever_the_batch(host_kernels, dtype):
    """The scores' RMSD column kernel (aligned_rmsd_*): equal to the float64 Kabsch twin, and bitwise the
    same value for a model alone, in a batch, reversed, or with a longer padded length."""
    from protgpu.scoring import tmscore as tm_mod

    rng = np.random.default_rng(21)
    n_ali = np.array([3, 31, 32, 33, 70, 70])
    lmax = 72
    y = rng.normal(0, 12, (len(n_ali), lmax, 3))
    x = y + rng.normal(0, 1.0, y.shape) + 30.0
    x[-1] = y[-1] - 5.0  # a translated copy: the near-identical branch measures it on the coordinates
    x, y = x.astype(dtype), y.astype(dtype)
    for i, n in enumerate(n_ali):
        x[i, n:], y[i, n:] = 1e6, -1e6  # padding is never read
    got = _host_aligned_rmsd(host_kernels, x, y, n_ali)
    want = tm_mod._common_rmsd(x.astype(np.float64), y.astype(np.float64), n_ali, np)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    assert got[-1] < 1e-6
    for i, n in enumerate(n_ali):
        alone = _host_aligned_rmsd(host_kernels, x[i:i + 1, :n], y[i:i + 1, :n], n_ali[i:i + 1], warps=1)
        assert alone[0] == got[i]
    rev = _host_aligned_rmsd(host_kernels, x[::-1], y[::-1], n_ali[::-1], warps=3)
    assert np.array_equal(rev[::-1], got)
    shared = _host_aligned_rmsd(host_kernels, x[4:6], y[4:5], n_ali[4:6])
    np.testing.assert_allclose(shared, tm_mod._common_rmsd(x[4:6].astype(np.float64), y[4:5].astype(np.float64),
                                                           n_ali[4:6], np), rtol=1e-9, atol=1e-9)
    empty = _host_aligned_rmsd(host_kernels, x[:1], y[:1], np.array([0]))
    assert np.isnan(empty[0])


@pytest.mark.parametrize("dtype, n_atoms", [(np.float32, 37), (np.float64, 37), (np.float32, 40), (np.float32, 532)])
def test_host_kernel_frames_equal_numpy_twin(host_kernels, dtype, n_atoms):
    """frame_moments -> qcp_frames -> frame_direct against the NumPy twin. 37 atoms: the scalar path
    (MOMENT_UNROLL atoms per lane per step, the last step mostly past the end); 40 and 532 float32
    atoms without an index array: the float4 path (quads of atoms; 532 = one full step of 4 quads per
    lane and a second of 5 quads), with an index array: the scalar path."""
    rng = np.random.default_rng(14)
    x = (rng.normal(size=(13, n_atoms, 3)) * 5 + 40).astype(dtype)
    y = rng.normal(size=(n_atoms, 3)) * 5
    x[4] = y + 7.0  # a translated copy: re-measured by frame_direct (both twins)
    w = rng.uniform(0.2, 3, n_atoms)
    fit = np.array([36, 2, 5, 11, 30, 17, 0, 9])
    for ww, ff in ((None, None), (w, None), (None, fit), (w[fit], fit)):
        yy = y if ff is None else y[ff]
        r, rot, t, mom = _host_rmsd(host_kernels, x, yy, ww, ff)
        r0, rot0, t0, _ = sp._rmsd_numpy(x, (yy, None), fit=ff, w_fit=ww)
        np.testing.assert_allclose(r, r0, atol=1e-10)
        np.testing.assert_allclose(rot, rot0, atol=1e-9)
        np.testing.assert_allclose(t, t0, atol=1e-8)
        # the moments themselves against the twin's
        yc, _cy, _gb, inv_w = sp._centre_reference(yy, ww)
        cx, ga, m = sp._moments_numpy(x if ff is None else x[:, ff], sp._moment_operands(yc, ww, inv_w))
        np.testing.assert_allclose(mom[:, :9], m.reshape(-1, 9), rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(mom[:, 9], ga, rtol=1e-12)
        np.testing.assert_allclose(mom[:, 10:], cx, rtol=1e-13)
        xs = x[4] if ff is None else x[4, ff]
        assert r[4] == pytest.approx(kabsch(xs, yy, ww)[0], abs=1e-10)  # re-measured: no sqrt of noise


def test_host_kernel_degenerate_cases(host_kernels):
    tet = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1.0]])
    line = np.outer(np.arange(6.0), [1, 2, 3])
    for x, y in ((tet, tet * [1, 1, -1]), (line, line), (line, line[::-1] * 1.1), (tet[:1], tet[1:2]),
                 (tet[:2], tet[2:]), (np.zeros((3, 3)), np.zeros((3, 3)))):
        r, rot, _, _ = _host_rmsd(host_kernels, x[None].astype(np.float64), y, block=32)
        r0, rot0, _, _ = sp._rmsd_numpy(x[None], (y, None))
        assert np.isfinite(r).all() and np.isfinite(rot).all()
        assert r[0] == pytest.approx(r0[0], abs=1e-9)
        assert r[0] == pytest.approx(kabsch(x, y)[0], abs=1e-7)
        assert np.linalg.det(rot[0]) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("in_dtype", [np.float32, np.float64])
def test_host_kernel_centre_frames(host_kernels, in_dtype):
    rng = np.random.default_rng(21)
    x = (rng.normal(size=(5, 45, 3)) * 4 + 30).astype(in_dtype)
    w = rng.uniform(0.5, 2.0, 45)
    fit = np.arange(44, 0, -3)
    for ww, ff in ((None, None), (w, None), (w[fit], fit)):
        a0, g0 = sp._centre_frames_numpy(x, ww, ff)
        n = a0.shape[1]
        inv_w = 1.0 / (n if ww is None else ww.sum())
        for prec in (np.float32, np.float64):
            a = np.full((15, n), np.nan, dtype=prec)
            g = np.full(5, np.nan)
            name = f"centre_frames_{'f32' if in_dtype == np.float32 else 'f64'}_b{np.dtype(prec).itemsize * 8}"
            host_kernels.run(name, (2,), (64,), np.ascontiguousarray(x), None if ff is None else ff.astype(np.int32),
                             ww, None if ww is None else np.sqrt(ww), a, g, 5, 45, n, inv_w)
            np.testing.assert_allclose(a, a0.astype(prec), rtol=1e-6 if prec == np.float32 else 1e-12, atol=1e-12)
            np.testing.assert_allclose(g, g0, rtol=1e-12)


def _host_pairs(hk, name, blocks, p0, g_a, g_b, dst, i0, i1, j0, j1, out_ld, out_row0, out_col0, n_total, inv_w,
                mode):
    """qcp_pairs_* then qcp_refine_* over a tile, as _PairPlan.qcp launches them."""
    ti, tj = i1 - i0, j1 - j0
    bx, by = _HOST_PAIR_BLOCK
    grid = (-(-tj // bx), -(-ti // by))
    args = (blocks, blocks.shape[1], 3 * (j0 - p0), g_a, g_b, dst, ti, tj, i0, j0, out_ld, out_row0, out_col0,
            n_total, inv_w, mode)
    hk.run(f"qcp_pairs_{name}", grid, _HOST_PAIR_BLOCK, *args)
    hk.run(f"qcp_refine_{name}", grid, _HOST_PAIR_BLOCK, *args)


@pytest.mark.parametrize("blocks_dtype,out_dtype", [(np.float64, np.float64), (np.float32, np.float32),
                                                    (np.float64, np.float32), (np.float32, np.float64)])
def test_host_kernel_pairs_all_modes(host_kernels, blocks_dtype, out_dtype):
    rng = np.random.default_rng(15)
    x = rng.normal(size=(41, 12, 3)) * 4
    x[7] = x[3] @ random_rotation(rng).T  # a duplicate pair: l_max at a near-repeated root? refined or not
    line = np.outer(np.arange(12.0), [1, 2, 0.5])
    x[20], x[21] = line, line[::-1] * 1.01  # collinear frames: a repeated l_max, the refine kernel's case
    prec = np.dtype(blocks_dtype)
    a, g = sp._centre_frames_numpy(x, None, None)
    a = a.astype(prec)
    f, n = len(g), a.shape[1]
    twin = sp._pairwise_numpy(x, precision=prec.name, out_dtype=np.float64)
    name = f"b{prec.itemsize * 8}_o{np.dtype(out_dtype).itemsize * 8}"
    tol = 1e-6 if out_dtype == np.float32 else 1e-12
    # Resident dense matrix: strips of 16 rows against panels of 24 columns from the diagonal on, mirrored.
    dst = np.full((f, f), np.nan, dtype=out_dtype)
    for i0 in range(0, f, 16):
        i1 = min(f, i0 + 16)
        for p0 in range(i0, f, 24):
            p1 = min(f, p0 + 24)
            blocks = np.ascontiguousarray(a[3 * i0:3 * i1] @ a[3 * p0:3 * p1].T)
            _host_pairs(host_kernels, name, blocks, p0, g, g, dst, i0, i1, p0, p1, f, i0, p0, f, 1.0 / n,
                        sp._MIRROR | sp._UPPER_ONLY | sp._ZERO_DIAG)
    np.testing.assert_allclose(dst, twin, atol=tol)
    assert (dst == dst.T).all() and (np.diag(dst) == 0).all()
    # Condensed, tiles of a panel (column offset within the panel's blocks).
    cond = np.full(f * (f - 1) // 2, np.nan, dtype=out_dtype)
    for i0 in range(0, f, 9):
        i1 = min(f, i0 + 9)
        blocks = np.ascontiguousarray(a[3 * i0:3 * i1] @ a[3 * i0:].T)
        for j0 in range(i0, f, 9):
            _host_pairs(host_kernels, name, blocks, i0, g, g, cond, i0, i1, j0, min(f, j0 + 9), 0, 0, 0, f, 1.0 / n,
                        sp._CONDENSED)
    np.testing.assert_allclose(cond, twin[np.triu_indices(f, 1)], atol=tol)
    # A tile buffer (local coordinates) of an off-diagonal tile taken from the middle of a panel.
    tile = np.full((4, 6), np.nan, dtype=out_dtype)
    blocks = np.ascontiguousarray(a[3 * 2:3 * 6] @ a[3 * 5:3 * 30].T)
    _host_pairs(host_kernels, name, blocks, 5, g, g, tile, 2, 6, 19, 25, 6, 0, 0, f, 1.0 / n, 0)
    np.testing.assert_allclose(tile, twin[2:6, 19:25], atol=tol)
    # A diagonal tile buffer, mirrored within itself (what _pairwise_tiles_cuda yields).
    tile = np.full((9, 9), np.nan, dtype=out_dtype)
    blocks = np.ascontiguousarray(a[3 * 18:3 * 27] @ a[3 * 18:3 * 27].T)
    _host_pairs(host_kernels, name, blocks, 18, g, g, tile, 18, 27, 18, 27, 9, 0, 0, f, 1.0 / n,
                sp._MIRROR | sp._UPPER_ONLY | sp._ZERO_DIAG)
    np.testing.assert_allclose(tile, twin[18:27, 18:27], atol=tol)


def test_host_kernel_refine_pass_is_used(host_kernels):
    """Collinear frames put l_max at a repeated root: the main kernel leaves the sentinel, and the result
    after the refine pass equals the twin's quaternion path (which the sentinel must never leak past)."""
    line = np.outer(np.arange(10.0), [1, 2, 0.5])
    x = np.stack([line, line * 1.02 + 3, line[::-1]])
    a, g = sp._centre_frames_numpy(x, None, None)
    blocks = np.ascontiguousarray(a @ a.T)
    out = np.full((3, 3), np.nan)
    args = (blocks, blocks.shape[1], 0, g, g, out, 3, 3, 0, 0, 3, 0, 0, 3, 0.1, sp._MIRROR | sp._UPPER_ONLY |
            sp._ZERO_DIAG)
    host_kernels.run("qcp_pairs_b64_o64", (1, 2), _HOST_PAIR_BLOCK, *args)
    assert (out[np.triu_indices(3, 1)] == -1.0).any()  # PAIR_REFINE left for the second pass
    host_kernels.run("qcp_refine_b64_o64", (1, 2), _HOST_PAIR_BLOCK, *args)
    np.testing.assert_allclose(out, sp._pairwise_numpy(x, out_dtype=np.float64), atol=1e-12)
    np.testing.assert_allclose(out, kabsch_rmsd_matrix(x, x), atol=1e-7)


# --------------------------------------------------------------------------------------------------
# The GPU path's orchestration (chunks, tiles, modes, streaming through pinned buffers, argument order
# checked against the parsed .cu signatures) on a fake device: a NumPy-backed stand-in for CuPy and
# the host-compiled kernels. The lead's GPU suite runs the real thing.


class _FakeDeviceArray(np.ndarray):
    def get(self, stream=None, out=None, blocking=True):
        if out is None:
            return np.array(self)
        out[...] = self
        return out


def _fake_cupy():
    import types

    def dev(a):
        return np.asarray(a).view(_FakeDeviceArray)

    class Event:
        def synchronize(self):
            pass

    class Stream:
        def __init__(self, non_blocking=False):
            pass

        def record(self):
            return Event()

        def wait_event(self, ev):
            pass

        def synchronize(self):
            pass

    cp = types.ModuleType("cupy")
    cp.ndarray = _FakeDeviceArray
    cp.float64, cp.float32, cp.int32 = np.float64, np.float32, np.int32
    cp.asarray = lambda a, dtype=None: dev(np.asarray(a, dtype=dtype))
    cp.ascontiguousarray = lambda a, dtype=None: dev(np.ascontiguousarray(a, dtype=dtype))

    def empty(shape, dtype=np.float64):
        # device memory is not cleared: poison it, so that an element a kernel should write but does not shows
        out = np.empty(shape, dtype=dtype)
        out.fill(np.nan if out.dtype.kind == "f" else 0x5A)
        return dev(out)

    cp.empty = empty
    cp.arange = lambda *a: dev(np.arange(*a))
    cp.einsum = lambda *a, **k: dev(np.einsum(*a, **k))
    cp.matmul = lambda *a, **k: dev(np.matmul(*a, **k))
    cp.sqrt = lambda *a, **k: dev(np.sqrt(*a, **k))
    cp.flatnonzero = lambda a: dev(np.flatnonzero(a))

    def asnumpy(a, stream=None, out=None, blocking=True):
        out[...] = a
        return out

    cp.asnumpy = asnumpy
    cp.isfinite = lambda a: dev(np.isfinite(np.asarray(a)))
    cp.argmax = lambda a: np.argmax(np.asarray(a))

    class Device:  # one fake GPU, ordinal 0
        def __init__(self, i=0):
            assert i == 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1, getDevice=lambda: 0)
    cp.cuda = types.SimpleNamespace(Stream=Stream, get_current_stream=lambda: Stream(), Device=Device, runtime=runtime)
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda shape, dtype=np.float64: np.empty(shape, dtype=dtype)
    return cp, cupyx


@pytest.fixture
def fake_device(host_kernels, monkeypatch):
    import protgpu._cuda as pc
    import protgpu._cuda.blas as blas
    from protgpu._cuda import loader

    cp, cupyx = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(64 << 20))
    monkeypatch.setattr(sp, "_WARP_THREADS", 64)  # fewer host threads per block; kernels use blockDim
    monkeypatch.setattr(sp, "_PAIR_BLOCK", _HOST_PAIR_BLOCK)  # as the host build (PAIR_BY in the defines)
    launches = []
    # The host emulation keeps its grid state in globals: one launch at a time (the multi-GPU path
    # launches from several host threads).
    emulator_lock = threading.Lock()

    def get_kernel(name, entry, defines=None):
        assert name == "qcp" and defines == sp._qcp_defines()
        params = loader.entry_points(name)[entry]
        return loader.KernelHandle(kernel=entry, name=f"{name}.{entry}", params=params)

    def launch(h, grid, block, *args, shared_mem=0, stream=None):
        assert len(args) == len(h.params), h.name
        assert all(isinstance(v, int) and v > 0 for v in (*grid, *block)), (h.name, grid, block)
        conv = []
        for p, a in zip(h.params, args, strict=True):
            if p.pointer:
                assert a is None or isinstance(a, _FakeDeviceArray), (h.name, p.name, type(a))
                conv.append(None if a is None else np.asarray(a))
            else:
                conv.append(loader._convert_arg(h, p, a).item())
        with emulator_lock:
            launches.append((h.name, args[-1] if "pairs" in h.name or "refine" in h.name else None))
            host_kernels.run(h.kernel, grid, block, *conv)

    flip = [False]

    def matmul(a, b):  # row-major as cuBLAS through nvmath gives it; now and then column-major (copied)
        flip[0] = not flip[0]
        r = np.asarray(a) @ np.asarray(b)
        return (np.asfortranarray(r) if flip[0] and r.shape[0] > 1 and r.shape[1] > 1 else r).view(_FakeDeviceArray)

    monkeypatch.setattr(pc, "get_kernel", get_kernel)
    monkeypatch.setattr(pc, "launch", launch)
    monkeypatch.setattr(blas, "matmul", matmul)
    return launches


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fake_device_rmsd_and_superpose(fake_device, dtype):
    rng = np.random.default_rng(16)
    x = (rng.normal(size=(40, 30, 3)) * 5 + 9).astype(dtype)
    y = rng.normal(size=(30, 3)) * 5
    # an identical and a moved near-identical frame: re-measured on the coordinates (both twins)
    x[3] = y
    x[11] = y @ random_rotation(rng).T + 4 + rng.normal(size=(30, 3)) * 1e-6
    y = x[3].astype(np.float64)
    w = rng.uniform(0.5, 2, 30)
    fit, meas = np.arange(0, 30, 2), np.arange(1, 30, 3)
    for kwargs in ({}, {"fit": fit, "w_fit": w[fit]}, {"fit": fit, "meas": meas, "w_meas": w[meas]}):
        ref = (y if "fit" not in kwargs else y[kwargs["fit"]], None if "meas" not in kwargs else y[kwargs["meas"]])
        want = sp._rmsd_numpy(x, ref, **kwargs, want_coords=True)
        got = sp._rmsd_cuda(x, ref, **kwargs, want_coords=True)
        for g, e in zip(got, want, strict=True):
            assert g.dtype == e.dtype
            np.testing.assert_allclose(np.asarray(g), e, atol=1e-9 if dtype == np.float64 else 2e-5)
        assert got[0][3] <= 1e-12 and abs(got[0][11] - want[0][11]) <= 1e-12
    sfx = "f32" if dtype == np.float32 else "f64"
    assert {n for n, _ in fake_device} == {f"qcp.frame_moments_{sfx}", "qcp.qcp_frames", f"qcp.frame_direct_{sfx}"}


def test_fake_device_reference_memo_follows_the_reference(fake_device, monkeypatch):
    """_rmsd_cuda reuses the last reference's device operands only for the same bytes: a reference
    changed in place, other weights or other fitted atoms give their own (right) results."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(6, 12, 3)) * 4
    y = rng.normal(size=(12, 3)) * 4
    w = rng.uniform(0.5, 2, 12)
    fit = np.arange(0, 12, 2)
    uploads = []
    real = sp._reference_operands
    monkeypatch.setattr(sp, "_reference_operands", lambda yc, w: uploads.append(1) or real(yc, w))
    sp._REFERENCE_MEMO.clear()
    cases = [((y, None), {}), ((y, None), {}), ((y, None), {"w_fit": w}), ((y[fit], None), {"fit": fit}),
             ((y[fit], None), {"fit": fit})]
    for ref, kwargs in cases:
        np.testing.assert_allclose(np.asarray(sp._rmsd_cuda(x, ref, **kwargs)[0]), sp._rmsd_numpy(x, ref, **kwargs)[0],
                                   atol=1e-9)
    assert len(uploads) == 3  # the repeated calls were served from the memo
    y[0] += 1.0  # in place: same array, other bytes
    np.testing.assert_allclose(np.asarray(sp._rmsd_cuda(x, (y, None))[0]), sp._rmsd_numpy(x, (y, None))[0], atol=1e-9)
    assert len(uploads) == 4


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_fake_device_pairwise_resident_and_streamed(fake_device, precision, monkeypatch, tmp_path):
    from scipy.spatial.distance import squareform

    rng = np.random.default_rng(17)
    x = (rng.normal(size=(37, 20, 3)) * 4).astype(np.float32)
    y = (rng.normal(size=(11, 20, 3)) * 4).astype(np.float32)
    tol = 1e-6
    twin = sp._pairwise_numpy(x, precision=precision, out_dtype=np.float64)
    twin_xy = sp._pairwise_numpy(x, y, precision=precision, out_dtype=np.float64)
    for tile in (None, 8):
        # resident dense (mirrored) and condensed, and x against y
        d = sp._pairwise_cuda(x, precision=precision, tile=tile)
        np.testing.assert_allclose(d, twin, atol=tol)
        assert (d == d.T).all() and (np.diag(d) == 0).all() and type(d) is np.ndarray
        c = sp._pairwise_cuda(x, precision=precision, tile=tile, condensed=True)
        np.testing.assert_allclose(squareform(c, checks=False), twin, atol=tol)
        np.testing.assert_allclose(sp._pairwise_cuda(x, y, precision=precision, tile=tile), twin_xy, atol=tol)
        # streamed into a host destination (memmap), dense float64 and condensed
        mm = np.lib.format.open_memmap(tmp_path / "d.npy", mode="w+", dtype=np.float64, shape=(37, 37))
        assert sp._pairwise_cuda(x, precision=precision, tile=tile, out=mm) is mm
        np.testing.assert_allclose(mm, twin, atol=1e-12 if precision == "float64" else 1e-9)
        cond = np.zeros(37 * 36 // 2, np.float32)
        sp._pairwise_cuda(x, precision=precision, tile=tile, out=cond, condensed=True)
        np.testing.assert_allclose(cond, twin[np.triu_indices(37, 1)], atol=tol)
        out_xy = np.zeros((37, 11), np.float32)
        sp._pairwise_cuda(x, y, precision=precision, tile=tile, out=out_xy)
        np.testing.assert_allclose(out_xy, twin_xy, atol=tol)
    # several resident strips (the GPU's are >= 256 rows): strips against their later columns, mirrored
    monkeypatch.setattr(sp, "_strip_rows", lambda f: 8)
    np.testing.assert_allclose(sp._pairwise_cuda(x, precision=precision), twin, atol=tol)
    np.testing.assert_allclose(sp._pairwise_cuda(x, precision=precision, condensed=True),
                               twin[np.triu_indices(37, 1)], atol=tol)
    modes = {m for n, m in fake_device if n.startswith("qcp.qcp_pairs")}
    assert modes == {0, sp._MIRROR | sp._UPPER_ONLY | sp._ZERO_DIAG, sp._CONDENSED, sp._UPPER_ONLY | sp._ZERO_DIAG}
    # a result larger than the budget streams to the host even without out=, or is refused for device input
    z = (rng.normal(size=(120, 4, 3)) * 4).astype(np.float32)
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(60_000))
    n_before = len(fake_device)
    np.testing.assert_allclose(sp._pairwise_cuda(z, precision=precision),
                               sp._pairwise_numpy(z, precision=precision), atol=tol)
    assert len(fake_device) - n_before > 1  # several tiles
    # condensed strips streamed to a host array, each strip's store split over helper threads
    monkeypatch.setattr(sp, "_store_pieces", lambda: 3)
    monkeypatch.setattr(sp, "_STORE_PIECE_BYTES", 8)
    streamed = []
    real_stream = sp._stream_condensed
    monkeypatch.setattr(sp, "_stream_condensed", lambda *a, **k: streamed.append(1) or real_stream(*a, **k))
    cond = np.zeros(120 * 119 // 2, np.float32)
    sp._pairwise_cuda(z, precision=precision, out=cond, condensed=True)
    np.testing.assert_allclose(cond, sp._pairwise_numpy(z, precision=precision)[np.triu_indices(120, 1)], atol=tol)
    assert streamed
    from protgpu.errors import MemoryBudgetError

    with pytest.raises(MemoryBudgetError, match="out="):
        sp._pairwise_cuda(z, precision=precision, host_result=False)


def test_fake_device_public_api(fake_device, monkeypatch):
    import protgpu._array as pa

    monkeypatch.setattr(pa, "gpu_available", lambda: True)
    rng = np.random.default_rng(18)
    x = (rng.normal(size=(12, 15, 3)) * 4).astype(np.float32)
    y = x[3] + 0.1
    r = rmsd(x, y, device="gpu")
    assert type(r) is np.ndarray
    np.testing.assert_allclose(r, rmsd(x, y, device="cpu"), atol=1e-9)
    res = superpose(x, y, fit=np.arange(8), atoms=np.arange(4, 15), device="gpu")
    ref = superpose(x, y, fit=np.arange(8), atoms=np.arange(4, 15), device="cpu")
    assert all(type(v) is np.ndarray for v in res)
    for g, e in zip(res, ref, strict=True):
        np.testing.assert_allclose(g, e, atol=2e-5)
    d = pairwise_rmsd(x, device="gpu")
    assert type(d) is np.ndarray and d.dtype == np.float32
    np.testing.assert_allclose(d, pairwise_rmsd(x, device="cpu"), atol=1e-6)
    # device-resident input stays on the device
    xd = np.asarray(x).view(_FakeDeviceArray)
    assert isinstance(rmsd(xd, y), _FakeDeviceArray)
    assert isinstance(pairwise_rmsd(xd, condensed=True), _FakeDeviceArray)
    assert isinstance(superpose(xd, y).coords, _FakeDeviceArray)


def test_fake_device_nan_host_input_named(fake_device, monkeypatch):
    import protgpu._array as pa

    monkeypatch.setattr(pa, "gpu_available", lambda: True)
    x = np.random.default_rng(19).normal(size=(4, 9, 3))
    x[2, 5, 1] = np.nan
    with pytest.raises(InputError, match="frame 2"):
        rmsd(x, x[0], device="gpu")
    with pytest.raises(InputError, match="frame 2"):
        superpose(x, x[0], device="gpu")
    with pytest.raises(InputError, match="frame 2"):
        pairwise_rmsd(x, device="gpu")
    # pairwise_rmsd on the GPU checks the traces of the centred frames on the device instead of
    # scanning the host coordinates: the same error, for either input, infinities too; a NaN outside
    # the fitted atoms does not matter (as on the CPU).
    with pytest.raises(InputError, match=r"^y: NaN or infinite coordinates in frame 2$"):
        pairwise_rmsd(x[[0, 1, 3]], x, device="gpu")
    z = np.nan_to_num(x)
    z[3, 0, 0] = -np.inf
    with pytest.raises(InputError, match="frame 3"):
        pairwise_rmsd(z, device="gpu", condensed=True, out=np.zeros(6, np.float32))
    np.testing.assert_allclose(pairwise_rmsd(x, fit=[0, 1, 2, 3], device="gpu"),
                               pairwise_rmsd(x, fit=[0, 1, 2, 3], device="cpu"), atol=1e-6)


def test_fake_device_sanitizer_section(fake_device, capsys):
    import importlib
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        importlib.import_module("test_superpose_gpu").check_superpose_for_sanitizer()
    finally:
        sys.path.pop(0)
    assert "superpose: ok" in capsys.readouterr().out
    names = {n for n, _ in fake_device}
    from protgpu._cuda import loader

    assert names == {f"qcp.{e}" for e in loader.entry_points("qcp")}  # every entry point, for the sanitizer


def test_sink_mirrors_large_tiles_in_strips():
    tile = np.random.default_rng(20).random((1100, 200)).astype(np.float32)
    out = np.zeros((1300, 1300), np.float32)
    sp._Sink(out, 1300, True, False).write(0, 1100, 1100, 1300, tile)
    np.testing.assert_array_equal(out[:1100, 1100:], tile)
    np.testing.assert_array_equal(out[1100:, :1100], tile.T)


def test_pairwise_devices_needs_the_gpu():
    x = np.random.default_rng(3).normal(size=(4, 5, 3))
    with pytest.raises(InputError, match="devices= is for GPU runs"):
        pairwise_rmsd(x, device="cpu", devices=2)


@pytest.mark.parametrize("rows", [None, 5, 32])
def test_fake_device_condensed_strips(fake_device, rows):
    """Streaming a condensed result in row strips (each strip one contiguous block of SciPy's layout,
    written by the kernel at its offset): equal to the twin, into NumPy and into a non-NumPy store."""
    rng = np.random.default_rng(8)
    x = (rng.normal(size=(41, 9, 3)) * 4).astype(np.float32)
    twin = sp._pairwise_numpy(x, out_dtype=np.float64)[np.triu_indices(41, 1)]
    plan = sp._PairPlan(x, None, None, None, "float64", np.float32)
    out = np.full(41 * 40 // 2, np.nan, np.float32)
    sp._stream_condensed(plan, out, 64 << 20, rows=rows)
    np.testing.assert_allclose(out, twin, atol=2e-5)

    class Store:  # not an ndarray: writes go one at a time
        def __init__(self, n):
            self.a = np.full(n, np.nan, np.float32)
            self.shape, self.dtype = self.a.shape, self.a.dtype

        def __setitem__(self, key, value):
            self.a[key] = value

    store = Store(41 * 40 // 2)
    sp._stream_condensed(plan, store, 64 << 20, row_starts=iter([0, 10, 20, 30, 40]), rows=10)
    np.testing.assert_allclose(store.a, twin, atol=2e-5)
    cond = np.full(41 * 40 // 2, np.nan, np.float32)
    assert sp._pairwise_cuda(x, out=cond, condensed=True) is cond  # the public streaming path
    np.testing.assert_allclose(cond, twin, atol=2e-5)


def test_fake_device_shared_strip_queue_is_paced_by_the_device(fake_device, monkeypatch):
    """With several devices sharing the strip queue (row_starts) and a page-locked destination, a
    device takes its next strip only after the copy of the strip that last used the buffer it needs is
    done (its event synchronised): strips go to the devices at their pace, not the host's."""
    import cupy as cp

    rng = np.random.default_rng(21)
    x = (rng.normal(size=(61, 7, 3)) * 4).astype(np.float32)
    plan = sp._PairPlan(x, None, None, None, "float64", np.float32)
    pinned = np.full(61 * 60 // 2, np.nan, np.float32)
    locked = {pinned.ctypes.data, pinned.ctypes.data + pinned.nbytes - 1}
    monkeypatch.setattr(cp.cuda.runtime, "pointerGetAttributes",
                        lambda ptr: types.SimpleNamespace(type=1 if ptr in locked else 0), raising=False)
    log = []

    class Event:
        def __init__(self):
            self.k = sum(1 for e in log if e[0] == "take")  # the strip whose copy it marks

        def synchronize(self):
            log.append(("sync", self.k))

    monkeypatch.setattr(cp.cuda.Stream, "record", lambda self: Event())

    def starts():
        for i0 in range(0, 61, 4):
            log.append(("take", i0))
            yield i0

    sp._stream_condensed(plan, pinned, 64 << 20, row_starts=starts(), rows=4)
    np.testing.assert_allclose(pinned, sp._pairwise_numpy(x)[np.triu_indices(61, 1)], atol=2e-5)
    n_buf = sp._stream_writers() + 1
    takes = [i for i, e in enumerate(log) if e[0] == "take"]
    assert len(takes) == 16
    for j, t in enumerate(takes[n_buf:], start=n_buf):  # strip j waits for strip j - n_buf's copy
        assert ("sync", j - n_buf + 1) in log[:t], (j, log[:t])
    # One device alone (no row_starts) is not paced: the host enqueues as far ahead as the buffers let it.
    log.clear()
    sp._stream_condensed(plan, pinned, 64 << 20, rows=4)
    assert not any(e[0] == "sync" for e in log)


def test_fake_device_condensed_into_page_locked_memory(fake_device, monkeypatch):
    """A page-locked destination is written straight from the device strips: no staging buffer and
    no writer-thread stores, the same values as the staged path; pageable arrays, views that are not
    C-contiguous and non-NumPy stores keep the staged path."""
    import cupy as cp
    import cupyx

    rng = np.random.default_rng(12)
    x = (rng.normal(size=(53, 7, 3)) * 4).astype(np.float32)
    plan = sp._PairPlan(x, None, None, None, "float64", np.float32)
    staged = np.full(53 * 52 // 2, np.nan, np.float32)
    sp._stream_condensed(plan, staged, 64 << 20, rows=8)

    pinned = np.full(53 * 52 // 2, np.nan, np.float32)
    locked = {pinned.ctypes.data, pinned.ctypes.data + pinned.nbytes - 1}

    def attributes(ptr):  # the driver's answer: host memory (1) for the locked range, else unregistered
        return types.SimpleNamespace(type=1 if ptr in locked else 0)

    monkeypatch.setattr(cp.cuda.runtime, "pointerGetAttributes", attributes, raising=False)
    staging = []
    real_empty_pinned = cupyx.empty_pinned
    monkeypatch.setattr(cupyx, "empty_pinned", lambda *a, **k: staging.append(a) or real_empty_pinned(*a, **k))
    assert sp._page_locked(pinned)
    assert not sp._page_locked(np.empty_like(pinned)) and not sp._page_locked(pinned[::2])
    sp._stream_condensed(plan, pinned, 64 << 20, rows=8)
    assert staging == []  # no staging buffers
    np.testing.assert_array_equal(pinned, staged)
    pageable = np.full_like(staged, np.nan)
    sp._stream_condensed(plan, pageable, 64 << 20, rows=8)
    assert staging  # the staged path for pageable memory
    np.testing.assert_array_equal(pageable, staged)


@pytest.mark.parametrize("width, quantum", [(32, 1024), (64, 32), (96, 40)])
def test_fake_device_condensed_strips_on_a_panel_grid(fake_device, monkeypatch, width, quantum):
    """Panels on a fixed grid: each strip's first panel starts on the quantum's grid just left of the
    diagonal and ends on the panel grid, then whole panels, then the grid's last, narrower panel; so a
    few panel shapes whatever the strip, and GEMM columns left of the diagonal fewer than a quantum."""
    monkeypatch.setattr(sp, "_STREAM_PANEL_COLS", width)
    monkeypatch.setattr(sp, "_STREAM_PANEL_QUANTUM", quantum)
    rng = np.random.default_rng(9)
    x = (rng.normal(size=(77, 6, 3)) * 4).astype(np.float64)
    twin = sp._pairwise_numpy(x, out_dtype=np.float64)[np.triu_indices(77, 1)]
    plan = sp._PairPlan(x, None, None, None, "float64", np.float64)
    calls = []
    orig = plan.gemm

    def gemm(i0, i1, j0, j1):
        calls.append((i0, j0, j1))
        return orig(i0, i1, j0, j1)

    plan.gemm = gemm
    out = np.full(77 * 76 // 2, np.nan)
    sp._stream_condensed(plan, out, 64 << 20, rows=10)
    np.testing.assert_allclose(out, twin, atol=1e-9)
    width = max(32, min(width, 77))  # (a panel is at most the frames there are)
    q = max(32, min(quantum, width) // 32 * 32)  # the quantum is a multiple of 32 columns
    width = max(q, width // q * q)
    for i0 in sorted({c[0] for c in calls}):
        spans = [(j0, j1) for r, j0, j1 in calls if r == i0]
        assert spans[0][0] <= i0 < spans[0][0] + q and spans[0][0] % q == 0  # just left of the diagonal
        assert all(j1 % width == 0 or j1 == 77 for _, j1 in spans)  # panels end on the grid
        assert [j0 for j0, _ in spans[1:]] == [j1 for _, j1 in spans[:-1]] and spans[-1][1] == 77
    widths = {j1 - j0 for _, j0, j1 in calls}
    assert widths <= {*range(q, width + 1, q), 77 % width} | {77 - j0 for _, j0, _ in calls}


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
