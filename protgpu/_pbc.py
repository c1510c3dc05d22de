"""Periodic boxes: box normalisation and the minimum-image rules, shared by distances and contacts.

Internal API (for :mod:`protgpu.distances`, :mod:`protgpu.contacts`, their tests and benchmarks):
:func:`normalize_box` (the box forms ``distances`` accepts), :func:`box_arrays` (the forms contacts
accept: a (3, 3) array is always one box), :func:`minimum_image_numpy` (minimum-image displacement
vectors, distances' twin), :func:`min_image_sq_triclinic` and :func:`half_plane_spacing_sq` (squared
minimum-image lengths with the short-displacement shortcut, contacts' twin). The two minimum-image
functions follow the same rule (``pg_minimum_image`` of ``kernels/common.cuh``) but are not merged:
each is the exact twin of its kernel's arithmetic, and their roundings differ.
"""

from __future__ import annotations

import numpy as np

from ._array import to_numpy
from .errors import InputError

PBC_NONE, PBC_ORTHO, PBC_TRICLINIC = 0, 1, 2


def normalize_box(box, n_frames: int, dtype=np.float64):
    """Box as (frames or 1, 3, 3) vectors (rows a, b, c, Angstrom), its inverse, and the PBC mode.

    Parameters
    ----------
    box : array_like or None
        (3,) or (frames, 3) orthorhombic lengths, or (3, 3) / (frames, 3, 3) box vectors (rows a, b,
        c), Angstrom. A (3, 3) array is always one box's vectors; with exactly 3 frames, per-frame
        lengths must be given as (3, 1, 3), and a (3, 3) array that is not lower triangular is refused
        as ambiguous.
    n_frames : int

    Returns
    -------
    vectors : ndarray (Fb, 3, 3) or None
    inverse : ndarray (Fb, 3, 3) or None
    mode : int
        0 no box, 1 orthorhombic, 2 triclinic.

    Examples
    --------
    >>> import numpy as np
    >>> vectors, inverse, mode = normalize_box([50.0, 60.0, 70.0], n_frames=10)
    >>> vectors.shape, mode, np.diag(vectors[0]).tolist()
    ((1, 3, 3), 1, [50.0, 60.0, 70.0])
    >>> np.allclose(vectors[0] @ inverse[0], np.eye(3))
    True
    >>> normalize_box(None, n_frames=10)
    (None, None, 0)
    """
    if box is None:
        return None, None, PBC_NONE
    try:
        b = np.asarray(to_numpy(box), dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"box must be numbers (lengths or box vectors, Angstrom), got {box!r:.60}") from None
    if b.shape == (3, 3) and n_frames == 3 and np.any(b[[0, 0, 1], [1, 2, 2]] != 0):
        # (3, 3) means one box's vectors; with 3 frames it could also be per-frame lengths. Box
        # vectors from MD engines are lower triangular; anything else here is refused, not guessed.
        raise InputError("box of shape (3, 3) with 3 frames is ambiguous: pass box vectors as (1, 3, 3) "
                         "or (3, 3, 3), per-frame lengths as (3, 1, 3)")
    per_frame_lengths = b.shape == (n_frames, 1, 3) or (b.shape == (n_frames, 3) and n_frames != 3)
    if b.shape == (3,) or per_frame_lengths:
        lengths = b.reshape(-1, 3)
        vec = np.zeros((lengths.shape[0], 3, 3))
        vec[:, [0, 1, 2], [0, 1, 2]] = lengths
    elif b.shape in ((3, 3), (1, 3, 3), (n_frames, 3, 3)):
        vec = b.reshape(-1, 3, 3).copy()
    else:
        raise InputError(
            f"box must have shape (3,), ({n_frames}, 3), (3, 3) or ({n_frames}, 3, 3), got {b.shape}"
        )
    if not np.isfinite(vec).all():
        raise InputError("box has NaN or infinite values")
    det = np.linalg.det(vec)
    if np.any(np.abs(det) < 1e-6):
        raise InputError(f"box of frame {int(np.argmin(np.abs(det)))} has zero volume")
    off_diagonal = vec[:, [0, 0, 1, 1, 2, 2], [1, 2, 0, 2, 0, 1]]
    mode = PBC_ORTHO if np.all(off_diagonal == 0) else PBC_TRICLINIC
    return vec.astype(dtype), np.linalg.inv(vec).astype(dtype), mode


