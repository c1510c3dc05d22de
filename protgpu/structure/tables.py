"""The per-atom and per-residue tables of a :class:`~protgpu.structure.core.Structure`.

:class:`AtomTable` holds one entry per atom in file order; :class:`ResidueTable` one per residue.
``residue_table(atoms)`` (internal) builds the latter from the former.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import InputError
from .chemistry import guess_elements, standardize_resnames

__all__ = ["AtomTable", "ResidueTable"]


def _str_array(values, n: int | None, field: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind == "S":
        arr = np.char.decode(arr, "ascii")
    elif arr.dtype.kind != "U":
        arr = arr.astype(str)
    if arr.ndim != 1 or (n is not None and arr.shape[0] != n):
        raise InputError(f"atom table: {field} must be 1-D of length {n}, got shape {arr.shape}")
    return arr


def _residue_starts_mask(chain, resid, icode, resname) -> np.ndarray:
    """Boolean mask, True where a new residue begins (file order, any key field changes)."""
    n = len(resid)
    new = np.zeros(n, dtype=bool)
    if n:
        new[0] = True
        for field in (chain, resid, icode, resname):
            new[1:] |= field[1:] != field[:-1]
    return new


@dataclass(frozen=True, eq=False)
class AtomTable:
    """Per-atom annotation: equal-length 1-D arrays, one entry per atom, in file order.

    Attributes
    ----------
    name : np.ndarray of str, shape (n,)
        Atom name, e.g. ``"CA"``.
    element : np.ndarray of str, shape (n,)
        Upper-case element symbol (``"C"``, ``"SE"``, ``"H"``; ``"D"`` for deuterium; ``"X"`` unknown).
    resname : np.ndarray of str, shape (n,)
        Residue name as in the file (``"HSD"``, ``"MSE"``); see :attr:`std_resname`.
    resid : np.ndarray of int32, shape (n,)
        Residue sequence number.
    icode : np.ndarray of str, shape (n,)
        Insertion code, ``""`` when none.
    chain : np.ndarray of str, shape (n,)
        Chain identifier, ``""`` when blank (a PDB segid is *not* copied here; see ``segid``).
    segid : np.ndarray of str, shape (n,)
        Segment identifier, ``""`` when none.
    hetero : np.ndarray of bool, shape (n,)
        True for HETATM records.
    residue_index : np.ndarray of int32, shape (n,)
        Residue of each atom, 0..R-1: a new residue starts whenever (chain, resid, icode, resname)
        changes from one atom to the next, in file order. Computed when not given.
    """

    name: np.ndarray
    element: np.ndarray
    resname: np.ndarray
    resid: np.ndarray
    icode: np.ndarray
    chain: np.ndarray
    segid: np.ndarray
    hetero: np.ndarray
    residue_index: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self):
        name = _str_array(self.name, None, "name")
        n = name.shape[0]
        fields = {"name": name}
        for f in ("element", "resname", "icode", "chain", "segid"):
            fields[f] = _str_array(getattr(self, f), n, f)
        resid = np.asarray(self.resid)
        if resid.shape != (n,) or (resid.size and resid.dtype.kind not in "iu"):
            raise InputError(f"atom table: resid must be integers of shape ({n},), got {resid.shape}")
        fields["resid"] = resid.astype(np.int32, copy=False)
        hetero = np.asarray(self.hetero)
        if hetero.shape != (n,):
            raise InputError(f"atom table: hetero must have shape ({n},), got {hetero.shape}")
        fields["hetero"] = hetero.astype(bool, copy=False)
        if self.residue_index is None:
            new = _residue_starts_mask(fields["chain"], fields["resid"], fields["icode"], fields["resname"])
            ri = np.cumsum(new, dtype=np.int32) - 1
        else:
            ri = np.asarray(self.residue_index)
            if ri.shape != (n,):
                raise InputError(f"atom table: residue_index must have shape ({n},), got {ri.shape}")
            ri = ri.astype(np.int32, copy=False)
        fields["residue_index"] = ri
        # frozen=True forbids attribute assignment; the normalised arrays are set once, here.
        for k, v in fields.items():
            object.__setattr__(self, k, v)

    @classmethod
    def _from_arrays(
        cls, *, name, element, resname, resid, icode, chain, segid, hetero, residue_index
    ) -> AtomTable:
        """A table from arrays that already are what ``__post_init__`` makes (internal, for loaders).

        The PDB reader builds every field as a 1-D array of the final dtype ('<U' strings, int32
        ``resid`` and ``residue_index``, bool ``hetero``), all of one length; checking and
        normalising them again costs about as much as decoding them, so they are set as they are.
        """
        table = object.__new__(cls)
        # (frozen forbids setattr, not the instance dict: one update sets the nine fields)
        table.__dict__.update(
            name=name, element=element, resname=resname, resid=resid, icode=icode, chain=chain, segid=segid,
            hetero=hetero, residue_index=residue_index,
        )
        return table

    def __len__(self) -> int:
        return int(self.name.shape[0])

    def __eq__(self, other) -> bool:
        if not isinstance(other, AtomTable):
            return NotImplemented
        return len(self) == len(other) and all(
            np.array_equal(getattr(self, f), getattr(other, f))
            for f in ("name", "element", "resname", "resid", "icode", "chain", "segid", "hetero", "residue_index")
        )

    __hash__ = None  # type: ignore[assignment]  # holds mutable arrays

    @property
    def n_residues(self) -> int:
        """Number of residues (``residue_index.max() + 1``; 0 for an empty table)."""
        return int(self.residue_index.max()) + 1 if len(self) else 0

    @cached_property
    def std_resname(self) -> np.ndarray:
        """Residue names mapped to standard amino acids (:func:`standardize_resnames`), shape (n,)."""
        return standardize_resnames(self.resname)

    @cached_property
    def _codes(self) -> dict:
        # Lazily filled cache {field: (unique values upper-cased or not, inverse)}, so that repeated
        # selections on a big table do one np.unique per field, not one per query.
        return {}

    def codes(self, field: str, upper: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Distinct values of a string field and each atom's index into them.

        Parameters
        ----------
        field : str
            Attribute name (``"name"``, ``"resname"``, ``"std_resname"``, ``"chain"``, ...).
        upper : bool
            Upper-case the distinct values (for case-insensitive matching).

        Returns
        -------
        uniq : np.ndarray of str, shape (k,)
        inverse : np.ndarray of intp, shape (n,)
            ``uniq[inverse]`` equals the field (upper-cased when asked).
        """
        key = (field, upper)
        if key not in self._codes:
            uniq, inverse = np.unique(getattr(self, field), return_inverse=True)
            if upper:
                uniq = np.char.upper(uniq)
            self._codes[key] = (uniq, inverse.ravel())
        return self._codes[key]

    def take(self, indices: np.ndarray) -> AtomTable:
        """Atom table of the atoms at ``indices`` (in that order), residues renumbered from 0.

        Parameters
        ----------
        indices : np.ndarray of int, shape (m,)

        Returns
        -------
        AtomTable
            Length ``m``; ``residue_index`` counts residue changes along the new order.
        """
        idx = np.asarray(indices, dtype=np.int64)
        ri = self.residue_index[idx]
        new = np.ones(len(idx), dtype=bool)
        new[1:] = ri[1:] != ri[:-1]
        return AtomTable(
            name=self.name[idx],
            element=self.element[idx],
            resname=self.resname[idx],
            resid=self.resid[idx],
            icode=self.icode[idx],
            chain=self.chain[idx],
            segid=self.segid[idx],
            hetero=self.hetero[idx],
            residue_index=np.cumsum(new, dtype=np.int32) - 1,
        )

    @classmethod
    def build(
        cls,
        name,
        resname,
        resid,
        chain,
        *,
        element=None,
        icode=None,
        segid=None,
        hetero=None,
        residue_index=None,
    ) -> AtomTable:
        """Make a table from the essential fields; the rest get defaults.

        Parameters
        ----------
        name, resname, chain : array_like of str, shape (n,)
        resid : array_like of int, shape (n,)
        element : array_like of str, optional
            Guessed from ``name`` and ``resname`` (:func:`guess_elements`) when omitted.
        icode, segid : array_like of str, optional
            ``""`` when omitted.
        hetero : array_like of bool, optional
            False when omitted.
        residue_index : array_like of int, optional
            Derived from residue changes when omitted.

        Returns
        -------
        AtomTable
        """
        name = _str_array(name, None, "name")
        n = name.shape[0]
        resname = _str_array(resname, n, "resname")
        blank = np.full(n, "", dtype="<U1")
        if element is None:
            element = guess_elements(name, resname)
        return cls(
            name=name,
            element=np.char.upper(np.char.strip(_str_array(element, n, "element"))),
            resname=resname,
            resid=resid,
            icode=blank if icode is None else icode,
            chain=chain,
            segid=blank if segid is None else segid,
            hetero=np.zeros(n, dtype=bool) if hetero is None else hetero,
            residue_index=residue_index,
        )


