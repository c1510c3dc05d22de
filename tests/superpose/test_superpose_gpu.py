"""GPU parity of protgpu.superpose: the CUDA path (kernels/qcp.cu + cuBLAS) against the NumPy twin on
real structures, float32 and float64 (DESIGN convention 7: the GPU's error against a float64 Kabsch
reference is at most 2x the same-precision NumPy run's, with a 1e-9 Angstrom floor since both are at
rounding level), tiling and streaming, degenerate inputs, array types."""

from __future__ import annotations

import numpy as np
import pytest

from protgpu.errors import InputError
from protgpu.superpose import (
    multigpu,
    pairwise_cpu,
    pairwise_gpu,
    pairwise_rmsd,
    rmsd,
    streaming,
    superpose,
    to_reference,
)

pytestmark = pytest.mark.gpu

FLOOR = 1e-9  # Angstrom: below this both paths are at float64 rounding level
# The rule "GPU error <= 2x the NumPy twin's" needs errors that scale with the reordering, not the square
# root of a cancelling residual: QCP's sqrt((G_A + G_B - 2 l_max) / W) is ~sqrt(eps) R_g ~ 3e-7 A of
# noise (or exactly 0, by the sign of the rounding) for near-identical frames. rmsd()/superpose()
# re-measure those frames on the coordinates (~1e-14 A, asserted below), and pairwise self-pairs are
# exactly 0, so every value compared here is either well away from 0 or at float64 rounding level.


def kabsch(x, y, w=None):
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.ones(len(x)) if w is None else np.asarray(w, dtype=np.float64)
    a, b = x - w @ x / w.sum(), y - w @ y / w.sum()
    u, s, vt = np.linalg.svd((a * w[:, None]).T @ b)
    d = np.sign(np.linalg.det(u @ vt)) or 1.0
    r = (u @ np.diag([1, 1, d]) @ vt).T
    return float(np.sqrt((w * ((a @ r.T - b) ** 2).sum(1)).sum() / w.sum()))


def kabsch_matrix(x, y):
    return np.array([[kabsch(a, b) for b in y] for a in x])


def assert_parity(gpu_val, cpu_val, ref):
    err_gpu = np.abs(np.asarray(gpu_val, dtype=np.float64) - ref).max()
    err_cpu = np.abs(np.asarray(cpu_val, dtype=np.float64) - ref).max()
    assert err_gpu <= max(2 * err_cpu, FLOOR), (err_gpu, err_cpu)


@pytest.fixture(scope="module")
def adk(datasets):
    from protgpu.io import load

    return load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rmsd_parity_adk(gpu, adk, dtype):
    x = adk.coords.astype(dtype)
    ref = kabsch_matrix(x, x[:1])[:, 0]
    r_gpu = rmsd(x, x[0], device="gpu")
    r_cpu = rmsd(x, x[0], device="cpu")
    assert isinstance(r_gpu, np.ndarray) and r_gpu.dtype == np.float64
    assert_parity(r_gpu, r_cpu, ref)
    assert r_gpu[0] <= 1e-12 and r_cpu[0] <= 1e-12  # self-RMSD: re-measured, no sqrt of a cancellation
    ca = adk.select_indices("ca")
    ref_ca = np.array([kabsch(f[ca], x[7, ca]) for f in x])
    r_gpu = rmsd(x, x[7], fit=ca, device="gpu")
    r_cpu = rmsd(x, x[7], fit=ca, device="cpu")
    assert r_gpu[7] <= 1e-12 and r_cpu[7] <= 1e-12
    assert_parity(r_gpu, r_cpu, ref_ca)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_superpose_parity_adk(gpu, adk, dtype):
    x = adk.coords[:40].astype(dtype)
    heavy = adk.select_indices("heavy")
    masses = np.where(adk.atoms.element == "H", 1.008, 12.0)
    for kw in ({"fit": "ca"}, {"fit": "ca", "atoms": "heavy"}, {"fit": "backbone", "weights": masses}):
        g = superpose(adk.__class__(x, adk.atoms, source="adk"), adk.frames(0), device="gpu", **kw)
        c = superpose(adk.__class__(x, adk.atoms, source="adk"), adk.frames(0), device="cpu", **kw)
        assert all(isinstance(v, np.ndarray) for v in g)
        np.testing.assert_allclose(np.linalg.det(g.rotation), 1.0, atol=1e-12)
        np.testing.assert_allclose(g.rotation, c.rotation, atol=1e-9)
        np.testing.assert_allclose(g.translation, c.translation, atol=1e-7)
        np.testing.assert_allclose(g.rmsd, c.rmsd, rtol=0, atol=1e-9)
        assert g.rmsd[0] <= 1e-12  # frame 0 against itself: re-measured on the coordinates
        np.testing.assert_allclose(g.coords, c.coords, atol=2e-5 if dtype == np.float32 else 1e-9)
        assert g.coords.dtype == np.float32  # a Structure holds float32
    # measured heavy-atom RMSD against an explicit superposition
    ca = adk.select_indices("ca")
    r = rmsd(x, x[0], fit=ca, atoms=heavy, device="gpu")
    xd = x.astype(np.float64)
    for f in (3, 30):
        a, b = xd[f, ca], xd[0, ca]
        u, s, vt = np.linalg.svd((a - a.mean(0)).T @ (b - b.mean(0)))
        rot = (u @ np.diag([1, 1, np.sign(np.linalg.det(u @ vt))]) @ vt).T
        t = b.mean(0) - rot @ a.mean(0)
        d = xd[f, heavy] @ rot.T + t - xd[0, heavy]
        assert r[f] == pytest.approx(np.sqrt((d**2).sum(1).mean()), abs=1e-7)


