"""Matching the residues and atoms of models to a reference, for TM-score, GDT and lDDT.

Models come as Structures (one per file, possibly many frames), paths, or bare coordinate arrays. A
Structure model is matched to the reference residue by residue:

* ``mapping="resnum"`` (default): equal (chain, residue number, insertion code), the TMscore program's
  rule. Chains are paired by identifier; when the model and the reference each have one chain, the two
  are paired whatever their identifiers (a CASP model has a blank chain). A blank chain id falls back
  to the segment id (MD files write the chain into the segid).
* ``mapping="sequence"``: a global alignment of each chain pair's sequences (Biopython's
  PairwiseAligner, BLOSUM62, gap open -11, extend -1); aligned columns are matched, identical or not.
* an explicit mapping: an integer array of shape (K, 2) holding (model residue index, reference
  residue index) pairs, 0-based into ``Structure.residues`` (or a list of such arrays, one per model).

Atoms are then matched by name within matched residues. MD names are read as their PDB equivalents so
that no residue or atom is dropped: residue names go through ``std_resname`` (HSD/HSE/HSP -> HIS,
CYX -> CYS, ...), and CHARMM/GROMOS atom names are translated (ILE CD -> CD1, OT1/OC1/O1 -> O,
OT2/OC2/O2 -> OXT). Bare arrays are matched by index.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from .._array import is_cupy_array, is_torch_tensor
from ..errors import InputError
from ..structure import AMINO_ACIDS, WATER_RESNAMES, Structure

# C-terminal oxygens as CHARMM (OT1/OT2), GROMOS (O1/O2) and GROMACS/OPLS (OC1/OC2) write them.
_TERMINAL_ALIASES = {"OT1": "O", "OT2": "OXT", "OC1": "O", "OC2": "OXT", "O1": "O", "O2": "OXT", "OXT": "OXT"}
# Side-chain atoms whose force-field name differs from the PDB's.
_RESIDUE_ATOM_ALIASES = {("ILE", "CD"): "CD1"}

ONE_LETTER = {
    "ALA": "A", "ARG": "R", "ASN": "N", "ASP": "D", "CYS": "C", "GLN": "Q", "GLU": "E", "GLY": "G",
    "HIS": "H", "ILE": "I", "LEU": "L", "LYS": "K", "MET": "M", "PHE": "F", "PRO": "P", "SER": "S",
    "THR": "T", "TRP": "W", "TYR": "Y", "VAL": "V", "SEC": "U", "PYL": "O",
}

#: Atom pairs whose names can be swapped without changing the residue (OpenStructure's list).
SYMMETRIC_ATOMS = {
    "ASP": (("OD1", "OD2"),),
    "GLU": (("OE1", "OE2"),),
    "LEU": (("CD1", "CD2"),),
    "VAL": (("CG1", "CG2"),),
    "ARG": (("NH1", "NH2"),),
    "PHE": (("CD1", "CD2"), ("CE1", "CE2")),
    "TYR": (("CD1", "CD2"), ("CE1", "CE2")),
}


# --------------------------------------------------------------------------------------------------
# Inputs


def is_array(x) -> bool:
    """True for NumPy/CuPy arrays and torch tensors (coordinates given without a topology)."""
    return isinstance(x, np.ndarray) or is_cupy_array(x) or is_torch_tensor(x)


def as_structure(x, what: str) -> Structure:
    """Load a path or pass a Structure through; anything else is an error naming ``what``."""
    if isinstance(x, Structure):
        return x
    if isinstance(x, (str, os.PathLike)):
        from ..io import load

        return load(x)
    raise InputError(f"{what}: expected a Structure, a file path or a coordinate array, got {type(x).__name__}")


def source_name(s: Structure, fallback: str) -> str:
    """A short name for messages and result rows: the file name, else ``fallback``."""
    return os.path.basename(str(s.source)) if s.source else fallback


# --------------------------------------------------------------------------------------------------
# Residues and atoms of a Structure


@dataclass(frozen=True, eq=False)
class ResidueInfo:
    """Per-residue facts of one Structure that matching needs (arrays of length R)."""

    chain: np.ndarray  # chain id, or the segid where the chain is blank
    resid: np.ndarray
    icode: np.ndarray
    std_resname: np.ndarray
    polymer: np.ndarray  # bool: amino acid, or any non-water ATOM-record residue
    protein: np.ndarray  # bool: a (standard or mapped) amino acid
    ca_atom: np.ndarray  # int64 atom index of the residue's CA, -1 if none (or not a polymer residue)
    atom_name: np.ndarray  # per atom: PDB-normalised name
    atom_residue: np.ndarray  # per atom: residue index
    cache: dict = field(default_factory=dict, repr=False)  # derived lookups, built once (reference)

    def keys(self) -> list:
        """(chain, resid, icode) of every residue, as a list of tuples."""
        k = self.cache.get("keys")
        if k is None:
            k = list(zip(self.chain.tolist(), self.resid.tolist(), self.icode.tolist(), strict=True))
            self.cache["keys"] = k
        return k

    def key_index(self) -> dict:
        """(chain, resid, icode) -> first polymer residue with that key."""
        d = self.cache.get("key_index")
        if d is None:
            d = {}
            keys = self.keys()
            for i in np.flatnonzero(self.polymer).tolist():
                d.setdefault(keys[i], i)
            self.cache["key_index"] = d
        return d


def residue_info(s: Structure) -> ResidueInfo:
    """Collect :class:`ResidueInfo` for ``s`` (vectorised over atoms)."""
    a = s.atoms
    res = s.residues
    chain = np.where(res.chain != "", res.chain, res.segid)
    std = np.char.upper(res.std_resname)
    protein = np.isin(std, list(AMINO_ACIDS))
    hetero = a.hetero[res.atom_start] if len(a) else np.zeros(0, bool)
    water = np.isin(np.char.upper(res.resname), list(WATER_RESNAMES))
    polymer = protein | (~hetero & ~water)
    uniq, inverse = a.codes("name", upper=True)  # upper-case the distinct names only
    names = normalized_atom_names(uniq[inverse], std[a.residue_index])
    ca_atom = np.full(len(res), -1, dtype=np.int64)
    is_ca = names == "CA"
    ca_idx = np.flatnonzero(is_ca)
    # first CA of each residue (reverse assignment so the first one wins)
    ca_atom[a.residue_index[ca_idx[::-1]]] = ca_idx[::-1]
    ca_atom[~polymer] = -1
    return ResidueInfo(chain=chain, resid=res.resid.astype(np.int64), icode=res.icode, std_resname=std,
                       polymer=polymer, protein=protein, ca_atom=ca_atom, atom_name=names,
                       atom_residue=a.residue_index.astype(np.int64))


def normalized_atom_names(names: np.ndarray, std_resnames: np.ndarray) -> np.ndarray:
    """PDB names for force-field atom names (per atom; ``names`` upper-case, ``std_resnames`` per atom)."""
    names = np.asarray(names, dtype=str)
    if names.size == 0:
        return names.copy()
    out = names.copy()
    for alias, pdb in _TERMINAL_ALIASES.items():
        hit = names == alias
        if hit.any():
            out[hit & np.isin(std_resnames, list(AMINO_ACIDS))] = pdb
    for (resname, alias), pdb in _RESIDUE_ATOM_ALIASES.items():
        out[(names == alias) & (std_resnames == resname)] = pdb
    return out


# --------------------------------------------------------------------------------------------------
# Residue matching


def _chain_order(chains: np.ndarray, mask: np.ndarray) -> list[str]:
    seen: dict[str, None] = {}
    for c in chains[mask].tolist():
        seen.setdefault(c, None)
    return list(seen)


def chain_map(model: ResidueInfo, ref: ResidueInfo, source: str) -> dict[str, str]:
    """Pair model chains with reference chains (model id -> reference id).

    One chain each: paired regardless of ids. Otherwise chains pair by equal id; model chains absent
    from the reference are ignored. No pair at all is an :class:`InputError` naming ``source``.
    """
    mc = _chain_order(model.chain, model.polymer)
    rc = _chain_order(ref.chain, ref.polymer)
    if not mc or not rc:
        what = "model" if not mc else "reference"
        raise InputError(f"{source}: the {what} has no protein or polymer residue to score")
    if len(mc) == 1 and len(rc) == 1:
        return {mc[0]: rc[0]}
    pairs = {c: c for c in mc if c in rc}
    if not pairs:
        raise InputError(
            f"{source}: chains cannot be matched: model chains {mc} vs reference chains {rc}; rename the "
            "chains or pass an explicit mapping"
        )
    return pairs


def _aligner():
    from Bio import Align
    from Bio.Align import substitution_matrices

    aligner = Align.PairwiseAligner()
    aligner.mode = "global"
    aligner.substitution_matrix = substitution_matrices.load("BLOSUM62")
    aligner.open_gap_score = -11
    aligner.extend_gap_score = -1
    return aligner


def _sequence(std: np.ndarray) -> str:
    return "".join(ONE_LETTER.get(r, "X") for r in std.tolist())


def map_residues(model: ResidueInfo, ref: ResidueInfo, mapping, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Matched residue pairs, sorted by reference residue.

    Parameters
    ----------
    model, ref : ResidueInfo
    mapping : {"resnum", "sequence"} or array_like of int, shape (K, 2)
        See the module docstring.
    source : str
        The model's name, for error messages.

    Returns
    -------
    model_res, ref_res : np.ndarray of int64, shape (K,)
        Residue indices into the model's and the reference's residue tables; each residue at most once.
    """
    if isinstance(mapping, str):
        if mapping not in ("resnum", "sequence"):
            raise InputError(f"mapping must be 'resnum', 'sequence' or an array of residue index pairs, "
                             f"not {mapping!r}")
        cmap = chain_map(model, ref, source)
        mres: list[int] = []
        rres: list[int] = []
        if mapping == "resnum":
            ref_keys = ref.key_index()
            mkeys = model.keys()
            same = all(k == v for k, v in cmap.items())
            for i in np.flatnonzero(model.polymer).tolist():
                key = mkeys[i]
                if not same:
                    rc = cmap.get(key[0])
                    if rc is None:
                        continue
                    key = (rc, key[1], key[2])
                j = ref_keys.get(key)
                if j is not None:
                    mres.append(i)
                    rres.append(j)
        else:
            aligner = _aligner()
            for mc, rc in cmap.items():
                mi = np.flatnonzero(model.polymer & (model.chain == mc))
                ri = np.flatnonzero(ref.polymer & (ref.chain == rc))
                aln = aligner.align(_sequence(model.std_resname[mi]), _sequence(ref.std_resname[ri]))[0]
                for (m0, m1), (r0, r1) in zip(*aln.aligned, strict=True):
                    mres.extend(mi[m0:m1].tolist())
                    rres.extend(ri[r0:r1].tolist())
        model_res = np.asarray(mres, dtype=np.int64)
        ref_res = np.asarray(rres, dtype=np.int64)
    else:
        pairs = np.asarray(mapping)
        if pairs.ndim != 2 or pairs.shape[1] != 2 or (pairs.size and pairs.dtype.kind not in "iu"):
            raise InputError(f"{source}: an explicit mapping must be an integer array of shape (K, 2) of "
                             f"(model residue, reference residue) indices, got shape {pairs.shape}")
        pairs = pairs.astype(np.int64)
        if pairs.size and (pairs[:, 0].min() < 0 or pairs[:, 0].max() >= len(model.resid)
                           or pairs[:, 1].min() < 0 or pairs[:, 1].max() >= len(ref.resid)):
            raise InputError(f"{source}: explicit mapping has residue indices out of range "
                             f"(model has {len(model.resid)}, reference {len(ref.resid)} residues)")
        model_res, ref_res = pairs[:, 0], pairs[:, 1]
    # one partner per residue, in reference order
    _, first = np.unique(ref_res, return_index=True)
    keep = np.zeros(len(ref_res), bool)
    keep[first] = True
    _, mfirst = np.unique(model_res, return_index=True)
    mkeep = np.zeros(len(model_res), bool)
    mkeep[mfirst] = True
    keep &= mkeep
    model_res, ref_res = model_res[keep], ref_res[keep]
    order = np.argsort(ref_res, kind="stable")
    return model_res[order], ref_res[order]


