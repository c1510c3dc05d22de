"""OpenStructure's GDT (protgpu.scoring.gdt_windows): the NumPy twin and the numba path against a direct,
one-window-at-a-time transcription of the algorithm (SVD superpositions, index lists), the seeds, edge
cases and rigid-motion invariance. The 1eud values against OpenStructure: tests/complexes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protgpu.scoring import _fast
from protgpu.scoring import gdt_windows as gw


def _svd_fit(x, y):
    """R, t with x @ R.T + t ~ y (least squares, proper rotation)."""
    cx, cy = x.mean(axis=0), y.mean(axis=0)
    u, _, vt = np.linalg.svd((x - cx).T @ (y - cy))
    d = np.sign(np.linalg.det(vt.T @ u.T))
    r = vt.T @ np.diag([1.0, 1.0, d]) @ u.T
    return r, cy - r @ cx


def _reference_counts(x, y):
    """ost.mol.alg.GDT for every window size and cutoff, one window at a time (the C++ loop as written)."""
    n = len(x)
    out = []
    for c in gw.CUTOFFS:
        best = 0
        for w in sorted({*gw.WINDOW_SIZES, n}):
            if w > n or w < 3:
                continue
            for start in gw._starts(n, w):
                temp = list(range(start, start + w))
                max_n = -1
                for _ in range(gw.MAX_ROUNDS):
                    if len(temp) < 3:
                        break
                    r, t = _svd_fit(x[temp], y[temp])
                    d2 = (((x @ r.T + t) - y) ** 2).sum(axis=1)
                    new = [i for i in range(n) if d2[i] < c * c]
                    max_n = max(max_n, len(new))
                    if new == temp:
                        break
                    temp = new
                best = max(best, max_n)
        out.append(best)
    return np.asarray(out)


def _pair(rng, n, noise=1.5, hinge=True):
    """A random CA-like chain and a model of it: noise, and a rigid turn of its second half."""
    y = np.cumsum(rng.normal(size=(n, 3)) * 2.2, axis=0)
    x = y + rng.normal(size=(n, 3)) * noise
    if hinge:
        a = rng.uniform(0.3, 0.8)
        r = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1.0]])
        h = n // 2
        x[h:] = (x[h:] - x[h]) @ r.T + x[h]
    return x, y


def _paths():
    paths = [gw.gdt_windows_numpy]
    if _fast.enabled():
        paths.append(gw.gdt_windows_fast)
    return paths


@pytest.mark.parametrize("n", [3, 5, 8, 13, 30, 55])
def test_twin_and_fast_match_the_direct_algorithm(n):
    rng = np.random.default_rng(n)
    x, y = _pair(rng, n)
    expect = _reference_counts(x, y)
    assert expect[-1] > expect[0] or n <= 5  # the cases are not trivial
    for f in _paths():
        got = f(x[None], y[None], [n])
        assert got.tolist() == [expect.tolist()], f.__name__


def test_batched_models_of_different_lengths_and_a_shared_reference():
    rng = np.random.default_rng(7)
    y = np.cumsum(rng.normal(size=(40, 3)) * 2.2, axis=0)
    xs = np.stack([y + rng.normal(size=y.shape) * s for s in (0.3, 1.0, 2.5)])
    n_ali = np.array([40, 25, 9])
    expect = np.stack([_reference_counts(xs[m, :k], y[:k]) for m, k in enumerate(n_ali)])
    for f in _paths():
        assert np.array_equal(f(xs, y[None], n_ali), expect), f.__name__


def test_window_seeds():
    # fewer pairs than the smallest window: the whole set is the only window
    assert gw.window_seeds(5).tolist() == [[0, 5]]
    assert gw.window_seeds(2).shape == (0, 2)  # nothing to superpose
    # n equal to a window size: that size once
    assert sorted(set(gw.window_seeds(9)[:, 1].tolist())) == [7, 9]
    assert len(gw.window_seeds(9)) == 3 + 1
    # more than MAX_WINDOWS starts: 1000, first and last included, increasing
    s = gw.window_seeds(1500)
    for w in (7, 48):
        starts = s[s[:, 1] == w, 0]
        assert len(starts) == gw.MAX_WINDOWS
        assert starts[0] == 0 and starts[-1] == 1500 - w
        assert np.all(np.diff(starts) > 0)
    assert s[s[:, 1] == 1500].tolist() == [[0, 1500]]


def test_edge_cases():
    rng = np.random.default_rng(3)
    x, y = _pair(rng, 12, hinge=False)
    for f in _paths():
        # fewer than 3 pairs: no superposition, nothing counted
        assert f(x[None, :2], y[None, :2], [2]).tolist() == [[0] * 5]
        # a structure against itself: every pair within every cutoff
        assert f(y[None], y[None], [12]).tolist() == [[12] * 5]
        # identical except one pair moved far: the windows of 7 that leave it out find the other 11
        z = y.copy()
        z[2] += 30.0
        assert f(z[None], y[None], [12]).tolist() == [[11] * 5]


def test_front_end_fractions_of_the_reference_length(datasets):
    ts, ha = gw.gdt_windows(datasets / "adk_closed.pdb", datasets / "adk_open.pdb", device="cpu")
    assert 0.0 < ha < ts < 1.0
    same = gw.gdt_windows(datasets / "adk_open.pdb", datasets / "adk_open.pdb", device="cpu")
    assert same == pytest.approx((1.0, 1.0))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(3, 40), shift=st.floats(-500, 500))
def test_rigid_motion_invariance(seed, n, shift):
    rng = np.random.default_rng(seed)
    x, y = _pair(rng, n)
    q = rng.normal(size=4)
    q /= np.linalg.norm(q)
    w, a, b, c = q
    r = np.array([[1 - 2 * (b * b + c * c), 2 * (a * b - c * w), 2 * (a * c + b * w)],
                  [2 * (a * b + c * w), 1 - 2 * (a * a + c * c), 2 * (b * c - a * w)],
                  [2 * (a * c - b * w), 2 * (b * c + a * w), 1 - 2 * (a * a + b * b)]])
    f = _paths()[-1]
    base = f(x[None], y[None], [n])
    assert np.array_equal(f((x @ r.T + shift)[None], y[None], [n]), base)
    assert np.array_equal(f(x[None], (y @ r.T - shift)[None], [n]), base)
