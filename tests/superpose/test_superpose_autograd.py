"""Gradients of pg.rmsd and pg.superpose for torch tensors (protgpu/superpose/differentiable.py): float64
gradcheck on the CPU, the degenerate inputs (identical, planar, collinear, 1-2 atoms), rotation
equivariance (hypothesis), float32 against finite differences, and the forward's numbers unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import protgpu as pg

torch = pytest.importorskip("torch")
gradcheck = torch.autograd.gradcheck


def _t(a, grad=True):
    return torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=grad)


def _cloud(seed, n=8, frames=2):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(frames, n, 3)) * 3.0, rng.normal(size=(n, 3)) * 3.0


def _all(res):
    return tuple(res)


def _rotation(rng):
    q = rng.normal(size=4)
    q /= np.linalg.norm(q)
    a, b, c, d = q
    return np.array([[a * a + b * b - c * c - d * d, 2 * (b * c - a * d), 2 * (b * d + a * c)],
                     [2 * (b * c + a * d), a * a - b * b + c * c - d * d, 2 * (c * d - a * b)],
                     [2 * (b * d - a * c), 2 * (c * d + a * b), a * a - b * b - c * c + d * d]])


def test_rmsd_gradcheck_both_inputs():
    x, y = _cloud(0)
    assert gradcheck(lambda a, b: pg.rmsd(a, b, device="cpu"), (_t(x), _t(y)))


def test_superpose_gradcheck_every_output():
    x, y = _cloud(1)
    assert gradcheck(lambda a, b: _all(pg.superpose(a, b, device="cpu")), (_t(x), _t(y)))


def test_weights_fit_and_atoms_selections():
    x, y = _cloud(2)
    w = np.arange(1.0, 9.0)
    call = lambda a, b: _all(pg.superpose(a, b, weights=w, fit=[0, 1, 2, 4, 5], atoms=[1, 3, 6, 7],  # noqa: E731
                                          device="cpu"))
    assert gradcheck(call, (_t(x), _t(y)))
    assert gradcheck(lambda a, b: pg.rmsd(a, b, weights=w, fit=[0, 2, 4, 6], device="cpu"), (_t(x), _t(y)))
    assert gradcheck(lambda a, b: pg.rmsd(a, b, fit=[0, 2, 4, 6], atoms=[1, 3, 5], device="cpu"), (_t(x), _t(y)))


def test_values_are_those_of_the_path_without_gradients():
    x, y = _cloud(3)
    r = pg.rmsd(_t(x), _t(y), device="cpu")
    assert r.grad_fn is not None
    assert torch.equal(r.detach(), pg.rmsd(_t(x, False), _t(y, False), device="cpu"))
    s = pg.superpose(_t(x), _t(y), device="cpu")
    s0 = pg.superpose(_t(x, False), _t(y, False), device="cpu")
    for a, b in zip(s, s0, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=1e-12)


def test_reference_structure_with_a_grad_mobile(datasets):
    """A selection string on the reference Structure applies to a bare mobile tensor; atoms outside
    the fit get no gradient from the RMSD."""
    ca = pg.load(datasets / "adk_open.pdb").select("ca")
    rng = np.random.default_rng(4)
    x = _t(ca.coords[0].astype(np.float64) + rng.normal(scale=0.5, size=(ca.n_atoms, 3)))
    r = pg.rmsd(x, ca, fit="resid 1-12", device="cpu")
    r.sum().backward()
    assert torch.count_nonzero(x.grad[12:]) == 0 and torch.count_nonzero(x.grad[:12]) > 0
    sub = _t(x.detach())
    assert gradcheck(lambda a: pg.rmsd(a, ca, fit="resid 1-12", device="cpu"), (sub,), nondet_tol=0.0,
                     fast_mode=True)


# ---- degenerate inputs ----------------------------------------------------------------------------


def test_identical_inputs_give_zero_rmsd_gradient_and_finite_superpose_gradients():
    _, y = _cloud(5)
    x = _t(y[None])
    yt = _t(y)
    r = pg.rmsd(x, yt, device="cpu")
    r.sum().backward()
    assert float(r.detach()) < 1e-12 and torch.count_nonzero(x.grad) == 0  # the cone's minimal subgradient
    assert gradcheck(lambda a, b: _all(pg.superpose(a, b, device="cpu")), (_t(y[None]), _t(y)))


def test_planar_inputs_are_differentiable():
    x, y = _cloud(6)
    x[..., 2] = 0.0
    y[..., 2] = 0.0
    assert gradcheck(lambda a, b: _all(pg.superpose(a, b, device="cpu")), (_t(x), _t(y)))


def test_collinear_inputs_give_finite_gradients():
    _, y = _cloud(7)
    line = np.arange(8.0)[:, None] * np.array([1.0, 2.0, 0.5]) + 0.1
    for x, ref in ((line[None], y), (line[None] + 0.3, line)):  # collinear mobile; both collinear
        xt, yt = _t(x), _t(ref)
        res = pg.superpose(xt, yt, device="cpu")
        (res.coords.sum() + res.rotation.sum() + res.translation.sum() + res.rmsd.sum()).backward()
        assert torch.isfinite(xt.grad).all() and torch.isfinite(yt.grad).all()


@pytest.mark.parametrize("n", [1, 2])
def test_one_or_two_atoms(n):
    x, y = _cloud(8)
    assert gradcheck(lambda a, b: pg.rmsd(a, b, device="cpu"), (_t(x[:, :n] + 1.0), _t(y[:n])))


def test_rotation_derivative_against_kabsch_by_svd():
    """The rotation's derivative against torch autograd through an SVD Kabsch (a different route)."""
    x, y = _cloud(9, frames=1)
    xt, yt = _t(x), _t(y)
    g = torch.randn(1, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    (pg.superpose(xt, yt, device="cpu").rotation * g).sum().backward()
    xs, ys = _t(x), _t(y)
    xc, yc = xs - xs.mean(-2, keepdim=True), ys - ys.mean(-2, keepdim=True)
    u, _, vt = torch.linalg.svd(yc.T @ xc[0])
    dsign = torch.sign(torch.linalg.det(u @ vt))
    rot = u @ torch.diag(torch.stack([torch.ones_like(dsign), torch.ones_like(dsign), dsign])) @ vt
    (rot[None] * g).sum().backward()
    torch.testing.assert_close(xt.grad, xs.grad, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(yt.grad, ys.grad, rtol=1e-7, atol=1e-9)


# ---- invariances -------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_gradients_are_rotation_equivariant(seed):
    """Rotating the mobile by Q rotates its RMSD gradient by Q; the reference's gradient is unchanged."""
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(1, 10, 3)) * 4.0, rng.normal(size=(10, 3)) * 4.0
    q = _rotation(rng)
    xt, yt = _t(x), _t(y)
    pg.rmsd(xt, yt, device="cpu").sum().backward()
    xq, yq = _t(x @ q.T + 2.0), _t(y)
    pg.rmsd(xq, yq, device="cpu").sum().backward()
    np.testing.assert_allclose(xq.grad.numpy(), xt.grad.numpy() @ q.T, atol=1e-9)
    np.testing.assert_allclose(yq.grad.numpy(), yt.grad.numpy(), atol=1e-9)


def test_float32_against_finite_differences():
    """float32 tensors: gradients in float32 agree with float64 central differences to 1e-4."""
    x, y = _cloud(10, n=40, frames=3)
    x32 = torch.tensor(x, dtype=torch.float32, requires_grad=True)
    r = pg.rmsd(x32, torch.tensor(y, dtype=torch.float32), device="cpu")
    r.sum().backward()
    assert x32.grad.dtype == torch.float32
    h = 1e-6
    num = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        num[idx] = (pg.rmsd(xp, y, device="cpu").sum() - pg.rmsd(xm, y, device="cpu").sum()) / (2 * h)
    np.testing.assert_allclose(x32.grad.numpy(), num, atol=1e-4)


def test_lists_of_grad_tensors_and_grad_weights_are_refused():
    x, y = _cloud(11)
    with pytest.raises(pg.InputError, match="list of tensors that require grad"):
        pg.rmsd([_t(x[0]), _t(x[1])], y, device="cpu")
    with pytest.raises(pg.ProtgpuError, match="not differentiable with respect to weights"):
        pg.rmsd(x, y, weights=_t(np.ones(8)), device="cpu")


def test_no_grad_mode_takes_the_plain_path():
    x, y = _cloud(12)
    with torch.no_grad():
        r = pg.rmsd(_t(x), _t(y), device="cpu")
    assert r.grad_fn is None
