"""``pg.attention`` as a differentiable torch operator: the custom op ``protgpu::attention`` (forward with
log-sum-exp) and ``protgpu::attention_backward``, registered with ``torch.library`` together with the
autograd formula that links them and fake (meta) implementations, so that the call trains, runs under
``torch.compile(fullgraph=True)`` and inside CUDA graphs. Eager calls run the same implementations
through a ``torch.autograd.Function``, whose host cost is a fifth of the
op's dispatch; a trace by torch.compile takes the op.

Where the work runs: CPU tensors use the NumPy twin (:mod:`protgpu.attention.reference`, float64 inside);
CUDA tensors use the flash kernels of :mod:`protgpu.attention.flash_backward` when its ``supports`` takes
the call, else the existing GPU forward plus log-sum-exp and a backward in torch math
(:func:`_torch_forward`, :func:`_torch_backward`: L x L per (batch entry, head chunk) in memory).

:func:`needs_op` decides, in a few attribute reads, whether a call must take the op (an input requires
grad, or torch.compile is tracing); every other call keeps the inference paths and their host cost.
The formulas are in ``docs/design/differentiable.md``.

Internal API (tests): :func:`attention_torch`, :func:`needs_op`, :func:`_torch_forward`,
:func:`_torch_backward`.
"""

from __future__ import annotations

import math

import numpy as np

try:
    import torch
except ImportError:  # torch is optional: without it the module is only imported by the docs
    torch = None

from .._autograd import NotDifferentiableError
from ..errors import InputError
from .inputs import _check_cutoff_scale, _check_gamma, _coords_input
from .reference import attention_backward_numpy, attention_lse_numpy

try:  # the flash backward kernels (branch w3-bwdkernel); the torch-math path stands in without them
    from . import flash_backward as _flash_bwd
except ImportError:  # pragma: no cover - depends on the merge
    _flash_bwd = None

__all__: list[str] = []  # internal API (see the module notes)

# Logits held at once by the torch-math path (per chunk of heads): 2^26 float32 = 256 MiB.
_TORCH_MATH_ELEMS = 1 << 26


def _grad_error(why: str) -> NotDifferentiableError:
    return NotDifferentiableError(f"pg.attention: an input requires grad, but {why} gives no gradients; call it under "
                      "torch.no_grad() or on detached tensors (a detached result would stop the gradients "
                      "silently)")


def needs_op(q, k, v, coords, gamma, return_weights: bool) -> bool:
    """Whether a call must run through the differentiable op (any input requires grad with grad mode
    on, or torch.compile is tracing); raises where an input requires grad but the call's path cannot
    give gradients. Cheap: the inference paths call it first."""
    T = torch.Tensor
    if not isinstance(q, T):
        if torch.is_grad_enabled() and any(isinstance(a, T) and a.requires_grad for a in (k, v, coords, gamma)):
            raise _grad_error("a call with NumPy / CuPy q, k, v")
        return False
    if torch.compiler.is_compiling():
        if return_weights:
            raise InputError("pg.attention under torch.compile does not return weights (return_weights=True "
                             "materialises L x L on the host)")
        return True
    if not torch.is_grad_enabled():
        return False
    rg = (q.requires_grad or k.requires_grad or v.requires_grad
          or (isinstance(coords, T) and coords.requires_grad) or (isinstance(gamma, T) and gamma.requires_grad))
    if rg and return_weights:
        raise _grad_error("return_weights=True")
    return rg


def _compute_dtype(q):
    return torch.float64 if q.dtype is torch.float64 else torch.float32


def _flash_supported(q) -> bool:
    return _flash_bwd is not None and q.is_cuda and bool(_flash_bwd.supports(q))


# --------------------------------------------------------------------------------------------------
# the op


