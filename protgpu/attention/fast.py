"""The fast path of :func:`protgpu.attention`: float16 / bfloat16 torch CUDA tensors or CuPy arrays
straight into the tensor-core kernel, with one prepared launch (:mod:`protgpu._cuda.plans`) on the
caller's current stream and no host synchronisation.

The general path converts every operand through DLPack and CuPy, broadcasts coordinates and mask,
uploads gamma and type-checks each launch argument: some 0.25 ms of Python per call, longer than the
kernel itself at L = 4096. A call on torch CUDA tensors or CuPy arrays of float16 / bfloat16 with
coordinates (and mask) on the same device takes this path instead: the operands are passed by pointer
as they are (copied only when strided or not 16-byte aligned), shared (L, 3) coordinates and (L,) masks
by a batch stride of 0, the output is allocated by the caller's library on its current stream, and
everything that depends only on the call's shapes and constants (kernel, grid, scalar arguments) is kept
in a plan. gamma given on the host is uploaded once per value; gamma on the device (a torch tensor or
``nn.Parameter``, a CuPy array) is passed by pointer and never read on the host. Its host time is
measured (``benchmarks/bench_attention.py``): keep per-call work out of it.

Internal API (tests): :func:`fast_attention`.
"""

from __future__ import annotations

import numpy as np

from .._array import is_cupy_array, is_torch_tensor, to_numpy
from ..errors import InputError
from . import flash as _flash
from .cuda import _MAX_GRID_YZ, _aligned, _device_gamma
from .flash import flash_block_m, flash_config, flash_entry, fused_kernel
from .inputs import _check_cutoff_scale, _check_gamma

_PLANS: dict = {}
_MAX_PLANS = 256
_GAMMAS: dict = {}  # (device, H, host gamma value) -> (H,) float32 CuPy array (see _host_gamma_ptr)
_TORCH: dict = {}  # torch objects looked up once: the 16-bit dtypes' names, the raw-stream getter


