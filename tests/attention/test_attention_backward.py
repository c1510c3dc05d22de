"""The NumPy twin of attention's forward with log-sum-exp and of its backward
(:func:`attention_lse_numpy`, :func:`attention_backward_numpy`: the specification of the kernels)
against torch autograd through a plain torch-math forward, in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

from protgpu.attention.reference import attention_backward_numpy, attention_lse_numpy, attention_numpy

torch = pytest.importorskip("torch")


def torch_attention(q, k, v, x, gamma, cutoff=None, mask=None, scale=None):
    """Dense attention in torch from the definition, (B, L, H, d); (out, lse (B, H, L))."""
    B, L, H, d = q.shape
    scale = 1 / math.sqrt(d) if scale is None else scale
    if x.dim() == 2:
        x = x.expand(B, L, 3)
    diff = x[:, :, None, :] - x[:, None, :, :]
    d2 = (diff * diff).sum(-1)  # (B, L, L); not cdist: its gradient at i == j is NaN
    logits = scale * torch.einsum("bihd,bjhd->bhij", q, k) - gamma[None, :, None, None] * d2[:, None]
    bad = torch.zeros((B, 1, L, L), dtype=torch.bool)
    if cutoff is not None:
        bad = bad | (d2 > cutoff**2)[:, None]
    if mask is not None:
        bad = bad | ~mask.expand(B, L)[:, None, None, :]
    logits = logits.masked_fill(bad, -math.inf)
    lse = torch.logsumexp(logits, dim=-1)
    # A row with no key: weights 0 (exp(-inf - -inf) would be NaN).
    w = torch.exp(logits - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    return torch.einsum("bhij,bjhd->bihd", w, v), lse


def make(rng, B=2, L=13, H=3, d=5, shared=False, spread=4.0):
    q, k, v = (rng.normal(size=(B, L, H, d)) for _ in range(3))
    x = rng.normal(scale=spread, size=(L, 3) if shared else (B, L, 3))
    gamma = rng.uniform(0.01, 0.2, size=H)
    return q, k, v, x, gamma


CASES = [
    dict(),
    dict(cutoff=6.0),
    dict(mask=True),
    dict(cutoff=5.0, mask=True, scale=0.7),
    dict(shared=True, cutoff=7.0),
    dict(empty_rows=True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c) or "plain")
def test_backward_matches_torch_autograd(case):
    rng = np.random.default_rng(len(case) * 7 + 1)
    case = dict(case)
    q, k, v, x, gamma = make(rng, shared=case.pop("shared", False))
    B, L = q.shape[:2]
    mask = None
    if case.pop("mask", False):
        mask = rng.random((B, L)) > 0.3
    if case.pop("empty_rows", False):
        # Every key of entry 1 is padding: its rows have no key (lse = -inf, output 0, gradient 0).
        mask = np.ones((B, L), dtype=bool)
        mask[1] = False
    cutoff, scale = case.get("cutoff"), case.get("scale")

    out, lse = attention_lse_numpy(q, k, v, x, gamma, cutoff, mask, scale)
    tq, tk, tv, tx, tg = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v, x, gamma))
    tmask = None if mask is None else torch.tensor(mask)
    tout, tlse = torch_attention(tq, tk, tv, tx, tg, cutoff, tmask, scale)
    np.testing.assert_allclose(out, tout.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isinf(lse), torch.isinf(tlse).numpy())
    fin = np.isfinite(lse)
    np.testing.assert_allclose(lse[fin], tlse.detach().numpy()[fin], rtol=1e-12)

    dout = rng.normal(size=q.shape)
    tout.backward(torch.tensor(dout))
    grads = attention_backward_numpy(q, k, v, x, gamma, cutoff, mask, scale, out, lse, dout)
    for name, mine, t in zip(("dq", "dk", "dv", "dcoords", "dgamma"), grads, (tq, tk, tv, tx, tg), strict=True):
        assert mine.shape == tuple(t.shape), name
        np.testing.assert_allclose(mine, t.grad.numpy(), rtol=1e-9, atol=1e-11, err_msg=name)
        assert np.isfinite(mine).all(), name


def test_unbatched_and_forward_unchanged():
    """(L, H, d) input gives unbatched gradients; attention_numpy's output is untouched by return_lse."""
    rng = np.random.default_rng(3)
    q, k, v, x, gamma = make(rng, B=1)
    q1, k1, v1, x1 = q[0], k[0], v[0], x[0]
    out, lse = attention_lse_numpy(q1, k1, v1, x1, gamma, 6.0)
    assert out.shape == q1.shape and lse.shape == (q1.shape[1], q1.shape[0])
    x32 = x1.astype(np.float32)
    ref = attention_numpy(q1, k1, v1, x32, gamma=gamma, cutoff=6.0)
    out2, lse2 = attention_numpy(q1, k1, v1, x32, gamma=gamma, cutoff=6.0, return_lse=True)
    np.testing.assert_array_equal(ref, out2)
    o3, l3 = attention_lse_numpy(q1, k1, v1, x32.astype(np.float64), gamma, 6.0)
    np.testing.assert_array_equal(o3, out2)
    np.testing.assert_array_equal(l3, lse2)
    grads = attention_backward_numpy(q1, k1, v1, x1, gamma, 6.0, None, None, out, lse, np.ones_like(q1))
    assert [g.shape for g in grads] == [q1.shape] * 3 + [x1.shape, gamma.shape]
    full = attention_backward_numpy(q, k, v, x, gamma, 6.0, None, None, out[None], lse[None], np.ones_like(q))
    for a, b in zip(grads, full, strict=True):
        np.testing.assert_allclose(a, b[0] if b.ndim > 1 else b, rtol=1e-12)


def test_gradient_is_translation_invariant():
    """The bias depends on differences only: the coordinate gradient sums to zero per batch entry."""
    rng = np.random.default_rng(5)
    q, k, v, x, gamma = make(rng, L=17)
    out, lse = attention_lse_numpy(q, k, v, x, gamma)
    dx = attention_backward_numpy(q, k, v, x, gamma, None, None, None, out, lse, rng.normal(size=q.shape))[3]
    np.testing.assert_allclose(dx.sum(axis=1), 0.0, atol=1e-10)


def test_row_blocks_agree(monkeypatch):
    """Long sequences run in query-row blocks: the blocked result equals the one-block result."""
    from protgpu.attention import reference

    rng = np.random.default_rng(9)
    q, k, v, x, gamma = make(rng, B=1, L=40)
    out, lse = attention_lse_numpy(q, k, v, x, gamma, 5.0)
    dout = rng.normal(size=q.shape)
    whole = attention_backward_numpy(q, k, v, x, gamma, 5.0, None, None, out, lse, dout)
    monkeypatch.setattr(reference, "_row_blocks", lambda L: ((i, min(L, i + 7)) for i in range(0, L, 7)))
    out2, lse2 = attention_lse_numpy(q, k, v, x, gamma, 5.0)
    np.testing.assert_allclose(out2, out, rtol=1e-13)
    blocked = attention_backward_numpy(q, k, v, x, gamma, 5.0, None, None, out, lse, dout)
    for a, b in zip(whole, blocked, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)