def test_cupy_in_cupy_out_and_chunks(gpu, adk, monkeypatch):
    cp = gpu
    x = cp.asarray(adk.coords)
    r = rmsd(x, adk.coords[0])
    assert isinstance(r, cp.ndarray)
    res = superpose(x, adk.coords[0])
    assert isinstance(res.coords, cp.ndarray) and res.coords.dtype == cp.float32
    # a small budget forces many frame chunks; the result must not change
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(2_000_000))
    r_small = rmsd(x, adk.coords[0])
    np.testing.assert_allclose(cp.asnumpy(r_small), cp.asnumpy(r), atol=1e-12)


def test_torch_cuda_roundtrip(gpu, adk):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x = torch.as_tensor(adk.coords[:20], device="cuda")
    r = rmsd(x, adk.coords[0])
    assert isinstance(r, torch.Tensor) and r.is_cuda
    d = pairwise_rmsd(x)
    assert isinstance(d, torch.Tensor) and d.is_cuda and d.shape == (20, 20)
    np.testing.assert_allclose(d.cpu().numpy(), pairwise_rmsd(adk.coords[:20], device="cpu"), atol=1e-5)


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("sel", ["ca", "heavy"])
def test_pairwise_parity_adk(gpu, adk, precision, sel):
    x = adk.coords[::3, adk.select_indices(sel)]
    ref = kabsch_matrix(x, x)
    d_gpu = pairwise_rmsd(x, precision=precision, device="gpu")
    d_cpu = pairwise_rmsd(x, precision=precision, device="cpu", )
    assert d_gpu.dtype == np.float32
    assert (d_gpu == d_gpu.T).all() and (np.diag(d_gpu) == 0).all()
    # float32 output rounds both the same way: compare in float64 outputs for the parity rule
    g64 = pairwise_gpu.pairwise_cuda(x, precision=precision, out_dtype=np.float64)
    c64 = pairwise_cpu.pairwise_numpy(x, precision=precision, out_dtype=np.float64)
    assert_parity(g64, c64, ref)
    assert np.abs(d_gpu - ref).max() <= (1e-4 if precision == "float64" else 1e-3)
    np.testing.assert_allclose(d_gpu, d_cpu, atol=1e-4 if precision == "float64" else 1e-3)


