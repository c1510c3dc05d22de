"""Input resolution of the contact functions, kept in one place: a Structure from what the caller gave
(:func:`as_structure`) and the coordinates to work on (:func:`work_coords`)."""

from __future__ import annotations

import numpy as np

from .._array import get_namespace, is_cupy_array, to_numpy
from ..errors import InputError


def as_structure(obj, what: str, top=None):
    if hasattr(obj, "coords") and hasattr(obj, "atoms") and hasattr(obj, "residues"):
        return obj
    from ..io import load

    if isinstance(obj, np.ndarray) or is_cupy_array(obj):
        raise InputError(f"{what}: contacts need residues; give a Structure (protgpu.load) rather than a bare array")
    return load(obj, top=top)


def work_coords(structure, coords, be, what):
    """The coordinates to use, float32 unless float64 came in, shape (F, N, 3).

    Device arrays (CuPy, CUDA tensors) stay on the device; host arrays stay on the host even when the
    work runs on the GPU, which then copies them over frame chunk by frame chunk (a trajectory need
    not fit in device memory).
    """
    src = structure.coords if coords is None else coords
    if be.on_gpu and be.kind in ("cupy", "torch-cuda"):
        a = be.asarray(src)
    else:
        a = np.asarray(to_numpy(src))
    xp = get_namespace(a)
    if a.dtype.kind not in "fiu":
        raise InputError(f"{what}: coords must be numeric, got dtype {a.dtype}")
    a = a.astype(xp.float64 if a.dtype == np.float64 else xp.float32, copy=False)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3 or a.shape[2] != 3 or a.shape[1] != structure.n_atoms:
        raise InputError(f"{what}: coords must have shape (frames, {structure.n_atoms}, 3), got {tuple(a.shape)}")
    if a.shape[0] == 0:
        raise InputError(f"{what}: no frames")
    if coords is not None and not bool(xp.isfinite(a).all()):
        raise InputError(f"{what}: NaN or infinite coordinates")
    return xp.ascontiguousarray(a)
