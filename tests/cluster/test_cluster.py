"""pg.cluster on the CPU: GROMOS against its twin, k-medoids against the kmedoids package, hierarchical
against SciPy, the input forms and the bad-input errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protgpu as pg
from protgpu.cluster import gromos, hierarchical, kmedoids
from protgpu.cluster.core import within_medoids
from protgpu.cluster.source import MatrixRows, RmsdRows
from protgpu.errors import InputError, MemoryBudgetError

scipy_h = pytest.importorskip("scipy.cluster.hierarchy")
squareform = pytest.importorskip("scipy.spatial.distance").squareform

DATA = "datasets/adk_dims.dcd"
TOP = "datasets/adk_open.pdb"


def ensemble(seed, f=40, n=12, spread=1.0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(4, n, 3))
    return centres[rng.integers(4, size=f)] + rng.normal(scale=spread, size=(f, n, 3))


def rmsd_matrix(x):
    return pg.pairwise_rmsd(x, out=np.empty((len(x), len(x))), device="cpu")


def int_matrix(seed, f, top=6):
    """A symmetric integer matrix with a zero diagonal: many exact ties."""
    rng = np.random.default_rng(seed)
    a = rng.integers(1, top, size=(f, f)).astype(float)
    a = np.triu(a, 1)
    return a + a.T


# ------------------------------------------------------------------------------------------- GROMOS


def test_gromos_gromacs_convention():
    # Neighbours are d < cutoff (a distance equal to the cutoff is not one), the frame itself counted.
    d = np.array([[0, 2, 9], [2, 0, 9], [9, 9, 0]], dtype=float)
    assert pg.cluster(metric=d, cutoff=2.0).labels.tolist() == [0, 1, 2]
    assert pg.cluster(metric=d, cutoff=2.0001).labels.tolist() == [0, 0, 1]


def test_gromos_ties_lowest_index():
    d = np.array([[0, 1, 9, 9], [1, 0, 9, 9], [9, 9, 0, 1], [9, 9, 1, 0]], dtype=float)
    c = pg.cluster(metric=d[::-1, ::-1].copy(), cutoff=2.0)
    assert c.medoids.tolist() == [0, 2] and c.labels.tolist() == [0, 0, 1, 1]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), f=st.integers(2, 30), cut=st.integers(1, 6), strip=st.integers(1, 7))
def test_gromos_rows_equal_twin_ties(seed, f, cut, strip):
    d = int_matrix(seed, f)
    src = MatrixRows(d)
    src.strip_rows = strip
    lab, cen, _ = gromos.gromos_rows(src, float(cut))
    lab0, cen0 = gromos.gromos_numpy(d, float(cut))
    assert lab.tolist() == lab0.tolist() and cen.tolist() == cen0.tolist()


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), cut=st.floats(0.5, 4.0), strip=st.integers(1, 50))
def test_gromos_coordinates_equal_twin(seed, cut, strip):
    x = ensemble(seed)
    src = RmsdRows(x)
    src.strip_rows = strip
    lab, cen, _ = gromos.gromos_rows(src, cut)
    lab0, cen0 = gromos.gromos_numpy(rmsd_matrix(x), cut)
    assert lab.tolist() == lab0.tolist() and cen.tolist() == cen0.tolist()


def test_gromos_shipped_trajectory():
    traj = pg.load(DATA, top=TOP).select("ca")
    d = rmsd_matrix(traj.coords)
    for cut in (1.0, 2.0, 3.0):
        c = pg.cluster(traj, method="gromos", cutoff=cut, device="cpu")
        lab0, cen0 = gromos.gromos_numpy(d, cut)
        assert c.labels.tolist() == lab0.tolist() and c.medoids.tolist() == cen0.tolist()
        assert c.sizes.sum() == traj.n_frames and c.linkage is None


# ---------------------------------------------------------------------------------------- k-medoids


def test_kmedoids_against_package_same_start():
    km = pytest.importorskip("kmedoids")
    for seed in range(6):
        x = ensemble(seed, f=80)
        d = rmsd_matrix(x)
        src = MatrixRows(d)
        src.strip_rows = 7
        meds, rows = kmedoids.kmeanspp_seed(src, 5, seed)
        ref = km.fasterpam(d, meds.copy(), max_iter=100, n_cpu=1)  # sequential FasterPAM (n_cpu > 1: shuffled order)
        lab, med, loss, _ = kmedoids.fasterpam_rows(src, meds, rows)
        assert loss <= float(ref.loss) * (1 + 1e-12) + 1e-12
        assert sorted(med.tolist()) == sorted(np.asarray(ref.medoids).tolist())
        assert np.isclose(loss, d[np.arange(len(d)), med[lab]].sum())


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(2, 6), strip=st.integers(1, 40))
def test_kmedoids_strip_size_and_local_optimum(seed, k, strip):
    x = ensemble(seed, f=40)
    d = rmsd_matrix(x)
    src = MatrixRows(d)
    meds, rows = kmedoids.kmeanspp_seed(src, k, seed)
    src.strip_rows = 40
    ref = kmedoids.fasterpam_rows(src, meds, rows.copy())
    src.strip_rows = strip
    got = kmedoids.fasterpam_rows(src, meds, rows.copy())
    assert got[1].tolist() == ref[1].tolist() and got[0].tolist() == ref[0].tolist()
    # No single swap improves the loss (brute force).
    med = got[1]
    best = d[:, med].min(axis=1).sum()
    for b in range(k):
        for j in range(len(d)):
            if j in med:
                continue
            trial = med.copy()
            trial[b] = j
            assert d[:, trial].min(axis=1).sum() >= best - 1e-9


def test_kmedoids_public_and_k1():
    x = ensemble(3)
    c = pg.cluster(x, method="kmedoids", k=3, seed=1, device="cpu")
    d = rmsd_matrix(x)
    assert np.isclose(c.objective, d[np.arange(len(d)), c.medoids[c.labels]].sum())
    c1 = pg.cluster(x, method="kmedoids", k=1, device="cpu")
    assert c1.medoids.tolist() == [int(np.argmin(d.sum(axis=1)))]
    assert pg.cluster(x, method="kmedoids", k=3, seed=1, device="cpu").medoids.tolist() == c.medoids.tolist()


# ------------------------------------------------------------------------------------- hierarchical


@pytest.mark.parametrize("method", ["single", "complete", "average"])
def test_hierarchical_equals_scipy(method):
    x = ensemble(5, f=50)
    d = rmsd_matrix(x)
    z0 = scipy_h.linkage(squareform(d, checks=False), method=method)
    for kw, crit in (({"k": 4}, ("maxclust", 4)), ({"cutoff": 2.5}, ("distance", 2.5))):
        c = pg.cluster(x, method="hierarchical", linkage=method, device="cpu", **kw)
        np.testing.assert_array_equal(c.linkage[:, [0, 1, 3]], z0[:, [0, 1, 3]])
        np.testing.assert_allclose(c.linkage[:, 2], z0[:, 2], rtol=1e-12)
        assert c.labels.tolist() == (scipy_h.fcluster(z0, crit[1], criterion=crit[0]) - 1).tolist()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), f=st.integers(2, 30))
def test_single_linkage_rows_equal_scipy_ties(seed, f):
    d = int_matrix(seed, f)
    z = hierarchical.single_linkage_rows(MatrixRows(d))
    np.testing.assert_array_equal(z, scipy_h.linkage(squareform(d), method="single"))


def test_single_linkage_when_matrix_does_not_fit(monkeypatch):
    x = ensemble(2, f=30)

    def too_big(self):
        raise MemoryBudgetError("does not fit")

    monkeypatch.setattr(RmsdRows, "condensed", too_big)
    c = pg.cluster(x, method="hierarchical", linkage="single", k=3, device="cpu")
    z0 = scipy_h.linkage(squareform(rmsd_matrix(x), checks=False), method="single")
    np.testing.assert_array_equal(c.linkage[:, [0, 1, 3]], z0[:, [0, 1, 3]])
    np.testing.assert_allclose(c.linkage[:, 2], z0[:, 2], rtol=1e-9)
    with pytest.raises(MemoryBudgetError, match="single linkage does not need it"):
        pg.cluster(x, method="hierarchical", linkage="average", k=3, device="cpu")


def test_within_medoids_brute_force():
    d = int_matrix(4, 25)
    labels = np.random.default_rng(1).integers(0, 4, size=25)
    src = MatrixRows(d)
    src.strip_rows = 3
    med, _ = within_medoids(src, labels)
    for c in range(4):
        m = np.flatnonzero(labels == c)
        assert med[c] == m[np.argmin(d[np.ix_(m, m)].sum(axis=1))]


# ------------------------------------------------------------------------------------- input forms


def test_precomputed_forms(tmp_path):
    x = ensemble(7)
    d = rmsd_matrix(x)
    ref = pg.cluster(x, cutoff=2.0, device="cpu")
    mm = np.lib.format.open_memmap(tmp_path / "d.npy", mode="w+", dtype=np.float32, shape=d.shape)
    mm[:] = d
    for m in (d, mm, d.astype(np.float32)):
        assert pg.cluster(metric=m, cutoff=2.0).labels.tolist() == ref.labels.tolist()
    assert pg.cluster(d, metric="precomputed", cutoff=2.0).labels.tolist() == ref.labels.tolist()
    assert pg.cluster(x, metric=d, cutoff=2.0).labels.tolist() == ref.labels.tolist()
    zarr = pytest.importorskip("zarr")
    z = zarr.open_array(str(tmp_path / "d.zarr"), mode="w", shape=d.shape, chunks=(7, 40), dtype=np.float64)
    z[:] = d
    assert pg.cluster(metric=z, cutoff=2.0).labels.tolist() == ref.labels.tolist()
    assert pg.cluster(metric=z, method="kmedoids", k=3).medoids.tolist() == \
        pg.cluster(metric=d, method="kmedoids", k=3).medoids.tolist()


def test_structure_and_path_inputs():
    traj = pg.load(DATA, top=TOP)
    a = pg.cluster(traj, fit="ca", cutoff=2.0, device="cpu")
    b = pg.cluster(traj.select("ca").coords, cutoff=2.0, device="cpu")
    assert a.labels.tolist() == b.labels.tolist()


# ---------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, match", [
    ({"cutoff": 0}, "cutoff 0.0: must be a positive"),
    ({"cutoff": -2}, "must be a positive"),
    ({"cutoff": float("nan")}, "must be a positive"),
    ({}, "GROMOS clustering needs cutoff"),
    ({"method": "kmedoids", "k": 0}, "must be a positive integer"),
    ({"method": "kmedoids", "k": 41}, "k=41: more clusters than the 40 frames"),
    ({"method": "kmedoids"}, "k-medoids needs k="),
    ({"method": "hierarchical"}, "exactly one of cutoff"),
    ({"method": "hierarchical", "k": 2, "linkage": "ward"}, "linkage 'ward'"),
    ({"method": "dbscan", "cutoff": 1}, "method 'dbscan'"),
    ({"metric": "euclid", "cutoff": 1}, "metric 'euclid'"),
    ({"metric": np.zeros((3, 4)), "cutoff": 1}, "must be square"),
    ({"metric": np.zeros((5, 5)), "cutoff": 1}, "the matrix is 5 x 5 but x has 40 frames"),
])
def test_bad_parameters_one_line(kwargs, match):
    with pytest.raises(InputError, match=match) as e:
        pg.cluster(ensemble(0), device="cpu", **kwargs)
    assert "\n" not in str(e.value)


def test_too_few_frames_and_nan():
    x = ensemble(0, f=5)
    with pytest.raises(InputError, match="at least 2 frames, got 1"):
        pg.cluster(x[:1], cutoff=1.0, device="cpu")
    with pytest.raises(InputError, match="at least 2 frames, got 1"):
        pg.cluster(x[0], cutoff=1.0, device="cpu")
    bad = x.copy()
    bad[3, 2, 1] = np.nan
    with pytest.raises(InputError) as e:
        pg.cluster(bad, cutoff=1.0, device="cpu")
    with pytest.raises(InputError) as e2:
        pg.pairwise_rmsd(bad, device="cpu")
    assert str(e.value) == str(e2.value)  # the same error as the other functions
    d = rmsd_matrix(x)
    d[1, 3] = np.nan
    with pytest.raises(InputError, match="nan at row 1, column 3"):
        pg.cluster(metric=d, cutoff=1.0)
    d[1, 3] = -1
    with pytest.raises(InputError, match="distances must be finite and >= 0"):
        pg.cluster(metric=d, method="kmedoids", k=2)


@pytest.mark.parametrize("method, kw", [("gromos", {"cutoff": 2.0}), ("hierarchical", {"k": 3}),
                                        ("kmedoids", {"k": 3})])
def test_objective_is_sum_to_medoids(method, kw):
    x = ensemble(11)
    d = rmsd_matrix(x)
    c = pg.cluster(x, method=method, device="cpu", **kw)
    assert np.isclose(c.objective, d[np.arange(len(d)), c.medoids[c.labels]].sum(), rtol=1e-9)
    assert c.sizes.tolist() == np.bincount(c.labels).tolist()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), f=st.integers(3, 30), k=st.integers(2, 5), strip=st.integers(1, 9))
def test_kmedoids_ties_follow_package(seed, f, k, strip):
    # Integer distances (exact sums, many ties): the same swaps as the kmedoids package's FasterPAM.
    km = pytest.importorskip("kmedoids")
    k = min(k, f - 1)
    d = int_matrix(seed, f, top=4)
    src = MatrixRows(d)
    src.strip_rows = strip
    meds, rows = kmedoids.kmeanspp_seed(src, k, seed)
    ref = km.fasterpam(d, meds.copy(), max_iter=100, n_cpu=1)  # sequential FasterPAM (n_cpu > 1: shuffled order)
    lab, med, loss, _ = kmedoids.fasterpam_rows(src, meds, rows)
    assert loss == float(ref.loss)
    assert med.tolist() == np.asarray(ref.medoids).tolist() and lab.tolist() == np.asarray(ref.labels).tolist()


def test_rows_hook_equals_pairwise_rmsd():
    from protgpu.superpose.pairwise_cpu import RowsNumpy

    x = ensemble(9, f=70)
    d = rmsd_matrix(x)
    idx = np.array([69, 0, 5, 5, 33])
    r = RowsNumpy(x).rows(idx)
    r[np.arange(idx.size), idx] = 0.0
    np.testing.assert_allclose(r, d[idx], atol=1e-10)
    np.testing.assert_allclose(RmsdRows(x).rows(slice(10, 20)), d[10:20], atol=1e-10)
