"""CPU tests of protgpu.superpose.pairwise_rmsd and its NumPy twin (pairwise_cpu): against a
float64 Kabsch, tile size and thread count not changing results, the thread control
(protgpu._threads), destinations (memmap, condensed)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from superpose_helpers import (
    kabsch_rmsd_matrix,
    load_adk,
    random_rotation,
    threads_input,
)

from protgpu import _threads
from protgpu.errors import InputError
from protgpu.superpose import (
    pairwise_cpu,
    pairwise_rmsd,
    qcp,
    rmsd,
)


@pytest.fixture(scope="module")
def adk(datasets):
    return load_adk(datasets)


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
    full = pairwise_cpu.pairwise_numpy(x, tile=1000)
    np.testing.assert_array_equal(pairwise_cpu.pairwise_numpy(x, tile=tile), full)
    np.testing.assert_array_equal(pairwise_cpu.pairwise_numpy(x, y, tile=tile),
                                  pairwise_cpu.pairwise_numpy(x, y, tile=1000))
    cond = pairwise_cpu.pairwise_numpy(x, tile=tile, condensed=True)
    from scipy.spatial.distance import squareform

    np.testing.assert_array_equal(squareform(cond), full)


@pytest.mark.parametrize("threads", [2, 5, 16])
def test_thread_count_does_not_change_results(threads, monkeypatch, tmp_path):
    """The CPU path's pool: QCP row groups (here of ~150 pairs: several per tile, so the pool is used
    even on small data) and centring chunks on worker threads, the next tile's GEMM overlapping them,
    tiles written in order from the calling thread. Bitwise equal to one thread, for every output form."""

    monkeypatch.setattr(qcp, "CHUNK_PAIRS", 150)
    monkeypatch.setattr(qcp, "CACHE_CHUNK_BYTES", 24 * 3 * 8 * 3 * 4)  # centring chunks of 4 frames
    x = threads_input()
    y = x[::3] + 0.5
    w = np.random.default_rng(2).uniform(0.5, 2, 24)
    main = threading.get_ident()
    seen = set()
    real_qcp = qcp.rmsd_only

    def spy(*args):
        seen.add(threading.get_ident())
        return real_qcp(*args)

    monkeypatch.setattr(qcp, "rmsd_only", spy)
    for kw, tile in (({}, None), ({}, 16), ({"weights": w[::2], "fit": np.arange(0, 24, 2)}, 16),
                     ({"precision": "float32"}, None)):
        seen.clear()
        one = pairwise_cpu.pairwise_numpy(x, tile=tile, out_dtype=np.float64, threads=1, **kw)
        assert seen == {main}
        seen.clear()
        many = pairwise_cpu.pairwise_numpy(x, tile=tile, out_dtype=np.float64, threads=threads, **kw)
        assert seen and main not in seen  # the groups ran on the pool
        np.testing.assert_array_equal(many, one)
        if not kw:
            np.testing.assert_array_equal(pairwise_cpu.pairwise_numpy(x, y, tile=tile, threads=threads),
                                          pairwise_cpu.pairwise_numpy(x, y, tile=tile, threads=1))
    # Tiles of 8 frames into memmaps (dense and condensed): every tile lands where it belongs.
    one = pairwise_cpu.pairwise_numpy(x, tile=8, out_dtype=np.float64, threads=1)
    mm = np.lib.format.open_memmap(tmp_path / "d.npy", mode="w+", dtype=np.float64, shape=(45, 45))
    assert pairwise_cpu.pairwise_numpy(x, tile=8, out=mm, threads=threads) is mm
    np.testing.assert_array_equal(np.load(tmp_path / "d.npy"), one)
    cm = np.lib.format.open_memmap(tmp_path / "c.npy", mode="w+", dtype=np.float64, shape=(45 * 44 // 2,))
    pairwise_cpu.pairwise_numpy(x, tile=8, out=cm, condensed=True, threads=threads)
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), one[np.triu_indices(45, 1)])


def test_cpu_split_never_oversubscribes():
    """The CPU all-vs-all's QCP pool and BLAS threads together fit the cores (from 2 up), each >= 1."""
    for n in range(1, 129):
        q, b = _threads.cpu_split(n)
        assert q >= 1 and b >= 1 and (q + b <= n or n == 1), n
    assert _threads.cpu_split(16) == (4, 12)


def test_blas_threads_limits_blas_inside_the_block():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    blas = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    if not blas:
        pytest.skip("no BLAS library found by threadpoolctl")
    with _threads.blas_threads(1):
        # the BLAS libraries loaded when protgpu first limited them: NumPy's among them
        assert all(lib.num_threads == 1 for lib in _threads.blas_controller().select(user_api="blas").lib_controllers)
        info = threadpoolctl.threadpool_info()
        assert all(i["num_threads"] == 1 for i in info if i["user_api"] == "blas" and "numpy" in i["filepath"])


def test_pairwise_worker_error_propagates(monkeypatch):
    monkeypatch.setattr(qcp, "CHUNK_PAIRS", 150)

    def boom(*args):
        raise FloatingPointError("in a worker")

    monkeypatch.setattr(qcp, "rmsd_only", boom)
    with pytest.raises(FloatingPointError, match="in a worker"):
        pairwise_cpu.pairwise_numpy(threads_input(), tile=16, threads=2)


def test_pairwise_cpu_twin_unchanged_on_real_frames(adk):
    """Pairs of AdK frames (real spectra, self pairs, a moved copy of a frame) on the pool against a
    float64 Kabsch reference; the copy keeps the QCP formula's noise (module notes)."""
    x = np.asarray(adk.coords[:12], dtype=np.float64)[:, ::7]
    x = np.concatenate([x, x[4:5] @ random_rotation(np.random.default_rng(3)).T + 9])
    d = pairwise_cpu.pairwise_numpy(x, out_dtype=np.float64, threads=2)
    np.testing.assert_allclose(d, kabsch_rmsd_matrix(x, x), atol=1e-6)
    assert d[4, 12] < 1e-5 and (np.diag(d) == 0).all() and (d == d.T).all()


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