@pytest.mark.parametrize("tile", [5, 32, 64])
def test_pairwise_tiles_resident_and_streamed(gpu, adk, tile, tmp_path):
    from scipy.spatial.distance import squareform

    x = adk.coords[:, adk.select_indices("ca")]
    y = adk.coords[:13, adk.select_indices("ca")]
    full = pairwise_gpu.pairwise_cuda(x)
    np.testing.assert_allclose(pairwise_gpu.pairwise_cuda(x, tile=tile), full, atol=1e-6)
    np.testing.assert_allclose(squareform(pairwise_gpu.pairwise_cuda(x, tile=tile, condensed=True), checks=False), full,
                               atol=1e-6)
    xy = pairwise_cpu.pairwise_numpy(x, y)
    np.testing.assert_allclose(pairwise_gpu.pairwise_cuda(x, y, tile=tile), xy, atol=1e-5)
    mm = np.lib.format.open_memmap(tmp_path / "d.npy", mode="w+", dtype=np.float32, shape=full.shape)
    assert pairwise_gpu.pairwise_cuda(x, tile=tile, out=mm) is mm
    np.testing.assert_allclose(np.load(tmp_path / "d.npy"), full, atol=1e-6)
    cond = np.zeros(98 * 97 // 2, np.float64)
    pairwise_gpu.pairwise_cuda(x, tile=tile, out=cond, condensed=True)
    np.testing.assert_allclose(squareform(cond, checks=False), full, atol=1e-6)
    out_xy = np.zeros((98, 13), np.float32)
    pairwise_gpu.pairwise_cuda(x, y, tile=tile, out=out_xy)
    np.testing.assert_allclose(out_xy, xy, atol=1e-5)


def test_pairwise_budget_streams_and_cupy_refuses(gpu, adk, monkeypatch):
    from protgpu.errors import MemoryBudgetError

    cp = gpu
    x = adk.coords[:, adk.select_indices("ca")]
    f, n = x.shape[:2]
    expect = pairwise_rmsd(x, device="gpu")
    # A budget that holds the resident stacked float64 coordinates and G (3 F N + 2 F doubles) but
    # leaves room only for ~24-frame tiles (96 bytes per pair: the 3x3 float64 block, two float32
    # output tiles, slack; see _gpu_tile_size): the 98 x 98 result streams to the host in 15 tiles.
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(8 * (3 * f * n + 2 * f) + 96 * 24**2))
    tiles = []
    real_qcp = pairwise_gpu.PairPlan.qcp

    def counting_qcp(self, blocks, p0, i0, i1, j0, j1, *rest):
        tiles.append((i0, i1, j0, j1))
        return real_qcp(self, blocks, p0, i0, i1, j0, j1, *rest)

    monkeypatch.setattr(pairwise_gpu.PairPlan, "qcp", counting_qcp)
    np.testing.assert_allclose(pairwise_rmsd(x, device="gpu"), expect, atol=1e-6)  # streamed to host
    assert len(tiles) > 1, tiles  # 15 tiles of 24 frames with the sizes above
    with pytest.raises(MemoryBudgetError, match="out="):
        pairwise_rmsd(cp.asarray(x))
    out = np.zeros((98, 98), np.float32)
    pairwise_rmsd(cp.asarray(x), out=out)
    np.testing.assert_allclose(out, expect, atol=1e-6)


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_pairwise_strips_many_frames(gpu, precision):
    """More frames than one strip (_strip_rows: 256-row strips for 700 frames), odd atom count,
    float32 and float64 frames: the resident strip schedule equals the twin and is exactly symmetric."""
    rng = np.random.default_rng(3)
    base = rng.normal(size=(37, 3)) * 8
    x = base + rng.normal(size=(700, 37, 3))
    for xx in (x.astype(np.float32), x):
        d = pairwise_gpu.pairwise_cuda(xx, precision=precision, out_dtype=np.float64)
        c = pairwise_cpu.pairwise_numpy(xx, precision=precision, out_dtype=np.float64)
        np.testing.assert_allclose(d, c, atol=1e-9 if precision == "float64" else 2e-4)
        assert (d == d.T).all() and (np.diag(d) == 0).all()
        cond = pairwise_gpu.pairwise_cuda(xx, precision=precision, condensed=True, out_dtype=np.float64)
        np.testing.assert_allclose(cond, d[np.triu_indices(700, 1)], atol=1e-12)


@pytest.mark.parametrize("tile", [7, 64, None])
def test_pairwise_tiles_generator(gpu, adk, tile):
    """_pairwise_tiles_cuda (the consensus hook): upper-triangle tiles, row by row, diagonal tiles complete
    (mirrored, zero diagonal), equal to the resident matrix; host and device input, weights and fit."""
    cp = gpu
    x = adk.coords[:61]
    ca = adk.select_indices("ca")
    masses = np.where(adk.atoms.element[ca] == "H", 1.008, 12.0)
    for xin, kw in ((x, {"fit": ca}), (cp.asarray(x), {"fit": ca, "weights": masses})):
        full = pairwise_gpu.pairwise_cuda(x, fit=ca, weights=kw.get("weights"), out_dtype=np.float64)
        seen = []
        for i0, i1, j0, j1, r in pairwise_gpu.pairwise_tiles_cuda(xin, tile=tile, out_dtype=np.float64, **kw):
            assert isinstance(r, cp.ndarray) and r.shape == (i1 - i0, j1 - j0) and r.flags.c_contiguous
            assert j0 >= i0
            np.testing.assert_allclose(r.get(), full[i0:i1, j0:j1], atol=1e-12)
            seen.append((i0, j0))
        assert seen == [(i0, j0) for i0, _i1, j0, _j1 in streaming.tiles(61, 61, tile or 61, True)]


