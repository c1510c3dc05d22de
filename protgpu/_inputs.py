"""The front door: what a user passes, turned into coordinates and, where there are any, atom tables.

Every public function resolves its structure-like arguments here, so every documented input form
(``docs/concepts.rst``) works everywhere and bad input gets the same one-line error everywhere.
Internal API; see ``docs/design/architecture.md``.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np

from ._array import is_cupy_array, is_torch_tensor, to_numpy
from .errors import InputError

#: Largest coordinate magnitude accepted, in Angstrom. Real systems stay far below it (a 1e6 A box
#: would hold ~10^17 atoms); beyond it float32 squared distances lose every digit and iterative
#: searches (TM-score's cutoff widening) stop making progress.
MAX_ABS_COORD = 1.0e6

FORMS = ("a Structure, a file path, an mdtraj.Trajectory, a Bio.PDB Structure/Model/Chain, "
         "a NumPy/CuPy/torch array of shape (atoms, 3) or (frames, atoms, 3), or a list of these")


class Coordinates(NamedTuple):
    """What :func:`coordinates` returns.

    Attributes
    ----------
    array : array, shape (frames, atoms, 3) or (atoms, 3)
        NumPy, CuPy or torch, as given (structures give NumPy float32), Angstrom. Not copied.
    structure : Structure or None
        The atom table the coordinates follow (None for bare arrays).
    name : str
        What messages call the input: the file name, else the argument's name.
    """

    array: Any
    structure: Any
    name: str


def is_array(x) -> bool:
    """True for NumPy/CuPy arrays and torch tensors (coordinates without a topology)."""
    return isinstance(x, np.ndarray) or is_cupy_array(x) or is_torch_tensor(x)


def is_structure(x) -> bool:
    """True for a :class:`~protgpu.Structure` (duck-typed, so that no import cycle is needed)."""
    return hasattr(x, "coords") and hasattr(x, "select_indices") and hasattr(x, "atoms")


def _module_of(x) -> str:
    return type(x).__module__ or ""


def has_topology(x) -> bool:
    """True when ``x`` carries atom tables: a Structure, a path, an mdtraj object, a Bio.PDB entity, or
    a non-empty list of these."""
    if is_structure(x) or isinstance(x, (str, os.PathLike)):
        return True
    mod = _module_of(x)
    if (mod.startswith("mdtraj") and hasattr(x, "xyz")) or mod.startswith("Bio.PDB"):
        return True
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(has_topology(i) for i in x)


def source_name(s, fallback: str) -> str:
    """A short name for messages and result rows: the file's base name, else ``fallback``."""
    src = getattr(s, "source", None)
    return os.path.basename(str(src)) if src else fallback


def as_structure(x, what: str, *, top=None):
    """A :class:`~protgpu.Structure` for anything with atom tables.

    Parameters
    ----------
    x : Structure, str, os.PathLike, mdtraj.Trajectory, Bio.PDB entity, or a list of these
        A list is stacked as frames (its items must have the same atoms), as :func:`protgpu.load` does.
    what : str
        The argument's name, for messages.
    top : optional
        Topology for trajectory files that carry none, as :func:`protgpu.load` takes it.

    Returns
    -------
    Structure

    Raises
    ------
    InputError
        ``x`` is none of these (a bare array has no atom table), or loading it failed.
    """
    if is_structure(x):
        return x
    if has_topology(x):
        from .io import load

        return load(x, top=top)
    if is_array(x) or (isinstance(x, (list, tuple)) and x and all(is_array(i) for i in x)):
        raise InputError(f"{what}: a coordinate array has no atom names or residues; pass a Structure "
                         "(protgpu.load) or a file path")
    raise InputError(f"{what}: expected {FORMS}; got {type(x).__name__}")


def as_array(x, what: str):
    """``x`` as an array: NumPy/CuPy/torch pass through uncopied; nested lists and lists of arrays
    become one NumPy array. Non-numeric (object, string, bool), complex and ragged input is an error."""
    if is_torch_tensor(x):
        if x.is_complex():
            raise InputError(f"{what}: coordinates must be real numbers, got complex dtype {x.dtype}")
        if not x.is_floating_point() and x.dtype not in _torch_int_dtypes():
            raise InputError(f"{what}: coordinates must be numeric, got dtype {x.dtype}")
        return x
    if is_cupy_array(x):
        _check_kind(x.dtype.kind, x.dtype, what)
        return x
    if not isinstance(x, (list, tuple, np.ndarray)):
        raise InputError(f"{what}: expected {FORMS}; got {type(x).__name__}")
    if isinstance(x, (list, tuple)) and x and any(is_cupy_array(i) or is_torch_tensor(i) for i in x):
        x = [to_numpy(i) for i in x]
    try:
        a = np.asarray(x)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{what}: coordinates must be a regular (atoms, 3) or (frames, atoms, 3) array of "
                         f"numbers; got a ragged or mixed {type(x).__name__}") from exc
    _check_kind(a.dtype.kind, a.dtype, what)
    return a


