"""pg.attention as a differentiable torch op on the CPU: gradcheck in float64 through the custom op
``protgpu::attention`` (q, k, v, coords, gamma; mask, cutoff, shared coordinates, scalar gamma), opcheck
of its registrations, torch.compile(fullgraph=True) with the aot_eager backend, a tiny model that
trains, the torch-math backward (the CUDA fallback) against the NumPy twin, and clear errors where a
call cannot give gradients."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg
from protgpu._autograd import NotDifferentiableError
from protgpu.errors import InputError

torch = pytest.importorskip("torch")
from protgpu.attention import autograd as ag  # noqa: E402  (needs torch)
from protgpu.attention.reference import attention_backward_numpy, attention_lse_numpy  # noqa: E402


def inputs(B=2, L=9, H=3, d=4, dtype=torch.float64, seed=0, grad=True):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, L, H, d, dtype=dtype, generator=gen) for _ in range(3))
    x = torch.randn(B, L, 3, dtype=dtype, generator=gen) * 3
    g = torch.rand(H, dtype=dtype, generator=gen) * 0.2 + 0.02
    ts = (q, k, v, x, g)
    return tuple(t.requires_grad_() for t in ts) if grad else ts


@pytest.mark.parametrize("cutoff,masked", [(None, False), (5.0, False), (None, True), (4.0, True)])
def test_gradcheck_float64(cutoff, masked):
    q, k, v, x, g = inputs()
    mask = torch.rand(2, 9, generator=torch.Generator().manual_seed(1)) > 0.25 if masked else None
    fn = lambda q, k, v, x, g: pg.attention(q, k, v, x, gamma=g, cutoff=cutoff, mask=mask)  # noqa: E731
    assert fn(q, k, v, x, g).grad_fn is not None
    assert torch.autograd.gradcheck(fn, (q, k, v, x, g))


def test_gradcheck_shared_coords_scalar_gamma_unbatched():
    q, k, v, x, _ = inputs(B=1)
    g = torch.tensor(0.07, dtype=torch.float64, requires_grad=True)
    xs = x[0].detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda q, x, g: pg.attention(q, k, v, x, gamma=g, cutoff=6.0), (q, xs, g))
    q1, k1, v1 = (t[0].detach().requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v, x: pg.attention(q, k, v, x, gamma=[0.1, 0.0, 0.3]),
                                    (q1, k1, v1, xs))


def test_gradcheck_through_the_registered_op():
    """The op's own autograd registration (what torch.compile traces; eager calls take the Function)."""
    q, k, v, x, g = inputs(L=7)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[0, 5:] = False
    op = torch.ops.protgpu.attention
    assert torch.autograd.gradcheck(lambda q, k, v, x, g: op(q, k, v, x, g, mask, 5.0, 0.4)[0], (q, k, v, x, g))
    out, lse = op(q, k, v, x, g, None, None, 0.4)
    assert out.requires_grad and not lse.requires_grad


def test_rows_without_keys_give_zero_gradients():
    q, k, v, x, g = inputs()
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1] = False
    out = pg.attention(q, k, v, x, gamma=g, mask=mask)
    out.sum().backward()
    assert torch.all(out[1] == 0)
    for t in (q, k, v, x):
        assert torch.isfinite(t.grad).all() and torch.all(t.grad[1] == 0)


