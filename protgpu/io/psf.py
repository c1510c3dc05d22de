"""CHARMM/NAMD/X-PLOR PSF topologies, read by protgpu: the atom table of the ``!NATOM`` section with
the atom names as the file writes them.

mdtraj translates PSF names to PDB names (``CD`` of isoleucine becomes ``CD1``), while protgpu's
PDB and mmCIF readers keep the file's names, as MDAnalysis does; reading the PSF here keeps one
convention, so a trajectory loaded with a PSF and the same molecule's CHARMM PDB have the same
atoms. Elements come from the masses (a mass below 0.5, a virtual site or lone pair, has none).
Internal API: :func:`read_psf`.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..structure import AMINO_ACIDS, WATER_RESNAMES, AtomTable, guess_elements, standardize_resnames
from ._files import read_bytes

# Standard atomic masses of the elements biomolecular PSFs hold.
_MASSES = {
    "H": 1.008, "C": 12.011, "N": 14.007, "O": 15.999, "F": 18.998, "NA": 22.990, "MG": 24.305, "P": 30.974,
    "S": 32.06, "CL": 35.45, "K": 39.098, "CA": 40.078, "MN": 54.938, "FE": 55.845, "CO": 58.933, "NI": 58.693,
    "CU": 63.546, "ZN": 65.38, "SE": 78.971, "BR": 79.904, "RB": 85.468, "CS": 132.91, "I": 126.90,
}
_SYMBOLS = np.array(list(_MASSES))
_VALUES = np.array(list(_MASSES.values()))


def read_psf(path: str) -> AtomTable:
    """The atom table of a PSF file (names, residues and segments as written; elements from masses).

    Raises
    ------
    InputError
        No ``!NATOM`` section, a malformed atom line (with its line number), or fewer atom lines
        than the section declares.
    """
    lines = read_bytes(path).decode("latin-1").splitlines()
    start = next((i for i, ln in enumerate(lines) if "!NATOM" in ln), None)
    if start is None:
        raise InputError(f"{path}: no !NATOM section (not a PSF file?)")
    try:
        n = int(lines[start].split()[0])
    except (IndexError, ValueError):
        raise InputError(f"{path}: line {start + 1}: bad !NATOM count") from None
    if n <= 0:
        raise InputError(f"{path}: no atoms")
    rows = lines[start + 1 : start + 1 + n]
    if len(rows) < n:
        raise InputError(f"{path}: truncated: !NATOM declares {n} atoms but {len(rows)} lines follow")
    segid, resid, icode, resname, name, mass = [], [], [], [], [], []
    for k, line in enumerate(rows):
        f = line.split()
        try:
            seq = f[2]
            digits = seq.rstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
            resid.append(int(digits))
            icode.append(seq[len(digits):][:1])
            segid.append(f[1])
            resname.append(f[3])
            name.append(f[4])
            mass.append(float(f[7]))
        except (IndexError, ValueError):
            raise InputError(f"{path}: line {start + 2 + k}: bad atom record {line.strip()[:60]!r}") from None
    resname_a = np.asarray(resname, dtype=str)
    name_a = np.asarray(name, dtype=str)
    element = _elements(np.asarray(mass), name_a, resname_a)
    std = standardize_resnames(resname_a)
    polymer = np.isin(std, list(AMINO_ACIDS)) | np.isin(resname_a, list(WATER_RESNAMES))
    return AtomTable(
        name=name_a, element=element, resname=resname_a, resid=np.asarray(resid, dtype=np.int32),
        icode=np.asarray(icode, dtype=str), chain=np.full(n, ""), segid=np.asarray(segid, dtype=str),
        hetero=~polymer,
    )


def _elements(mass: np.ndarray, name: np.ndarray, resname: np.ndarray) -> np.ndarray:
    """Element of the nearest standard mass (within 0.5 u); "" below 0.5 u (virtual sites, lone
    pairs); a name-based guess for masses matching none (heavy hydrogens, united atoms)."""
    near = np.abs(mass[:, None] - _VALUES[None, :])
    best = near.argmin(axis=1)
    out = _SYMBOLS[best].astype("<U2")
    guess = near[np.arange(mass.size), best] > 0.5
    if guess.any():
        out[guess] = guess_elements(np.char.add(" ", name[guess]), resname[guess])
    out[mass < 0.5] = ""
    return out