def _torch_int_dtypes() -> tuple:
    import torch

    return (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _check_kind(kind: str, dtype, what: str) -> None:
    if kind == "c":
        raise InputError(f"{what}: coordinates must be real numbers, got complex dtype {dtype}")
    if kind not in "fiu":
        raise InputError(f"{what}: coordinates must be numeric, got dtype {dtype}")


def coordinates(x, what: str, *, top=None) -> Coordinates:
    """Resolve any documented input form into coordinates (and an atom table where there is one).

    Parameters
    ----------
    x : Structure, path, mdtraj.Trajectory, Bio.PDB entity, array, or a list of these
        Structures and paths in a list are stacked as frames; arrays in a list are stacked as frames.
    what : str
        The argument's name, for messages when the input has no file name.
    top : optional
        Topology for trajectory files, as :func:`protgpu.load` takes it.

    Returns
    -------
    Coordinates
        ``array`` in Angstrom ((frames, atoms, 3) for structure-like input; arrays as given, shape
        unchecked: see :func:`check_shape`), ``structure`` (or None) and ``name``.

    Raises
    ------
    InputError
        Unknown type, non-numeric, complex or ragged arrays, or a file that fails to load.
    """
    if has_topology(x):
        s = as_structure(x, what, top=top)
        return Coordinates(s.coords, s, source_name(s, what))
    if is_array(x) or isinstance(x, (list, tuple)):
        return Coordinates(as_array(x, what), None, what)
    raise InputError(f"{what}: expected {FORMS}; got {type(x).__name__}")


def check_shape(shape, name: str, *, frames: bool = True) -> None:
    """InputError unless ``shape`` is (atoms, 3) or, with ``frames``, (frames, atoms, 3), non-empty."""
    shape = tuple(shape)
    ndims = (2, 3) if frames else (2,)
    if len(shape) not in ndims or shape[-1] != 3:
        want = "(atoms, 3) or (frames, atoms, 3)" if frames else "(atoms, 3)"
        raise InputError(f"{name}: coordinates must have shape {want}, got {shape}")
    if shape[-2] == 0:
        raise InputError(f"{name}: no atoms")
    if len(shape) == 3 and shape[0] == 0:
        raise InputError(f"{name}: no frames")


def host_view(x, what: str) -> np.ndarray | None:
    """A NumPy view of host input (for validation), or None for device arrays (checking those would
    synchronise the caller's stream)."""
    if is_cupy_array(x) or (is_torch_tensor(x) and x.is_cuda):
        return None
    return as_array(to_numpy(x), what)


def check_finite(a: np.ndarray | None, name: str, atoms=None) -> None:
    """The one check for NaN, infinite and absurdly large coordinates (|x| > :data:`MAX_ABS_COORD`).

    Parameters
    ----------
    a : ndarray, shape (frames, atoms, 3) or (atoms, 3), or None
        Host coordinates; None (device arrays) and integer arrays are not checked.
    name : str
        The input's name for the message.
    atoms : array of int, optional
        Check only these atoms (indices into axis -2).

    Raises
    ------
    InputError
        ``"{name}: NaN or infinite coordinates in frame F (atom A)"``, or
        ``"{name}: coordinates beyond ±1e+06 Angstrom in frame F (atom A): VALUE"``; frames and atoms
        are numbered from 0, as in the arrays (the atom among ``atoms`` where given).
    """
    if a is None or a.dtype.kind != "f" or a.size == 0:
        return
    a3 = a if a.ndim == 3 else a[None]
    if atoms is not None:
        a3 = a3[:, atoms]
    if a3.dtype in (np.float32, np.float64) and a3.flags.c_contiguous:
        # One multi-threaded BLAS pass: every x^2 <= sum x^2, so a small enough sum (NaN never is) proves
        # the bound; typical inputs (10^4 models x 10^3 atoms) pass here at memory bandwidth.
        flat = a3.reshape(-1)
        if float(np.dot(flat, flat)) <= 0.25 * MAX_ABS_COORD**2:
            return
    # Else two reductions (NaN propagates through min and max), no boolean temporary of the input's
    # size; the search below runs only for bad input.
    lo, hi = a3.min(), a3.max()
    if lo >= -MAX_ABS_COORD and hi <= MAX_ABS_COORD:
        return
    nonfinite = ~np.isfinite(a3)
    if nonfinite.any():
        f, atom = np.argwhere(nonfinite)[0][:2]
        raise InputError(f"{name}: NaN or infinite coordinates in frame {f} (atom {atom})")
    f, atom, k = np.argwhere(np.abs(a3) > MAX_ABS_COORD)[0]
    raise InputError(f"{name}: coordinates beyond ±{MAX_ABS_COORD:.0e} Angstrom in frame {f} (atom {atom}): "
                     f"{float(a3[f, atom, k]):.6g}")
