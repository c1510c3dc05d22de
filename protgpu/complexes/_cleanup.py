"""The clean-up OpenStructure's Scorer applies before scoring (its Molck step), as far as it changes
protein scores: hydrogens are dropped, and a modified residue mapped to its parent amino acid
(CME -> CYS, NEP -> HIS, MSE -> MET, ...; protgpu's ``std_resname``) keeps only the atoms its parent
has (``map_nonstd_res``), so that atoms no model of the parent can have do not count against it.
"""

from __future__ import annotations

import numpy as np

from ..scoring import _mapping as mp

_BACKBONE = ("N", "CA", "C", "O", "OXT")
#: Heavy atoms of the 20 standard amino acids beyond the backbone (PDB names).
SIDE_CHAINS = {
    "ALA": "CB", "ARG": "CB CG CD NE CZ NH1 NH2", "ASN": "CB CG OD1 ND2", "ASP": "CB CG OD1 OD2",
    "CYS": "CB SG", "GLN": "CB CG CD OE1 NE2", "GLU": "CB CG CD OE1 OE2", "GLY": "",
    "HIS": "CB CG ND1 CD2 CE1 NE2", "ILE": "CB CG1 CG2 CD1", "LEU": "CB CG CD1 CD2",
    "LYS": "CB CG CD CE NZ", "MET": "CB CG SD CE", "PHE": "CB CG CD1 CD2 CE1 CE2 CZ",
    "PRO": "CB CG CD", "SER": "CB OG", "THR": "CB OG1 CG2", "TRP": "CB CG CD1 CD2 NE1 CE2 CE3 CZ2 CZ3 CH2",
    "TYR": "CB CG CD1 CD2 CE1 CE2 CZ OH", "VAL": "CB CG1 CG2",
}
PARENT_ATOMS = {res: frozenset(_BACKBONE + tuple(sc.split())) for res, sc in SIDE_CHAINS.items()}


def clean_keep(s):
    """The atoms :func:`clean` keeps: a boolean mask of shape (atoms,), or None when it keeps all."""
    info = mp.residue_info(s)
    el = np.char.upper(s.atoms.element)
    keep = (el != "H") & (el != "D")
    raw = np.char.upper(s.atoms.resname.astype(str))
    std = info.std_resname[info.atom_residue]
    modified = info.protein[info.atom_residue] & (raw != std) & np.isin(std, list(PARENT_ATOMS))
    for parent in np.unique(std[modified]).tolist():
        hit = modified & (std == parent)
        keep[hit] &= np.isin(info.atom_name[hit], list(PARENT_ATOMS[parent]))
    return None if keep.all() else keep


def clean(s):
    """``s`` without hydrogens and without the atoms of modified residues that their parent lacks
    (the same Structure when nothing is dropped)."""
    keep = clean_keep(s)
    return s if keep is None else s.select(keep)
