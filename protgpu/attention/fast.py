"""The fast path of :func:`protgpu.attention`: float16 / bfloat16 torch CUDA tensors or CuPy arrays
straight into the tensor-core kernel, with one prepared launch (:mod:`protgpu._cuda.plans`) on the
caller's current stream and no host synchronisation.

The general path converts every operand through DLPack and CuPy, broadcasts coordinates and mask,
uploads gamma and type-checks each launch argument: some 0.25 ms of Python per call, longer than the
kernel itself at L = 4096. A call on torch CUDA tensors or CuPy arrays of float16 / bfloat16 with
coordinates (and mask) on the same device takes this path instead: the operands are passed by pointer
as they are (copied only when strided or not 16-byte aligned), shared (L, 3) coordinates and (L,) masks
by a batch stride of 0, the output is allocated by the caller's library on its current stream, and
everything that depends only on the call's shapes and constants (kernel, grid, scalar arguments, gamma
on the device) is kept in a plan. Its host time is measured (``benchmarks/bench_attention.py``): keep
per-call work out of it.

Internal API (tests): :func:`fast_attention`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._array import is_cupy_array, is_torch_tensor, to_numpy
from ..errors import InputError
from . import flash as _flash
from .cuda import _MAX_GRID_YZ, _aligned, _device_gamma
from .flash import flash_block_m, flash_config, flash_entry, fused_kernel
from .inputs import _check_cutoff_scale, _check_gamma

_PLANS: dict = {}
_MAX_PLANS = 256


@dataclass(frozen=True)
class _Plan:
    """What a fast-path launch needs beyond the operands' pointers."""

    kernel: Any  # protgpu._cuda.LaunchPlan: kernel, grid, scalar tail L, H, xstride, mstride, scale, cutoff2
    gamma: Any  # (H,) float32 CuPy array, kept alive here


