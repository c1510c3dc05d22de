"""Rules the structure readers share: alternate locations, model selection and model consistency
checks (PDB and mmCIF), and the one-line text of a third-party exception (every reader)."""

from __future__ import annotations

import numpy as np

from ..errors import InputError


def altloc_keep(group: np.ndarray, name_key: np.ndarray, has_alt: np.ndarray, occupancy, mode: str) -> np.ndarray:
    """Boolean keep-mask resolving alternate locations atom by atom.

    Parameters
    ----------
    group : np.ndarray of int64, shape (n,)
        Residue block of each atom (changes with model, chain, residue number or insertion code).
    name_key : np.ndarray of int, shape (n,)
        Atom-name code; atoms with equal (group, name_key) are altlocs of one atom.
    has_alt : np.ndarray of bool, shape (n,)
        True where the record carries an altloc letter.
    occupancy : callable
        ``occupancy(indices) -> float array``, called only in "occupancy" mode.
    mode : {"first", "occupancy"}
    """
    keep = ~has_alt
    alt_idx = np.flatnonzero(has_alt)
    if alt_idx.size == 0:
        return keep
    key = (group[alt_idx].astype(np.int64) << 32) | name_key[alt_idx].astype(np.int64)
    if mode == "first":
        _, first = np.unique(key, return_index=True)
        keep[alt_idx[first]] = True
        return keep
    occ = np.asarray(occupancy(alt_idx), dtype=np.float64)
    order = np.lexsort((np.arange(alt_idx.size), -occ, key))
    ks = key[order]
    lead = np.ones(ks.size, dtype=bool)
    lead[1:] = ks[1:] != ks[:-1]
    keep[alt_idx[order[lead]]] = True
    return keep


def split_models(model_id: np.ndarray, model_numbers: list[int], model, name: str):
    """Validate the model selection; return (kept atom mask or None, kept model numbers)."""
    if model is None:
        return None, model_numbers
    if model not in model_numbers:
        shown = ", ".join(map(str, model_numbers[:10])) + (" ..." if len(model_numbers) > 10 else "")
        raise InputError(f"{name}: no model {model} (models in the file: {shown})")
    k = model_numbers.index(model)
    return model_id == k, [model]


def check_models(counts: np.ndarray, model_numbers: list[int], name: str) -> None:
    """Raise when the models' atom counts ``counts`` (shape (M,)) differ, naming the first odd model."""
    bad = np.flatnonzero(counts != counts[0])
    if bad.size:
        k = int(bad[0])
        raise InputError(
            f"{name}: model {model_numbers[k]} has {counts[k]} atoms but model {model_numbers[0]} has "
            f"{counts[0]}; every model must have the same atoms in the same order"
        )


def check_model_atoms(keys: np.ndarray, n_models: int, model_numbers: list[int], describe, name: str) -> None:
    """keys: (n_models * n,) per-atom identity codes, models concatenated."""
    if n_models < 2:
        return
    k2 = keys.reshape(n_models, -1)
    diff = k2 != k2[0]
    if diff.any():
        m, a = np.argwhere(diff)[0]
        raise InputError(
            f"{name}: model {model_numbers[m]} atom {a} is {describe(m, a)} but model {model_numbers[0]} "
            f"has {describe(0, a)}; every model must have the same atoms in the same order"
        )


def cell_box(cell, name: str) -> np.ndarray | None:
    """Box vectors (rows a, b, c; float32 Angstrom, a along x, b in the xy plane) of a unit cell
    ``(a, b, c, alpha, beta, gamma)`` (Angstrom, degrees), as mdtraj and MDAnalysis compute them.

    None for no cell: all lengths zero, or the ``1 1 1`` placeholder PDB and gemmi write for
    structures without one (NMR models, predictions). A negative or NaN length, or angles that
    span no volume, raise InputError.
    """
    a, b, c, alpha, beta, gamma = (float(v) for v in cell)
    lengths = np.array([a, b, c])
    if (lengths == 0).all() or (lengths == 1).all():
        return None
    if not (np.isfinite(cell).all() and (lengths > 0).all()):
        raise InputError(f"{name}: bad unit cell (lengths {a:g} {b:g} {c:g} A must be positive)")
    al, be, ga = np.radians([alpha or 90.0, beta or 90.0, gamma or 90.0])
    bx, by = b * np.cos(ga), b * np.sin(ga)
    cx = c * np.cos(be)
    cy = c * (np.cos(al) - np.cos(be) * np.cos(ga)) / np.sin(ga) if np.sin(ga) else np.nan
    cz2 = c * c - cx * cx - cy * cy
    if not (np.isfinite(cz2) and cz2 > 0 and by > 0):
        raise InputError(f"{name}: bad unit cell (angles {alpha:g} {beta:g} {gamma:g} degrees span no volume)")
    box = np.array([[a, 0.0, 0.0], [bx, by, 0.0], [cx, cy, np.sqrt(cz2)]])
    box[np.abs(box) < 1e-6] = 0.0  # (cos 90 degrees is 6e-17)
    return box.astype(np.float32)


def one_line(exc: BaseException) -> str:
    """The first line of an exception's text (its type name when empty), for one-line error messages."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
