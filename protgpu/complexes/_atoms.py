"""Atoms of residues, by name: the tables the complex scores, QS-score and the stereochecks read."""

from __future__ import annotations

import numpy as np

from ..scoring import _mapping as mp

#: The backbone atoms DockQ's RMSDs superpose on.
BACKBONE = ("CA", "C", "N", "O")


def atom_table(info: mp.ResidueInfo, residues: np.ndarray, names) -> np.ndarray:
    """Atom index of each (residue, name), -1 where the residue lacks it; shape (len(residues), len(names))."""
    out = np.full((len(residues), len(names)), -1, dtype=np.int64)
    pos = np.full(len(info.resid), -1, dtype=np.int64)
    pos[residues] = np.arange(len(residues))
    for k, name in enumerate(names):
        at = np.flatnonzero(info.atom_name == name)
        row = pos[info.atom_residue[at]]
        ok = row >= 0
        out[row[ok][::-1], k] = at[ok][::-1]  # first atom of that name wins
    return out


def representative_atoms(info: mp.ResidueInfo, residues: np.ndarray) -> np.ndarray:
    """CB of each residue, CA for glycine (QS-score's representative atom); -1 where missing."""
    t = atom_table(info, residues, ("CB", "CA"))
    gly = info.std_resname[residues] == "GLY"
    return np.where(gly, t[:, 1], t[:, 0])


def heavy_atoms(s, info: mp.ResidueInfo, residues: np.ndarray) -> np.ndarray:
    """Heavy atoms of the given residues."""
    keep = ~np.isin(s.atoms.element, ("H", "D", "h", "d")) & np.isin(info.atom_residue, residues)
    return np.flatnonzero(keep)
