"""The general CUDA paths of :func:`protgpu.attention` on a validated problem: ``"materialized"``
(cuBLAS ``Q K^T``, the ``bias_softmax_*`` kernel of ``kernels/attention.cu``, cuBLAS ``P V``, chunked
over (batch, head) pairs to the device memory budget) and ``"fused"`` (``kernels/attention_flash.cu`` on
tensor cores for 16-bit inputs, ``flash_simt_*`` of ``kernels/attention.cu`` on CUDA cores otherwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._memory import check_host_fits, device_budget_bytes, format_bytes, rows_per_chunk
from ..errors import MemoryBudgetError
from .flash import flash_block_m, flash_config, flash_entry, fused_kernel
from .inputs import _from_compute, _to_compute

if TYPE_CHECKING:
    from .inputs import _Problem

_SIMT_ROWS_PER_BLOCK = 16  # SM_WARPS * SM_ROWS of attention.cu (defaults)
_SOFTMAX_THREADS = 256  # SOFTMAX_THREADS of attention.cu
_MAX_GRID_YZ = 65535
_GAMMA_CACHE: dict = {}
_MAX_GAMMA_CACHE = 256


def _device_gamma(g: np.ndarray, dtype):
    """gamma as a CuPy array on the current device, kept per value so that repeated calls upload nothing.

    The upload is waited for once, when the array is made: kernels on any stream (torch's included) may
    read it afterwards.
    """
    import cupy

    a = np.ascontiguousarray(g, dtype=dtype)
    key = (cupy.cuda.runtime.getDevice(), a.dtype.str, a.tobytes())
    hit = _GAMMA_CACHE.get(key)
    if hit is None:
        hit = cupy.asarray(a)
        cupy.cuda.get_current_stream().synchronize()
        if len(_GAMMA_CACHE) < _MAX_GAMMA_CACHE:  # never evicted: a kernel in flight may still read it
            _GAMMA_CACHE[key] = hit
    return hit


def _aligned(a, cupy):
    """C-contiguous with a 16-byte aligned base (cp.async reads 16-byte chunks)."""
    a = cupy.ascontiguousarray(a)
    if a.data.ptr % 16:
        a = a.copy()
    return a


def _batch_chunks(B: int):
    for b0 in range(0, B, _MAX_GRID_YZ):
        yield b0, min(B, b0 + _MAX_GRID_YZ)


def _launch_flash_mma(q, k, v, x, gamma_d, mask_u8, precision, scale, cutoff2, defines=None):
    """Run ``attention_flash.cu`` on (B, L, H, d) 16-bit CuPy arrays (bfloat16 as uint16); ``x`` (B, L, 3)
    float32, ``mask_u8`` (B, L) uint8 or None, ``gamma_d`` (H,) float32 on the device. Returns the output
    in the dtype of ``q``."""
    import cupy

    from .. import _cuda

    B, L, H, d = q.shape
    cfg = defines if defines is not None else flash_config(d)
    entry, arch_specific = flash_entry(precision, cfg, cutoff2)
    h = _cuda.get_kernel("attention_flash", entry, cfg, arch_specific=arch_specific)
    q, k, v = (_aligned(a, cupy) for a in (q, k, v))
    out = cupy.empty_like(q)
    rows = flash_block_m(cfg)
    for b0, b1 in _batch_chunks(B):
        _cuda.launch(h, ((L + rows - 1) // rows, H, b1 - b0), (32 * int(cfg.get("FA_WARPS", 4)),),
                     q[b0:b1], k[b0:b1], v[b0:b1], x[b0:b1], gamma_d,
                     None if mask_u8 is None else mask_u8[b0:b1], out[b0:b1], L, H, 3 * L, L,
                     np.float32(scale), np.float32(cutoff2))
    return out


def _launch_flash_simt(q, k, v, x, gamma_d, mask_u8, scale, cutoff2):
    """Run ``flash_simt_f32/f64`` on (B, L, H, d) float32 / float64 CuPy arrays."""
    import cupy

    from .. import _cuda

    B, L, H, d = q.shape
    f64 = q.dtype == np.float64
    h = _cuda.get_kernel("attention", "flash_simt_f64" if f64 else "flash_simt_f32", {"HEAD_DIM": d})
    q, k, v = (cupy.ascontiguousarray(a) for a in (q, k, v))
    out = cupy.empty_like(q)
    st = np.float64 if f64 else np.float32
    for b0, b1 in _batch_chunks(B):
        _cuda.launch(h, ((L + _SIMT_ROWS_PER_BLOCK - 1) // _SIMT_ROWS_PER_BLOCK, H, b1 - b0), (128,),
                     q[b0:b1], k[b0:b1], v[b0:b1], x[b0:b1], gamma_d,
                     None if mask_u8 is None else mask_u8[b0:b1], out[b0:b1], L, H, st(scale), st(cutoff2))
    return out


def _materialized_cuda(q, k, v, x, gamma_d, mask_u8, scale, cutoff2, weights_host: bool, return_weights: bool):
    """QK^T and PV by cuBLAS, bias + mask + softmax by ``bias_softmax_*``, chunked over (batch, head)
    pairs to the device memory budget. ``q, k, v``: (B, L, H, d) float32 / float64 CuPy arrays."""
    import cupy

    from .. import _cuda
    from .._cuda.blas import matmul

    B, L, H, d = q.shape
    T = q.dtype
    isz = T.itemsize
    f64 = T == np.float64
    h = _cuda.get_kernel("attention", "bias_softmax_f64" if f64 else "bias_softmax_f32")
    nbh = B * H
    # (B, L, H, d) -> (B*H, L, d): cuBLAS's strided batch needs one batch stride.
    qt, kt, vt = (cupy.ascontiguousarray(a.transpose(0, 2, 1, 3)).reshape(nbh, L, d) for a in (q, k, v))
    weights = None
    total_w = nbh * L * L * isz
    budget = device_budget_bytes()
    if return_weights:
        if weights_host:
            check_host_fits(total_w, f"the attention weights ({B}, {H}, {L}, {L})")
            weights = np.empty((nbh, L, L), dtype=T)
        else:
            if total_w > budget:
                raise MemoryBudgetError(f"the attention weights ({B}, {H}, {L}, {L}) need {format_bytes(total_w)} "
                                        f"of device memory; the budget is {format_bytes(budget)}")
            weights = cupy.empty((nbh, L, L), dtype=T)
            budget -= total_w
    # Per (batch, head): the score matrix plus cuBLAS's output of P V, and slack for a copy.
    chunk = rows_per_chunk(2 * L * L * isz + L * d * isz, nbh, max(budget, 1))
    chunk = max(1, min(chunk, (2**31 - 1) // L))  # one block per row: grid.x < 2^31
    out = cupy.empty((nbh, L, d), dtype=T)
    st = np.float64 if f64 else np.float32
    for c0 in range(0, nbh, chunk):
        c1 = min(nbh, c0 + chunk)
        # cuBLASLt gives the result the layout of the first operand (row-major here); the kernel
        # needs C order, so make sure of it (a no-op when it already is).
        s = cupy.ascontiguousarray(matmul(qt[c0:c1], kt[c0:c1].transpose(0, 2, 1)))
        _cuda.launch(h, ((c1 - c0) * L,), (_SOFTMAX_THREADS,), s, x, gamma_d, mask_u8, st(scale), st(cutoff2),
                     L, H, c0)
        out[c0:c1] = matmul(s, vt[c0:c1])
        if weights is not None:
            if weights_host:
                weights[c0:c1] = s.get()
            else:
                weights[c0:c1] = s
        del s
    out = cupy.ascontiguousarray(out.reshape(B, H, L, d).transpose(0, 2, 1, 3))
    if weights is not None:
        weights = weights.reshape(B, H, L, L)
    return out, weights


def _attention_cuda(p: _Problem, method: str, return_weights: bool, weights_host: bool, flash_defines=None):
    """Both GPU paths on a validated problem; returns (out in the input precision, weights or None)."""
    import cupy

    prec = p.q.precision
    B, L, H, d = p.q.array.shape
    # bool and uint8 are both one byte of 0 / 1: a view, not a conversion.
    mask_u8 = None if p.mask is None else cupy.ascontiguousarray(p.mask).view(cupy.uint8)
    cutoff2 = -1.0 if p.cutoff is None else p.cutoff**2
    x = cupy.ascontiguousarray(p.coords, dtype=cupy.float32)
    compute = np.float64 if prec == "float64" else np.float32

    if method == "fused":
        fk = fused_kernel(prec, d)
        if fk == "mma":
            g32 = _device_gamma(p.gamma, "float32")
            out = _launch_flash_mma(p.q.array, p.k.array, p.v.array, x, g32, mask_u8, prec, p.scale, cutoff2,
                                    flash_defines)
            return out, None
        q, k, v = (_to_compute(o.array, prec, cupy, compute) for o in (p.q, p.k, p.v))
        gd = cupy.asarray(p.gamma.astype(compute))
        out = _launch_flash_simt(q, k, v, x, gd, mask_u8, p.scale, cutoff2)
        return _from_compute(out, prec, cupy), None

    q, k, v = (_to_compute(o.array, prec, cupy, compute) for o in (p.q, p.k, p.v))
    gd = cupy.asarray(p.gamma.astype(compute))
    out, w = _materialized_cuda(q, k, v, x, gd, mask_u8, p.scale, cutoff2, weights_host, return_weights)
    return _from_compute(out, prec, cupy), w
