"""Which atoms each residue contributes under a residue-distance scheme, which residues a map holds,
and which residue pairs it includes (mdtraj's ``compute_contacts`` conventions; the reasoning is in
``docs/design/contacts.md``).

Schemes (``SCHEMES``):

``"ca"``
    distance between the two CA atoms (a residue with no CA has no distance: +inf).
``"closest"``
    minimum over all atom pairs, hydrogens included.
``"closest-heavy"``
    minimum over pairs of non-hydrogen atoms (element not H or D).
``"sidechain"``
    minimum over side-chain atoms: every atom of an amino acid except N, CA, C, O, H and HA (and the
    aliases mdtraj's PDB reader renames to them), as mdtraj's ``Atom.is_sidechain``; so OXT, the
    N-terminal H2/H3 and glycine's HA2/HA3 count as side chain.
``"sidechain-heavy"``
    the side-chain atoms that are not hydrogens, except for glycine, which uses its side-chain
    hydrogens (HA2/HA3); without hydrogens in the file a glycine's distances are +inf.

Residues (``residues=None``): those with an atom named CA that is not a calcium ion. Excluded pairs: the
diagonal, and same-chain pairs (chain id, segment id) closer than ``min_separation`` in residue index
(the position in the structure); pairs from different chains only with ``inter_chain=True``.

Internal API (tests, benchmarks): :func:`scheme_atoms`, :func:`residue_keys`, :func:`allowed_pairs`,
:func:`allowed_block`.
"""

from __future__ import annotations

import numpy as np

from .._array import to_numpy
from ..errors import InputError
from .maps import ResidueLabels

SCHEMES = ("ca", "closest", "closest-heavy", "sidechain", "sidechain-heavy")

# Atom names mdtraj's Atom.is_sidechain rejects (C, CA, N, O, HA, H), plus the aliases its PDB reader
# renames to H or O before that test (mdtraj/formats/pdb/data/pdbNames.xml, "Protein" section).
_NOT_SIDECHAIN = ("C", "CA", "N", "O", "HA", "H", "HN", "H1", "1H", "HN1", "HT1", "O1", "OT1", "OCT1", "OC1")
_HYDROGEN = ("H", "D")


def _upper(a: np.ndarray) -> np.ndarray:
    return np.char.upper(np.char.strip(np.asarray(a, dtype=str)))


def _select_residues(structure, residues, has_ca: np.ndarray) -> np.ndarray:
    n_res = structure.n_residues
    where = structure.source or "structure"
    if residues is None:
        sel = np.flatnonzero(has_ca)
    elif isinstance(residues, str) and residues.strip().lower() == "all":
        sel = np.arange(n_res)
    elif isinstance(residues, str):
        atoms = structure.select_indices(residues)
        sel = np.unique(structure.atoms.residue_index[atoms])
    else:
        arr = np.asarray(to_numpy(residues))
        if arr.dtype == bool:
            if arr.shape != (n_res,):
                raise InputError(f"{where}: residues mask has shape {arr.shape}, expected ({n_res},)")
            sel = np.flatnonzero(arr)
        elif arr.size == 0 or (arr.ndim == 1 and arr.dtype.kind in "iu"):
            sel = np.unique(arr.astype(np.int64))
            if sel.size and (sel[0] < 0 or sel[-1] >= n_res):
                raise InputError(f"{where}: residue index out of range 0..{n_res - 1}")
        else:
            raise InputError(f"{where}: residues must be None, 'all', a selection string, residue indices or a mask")
    if sel.size == 0:
        what = "no residue has a CA atom" if residues is None else f"residues={residues!r} selects no residue"
        raise InputError(f"{where}: {what}")
    return sel.astype(np.int64)