def test_degenerate_inputs_gpu(gpu):
    rng = np.random.default_rng(0)
    line = np.outer(np.arange(8.0), [1, 2, 3]) + 5
    tet = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1.0]])
    pts = rng.normal(size=(12, 3))
    near_line = np.array([[0, 0, 0], [0, 0.23242188, 4.0], [0, 0.23263799, 4.0]])
    cases = [(pts, pts), (line, line), (line, np.outer(np.arange(8.0) ** 1.2, [3, 1, 0])), (tet, tet * [1, 1, -1]),
             (pts, pts * [1, 1, -1]), (near_line, near_line), (np.ones((4, 3)), np.full((4, 3), 2.0))]
    for x, y in cases:
        g = superpose(x, y, device="gpu")
        assert np.isfinite(g.rotation).all() and np.isfinite(g.rmsd).all()
        np.testing.assert_allclose(np.linalg.det(g.rotation), 1.0, atol=1e-9)
        assert g.rmsd[0] == pytest.approx(kabsch(x, y), abs=1e-6)
        d = pairwise_rmsd(np.stack([x, y]), device="gpu")
        assert d[0, 1] == pytest.approx(kabsch(x, y), abs=1e-5)
    for x, y in ((pts[:1], pts[1:2]), (pts[:2], pts[2:4])):
        assert rmsd(x, y, device="gpu")[0] == pytest.approx(kabsch(x, y), abs=1e-7)


def test_nan_in_device_input_gives_nan(gpu):
    cp = gpu
    x = np.random.default_rng(1).normal(size=(3, 10, 3))
    x[1, 2, 0] = np.nan
    r = cp.asnumpy(rmsd(cp.asarray(x), x[0]))
    assert np.isnan(r[1]) and np.isfinite(r[[0, 2]]).all()
    d = cp.asnumpy(pairwise_rmsd(cp.asarray(x)))
    assert np.isnan(d[1, 0]) and np.isnan(d[0, 1]) and d[1, 1] == 0 and np.isfinite(d[0, 2])


def test_many_frames_rmsd(gpu):
    rng = np.random.default_rng(2)
    base = rng.normal(size=(200, 3)) * 10
    x = (base + rng.normal(size=(20_000, 200, 3))).astype(np.float32)
    r = rmsd(x, base, device="gpu")
    np.testing.assert_allclose(r, rmsd(x, base, device="cpu"), atol=1e-9)