# --------------------------------------------------------------------------------------------------
# What TM-score and lDDT need from a (model topology, reference) pair


@dataclass(frozen=True)
class CAMatch:
    """CA pairs of one model topology against the reference.

    Attributes
    ----------
    model_atoms : np.ndarray of int64, shape (K,)
        Atom indices of the model's CAs, in reference residue order.
    ref_pos : np.ndarray of int64, shape (K,)
        Positions of the matched residues in the reference's CA list (0..L_N-1), increasing.
    n_model : int
        Model residues with a CA (the TMscore program's model length).
    n_skipped : int
        Model polymer residues without a CA atom, skipped as the TMscore program skips them.
    """

    model_atoms: np.ndarray
    ref_pos: np.ndarray
    n_model: int
    n_skipped: int


def reference_ca(ref: ResidueInfo) -> np.ndarray:
    """Residue indices of the reference residues that count for TM-score (those with a CA)."""
    return np.flatnonzero(ref.ca_atom >= 0)


def match_ca(model: ResidueInfo, ref: ResidueInfo, mapping, source: str) -> CAMatch:
    """Match the model's CA atoms to the reference's (see :func:`map_residues`)."""
    mres, rres = map_residues(model, ref, mapping, source)
    ref_ca_res = reference_ca(ref)
    pos_of_res = np.full(len(ref.resid), -1, dtype=np.int64)
    pos_of_res[ref_ca_res] = np.arange(len(ref_ca_res))
    ok = (model.ca_atom[mres] >= 0) & (pos_of_res[rres] >= 0)
    n_model = int((model.ca_atom >= 0).sum())
    n_skipped = int((model.polymer & (model.ca_atom < 0)).sum())
    return CAMatch(model_atoms=model.ca_atom[mres[ok]], ref_pos=pos_of_res[rres[ok]], n_model=n_model,
                   n_skipped=n_skipped)


