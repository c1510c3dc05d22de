"""Inputs of the contact functions: a Structure through the front door (:mod:`protgpu._inputs`) and the
coordinates to work on (:func:`work_coords`)."""

from __future__ import annotations

import numpy as np

from .. import _inputs
from .._array import get_namespace, to_numpy
from ..errors import InputError


def work_coords(structure, coords, be, what):
    """The coordinates to use, float32 unless float64 came in, shape (F, N, 3).

    Device arrays (CuPy, CUDA tensors) stay on the device; host arrays stay on the host even when the
    work runs on the GPU, which then copies them over frame chunk by frame chunk (a trajectory need
    not fit in device memory).
    """
    src = structure.coords if coords is None else _inputs.as_array(coords, what)
    if be.on_gpu and be.kind in ("cupy", "torch-cuda"):
        a = be.asarray(src)
    else:
        a = np.asarray(to_numpy(src))
    xp = get_namespace(a)
    a = a.astype(xp.float64 if a.dtype == np.float64 else xp.float32, copy=False)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3 or a.shape[2] != 3 or a.shape[1] != structure.n_atoms:
        raise InputError(f"{what}: coords must have shape (frames, {structure.n_atoms}, 3), got {tuple(a.shape)}")
    if a.shape[0] == 0:
        raise InputError(f"{what}: no frames")
    if coords is not None:
        if xp is np:
            _inputs.check_finite(a, what)
        elif not bool(xp.isfinite(a).all()):  # device coords: one reduction (contacts read them all anyway)
            raise InputError(f"{what}: NaN or infinite coordinates")
    return xp.ascontiguousarray(a)