def _forward_impl(q, k, v, coords, gamma, mask, cutoff, scale):
    """Forward with log-sum-exp on batched operands: q, k, v (B, L, H, d), coords (B, L, 3), gamma (H,),
    mask (B, L) bool or None. Returns out (B, L, H, d, dtype of q) and lse (B, H, L; float64 for float64
    q, else float32); never an input (a custom op's outputs must not alias its inputs)."""
    if q.is_cuda:
        if _flash_supported(q):
            out, lse = _flash_bwd.flash_forward_lse(q, k, v, coords.contiguous(), gamma, cutoff,
                                                    None if mask is None else mask.contiguous(), scale)
            return out, lse.to(_compute_dtype(q))
        if q.dtype is torch.float64:  # float64 coordinates throughout (the GPU forward reads float32)
            return _torch_forward(q, k, v, coords, gamma, cutoff, mask, scale)
        out = _gpu_forward(q, k, v, coords, gamma, cutoff, mask, scale)
        return out, _torch_forward(q, k, None, coords, gamma, cutoff, mask, scale)[1]
    a = _host(q, k, v, coords, gamma, mask)
    out, lse = attention_lse_numpy(a[0], a[1], a[2], a[3], a[4], cutoff, a[5], scale)
    return _to_torch(out, q), torch.from_numpy(lse).to(_compute_dtype(q))


def _backward_impl(q, k, v, coords, gamma, mask, cutoff, scale, out, lse, dout):
    """Gradients (dq, dk, dv in q's dtype, dcoords in coords', dgamma in gamma's) of :func:`_forward_impl`."""
    if q.is_cuda:
        if _flash_supported(q):
            grads = _flash_bwd.flash_backward(q, k, v, coords.contiguous(), gamma, cutoff,
                                              None if mask is None else mask.contiguous(), scale, out, lse, dout)
        else:
            grads = _torch_backward(q, k, v, coords, gamma, cutoff, mask, scale, out, lse, dout)
    else:
        a = _host(q, k, v, coords, gamma, mask)
        o, ls, do = (t.detach().to(torch.float64).numpy() for t in (out, lse, dout))
        grads = [torch.from_numpy(g) for g in attention_backward_numpy(*a[:5], cutoff, a[5], scale, o, ls, do)]
    dq, dk, dv, dx, dg = grads
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype), dx.to(coords.dtype), dg.to(gamma.dtype)


def _register():
    """Define and register the ops ``protgpu::attention`` and ``protgpu::attention_backward`` (with fake
    implementations and the autograd formula linking them) and the eager autograd Function. Run at
    import when torch is there: without it the module stays importable (for the docs)."""

    @torch.library.custom_op("protgpu::attention", mutates_args=())
    def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, coords: torch.Tensor, gamma: torch.Tensor,
                     mask: torch.Tensor | None, cutoff: float | None, scale: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        return _forward_impl(q, k, v, coords, gamma, mask, cutoff, scale)

    @attention_op.register_fake
    def _attention_fake(q, k, v, coords, gamma, mask, cutoff, scale):
        B, L, H, _ = q.shape  # contiguous, as the real outputs are (empty_like would copy q's strides)
        return q.new_empty(q.shape), q.new_empty((B, H, L), dtype=_compute_dtype(q))

    @torch.library.custom_op("protgpu::attention_backward", mutates_args=())
    def attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, coords: torch.Tensor,
                              gamma: torch.Tensor, mask: torch.Tensor | None, cutoff: float | None, scale: float,
                              out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return _backward_impl(q, k, v, coords, gamma, mask, cutoff, scale, out, lse, dout)

    @attention_backward_op.register_fake
    def _attention_backward_fake(q, k, v, coords, gamma, mask, cutoff, scale, out, lse, dout):
        return (q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape), coords.new_empty(coords.shape),
                gamma.new_empty(gamma.shape))

    def setup_context(ctx, inputs, output):
        q, k, v, coords, gamma, mask, cutoff, scale = inputs
        out, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, coords, gamma, mask, out, lse)
        ctx.cutoff, ctx.scale = cutoff, scale

    def backward(ctx, dout, _dlse):
        q, k, v, coords, gamma, mask, out, lse = ctx.saved_tensors
        grads = attention_backward_op(q, k, v, coords, gamma, mask, ctx.cutoff, ctx.scale, out, lse,
                                      dout.contiguous())
        return (*grads, None, None, None)

    attention_op.register_autograd(backward, setup_context=setup_context)

    class AttentionFunction(torch.autograd.Function):
        """The op's forward and backward for eager calls: ``Function.apply`` costs some 10 us of host
        time, the custom op's dispatch about 5x that (measured on the CPU); torch.compile takes the op
        (its fake implementation traces the graph). ``call``: the flash kernels' prepared launches for
        the call's signature (:class:`protgpu.attention.flash_backward.TorchCall`), or None."""

        @staticmethod
        def forward(ctx, q, k, v, coords, gamma, mask, cutoff, scale, call=None):
            if call is not None:
                out, lse = call.forward(q, k, v, coords, gamma, mask)
            else:
                out, lse = _forward_impl(q, k, v, coords, gamma, mask, cutoff, scale)
            ctx.save_for_backward(q, k, v, coords, gamma, mask, out, lse)
            ctx.cutoff, ctx.scale, ctx.call = cutoff, scale, call
            return out

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, dout):
            q, k, v, coords, gamma, mask, out, lse = ctx.saved_tensors
            if ctx.call is not None:  # (gradients in the inputs' dtypes already)
                grads = ctx.call.backward(q, k, v, coords, gamma, mask, out, lse, dout)
            else:
                grads = _backward_impl(q, k, v, coords, gamma, mask, ctx.cutoff, ctx.scale, out, lse,
                                       dout.contiguous())
            return (*grads, None, None, None, None)

    return attention_op, attention_backward_op, AttentionFunction