def _fast_plan(precision: str, shape: tuple, xshape: tuple, mshape, gamma, cutoff, scale) -> _Plan | None:
    """The plan of a fast-path call, or None when the call must take the general path (which also
    reports bad input)."""
    if not all(c is None or isinstance(c, (int, float, np.integer, np.floating)) for c in (cutoff, scale)):
        return None
    try:
        g = np.asarray(to_numpy(gamma), dtype=np.float64)
    except (TypeError, ValueError):
        return None
    key = (precision, shape, xshape, mshape, g.shape, g.tobytes(), cutoff, scale,
           tuple(sorted(_flash.FLASH_OVERRIDES.items())))
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    plan = _PLANS.get((dev, key))
    if plan is not None:
        return plan
    B, L, H, d = (1, *shape) if len(shape) == 3 else shape
    if min(B, L, H, d) < 1 or B > _MAX_GRID_YZ or H > _MAX_GRID_YZ or fused_kernel(precision, d) != "mma":
        return None
    if xshape == (L, 3) or xshape == (1, L, 3):
        xstride = 0
    elif xshape == (B, L, 3):
        xstride = 3 * L
    else:
        return None
    if mshape is None or mshape == (L,):
        mstride = 0
    elif mshape == (B, L):
        mstride = L
    else:
        return None
    try:
        g = _check_gamma(g, H)
        cutoff_f, scale_f = _check_cutoff_scale(cutoff, scale, d)
    except InputError:
        return None
    from .. import _cuda

    cfg = flash_config(d)
    cutoff2 = -1.0 if cutoff_f is None else cutoff_f**2
    entry, arch_specific = flash_entry(precision, cfg, cutoff2)
    handle = _cuda.get_kernel("attention_flash", entry, cfg, arch_specific=arch_specific)
    rows = flash_block_m(cfg)
    tail = (np.int32(L), np.int32(H), np.int32(xstride), np.int32(mstride), np.float32(scale_f), np.float32(cutoff2))
    kernel = _cuda.build_plan(handle, ((L + rows - 1) // rows, H, B), (32 * int(cfg["FA_WARPS"]),), tail)
    plan = _Plan(kernel, _device_gamma(g, np.float32))
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()  # plans hold no memory that a kernel in flight reads (gamma lives in _GAMMA_CACHE)
    _PLANS[(dev, key)] = plan
    return plan


def _host_gamma(gamma) -> bool:
    """gamma given on the host (reading a device gamma would synchronise: the general path does that)."""
    return not is_cupy_array(gamma) and not (is_torch_tensor(gamma) and gamma.is_cuda)


def _fast_torch(q, k, v, coords, gamma, cutoff, mask, scale):
    import torch

    dt = q.dtype
    if dt is torch.bfloat16:
        precision = "bfloat16"
    elif dt is torch.float16:
        precision = "float16"
    else:
        return None
    dev = q.device
    if dev.type != "cuda" or not _host_gamma(gamma):
        return None
    for t in (k, v, coords) if mask is None else (k, v, coords, mask):
        if not is_torch_tensor(t) or t.device != dev:
            return None
    if k.dtype is not dt or v.dtype is not dt or (mask is not None and mask.dtype is not torch.bool):
        return None
    shape = tuple(q.shape)
    if tuple(k.shape) != shape or tuple(v.shape) != shape or len(shape) not in (3, 4):
        return None
    import cupy

    if dev.index != cupy.cuda.runtime.getDevice():
        return None
    plan = _fast_plan(precision, shape, tuple(coords.shape), None if mask is None else tuple(mask.shape), gamma,
                      cutoff, scale)
    if plan is None:
        return None
    # Copies (strided or misaligned operands, other coordinate dtypes) stay referenced until the launch
    # is enqueued: freed earlier, their memory could be handed to the next copy before the kernel reads it.
    ops = [t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)
           for t in (q, k, v)]  # cp.async reads 16-byte chunks
    x = coords
    if x.dtype is not torch.float32 or not x.is_contiguous():
        x = x.to(torch.float32).contiguous()
    m = None if mask is None else mask.contiguous()
    out = torch.empty(shape, dtype=dt, device=dev)
    plan.kernel.launch(torch.cuda.current_stream(dev).cuda_stream, dev.index,
                       ops[0].data_ptr(), ops[1].data_ptr(), ops[2].data_ptr(), x.data_ptr(), plan.gamma.data.ptr,
                       0 if m is None else m.data_ptr(), out.data_ptr())
    return out


def _fast_cupy(q, k, v, coords, gamma, cutoff, mask, scale):
    import cupy

    dt = q.dtype
    if dt == np.float16:
        precision = "float16"
    elif dt.name == "bfloat16" and dt.itemsize == 2:
        precision = "bfloat16"
    else:
        return None
    if not _host_gamma(gamma) or not all(is_cupy_array(a) for a in (k, v, coords)):
        return None
    if mask is not None and not (is_cupy_array(mask) and mask.dtype == np.bool_):
        return None
    if k.dtype != dt or v.dtype != dt or k.shape != q.shape or v.shape != q.shape or q.ndim not in (3, 4):
        return None
    dev = cupy.cuda.runtime.getDevice()
    if any(a.device.id != dev for a in (q, k, v, coords) + (() if mask is None else (mask,))):
        return None
    plan = _fast_plan(precision, q.shape, coords.shape, None if mask is None else mask.shape, gamma, cutoff, scale)
    if plan is None:
        return None
    q, k, v = (_aligned(a, cupy) for a in (q, k, v))
    x = cupy.ascontiguousarray(coords, dtype=cupy.float32)
    m = None if mask is None else cupy.ascontiguousarray(mask)
    out = cupy.empty(q.shape, dtype=dt)
    plan.kernel.launch(cupy.cuda.get_current_stream().ptr, dev,
                       q.data.ptr, k.data.ptr, v.data.ptr, x.data.ptr, plan.gamma.data.ptr,
                       0 if m is None else m.data.ptr, out.data.ptr)
    return out


def fast_attention(q, k, v, coords, gamma, cutoff, mask, scale, return_weights, method, device):
    """The fast path's result, or None when the call is not of its kind (see the module notes).

    Parameters are those of :func:`protgpu.attention`, positionally; a None result means the call must
    take the general path (which also reports bad input).
    """
    if return_weights or method not in ("auto", "fused") or device not in ("auto", "gpu"):
        return None
    if is_torch_tensor(q):
        return _fast_torch(q, k, v, coords, gamma, cutoff, mask, scale)
    if is_cupy_array(q):
        return _fast_cupy(q, k, v, coords, gamma, cutoff, mask, scale)
    return None
