"""cuBLAS matmul through nvmath-python: parity with NumPy, batched, transposed views, plan reuse,
and the caller's stream (run on the GPU machine)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def blas(gpu):
    pytest.importorskip("nvmath")
    from protgpu._cuda import blas

    return blas


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-4), (np.float64, 1e-12)])
@pytest.mark.parametrize("shape_a, shape_b", [((37, 19), (19, 53)), ((4, 37, 19), (4, 19, 53))])
def test_matmul_matches_numpy(gpu, blas, dtype, tol, shape_a, shape_b):
    rng = np.random.default_rng(0)
    a = rng.normal(size=shape_a).astype(dtype)
    b = rng.normal(size=shape_b).astype(dtype)
    got = blas.matmul(gpu.asarray(a), gpu.asarray(b))
    assert isinstance(got, gpu.ndarray) and got.dtype == dtype and got.shape == (a @ b).shape
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.max(np.abs(got.get() - ref)) <= tol * np.max(np.abs(ref))


def test_transposed_view_and_plan_reuse(gpu, blas):
    rng = np.random.default_rng(1)
    x = gpu.asarray(rng.normal(size=(300, 40)))
    first = blas.matmul(x, x.T)  # A A^T, the pairwise-RMSD shape, without a copy
    plans = blas._device_cache(x.device.id)[0]
    n_plans = len(plans)
    y = gpu.asarray(rng.normal(size=(300, 40)))
    second = blas.matmul(y, y.T)  # same shapes: the cached plan is reused with new operands
    assert len(plans) == n_plans
    np.testing.assert_allclose(first.get(), x.get() @ x.get().T, atol=1e-10)
    np.testing.assert_allclose(second.get(), y.get() @ y.get().T, atol=1e-10)


def test_runs_on_the_callers_stream(gpu, blas):
    rng = np.random.default_rng(2)
    a = gpu.asarray(rng.normal(size=(64, 64)))
    s = gpu.cuda.Stream(non_blocking=True)
    with s:
        got = blas.matmul(a, a)
        key_streams = {k[-1] for k in blas._device_cache(a.device.id)[0]}
    s.synchronize()
    assert s.ptr in key_streams
    np.testing.assert_allclose(got.get(), a.get() @ a.get(), atol=1e-10)


def test_bad_operands_are_refused(gpu, blas):
    a = gpu.zeros((3, 4), np.float32)
    with pytest.raises(TypeError, match="float32 or two float64"):
        blas.matmul(a, gpu.zeros((4, 2), np.float64))
    with pytest.raises(ValueError, match="shapes do not agree"):
        blas.matmul(a, gpu.zeros((3, 2), np.float32))


def test_each_device_keeps_its_own_plans(gpu, blas):
    """Two devices multiplying the same shapes, each from its own thread, many times: every plan stays
    cached in its device's cache (one shared LRU would let the devices evict each other's plans)."""
    import concurrent.futures

    if gpu.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    rng = np.random.default_rng(3)
    hosts = [rng.normal(size=(3 * n, 30)) for n in range(20, 20 + blas._MAX_PLANS)]

    def work(dev):
        with gpu.cuda.Device(dev):
            arrays = [gpu.asarray(h) for h in hosts]
            plans = blas._device_cache(dev)[0]
            [blas.matmul(a, a.T) for a in arrays]
            planned = {k: id(m) for k, m in plans.items()}
            outs = [blas.matmul(a, a.T) for a in arrays]  # every shape must be found already planned
            gpu.cuda.get_current_stream().synchronize()
            return planned, {k: id(m) for k, m in plans.items()}, [o.get() for o in outs]

    blas.clear_plans()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(work, [0, 1]))
    for planned, reused, got in results:
        assert len(planned) == blas._MAX_PLANS and reused == planned
        for g, h in zip(got, hosts, strict=True):
            np.testing.assert_allclose(g, h @ h.T, atol=1e-9)
