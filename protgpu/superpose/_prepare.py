"""Input preparation of :mod:`protgpu.superpose`: the inputs come through the front door
(:mod:`protgpu._inputs`); here are the ``fit=`` / ``atoms=`` selections and weights and the lined-up
reference of :func:`prepare`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._array import dispatch, to_numpy
from .._inputs import check_finite, check_shape, coordinates, host_view
from ..errors import InputError


def resolve_selection(sel, struct, n_atoms: int, name: str, kind: str, other=None):
    """Atom indices (int64) for ``fit=``/``atoms=``: a selection string (needs a Structure; an array
    input with the same atom count borrows the other input's Structure), an index array or a boolean
    mask. ``None`` means all atoms."""
    if sel is None:
        return None
    if isinstance(sel, str):
        src = struct
        if src is None and other is not None and other.n_atoms == n_atoms:
            src = other
        if src is None:
            raise InputError(f"{kind}={sel!r}: a selection string needs a Structure (protgpu.load) for "
                             f"{name}, not a bare array; pass atom indices instead")
        idx = src.select_indices(sel)
        if idx.size == 0:
            raise InputError(f"{kind}={sel!r} selects no atoms of {name}")
        return idx
    arr = to_numpy(sel)
    arr = np.asarray(arr)
    if arr.dtype == bool:
        if arr.shape != (n_atoms,):
            raise InputError(f"{kind}: boolean mask has shape {arr.shape}, {name} has {n_atoms} atoms")
        idx = np.flatnonzero(arr)
    else:
        if arr.size and arr.dtype.kind not in "iu":
            raise InputError(f"{kind}: must be a selection string, an integer index array or a boolean mask")
        idx = arr.astype(np.int64).reshape(-1)
        if idx.size and (idx.min() < -n_atoms or idx.max() >= n_atoms):
            raise InputError(f"{kind}: atom index out of range for {name} ({n_atoms} atoms)")
        idx = np.where(idx < 0, idx + n_atoms, idx)
    if idx.size == 0:
        raise InputError(f"{kind}: the selection is empty")
    return idx


def resolve_weights(weights, n_full: int, sel, name: str):
    """Weights (float64) of the selected atoms: ``weights`` has one value per atom of the input, or
    one per selected atom. ``None`` -> None (unweighted)."""
    if weights is None:
        return None
    w = np.asarray(to_numpy(weights), dtype=np.float64).reshape(-1)
    n_sel = n_full if sel is None else len(sel)
    if w.shape == (n_full,):
        w = w if sel is None else w[sel]
    elif w.shape != (n_sel,):
        raise InputError(f"weights has {w.size} values; {name} has {n_full} atoms ({n_sel} selected)")
    if not np.isfinite(w).all() or (w < 0).any():
        raise InputError("weights must be finite and non-negative")
    if not w.sum() > 0:
        raise InputError("weights of the selected atoms sum to zero")
    return w


class Prepared(NamedTuple):
    """The resolved inputs of rmsd() / superpose(), as :func:`prepare` returns them."""

    be: Any
    mobile: Any  # (F, N, 3) in the input's array library (NumPy for host input)
    ref: tuple  # (ref_fit (n_fit, 3), ref_meas (n_meas, 3) or None), float64, lined up with mobile
    fit: np.ndarray | None  # indices into mobile/ref atoms (None: all)
    meas: np.ndarray | None  # measured atoms (None: same as fit)
    w_fit: np.ndarray | None
    w_meas: np.ndarray | None
    squeeze: bool
    name: str = "mobile"  # the mobile input's name, for messages


def prepare(mobile, reference, fit, atoms, weights, ref_frame, device, *, need_rotation: bool):
    """The inputs of rmsd() / superpose() resolved and checked: backend, mobile frames, the reference
    frame's fitted (and measured) atoms lined up with the mobile's as float64, selections and weights.

    Raises
    ------
    InputError
        Bad shapes, atom counts differing after selection, an out-of-range ``ref_frame``, fewer than 3
        fitted atoms where a rotation is needed, NaN coordinates (host input; rmsd() checks its result
        instead).
    """
    mob, mob_s, mob_name = coordinates(mobile, "mobile")
    ref, ref_s, ref_name = coordinates(reference, "reference")
    be = dispatch(mob, device=device)
    mob_shape = tuple(getattr(mob, "shape", None) or np.shape(mob))
    check_shape(mob_shape, mob_name)
    ref_host = np.asarray(to_numpy(ref))
    check_shape(ref_host.shape, ref_name)
    if isinstance(ref_frame, bool) or not isinstance(ref_frame, (int, np.integer)):
        raise InputError(f"ref_frame must be an integer frame index, got {ref_frame!r}")
    if ref_host.ndim == 3:
        nf = ref_host.shape[0]
        if not -nf <= ref_frame < nf:
            raise InputError(f"ref_frame={ref_frame} is out of range: {ref_name} has {nf} frames")
        ref_host = ref_host[ref_frame]
    elif ref_frame not in (0, -1):
        raise InputError(f"ref_frame={ref_frame} given but {ref_name} is a single frame")
    n_mob, n_ref = mob_shape[-2], ref_host.shape[0]
    fit_m = resolve_selection(fit, mob_s, n_mob, mob_name, "fit", other=ref_s)
    fit_r = resolve_selection(fit, ref_s, n_ref, ref_name, "fit", other=mob_s)
    meas_m = resolve_selection(atoms, mob_s, n_mob, mob_name, "atoms", other=ref_s)
    meas_r = resolve_selection(atoms, ref_s, n_ref, ref_name, "atoms", other=mob_s)
    nf_m = n_mob if fit_m is None else len(fit_m)
    nf_r = n_ref if fit_r is None else len(fit_r)
    if nf_m != nf_r:
        raise InputError(f"mobile and reference differ in atom count after the fit selection: "
                         f"{mob_name} has {nf_m}, {ref_name} has {nf_r}")
    nm_m = nf_m if atoms is None else len(meas_m)
    nm_r = nf_r if atoms is None else len(meas_r)
    if nm_m != nm_r:
        raise InputError(f"mobile and reference differ in atom count after the atoms selection: "
                         f"{mob_name} has {nm_m}, {ref_name} has {nm_r}")
    if (need_rotation or atoms is not None) and nf_m < 3:
        what = "superposition" if need_rotation else "measuring on other atoms than the fitted ones"
        raise InputError(f"{what} needs at least 3 fitted atoms, got {nf_m}: with 1 or 2 atoms the rotation "
                         "is not unique (rmsd() without atoms= accepts them)")
    host = host_view(mob, mob_name)
    used = None
    if not need_rotation and fit_m is not None:
        used = fit_m if meas_m is None else np.union1d(fit_m, meas_m)
    if need_rotation:
        check_finite(host, mob_name, used)
    # else: rmsd() checks its (F,) result instead (a NaN or infinite coordinate of a fitted or measured
    # atom makes that frame's RMSD NaN or infinite), which costs nothing: a host pass over 10^8
    # coordinates takes longer than the GPU computation, and a fifth of the CPU one.
    check_finite(ref_host.astype(np.float64), ref_name)
    # Reference atoms reordered/selected to line up with the mobile's fit (and measured) atoms.
    ref64 = ref_host.astype(np.float64)
    ref_fit = ref64 if fit_r is None else ref64[fit_r]
    ref_meas = None if atoms is None else ref64[meas_r]
    w_fit = resolve_weights(weights, n_mob, fit_m, mob_name)
    w_meas = None if atoms is None else resolve_weights(weights, n_mob, meas_m, mob_name)
    squeeze = len(mob_shape) == 2
    mob_arr = mob if host is None else host
    return Prepared(be, mob_arr, (ref_fit, ref_meas), fit_m, meas_m, w_fit, w_meas, squeeze, mob_name)


def float_dtype(dtype):
    """float32 for float32 input, else float64 (the dtype the paths compute moved coordinates in)."""
    return np.float32 if np.dtype(dtype) == np.float32 else np.float64
