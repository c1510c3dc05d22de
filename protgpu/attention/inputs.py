"""Input handling of :func:`protgpu.attention`'s general path, kept in one place: q, k, v as operands on
the work device (bfloat16 as its bit patterns), coordinates (a Structure gives its CA atoms), mask,
gamma, cutoff and scale, validated into one batched problem (:func:`_prepare`), and the conversions to
and from the compute dtype."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _inputs
from .._array import array_kind, is_torch_tensor, to_numpy
from ..errors import InputError
from .reference import bf16_bits_to_float32, float32_to_bf16_bits

PRECISIONS = ("float16", "bfloat16", "float32", "float64")


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
    """CA coordinates (frames, L, 3) of anything with atom tables (a Structure, path, mdtraj or Bio.PDB
    object: through the front door, :mod:`protgpu._inputs`), or the array itself; and its name."""
    if _inputs.has_topology(coords):
        s = _inputs.as_structure(coords, "coords")
        return s.select("ca").coords, _inputs.source_name(s, "coords")
    return _inputs.as_array(coords, "coords"), "coords"


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
