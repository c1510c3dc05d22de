"""GPU parity of the distance kernels with the NumPy twin (run on the GPU machine)."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg
from protgpu.distances import distances_numpy

pytestmark = pytest.mark.gpu


def _ref64(x, y=None, box=None, pairs=None):
    return distances_numpy(np.asarray(x, np.float64), None if y is None else np.asarray(y, np.float64),
                           box=box, pairs=pairs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_self_matrix_parity_on_real_structure(gpu, datasets, dtype):
    s = pg.load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb")
    x = s.coords[:8].astype(dtype)
    got = pg.distances(x, device="gpu")
    assert isinstance(got, np.ndarray) and got.dtype == dtype
    ref = _ref64(x)
    err_gpu = np.max(np.abs(got - ref))
    err_cpu = np.max(np.abs(distances_numpy(x) - ref))
    assert err_gpu <= max(2 * err_cpu, 1e-4 if dtype == np.float32 else 1e-10)


def test_cupy_in_cupy_out_and_cross(gpu, datasets):
    s = pg.load(datasets / "adk_open.pdb")
    a = gpu.asarray(s.coords[0, :500])
    b = gpu.asarray(s.coords[0, 2000:2900])
    got = pg.distances(a, b)
    assert isinstance(got, gpu.ndarray) and got.shape == (500, 900)
    assert float(gpu.max(gpu.abs(got - gpu.asarray(_ref64(s.coords[:, :500], s.coords[:, 2000:2900])[0])))) < 1e-4


@pytest.mark.parametrize("box", [np.array([30.0, 40.0, 50.0]),
                                 np.array([[40.0, 0, 0], [13.3, 37.7, 0], [-13.3, 18.8, 32.7]])])
def test_periodic_parity(gpu, box):
    rng = np.random.default_rng(0)
    x = (rng.uniform(0, 1, size=(3, 700, 3)) @ (np.diag(box) if box.ndim == 1 else box)).astype(np.float32)
    got = pg.distances(x, box=box, device="gpu")
    assert np.max(np.abs(got - _ref64(x, box=box))) < 1e-4


def test_pairs_parity_with_per_frame_boxes(gpu):
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 50, size=(5, 300, 3)).astype(np.float32)
    boxes = rng.uniform(30, 60, size=(5, 3))
    pairs = rng.integers(0, 300, size=(1000, 2))
    got = pg.distances(x, pairs=pairs, box=boxes, device="gpu")
    assert got.shape == (5, 1000)
    assert np.max(np.abs(got - _ref64(x, box=boxes, pairs=pairs))) < 1e-4


def test_chunked_output_to_memmap_equals_one_shot(gpu, tmp_path, monkeypatch):
    x = np.random.default_rng(2).normal(scale=20, size=(7, 300, 3)).astype(np.float32)
    one_shot = pg.distances(x, device="gpu")
    # A tiny budget forces one frame per chunk.
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(300 * 300 * 4))
    out = np.lib.format.open_memmap(tmp_path / "d.npy", mode="w+", dtype=np.float32, shape=(7, 300, 300))
    pg.distances(x, out=out, device="gpu")
    np.testing.assert_array_equal(np.asarray(out), one_shot)
    chunked = pg.distances(x, device="gpu")
    np.testing.assert_array_equal(chunked, one_shot)


def test_torch_cuda_round_trip(gpu):
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 100, 3, device="cuda")
    got = pg.distances(x)
    assert isinstance(got, torch.Tensor) and got.is_cuda
    ref = torch.cdist(x.double(), x.double())
    assert float((got.double() - ref).abs().max()) < 1e-4


@pytest.mark.parametrize("m", [333, 1000])  # 333: the scalar-store path; 1000: float4 stores
def test_rows_per_block_does_not_change_results(gpu, m):
    """Tile-size independence: the kernel's ROWS_PER_BLOCK knob (and the launch geometry with it)."""
    import cupy

    from protgpu import _cuda

    rng = np.random.default_rng(3)
    x = cupy.asarray(rng.normal(scale=30, size=(2, 333, 3)).astype(np.float32))
    y = cupy.asarray(rng.normal(scale=30, size=(2, m, 3)).astype(np.float32))
    zeros = cupy.zeros((1, 9), np.float64)
    results = []
    for rows in (1, 3, 8, 16):
        h = _cuda.get_kernel("distances", "distance_matrix_f32", {"ROWS_PER_BLOCK": rows})
        out = cupy.empty((2, 333, m), np.float32)
        tiles = (333 + rows - 1) // rows
        _cuda.launch(h, 2 * tiles, 128, x, y, zeros, zeros, out, 2, 333, m, 1, 0, 0)
        results.append(out.get())
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    ref = distances_numpy(x.get(), y.get())
    np.testing.assert_allclose(results[0], ref, atol=1e-5)


def test_launch_rejects_wrong_argument_types(gpu):
    import cupy

    from protgpu import _cuda

    h = _cuda.get_kernel("distances", "pair_distances_f32")
    x = cupy.zeros((1, 2, 3), np.float64)  # wrong dtype
    with pytest.raises(TypeError, match="float"):
        _cuda.launch(h, 1, 32, x, None, None, None, None, 1, 2, 0, 0, 0)
    with pytest.raises(TypeError, match="takes 10 arguments"):
        _cuda.launch(h, 1, 32, x)
