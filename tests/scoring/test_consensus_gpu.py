"""GPU parity of protgpu.scoring.consensus: the fused CUDA path (pairwise_rmsd tiles on the device folded
into online-softmax states by kernels/consensus.cu) against the NumPy twin on real structures, float32
and float64 (DESIGN convention 7: the GPU's error against a float64 reference is at most 2x the NumPy
twin's, with a 1e-12 floor); the tile kernel and the weights kernel against their NumPy twins; tiling,
the memory budget, array types."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from protgpu.errors import MemoryBudgetError
from protgpu.scoring.tmscore import d0_tmscore
from protgpu.superpose import pairwise_cpu, pairwise_rmsd, qcp

cs = importlib.import_module("protgpu.scoring.consensus")

pytestmark = pytest.mark.gpu

FLOOR = 1e-12


def reference(x, temperature, d0=None):
    """float64 throughout: RMSDs from the float64 NumPy twin of pairwise_rmsd, then the definition."""
    x = np.asarray(x, dtype=np.float64)
    r = pairwise_cpu.pairwise_numpy(x, out_dtype=np.float64)
    d0 = float(d0_tmscore(x.shape[1])) if d0 is None else d0
    r2 = r * r
    inv_t = 0.0 if np.isinf(temperature) else 1.0 / temperature
    logit = -r2 * inv_t
    np.fill_diagonal(logit, -np.inf)
    e = np.exp(logit - logit.max(axis=1, keepdims=True))
    w = e / e.sum(axis=1, keepdims=True)
    return (w / (1 + r2 / d0**2)).sum(axis=1), w


def assert_parity(gpu_val, cpu_val, ref):
    err_gpu = np.abs(np.asarray(gpu_val, dtype=np.float64) - ref).max()
    err_cpu = np.abs(np.asarray(cpu_val, dtype=np.float64) - ref).max()
    assert err_gpu <= max(2 * err_cpu, FLOOR), (err_gpu, err_cpu)


def _rotations(rng, n):
    q = rng.normal(size=(n, 4))
    return qcp.quaternion_to_rotation(q / np.linalg.norm(q, axis=1, keepdims=True))


@pytest.fixture(scope="module")
def adk(datasets):
    from protgpu.io import load

    return load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb")


@pytest.fixture(scope="module")
def ensemble(adk):
    """294 models of 214 CA atoms, float64: the 98 AdK frames and two noisy, moved copies of each."""
    rng = np.random.default_rng(0)
    ca = adk.coords[:, adk.select_indices("ca")].astype(np.float64)
    x = np.concatenate([ca, ca + rng.normal(scale=0.4, size=ca.shape), ca + rng.normal(scale=1.5, size=ca.shape)])
    rot = _rotations(rng, len(x))
    return np.matmul(x, rot.transpose(0, 2, 1)) + rng.normal(scale=20, size=(len(x), 1, 3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("temperature", [cs.DEFAULT_TEMPERATURE, 1.0, 25.0, np.inf])
def test_parity_adk(gpu, ensemble, dtype, temperature):
    x = ensemble.astype(dtype)
    ref, _ = reference(x, temperature)
    g = cs.consensus_score(x, temperature=temperature, device="gpu")
    c = cs.consensus_score(x, temperature=temperature, device="cpu")
    assert isinstance(g, np.ndarray) and g.dtype == np.float64 and g.shape == (len(x),)
    assert_parity(g, c, ref)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("tile", [13, 64, 100, 293])
def test_tiles_do_not_change_the_result(gpu, ensemble, dtype, tile):
    x = ensemble.astype(dtype)
    ref, _ = reference(x, 4.0)
    c = cs.consensus_numpy(x, 4.0)
    g = cs.consensus_cuda(gpu.asarray(x), 4.0, tile=tile)
    assert isinstance(g, gpu.ndarray)
    assert_parity(g.get(), c, ref)
    np.testing.assert_allclose(g.get(), c, rtol=0, atol=1e-7)


def test_single_model_tiles(gpu, ensemble):
    x = ensemble[:20]
    np.testing.assert_allclose(cs.consensus_cuda(x, 2.0, tile=1).get(), cs.consensus_numpy(x, 2.0), atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_return_weights(gpu, ensemble, dtype):
    x = ensemble[:150].astype(dtype)
    ref, ref_w = reference(x, 4.0)
    g, gw = cs.consensus_score(x, return_weights=True, device="gpu")
    c, cw = cs.consensus_score(x, return_weights=True, device="cpu")
    assert gw.shape == (150, 150) and gw.dtype == np.float64
    np.testing.assert_allclose(gw.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert (np.diag(gw) == 0).all()
    assert_parity(g, c, ref)
    assert_parity(gw, cw, ref_w)
    # the weights path and the fused path agree
    np.testing.assert_allclose(g, cs.consensus_score(x, device="gpu"), rtol=0, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tile_kernel_equals_twin(gpu, dtype):
    rng = np.random.default_rng(7)
    n = 5000
    for ti, tj, row0, col0, mode in ((1000, 3000, 0, 1500, cs.ROWS | cs.COLS), (777, 777, 300, 300, cs.ROWS),
                                     (33, 4000, 10, 1000, cs.COLS), (2800, 45, 2000, 4900, cs.ROWS | cs.COLS),
                                     (1, 1, 7, 7, cs.ROWS)):
        r = rng.uniform(0, 8, size=(ti, tj)).astype(dtype)
        if ti > 10 and tj > 10:
            r[5, 9] = np.nan
        pre = rng.uniform(0, 4, size=(1, n))
        host = (np.full(n, -np.inf), np.zeros(n), np.zeros(n))
        cs.tile_update_numpy(pre, 0, 0, host, 0.3, 0.05, cs.COLS)
        dev = tuple(gpu.asarray(a) for a in host)
        cs.tile_update_numpy(r, row0, col0, host, 0.3, 0.05, mode)
        cs._tile_update_cuda(gpu.asarray(r), row0, col0, dev, 0.3, 0.05, mode)
        for a, b in zip(dev, host, strict=True):
            np.testing.assert_allclose(a.get(), b, rtol=1e-12, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_weights_kernel_equals_twin(gpu, ensemble, dtype):
    x = ensemble[:120]
    r = pairwise_rmsd(x, device="cpu").astype(dtype)
    state = (np.full(120, -np.inf), np.zeros(120), np.zeros(120))
    cs.tile_update_numpy(r, 0, 0, state, 0.25, 0.04, cs.ROWS)
    from protgpu import _cuda

    w = gpu.empty((120, 120))
    h = _cuda.get_kernel("consensus", f"consensus_weights_{'f32' if dtype == np.float32 else 'f64'}")
    _cuda.launch(h, (8,), (256,), gpu.asarray(r), w, gpu.asarray(state[0]), gpu.asarray(state[1]), 120, 0.25)
    logit = -(r.astype(np.float64) ** 2) * 0.25
    np.fill_diagonal(logit, -np.inf)
    e = np.exp(logit - logit.max(axis=1, keepdims=True))
    np.testing.assert_allclose(w.get(), e / e.sum(axis=1, keepdims=True), rtol=1e-12, atol=1e-300)


def test_array_types(gpu, ensemble):
    x = ensemble[:60]
    c = cs.consensus_score(x, device="cpu")
    xd = gpu.asarray(x.astype(np.float32))
    g = cs.consensus_score(xd)  # CuPy in: the GPU, CuPy out
    assert isinstance(g, gpu.ndarray) and g.dtype == np.float64
    np.testing.assert_allclose(g.get(), c, atol=1e-6)
    res = cs.consensus_score(xd, return_weights=True)
    assert isinstance(res.score, gpu.ndarray) and isinstance(res.weights, gpu.ndarray)
    g = cs.consensus_score(list(x), device="gpu")  # a list of arrays
    assert isinstance(g, np.ndarray)
    np.testing.assert_allclose(g, c, atol=1e-6)


def test_torch_cuda(gpu, ensemble):
    torch = pytest.importorskip("torch")
    x = ensemble[:40]
    t = torch.as_tensor(x, device="cuda")
    g = cs.consensus_score(t)
    assert isinstance(g, torch.Tensor) and g.is_cuda
    np.testing.assert_allclose(g.cpu().numpy(), cs.consensus_score(x, device="cpu"), atol=1e-6)


def test_structures_on_gpu(gpu, adk):
    sub = adk.frames(np.arange(0, 98, 3))
    np.testing.assert_allclose(cs.consensus_score(sub, device="gpu"), cs.consensus_score(sub, device="cpu"),
                               atol=1e-7)
    rows = cs.consensus_ranking_table([sub], device="gpu")
    assert [r["rank"] for r in rows] == list(range(1, 34))


def test_device_nan_gives_nan(gpu, ensemble):
    xd = gpu.asarray(ensemble[:30])
    xd[4, 7, 1] = gpu.nan
    g = cs.consensus_score(xd)
    assert bool(gpu.isnan(g).all())


def test_memory_budget(gpu, ensemble, monkeypatch):
    x = ensemble
    c = cs.consensus_numpy(x, 4.0)
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(2_000_000))  # tiles of ~79 models
    assert cs._gpu_tile(len(x), None) < len(x)
    np.testing.assert_allclose(cs.consensus_score(x, device="gpu"), c, atol=1e-7)
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(500_000))  # under the 1 MB of RMSD + weights
    with pytest.raises(MemoryBudgetError, match="return_weights"):
        cs.consensus_score(x, return_weights=True, device="gpu")


def test_many_models_many_tiles(gpu, adk):
    rng = np.random.default_rng(3)
    ca = adk.coords[:, adk.select_indices("ca")][:, :60].astype(np.float64)
    k = rng.integers(0, len(ca), size=2500)
    x = ca[k] + rng.normal(scale=0.5, size=(2500, 60, 3))
    c = cs.consensus_numpy(x, 4.0)
    g = cs.consensus_cuda(x, 4.0, tile=512).get()  # 5 row bands, 15 tiles, ragged last band
    np.testing.assert_allclose(g, c, rtol=0, atol=1e-7)
    np.testing.assert_allclose(cs.consensus_score(x, device="gpu"), c, rtol=0, atol=1e-7)


def check_consensus_for_sanitizer() -> None:
    """Every consensus.cu entry point on odd sizes (for compute-sanitizer via tests/sanitize_kernels.py),
    each result checked against the NumPy twin."""
    import cupy as cp

    rng = np.random.default_rng(0)
    x = rng.normal(scale=4, size=(45, 17, 3))
    twin, twin_w = cs.consensus_numpy(x, 3.0, return_weights=True)
    for tile in (7, 16, 45):  # consensus_tile_f32: diagonal (rows) and off-diagonal (rows + columns) tiles
        got = cs.consensus_cuda(x, 3.0, tile=tile).get()
        assert np.allclose(got, twin, atol=1e-6), ("tiles", tile)
    got, w = cs.consensus_cuda(x, 3.0, return_weights=True)  # consensus_weights_f32
    assert np.allclose(got.get(), twin, atol=1e-6) and np.allclose(w.get(), twin_w, atol=1e-6), "weights"
    r = rng.uniform(0, 6, size=(29, 37))  # consensus_tile_f64 / consensus_weights_f64
    host = (np.full(80, -np.inf), np.zeros(80), np.zeros(80))
    dev = tuple(cp.asarray(a) for a in host)
    cs.tile_update_numpy(r, 3, 40, host, 0.5, 0.1, cs.ROWS | cs.COLS)
    cs._tile_update_cuda(cp.asarray(r), 3, 40, dev, 0.5, 0.1, cs.ROWS | cs.COLS)
    assert all(np.allclose(a.get(), b, rtol=1e-12, equal_nan=True) for a, b in zip(dev, host, strict=True)), "f64"
    from protgpu import _cuda

    sq = rng.uniform(0, 6, size=(23, 23))
    sq = np.triu(sq, 1) + np.triu(sq, 1).T
    st_ = (np.full(23, -np.inf), np.zeros(23), np.zeros(23))
    cs.tile_update_numpy(sq, 0, 0, st_, 0.5, 0.1, cs.ROWS)
    w = cp.empty((23, 23))
    h = _cuda.get_kernel("consensus", "consensus_weights_f64")
    _cuda.launch(h, (3,), (128,), cp.asarray(sq), w, cp.asarray(st_[0]), cp.asarray(st_[1]), 23, 0.5)
    assert np.allclose(w.get().sum(axis=1), 1.0), "weights f64"
    print("consensus: ok")


def test_sanitizer_section(gpu):
    check_consensus_for_sanitizer()
