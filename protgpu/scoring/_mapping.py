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

Matching is cached: the models of one target usually share their atom table (the same residues and
atom names, only the coordinates differ), so :func:`residue_info`, :func:`map_residues`,
:func:`match_ca` and :func:`match_atoms` key their results by :func:`topology_key` (a sha256 of the
atom-table arrays that matching reads) and compute them once per distinct table and reference, per
process. A model whose table differs in any of those arrays gets its own entry.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

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
# Caches keyed by atom table

def topology_key(s: Structure) -> bytes:
    """A digest of what matching reads from an atom table, for caching matches across models.

    Parameters
    ----------
    s : Structure

    Returns
    -------
    bytes
        32 bytes: sha256 over every atom's ``residue_index`` and ``name``, and over ``chain``,
        ``segid``, ``resid``, ``icode``, ``resname`` and ``hetero`` of each residue's first atom - exactly
        what :func:`residue_info` reads (each field with its dtype and length). Two structures with equal
        keys have equal residue tables and atom names, hence equal matches to any reference.
    """
    a = s.atoms
    ri = a.residue_index
    first = np.ones(len(ri), dtype=bool)
    first[1:] = ri[1:] != ri[:-1]
    starts = np.flatnonzero(first)
    h = hashlib.sha256()
    for tag, arr in (("ri", ri), ("name", a.name), ("chain", a.chain[starts]), ("segid", a.segid[starts]),
                     ("resid", a.resid[starts]), ("icode", a.icode[starts]), ("resname", a.resname[starts]),
                     ("hetero", a.hetero[starts])):
        arr = np.ascontiguousarray(arr)
        h.update(f"{tag}:{arr.dtype.str}:{len(arr)};".encode())
        h.update(memoryview(arr).cast("B"))
    return h.digest()


def array_key(a: np.ndarray) -> bytes:
    """sha256 of an index array's dtype, shape and bytes (cache keys for atom selections)."""
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.dtype.str}:{a.shape};".encode())
    h.update(memoryview(a).cast("B"))
    return h.digest()


