"""The GPU paths' orchestration (chunks, tiles, modes, streaming through pinned buffers,
several devices, argument order checked against the parsed .cu signatures) on a fake
device: a NumPy-backed stand-in for CuPy and the host-compiled kernels. The GPU suite
runs the real thing."""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import pytest
from superpose_helpers import (
    FakeDeviceArray,
    build_host_kernels,
    install_fake_device,
    random_rotation,
)

from protgpu.errors import InputError
from protgpu.superpose import (
    kernels,
    pairwise_cpu,
    pairwise_gpu,
    pairwise_rmsd,
    rmsd,
    streaming,
    superpose,
    to_reference,
)


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    return build_host_kernels(tmp_path_factory)


@pytest.fixture
def fake_device(host_kernels, monkeypatch):
    return install_fake_device(host_kernels, monkeypatch)


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
        want = to_reference.rmsd_numpy(x, ref, **kwargs, want_coords=True)
        got = to_reference.rmsd_cuda(x, ref, **kwargs, want_coords=True)
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
    real = to_reference.reference_operands
    monkeypatch.setattr(to_reference, "reference_operands", lambda yc, w: uploads.append(1) or real(yc, w))
    to_reference.REFERENCE_MEMO.clear()
    cases = [((y, None), {}), ((y, None), {}), ((y, None), {"w_fit": w}), ((y[fit], None), {"fit": fit}),
             ((y[fit], None), {"fit": fit})]
    for ref, kwargs in cases:
        np.testing.assert_allclose(np.asarray(to_reference.rmsd_cuda(x, ref, **kwargs)[0]),
                                   to_reference.rmsd_numpy(x, ref, **kwargs)[0],
                                   atol=1e-9)
    assert len(uploads) == 3  # the repeated calls were served from the memo
    y[0] += 1.0  # in place: same array, other bytes
    np.testing.assert_allclose(np.asarray(to_reference.rmsd_cuda(x, (y, None))[0]),
                               to_reference.rmsd_numpy(x, (y, None))[0], atol=1e-9)
    assert len(uploads) == 4


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_fake_device_pairwise_resident_and_streamed(fake_device, precision, monkeypatch, tmp_path):
    from scipy.spatial.distance import squareform

    rng = np.random.default_rng(17)
    x = (rng.normal(size=(37, 20, 3)) * 4).astype(np.float32)
    y = (rng.normal(size=(11, 20, 3)) * 4).astype(np.float32)
    tol = 1e-6
    twin = pairwise_cpu.pairwise_numpy(x, precision=precision, out_dtype=np.float64)
    twin_xy = pairwise_cpu.pairwise_numpy(x, y, precision=precision, out_dtype=np.float64)
    for tile in (None, 8):
        # resident dense (mirrored) and condensed, and x against y
        d = pairwise_gpu.pairwise_cuda(x, precision=precision, tile=tile)
        np.testing.assert_allclose(d, twin, atol=tol)
        assert (d == d.T).all() and (np.diag(d) == 0).all() and type(d) is np.ndarray
        c = pairwise_gpu.pairwise_cuda(x, precision=precision, tile=tile, condensed=True)
        np.testing.assert_allclose(squareform(c, checks=False), twin, atol=tol)
        np.testing.assert_allclose(pairwise_gpu.pairwise_cuda(x, y, precision=precision, tile=tile), twin_xy, atol=tol)
        # streamed into a host destination (memmap), dense float64 and condensed
        mm = np.lib.format.open_memmap(tmp_path / "d.npy", mode="w+", dtype=np.float64, shape=(37, 37))
        assert pairwise_gpu.pairwise_cuda(x, precision=precision, tile=tile, out=mm) is mm
        np.testing.assert_allclose(mm, twin, atol=1e-12 if precision == "float64" else 1e-9)
        cond = np.zeros(37 * 36 // 2, np.float32)
        pairwise_gpu.pairwise_cuda(x, precision=precision, tile=tile, out=cond, condensed=True)
        np.testing.assert_allclose(cond, twin[np.triu_indices(37, 1)], atol=tol)
        out_xy = np.zeros((37, 11), np.float32)
        pairwise_gpu.pairwise_cuda(x, y, precision=precision, tile=tile, out=out_xy)
        np.testing.assert_allclose(out_xy, twin_xy, atol=tol)
    # several resident strips (the GPU's are >= 256 rows): strips against their later columns, mirrored
    monkeypatch.setattr(pairwise_gpu, "strip_rows", lambda f: 8)
    np.testing.assert_allclose(pairwise_gpu.pairwise_cuda(x, precision=precision), twin, atol=tol)
    np.testing.assert_allclose(pairwise_gpu.pairwise_cuda(x, precision=precision, condensed=True),
                               twin[np.triu_indices(37, 1)], atol=tol)
    modes = {m for n, m in fake_device if n.startswith("qcp.qcp_pairs")}
    diag = kernels.UPPER_ONLY | kernels.ZERO_DIAG
    assert modes == {0, kernels.MIRROR | diag, kernels.CONDENSED, diag}
    # a result larger than the budget streams to the host even without out=, or is refused for device input
    z = (rng.normal(size=(120, 4, 3)) * 4).astype(np.float32)
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(60_000))
    n_before = len(fake_device)
    np.testing.assert_allclose(pairwise_gpu.pairwise_cuda(z, precision=precision),
                               pairwise_cpu.pairwise_numpy(z, precision=precision), atol=tol)
    assert len(fake_device) - n_before > 1  # several tiles
    # condensed strips streamed to a host array, each strip's store split over helper threads
    monkeypatch.setattr(streaming, "store_pieces", lambda: 3)
    monkeypatch.setattr(streaming, "STORE_PIECE_BYTES", 8)
    streamed = []
    real_stream = streaming.stream_condensed
    monkeypatch.setattr(streaming, "stream_condensed", lambda *a, **k: streamed.append(1) or real_stream(*a, **k))
    cond = np.zeros(120 * 119 // 2, np.float32)
    pairwise_gpu.pairwise_cuda(z, precision=precision, out=cond, condensed=True)
    twin_z = pairwise_cpu.pairwise_numpy(z, precision=precision)
    np.testing.assert_allclose(cond, twin_z[np.triu_indices(120, 1)], atol=tol)
    assert streamed
    from protgpu.errors import MemoryBudgetError

    with pytest.raises(MemoryBudgetError, match="out="):
        pairwise_gpu.pairwise_cuda(z, precision=precision, host_result=False)


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
    xd = np.asarray(x).view(FakeDeviceArray)
    assert isinstance(rmsd(xd, y), FakeDeviceArray)
    assert isinstance(pairwise_rmsd(xd, condensed=True), FakeDeviceArray)
    assert isinstance(superpose(xd, y).coords, FakeDeviceArray)


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
    streaming.Sink(out, 1300, True, False).write(0, 1100, 1100, 1300, tile)
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
    twin = pairwise_cpu.pairwise_numpy(x, out_dtype=np.float64)[np.triu_indices(41, 1)]
    plan = pairwise_gpu.PairPlan(x, None, None, None, "float64", np.float32)
    out = np.full(41 * 40 // 2, np.nan, np.float32)
    streaming.stream_condensed(plan, out, 64 << 20, rows=rows)
    np.testing.assert_allclose(out, twin, atol=2e-5)

    class Store:  # not an ndarray: writes go one at a time
        def __init__(self, n):
            self.a = np.full(n, np.nan, np.float32)
            self.shape, self.dtype = self.a.shape, self.a.dtype

        def __setitem__(self, key, value):
            self.a[key] = value

    store = Store(41 * 40 // 2)
    streaming.stream_condensed(plan, store, 64 << 20, row_starts=iter([0, 10, 20, 30, 40]), rows=10)
    np.testing.assert_allclose(store.a, twin, atol=2e-5)
    cond = np.full(41 * 40 // 2, np.nan, np.float32)
    assert pairwise_gpu.pairwise_cuda(x, out=cond, condensed=True) is cond  # the public streaming path
    np.testing.assert_allclose(cond, twin, atol=2e-5)


def test_fake_device_shared_strip_queue_is_paced_by_the_device(fake_device, monkeypatch):
    """With several devices sharing the strip queue (row_starts) and a page-locked destination, a
    device takes its next strip only after the copy of the strip that last used the buffer it needs is
    done (its event synchronised): strips go to the devices at their pace, not the host's."""
    import cupy as cp

    rng = np.random.default_rng(21)
    x = (rng.normal(size=(61, 7, 3)) * 4).astype(np.float32)
    plan = pairwise_gpu.PairPlan(x, None, None, None, "float64", np.float32)
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

    streaming.stream_condensed(plan, pinned, 64 << 20, row_starts=starts(), rows=4)
    np.testing.assert_allclose(pinned, pairwise_cpu.pairwise_numpy(x)[np.triu_indices(61, 1)], atol=2e-5)
    n_buf = streaming.stream_writers() + 1
    takes = [i for i, e in enumerate(log) if e[0] == "take"]
    assert len(takes) == 16
    for j, t in enumerate(takes[n_buf:], start=n_buf):  # strip j waits for strip j - n_buf's copy
        assert ("sync", j - n_buf + 1) in log[:t], (j, log[:t])
    # One device alone (no row_starts) is not paced: the host enqueues as far ahead as the buffers let it.
    log.clear()
    streaming.stream_condensed(plan, pinned, 64 << 20, rows=4)
    assert not any(e[0] == "sync" for e in log)


def test_fake_device_condensed_into_page_locked_memory(fake_device, monkeypatch):
    """A page-locked destination is written straight from the device strips: no staging buffer and
    no writer-thread stores, the same values as the staged path; pageable arrays, views that are not
    C-contiguous and non-NumPy stores keep the staged path."""
    import cupy as cp
    import cupyx

    rng = np.random.default_rng(12)
    x = (rng.normal(size=(53, 7, 3)) * 4).astype(np.float32)
    plan = pairwise_gpu.PairPlan(x, None, None, None, "float64", np.float32)
    staged = np.full(53 * 52 // 2, np.nan, np.float32)
    streaming.stream_condensed(plan, staged, 64 << 20, rows=8)

    pinned = np.full(53 * 52 // 2, np.nan, np.float32)
    locked = {pinned.ctypes.data, pinned.ctypes.data + pinned.nbytes - 1}

    def attributes(ptr):  # the driver's answer: host memory (1) for the locked range, else unregistered
        return types.SimpleNamespace(type=1 if ptr in locked else 0)

    monkeypatch.setattr(cp.cuda.runtime, "pointerGetAttributes", attributes, raising=False)
    staging = []
    real_empty_pinned = cupyx.empty_pinned
    monkeypatch.setattr(cupyx, "empty_pinned", lambda *a, **k: staging.append(a) or real_empty_pinned(*a, **k))
    assert streaming.page_locked(pinned)
    assert not streaming.page_locked(np.empty_like(pinned)) and not streaming.page_locked(pinned[::2])
    streaming.stream_condensed(plan, pinned, 64 << 20, rows=8)
    assert staging == []  # no staging buffers
    np.testing.assert_array_equal(pinned, staged)
    pageable = np.full_like(staged, np.nan)
    streaming.stream_condensed(plan, pageable, 64 << 20, rows=8)
    assert staging  # the staged path for pageable memory
    np.testing.assert_array_equal(pageable, staged)


@pytest.mark.parametrize("width, quantum", [(32, 1024), (64, 32), (96, 40)])
def test_fake_device_condensed_strips_on_a_panel_grid(fake_device, monkeypatch, width, quantum):
    """Panels on a fixed grid: each strip's first panel starts on the quantum's grid just left of the
    diagonal and ends on the panel grid, then whole panels, then the grid's last, narrower panel; so a
    few panel shapes whatever the strip, and GEMM columns left of the diagonal fewer than a quantum."""
    monkeypatch.setattr(streaming, "STREAM_PANEL_COLS", width)
    monkeypatch.setattr(streaming, "STREAM_PANEL_QUANTUM", quantum)
    rng = np.random.default_rng(9)
    x = (rng.normal(size=(77, 6, 3)) * 4).astype(np.float64)
    twin = pairwise_cpu.pairwise_numpy(x, out_dtype=np.float64)[np.triu_indices(77, 1)]
    plan = pairwise_gpu.PairPlan(x, None, None, None, "float64", np.float64)
    calls = []
    orig = plan.gemm

    def gemm(i0, i1, j0, j1):
        calls.append((i0, j0, j1))
        return orig(i0, i1, j0, j1)

    plan.gemm = gemm
    out = np.full(77 * 76 // 2, np.nan)
    streaming.stream_condensed(plan, out, 64 << 20, rows=10)
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
