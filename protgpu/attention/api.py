"""The public function :func:`attention` (``pg.attention``): the fast path when the call is of its kind
(:mod:`protgpu.attention.fast`), else validation (:mod:`protgpu.attention.inputs`), the choice of path
(:mod:`protgpu.attention.flash`) and the work on the GPU (:mod:`protgpu.attention.cuda`) or in the NumPy
twin (:mod:`protgpu.attention.reference`)."""

from __future__ import annotations

import sys

import numpy as np

from .._array import dispatch
from .._memory import check_host_fits
from .cuda import _attention_cuda
from .fast import fast_attention
from .flash import choose_method
from .inputs import _coords_input, _from_compute, _prepare, _to_compute, _wrap_bf16
from .reference import attention_numpy

__all__ = ["attention"]

_OP = None  # protgpu.attention.autograd once torch is in use (importing it imports torch)


def _load_op():
    global _OP
    from . import autograd

    _OP = autograd
    return autograd


def attention(q, k, v, coords, *, gamma, cutoff=None, mask=None, scale=None, return_weights=False,
              method="auto", device="auto"):
    """Multi-head attention over residues with a distance bias from their coordinates.

    The logit of residue ``i`` attending to ``j`` in head ``h`` is
    ``scale * q[i, h] . k[j, h] - gamma[h] * |x_i - x_j|^2``, minus infinity where ``mask[j]`` is False
    or ``|x_i - x_j| > cutoff``; the softmax runs over ``j``. A row whose keys are all excluded gives
    zeros (never NaN).

    Parameters
    ----------
    q, k, v : array, shape (B, L, H, d) or (L, H, d)
        Queries, keys, values: NumPy, CuPy or torch (CUDA tensors cross through DLPack without a copy);
        float16, bfloat16 (torch, or an ``ml_dtypes`` / CuPy ``bfloat16`` array), float32 or float64,
        all three the same. 16-bit inputs accumulate in float32.
    coords : array, shape (B, L, 3) or (L, 3), or Structure
        Residue coordinates in Angstrom (used as float32); (L, 3) is shared by every batch entry. A
        Structure gives its CA atoms (one frame per batch entry).
    gamma : float or array, shape (H,)
        Distance penalty per head, per Angstrom^2, >= 0. ``gamma = 0`` without a cutoff is plain
        attention. A torch tensor or ``nn.Parameter`` on the device is read on the device only (its
        sign is then not checked); a learnt gamma is best kept >= 0 through a softplus.
    cutoff : float, optional
        Keys farther than ``cutoff`` Angstrom get weight 0.
    mask : array of bool, shape (B, L) or (L,), optional
        False marks padding keys (weight 0).
    scale : float, optional
        Multiplies ``q . k``; default ``1 / sqrt(d)``.
    return_weights : bool
        Also return the weights (B, H, L, L); runs the materialised path. float32 for 16-bit inputs,
        else the input dtype.
    method : {"auto", "materialized", "fused"}
        GPU path. ``"fused"``: flash-style, O(B L H d) memory, tensor cores for 16-bit inputs with
        ``d % 16 == 0`` (up to 128). ``"materialized"``: cuBLAS products and a fused bias/softmax kernel,
        L x L per (batch, head) in memory. ``"auto"`` picks by dtype and size (see
        :func:`protgpu.attention.flash.choose_method`). Ignored on the CPU.
    device : {"auto", "cpu", "gpu"}
        Where to compute; ``"auto"`` follows the data (and uses a GPU for NumPy input when present).

    Notes
    -----
    float16/bfloat16 q, k, v as torch CUDA tensors or CuPy arrays, with ``coords`` (and ``mask``) as
    arrays of the same library on the same device and ``gamma`` on the host or on that device, run
    without any host synchronisation and with one kernel launch on the caller's current stream (torch's
    for tensors). Coordinates on the device are not checked for NaN (the check would synchronise).

    **Gradients.** With torch tensors, the result is differentiable with respect to ``q``, ``k``, ``v``,
    ``coords`` and ``gamma`` (not ``mask``, ``cutoff`` or ``scale``: the mask and the cutoff are steps)
    whenever one of them requires grad and grad mode is on; the call then runs as the custom op
    ``protgpu::attention`` (registered with ``torch.library``, with a fake implementation, so it also
    runs under ``torch.compile(fullgraph=True)`` and in CUDA graphs). CUDA tensors use the flash-style
    backward kernel (memory O(B L H d)) where it takes the call; CPU tensors use the NumPy twin in
    float64 (float64 inputs keep float64 coordinates: ``torch.autograd.gradcheck`` passes). ``method``
    is ignored there. Inputs that require grad on a path without gradients (``return_weights=True``,
    NumPy / CuPy q, k, v) raise rather than return a detached result; under ``torch.no_grad()`` every
    path is open. See ``docs/design/differentiable.md``.

    Returns
    -------
    out : array, shape and dtype of ``q``, array type of the input
    weights : array, shape (B, H, L, L) or (H, L, L)
        Only with ``return_weights=True``.

    Raises
    ------
    InputError
        Shapes that do not agree, a non-boolean mask, negative gamma, NaN coordinates of real residues;
        inputs that require grad with ``return_weights=True`` or with NumPy / CuPy q, k, v.
    MemoryBudgetError
        ``return_weights=True`` with weights larger than host (or device) memory.

    Examples
    --------
    >>> import numpy as np, protgpu as pg
    >>> rng = np.random.default_rng(0)
    >>> q = k = v = rng.normal(size=(5, 2, 8)).astype(np.float32)
    >>> x = np.arange(15, dtype=np.float32).reshape(5, 3)
    >>> out, w = pg.attention(q, k, v, x, gamma=[0.0, 0.1], return_weights=True, device="cpu")
    >>> out.shape, w.shape, bool(np.allclose(w.sum(-1), 1))
    ((5, 2, 8), (2, 5, 5), True)
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        T = torch.Tensor
        if isinstance(q, T) or isinstance(gamma, T) or isinstance(coords, T) or isinstance(k, T) or isinstance(v, T):
            op = _OP or _load_op()
            if op.needs_op(q, k, v, coords, gamma, return_weights):
                return op.attention_torch(q, k, v, coords, gamma, cutoff, mask, scale, device)
    out = fast_attention(q, k, v, coords, gamma, cutoff, mask, scale, return_weights, method, device)
    if out is not None:
        return out
    return _attention_general(q, k, v, coords, gamma, cutoff, mask, scale, return_weights, method, device)


def _attention_general(q, k, v, coords, gamma, cutoff, mask, scale, return_weights, method, device):
    """The general path of :func:`attention` (validation, choice of path, GPU or NumPy twin)."""
    coords_in, _ = _coords_input(coords)
    be = dispatch(q, k, v, coords_in, mask, device=device)
    p = _prepare(q, k, v, coords, gamma, cutoff, mask, scale, be)
    prec = p.q.precision
    B, L, H, d = p.q.array.shape
    chosen = choose_method(method, prec, d, L, return_weights)
    host_out = be.kind in ("numpy", "torch-cpu")
    if return_weights and (host_out or not be.on_gpu):
        # Host copies: float32 or float64 weights; the CPU path also holds its float64 weights first.
        per = (8 if prec == "float64" else 4) + (0 if be.on_gpu or prec == "float64" else 8)
        check_host_fits(B * H * L * L * per, f"the attention weights ({B}, {H}, {L}, {L})")

    if be.on_gpu:
        out, w = _attention_cuda(p, chosen, return_weights, weights_host=host_out)
    else:
        q64, k64, v64 = (_to_compute(o.array, prec, np, np.float64) for o in (p.q, p.k, p.v))
        res = attention_numpy(q64, k64, v64, p.coords, gamma=p.gamma, cutoff=p.cutoff, mask=p.mask, scale=p.scale,
                              return_weights=return_weights, dtype=np.float64)
        out, w = res if return_weights else (res, None)
        out = _from_compute(out, prec, np)
        if w is not None and prec != "float64":
            w = w.astype(np.float32)

    if p.squeeze:
        out = out[0]
        w = w[0] if w is not None else None
    out = _wrap_bf16(out, be, p.q.dtype) if prec == "bfloat16" else be.wrap(out)
    if return_weights:
        return out, be.wrap(w)
    return out
