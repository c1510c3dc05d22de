"""Distances: the NumPy twin against float64 brute force, scipy, mdtraj; periodic images; errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import protgpu as pg
from protgpu._pbc import normalize_box
from protgpu.distances import distances_numpy
from protgpu.errors import InputError


def brute_force(x, y=None, box=None):
    """float64 reference: explicit loops over images (the definition of the minimum image)."""
    x = np.asarray(x, np.float64)
    y = x if y is None else np.asarray(y, np.float64)
    d = y[:, None, :, :] - x[:, :, None, :] if y.shape[0] == x.shape[0] else y[0][None, None] - x[:, :, None]
    if box is not None:
        vec = np.asarray(box, np.float64).reshape(-1, 3, 3)
        shifts = np.array(list(itertools.product((-2, -1, 0, 1, 2), repeat=3)), dtype=np.float64)
        out = np.empty(d.shape[:-1])
        for f in range(d.shape[0]):
            v = vec[min(f, len(vec) - 1)]
            # wrap into the cell first, then search a generous neighbourhood of images
            s = d[f] @ np.linalg.inv(v)
            s -= np.rint(s)
            df = s @ v
            imgs = df[..., None, :] + shifts @ v
            out[f] = np.sqrt((imgs**2).sum(-1).min(-1))
        return out
    return np.sqrt((d**2).sum(-1))


def test_self_matrix_matches_float64_reference(datasets):
    s = pg.load(datasets / "adk_open.pdb").select("ca")
    got = pg.distances(s, device="cpu")[0]  # a Structure is always (frames, atoms, 3)
    ref = brute_force(s.coords)[0]
    assert got.shape == (s.n_atoms, s.n_atoms) and got.dtype == np.float32
    assert np.max(np.abs(got - ref)) < 1e-4
    assert np.allclose(got, got.T) and np.all(np.diag(got) == 0)


def test_far_from_origin_keeps_1e4_accuracy():
    rng = np.random.default_rng(0)
    # coordinates within 500 Angstrom of the origin (a ball), distances up to ~1,000 Angstrom
    v = rng.normal(size=(2, 300, 3))
    x = (v / np.linalg.norm(v, axis=-1, keepdims=True) * 500 * rng.uniform(0, 1, size=(2, 300, 1)) ** (1 / 3))
    x = x.astype(np.float32)
    got = pg.distances(x, device="cpu")
    ref = brute_force(x)
    assert np.max(np.abs(got - ref)) < 1e-4


def test_matches_scipy_cdist_cross(datasets):
    spatial = pytest.importorskip("scipy.spatial")
    s = pg.load(datasets / "adk_open.pdb")
    a, b = s.coords[0, :400], s.coords[0, 1000:1700]
    got = pg.distances(a, b, device="cpu")
    assert got.shape == (400, 700)
    np.testing.assert_allclose(got, spatial.distance.cdist(a.astype(np.float64), b.astype(np.float64)), atol=1e-4)


def test_pairs_match_mdtraj_compute_distances(datasets):
    md = pytest.importorskip("mdtraj")
    t = md.load(str(datasets / "adk_dims.dcd"), top=str(datasets / "adk_open.pdb"))[:10]
    rng = np.random.default_rng(1)
    pairs = rng.integers(0, t.n_atoms, size=(500, 2))
    ref_nm = md.compute_distances(t, pairs, periodic=False)
    got = pg.distances(t.xyz * 10, pairs=pairs, device="cpu")
    assert got.shape == (10, 500)
    assert np.max(np.abs(got - ref_nm * 10)) < 1e-3  # mdtraj computes in float32 nm


def test_float64_in_float64_out():
    x = np.random.default_rng(2).normal(size=(3, 20, 3))
    got = pg.distances(x, device="cpu")
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, brute_force(x), rtol=0, atol=1e-12)


def test_y_with_one_frame_broadcasts():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 10, 3)).astype(np.float32)
    y = rng.normal(size=(6, 3)).astype(np.float32)
    got = pg.distances(x, y, device="cpu")
    assert got.shape == (4, 10, 6)
    np.testing.assert_allclose(got, brute_force(x, y[None]), atol=1e-5)


def test_orthorhombic_box_minimum_image():
    rng = np.random.default_rng(4)
    lengths = np.array([30.0, 40.0, 50.0])
    x = (rng.uniform(0, 1, size=(2, 60, 3)) * lengths).astype(np.float32)
    got = pg.distances(x, box=lengths, device="cpu")
    ref = brute_force(x, box=np.diag(lengths))
    assert np.max(np.abs(got - ref)) < 1e-4
    assert got.max() <= np.linalg.norm(lengths) / 2 + 1e-3


def test_triclinic_box_minimum_image():
    rng = np.random.default_rng(5)
    # a truncated-octahedron-like, strongly skewed (but reduced) cell
    box = np.array([[40.0, 0, 0], [13.3, 37.7, 0], [-13.3, 18.8, 32.7]])
    x = (rng.uniform(0, 1, size=(1, 80, 3)) @ box).astype(np.float32)
    got = pg.distances(x, box=box, device="cpu")
    ref = brute_force(x, box=box)
    assert np.max(np.abs(got - ref)) < 1e-4


def test_per_frame_boxes_are_used_per_frame():
    x = np.array([[[0, 0, 0], [9, 0, 0]], [[0, 0, 0], [9, 0, 0]]], dtype=np.float32)
    got = pg.distances(x, pairs=[[0, 1]], box=[[10, 10, 10], [30, 30, 30]], device="cpu")
    np.testing.assert_allclose(got[:, 0], [1.0, 9.0], atol=1e-6)


def test_out_memmap_is_filled(tmp_path):
    x = np.random.default_rng(6).normal(size=(3, 50, 3)).astype(np.float32)
    out = np.lib.format.open_memmap(tmp_path / "d.npy", mode="w+", dtype=np.float32, shape=(3, 50, 50))
    res = pg.distances(x, out=out, device="cpu")
    assert res is out
    np.testing.assert_allclose(np.load(tmp_path / "d.npy"), brute_force(x), atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"x": np.zeros((5, 2))}, "shape"),
        ({"x": np.zeros((1, 0, 3))}, "no atoms"),
        ({"x": np.array([[0, 0, 0], [np.nan, 0, 0]])}, "atom 1"),
        ({"x": np.zeros((2, 4, 3)), "pairs": [[0, 9]]}, "outside"),
        ({"x": np.zeros((2, 4, 3)), "pairs": [0, 1]}, "(k, 2)"),
        ({"x": np.zeros((2, 4, 3)), "box": [1, 2]}, "box must have shape"),
        ({"x": np.zeros((2, 4, 3)), "box": [0, 1, 1]}, "zero volume"),
        ({"x": np.zeros((2, 4, 3)), "y": np.zeros((3, 4, 3))}, "frames"),
        ({"x": np.zeros((2, 4, 3)), "out": np.zeros((2, 4, 5), np.float32)}, "out="),
        ({"x": np.zeros((2, 4, 3)), "device": "tpu"}, "device"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, message):
    x = kwargs.pop("x")
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pg.distances(x, **({"device": "cpu"} | kwargs))


def test_frame_with_nan_is_named():
    x = np.zeros((4, 3, 3))
    x[2, 1, 0] = np.inf
    with pytest.raises(InputError, match="frame 2"):
        pg.distances(x, device="cpu")


def test_result_too_large_for_host_fails_before_allocating(monkeypatch):
    import protgpu._memory as mem
    from protgpu.errors import MemoryBudgetError

    monkeypatch.setattr(mem, "host_available_bytes", lambda: 1000)
    with pytest.raises(MemoryBudgetError, match="needs"):
        pg.distances(np.zeros((2, 100, 3), np.float32), device="cpu")


coords = arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 25), st.just(3)),
                elements=st.floats(-100, 100, allow_nan=False, width=64))


@settings(max_examples=40, deadline=None)
@given(coords)
def test_symmetric_zero_diagonal_and_translation_invariant(x):
    d = distances_numpy(x)
    np.testing.assert_allclose(d, np.swapaxes(d, 1, 2), atol=1e-12)
    assert np.all(np.diagonal(d, axis1=1, axis2=2) == 0)
    np.testing.assert_allclose(distances_numpy(x + np.array([7.0, -3.0, 11.0])), d, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(coords, st.floats(5, 60), st.floats(5, 60), st.floats(5, 60))
def test_periodic_distance_never_exceeds_plain_and_matches_images(x, a, b, c):
    box = np.array([a, b, c])
    d = distances_numpy(x, box=box)
    assert np.all(d <= distances_numpy(x) + 1e-9)
    np.testing.assert_allclose(d, brute_force(x, box=np.diag(box)), atol=1e-8)


def test_three_frame_box_ambiguity_is_refused_not_guessed():
    with pytest.raises(InputError, match="ambiguous"):
        normalize_box(np.full((3, 3), 50.0), 3)
    vec, _, mode = normalize_box(np.array([[40.0, 0, 0], [13, 37, 0], [-13, 18, 32]]), 3)  # lower triangular
    assert mode == 2 and vec.shape == (1, 3, 3)
    vec, _, mode = normalize_box(np.array([[[50.0, 60, 70]], [[50, 60, 70]], [[51, 61, 71]]]), 3)
    assert mode == 1 and vec.shape == (3, 3, 3) and vec[2, 2, 2] == 71


def test_normalize_box_forms():
    vec, inv, mode = normalize_box([10, 20, 30], 4)
    assert mode == 1 and vec.shape == (1, 3, 3)
    np.testing.assert_allclose(vec[0] @ inv[0], np.eye(3), atol=1e-12)
    vec, inv, mode = normalize_box(np.tile(np.array([[10, 0, 0], [3, 10, 0], [0, 0, 10.0]]), (4, 1, 1)), 4)
    assert mode == 2 and vec.shape == (4, 3, 3)
    assert normalize_box(None, 4)[2] == 0