def test_opcheck():
    q, k, v, x, g = inputs(grad=True)
    mask = torch.ones(2, 9, dtype=torch.bool)
    torch.library.opcheck(torch.ops.protgpu.attention.default, (q, k, v, x, g, mask, 5.0, 0.5))
    torch.library.opcheck(torch.ops.protgpu.attention.default, (q, k, v, x, g, None, None, 0.5))
    # dense but permuted q (a transposed projection): the fake's strides must still be the real ones
    qt = torch.randn(2, 3, 9, 4, dtype=torch.float64).transpose(1, 2).requires_grad_()
    torch.library.opcheck(torch.ops.protgpu.attention.default, (qt, k, v, x, g, None, None, 0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_same_with_and_without_grad(dtype):
    """The op's forward gives the inference path's numbers (coordinates as float32, the NumPy twin)."""
    q, k, v, x, g = inputs(dtype=dtype, grad=False)
    x = x.float()
    ref = pg.attention(q, k, v, x, gamma=g.double(), cutoff=5.0)
    out = pg.attention(q.requires_grad_(), k, v, x, gamma=g.double(), cutoff=5.0)
    assert out.grad_fn is not None and out.dtype is dtype
    assert torch.equal(out.detach(), ref)
    with torch.no_grad():
        assert pg.attention(q, k, v, x, gamma=g.double(), cutoff=5.0).grad_fn is None


class TinyModel(torch.nn.Module):
    """Projections to q, k, v, distance-biased attention with a learnt gamma (through softplus: gamma
    must stay >= 0), a linear read-out."""

    def __init__(self, c=8, H=2, d=4):
        super().__init__()
        self.H, self.d = H, d
        self.qkv = torch.nn.Linear(c, 3 * H * d)
        self.raw_gamma = torch.nn.Parameter(torch.full((H,), -3.0))
        self.out = torch.nn.Linear(H * d, 1)

    def forward(self, h, x, mask):
        B, L, _ = h.shape
        q, k, v = self.qkv(h).view(B, L, 3, self.H, self.d).unbind(2)
        a = pg.attention(q, k, v, x, gamma=torch.nn.functional.softplus(self.raw_gamma), mask=mask, cutoff=12.0)
        return self.out(a.reshape(B, L, -1)).squeeze(-1)


def toy_data(B=4, L=12, seed=0):
    """Target: per residue, its number of neighbours within 6 Angstrom (needs the coordinates)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.cumsum(torch.randn(B, L, 3, generator=gen) * 2.5, dim=1)
    h = torch.randn(B, L, 8, generator=gen)
    y = (torch.cdist(x, x) < 6.0).float().sum(-1) / 4
    return h, x, y, torch.ones(B, L, dtype=torch.bool)


def test_tiny_model_trains():
    torch.manual_seed(0)
    model = TinyModel()
    h, x, y, mask = toy_data()
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(h, x, mask), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert model.raw_gamma.grad is not None and torch.isfinite(model.raw_gamma.grad).all()
    assert losses[-1] < 0.3 * losses[0], losses[::10]


def test_compile_fullgraph_aot_eager():
    """torch.compile(fullgraph=True) of a module calling pg.attention: no graph break, the values and
    the gradients of eager mode (backend aot_eager: the op's fake implementation traces the graph)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyModel()
    h, x, y, mask = toy_data(B=2, L=7)
    x = x.requires_grad_()
    eager = model(h, x, mask).pow(2).sum()
    eager.backward()
    ref = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    ag._STEPS.clear()  # (the trace must not depend on what eager calls kept)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    loss = compiled(h, x, mask).pow(2).sum()
    loss.backward()
    torch.testing.assert_close(loss, eager)
    for a, b in zip([p.grad for p in model.parameters()] + [x.grad], ref, strict=True):
        torch.testing.assert_close(a, b)
    with torch.no_grad():  # inference under compile also goes through the op
        torch.testing.assert_close(compiled(h, x, mask), model(h, x, mask))


@pytest.mark.parametrize("cutoff,masked", [(None, False), (5.0, True)])
def test_torch_math_backward_matches_twin(cutoff, masked, monkeypatch):
    """The CUDA fallback's torch math (forward, log-sum-exp and backward) equals the NumPy twin, here on the CPU,
    also when the heads run in chunks."""
    q, k, v, x, g = inputs(B=2, L=11, H=4, grad=False)
    mask = torch.rand(2, 11, generator=torch.Generator().manual_seed(2)) > 0.3 if masked else None
    mask_np = None if mask is None else mask.numpy()
    out, lse = attention_lse_numpy(q.numpy(), k.numpy(), v.numpy(), x.numpy(), g.numpy(), cutoff, mask_np, 0.6)
    dout = torch.randn(q.shape, dtype=torch.float64)
    ref = attention_backward_numpy(q.numpy(), k.numpy(), v.numpy(), x.numpy(), g.numpy(), cutoff, mask_np, 0.6,
                                   out, lse, dout.numpy())
    for elems in (1 << 26, 2 * 11 * 11):  # all heads at once; two heads a chunk
        monkeypatch.setattr(ag, "_TORCH_MATH_ELEMS", elems)
        to, tl = ag._torch_forward(q, k, v, x, g, cutoff, mask, 0.6)
        np.testing.assert_allclose(tl.numpy(), lse, rtol=1e-12)
        np.testing.assert_allclose(to.numpy(), out, rtol=1e-11, atol=1e-13)
        assert ag._torch_forward(q, k, None, x, g, cutoff, mask, 0.6)[0] is None
        got = ag._torch_backward(q, k, v, x, g, cutoff, mask, 0.6, torch.from_numpy(out), tl, dout)
        for a, b in zip(got, ref, strict=True):
            np.testing.assert_allclose(a.numpy(), b, rtol=1e-10, atol=1e-12)


def test_inputs_requiring_grad_where_no_gradient_can_come():
    q, k, v, x, g = inputs(grad=False)
    with pytest.raises(NotDifferentiableError, match="return_weights=True gives no gradients"):
        pg.attention(q.requires_grad_(), k, v, x, gamma=g, return_weights=True)
    with torch.no_grad():  # no gradients wanted: the weights come back
        out, w = pg.attention(q, k, v, x, gamma=g, return_weights=True)
        assert w.shape == (2, 3, 9, 9)
    gp = torch.nn.Parameter(g.clone())
    with pytest.raises(NotDifferentiableError, match="NumPy / CuPy q, k, v gives no gradients"):
        pg.attention(q.detach().numpy(), k.numpy(), v.numpy(), x.numpy(), gamma=gp)
    with pytest.raises(NotDifferentiableError, match="NumPy / CuPy"):
        pg.attention(q.detach().numpy(), k.numpy(), v.numpy(), x.requires_grad_(), gamma=0.1)


def test_bad_input_on_the_grad_path_is_one_line():
    q, k, v, x, g = inputs()
    cases = [
        (dict(gamma=torch.tensor([0.1, 0.2], dtype=torch.float64)), "gamma must be a number or have shape"),
        (dict(gamma=[-0.1, 0.1, 0.1]), "gamma must be finite and >= 0"),
        (dict(gamma=g, mask=torch.ones(2, 9)), "mask must be boolean"),
        (dict(gamma=g, mask=torch.ones(3, dtype=torch.bool)), "mask must have shape"),
        (dict(gamma=g, cutoff=-1.0), "cutoff must be a positive distance"),
        (dict(gamma=g, device="gpu"), "gradients are computed where the tensors live"),
    ]
    for kw, msg in cases:
        with pytest.raises(InputError, match=msg):
            pg.attention(q, k, v, x, **kw)
    with pytest.raises(InputError, match="must have shape"):
        pg.attention(q, k, v, x[:, :4], gamma=g)
    with pytest.raises(InputError, match="k is torch.float32"):
        pg.attention(q, k.detach().float(), v, x, gamma=g)


def test_a_signature_is_checked_once_and_its_values_every_call():
    """attention_torch keeps a call's checks per signature (shapes, dtypes, devices, gamma's number,
    cutoff, scale): the second call of a signature reuses them and gives the same numbers and gradients;
    what a signature does not fix is still checked every call (a host gamma tensor's values), and a
    call that fails its checks leaves nothing kept."""
    ag._STEPS.clear()
    q, k, v, x, g = inputs()
    gp = g.detach().clone().requires_grad_()
    first = pg.attention(q, k, v, x, gamma=0.05, cutoff=6.0)
    grads1 = torch.autograd.grad(first.square().sum(), (q, k, v, x))
    assert len(ag._STEPS) == 1
    again = pg.attention(q, k, v, x, gamma=0.05, cutoff=6.0)
    grads2 = torch.autograd.grad(again.square().sum(), (q, k, v, x))
    assert len(ag._STEPS) == 1 and torch.equal(first, again)
    assert all(torch.equal(a, b) for a, b in zip(grads1, grads2, strict=True))
    pg.attention(q, k, v, x, gamma=0.07, cutoff=6.0)  # another number: another signature
    assert len(ag._STEPS) == 2
    for _ in range(2):  # a failing signature raises every time and is not kept
        with pytest.raises(InputError, match="gamma must be finite and >= 0"):
            pg.attention(q, k, v, x, gamma=-0.5)
    assert len(ag._STEPS) == 2
    pg.attention(q, k, v, x, gamma=gp)  # a host tensor: its values are read, so it has no signature
    gp.data[0] = -1.0
    with pytest.raises(InputError, match="gamma must be finite and >= 0"):
        pg.attention(q, k, v, x, gamma=gp)
    assert len(ag._STEPS) == 2
    # unbatched inputs with shared (L, 3) coordinates and a (L,) mask: through their conversions each call
    mask = torch.ones(9, dtype=torch.bool)
    mask[7:] = False
    q1, k1, v1 = (t[0].detach().requires_grad_() for t in (q, k, v))
    outs = [pg.attention(q1, k1, v1, x[0], gamma=0.05, mask=mask) for _ in range(2)]
    assert torch.equal(outs[0], outs[1]) and outs[0].shape == q1.shape
    ref = pg.attention(q1.detach(), k1.detach(), v1.detach(), x[0].detach(), gamma=0.05, mask=mask)
    torch.testing.assert_close(outs[1].detach(), ref)
