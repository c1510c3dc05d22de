"""Gradients of pg.distances for torch tensors: float64 gradcheck (matrices, cross matrices, pairs,
orthorhombic and triclinic boxes), coincident atoms, and the forward's numbers unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg

torch = pytest.importorskip("torch")
gradcheck = torch.autograd.gradcheck
TRICLINIC = np.array([[6.0, 0, 0], [1.0, 7, 0], [1.5, 2.0, 8]])


def _t(a, grad=True):
    return torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=grad)


@pytest.fixture
def xy():
    rng = np.random.default_rng(1)
    return _t(rng.normal(size=(2, 6, 3)) * 4), _t(rng.normal(size=(5, 3)) * 4)


@pytest.mark.parametrize("box", [None, [5.0, 6.0, 7.0], TRICLINIC], ids=["none", "ortho", "triclinic"])
def test_gradcheck(xy, box):
    x, y = xy
    assert gradcheck(lambda a: pg.distances(a, box=box, device="cpu"), (x,))
    assert gradcheck(lambda a, b: pg.distances(a, b, box=box, device="cpu"), (x, y))
    assert gradcheck(lambda a: pg.distances(a, pairs=[[0, 1], [2, 5], [4, 3]], box=box, device="cpu"), (x,))
    assert gradcheck(lambda a: pg.distances(a[0], box=box, device="cpu"), (x,))  # 2-D input


def test_coincident_atoms_give_zero_not_nan(xy):
    x, _ = xy
    xs = _t(np.repeat(x.detach().numpy()[:, :1], 3, axis=1))
    pg.distances(xs, device="cpu").sum().backward()
    assert torch.count_nonzero(xs.grad) == 0
    xp = _t(x.detach())
    pg.distances(xp, pairs=[[1, 1]], device="cpu").sum().backward()
    assert torch.isfinite(xp.grad).all()


def test_values_unchanged_and_float32(xy):
    x, y = xy
    d = pg.distances(x, y, device="cpu")
    assert d.grad_fn is not None and torch.equal(d.detach(), pg.distances(x.detach(), y.detach(), device="cpu"))
    x32 = x.detach().float().requires_grad_()
    d32 = pg.distances(x32, device="cpu")
    assert d32.dtype == torch.float32
    d32.sum().backward()
    x64 = x.detach().clone().requires_grad_()
    pg.distances(x64, device="cpu").sum().backward()
    torch.testing.assert_close(x32.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)


def test_numpy_y_with_a_grad_x_and_the_refusals(xy):
    x, y = xy
    assert gradcheck(lambda a: pg.distances(a, y.detach().numpy(), device="cpu"), (x,))
    with pytest.raises(pg.ProtgpuError, match="not differentiable with respect to box"):
        pg.distances(x, box=_t([5.0, 6.0, 7.0]), device="cpu")
    with pytest.raises(pg.InputError, match="out="):
        pg.distances(x, out=np.empty((2, 6, 6)), device="cpu")
