"""Distance-biased multi-head attention over residues.

The logit of residue ``i`` attending to residue ``j`` in head ``h`` is::

    scale * q[i, h] . k[j, h] - gamma[h] * |x_i - x_j|^2

(``x``: coordinates in Angstrom, usually CA), minus infinity where key ``j`` is padding (``mask``
False) or ``|x_i - x_j| > cutoff``; the weights are the softmax over ``j`` and the output is
``sum_j w_ij v[j, h]``. A query whose keys are all masked gets weights and output zero (not NaN).

Three layers, as everywhere in protgpu: :func:`attention` (validates, picks the backend and the GPU
path, converts back), :func:`attention_numpy` (the NumPy twin: the specification and the CPU path,
float64 inside), and two CUDA paths:

* ``"materialized"``: per (batch, head) the score matrix ``Q K^T`` by cuBLAS (batched, float32 or
  float64, through :func:`protgpu._cuda.blas.matmul`), then one NVRTC kernel
  (``kernels/attention.cu: bias_softmax_*``) adds scale, distance bias, mask and cutoff and turns each
  row into its softmax in place, then ``P V`` by cuBLAS. Needs ``L x L`` per (batch, head) in device
  memory (chunked to the memory budget); the only path that can return the weights.
* ``"fused"``: flash-style, the ``L x L`` matrix is never stored (device memory O(B L H d)). float16 and
  bfloat16 with ``d`` a multiple of 16 (up to 128) run ``kernels/attention_flash.cu`` (tensor cores:
  ``mma.sync`` m16n8k16 with float32 accumulation, K/V tiles through shared memory by ``cp.async``,
  online softmax, the bias computed from the coordinates in the kernel; on compute capability 9.0
  (Hopper) with ``d = 64`` and no cutoff, the products run on warpgroup ``wgmma`` instead, compiled
  for ``sm_90a``); float32, float64 and other
  head dimensions run ``kernels/attention.cu: flash_simt_*`` (the same algorithm on CUDA cores).
  Calls on float16/bfloat16 torch CUDA tensors or CuPy arrays with coordinates (and mask) on the same
  device skip the general input handling: pointers in, one launch on the caller's current stream, no
  host synchronisation (see "Fast path" below).

``method="auto"`` chooses by dtype and size (:func:`choose_method`): the tensor-core kernel for 16-bit
inputs; on CUDA cores the materialised path while one score matrix is small, the fused one beyond.

Precision: float16 and bfloat16 inputs accumulate in float32 (both paths; the materialised path upcasts
them and multiplies in float32); coordinates are always float32. NumPy has no bfloat16: bfloat16 comes
from torch tensors (moved through DLPack as raw 16-bit words, since CuPy may lack the dtype) or from
arrays whose dtype is named ``bfloat16`` (``ml_dtypes`` in NumPy, CuPy where supported), and goes back
as the same type.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._array import array_kind, dispatch, is_cupy_array, is_torch_tensor, to_numpy
from .._memory import check_host_fits, device_budget_bytes, format_bytes, rows_per_chunk
from ..errors import InputError, MemoryBudgetError

# The bfloat16 bit helpers are internal (importable by name for tests and benchmarks).
__all__ = ["attention", "attention_numpy"]

METHODS = ("auto", "materialized", "fused")
PRECISIONS = ("float16", "bfloat16", "float32", "float64")

# The tensor-core kernel keeps a 16-row slice of Q and of the output accumulator in registers: head
# dimensions above 128 would spill. The CUDA-core kernel keeps K, V and Q tiles in 48 KB of static
# shared memory: up to d = 128 in float32 and d = 64 in float64.
MMA_MAX_HEAD_DIM = 128
SIMT_MAX_HEAD_DIM = {"float32": 128, "float64": 64}
_STATIC_SMEM = 48 * 1024
_SIMT_ROWS_PER_BLOCK = 16  # SM_WARPS * SM_ROWS of attention.cu (defaults)
_SOFTMAX_THREADS = 256  # SOFTMAX_THREADS of attention.cu
_MAX_GRID_YZ = 65535
# "auto" on CUDA cores: the materialised path while one (batch, head) score matrix is at most this big.
MATERIALIZED_MAX_SCORE_BYTES = 256 * 2**20

# Tuning knobs of the tensor-core kernel that override :func:`flash_config` (the benchmark sweeps them).
FLASH_OVERRIDES: dict = {}


# --------------------------------------------------------------------------------------------------
# bfloat16 as raw 16-bit words (NumPy has no bfloat16; CuPy may not either)


def bf16_bits_to_float32(bits, xp=np):
    """bfloat16 bit patterns (uint16) to float32, exactly (the 16 bits are the float32's high half).

    Parameters
    ----------
    bits : ndarray of uint16 (NumPy or CuPy, per ``xp``)
    xp : module
        ``numpy`` or ``cupy``.

    Returns
    -------
    ndarray of float32, same shape.
    """
    return (xp.asarray(bits).astype(xp.uint32) << 16).view(xp.float32)


def float32_to_bf16_bits(x, xp=np):
    """float32 values to bfloat16 bit patterns (uint16), rounding to nearest even as CUDA's
    ``__float2bfloat16`` does; infinities stay infinite, NaN stays a (quiet) NaN of the same sign.

    Parameters
    ----------
    x : ndarray (NumPy or CuPy, per ``xp``), converted to float32 first
    xp : module

    Returns
    -------
    ndarray of uint16, same shape.
    """
    f = xp.ascontiguousarray(xp.asarray(x, dtype=xp.float32))
    u = f.view(xp.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even, in integer arithmetic;
    # the carry propagates into the exponent (and to infinity) exactly as IEEE rounding would.
    rounded = (u + (xp.uint32(0x7FFF) + ((u >> 16) & xp.uint32(1)))) >> 16
    quiet_nan = (u >> 16) | xp.uint32(0x0040)
    return xp.where(xp.isnan(f), quiet_nan, rounded).astype(xp.uint16)


# --------------------------------------------------------------------------------------------------
# Input handling


@dataclass(frozen=True)
class _Operand:
    """A q/k/v array on the work device. bfloat16 is held as its uint16 bit patterns."""

    array: Any
    precision: str  # one of PRECISIONS
    dtype: Any  # the caller's dtype object (to give bfloat16 results back in the same type)


def _operand(x, be, name: str) -> _Operand:
    if x is None:
        raise InputError(f"{name} is required")
    in_dtype = getattr(x, "dtype", None)
    bf16 = False
    if is_torch_tensor(x):
        import torch

        x = x.detach()
        if x.dtype == torch.bfloat16:
            # Through DLPack as int16 words: CuPy and NumPy need not know bfloat16.
            x = x.view(torch.int16)
            bf16 = True
        if x.is_cuda:
            import cupy

            x = cupy.from_dlpack(x)
        else:
            x = np.from_dlpack(x)
    elif getattr(in_dtype, "name", None) == "bfloat16" or str(in_dtype) == "bfloat16":
        x = x.view(np.uint16)
        bf16 = True
    if be.on_gpu:
        import cupy

        a = cupy.asarray(x)
    else:
        a = np.asarray(to_numpy(x))
    if bf16:
        a = a.view(np.uint16)
        precision = "bfloat16"
    else:
        precision = np.dtype(a.dtype).name
        if precision not in PRECISIONS:
            raise InputError(f"{name} must be float16, bfloat16, float32 or float64, got {a.dtype}")
    return _Operand(a, precision, in_dtype)


def _to_compute(a, precision: str, xp, dtype):
    """An operand's values in the compute dtype (float32 / float64)."""
    if precision == "bfloat16":
        a = bf16_bits_to_float32(a, xp)
    return a.astype(dtype, copy=False)


def _from_compute(a, precision: str, xp):
    """Compute-dtype values to the operand precision (bfloat16 as uint16 bits)."""
    if precision == "bfloat16":
        return float32_to_bf16_bits(a, xp)
    return a.astype(precision, copy=False)


def _wrap_bf16(bits, be, like_dtype):
    """Give bfloat16 bit patterns back as the caller's bfloat16 type."""
    if be.kind in ("torch-cuda", "torch-cpu"):
        import torch

        if be.kind == "torch-cuda":
            import cupy

            t = torch.from_dlpack(cupy.ascontiguousarray(cupy.asarray(bits)).view(cupy.int16))
        else:
            t = torch.from_numpy(np.ascontiguousarray(to_numpy(bits)).view(np.int16))
        return t.view(torch.bfloat16)
    if be.kind == "cupy":
        import cupy

        return cupy.asarray(bits).view(like_dtype)
    return np.ascontiguousarray(to_numpy(bits)).view(like_dtype)


def _coords_input(coords):
    """CA coordinates of a Structure (frames, L, 3), or the array itself."""
    if hasattr(coords, "atoms") and hasattr(coords, "select") and hasattr(coords, "coords"):
        name = getattr(coords, "source", None) or "coords"
        return coords.select("ca").coords, name
    return coords, "coords"


@dataclass(frozen=True)
class _Problem:
    """Validated inputs on the work device, all batched."""

    q: _Operand
    k: _Operand
    v: _Operand
    coords: Any  # (B, L, 3) float32
    mask: Any  # (B, L) bool or None
    gamma: np.ndarray  # (H,) float64, host
    cutoff: float | None
    scale: float
    squeeze: bool  # the caller gave unbatched (L, H, d) input


def _prepare(q, k, v, coords, gamma, cutoff, mask, scale, be) -> _Problem:
    qo, ko, vo = _operand(q, be, "q"), _operand(k, be, "k"), _operand(v, be, "v")
    if qo.array.ndim not in (3, 4):
        raise InputError(f"q must have shape (B, L, H, d) or (L, H, d), got {tuple(qo.array.shape)}")
    for o, n in ((ko, "k"), (vo, "v")):
        if tuple(o.array.shape) != tuple(qo.array.shape):
            raise InputError(f"{n} must have the shape of q {tuple(qo.array.shape)}, got {tuple(o.array.shape)}")
        if o.precision != qo.precision:
            raise InputError(f"{n} is {o.precision} but q is {qo.precision}; give all three in one dtype")
    squeeze = qo.array.ndim == 3
    if squeeze:
        qo, ko, vo = (_Operand(o.array[None], o.precision, o.dtype) for o in (qo, ko, vo))
    B, L, H, d = qo.array.shape
    if B == 0 or L == 0 or H == 0 or d == 0:
        raise InputError(f"q has an empty axis: shape {tuple(qo.array.shape)}")
    xp = be.xp

    # Mask first: the coordinate check ignores padded residues.
    m = None
    if mask is not None:
        mh = be.asarray(mask)
        if mh.dtype != np.bool_:
            raise InputError(f"mask must be boolean (True = a real residue), got dtype {mh.dtype}")
        if mh.shape == (L,):
            mh = xp.broadcast_to(mh[None], (B, L))
        elif mh.shape != (B, L):
            raise InputError(f"mask must have shape ({L},) or ({B}, {L}), got {tuple(mh.shape)}")
        m = xp.ascontiguousarray(mh)

    c, cname = _coords_input(coords)
    host = array_kind(c) in ("numpy", "torch-cpu")
    x = np.asarray(to_numpy(c)) if host else be.asarray(c)
    if x.dtype.kind not in "fiu":
        raise InputError(f"{cname} must be numeric coordinates, got dtype {x.dtype}")
    if x.ndim == 3 and x.shape[0] == 1 and squeeze:
        x = x[0]
    if tuple(x.shape) == (L, 3):
        x = x[None]
    elif tuple(x.shape) != (B, L, 3):
        raise InputError(f"{cname} must have shape ({L}, 3) or ({B}, {L}, 3) to match q, got {tuple(x.shape)}")
    if host:
        # Host input is checked for NaN/inf (padding residues may hold anything); device input is not:
        # the check would synchronise the caller's stream.
        x = x.astype(np.float32)
        bad = ~np.isfinite(x).all(axis=-1)
        if m is not None:
            bad = bad & to_numpy(m)
        if bad.any():
            b, i = np.argwhere(bad)[0]
            where = f"residue {i}" if x.shape[0] == 1 else f"batch entry {b}, residue {i}"
            raise InputError(f"{cname}: NaN or infinite coordinates at {where}")
    x = xp.ascontiguousarray(xp.broadcast_to(be.asarray(x, np.float32), (B, L, 3)))

    g = _check_gamma(np.asarray(to_numpy(gamma), dtype=np.float64), H)
    cutoff, scale = _check_cutoff_scale(cutoff, scale, d)
    return _Problem(qo, ko, vo, x, m, g, cutoff, scale, squeeze)


def _check_gamma(g: np.ndarray, H: int) -> np.ndarray:
    """gamma as (H,) float64 (a scalar is broadcast), finite and >= 0."""
    if g.ndim == 0:
        g = np.full(H, float(g))
    if g.shape != (H,):
        raise InputError(f"gamma must be a number or have shape ({H},) (one per head), got {g.shape}")
    if not np.isfinite(g).all() or (g < 0).any():
        raise InputError("gamma must be finite and >= 0 (per Angstrom^2)")
    return g


def _check_cutoff_scale(cutoff, scale, d: int) -> tuple[float | None, float]:
    """The cutoff (None or a positive float, Angstrom) and the scale (default 1 / sqrt(d))."""
    if cutoff is not None:
        cutoff = float(cutoff)
        if not (math.isfinite(cutoff) and cutoff > 0):
            raise InputError(f"cutoff must be a positive distance in Angstrom, got {cutoff}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise InputError(f"scale must be finite, got {scale}")
    return cutoff, scale


# --------------------------------------------------------------------------------------------------
# NumPy twin


def attention_numpy(q, k, v, coords, *, gamma, cutoff=None, mask=None, scale=None, return_weights=False,
                    dtype=np.float64):
    """The NumPy twin of :func:`attention` (also its CPU path), computing in ``dtype``.

    Parameters
    ----------
    q, k, v : ndarray, shape (B, L, H, d) or (L, H, d)
        Queries, keys, values (any float dtype; converted to ``dtype``).
    coords : ndarray, shape (B, L, 3) or (L, 3)
        Residue coordinates in Angstrom; taken as float32 (the kernels' input), then ``dtype``.
    gamma : float or ndarray, shape (H,)
        Distance penalty per head, per Angstrom^2.
    cutoff : float, optional
        Keys farther than this (Angstrom) are excluded.
    mask : ndarray of bool, shape (B, L) or (L,), optional
        False marks padding keys.
    scale : float, optional
        Multiplies ``q . k``; default ``1 / sqrt(d)``.
    return_weights : bool
        Also return the weights.
    dtype : dtype
        Compute (and result) dtype; float64 is the reference, float32 the "same precision" run.

    Returns
    -------
    out : ndarray, shape of ``q``, ``dtype``
    weights : ndarray, shape (B, H, L, L) or (H, L, L), ``dtype`` (only with ``return_weights``)

    Examples
    --------
    Six residues, two heads; the second head penalises distance and ignores keys beyond 5 Angstrom:

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.normal(size=(6, 2, 4)) for _ in range(3))
    >>> x = np.cumsum(rng.normal(size=(6, 3)) * 2.2, axis=0)
    >>> out, w = attention_numpy(q, k, v, x, gamma=np.array([0.0, 0.1]), cutoff=5.0, return_weights=True)
    >>> out.shape, w.shape, out.dtype
    ((6, 2, 4), (2, 6, 6), dtype('float64'))
    >>> np.linalg.norm(x - x[0], axis=1).round(1).tolist()  # distances from residue 0
    [0.0, 3.0, 1.9, 3.8, 5.8, 9.0]
    >>> w[1, 0].round(3).tolist()  # residue 0's weights in head 1: zero past the cutoff
    [0.196, 0.309, 0.19, 0.304, 0.0, 0.0]
    """
    ct = np.dtype(dtype)
    q = np.asarray(q)
    squeeze = q.ndim == 3
    qc, kc, vc = (np.asarray(a).astype(ct)[None] if squeeze else np.asarray(a).astype(ct) for a in (q, k, v))
    B, L, H, d = qc.shape
    x = np.asarray(coords, dtype=np.float32).astype(ct)
    if x.ndim == 2:
        x = np.broadcast_to(x[None], (B, L, 3))
    keep = np.ones((B, L), dtype=bool) if mask is None else np.broadcast_to(np.asarray(mask, dtype=bool), (B, L))
    g = np.broadcast_to(np.asarray(gamma, dtype=np.float64), (H,)).astype(ct)
    sc = ct.type(1.0 / math.sqrt(d) if scale is None else scale)
    c2 = None if cutoff is None else ct.type(float(cutoff) ** 2)
    ninf = ct.type(-np.inf)

    out = np.empty((B, L, H, d), dtype=ct)
    weights = np.empty((B, H, L, L), dtype=ct) if return_weights else None
    rows = max(1, min(L, (1 << 20) // L))  # query rows per block: keeps the (rows, L, 3) temporary small
    for b in range(B):
        xb = x[b]
        for i0 in range(0, L, rows):
            i1 = min(L, i0 + rows)
            diff = xb[i0:i1, None, :] - xb[None, :, :]
            d2 = diff[..., 0] * diff[..., 0] + diff[..., 1] * diff[..., 1] + diff[..., 2] * diff[..., 2]
            invalid = np.broadcast_to(~keep[b][None, :], d2.shape)
            if c2 is not None:
                invalid = invalid | (d2 > c2)
            for h in range(H):
                t = sc * (qc[b, i0:i1, h] @ kc[b, :, h].T) - g[h] * d2
                t = np.where(invalid, ninf, t)
                mx = t.max(axis=1, keepdims=True)
                mx = np.where(np.isfinite(mx), mx, ct.type(0))  # all keys masked: exp(-inf) = 0, no NaN
                p = np.exp(t - mx)
                z = p.sum(axis=1, keepdims=True)
                w = np.divide(p, z, out=np.zeros_like(p), where=z > 0)
                out[b, i0:i1, h] = w @ vc[b, :, h]
                if weights is not None:
                    weights[b, h, i0:i1] = w
    if squeeze:
        out = out[0]
        weights = weights[0] if weights is not None else None
    return (out, weights) if return_weights else out


# --------------------------------------------------------------------------------------------------
# CUDA paths


def flash_config(d: int) -> dict:
    """Compile-time knobs of ``attention_flash.cu`` for head dimension ``d`` (a multiple of 16).

    The largest key tile whose double-buffered K and V tiles (rows padded by 8 elements) plus key
    coordinates fit the 48 KB of static shared memory; ``FLASH_OVERRIDES`` replaces any of them.

    Returns
    -------
    dict
        ``HEAD_DIM``, ``FA_BLOCK_N``, ``FA_STAGES``, ``FA_WARPS``, ``FA_MT``, ``FA_MIN_BLOCKS``, and
        ``FA_WGMMA``: 1 when the tile shape is the one the wgmma entry points take (``d = 64``, 64-key
        tiles, 2 stages, 4 warps) and the overrides do not set it to 0. The wgmma kernel then runs where
        the device has it (:func:`flash_entry`).
    """
    cfg = None
    for block_n, stages in ((64, 2), (32, 2), (64, 1), (32, 1), (16, 1)):
        if flash_smem_bytes(d, block_n, stages) <= _STATIC_SMEM:
            cfg = {"HEAD_DIM": d, "FA_BLOCK_N": block_n, "FA_STAGES": stages}
            break
    if cfg is None:
        raise InputError(f"head dimension {d} is too large for the tensor-core kernel")
    # 4 warps of 2 x 16 query rows (128 rows a block) for d <= 64: every K and V fragment read from shared
    # memory feeds two mma instructions, and the ~255 registers a thread allow 2 blocks per SM (L = 4096,
    # H = 8 is then one wave of 256 blocks on 132 SMs). Beyond d = 64 the second slice of O would spill.
    cfg.update({"FA_WARPS": 4, "FA_MT": 2 if d <= 64 else 1, "FA_MIN_BLOCKS": 2})
    cfg.update(FLASH_OVERRIDES)
    cfg["HEAD_DIM"] = d
    wg_shape = (d, int(cfg["FA_BLOCK_N"]), int(cfg["FA_STAGES"]), int(cfg["FA_WARPS"])) == (64, 64, 2, 4)
    cfg["FA_WGMMA"] = int(wg_shape and bool(int(FLASH_OVERRIDES.get("FA_WGMMA", 1))))
    return cfg


_WGMMA_DEVICES: dict = {}


def _wgmma_device() -> bool:
    """Whether the current device runs the sm_90a wgmma kernel (compute capability 9.0 exactly: the
    arch-specific instructions are not in later architectures)."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    hit = _WGMMA_DEVICES.get(dev)
    if hit is None:
        hit = _WGMMA_DEVICES[dev] = cupy.cuda.Device(dev).compute_capability == "90"
    return hit


def flash_entry(precision: str, cfg: dict, cutoff2: float) -> tuple[str, bool]:
    """The entry point of ``attention_flash.cu`` for one launch, and whether it is compiled for the
    device's arch-specific target (``sm_90a``): the wgmma kernel when ``cfg`` allows it
    (``FA_WGMMA``), there is no cutoff (the cutoff's tile skipping is decided per warp, and a
    warpgroup's instructions need all four warps) and the device is compute capability 9.0; else the
    mma.sync kernel."""
    wg = bool(int(cfg.get("FA_WGMMA", 0))) and cutoff2 < 0 and _wgmma_device()
    suffix = "bf16" if precision == "bfloat16" else "f16"
    return (f"flash_attention_wg_{suffix}" if wg else f"flash_attention_{suffix}"), wg


def flash_block_m(cfg: dict) -> int:
    """Query rows per block of ``attention_flash.cu`` under the knobs ``cfg`` (16 x FA_MT x FA_WARPS)."""
    return 16 * int(cfg.get("FA_MT", 2)) * int(cfg.get("FA_WARPS", 4))


def flash_smem_bytes(d: int, block_n: int, stages: int) -> int:
    """Static shared memory of ``attention_flash.cu``: per stage K and V tiles (16-bit, rows of d + 8)
    and 32 bytes per key for the bias (a float4 of coordinates, or 16 float16 bias channels for the
    tensor cores)."""
    return stages * (2 * block_n * (d + 8) * 2 + block_n * 32)


def fused_kernel(precision: str, d: int) -> str | None:
    """Which fused kernel runs ``precision`` / head dimension ``d``: ``"mma"`` (tensor cores),
    ``"simt32"``, ``"simt64"``, or ``None`` (no fused kernel; the materialised path is used)."""
    if precision in ("float16", "bfloat16") and d % 16 == 0 and d <= MMA_MAX_HEAD_DIM:
        return "mma"
    if precision in ("float16", "bfloat16", "float32") and d <= SIMT_MAX_HEAD_DIM["float32"]:
        return "simt32"
    if precision == "float64" and d <= SIMT_MAX_HEAD_DIM["float64"]:
        return "simt64"
    return None


def choose_method(method: str, precision: str, d: int, L: int, return_weights: bool) -> str:
    """Resolve ``method`` to ``"materialized"`` or ``"fused"``, by dtype and size.

    ``"auto"``: 16-bit inputs whose head dimension the tensor-core kernel takes run fused (fast and
    O(L) in memory at every length). Other inputs run on CUDA cores either way; there cuBLAS's products
    beat the fused kernel while one (batch, head) score matrix is small (up to
    ``MATERIALIZED_MAX_SCORE_BYTES``, L = 8192 in float32), and the fused kernel keeps longer sequences
    in O(L) memory. ``return_weights=True`` always takes the materialised path.
    """
    if method == "materialised":
        method = "materialized"
    if method not in METHODS:
        raise InputError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    if return_weights:
        if method == "fused":
            raise InputError("return_weights=True needs the materialised path (the fused path never "
                             "stores the L x L weights); use method='materialized' or 'auto'")
        return "materialized"
    fk = fused_kernel(precision, d)
    if method == "fused" and fk is None:
        raise InputError(f"no fused kernel for {precision} with head dimension {d} (tensor cores: 16-bit, "
                         f"d a multiple of 16 up to {MMA_MAX_HEAD_DIM}; CUDA cores: d up to "
                         f"{SIMT_MAX_HEAD_DIM['float32']} in float32, {SIMT_MAX_HEAD_DIM['float64']} in float64)")
    if method != "auto":
        return method
    if fk == "mma":
        return "fused"
    score_bytes = L * L * (8 if precision == "float64" else 4)
    if fk is None or score_bytes <= MATERIALIZED_MAX_SCORE_BYTES:
        return "materialized"
    return "fused"


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


# --------------------------------------------------------------------------------------------------
# Fast path: 16-bit device arrays straight into the tensor-core kernel
#
# The general path above converts every operand through DLPack and CuPy, broadcasts coordinates and
# mask, uploads gamma and type-checks each launch argument: some 0.25 ms of Python per call, longer than
# the kernel itself at L = 4096. A call on torch CUDA tensors or CuPy arrays of float16 / bfloat16 with
# coordinates (and mask) on the same device takes this path instead: the operands are passed by pointer
# as they are (copied only when strided or not 16-byte aligned), shared (L, 3) coordinates and (L,) masks
# by a batch stride of 0, the output is allocated by the caller's library on its current stream, and
# everything that depends only on the call's shapes and constants (kernel, grid, scalar arguments, gamma
# on the device) is kept in a plan. No host synchronisation, one launch.

_PLANS: dict = {}
_MAX_PLANS = 256
_GAMMA_CACHE: dict = {}
_MAX_GAMMA_CACHE = 256
_STREAMS: dict = {}


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


class _ForeignStream:
    """A raw CUDA stream handle (torch's) in the ``__cuda_stream__`` protocol that cuda.core accepts."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


_TLS = threading.local()


def _ensure_context(dev: int) -> None:
    """Make device ``dev``'s primary context current in this thread for cuda.core's launches (once per
    thread and device; the general path's kernel lookup does it on every call)."""
    if getattr(_TLS, "dev", None) != dev:
        from cuda.core import Device

        Device(dev).set_current()
        _TLS.dev = dev


def _core_stream(handle: int):
    """A cuda.core Stream for a raw stream handle on the current device (one wrapper each, made once)."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    st = _STREAMS.get((dev, handle))
    if st is None:
        from cuda.core import Device

        _ensure_context(dev)
        st = Device(dev).create_stream(_ForeignStream(handle))
        _STREAMS[(dev, handle)] = st
    return st


@dataclass(frozen=True)
class _Plan:
    """What a fast-path launch needs beyond the operands' pointers."""

    kernel: Any  # cuda.core Kernel
    launch_config: Any  # cuda.core LaunchConfig
    gamma: Any  # (H,) float32 CuPy array, kept alive here
    tail: tuple  # scalar arguments: L, H, xstride, mstride, scale, cutoff2 (NumPy scalars)


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
           tuple(sorted(FLASH_OVERRIDES.items())))
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
    from cuda.core import LaunchConfig

    from .. import _cuda

    cfg = flash_config(d)
    cutoff2 = -1.0 if cutoff_f is None else cutoff_f**2
    entry, arch_specific = flash_entry(precision, cfg, cutoff2)
    handle = _cuda.get_kernel("attention_flash", entry, cfg, arch_specific=arch_specific)
    rows = flash_block_m(cfg)
    launch_config = LaunchConfig(grid=((L + rows - 1) // rows, H, B), block=(32 * int(cfg["FA_WARPS"]),),
                                 shmem_size=0)
    tail = (np.int32(L), np.int32(H), np.int32(xstride), np.int32(mstride), np.float32(scale_f), np.float32(cutoff2))
    plan = _Plan(handle.kernel, launch_config, _device_gamma(g, np.float32), tail)
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
    _ensure_context(dev.index)
    # Copies (strided or misaligned operands, other coordinate dtypes) stay referenced until the launch
    # is enqueued: freed earlier, their memory could be handed to the next copy before the kernel reads it.
    ops = [t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)
           for t in (q, k, v)]  # cp.async reads 16-byte chunks
    x = coords
    if x.dtype is not torch.float32 or not x.is_contiguous():
        x = x.to(torch.float32).contiguous()
    m = None if mask is None else mask.contiguous()
    out = torch.empty(shape, dtype=dt, device=dev)
    from cuda.core import launch

    launch(_core_stream(torch.cuda.current_stream(dev).cuda_stream), plan.launch_config, plan.kernel,
           ops[0].data_ptr(), ops[1].data_ptr(), ops[2].data_ptr(), x.data_ptr(), plan.gamma.data.ptr,
           0 if m is None else m.data_ptr(), out.data_ptr(), *plan.tail)
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
    _ensure_context(dev)
    q, k, v = (_aligned(a, cupy) for a in (q, k, v))
    x = cupy.ascontiguousarray(coords, dtype=cupy.float32)
    m = None if mask is None else cupy.ascontiguousarray(mask)
    out = cupy.empty(q.shape, dtype=dt)
    from cuda.core import launch

    launch(_core_stream(cupy.cuda.get_current_stream().ptr), plan.launch_config, plan.kernel,
           q.data.ptr, k.data.ptr, v.data.ptr, x.data.ptr, plan.gamma.data.ptr, 0 if m is None else m.data.ptr,
           out.data.ptr, *plan.tail)
    return out


def _fast_attention(q, k, v, coords, gamma, cutoff, mask, scale, return_weights, method, device):
    """The fast path's result, or None when the call is not of its kind (see the comment above)."""
    if return_weights or method not in ("auto", "fused") or device not in ("auto", "gpu"):
        return None
    if is_torch_tensor(q):
        return _fast_torch(q, k, v, coords, gamma, cutoff, mask, scale)
    if is_cupy_array(q):
        return _fast_cupy(q, k, v, coords, gamma, cutoff, mask, scale)
    return None


# --------------------------------------------------------------------------------------------------
# Public function


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
        attention.
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
        :func:`choose_method`). Ignored on the CPU.
    device : {"auto", "cpu", "gpu"}
        Where to compute; ``"auto"`` follows the data (and uses a GPU for NumPy input when present).

    Notes
    -----
    float16/bfloat16 q, k, v as torch CUDA tensors or CuPy arrays, with ``coords`` (and ``mask``) as
    arrays of the same library on the same device and ``gamma`` given on the host, run without any host
    synchronisation and with one kernel launch on the caller's current stream (torch's for tensors).
    Coordinates on the device are not checked for NaN (the check would synchronise).

    Returns
    -------
    out : array, shape and dtype of ``q``, array type of the input
    weights : array, shape (B, H, L, L) or (H, L, L)
        Only with ``return_weights=True``.

    Raises
    ------
    InputError
        Shapes that do not agree, a non-boolean mask, negative gamma, NaN coordinates of real residues.
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
    out = _fast_attention(q, k, v, coords, gamma, cutoff, mask, scale, return_weights, method, device)
    if out is not None:
        return out
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