def _fast_plan(dev: int, precision: str, shape: tuple, xshape: tuple, mshape, cutoff, scale):
    """The prepared launch (``protgpu._cuda.LaunchPlan``: kernel, grid, scalar tail L, H, xstride,
    mstride, scale, cutoff2) of a fast-path call on device ``dev``, or None when the call must take the
    general path (which also reports bad input)."""
    key = (dev, precision, shape, xshape, mshape, cutoff, scale,
           tuple(sorted(_flash.FLASH_OVERRIDES.items())) if _flash.FLASH_OVERRIDES else ())
    try:
        plan = _PLANS.get(key)
    except TypeError:  # an unhashable cutoff or scale (a 0-d array): the general path converts it
        return None
    if plan is not None:
        return plan
    if not all(c is None or isinstance(c, (int, float, np.integer, np.floating)) for c in (cutoff, scale)):
        return None
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
    plan = _cuda.build_plan(handle, ((L + rows - 1) // rows, H, B), (32 * int(cfg["FA_WARPS"]),), tail)
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()  # plans hold no memory that a kernel in flight reads
    _PLANS[key] = plan
    return plan


def _host_gamma_ptr(dev: int, gamma, H: int) -> int | None:
    """The device address of host ``gamma`` (a number, sequence or array) as (H,) float32, uploaded once
    per value and device; None when it is not valid (the general path reports it). A Python number or
    sequence of numbers is its own key: no array is made on a hit."""
    if isinstance(gamma, (float, int)):
        key = (dev, H, gamma)
    elif isinstance(gamma, (tuple, list)):
        key = (dev, H, tuple(gamma))
    elif type(gamma) is np.ndarray and gamma.dtype == np.float64:  # (no conversion: its bytes are the key)
        key = (dev, H, gamma.shape, gamma.tobytes())
    else:
        try:
            g = np.asarray(to_numpy(gamma), dtype=np.float64)
        except (TypeError, ValueError):
            return None
        key = (dev, H, g.shape, g.tobytes())
    try:
        hit = _GAMMAS.get(key)
    except TypeError:  # a sequence with an unhashable element
        return None
    if hit is None:
        try:
            g = _check_gamma(np.asarray(to_numpy(gamma), dtype=np.float64), H)
        except (InputError, TypeError, ValueError):
            return None
        hit = _device_gamma(g, np.float32)  # never freed: a kernel in flight may read it
        if len(_GAMMAS) < _MAX_PLANS:
            _GAMMAS[key] = hit
    return hit.data.ptr


def _torch_setup() -> dict:
    import torch

    _TORCH["precision"] = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
    # The raw handle without building a torch.cuda.Stream object (microseconds a call); inductor's
    # generated code calls the same function.
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    _TORCH["stream"] = raw if raw is not None else (lambda i: torch.cuda.current_stream(i).cuda_stream)
    _TORCH["torch"], _TORCH["T"] = torch, torch.Tensor
    return _TORCH


# Fast-path decisions of torch calls by signature: (device, and dtype and shape of each operand, mask,
# gamma's kind, cutoff, scale, kernel overrides) -> (plan, gamma expanded from a scalar, gamma converted).
# A hit skips the checks of _fast_torch_plan; what can change between calls with one signature (strides,
# alignment, the values of a host gamma, the current device) is still looked at every call.
_SIGS: dict = {}


def _fast_torch_plan(q, k, v, coords, gamma, cutoff, mask, devi, scale):
    """The checks of a torch call's first time with its signature: (plan, expand, convert) for
    :func:`_fast_torch`, or None for the general path."""
    torch = _TORCH["torch"]
    precision = _TORCH["precision"].get(q.dtype)
    if precision is None:
        return None
    T = torch.Tensor
    for t in (k, v, coords) if mask is None else (k, v, coords, mask):
        if not isinstance(t, T) or not t.is_cuda or t.get_device() != devi:
            return None
    dt = q.dtype
    if k.dtype is not dt or v.dtype is not dt or (mask is not None and mask.dtype is not torch.bool):
        return None
    shape = tuple(q.shape)
    if tuple(k.shape) != shape or tuple(v.shape) != shape or len(shape) not in (3, 4):
        return None
    H = shape[-2]
    expand = convert = False
    if isinstance(gamma, T) and gamma.is_cuda:
        if gamma.get_device() != devi or gamma.dim() not in (0, 1) or (gamma.dim() == 1 and tuple(gamma.shape) != (H,)):
            return None
        expand, convert = gamma.dim() == 0, gamma.dtype is not torch.float32
    plan = _fast_plan(devi, precision, shape, tuple(coords.shape), None if mask is None else tuple(mask.shape),
                      cutoff, scale)
    return None if plan is None else (plan, expand, convert)


def _fast_torch(q, k, v, coords, gamma, cutoff, mask, scale):
    tc = _TORCH.get("T") and _TORCH or _torch_setup()
    T = tc["T"]
    if not q.is_cuda:
        return None
    devi = q.get_device()
    try:
        key = (devi, q.dtype, q.shape, k.dtype, k.shape, k.get_device(), v.dtype, v.shape, v.get_device(),
               coords.dtype, coords.shape, coords.get_device(),
               None if mask is None else (mask.dtype, mask.shape, mask.get_device()),
               (gamma.dtype, gamma.shape, gamma.get_device()) if isinstance(gamma, T) else None, cutoff, scale,
               tuple(sorted(_flash.FLASH_OVERRIDES.items())) if _flash.FLASH_OVERRIDES else ())
        hit = _SIGS.get(key)
    except (AttributeError, TypeError):  # an operand that is not a tensor; an unhashable cutoff or scale
        return None
    import cupy

    if devi != cupy.cuda.runtime.getDevice():
        return None
    if hit is None:
        hit = _fast_torch_plan(q, k, v, coords, gamma, cutoff, mask, devi, scale)
        if hit is None:
            return None
        if len(_SIGS) >= _MAX_PLANS:
            _SIGS.clear()
        _SIGS[key] = hit
    plan, expand, convert = hit
    torch = tc["torch"]
    if isinstance(gamma, T) and gamma.is_cuda:
        # gamma on the device (an nn.Parameter): by pointer, never read on the host (that would
        # synchronise; so a negative value is not reported). Another dtype or a scalar is converted on the
        # stream. It requires no grad here, or grad mode is off (else the call took the op: needs_op).
        g = gamma.expand(q.shape[-2]) if expand else gamma
        if convert or not g.is_contiguous():
            g = g.to(torch.float32).contiguous()
        gptr = g.data_ptr()
    else:
        gptr = _host_gamma_ptr(devi, gamma, q.shape[-2])
        if gptr is None:
            return None
    # Copies (strided or misaligned operands, other coordinate dtypes) stay referenced until the launch
    # is enqueued: freed earlier, their memory could be handed to the next copy before the kernel reads
    # it. cp.async reads 16-byte chunks.
    if q.data_ptr() & 15 or not q.is_contiguous():
        q = q.clone(memory_format=torch.contiguous_format)
    if k.data_ptr() & 15 or not k.is_contiguous():
        k = k.clone(memory_format=torch.contiguous_format)
    if v.data_ptr() & 15 or not v.is_contiguous():
        v = v.clone(memory_format=torch.contiguous_format)
    x = coords
    if x.dtype is not torch.float32 or not x.is_contiguous():
        x = x.to(torch.float32).contiguous()
    m = None if mask is None else mask.contiguous()
    out = torch.empty_like(q)  # (q is contiguous here: so is out)
    plan.launch(tc["stream"](devi), devi, q.data_ptr(), k.data_ptr(), v.data_ptr(), x.data_ptr(), gptr,
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
    if is_torch_tensor(gamma) and gamma.is_cuda:
        return None  # a torch gamma with CuPy operands: the general path converts it
    if not all(is_cupy_array(a) for a in (k, v, coords)):
        return None
    if mask is not None and not (is_cupy_array(mask) and mask.dtype == np.bool_):
        return None
    if k.dtype != dt or v.dtype != dt or k.shape != q.shape or v.shape != q.shape or q.ndim not in (3, 4):
        return None
    dev = cupy.cuda.runtime.getDevice()
    if any(a.device.id != dev for a in (q, k, v, coords) + (() if mask is None else (mask,))):
        return None
    H = q.shape[-2]
    g = None
    if is_cupy_array(gamma):
        # On the device: by pointer, never read on the host (see _fast_torch).
        if gamma.device.id != dev or gamma.shape not in ((), (H,)):
            return None
        g = cupy.ascontiguousarray(cupy.broadcast_to(gamma, (H,)), dtype=cupy.float32)
        gptr = g.data.ptr
    else:
        gptr = _host_gamma_ptr(dev, gamma, H)
        if gptr is None:
            return None
    plan = _fast_plan(dev, precision, q.shape, coords.shape, None if mask is None else mask.shape, cutoff, scale)
    if plan is None:
        return None
    q, k, v = (_aligned(a, cupy) for a in (q, k, v))
    x = cupy.ascontiguousarray(coords, dtype=cupy.float32)
    m = None if mask is None else cupy.ascontiguousarray(mask)
    out = cupy.empty(q.shape, dtype=dt)
    plan.launch(cupy.cuda.get_current_stream().ptr, dev, q.data.ptr, k.data.ptr, v.data.ptr, x.data.ptr, gptr,
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