def lddt_reference_atoms(ref: ResidueInfo, s: Structure, atoms: str) -> np.ndarray:
    """Atom indices of the reference atoms lDDT scores: heavy atoms (or CAs) of polymer residues."""
    if atoms == "ca":
        return np.sort(ref.ca_atom[ref.ca_atom >= 0])
    if atoms != "heavy":
        raise InputError(f"atoms must be 'heavy' or 'ca', not {atoms!r}")
    el = np.char.upper(s.atoms.element)
    heavy = (el != "H") & (el != "D")
    return np.flatnonzero(heavy & ref.polymer[ref.atom_residue])


def match_atoms(model: ResidueInfo, ref: ResidueInfo, ref_atoms: np.ndarray, mapping, source: str):
    """Match model atoms to the scored reference atoms, by name within matched residues.

    Returns
    -------
    model_atoms : np.ndarray of int64, shape (A,)
        Model atom indices.
    slots : np.ndarray of int64, shape (A,)
        Positions of the matched atoms in ``ref_atoms``.
    n_matched_residues : int
        Number of reference residues with a matched model residue.
    """
    mres, rres = map_residues(model, ref, mapping, source)
    res_of_model_res = np.full(len(model.resid), -1, dtype=np.int64)
    res_of_model_res[mres] = rres
    # integer keys (reference residue, atom name code) for the scored reference atoms
    names = np.concatenate([ref.atom_name[ref_atoms], model.atom_name])
    _, codes = np.unique(names, return_inverse=True)
    n_codes = int(codes.max()) + 1 if codes.size else 1
    ref_keys = ref.atom_residue[ref_atoms] * n_codes + codes[: len(ref_atoms)]
    order = np.argsort(ref_keys, kind="stable")
    sorted_keys = ref_keys[order]
    m_res = res_of_model_res[model.atom_residue]
    m_keys = m_res * n_codes + codes[len(ref_atoms):]
    pos = np.searchsorted(sorted_keys, m_keys)
    pos_c = np.minimum(pos, max(len(sorted_keys) - 1, 0))
    if len(sorted_keys):
        hit = (m_res >= 0) & (sorted_keys[pos_c] == m_keys)
    else:
        hit = np.zeros(len(m_keys), dtype=bool)
    model_atoms = np.flatnonzero(hit)
    slots = order[pos_c[hit]]
    # an atom name twice in one residue (altlocs kept as atoms): first one wins
    _, first = np.unique(slots, return_index=True)
    return model_atoms[first], slots[first], int(len(np.unique(rres)))
