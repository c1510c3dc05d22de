"""The selection grammar: a selection string, index array or mask to a boolean atom mask.

Selections are strings in a small grammar (see :meth:`protgpu.structure.core.Structure.select`) evaluated
as vectorised NumPy boolean masks, so selecting from 100k atoms costs a few array operations and no
per-atom Python loop. Internal API: ``select_mask(atoms, selection, source)``.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import InputError
from .chemistry import AMINO_ACIDS, VIRTUAL_SITE_ELEMENTS, WATER_RESNAMES
from .tables import AtomTable

_BACKBONE_NAMES = ("N", "CA", "C", "O")

# Keywords that stand alone, and keywords followed by one or more values.
_FLAG_KEYWORDS = ("all", "none", "ca", "heavy", "hydrogen", "backbone", "protein", "water", "hetero")
_VALUE_KEYWORDS = ("chain", "segid", "resid", "resname", "name", "element", "index")
_OPERATORS = ("and", "or", "not", "(", ")")
_TOKEN_RE = re.compile(r"\(|\)|[^\s()]+")
_INT_RE = re.compile(r"^[+-]?\d+$")
_RANGE_RE = re.compile(r"^([+-]?\d+)(?:-|:|\.\.)([+-]?\d+)$")


# Other tools' selection words (mdtraj, MDAnalysis, PyMOL, VMD, Biopython) -> what protgpu says.
_OTHER_TOOLS = {
    "resseq": ("resid", "protgpu's resid is the residue number (mdtraj's resSeq)"),
    "resnum": ("resid", "protgpu's resid is the residue number"),
    "resi": ("resid", "protgpu's resid is the residue number"),
    "residue": ("resid", "protgpu's resid is the residue number"),
    "resindex": ("resid", "protgpu selects residues by number: resid"),
    "resn": ("resname", "protgpu's resname is the residue name"),
    "segname": ("segid", "protgpu's segid is the segment name"),
    "chainid": ("chain", "protgpu's chain is the chain id"),
    "chid": ("chain", "protgpu's chain is the chain id"),
    "atomname": ("name", "protgpu's name is the atom name"),
    "type": ("element", "protgpu has no atom types; element is the chemical element"),
    "symbol": ("element", "protgpu's element is the chemical element"),
    "elem": ("element", "protgpu's element is the chemical element"),
    "bynum": ("index", "protgpu's index counts atoms from 0 (bynum and serial from 1)"),
    "serial": ("index", "protgpu's index counts atoms from 0 (bynum and serial from 1)"),
    "id": ("index", "protgpu's index counts atoms from 0"),
    "polymer": ("protein", "protgpu's protein is the standard amino acids"),
    "sidechain": ("protein and not backbone", "protgpu has no sidechain keyword"),
    "noh": ("heavy", "protgpu's heavy is every atom but hydrogen"),
    "solvent": ("water", "protgpu's water is the water residues"),
    "waters": ("water", "protgpu's water is the water residues"),
    "hetatm": ("hetero", "protgpu's hetero is the HETATM records"),
    "hydrogens": ("hydrogen", "protgpu's hydrogen is H and D atoms"),
    "&&": ("and", "protgpu's operators are and, or, not"),
    "||": ("or", "protgpu's operators are and, or, not"),
    "!": ("not", "protgpu's operators are and, or, not"),
}


def _valid_keywords() -> str:
    return ", ".join(_FLAG_KEYWORDS + _VALUE_KEYWORDS + ("and", "or", "not", "( )"))


def _unknown_word_hint(word: str) -> str:
    """What to write instead of ``word``: protgpu's name for another tool's keyword, or the closest
    keyword for a typing slip; "" when nothing is close."""
    import difflib

    low = word.lower()
    if low in _OTHER_TOOLS:
        ours, why = _OTHER_TOOLS[low]
        return f"; use {ours}: {why}"
    close = difflib.get_close_matches(low, _FLAG_KEYWORDS + _VALUE_KEYWORDS + ("and", "or", "not"), n=1, cutoff=0.7)
    return f"; did you mean {close[0]}?" if close else ""


def _listing(values, most: int = 20) -> str:
    """``A, B, C`` (the first ``most`` of sorted distinct ``values``, then ``... (N in all)``)."""
    uniq = sorted({str(v) for v in values})
    shown = ", ".join(repr(v) if v == "" or v != v.strip() else v for v in uniq[:most])
    return shown + (f", ... ({len(uniq)} in all)" if len(uniq) > most else "")


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
        self.absent: list[str] = []  # values that name nothing in these atoms, for the empty-result message

    def error(self, msg: str) -> InputError:
        return InputError(f"{self.where}: {msg}")

    def peek(self) -> str | None:
        return self.tokens[self.pos].lower() if self.pos < len(self.tokens) else None

    def parse(self) -> np.ndarray:
        if not self.tokens:
            raise self.error(f"empty selection; valid keywords: {_valid_keywords()}")
        mask = self.parse_or()
        if self.pos != len(self.tokens):
            word = self.tokens[self.pos]
            raise self.error(f"unexpected {word!r} at word {self.pos + 1}{_unknown_word_hint(word)}")
        if self.absent and not mask.any():
            # Nothing matched because a name names nothing here (chain A of a file with chains B and
            # C): say what there is. A selection of present names (or of numbers, "resid 0:0") that
            # matches nothing stays an empty result.
            raise InputError(f"{self.where} matches no atoms; {'; '.join(self.absent)}")
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
        word = self.tokens[self.pos]
        raise self.error(f"unknown word {word!r}{_unknown_word_hint(word)}; valid keywords: {_valid_keywords()}")

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
        if tok == "heavy":  # neither hydrogen nor a virtual site (TIP4P MW, lone pairs: no element)
            return ~(self.hydrogen() | self.isin("element", VIRTUAL_SITE_ELEMENTS))
        if tok == "ca":
            # Element C excludes calcium ions named CA. An unknown residue (UNK) with a carbon CA is an
            # amino acid of unknown type (CA-only models, SCOPe's CA sets): its CA counts.
            return (self.isin("name", ("CA",)) & self.isin("element", ("C",))
                    & (self.protein() | self.isin("resname", ("UNK",))))
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
            mask = self.isin(kw, words, upper=False)
        else:
            mask = self.isin(kw, [w.upper() for w in words])
        if not mask.any() and self.n and kw == "chain" and not self.atoms.chain.astype(bool).any():
            segids = _listing(self.atoms.segid)
            self.absent.append(f"no chain {' '.join(words)} (the atoms here have no chain id"
                               + (f"; their segids: {segids})" if self.atoms.segid.astype(bool).any() else ")"))
        elif not mask.any() and self.n:
            what = {"chain": "chains", "segid": "segids", "resname": "residue names", "name": "atom names",
                    "element": "elements"}[kw]
            self.absent.append(f"no {kw} {' '.join(words)} (the {what} here: {_listing(getattr(self.atoms, kw))})")
        return mask


def select_mask(atoms: AtomTable, selection, source: str | None) -> np.ndarray:
    """Boolean mask of shape (n_atoms,) for a selection string, index array or boolean mask."""
    n = len(atoms)
    where = source or "structure"
    if isinstance(selection, str):
        try:
            return _SelectionParser(atoms, selection, source).parse()
        except RecursionError:  # the parser descends once per parenthesis or operator
            raise InputError(f"selection of {len(selection)} characters nests too deeply (parentheses or "
                             "and/or/not chains); write it flatter") from None
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
