"""pg.cluster on the GPU: the device rows (pairwise_rows_cuda) against the CPU rows, and every method's
clusters against the CPU path and the twins, for NumPy and CuPy input."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg
from protgpu.cluster import gromos, kmedoids
from protgpu.cluster.source import MatrixRows, RmsdRows
from protgpu.errors import InputError

pytestmark = pytest.mark.gpu


def ensemble(seed, f=300, n=40, spread=1.0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(6, n, 3))
    return centres[rng.integers(6, size=f)] + rng.normal(scale=spread, size=(f, n, 3))


def test_device_rows_equal_cpu_rows():
    import cupy as cp

    x = ensemble(0)
    g, c = RmsdRows(x, on_gpu=True), RmsdRows(x)
    idx = np.array([5, 0, 299, 17, 17])
    np.testing.assert_allclose(cp.asnumpy(g.rows(idx)), c.rows(idx), atol=1e-9)
    g.strip_rows = 64
    for i0, i1, s in g.strips():
        np.testing.assert_allclose(cp.asnumpy(s), c.rows(np.arange(i0, i1)), atol=1e-9)


@pytest.mark.parametrize("kind", ["numpy", "cupy"])
def test_gromos_gpu_equals_twin(kind):
    import cupy as cp

    x = ensemble(1)
    d = pg.pairwise_rmsd(x, out=np.empty((len(x), len(x))), device="cpu")
    xin = cp.asarray(x) if kind == "cupy" else x
    for cut in (2.0, 5.0, 8.0):
        c = pg.cluster(xin, cutoff=cut, device="gpu")
        lab0, cen0 = gromos.gromos_numpy(d, cut)
        assert cp.asnumpy(c.labels).tolist() == lab0.tolist() and cp.asnumpy(c.medoids).tolist() == cen0.tolist()
        assert isinstance(c.labels, cp.ndarray) == (kind == "cupy")


def test_gromos_gpu_small_strips():
    x = ensemble(2, f=200)
    src = RmsdRows(x, on_gpu=True)
    src.strip_rows = 7
    lab, cen, _ = gromos.gromos_rows(src, 6.0)
    lab0, cen0 = gromos.gromos_numpy(pg.pairwise_rmsd(x, out=np.empty((200, 200)), device="cpu"), 6.0)
    assert lab.tolist() == lab0.tolist() and cen.tolist() == cen0.tolist()


def test_gromos_gpu_live_peak_within_budget(monkeypatch):
    # 20,000 frames: the F x F float64 matrix would be 3.2 GB; a budget of 256 MB bounds what is allocated at
    # once (the budget must exceed fixed costs such as cuBLAS's workspace: a 32 MB one at 6,000 frames did
    # not hold), and the clusters are those of the run under the default budget.
    import cupy as cp

    from protgpu._memory import DevicePeak

    x = cp.asarray(ensemble(3, f=20_000, n=30, spread=0.8))
    free = pg.cluster(x, cutoff=3.0, device="gpu")
    budget = 256_000_000
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(budget))
    cp.get_default_memory_pool().free_all_blocks()
    with DevicePeak() as peak:
        c = pg.cluster(x, cutoff=3.0, device="gpu")
    assert 8 * 20_000**2 > 10 * budget
    assert 0 < peak.live <= budget, f"live peak {peak.live} bytes over the budget {budget}"
    assert c.labels.tolist() == free.labels.tolist() and c.medoids.tolist() == free.medoids.tolist()
    assert len(c.sizes) > 1


def test_tm_metric_gpu_equals_cpu():
    x = ensemble(4, f=40, n=50, spread=0.7)  # six GROMOS clusters at 1 - TM < 0.5
    for method, kw in (("gromos", {"cutoff": 0.5}), ("hierarchical", {"k": 4})):
        g = pg.cluster(x, metric="tm", method=method, device="gpu", **kw)
        c = pg.cluster(x, metric="tm", method=method, device="cpu", **kw)
        assert g.labels.tolist() == c.labels.tolist() and g.medoids.tolist() == c.medoids.tolist()
        assert len(c.sizes) > 1


def test_kmedoids_gpu_equals_cpu():
    x = ensemble(3)
    for seed in (0, 1):
        g = pg.cluster(x, method="kmedoids", k=6, seed=seed, device="gpu")
        c = pg.cluster(x, method="kmedoids", k=6, seed=seed, device="cpu")
        assert g.medoids.tolist() == c.medoids.tolist() and g.labels.tolist() == c.labels.tolist()
        assert np.isclose(g.objective, c.objective, rtol=1e-9)


def test_kmedoids_gpu_against_package():
    km = pytest.importorskip("kmedoids")
    import cupy as cp

    x = ensemble(4)
    d = pg.pairwise_rmsd(x, out=np.empty((len(x), len(x))), device="cpu")
    src = MatrixRows(cp.asarray(d), on_gpu=True)
    src.strip_rows = 50
    meds, rows = kmedoids.kmeanspp_seed(src, 8, 0)
    ref = km.fasterpam(d, meds.copy(), max_iter=100, n_cpu=1)  # sequential FasterPAM (n_cpu > 1: shuffled order)
    _, med, loss, _ = kmedoids.fasterpam_rows(src, meds, rows)
    assert loss <= float(ref.loss) * (1 + 1e-12) + 1e-12


@pytest.mark.parametrize("linkage", ["single", "average"])
def test_hierarchical_gpu_equals_cpu(linkage):
    x = ensemble(5, f=150)
    g = pg.cluster(x, method="hierarchical", linkage=linkage, k=5, device="gpu")
    c = pg.cluster(x, method="hierarchical", linkage=linkage, k=5, device="cpu")
    assert g.labels.tolist() == c.labels.tolist()
    np.testing.assert_allclose(g.linkage, c.linkage, atol=1e-6)


def test_cupy_matrix_and_nan_gpu():
    import cupy as cp

    x = ensemble(6, f=80)
    d = pg.pairwise_rmsd(x, out=np.empty((80, 80)), device="cpu")
    c = pg.cluster(metric=cp.asarray(d), cutoff=4.0)
    assert isinstance(c.labels, cp.ndarray)
    assert cp.asnumpy(c.labels).tolist() == pg.cluster(metric=d, cutoff=4.0, device="cpu").labels.tolist()
    bad = x.copy()
    bad[7, 3, 0] = np.nan
    with pytest.raises(InputError) as e:
        pg.cluster(bad, cutoff=1.0, device="gpu")
    with pytest.raises(InputError) as e2:
        pg.pairwise_rmsd(bad, device="cpu")
    assert str(e.value) == str(e2.value)