def scheme_atoms(structure, scheme: str = "closest-heavy", residues=None):
    """The atoms each residue contributes to its residue distance under ``scheme``.

    Parameters
    ----------
    structure : Structure
    scheme : {"ca", "closest", "closest-heavy", "sidechain", "sidechain-heavy"}
        See this module's notes for the atoms of each scheme and the glycine case.
    residues : None, "all", str, array of int or bool mask, optional
        ``None``: residues with a CA atom (mdtraj's protein residues); ``"all"``: every residue; a
        selection string: the residues with at least one selected atom (all their atoms then count
        under the scheme); residue indices (sorted and made unique) or a mask over residues.

    Returns
    -------
    residue_index : np.ndarray of int64, shape (R,)
        Residues of the map (indices into ``structure.residues``), ascending.
    atom_idx : np.ndarray of int32, shape (A,)
        Atom indices, grouped by residue in map order.
    starts : np.ndarray of int32, shape (R + 1,)
        ``atom_idx[starts[r]:starts[r + 1]]`` are residue r's atoms (possibly none).

    Raises
    ------
    InputError
        Unknown scheme, empty residue selection, or (scheme ``"ca"``) a residue with two CA atoms.
    """
    if scheme not in SCHEMES:
        raise InputError(f"scheme must be one of {', '.join(SCHEMES)}, not {scheme!r}")
    atoms = structure.atoms
    ri = np.asarray(atoms.residue_index, dtype=np.int64)
    n_res = structure.n_residues
    names = _upper(atoms.name)
    element = _upper(atoms.element)
    is_ca = (names == "CA") & (element != "CA")  # a calcium ion named CA is not an alpha carbon
    has_ca = np.zeros(n_res, dtype=bool)
    has_ca[ri[is_ca]] = True
    res_sel = _select_residues(structure, residues, has_ca)
    is_h = np.isin(element, _HYDROGEN)
    if scheme == "ca":
        mask = is_ca
        n_ca = np.bincount(ri[is_ca], minlength=n_res)
        many = np.flatnonzero(n_ca[res_sel] > 1)
        if many.size:
            r = int(res_sel[many[0]])
            lab = structure.residues.labels()[r]
            raise InputError(f"{structure.source or 'structure'}: residue {lab} has {int(n_ca[r])} CA atoms")
    elif scheme == "closest":
        mask = np.ones(len(names), dtype=bool)
    elif scheme == "closest-heavy":
        mask = ~is_h
    else:
        # Side-chain atoms belong to amino acids only; "amino acid" here is "has a CA", the same test
        # that decides which residues are in the map.
        side = ~np.isin(names, _NOT_SIDECHAIN) & has_ca[ri]
        if scheme == "sidechain":
            mask = side
        else:
            gly = np.asarray(atoms.std_resname) == "GLY"
            mask = side & (~is_h | gly)
    in_sel = np.zeros(n_res, dtype=bool)
    in_sel[res_sel] = True
    atom_idx = np.flatnonzero(mask & in_sel[ri])  # file order = grouped by residue, residues ascending
    starts = np.searchsorted(ri[atom_idx], res_sel, side="left")
    starts = np.append(starts, atom_idx.size)
    return res_sel, atom_idx.astype(np.int32), starts.astype(np.int32)


def residue_keys(structure, res_sel: np.ndarray):
    """Chain code (int32, one per distinct (chain, segid)) and labels of the selected residues."""
    table = structure.residues
    chain = np.asarray(table.chain)[res_sel]
    segid = np.asarray(table.segid)[res_sel]
    key = np.char.add(np.char.add(chain.astype(str), "\x1f"), segid.astype(str))
    _, code = np.unique(key, return_inverse=True)
    labels = ResidueLabels(
        index=res_sel.astype(np.int64),
        chain=chain,
        number=np.asarray(table.resid, dtype=np.int32)[res_sel],
        icode=np.asarray(table.icode)[res_sel],
        name=np.asarray(table.resname)[res_sel],
        segid=segid,
    )
    return code.reshape(-1).astype(np.int32), labels


def allowed_pairs(chain, seq, min_separation: int = 3, inter_chain: bool = True) -> np.ndarray:
    """Which residue pairs a map includes (the rule the kernel applies too).

    Parameters
    ----------
    chain : array_like of int, shape (R,)
        Chain code of each residue.
    seq : array_like of int, shape (R,)
        Residue index in the structure (the separation is measured on it).
    min_separation : int
        Same-chain pairs need ``|seq_i - seq_j| >= min_separation`` (and ``i != j`` always).
    inter_chain : bool
        Whether pairs of different chains are included.

    Returns
    -------
    np.ndarray of bool, shape (R, R)
        Symmetric, False on the diagonal.
    """
    chain = np.asarray(chain)
    seq = np.asarray(seq, dtype=np.int64)
    ok = allowed_block(chain, seq, chain, seq, min_separation, inter_chain)
    np.fill_diagonal(ok, False)
    return ok


def allowed_block(chain_a, seq_a, chain_b, seq_b, min_separation, inter_chain) -> np.ndarray:
    same = chain_a[:, None] == chain_b[None, :]
    sep = np.abs(seq_a[:, None] - seq_b[None, :]) >= min_separation
    return np.where(same, sep, bool(inter_chain))
