"""kernels/qcp.cu on the host: compiled as C++20 with one std::thread per CUDA thread (warp
shuffles and __syncthreads through barriers; see superpose_helpers.py) and held equal to
the NumPy twins."""

from __future__ import annotations

import numpy as np
import pytest
from superpose_helpers import (
    HOST_PAIR_BLOCK,
    build_host_kernels,
    kabsch,
    kabsch_rmsd_matrix,
    random_rotation,
)

from protgpu.superpose import (
    kernels,
    pairwise_cpu,
    qcp,
    to_reference,
)


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    return build_host_kernels(tmp_path_factory)


def _host_rmsd(hk, x, y, w=None, fit=None, block=64):
    """The three frame kernels in sequence, as _rmsd_cuda launches them (small blocks: few threads)."""
    yc, cy, gb, inv_w = to_reference.centre_reference(np.asarray(y, np.float64), w)
    f, n_atoms = x.shape[:2]
    n = len(yc)
    ref, wyc = to_reference.reference_operands(yc, w)
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
           inv_w, qcp.DIRECT_TAU)
    return r, rot, t, mom


def _host_aligned_rmsd(hk, x, y, n_ali, warps=2):
    m, lmax = x.shape[:2]
    out = np.full(m, -1.0)
    sfx = "f32" if x.dtype == np.float32 else "f64"
    hk.run(f"aligned_rmsd_{sfx}", (-(-m // warps),), (32 * warps,), np.ascontiguousarray(x), np.ascontiguousarray(y),
           1 if y.shape[0] == m and m > 1 else 0, np.asarray(n_ali, np.int32), lmax, m, qcp.DIRECT_TAU, out)
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
        r0, rot0, t0, _ = to_reference.rmsd_numpy(x, (yy, None), fit=ff, w_fit=ww)
        np.testing.assert_allclose(r, r0, atol=1e-10)
        np.testing.assert_allclose(rot, rot0, atol=1e-9)
        np.testing.assert_allclose(t, t0, atol=1e-8)
        # the moments themselves against the twin's
        yc, _cy, _gb, inv_w = to_reference.centre_reference(yy, ww)
        ops = to_reference.moment_operands(yc, ww, inv_w)
        cx, ga, m = to_reference.moments_numpy(x if ff is None else x[:, ff], ops)
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
        r0, rot0, _, _ = to_reference.rmsd_numpy(x[None], (y, None))
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
        a0, g0 = pairwise_cpu.centre_frames_numpy(x, ww, ff)
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
    bx, by = HOST_PAIR_BLOCK
    grid = (-(-tj // bx), -(-ti // by))
    args = (blocks, blocks.shape[1], 3 * (j0 - p0), g_a, g_b, dst, ti, tj, i0, j0, out_ld, out_row0, out_col0,
            n_total, inv_w, mode)
    hk.run(f"qcp_pairs_{name}", grid, HOST_PAIR_BLOCK, *args)
    hk.run(f"qcp_refine_{name}", grid, HOST_PAIR_BLOCK, *args)


@pytest.mark.parametrize("blocks_dtype,out_dtype", [(np.float64, np.float64), (np.float32, np.float32),
                                                    (np.float64, np.float32), (np.float32, np.float64)])
def test_host_kernel_pairs_all_modes(host_kernels, blocks_dtype, out_dtype):
    rng = np.random.default_rng(15)
    x = rng.normal(size=(41, 12, 3)) * 4
    x[7] = x[3] @ random_rotation(rng).T  # a duplicate pair: l_max at a near-repeated root? refined or not
    line = np.outer(np.arange(12.0), [1, 2, 0.5])
    x[20], x[21] = line, line[::-1] * 1.01  # collinear frames: a repeated l_max, the refine kernel's case
    prec = np.dtype(blocks_dtype)
    a, g = pairwise_cpu.centre_frames_numpy(x, None, None)
    a = a.astype(prec)
    f, n = len(g), a.shape[1]
    twin = pairwise_cpu.pairwise_numpy(x, precision=prec.name, out_dtype=np.float64)
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
                        kernels.MIRROR | kernels.UPPER_ONLY | kernels.ZERO_DIAG)
    np.testing.assert_allclose(dst, twin, atol=tol)
    assert (dst == dst.T).all() and (np.diag(dst) == 0).all()
    # Condensed, tiles of a panel (column offset within the panel's blocks).
    cond = np.full(f * (f - 1) // 2, np.nan, dtype=out_dtype)
    for i0 in range(0, f, 9):
        i1 = min(f, i0 + 9)
        blocks = np.ascontiguousarray(a[3 * i0:3 * i1] @ a[3 * i0:].T)
        for j0 in range(i0, f, 9):
            _host_pairs(host_kernels, name, blocks, i0, g, g, cond, i0, i1, j0, min(f, j0 + 9), 0, 0, 0, f, 1.0 / n,
                        kernels.CONDENSED)
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
                kernels.MIRROR | kernels.UPPER_ONLY | kernels.ZERO_DIAG)
    np.testing.assert_allclose(tile, twin[18:27, 18:27], atol=tol)


def test_host_kernel_refine_pass_is_used(host_kernels):
    """Collinear frames put l_max at a repeated root: the main kernel leaves the sentinel, and the result
    after the refine pass equals the twin's quaternion path (which the sentinel must never leak past)."""
    line = np.outer(np.arange(10.0), [1, 2, 0.5])
    x = np.stack([line, line * 1.02 + 3, line[::-1]])
    a, g = pairwise_cpu.centre_frames_numpy(x, None, None)
    blocks = np.ascontiguousarray(a @ a.T)
    out = np.full((3, 3), np.nan)
    args = (blocks, blocks.shape[1], 0, g, g, out, 3, 3, 0, 0, 3, 0, 0, 3, 0.1, kernels.MIRROR | kernels.UPPER_ONLY |
            kernels.ZERO_DIAG)
    host_kernels.run("qcp_pairs_b64_o64", (1, 2), HOST_PAIR_BLOCK, *args)
    assert (out[np.triu_indices(3, 1)] == -1.0).any()  # PAIR_REFINE left for the second pass
    host_kernels.run("qcp_refine_b64_o64", (1, 2), HOST_PAIR_BLOCK, *args)
    np.testing.assert_allclose(out, pairwise_cpu.pairwise_numpy(x, out_dtype=np.float64), atol=1e-12)
    np.testing.assert_allclose(out, kabsch_rmsd_matrix(x, x), atol=1e-7)
