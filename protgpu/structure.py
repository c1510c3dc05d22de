"""The :class:`Structure` container: coordinates of one or more frames plus an atom table, and atom
selections.

A :class:`Structure` holds ``coords`` of shape ``(frames, atoms, 3)`` as C-contiguous float32 in
Angstrom, an :class:`AtomTable` describing the atoms (names, elements, residues, chains), and optional
periodic box vectors and times. Every loader in :mod:`protgpu.io` produces one, and every domain
function accepts one where it accepts a coordinate array.

Selections are strings in a small grammar (see :meth:`Structure.select`) evaluated as vectorised NumPy
boolean masks, so selecting from 100k atoms costs a few array operations and no per-atom Python loop.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .errors import InputError

__all__ = [
    "AMINO_ACIDS",
    "NONSTANDARD_RESNAMES",
    "WATER_RESNAMES",
    "AtomTable",
    "ResidueTable",
    "Structure",
    "guess_elements",
    "standardize_resnames",
]

#: The 20 canonical amino acids plus selenocysteine and pyrrolysine, as 3-letter PDB names.
AMINO_ACIDS = frozenset(
    "ALA ARG ASN ASP CYS GLN GLU GLY HIS ILE LEU LYS MET PHE PRO SER THR TRP TYR VAL SEC PYL".split()
)

#: Residue names that force fields and the PDB use for (modified or differently protonated) amino
#: acids, mapped to the parent amino acid. Protonation/tautomer names come from CHARMM (HSD/HSE/HSP),
#: AMBER (HID/HIE/HIP, CYX/CYM, ASH/GLH/LYN) and GROMOS/GROMACS (HIS1/HISA/HISB/HISD/HISE/HISH, CYS2,
#: LYSH, ...). Common PDB modified residues map to their parent: MSE (selenomethionine) -> MET, so
#: selenomethionine counts as protein and its CA is selected by ``ca`` (its SE atom keeps element SE).
NONSTANDARD_RESNAMES = {
    **dict.fromkeys(
        "HSD HSE HSP HID HIE HIP HIS1 HIS2 HISA HISB HISD HISE HISH HISP HSC HSN HN1 HN2 HIN".split(),
        "HIS",
    ),
    **dict.fromkeys("CYX CYM CYS2 CYSH CYN CSS CYF CYP".split(), "CYS"),
    **dict.fromkeys("ASH ASPH ASPP ASN1".split(), "ASP"),
    **dict.fromkeys("GLH GLUH GLUP".split(), "GLU"),
    **dict.fromkeys("LYN LYSH LSN LYP MLY KCX".split(), "LYS"),
    **dict.fromkeys("ARN".split(), "ARG"),
    **dict.fromkeys("TYM".split(), "TYR"),
    "MSE": "MET",
    "TPO": "THR",
    "SEP": "SER",
    "PTR": "TYR",
    "HYP": "PRO",
    "CSO": "CYS",
    "CME": "CYS",
    "CSD": "CYS",
    "OCS": "CYS",
    "MEN": "ASN",
    "PCA": "GLU",
    "SCY": "CYS",
    "CSX": "CYS",
    "FME": "MET",
    "AIB": "ALA",
    "NLE": "LEU",
    "NEP": "HIS",
    "HIC": "HIS",
    "ALY": "LYS",
    "M3L": "LYS",
    "MLZ": "LYS",
    "CGU": "GLU",
    "CSE": "SEC",
    # D-amino acids
    "DAL": "ALA", "DAR": "ARG", "DSG": "ASN", "DAS": "ASP", "DCY": "CYS", "DGN": "GLN", "DGL": "GLU",
    "DHI": "HIS", "DIL": "ILE", "DLE": "LEU", "DLY": "LYS", "MED": "MET", "DPN": "PHE", "DPR": "PRO",
    "DSN": "SER", "DTH": "THR", "DTR": "TRP", "DTY": "TYR", "DVA": "VAL",
}

#: Residue names of water across the PDB and the common MD packages.
WATER_RESNAMES = frozenset(
    "HOH WAT H2O DOD D2O SOL TIP TIP2 TIP3 TIP4 TIP5 TIP3P TIP4P TIP5P T3P T4P T5P SPC SPCE SPC/E "
    "OPC OPC3 TP3 HO4 W".split()
)

_BACKBONE_NAMES = ("N", "CA", "C", "O")

# Two-letter element symbols that PDB atom names of ions and ligands start with. Kept short on
# purpose: only symbols that occur in biomolecular files, so that e.g. "CD" (a carbon in a side
# chain) is never read as cadmium outside the HETATM/unknown-residue case below.
_TWO_LETTER_ELEMENTS = frozenset(
    "HE LI BE NE NA MG AL SI CL AR CA SC TI CR MN FE CO NI CU ZN GA GE AS SE BR KR RB SR ZR MO RU RH PD "
    "AG CD IN SN SB TE XE CS BA LA CE GD YB W PT AU HG TL PB BI".split()
)
_ONE_LETTER_ELEMENTS = frozenset("H D C N O S P F K I B V U W Y".split())
# Single-atom ion residues of CHARMM/AMBER whose atom name does not spell the element.
_ION_RESNAMES = {
    "SOD": "NA",
    "NA+": "NA",
    "CLA": "CL",
    "CL-": "CL",
    "POT": "K",
    "K+": "K",
    "CAL": "CA",
    "CES": "CS",
    "LIT": "LI",
    "ZN2": "ZN",
    "MG2": "MG",
    "RUB": "RB",
}


def standardize_resnames(resname: np.ndarray) -> np.ndarray:
    """Map residue names to standard amino-acid names where a mapping is known.

    Parameters
    ----------
    resname : np.ndarray of str, shape (n,)
        Residue names as found in a file (e.g. ``"HSD"``, ``"MSE"``, ``"ALA"``).

    Returns
    -------
    np.ndarray of str, shape (n,)
        ``resname`` with the names in :data:`NONSTANDARD_RESNAMES` replaced by their parent amino acid
        (``HSD`` -> ``HIS``, ``CYX`` -> ``CYS``, ``MSE`` -> ``MET``, ...); other names unchanged.

    Examples
    --------
    >>> import numpy as np
    >>> standardize_resnames(np.array(["HSD", "MSE", "ALA", "CYX", "HOH"])).tolist()
    ['HIS', 'MET', 'ALA', 'CYS', 'HOH']
    """
    resname = np.asarray(resname, dtype=str)
    if resname.size == 0:
        return resname.copy()
    # Map the (few) distinct names, then broadcast back: no per-atom Python work.
    uniq, inverse = np.unique(resname, return_inverse=True)
    mapped = np.array([NONSTANDARD_RESNAMES.get(str(u).upper(), str(u)) for u in uniq], dtype=str)
    return mapped[inverse.reshape(resname.shape)]


def _guess_one_element(padded_name: str, resname: str) -> str:
    """Element symbol of one atom from its (PDB-padded, 4-character) name and residue name."""
    name = padded_name.strip().upper()
    letters = name.lstrip("0123456789")
    res = resname.strip().upper()
    if res in _ION_RESNAMES:
        return _ION_RESNAMES[res]
    if not letters:
        return "X"
    std = NONSTANDARD_RESNAMES.get(res, res)
    if std in AMINO_ACIDS or res in WATER_RESNAMES:
        # Polymer and water atom names start with their element (CA is C-alpha, HG12 a hydrogen);
        # the exception is selenium of selenomethionine.
        if letters.startswith("SE") and res in ("MSE", "SEC"):
            return "SE"
        return letters[0]
    two = letters[:2]
    # A single-atom residue named like its atom ("ZN"/"ZN", "CL"/"CL") is that ion; otherwise the
    # PDB convention puts two-letter elements at the name's first column (no leading blank).
    if two in _TWO_LETTER_ELEMENTS and (name == res or (padded_name[:1] not in " 0123456789")):
        if len(letters) <= 2 or letters[0] not in "CHNOS" or name == res:
            return two
    if letters[0] in _ONE_LETTER_ELEMENTS:
        return letters[0]
    return two if two in _TWO_LETTER_ELEMENTS else "X"


def guess_elements(names: np.ndarray, resnames: np.ndarray) -> np.ndarray:
    """Guess upper-case element symbols from atom and residue names.

    Used where a file has no element column. Names are read as the PDB pads them: a name whose
    first column is blank or a digit has a one-letter element (``" CA "`` is carbon); a name that
    starts in the first column may be a two-letter element (``"FE  "``, ``"CL  "``). Atoms of amino
    acids and water always take the first letter (``"HG12"`` is hydrogen), except selenium of MSE.

    Parameters
    ----------
    names : np.ndarray of str, shape (n,)
        Atom names, ideally padded to 4 characters as in PDB columns 13-16.
    resnames : np.ndarray of str, shape (n,)
        Residue names.

    Returns
    -------
    np.ndarray of str, shape (n,)
        Element symbols such as ``"C"``, ``"SE"``, ``"ZN"``; ``"X"`` when nothing fits.

    Examples
    --------
    A protein's CA is carbon, a calcium ion's CA is calcium; ``HG1`` of leucine is hydrogen:

    >>> import numpy as np
    >>> names = np.array([" CA ", "CA  ", " HG1", "FE  ", "SE  "])
    >>> resnames = np.array(["ALA", "CA", "LEU", "HEM", "MSE"])
    >>> guess_elements(names, resnames).tolist()
    ['C', 'CA', 'H', 'FE', 'SE']
    """
    names = np.asarray(names, dtype=str)
    resnames = np.asarray(resnames, dtype=str)
    if names.size == 0:
        return np.zeros(0, dtype="<U2")
    # Distinct (name, resname) pairs are few even in big systems: guess once per pair.
    pairs = np.char.add(np.char.add(names, "\x1f"), resnames)
    uniq, inverse = np.unique(pairs, return_inverse=True)
    guessed = []
    for p in uniq.tolist():
        n, r = p.split("\x1f", 1)
        guessed.append(_guess_one_element(n, r))
    return np.array(guessed, dtype=str)[inverse.reshape(names.shape)]


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


def _residue_table(atoms: AtomTable) -> ResidueTable:
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


# ----------------------------------------------------------------------------------------------------
# Selection language
# ----------------------------------------------------------------------------------------------------

# Keywords that stand alone, and keywords followed by one or more values.
_FLAG_KEYWORDS = ("all", "none", "ca", "heavy", "hydrogen", "backbone", "protein", "water", "hetero")
_VALUE_KEYWORDS = ("chain", "segid", "resid", "resname", "name", "element", "index")
_OPERATORS = ("and", "or", "not", "(", ")")
_TOKEN_RE = re.compile(r"\(|\)|[^\s()]+")
_INT_RE = re.compile(r"^[+-]?\d+$")
_RANGE_RE = re.compile(r"^([+-]?\d+)(?:-|:|\.\.)([+-]?\d+)$")


def _valid_keywords() -> str:
    return ", ".join(_FLAG_KEYWORDS + _VALUE_KEYWORDS + ("and", "or", "not", "( )"))


class _SelectionParser:
    """Recursive-descent parser that evaluates a selection string to a boolean mask.

    Grammar (keywords case-insensitive)::

        expr    := and_expr ("or" and_expr)*
        and_expr:= not_expr ("and" not_expr)*
        not_expr:= "not" not_expr | primary
        primary := "(" expr ")" | FLAG | VALUE_KEYWORD value+
    """

    def __init__(self, atoms: AtomTable, expr: str, source: str | None):
        self.atoms = atoms
        self.n = len(atoms)
        self.expr = expr
        self.where = f"{source or 'structure'}: selection {expr!r}"
        self.tokens = _TOKEN_RE.findall(expr)
        self.pos = 0

    def error(self, msg: str) -> InputError:
        return InputError(f"{self.where}: {msg}")

    def peek(self) -> str | None:
        return self.tokens[self.pos].lower() if self.pos < len(self.tokens) else None

    def parse(self) -> np.ndarray:
        if not self.tokens:
            raise self.error(f"empty selection; valid keywords: {_valid_keywords()}")
        mask = self.parse_or()
        if self.pos != len(self.tokens):
            raise self.error(f"unexpected {self.tokens[self.pos]!r} at word {self.pos + 1}")
        return mask

    def parse_or(self) -> np.ndarray:
        mask = self.parse_and()
        while self.peek() == "or":
            self.pos += 1
            mask = mask | self.parse_and()
        return mask

    def parse_and(self) -> np.ndarray:
        mask = self.parse_not()
        while self.peek() == "and":
            self.pos += 1
            mask = mask & self.parse_not()
        return mask

    def parse_not(self) -> np.ndarray:
        if self.peek() == "not":
            self.pos += 1
            return ~self.parse_not()
        return self.parse_primary()

    def parse_primary(self) -> np.ndarray:
        tok = self.peek()
        if tok is None:
            raise self.error("ends too early: expected a keyword or '('")
        if tok == "(":
            self.pos += 1
            mask = self.parse_or()
            if self.peek() != ")":
                raise self.error("missing ')'")
            self.pos += 1
            return mask
        if tok in _FLAG_KEYWORDS:
            self.pos += 1
            return self.flag(tok)
        if tok in _VALUE_KEYWORDS:
            self.pos += 1
            values = []
            while self.pos < len(self.tokens) and self.peek() not in _OPERATORS:
                values.append(self.tokens[self.pos])
                self.pos += 1
            if not values:
                raise self.error(f"keyword {tok!r} needs at least one value")
            return self.valued(tok, values)
        raise self.error(f"unknown word {self.tokens[self.pos]!r}; valid keywords: {_valid_keywords()}")

    # -- flags -------------------------------------------------------------------------------------
    def isin(self, field: str, values, upper: bool = True) -> np.ndarray:
        uniq, inverse = self.atoms.codes(field, upper=upper)
        hit = np.isin(uniq, np.asarray(list(values), dtype=str))
        return hit[inverse] if self.n else np.zeros(0, dtype=bool)

    def protein(self) -> np.ndarray:
        return self.isin("std_resname", AMINO_ACIDS)

    def hydrogen(self) -> np.ndarray:
        # Deuterium is hydrogen for every purpose a selection serves.
        return self.isin("element", ("H", "D"))

    def flag(self, tok: str) -> np.ndarray:
        if tok == "all":
            return np.ones(self.n, dtype=bool)
        if tok == "none":
            return np.zeros(self.n, dtype=bool)
        if tok == "protein":
            return self.protein()
        if tok == "water":
            return self.isin("resname", WATER_RESNAMES)
        if tok == "hetero":
            return self.atoms.hetero.copy()
        if tok == "hydrogen":
            return self.hydrogen()
        if tok == "heavy":
            return ~self.hydrogen()
        if tok == "ca":
            # Element C excludes calcium ions named CA.
            return self.isin("name", ("CA",)) & self.isin("element", ("C",)) & self.protein()
        # backbone
        return self.isin("name", _BACKBONE_NAMES) & self.protein()

    # -- keywords with values ------------------------------------------------------------------------
    def int_mask(self, values: np.ndarray, words: list[str], kw: str) -> np.ndarray:
        mask = np.zeros(self.n, dtype=bool)
        singles = []
        i = 0
        while i < len(words):
            w = words[i]
            m = _RANGE_RE.match(w)
            if m:
                lo, hi = int(m.group(1)), int(m.group(2))
            elif _INT_RE.match(w):
                lo = hi = int(w)
                # "10 - 50", "10 to 50", "10 : 50" spelled with spaces
                if i + 2 < len(words) and words[i + 1].lower() in ("-", "to", ":") and _INT_RE.match(words[i + 2]):
                    hi = int(words[i + 2])
                    i += 2
            else:
                raise self.error(f"{kw} needs integers or ranges like 10-50, got {w!r}")
            if lo == hi:
                singles.append(lo)
            else:
                mask |= (values >= min(lo, hi)) & (values <= max(lo, hi))
            i += 1
        if singles:
            mask |= np.isin(values, np.asarray(singles, dtype=np.int64))
        return mask

    def valued(self, kw: str, words: list[str]) -> np.ndarray:
        if kw == "resid":
            return self.int_mask(self.atoms.resid, words, kw)
        if kw == "index":
            return self.int_mask(np.arange(self.n), words, kw)
        if kw in ("chain", "segid"):
            # Chain ids are case-sensitive (large mmCIF entries use both "A" and "a").
            return self.isin(kw, words, upper=False)
        return self.isin(kw, [w.upper() for w in words])


def _select_mask(atoms: AtomTable, selection, source: str | None) -> np.ndarray:
    """Boolean mask of shape (n_atoms,) for a selection string, index array or boolean mask."""
    n = len(atoms)
    where = source or "structure"
    if isinstance(selection, str):
        return _SelectionParser(atoms, selection, source).parse()
    arr = np.asarray(selection)
    if arr.dtype == bool:
        if arr.shape != (n,):
            raise InputError(f"{where}: boolean selection mask has shape {arr.shape}, expected ({n},)")
        return arr
    if arr.size == 0:
        return np.zeros(n, dtype=bool)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise InputError(f"{where}: a selection must be a string, a 1-D integer index array or a boolean mask")
    if arr.min() < 0 or arr.max() >= n:
        raise InputError(f"{where}: selection index out of range 0..{n - 1} (got {arr.min()}..{arr.max()})")
    mask = np.zeros(n, dtype=bool)
    mask[arr] = True
    return mask


# ----------------------------------------------------------------------------------------------------
# Structure
# ----------------------------------------------------------------------------------------------------


class Structure:
    """Coordinates of one or more frames of the same atoms, with their atom table.

    Parameters
    ----------
    coords : array_like, shape (frames, atoms, 3) or (atoms, 3)
        Cartesian coordinates in Angstrom. Stored as C-contiguous float32 (no copy when already so).
    atoms : AtomTable
        Annotation of the ``atoms`` atoms.
    source : str, optional
        File name or description, used in error messages and ``repr``.
    box : array_like, optional
        Periodic box vectors in Angstrom, rows a, b, c: shape (frames, 3, 3) or (3, 3) (same box for
        every frame); (3,) or (frames, 3) give the edge lengths of a rectangular box.
    time : array_like, optional
        Time of each frame in ps, shape (frames,).

    Raises
    ------
    InputError
        Wrong shapes, atom count differing from the table, or a non-finite coordinate (the message
        names the source, the first bad frame and atom).

    Examples
    --------
    >>> import numpy as np
    >>> s = Structure.from_coords(np.zeros((5, 3)), source="demo")
    >>> s
    <Structure demo: 1 frame, 5 atoms, 5 residues>
    >>> s.coords.shape, s.coords.dtype
    ((1, 5, 3), dtype('float32'))
    """

    __slots__ = ("coords", "atoms", "source", "box", "time")

    def __init__(self, coords, atoms: AtomTable, source: str | None = None, box=None, time=None):
        where = source or "coordinates"
        if not isinstance(atoms, AtomTable):
            raise InputError(f"{where}: atoms must be an AtomTable, got {type(atoms).__name__}")
        try:
            xyz = np.asarray(coords)
            if xyz.dtype.kind not in "fiub":
                raise TypeError(xyz.dtype)
            if xyz.dtype != np.float32 or not xyz.flags.c_contiguous:
                # (the loaders hand over C-contiguous float32: no cast, and no errstate to enter)
                with np.errstate(over="ignore"):  # overflow gives inf, reported just below
                    xyz = np.ascontiguousarray(xyz, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: coordinates must be a numeric array ({exc})") from None
        if xyz.ndim == 2:
            xyz = xyz[None]
        if xyz.ndim != 3 or xyz.shape[2] != 3:
            raise InputError(f"{where}: coordinates must have shape (frames, atoms, 3), got {np.shape(coords)}")
        if xyz.shape[1] != len(atoms):
            raise InputError(f"{where}: {xyz.shape[1]} atoms in the coordinates but {len(atoms)} in the atom table")
        finite = np.isfinite(xyz)
        if not finite.all():
            f, a = np.argwhere(~finite.all(axis=2))[0]
            raise InputError(f"{where}: non-finite coordinate (NaN or inf) at frame {f}, atom {a}")
        n_frames = xyz.shape[0]
        if box is not None:
            b = np.asarray(box, dtype=np.float32)
            if b.shape == (3,) or (b.ndim == 2 and b.shape[1] == 3 and b.shape != (3, 3)):
                # edge lengths of a rectangular box -> diagonal box vectors
                b = b[..., :, None] * np.eye(3, dtype=np.float32)
            if b.shape == (3, 3):
                b = np.broadcast_to(b, (n_frames, 3, 3))
            if b.shape != (n_frames, 3, 3):
                raise InputError(f"{where}: box must have shape ({n_frames}, 3, 3), got {np.shape(box)}")
            if not np.isfinite(b).all():
                raise InputError(f"{where}: non-finite box vectors")
            box = np.ascontiguousarray(b)
        if time is not None:
            t = np.asarray(time, dtype=np.float64).reshape(-1)
            if t.shape != (n_frames,):
                raise InputError(f"{where}: time must have shape ({n_frames},), got {np.shape(time)}")
            time = t
        self.coords = xyz
        self.atoms = atoms
        self.source = source
        self.box = box
        self.time = time

    @classmethod
    def _from_parts(cls, coords: np.ndarray, atoms: AtomTable, source: str | None) -> Structure:
        """A Structure from parts that already pass every check of ``__init__`` (internal, for loaders).

        ``coords`` must be C-contiguous float32 of shape (frames, len(atoms), 3) and finite; no box,
        no time. The PDB reader knows this of what it decoded, and the checks (a pass over every
        coordinate for finiteness among them) cost a measurable part of loading a small file.
        """
        s = object.__new__(cls)
        s.coords, s.atoms, s.source, s.box, s.time = coords, atoms, source, None, None
        return s

    @classmethod
    def from_coords(cls, coords, source: str | None = None) -> Structure:
        """Wrap a bare coordinate array with a placeholder atom table.

        Every atom becomes its own residue ``UNK`` (resid 1..n) in chain ``"A"``, with name and
        element ``"X"``; so selections other than ``all``/``index``/``resid`` match nothing useful.

        Parameters
        ----------
        coords : array_like, shape (frames, atoms, 3) or (atoms, 3)
            Angstrom.
        source : str, optional
            Description for error messages.

        Returns
        -------
        Structure

        Examples
        --------
        >>> import numpy as np
        >>> s = Structure.from_coords(np.zeros((2, 5, 3)))
        >>> s.n_frames, s.n_atoms, s.coords.dtype
        (2, 5, dtype('float32'))
        >>> s.select("resid 2-3").n_atoms
        2
        """
        shape = np.shape(coords)
        if len(shape) not in (2, 3):
            raise InputError(f"{source or 'coordinates'}: coordinates must have shape (frames, atoms, 3), got {shape}")
        n = shape[-2]
        atoms = AtomTable(
            name=np.full(n, "X"),
            element=np.full(n, "X"),
            resname=np.full(n, "UNK"),
            resid=np.arange(1, n + 1, dtype=np.int32),
            icode=np.full(n, ""),
            chain=np.full(n, "A"),
            segid=np.full(n, ""),
            hetero=np.zeros(n, dtype=bool),
            residue_index=np.arange(n, dtype=np.int32),
        )
        return cls(coords, atoms, source=source)

    # -- sizes -----------------------------------------------------------------------------------------
    @property
    def n_frames(self) -> int:
        """Number of frames."""
        return int(self.coords.shape[0])

    @property
    def n_atoms(self) -> int:
        """Number of atoms."""
        return int(self.coords.shape[1])

    @property
    def n_residues(self) -> int:
        """Number of residues."""
        return self.atoms.n_residues

    @property
    def atom_residue(self) -> np.ndarray:
        """Residue index (0..R-1) of each atom, int32 shape (atoms,); same as ``atoms.residue_index``."""
        return self.atoms.residue_index

    @property
    def residues(self) -> ResidueTable:
        """Per-residue table (chain, resid, icode, resname, std_resname, segid, atom_start, atom_count)."""
        return _residue_table(self.atoms)

    def __repr__(self) -> str:
        f = self.n_frames
        # the file name, not its whole path, keeps the repr one short line
        label = os.path.basename(self.source) if self.source else "(no source)"
        return (
            f"<Structure {label}: {f} frame{'s' if f != 1 else ''}, "
            f"{self.n_atoms} atoms, {self.n_residues} residues>"
        )

    # -- selection -------------------------------------------------------------------------------------
    def select_indices(self, selection) -> np.ndarray:
        """Indices of the atoms a selection matches.

        Parameters
        ----------
        selection : str or array_like
            A selection string (grammar in :meth:`select`), an integer index array or a boolean mask
            of shape (atoms,).

        Returns
        -------
        np.ndarray of int64, shape (m,)
            Sorted, unique atom indices; empty when nothing matches.

        Examples
        --------
        >>> import protgpu as pg
        >>> s = pg.load("datasets/adk_open.pdb")
        >>> idx = s.select_indices("resid 1 and backbone")
        >>> idx.tolist(), s.atoms.name[idx].tolist()
        ([0, 4, 17, 18], ['N', 'CA', 'C', 'O'])
        """
        return np.flatnonzero(_select_mask(self.atoms, selection, self.source)).astype(np.int64)

    def select(self, selection) -> Structure:
        """New Structure with the selected atoms, all frames.

        Selection strings combine, case-insensitively:

        ``all``, ``none``; ``protein`` (amino acids, including the MD and modified names of
        :data:`NONSTANDARD_RESNAMES`; caps such as ACE/NME are not protein); ``ca`` (name CA, element
        C, protein); ``backbone`` (N, CA, C, O of protein); ``heavy`` (element not H or D);
        ``hydrogen``; ``water``; ``hetero`` (HETATM); ``chain A B`` and ``segid X`` (case-sensitive);
        ``resid 10-50`` / ``resid 10:50`` / ``resid 5 7 9`` / ``resid 10 to 50``; ``index 0-9``
        (0-based, inclusive ranges); ``resname ALA GLY``, ``name CA CB``, ``element C N``
        (case-insensitive); joined with ``and``, ``or``, ``not`` and parentheses (``not`` binds
        tightest, then ``and``, then ``or``).

        Parameters
        ----------
        selection : str or array_like
            Selection string, integer index array or boolean mask of shape (atoms,). Atoms keep
            their original order.

        Returns
        -------
        Structure
            Same frames, box and time; atom table restricted, residues renumbered from 0.

        Raises
        ------
        InputError
            Unknown keyword (the message lists the valid ones), malformed expression, or a selection
            matching no atom (the message names the source and the expression).

        Examples
        --------
        >>> import numpy as np
        >>> s = Structure.from_coords(np.zeros((4, 3)), source="demo")
        >>> s.select("index 1-2").n_atoms
        2
        """
        idx = self.select_indices(selection)
        if idx.size == 0:
            what = repr(selection) if isinstance(selection, str) else "the given index/mask"
            raise InputError(f"{self.source or 'structure'}: selection {what} matches no atoms")
        return Structure(
            np.ascontiguousarray(self.coords[:, idx]), self.atoms.take(idx), source=self.source,
            box=self.box, time=self.time,
        )

    # -- frames ----------------------------------------------------------------------------------------
    def frames(self, idx) -> Structure:
        """New Structure with a subset of frames (same atoms).

        Parameters
        ----------
        idx : int, slice, array_like of int or bool
            Frame index (negative counts from the end), slice, index array or boolean mask.

        Returns
        -------
        Structure
            An int gives a single-frame Structure (coords shape (1, atoms, 3)).

        Examples
        --------
        >>> import protgpu as pg
        >>> traj = pg.load("datasets/adk_dims.dcd", top="datasets/adk_open.pdb")
        >>> traj.n_frames, traj.frames(slice(0, 10, 2)).n_frames
        (98, 5)
        >>> traj.frames(-1).coords.shape
        (1, 3341, 3)
        """
        f = self.n_frames
        where = self.source or "structure"
        if isinstance(idx, (int, np.integer)) and not isinstance(idx, bool):
            i = int(idx)
            if not -f <= i < f:
                raise InputError(f"{where}: frame {i} out of range ({f} frame{'s' if f != 1 else ''})")
            sel = slice(i % f, i % f + 1)
        elif isinstance(idx, slice):
            sel = idx
        else:
            arr = np.asarray(idx)
            if arr.dtype == bool:
                if arr.shape != (f,):
                    raise InputError(f"{where}: frame mask has shape {arr.shape}, expected ({f},)")
                sel = np.flatnonzero(arr)
            elif arr.size == 0 or arr.dtype.kind in "iu":
                sel = arr.astype(np.int64).reshape(-1)
                if sel.size and (sel.min() < -f or sel.max() >= f):
                    raise InputError(f"{where}: frame index out of range ({f} frames)")
            else:
                raise InputError(f"{where}: frames must be an int, slice, index array or boolean mask")
        coords = np.ascontiguousarray(self.coords[sel])
        if coords.shape[0] == 0:
            raise InputError(f"{where}: frame selection {idx!r} selects no frames")
        return Structure(
            coords, self.atoms, source=self.source,
            box=None if self.box is None else self.box[sel],
            time=None if self.time is None else self.time[sel],
        )

    def __getitem__(self, idx) -> Structure:
        """Frame slicing, same as :meth:`frames`."""
        return self.frames(idx)

    def copy(self) -> Structure:
        """Deep copy of coordinates, box and time; the (immutable) atom table is shared.

        Examples
        --------
        >>> import protgpu as pg
        >>> s = pg.load("datasets/adk_open.pdb")
        >>> moved = s.copy()
        >>> moved.coords += 10.0
        >>> round(float(moved.coords[0, 0, 0] - s.coords[0, 0, 0]), 3), moved.atoms is s.atoms
        (10.0, True)
        """
        return Structure(
            self.coords.copy(), self.atoms, source=self.source,
            box=None if self.box is None else self.box.copy(),
            time=None if self.time is None else self.time.copy(),
        )