def box_arrays(box, n_frames: int, dtype):
    """Box vectors (Fb, 3, 3), their inverses and the PBC mode (0 none, 1 orthorhombic, 2 triclinic).

    Accepts (3,) or (F, 3) edge lengths and (3, 3) or (F, 3, 3) vectors (rows a, b, c), Angstrom. A
    (3, 3) array is always one box's vectors (as ``Structure`` reads it), also when F is 3. Fb is 1
    for one box, else F. Validation and the mode come from :func:`normalize_box`.
    """
    if box is None:
        return None, None, 0
    b = np.asarray(to_numpy(box), dtype=np.float64)
    if b.shape == (3,):
        b = np.diag(b)[None]
    elif b.shape == (3, 3):
        b = b[None]
    elif b.shape == (n_frames, 3):
        b = b[:, None, :] * np.eye(3)
    elif b.shape != (n_frames, 3, 3):
        raise InputError(f"box must have shape (3,), ({n_frames}, 3), (3, 3) or ({n_frames}, 3, 3), got {b.shape}")
    one = b.shape[0] == 1 and n_frames != 1
    vec, inv, mode = normalize_box(np.broadcast_to(b, (n_frames, 3, 3)) if one else b, n_frames, dtype=dtype)
    if one:
        vec, inv = vec[:1], inv[:1]
    return vec, inv, mode


def half_plane_spacing_sq(vec: np.ndarray):
    """Square of half the smallest lattice-plane spacing of a box (rows a, b, c, Angstrom), for one
    box (3, 3) -> float, or a stack (..., 3, 3) -> array (...).

    Every non-zero lattice vector is at least the smallest plane spacing ``1 / max_k |inv[:, k]|``
    long, so a displacement shorter than half of it is its own minimum image: the 27-image search is
    needed only for longer ones. Both the NumPy twin and the kernel skip it below this bound.
    """
    inv = np.linalg.inv(np.asarray(vec, dtype=np.float64))
    spacing = 1.0 / np.max(np.linalg.norm(inv, axis=-2), axis=-1)
    out = (0.5 * spacing) ** 2
    return float(out) if out.ndim == 0 else out


def min_image_sq_triclinic(d: np.ndarray, vec: np.ndarray, inv: np.ndarray, near2: float) -> np.ndarray:
    """Squared minimum-image lengths of displacements ``d`` (..., 3), as the kernel computes them:
    wrap in fractional coordinates; if still longer than ``sqrt(near2)``, take the shortest of the 27
    neighbouring images (the rule of common.cuh's ``pg_minimum_image``)."""
    s = d @ inv
    s -= np.rint(s)
    w = s @ vec
    n2 = np.einsum("...k,...k->...", w, w)
    far = n2 > near2
    if far.any():
        wf = w[far]
        best = n2[far]
        for i in (-1, 0, 1):
            for j in (-1, 0, 1):
                for k in (-1, 0, 1):
                    e = wf + (i * vec[0] + j * vec[1] + k * vec[2])
                    np.minimum(best, np.einsum("...k,...k->...", e, e), out=best)
        n2[far] = best
    return n2


def minimum_image_numpy(d, vec, inv, mode):
    """Minimum-image displacements ``d`` (..., 3) float64 for one frame's box (rules of common.cuh)."""
    if mode == PBC_ORTHO:
        lengths = np.diagonal(vec)
        return d - lengths * np.rint(d * np.diagonal(inv))
    s = d @ inv
    s -= np.rint(s)
    d = s @ vec
    shifts = np.array([[i, j, k] for i in (-1, 0, 1) for j in (-1, 0, 1) for k in (-1, 0, 1)], dtype=np.float64)
    images = d[..., None, :] + (shifts @ vec)  # (..., 27, 3)
    best = np.argmin(np.einsum("...ij,...ij->...i", images, images), axis=-1)
    return np.take_along_axis(images, best[..., None, None], axis=-2)[..., 0, :]