@pytest.mark.parametrize("condensed", [True, False])
def test_pairwise_devices_spread_equals_one_gpu(gpu, condensed):
    """Tiles spread over GPUs (several host threads, one per device, sharing a row-tile queue) give
    bitwise the single-GPU result; with one visible GPU two threads share it."""
    rng = np.random.default_rng(5)
    x = (rng.normal(size=(70, 40, 3)) * 6).astype(np.float32)
    shape = (70 * 69 // 2,) if condensed else (70, 70)
    one = pairwise_gpu.pairwise_cuda(x, tile=16, condensed=condensed, out=np.zeros(shape, np.float32))  # streamed
    n_gpu = gpu.cuda.runtime.getDeviceCount()
    ids = list(range(n_gpu)) if n_gpu > 1 else [0, 0]
    spread = multigpu.pairwise_multi_gpu(x, None, fit=None, weights=None, precision="float64", out=None,
                                    condensed=condensed, devices=ids, tile=16)
    assert np.array_equal(spread, one)  # same tiles and GEMM panels, whichever device ran them
    if condensed:  # row strips written as contiguous blocks of the condensed vector
        strips = multigpu.pairwise_multi_gpu(x, None, fit=None, weights=None, precision="float64", out=None,
                                        condensed=True, devices=ids)
        one_strips = pairwise_gpu.pairwise_cuda(x, condensed=True, out=np.zeros(shape, np.float32))
        assert np.array_equal(strips, one_strips)
        np.testing.assert_allclose(strips, one, atol=1e-5)
    np.testing.assert_allclose(pairwise_rmsd(x, condensed=condensed, devices="all"),
                               pairwise_rmsd(x, condensed=condensed), atol=1e-5)
    with pytest.raises(InputError, match="devices"):
        pairwise_rmsd(gpu.asarray(x), devices=[0, 0])


def test_pairwise_condensed_into_page_locked_memory(gpu):
    """A page-locked destination (cupyx.empty_pinned) is recognised and written by the copy engines
    straight from the device strips; the values are bitwise those of a pageable destination, on one
    GPU and spread over the visible GPUs."""
    import cupyx

    rng = np.random.default_rng(13)
    x = (rng.normal(size=(300, 25, 3)) * 6).astype(np.float32)
    n = 300 * 299 // 2
    pageable = pairwise_gpu.pairwise_cuda(x, condensed=True, out=np.zeros(n, np.float32))
    pinned = cupyx.empty_pinned(n, dtype=np.float32)
    pinned[:] = np.nan
    assert streaming.page_locked(pinned) and not streaming.page_locked(np.zeros(n, np.float32))
    assert pairwise_gpu.pairwise_cuda(x, condensed=True, out=pinned) is pinned  # the same strips and panels
    assert np.array_equal(pinned, pageable)
    spread = pairwise_rmsd(x, condensed=True, out=np.zeros(n, np.float32), devices="all")
    pinned[:] = np.nan
    assert pairwise_rmsd(x, condensed=True, out=pinned, devices="all") is pinned
    assert np.array_equal(pinned, spread)


def test_pairwise_nan_frames_named_on_every_gpu_path(gpu):
    """Host input with a non-finite coordinate: the GPU paths find it in the traces of the centred
    frames (no host scan) and name the frame, resident, streamed, page-locked and over all GPUs; a NaN
    outside the fitted atoms does not matter."""
    import cupyx

    rng = np.random.default_rng(23)
    x = (rng.normal(size=(200, 12, 3)) * 5).astype(np.float32)
    x[137, 4, 2] = np.nan
    n = 200 * 199 // 2
    with pytest.raises(InputError, match=r"^x: NaN or infinite coordinates in frame 137$"):
        pairwise_rmsd(x, device="gpu")
    with pytest.raises(InputError, match="frame 137"):
        pairwise_rmsd(x, device="gpu", condensed=True, out=np.zeros(n, np.float32))
    with pytest.raises(InputError, match="frame 137"):
        pairwise_rmsd(x, device="gpu", condensed=True, out=cupyx.empty_pinned(n, dtype=np.float32), devices="all")
    with pytest.raises(InputError, match=r"^y: NaN or infinite coordinates in frame 137$"):
        pairwise_rmsd(x[:5] * 0 + 1, x, device="gpu")
    fit = np.array([0, 1, 2, 3, 5, 6])
    got = pairwise_rmsd(x, fit=fit, device="gpu", condensed=True, out=np.zeros(n, np.float32), devices="all")
    np.testing.assert_allclose(got, pairwise_rmsd(x[:, fit], device="cpu", condensed=True), atol=2e-5)


def check_superpose_for_sanitizer() -> None:
    """Every qcp.cu entry point on odd sizes (for compute-sanitizer via tests/sanitize_kernels.py),
    each result checked against the NumPy twin: frame_moments_* / qcp_frames / frame_direct_* (a
    near-identical frame so that the direct pass does work), centre_frames_* (float32 and float64
    frames, both GEMM precisions), qcp_pairs_* and qcp_refine_* (collinear frames: a repeated l_max),
    through every schedule: resident strips, square tiles, condensed, x against y, streamed to the host,
    the _pairwise_tiles_cuda generator and the multi-GPU queue; aligned_rmsd_*."""
    import cupyx

    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        x = (rng.normal(size=(37, 29, 3)) * 5).astype(dtype)
        y = rng.normal(size=(29, 3)) * 5
        x[5] = y + 3.0  # re-measured by frame_direct_*
        w = rng.uniform(0.5, 2.0, size=29)
        fit = np.arange(0, 29, 3)
        for kw in ({}, {"fit": fit, "w_fit": w[fit]}):
            ref = (y if "fit" not in kw else y[fit], None)
            got = to_reference.rmsd_cuda(x, ref, **kw, want_coords=True)
            want = to_reference.rmsd_numpy(x, ref, **kw, want_coords=True)
            assert np.allclose(got[0].get(), want[0], atol=1e-8), ("rmsd", dtype, kw.keys())
            assert np.allclose(got[1].get(), want[1], atol=1e-8), ("rotation", dtype, kw.keys())
            assert np.allclose(got[2].get(), want[2], atol=1e-6), ("translation", dtype, kw.keys())
    line = np.outer(np.arange(13.0), [1, 2, 0.5])
    for in_dtype in (np.float32, np.float64):  # centre_frames_f32_* / f64_*
        x = (rng.normal(size=(23, 13, 3)) * 4).astype(in_dtype)
        x[4], x[9] = line, line[::-1] * 1.02 + 1  # qcp_refine_* has work
        y = (rng.normal(size=(7, 13, 3)) * 4).astype(in_dtype)
        for precision in ("float64", "float32"):  # qcp_pairs_b64_* / b32_*, centre_frames_*_b64 / b32
            twin = pairwise_cpu.pairwise_numpy(x, precision=precision, out_dtype=np.float64)
            twin_xy = pairwise_cpu.pairwise_numpy(x, y, precision=precision, out_dtype=np.float64)
            for out_dtype in (np.float32, np.float64):  # *_o32 / *_o64
                d = pairwise_gpu.pairwise_cuda(x, precision=precision, out_dtype=out_dtype)  # resident strips, mirrored
                assert np.allclose(d, twin, atol=1e-5), ("strips", precision, out_dtype)
                c = pairwise_gpu.pairwise_cuda(x, precision=precision, tile=9, out_dtype=out_dtype, condensed=True)
                assert np.allclose(c, twin[np.triu_indices(23, 1)], atol=1e-5), ("condensed", precision)
                assert np.allclose(pairwise_gpu.pairwise_cuda(x, y, precision=precision, tile=9, out_dtype=out_dtype),
                                   twin_xy, atol=1e-5), ("x-y", precision)
                out = np.zeros((23, 23), out_dtype)
                pairwise_gpu.pairwise_cuda(x, precision=precision, tile=9, out=out)
                assert np.allclose(out, twin, atol=1e-5), ("streamed", precision, out_dtype)
            seen = np.zeros((23, 23), bool)
            for i0, i1, j0, j1, r in pairwise_gpu.pairwise_tiles_cuda(x, precision=precision, tile=9):
                assert np.allclose(r.get(), twin[i0:i1, j0:j1], atol=1e-5), ("tiles", precision, i0, j0)
                seen[i0:i1, j0:j1] = True
            assert seen[np.triu_indices(23)].all()
            strips = np.zeros(23 * 22 // 2, np.float32)  # condensed row strips streamed to the host
            pairwise_gpu.pairwise_cuda(x, precision=precision, out=strips, condensed=True)
            assert np.allclose(strips, twin[np.triu_indices(23, 1)], atol=1e-5), ("strips", precision)
            locked = cupyx.empty_pinned(23 * 22 // 2, dtype=np.float32)  # written by the copy engine
            pairwise_gpu.pairwise_cuda(x, precision=precision, out=locked, condensed=True)
            assert np.array_equal(locked, strips), ("page-locked strips", precision)
            # two host threads sharing one GPU exercise the multi-GPU path (shared row-tile queue)
            multi = multigpu.pairwise_multi_gpu(x, None, fit=None, weights=None, precision=precision, out=None,
                                           condensed=True, devices=[0, 0], tile=9)
            assert np.allclose(multi, twin[np.triu_indices(23, 1)], atol=1e-5), ("multi", precision)
    # aligned_rmsd_* (the scores' RMSD column)
    import cupy as cp

    from protgpu.scoring import tmscore as tm_mod

    n_ali = np.array([3, 40, 33])
    ya = rng.normal(0, 8, (3, 41, 3))
    xa = ya + rng.normal(0, 1, ya.shape)
    xa[2] = ya[2]
    for in_dtype in (np.float32, np.float64):
        got = tm_mod._common_rmsd(cp.asarray(xa.astype(in_dtype)), cp.asarray(ya.astype(in_dtype)), n_ali, cp)
        want = tm_mod._common_rmsd(xa.astype(in_dtype).astype(np.float64), ya.astype(in_dtype).astype(np.float64),
                                   n_ali, np)
        assert np.allclose(got.get(), want, atol=1e-8), ("aligned_rmsd", in_dtype)
    print("superpose: ok")
