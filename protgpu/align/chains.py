"""One protein chain's CA trace and sequence from any input form, as TM-align reads a chain.

By default the first chain with a protein residue (an amino acid, or UNK: an amino acid of unknown
type) that has a CA atom, or the chain asked for; chains with no such residue before it are skipped
with a warning; protein residues without a CA atom are skipped and counted. Each frame of a
multi-frame input (a multi-model file, a trajectory) is one chain to align, as frames are models
everywhere in protgpu (TM-align itself reads only the first model: pass ``s.frames(0)`` for that).
Bare arrays are CA traces with unknown residues ('X').
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from .._array import to_numpy
from .._inputs import as_array, as_structure, check_finite, has_topology, is_array, source_name
from ..errors import InputError
from ..scoring._mapping import ONE_LETTER
from ..structure import AMINO_ACIDS

#: Fewest CA residues a chain needs (TM-align's threading needs at least 5 aligned residues).
MIN_RESIDUES = 5


class Chain(NamedTuple):
    """A chain as the aligner sees it.

    Attributes
    ----------
    ca : ndarray, float64, shape (L, 3)
        CA coordinates, Angstrom.
    sequence : str
        One letter per residue ('X' for unknown and non-standard residues without a parent).
    name : str
        The input's name for messages (file name, or argument name and list index).
    n_skipped : int
        Protein residues of the chain skipped for lack of a CA atom.
    """

    ca: np.ndarray
    sequence: str
    name: str
    n_skipped: int


def chains_of(x, what: str, chain: str | None = None) -> list[Chain]:
    """The chains of one argument: a single input gives one, a list (or an (N, L, 3) array) several.
    A :class:`Chain` (read before, e.g. from a structure database) is taken as it is."""
    if isinstance(x, Chain):
        return [x]
    if isinstance(x, (list, tuple)) and x and not _is_number_list(x):
        return [one_chain(item, f"{what}[{k}]", chain) for k, item in enumerate(x)]
    if is_array(x) and not has_topology(x):
        a = to_numpy(as_array(x, what))
        if a.ndim == 3:  # N traces: checked once, with the front door's wording (frame k, atom i)
            check_finite(a, what)
            return [_array_chain(a[k], f"{what}[{k}]", checked=True) for k in range(len(a))]
    if has_topology(x):
        return _structure_chains(as_structure(x, what), what, chain)
    return [one_chain(x, what, chain)]


def _is_number_list(x) -> bool:
    # a nested list of numbers is one (L, 3) coordinate array, not a list of inputs
    first = x[0]
    return isinstance(first, (int, float, np.number)) or (
        isinstance(first, (list, tuple)) and first and isinstance(first[0], (int, float, np.number)))


def one_chain(x, what: str, chain: str | None = None) -> Chain:
    """One chain from one input (Structure, path, mdtraj/Bio.PDB object, or an (L, 3) CA array); of a
    multi-frame Structure, the first frame; a :class:`Chain` as it is."""
    if isinstance(x, Chain):
        return x
    if has_topology(x):
        return _structure_chains(as_structure(x, what), what, chain, first_frame_only=True)[0]
    if is_array(x) or isinstance(x, (list, tuple)):
        return _array_chain(to_numpy(as_array(x, what)), what)
    raise InputError(f"{what}: expected a Structure, a file path, a Bio.PDB/mdtraj object, an (L, 3) CA "
                     f"array, or a list of these; got {type(x).__name__}")


def _array_chain(a: np.ndarray, name: str, checked: bool = False) -> Chain:
    if a.ndim != 2 or a.shape[-1] != 3:
        raise InputError(f"{name}: a CA trace must have shape (residues, 3), got {a.shape}")
    if not checked:
        check_finite(a, name)
    _check_length(len(a), name)
    return Chain(np.asarray(a, dtype=np.float64), "X" * len(a), name, 0)


def _check_length(n: int, name: str) -> None:
    if n < MIN_RESIDUES:
        raise InputError(f"{name}: {n} residue{'s' if n != 1 else ''} with a CA atom; TM-align needs at "
                         f"least {MIN_RESIDUES}")


def _structure_chains(s, what: str, chain: str | None, first_frame_only: bool = False) -> list[Chain]:
    """The chain's CA trace in every frame (or the first): the atoms are chosen once, from the table."""
    name = source_name(s, what)
    atoms = s.atoms
    std = atoms.std_resname
    protein = np.isin(std, list(AMINO_ACIDS)) | (np.char.upper(atoms.resname.astype(str)) == "UNK")
    ca_mask = np.zeros(s.n_atoms, dtype=bool)
    ca_mask[s.select_indices("ca")] = True
    ids = list(dict.fromkeys(atoms.chain.tolist()))  # chains in file order
    has_ca = {c: bool((ca_mask & (atoms.chain == c)).any()) for c in ids}
    if chain is None:
        usable = [c for c in ids if has_ca[c]]
        if not usable:
            _check_length(0, name)
        pick = usable[0]
        skipped = ids[:ids.index(pick)]
        if skipped:
            shown = ", ".join(repr(c) for c in skipped)
            warnings.warn(f"{name}: chain{'s' if len(skipped) > 1 else ''} {shown} skipped: no protein "
                          f"residue with a CA atom; aligning chain {pick!r}", stacklevel=4)
    else:
        if chain not in has_ca:
            raise InputError(f"{name}: no chain {chain!r} (chains: {', '.join(repr(c) for c in ids)})")
        if not has_ca[chain]:
            raise InputError(f"{name}: chain {chain!r} has no protein residue with a CA atom")
        pick = chain
    in_chain = atoms.chain == pick
    res = atoms.residue_index
    # the first CA atom of each residue (alternate locations keep the first, as TM-align does)
    ca_atoms = np.flatnonzero(ca_mask & in_chain)
    _, first = np.unique(res[ca_atoms], return_index=True)
    ca_atoms = np.sort(ca_atoms[first])
    protein_res = np.unique(res[protein & in_chain])
    n_skipped = int(len(protein_res) - len(ca_atoms))
    _check_length(len(ca_atoms), name if chain is None else f"{name} chain {pick!r}")
    xyz = np.asarray(s.coords[:1 if first_frame_only else None, ca_atoms], dtype=np.float64)
    check_finite(xyz, name)  # the front door's wording: frame k (atom i of the trace)
    seq = "".join(ONE_LETTER.get(r, "X") for r in std[ca_atoms].tolist())
    if len(xyz) == 1:
        return [Chain(xyz[0], seq, name, n_skipped)]
    return [Chain(xyz[k], seq, f"{name} frame {k}", n_skipped) for k in range(len(xyz))]
