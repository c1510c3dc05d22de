"""CPU tests of protgpu.superpose.qcp, the NumPy QCP: degenerate inputs and the Jacobi fallback,
invariances and the rotation's meaning with hypothesis, and scoring's use of the same QCP."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from superpose_helpers import (
    kabsch,
    random_rotation,
)

from protgpu.superpose import (
    pairwise_rmsd,
    qcp,
    rmsd,
    superpose,
)

# --------------------------------------------------------------------------------------------------
# Degenerate inputs


def _check_proper(rot):
    assert np.isfinite(rot).all()
    np.testing.assert_allclose(np.linalg.det(rot), 1.0, atol=1e-9)
    np.testing.assert_allclose(rot @ rot.transpose(0, 2, 1), np.broadcast_to(np.eye(3), rot.shape), atol=1e-9)


@pytest.mark.parametrize("case", ["identical", "collinear", "collinear-moved", "collinear-different", "planar",
                                  "two-atoms", "one-atom", "mirror-tetrahedron", "mirror-random", "all-same-point"])
def test_degenerate_inputs(case):
    rng = np.random.default_rng(6)
    rot = random_rotation(rng)
    line = np.outer(np.arange(8.0), [1, 2, 3]) + 5
    tet = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1.0]])
    pts = rng.normal(size=(12, 3))
    planar = pts * [1, 1, 0]
    x, y = {
        "identical": (pts, pts),
        "collinear": (line, line),
        "collinear-moved": (line @ rot.T + 3, line),
        "collinear-different": (line, np.outer(np.arange(8.0) ** 1.2, [3, 1, 0])),
        "planar": (planar @ rot.T - 2, planar),
        "two-atoms": (pts[:2], pts[2:4]),
        "one-atom": (pts[:1], pts[1:2]),
        "mirror-tetrahedron": (tet, tet * [1, 1, -1]),
        "mirror-random": (pts, pts * [1, 1, -1]),
        "all-same-point": (np.ones((4, 3)), np.full((4, 3), 2.0)),
    }[case]
    r = rmsd(x, y, device="cpu")
    expected = kabsch(x, y)[0]
    assert np.isfinite(r).all()
    assert r[0] == pytest.approx(expected, abs=1e-7)
    assert pairwise_rmsd(np.stack([x, y]), device="cpu")[0, 1] == pytest.approx(expected, abs=1e-6)
    if len(x) >= 3:
        res = superpose(x, y, device="cpu")
        _check_proper(res.rotation)
        direct = np.sqrt(((res.coords[0] - y) ** 2).sum(1).mean())
        assert direct == pytest.approx(expected, abs=1e-7)
        assert res.rmsd[0] == pytest.approx(direct, abs=1e-7)


def test_jacobi_fallback_matches_eigh():
    rng = np.random.default_rng(7)
    a = rng.normal(size=(50, 4, 4))
    a = a + a.transpose(0, 2, 1)
    a[:10] = np.diag([1.0, 3.0, 3.0, -7.0])  # repeated top eigenvalue
    k = [a[:, i, j] for i, j in ((0, 0), (0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (3, 3))]
    q = qcp.jacobi_top_eigenvector(k)
    ev = np.linalg.eigvalsh(a)[:, -1]
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(np.einsum("pi,pij,pj->p", q, a, q), ev, atol=1e-10)


# --------------------------------------------------------------------------------------------------
# Hypothesis: invariances and the rotation's meaning

coord = st.floats(min_value=-50, max_value=50, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def structures(draw, min_atoms=3, max_atoms=12):
    n = draw(st.integers(min_atoms, max_atoms))
    pts = np.array(draw(st.lists(st.tuples(coord, coord, coord), min_size=n, max_size=n)), dtype=np.float64)
    return pts


@st.composite
def rigid_motions(draw):
    q = np.array(draw(st.tuples(*[st.floats(-1, 1, allow_nan=False)] * 4)))
    assume(np.linalg.norm(q) > 0.1)
    t = np.array(draw(st.tuples(coord, coord, coord)))
    return qcp.quaternion_to_rotation((q / np.linalg.norm(q))[None])[0], t


def _scale(x):
    return max(1.0, float(np.abs(x - x.mean(0)).max()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(structures(), st.data(), rigid_motions(), rigid_motions())
def test_rmsd_invariant_under_rigid_motion(x, data, m1, m2):
    noise = np.array(data.draw(st.lists(st.tuples(*[st.floats(-2, 2, allow_nan=False)] * 3),
                                        min_size=len(x), max_size=len(x))))
    y = x + noise
    (r1, t1), (r2, t2) = m1, m2
    base = rmsd(x, y, device="cpu")[0]
    moved = rmsd(x @ r1.T + t1, y @ r2.T + t2, device="cpu")[0]
    assert np.isfinite(base)
    tol = 1e-7 * _scale(x) + 1e-9 * max(1.0, np.abs(t1).max(), np.abs(t2).max()) * _scale(x)
    assert abs(moved - base) <= max(tol, 2e-6)
    assert abs(base - kabsch(x, y)[0]) <= max(tol, 2e-6)


@settings(max_examples=60, deadline=None)
@given(structures(), rigid_motions())
def test_rotation_maps_mobile_onto_reference(y, motion):
    r, t = motion
    x = y @ r.T + t  # mobile is a moved copy: superposition must undo the motion
    res = superpose(x, y, device="cpu")
    _check_proper(res.rotation)
    scale = _scale(y)
    assert res.rmsd[0] <= 1e-6 * scale + 1e-9
    np.testing.assert_allclose(res.coords[0], y, atol=1e-6 * scale + 1e-6 * np.abs(t).max())


@settings(max_examples=40, deadline=None)
@given(structures(min_atoms=1, max_atoms=6), st.sampled_from(["self", "mirror", "collinear", "planar"]))
def test_degenerate_never_nan(x, kind):
    if kind == "mirror":
        y = x * [1, 1, -1]
    elif kind == "collinear":
        x = np.outer(x[:, 0], [1, -2, 0.5])
        y = np.outer(np.sort(x[:, 0]), [0, 1, 0])
    elif kind == "planar":
        x = x * [1, 1, 0]
        y = x[::-1] * [1, 0, 1]
    else:
        y = x
    r = rmsd(x, y, device="cpu")
    assert np.isfinite(r).all()
    assert r[0] == pytest.approx(kabsch(x, y)[0], abs=1e-6 * _scale(np.vstack([x, y])))
    if len(x) >= 3:
        _check_proper(superpose(x, y, device="cpu").rotation)


def test_scoring_kabsch_uses_this_qcp():
    """protgpu.scoring._kabsch (the TM-score search's fits from sums, the RMSD column) is this module's
    QCP twin with per-model weights and references: equal to rmsd()/superpose() model by model and to
    a float64 Kabsch; an empty subset gives the identity (and RMSD NaN, as the aligned_rmsd kernel)."""
    from protgpu.scoring import _kabsch

    rng = np.random.default_rng(22)
    x = rng.normal(size=(6, 30, 3)) * 7 + 40
    y = np.stack([a @ random_rotation(rng).T + rng.normal(size=(30, 3)) * s for a, s in
                  zip(x, [0, 0.3, 1, 2, 3, 4], strict=True)])
    w = (rng.random((6, 30)) < 0.6).astype(float)
    w[0] = 1.0  # a model identical to its reference up to a rotation: re-measured on the coordinates
    w[5] = 0.0
    rot, t, r = _kabsch.superpose(x, y, w)
    for s in range(5):
        m = w[s] > 0
        ref_r, ref_rot, ref_t = kabsch(x[s][m], y[s][m])
        assert r[s] == pytest.approx(ref_r, abs=1e-9)
        assert r[s] == pytest.approx(float(rmsd(x[s][m], y[s][m], device="cpu")[0]), abs=1e-12)
        np.testing.assert_allclose(rot[s], ref_rot, atol=1e-9)
        np.testing.assert_allclose(t[s], ref_t, atol=1e-7)
    assert r[0] < 1e-12 and np.isnan(r[5]) and (rot[5] == np.eye(3)).all()
    n = w.sum(1)
    rs, ts = _kabsch.superpose_from_sums(n, np.einsum("sn,sni->si", w, x), np.einsum("sn,sni->si", w, y),
                                         np.einsum("sn,sni,snj->sij", w, x, y))
    np.testing.assert_allclose(rs, rot, atol=1e-9)
    np.testing.assert_allclose(ts, t, atol=1e-6)
    _check_proper(rs)
    with pytest.raises(TypeError, match="NumPy only"):
        _kabsch.superpose(x, y, xp=object())