class _LRU:
    """A small thread-safe least-recently-used cache (parse threads and the compute thread share it)."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key):
        with self._lock:
            v = self._d.get(key)
            if v is None:
                self.misses += 1
                return None
            self._d.move_to_end(key)
            self.hits += 1
            return v

    def put(self, key, value):
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.maxsize:
                self._d.popitem(last=False)
        return value

    def clear(self):
        with self._lock:
            self._d.clear()
            self.hits = self.misses = 0


_INFO_CACHE = _LRU(64)  # topology key -> ResidueInfo
_MATCH_CACHE = _LRU(256)  # (what, model key, reference key, mapping[, atoms key]) -> match


def clear_caches() -> None:
    """Forget every cached residue table and match (tests; memory)."""
    _INFO_CACHE.clear()
    _MATCH_CACHE.clear()


def _frozen(*arrays):
    # cached arrays are shared by every model with the same table: nobody may write into them
    for a in arrays:
        a.setflags(write=False)
    return arrays


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
    key: bytes = b""  # topology_key of the structure (b"": not cached, e.g. built by hand)


def residue_info(s: Structure) -> ResidueInfo:
    """Collect :class:`ResidueInfo` for ``s`` (vectorised over atoms), cached by :func:`topology_key`.

    Structures with equal atom tables share one (read-only) ResidueInfo.
    """
    key = topology_key(s)
    info = _INFO_CACHE.get(key)
    if info is None:
        info = _INFO_CACHE.put(key, _residue_info(s, key))
    return info


def _residue_info(s: Structure, key: bytes) -> ResidueInfo:
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
    arrays = _frozen(chain, res.resid.astype(np.int64), np.array(res.icode), std, polymer, protein, ca_atom, names,
                     a.residue_index.astype(np.int64))
    return ResidueInfo(*arrays, key=key)


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
    """Distinct chains of the masked residues, in order of first appearance."""
    uniq, first = np.unique(chains[mask], return_index=True)
    return uniq[np.argsort(first)].tolist()


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


_ALIGNERS = threading.local()  # one aligner per thread: building one reads BLOSUM62 from disk


def aligner(free_end_gaps: bool = False):
    """This thread's Biopython ``PairwiseAligner``: global, BLOSUM62, gap open -11, extend -1; with
    ``free_end_gaps`` semi-global (overhangs cost nothing: the complexes' chain mapper, as OpenStructure's)."""
    key = "semiglobal" if free_end_gaps else "global"
    found = getattr(_ALIGNERS, key, None)
    if found is not None:
        return found
    from Bio import Align
    from Bio.Align import substitution_matrices

    found = Align.PairwiseAligner()
    found.mode = "global"
    found.substitution_matrix = substitution_matrices.load("BLOSUM62")
    found.open_gap_score = -11
    found.extend_gap_score = -1
    if free_end_gaps:
        found.end_gap_score = 0
    setattr(_ALIGNERS, key, found)
    return found


def _sequence(std: np.ndarray) -> str:
    return "".join(ONE_LETTER.get(r, "X") for r in std.tolist())


def _resnum_pairs(model: ResidueInfo, ref: ResidueInfo, cmap: dict) -> tuple[np.ndarray, np.ndarray]:
    """(model residue, reference residue) pairs of equal (chain, resid, icode), in model order; each
    model polymer residue whose chain is paired meets the first reference polymer residue of its key."""
    mi = np.flatnonzero(model.polymer)
    ri = np.flatnonzero(ref.polymer)
    # the model's chains renamed to their reference partners; unpaired chains drop out
    mchain = model.chain[mi]
    paired = np.isin(mchain, list(cmap))
    mi, mchain = mi[paired], mchain[paired]
    if any(k != v for k, v in cmap.items()):
        uniq, inv = np.unique(mchain, return_inverse=True)
        mchain = np.asarray([cmap[c] for c in uniq.tolist()], dtype=ref.chain.dtype)[inv.ravel()] if len(uniq) \
            else mchain
    if not len(mi) or not len(ri):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # one integer per (chain, icode, resid): string parts as codes into their sorted distinct values
    chains, chain_code = np.unique(np.concatenate([ref.chain[ri], mchain]), return_inverse=True)
    icodes, icode_code = np.unique(np.concatenate([ref.icode[ri], model.icode[mi]]), return_inverse=True)
    resid = np.concatenate([ref.resid[ri], model.resid[mi]]).astype(np.int64)
    lo = int(resid.min())
    span = int(resid.max()) - lo + 1
    key = (chain_code.ravel() * len(icodes) + icode_code.ravel()) * span + (resid - lo)
    rkey, mkey = key[: len(ri)], key[len(ri):]
    uniq, first = np.unique(rkey, return_index=True)  # first reference residue of each key
    pos = np.minimum(np.searchsorted(uniq, mkey), len(uniq) - 1)
    hit = uniq[pos] == mkey
    return mi[hit].astype(np.int64), ri[first[pos[hit]]].astype(np.int64)


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
        ck = ("residues", model.key, ref.key, mapping) if model.key and ref.key else None
        hit = _MATCH_CACHE.get(ck) if ck is not None else None
        if hit is not None:
            return hit
        cmap = chain_map(model, ref, source)
        if mapping == "resnum":
            model_res, ref_res = _resnum_pairs(model, ref, cmap)
        else:
            mres: list[np.ndarray] = []
            rres: list[np.ndarray] = []
            seq_aligner = aligner()
            for mc, rc in cmap.items():
                mi = np.flatnonzero(model.polymer & (model.chain == mc))
                ri = np.flatnonzero(ref.polymer & (ref.chain == rc))
                aln = seq_aligner.align(_sequence(model.std_resname[mi]), _sequence(ref.std_resname[ri]))[0]
                for (m0, m1), (r0, r1) in zip(*aln.aligned, strict=True):
                    mres.append(mi[m0:m1])
                    rres.append(ri[r0:r1])
            model_res = np.concatenate(mres).astype(np.int64) if mres else np.zeros(0, np.int64)
            ref_res = np.concatenate(rres).astype(np.int64) if rres else np.zeros(0, np.int64)
        out = _one_to_one(model_res, ref_res)
        return _MATCH_CACHE.put(ck, _frozen(*out)) if ck is not None else out
    pairs = np.asarray(mapping)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or (pairs.size and pairs.dtype.kind not in "iu"):
        raise InputError(f"{source}: an explicit mapping must be an integer array of shape (K, 2) of "
                         f"(model residue, reference residue) indices, got shape {pairs.shape}")
    pairs = pairs.astype(np.int64)
    if pairs.size and (pairs[:, 0].min() < 0 or pairs[:, 0].max() >= len(model.resid)
                       or pairs[:, 1].min() < 0 or pairs[:, 1].max() >= len(ref.resid)):
        raise InputError(f"{source}: explicit mapping has residue indices out of range "
                         f"(model has {len(model.resid)}, reference {len(ref.resid)} residues)")
    return _one_to_one(pairs[:, 0], pairs[:, 1])


def _one_to_one(model_res: np.ndarray, ref_res: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep the first pair of each reference and each model residue; sort by reference residue."""
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
    """Match the model's CA atoms to the reference's (see :func:`map_residues`); cached for string
    mappings (the arrays of a cached match are read-only)."""
    ck = ("ca", model.key, ref.key, mapping) if model.key and ref.key and isinstance(mapping, str) else None
    hit = _MATCH_CACHE.get(ck) if ck is not None else None
    if hit is not None:
        return hit
    mres, rres = map_residues(model, ref, mapping, source)
    ref_ca_res = reference_ca(ref)
    pos_of_res = np.full(len(ref.resid), -1, dtype=np.int64)
    pos_of_res[ref_ca_res] = np.arange(len(ref_ca_res))
    ok = (model.ca_atom[mres] >= 0) & (pos_of_res[rres] >= 0)
    n_model = int((model.ca_atom >= 0).sum())
    n_skipped = int((model.polymer & (model.ca_atom < 0)).sum())
    out = CAMatch(model_atoms=model.ca_atom[mres[ok]], ref_pos=pos_of_res[rres[ok]], n_model=n_model,
                  n_skipped=n_skipped)
    if ck is None:
        return out
    _frozen(out.model_atoms, out.ref_pos)
    return _MATCH_CACHE.put(ck, out)