if torch is not None:
    attention_op, attention_backward_op, _AttentionFunction = _register()


# --------------------------------------------------------------------------------------------------
# the op's implementations


def _host(q, k, v, coords, gamma, mask):
    """The operands as float64 NumPy arrays (bfloat16 through float32: NumPy has no bfloat16)."""
    arrs = [t.detach().to(torch.float64).numpy() for t in (q, k, v, coords, gamma)]
    return (*arrs, None if mask is None else mask.detach().numpy())


def _to_torch(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A float64 result in ``like``'s dtype, rounded as the inference path rounds (bfloat16 via float32)."""
    t = torch.from_numpy(a)
    if like.dtype is torch.bfloat16:
        t = t.to(torch.float32)
    return t.to(like.dtype)


def _gpu_forward(q, k, v, coords, gamma, cutoff, mask, scale):
    """The inference forward on CUDA tensors (the numbers of a call without gradients)."""
    from .api import _attention_general
    from .fast import fast_attention

    q, k, v, coords, gamma = (t.detach() for t in (q, k, v, coords, gamma))
    out = fast_attention(q, k, v, coords, gamma, cutoff, mask, scale, False, "auto", "auto")
    if out is None:
        out = _attention_general(q, k, v, coords.contiguous(), gamma, cutoff,
                                 None if mask is None else mask.contiguous(), scale, False, "auto", "auto")
    return out


def _torch_chunks(q, k, coords, gamma, cutoff, mask, scale):
    """Per batch entry and chunk of heads: (b, heads slice, logits (h, L, L) with -inf where excluded,
    squared distances (L, L)), in the compute dtype."""
    ct = _compute_dtype(q)
    B, L, H, _ = q.shape
    hc = max(1, min(H, _TORCH_MATH_ELEMS // (L * L)))
    for b in range(B):
        x = coords[b].detach().to(ct)
        diff = x[:, None, :] - x[None, :, :]
        d2 = (diff * diff).sum(-1)
        bad = torch.zeros((L, L), dtype=torch.bool, device=q.device) if mask is None else ~mask[b][None, :]
        if cutoff is not None:
            bad = bad | (d2 > cutoff * cutoff)
        for h0 in range(0, H, hc):
            hs = slice(h0, min(H, h0 + hc))
            s = scale * torch.einsum("ihc,jhc->hij", q[b, :, hs].to(ct), k[b, :, hs].to(ct))
            s = s - gamma[hs].to(ct)[:, None, None] * d2
            yield b, hs, s.masked_fill(bad, -math.inf), d2


def _torch_forward(q, k, v, coords, gamma, cutoff, mask, scale):
    """Output (None when ``v`` is None) and log-sum-exp (B, H, L) in torch math (lse -inf and output 0
    for a row with no key)."""
    B, L, H, d = q.shape
    ct = _compute_dtype(q)
    lse = q.new_empty((B, H, L), dtype=ct)
    out = None if v is None else q.new_empty((B, L, H, d), dtype=ct)
    for b, hs, s, _ in _torch_chunks(q, k, coords, gamma, cutoff, mask, scale):
        ls = torch.logsumexp(s, dim=-1)
        lse[b, hs] = ls
        if out is not None:
            p = torch.exp(s - torch.where(torch.isfinite(ls), ls, 0.0)[..., None])
            out[b, :, hs] = torch.einsum("hij,jhc->ihc", p, v[b, :, hs].to(ct))
    return (None if out is None else out.to(q.dtype)), lse


def _torch_backward(q, k, v, coords, gamma, cutoff, mask, scale, out, lse, dout):
    """The backward of ``reference.attention_backward_numpy`` in torch math, on any device."""
    ct = _compute_dtype(q)
    dq, dk, dv = (torch.zeros(q.shape, dtype=ct, device=q.device) for _ in range(3))
    dx = torch.zeros(coords.shape, dtype=ct, device=q.device)
    dg = torch.zeros(gamma.shape, dtype=ct, device=q.device)
    do_all = dout.to(ct)
    delta = torch.einsum("bihc,bihc->bhi", do_all, out.to(ct))
    for b, hs, s, d2 in _torch_chunks(q, k, coords, gamma, cutoff, mask, scale):
        ls = lse[b, hs].to(ct)
        # A row with no key has lse = -inf and logits -inf: exp(-inf - 0) = 0, not NaN.
        p = torch.exp(s - torch.where(torch.isfinite(ls), ls, 0.0)[..., None])
        do, vb = do_all[b, :, hs], v[b, :, hs].to(ct)
        dv[b, :, hs] += torch.einsum("hij,ihc->jhc", p, do)
        ds = p * (torch.einsum("ihc,jhc->hij", do, vb) - delta[b, hs][..., None])
        dq[b, :, hs] = scale * torch.einsum("hij,jhc->ihc", ds, k[b, :, hs].to(ct))
        dk[b, :, hs] += scale * torch.einsum("hij,ihc->jhc", ds, q[b, :, hs].to(ct))
        dg[hs] -= (ds * d2).sum(dim=(1, 2))
        acc = (gamma[hs].to(ct)[:, None, None] * ds).sum(0)  # sum_h gamma_h dS_h
        x = coords[b].to(ct)
        # d|x_i - x_j|^2 / dx_i = 2 (x_i - x_j): rows get it as queries, columns as keys.
        dx[b] += -2.0 * (acc.sum(1)[:, None] * x - acc @ x + acc.sum(0)[:, None] * x - acc.T @ x)
    return dq, dk, dv, dx, dg


# --------------------------------------------------------------------------------------------------
# the call


_GAMMA_TENSORS: dict = {}


def _gamma_tensor(gamma, H: int, q) -> torch.Tensor:
    """gamma as an (H,) tensor on q's device in the compute dtype; a tensor keeps its autograd history
    (a scalar is expanded, so its gradient is the sum over heads). Host values are checked (finite,
    >= 0) and kept per value; a device tensor is not read (that would synchronise)."""
    ct = _compute_dtype(q)
    if isinstance(gamma, torch.Tensor):
        if gamma.device.type == "cpu" and not torch.compiler.is_compiling():
            _check_gamma(gamma.detach().to(torch.float64).numpy(), H)
        if gamma.dim() == 0:
            gamma = gamma.expand(H)
        elif tuple(gamma.shape) != (H,):
            raise InputError(f"gamma must be a number or have shape ({H},) (one per head), got {tuple(gamma.shape)}")
        return gamma.to(device=q.device, dtype=ct)
    g = _check_gamma(np.asarray(gamma, dtype=np.float64), H)
    key = (g.tobytes(), q.device, ct)
    hit = _GAMMA_TENSORS.get(key)
    if hit is None:
        hit = torch.as_tensor(g, dtype=ct).to(q.device)
        if len(_GAMMA_TENSORS) < 256:
            _GAMMA_TENSORS[key] = hit
    return hit


def _coords_tensor(coords, B: int, L: int, squeeze: bool, q) -> torch.Tensor:
    """Coordinates as (B, L, 3) on q's device (an expanded view of a shared (L, 3) set, so its gradient
    is the sum over the batch): float64 for float64 q (gradients of the unrounded function), float32
    otherwise (the kernels' input)."""
    if not isinstance(coords, torch.Tensor):
        coords = torch.as_tensor(np.asarray(_coords_input(coords)[0], dtype=np.float32))
    if coords.dtype.is_complex or not (coords.dtype.is_floating_point or coords.dtype in (torch.int32, torch.int64)):
        raise InputError(f"coords must be numeric coordinates, got dtype {coords.dtype}")
    x = coords.to(device=q.device, dtype=_compute_dtype(q))
    if x.dim() == 3 and x.shape[0] == 1 and squeeze:
        x = x[0]
    if tuple(x.shape) == (L, 3):
        return x.expand(B, L, 3)
    if tuple(x.shape) == (1, L, 3):
        return x.expand(B, L, 3)
    if tuple(x.shape) != (B, L, 3):
        raise InputError(f"coords must have shape ({L}, 3) or ({B}, {L}, 3) to match q, got {tuple(x.shape)}")
    return x


def _mask_tensor(mask, B: int, L: int, q) -> torch.Tensor | None:
    """The mask as a (B, L) bool tensor on q's device (an expanded view of a shared (L,) mask)."""
    if mask is None:
        return None
    m = torch.as_tensor(mask, device=q.device)
    if m.dtype is not torch.bool:
        raise InputError(f"mask must be boolean (True = a real residue), got dtype {m.dtype}")
    if tuple(m.shape) == (L,):
        return m.expand(B, L)
    if tuple(m.shape) != (B, L):
        raise InputError(f"mask must have shape ({L},) or ({B}, {L}), got {tuple(m.shape)}")
    return m


class _Step:
    """What :func:`attention_torch` settles once per call signature (:func:`_signature`): the checks have
    passed, and which operands go to the op as they come (``*_direct``) or through their conversions
    (which check again), the flash kernels' prepared launches (``call``, CUDA), cutoff and scale."""

    __slots__ = ("B", "H", "L", "call", "coords_direct", "cutoff", "gamma_const", "gamma_direct", "mask_direct",
                 "scale", "squeeze")

    def __call__(self, q, k, v, coords, gamma, mask):
        squeeze = self.squeeze
        if squeeze:
            q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
        x = coords if self.coords_direct else _coords_tensor(coords, self.B, self.L, squeeze, q)
        g = self.gamma_const
        if g is None:
            g = gamma if self.gamma_direct else _gamma_tensor(gamma, self.H, q)
        m = mask if self.mask_direct else _mask_tensor(mask, self.B, self.L, q)
        if torch.compiler.is_compiling():
            out = attention_op(q, k, v, x, g, m, self.cutoff, self.scale)[0]
        else:
            out = _AttentionFunction.apply(q, k, v, x, g, m, self.cutoff, self.scale, self.call)
        return out[0] if squeeze else out


_STEPS: dict = {}
_MAX_STEPS = 256


def _signature(q, k, v, coords, gamma, cutoff, mask, scale, device):
    """The key of a call's :class:`_Step`: everything its checks and conversions depend on (shapes, dtypes
    and devices; gamma's value when it is a number; cutoff, scale, device; the backward's knobs), or
    None for a call checked in full every time (coordinates or a mask that are not tensors, gamma a list
    or a host tensor, whose values are checked)."""
    T = torch.Tensor
    if not (isinstance(k, T) and isinstance(v, T) and isinstance(coords, T)):
        return None
    if isinstance(gamma, T):
        if gamma.device.type == "cpu":
            return None
        gkey = (gamma.shape, gamma.dtype, gamma.device)
    elif isinstance(gamma, (float, int)) and not isinstance(gamma, bool):
        gkey = float(gamma)
    else:
        return None
    if mask is None:
        mkey = None
    elif isinstance(mask, T):
        mkey = (mask.shape, mask.dtype, mask.device)
    else:
        return None
    knobs = _flash_bwd.BWD_OVERRIDES if _flash_bwd is not None else None
    return (q.shape, q.dtype, q.device, k.shape, k.dtype, k.device, v.shape, v.dtype, v.device, coords.shape,
            coords.dtype, coords.device, gkey, mkey, cutoff, scale, device,
            tuple(sorted(knobs.items())) if knobs else ())


def attention_torch(q, k, v, coords, gamma, cutoff, mask, scale, device="auto"):
    """``pg.attention`` on torch tensors through the differentiable op (see :func:`needs_op`).

    Parameters are those of :func:`protgpu.attention`; the result is ``out`` with its autograd history.
    A call's checks run once per signature (:func:`_signature`); later calls of the signature go straight
    to the op.
    """
    if torch.compiler.is_compiling():  # (traced once: nothing kept, no launch plans)
        return _prepare(q, k, v, coords, gamma, cutoff, mask, scale, device)(q, k, v, coords, gamma, mask)
    try:
        key = _signature(q, k, v, coords, gamma, cutoff, mask, scale, device)
        step = _STEPS.get(key) if key is not None else None
    except TypeError:  # (an unhashable cutoff or scale: checked below, every call)
        key = step = None
    if step is None:
        step = _prepare(q, k, v, coords, gamma, cutoff, mask, scale, device)
        if key is not None:
            if len(_STEPS) >= _MAX_STEPS:
                _STEPS.clear()
            _STEPS[key] = step
    return step(q, k, v, coords, gamma, mask)


def _prepare(q, k, v, coords, gamma, cutoff, mask, scale, device) -> _Step:
    """Check a call in full and settle its :class:`_Step`."""
    if device not in ("auto", "gpu" if q.is_cuda else "cpu"):
        raise InputError(f"device={device!r} with {'CUDA' if q.is_cuda else 'CPU'} tensors that require grad: "
                         "gradients are computed where the tensors live; move them, or pass device='auto'")
    for t, n in ((k, "k"), (v, "v")):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(q.shape):
            raise InputError(f"{n} must be a torch tensor with the shape of q {tuple(q.shape)}")
        if t.dtype != q.dtype or t.device != q.device:
            raise InputError(f"{n} is {t.dtype} on {t.device} but q is {q.dtype} on {q.device}; give all three alike")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise InputError(f"q must be float16, bfloat16, float32 or float64, got {q.dtype}")
    if q.dim() not in (3, 4) or q.numel() == 0:
        raise InputError(f"q must have non-empty shape (B, L, H, d) or (L, H, d), got {tuple(q.shape)}")
    squeeze = q.dim() == 3
    qb = q[None] if squeeze else q
    B, L, H, d = qb.shape
    x = _coords_tensor(coords, B, L, squeeze, qb)
    g = _gamma_tensor(gamma, H, qb)
    m = _mask_tensor(mask, B, L, qb)
    step = _Step()
    step.B, step.L, step.H, step.squeeze = B, L, H, squeeze
    step.cutoff, step.scale = _check_cutoff_scale(cutoff, scale, d)
    ct = _compute_dtype(q)
    T = torch.Tensor
    step.coords_direct = (not squeeze and isinstance(coords, T) and tuple(coords.shape) == (B, L, 3)
                          and coords.dtype == ct and coords.device == q.device)
    step.gamma_const = None if isinstance(gamma, T) else g  # (a number: its device tensor, checked)
    step.gamma_direct = (isinstance(gamma, T) and tuple(gamma.shape) == (H,) and gamma.dtype == ct
                         and gamma.device == q.device)
    step.mask_direct = mask is None or (isinstance(mask, T) and mask.dtype is torch.bool
                                        and tuple(mask.shape) == (B, L) and mask.device == q.device)
    step.call = None
    if _flash_supported(qb) and not torch.compiler.is_compiling():
        step.call = _flash_bwd.TorchCall(qb, x, m, step.cutoff, step.scale)
    return step