@dataclass(frozen=True, eq=False)
class ResidueTable:
    """One entry per residue, in file order.

    Attributes
    ----------
    chain, icode, resname, std_resname, segid : np.ndarray of str, shape (R,)
    resid : np.ndarray of int32, shape (R,)
    atom_start : np.ndarray of int64, shape (R,)
        Index of the residue's first atom (atoms of a residue are contiguous).
    atom_count : np.ndarray of int64, shape (R,)
        Number of atoms in the residue.
    """

    chain: np.ndarray
    resid: np.ndarray
    icode: np.ndarray
    resname: np.ndarray
    std_resname: np.ndarray
    segid: np.ndarray
    atom_start: np.ndarray
    atom_count: np.ndarray

    def __len__(self) -> int:
        return int(self.resid.shape[0])

    def labels(self) -> list[str]:
        """Readable residue labels such as ``"A:LYS12"`` (``"A:LYS12B"`` with an insertion code).

        The chain id prefixes the label; when the chain is blank the segment id is used, and when
        both are blank the label is just ``"LYS12"``.

        Returns
        -------
        list of str, length R
        """
        out = []
        for ch, seg, rn, ri, ic in zip(
            self.chain.tolist(), self.segid.tolist(), self.resname.tolist(), self.resid.tolist(),
            self.icode.tolist(), strict=True,
        ):
            prefix = ch or seg
            out.append(f"{prefix}:{rn}{ri}{ic}" if prefix else f"{rn}{ri}{ic}")
        return out


def residue_table(atoms: AtomTable) -> ResidueTable:
    """The :class:`ResidueTable` of an atom table (atoms of a residue are contiguous)."""
    ri = atoms.residue_index
    n = len(atoms)
    if n == 0:
        empty_s = np.zeros(0, dtype="<U1")
        empty_i = np.zeros(0, dtype=np.int64)
        return ResidueTable(empty_s, np.zeros(0, np.int32), empty_s, empty_s, empty_s, empty_s, empty_i, empty_i)
    new = np.ones(n, dtype=bool)
    new[1:] = ri[1:] != ri[:-1]
    start = np.flatnonzero(new)
    count = np.diff(np.append(start, n))
    return ResidueTable(
        chain=atoms.chain[start],
        resid=atoms.resid[start],
        icode=atoms.icode[start],
        resname=atoms.resname[start],
        std_resname=atoms.std_resname[start],
        segid=atoms.segid[start],
        atom_start=start.astype(np.int64),
        atom_count=count.astype(np.int64),
    )