def lddt_reference_atoms(ref: ResidueInfo, s: Structure, atoms: str) -> np.ndarray:
    """Atom indices of the reference atoms lDDT scores: heavy atoms (or CAs) of polymer residues."""
    if atoms == "ca":
        return np.sort(ref.ca_atom[ref.ca_atom >= 0])
    if atoms != "heavy":
        raise InputError(f"atoms must be 'heavy' or 'ca', not {atoms!r}")
    el = np.char.upper(s.atoms.element)
    heavy = (el != "H") & (el != "D")
    return np.flatnonzero(heavy & ref.polymer[ref.atom_residue])


def match_atoms(model: ResidueInfo, ref: ResidueInfo, ref_atoms: np.ndarray, mapping, source: str,
                atoms_key: bytes | None = None):
    """Match model atoms to the scored reference atoms, by name within matched residues.

    Returns
    -------
    model_atoms : np.ndarray of int64, shape (A,)
        Model atom indices.
    slots : np.ndarray of int64, shape (A,)
        Positions of the matched atoms in ``ref_atoms``.
    n_matched_residues : int
        Number of reference residues with a matched model residue.

    Cached for string mappings, by the two tables and the bytes of ``ref_atoms`` (``atoms_key``:
    their :func:`array_key`, when the caller has it).
    """
    ck = None
    if model.key and ref.key and isinstance(mapping, str):
        ck = ("atoms", model.key, ref.key, mapping, atoms_key or array_key(np.asarray(ref_atoms)))
        hit = _MATCH_CACHE.get(ck)
        if hit is not None:
            return hit
    out = _match_atoms(model, ref, ref_atoms, mapping, source)
    if ck is None:
        return out
    _frozen(out[0], out[1])
    return _MATCH_CACHE.put(ck, out)


def _match_atoms(model: ResidueInfo, ref: ResidueInfo, ref_atoms: np.ndarray, mapping, source: str):
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
