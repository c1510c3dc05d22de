"""Byte-level helpers of the fast PDB reader (:mod:`protgpu.io.pdb`): fixed-column rows, integer-held
text fields, decoded-field memos, coordinate and residue-number decoding.

Internal API, also used by tests and ``benchmarks/bench_io.py``: :class:`KeyMemo` and the memos
``ATOM_MEMO``, ``GUESS_MEMO``, ``RESID_MEMO`` with :func:`clear_memos`; :func:`parse_coord_fields`;
:func:`all_true` / :func:`any_true`; ``UINT``, :func:`strip_keys`, :func:`widen`;
:func:`element_table`; the tuning constants ``SCAN_BLOCK`` (bytes scanned for newlines per block)
and ``COORD_CHUNK`` (coordinate fields decoded per pass). See ``docs/design/io.md``.
"""

from __future__ import annotations

import threading
from functools import cached_property

import numpy as np

from ..errors import InputError
from ..structure import AMINO_ACIDS, NONSTANDARD_RESNAMES, WATER_RESNAMES, guess_elements, is_virtual_site

_REC_ATOM = int(np.frombuffer(b"ATOM", dtype="<u4")[0])
_REC_HETA = int(np.frombuffer(b"HETA", dtype="<u4")[0])
_REC_MODE = int(np.frombuffer(b"MODE", dtype="<u4")[0])
_REC_ENDM = int(np.frombuffer(b"ENDM", dtype="<u4")[0])
_RESID_WEIGHTS = np.array([1000, 100, 10, 1], dtype=np.int32)
UINT = {1: np.dtype(np.uint8), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_BLANKS = {w: int.from_bytes(b" " * w, "little") for w in UINT}
# More blocks than this and the rows are gathered byte by byte instead (a Python step per block).
_MAX_BLOCKS = 64


_SCRATCH = threading.local()


def _scratch(name: str, size: int, dtype) -> np.ndarray:
    """A per-thread work array of at least ``size`` elements, kept between calls.

    Temporaries of more than 128 KiB are mmap'ed by malloc and so come as fresh pages on every
    call; when other work (mdtraj, Biopython) runs between loads even smaller ones do, once the heap
    has been trimmed. A page fault costs microseconds (about 4 us each on the benchmark VMs), which
    for a 400 kB file added up to more than the parsing; the hot loops therefore work in blocks
    through these kept arrays (``out=``) instead of allocating.
    """
    if size * np.dtype(dtype).itemsize > _SCRATCH_MAX:  # a huge file: not worth keeping
        return np.empty(size, dtype=dtype)
    arrays = _SCRATCH.__dict__
    a = arrays.get(name)
    if a is None or a.shape[0] < size:
        a = arrays[name] = np.empty(size, dtype=dtype)
    return a[:size]


_SCRATCH_MAX = 16 << 20  # bytes; larger work arrays are allocated per call


# Bytes of text scanned for newlines per block (see _scratch).
SCAN_BLOCK = 1 << 16


def all_true(mask: np.ndarray) -> bool:
    """``mask.all()`` for a 1-D bool array, as the value at ``argmin`` (NumPy finds the first False
    of a bool array with a vectorised byte search and stops there): about a fifth of the cost of
    NumPy's reduction for the arrays of a small file (whose per-call overhead is most of the cost),
    and a third of a search in a copy of the bytes for a large one."""
    return not mask.shape[0] or bool(mask[mask.argmin()])


def any_true(mask: np.ndarray) -> bool:
    """``mask.any()`` for a 1-D bool array (see :func:`all_true`)."""
    return bool(mask.shape[0]) and bool(mask[mask.argmax()])


def _newlines(buf: np.ndarray) -> np.ndarray:
    """Positions of the newline bytes of ``buf``, int64, found a block at a time."""
    if buf.shape[0] <= SCAN_BLOCK:
        return np.flatnonzero(np.equal(buf, 10, out=_scratch("scan", buf.shape[0], bool)))
    found = []
    for a in range(0, buf.shape[0], SCAN_BLOCK):
        block = buf[a : a + SCAN_BLOCK]
        hits = np.flatnonzero(np.equal(block, 10, out=_scratch("scan", block.shape[0], bool)))
        hits += a
        found.append(hits)
    return np.concatenate(found)


class _Rows:
    """Columns 1-80 of the atom lines as one (n, W) byte matrix; fields are strided views of it.

    Every PDB field is a fixed column range, so with the lines at a constant stride W the field at
    columns ``c:c+w`` of all lines is a zero-copy view ``np.ndarray(offset=c, strides=(W,))`` read
    as one unsigned integer per line. Fancy-indexing the text at each line start instead costs
    about 9 ns per element for an unaligned multi-byte dtype, several times a strided read.

    The matrix is copied out of the text in blocks: atom lines at one constant distance from each
    other (the ATOM lines between two TER/MODEL records, or ATOM lines interleaved with ANISOU) are
    one strided 2-D view of the text, copied by one assignment (a plain memcpy when they are
    consecutive lines). Lines shorter than W - 1, and all lines when there are more than
    ``_MAX_BLOCKS`` blocks, are gathered byte by byte and padded with blanks. Columns past every
    line's end (W - 1 < 80) read as blanks.
    """

    def __init__(self, buffer, base: int, stride: int, n: int, width: int):
        self.buffer = buffer  # the file's bytes, or a private copy of the rows
        self.base = base  # offset of row 0 in buffer
        self.stride = stride  # bytes from one row to the next (>= width)
        self.n = n
        self.width = width
        # One structured view of the rows holds the fields the reader uses that lie inside the lines:
        # taking a field of it is a dictionary lookup, a third of the cost of a new strided ndarray.
        dtype, self.inside = _row_dtype(stride, width - 1)
        self.fields = np.ndarray((n,), dtype, buffer=buffer, offset=base)

    @cached_property
    def matrix(self) -> np.ndarray:
        """The rows as an (n, width) uint8 matrix (a view)."""
        shape, strides = (self.n, self.width), (self.stride, 1)
        return np.ndarray(shape, np.uint8, buffer=self.buffer, offset=self.base, strides=strides)

    @classmethod
    def empty(cls, n: int, width: int) -> _Rows:
        # 80 spare bytes: a field view of the last row may reach column 80 (masked to blanks below)
        return cls(np.empty(n * width + 80, dtype=np.uint8), 0, width, n, width)

    @classmethod
    def from_text(
        cls, data: bytes, buf: np.ndarray, s: np.ndarray, lengths: np.ndarray, shortest: int, longest: int
    ) -> _Rows:
        n = s.shape[0]
        w = min(longest, 80) + 1
        if shortest == longest:
            stride = longest + 1
            if s[-1] - s[0] == (n - 1) * stride and int(s[-1]) + 80 <= len(data):
                # Consecutive lines of one length (lines at least stride apart, and n - 1 gaps
                # that add up to exactly that): the text itself is the matrix, nothing is copied.
                return cls(data, int(s[0]), stride, n, w)
            # Runs of consecutive atom lines (between TER, MODEL/ENDMDL, CONECT ... records) are
            # copied next to each other into a kept work array: one copy per run, no Python step
            # per row.
            brk = np.flatnonzero(np.diff(s) != stride)
            if brk.size < _MAX_BLOCKS:
                begin = [int(s[0])] + (s[brk + 1]).tolist()
                end = (s[brk] + stride).tolist() + [int(s[-1]) + stride]
                text = _scratch("rows", n * stride + 80, np.uint8)
                at = 0
                for a, b in zip(begin, end, strict=True):
                    text[at : at + b - a] = buf[a:b]
                    at += b - a
                text[at:] = 32  # 80 blanks after the last row: a field view may read up to column 80
                return cls(text, 0, stride, n, w)
        rows = cls.empty(n, w)
        w = rows.width
        full = lengths >= w - 1
        short = None if full.all() else ~full
        if n > 1:
            d = np.diff(s)
            # block starts: row 0, and row i + 1 wherever the distance to the next line changes
            cut = np.empty(n, dtype=bool)
            cut[0], cut[1] = True, False
            np.not_equal(d[1:], d[:-1], out=cut[2:])
            if short is not None:  # short lines are gathered on their own
                cut |= short
                cut[1:] |= short[:-1]
            first = np.flatnonzero(cut)
        else:
            d, first = None, np.zeros(1, dtype=np.int64)
        if first.size > _MAX_BLOCKS:
            rows.matrix[:] = _gather_rows(buf, s, lengths, w)
            return rows
        bounds = first.tolist() + [n]
        starts = s[first].tolist()
        strides = d[first[first < n - 1]].tolist() if d is not None else []
        for k in range(first.size):
            a, e = bounds[k], bounds[k + 1]
            if short is not None and short[a]:
                continue
            stride = strides[k] if e - a > 1 else w
            rows.matrix[a:e] = np.ndarray((e - a, w), np.uint8, buffer=data, offset=starts[k], strides=(stride, 1))
        if short is not None:
            idx = np.flatnonzero(short)
            rows.matrix[idx] = _gather_rows(buf, s[idx], lengths[idx], w)
        return rows

    def take(self, index: np.ndarray) -> _Rows:
        sub = self.matrix[index]
        out = _Rows.empty(sub.shape[0], self.width)
        out.matrix[:] = sub
        return out

    def get(self, col: int, width: int, n: int | None = None) -> np.ndarray:
        """Columns col:col+width of the first ``n`` rows (all by default), one uint per row, a view."""
        field = _ROW_FIELDS.get((col, width))
        if field in self.inside:
            v = self.fields[field]
            return v if n is None or n == self.n else v[:n]
        n = self.n if n is None else n
        dtype = UINT[width]
        last = self.width - 1  # columns >= last are past the end of every line
        if col >= last:
            return np.full(n, _BLANKS[width], dtype=dtype)
        v = np.ndarray((n,), dtype, buffer=self.buffer, offset=self.base + col, strides=(self.stride,))
        if col + width > last:
            keep = (1 << (8 * (last - col))) - 1
            v = (v & dtype.type(keep)) | dtype.type(_BLANKS[width] & ~keep)
        return v

    def columns(self, col: int, width: int, index: np.ndarray) -> np.ndarray:
        """Bytes of columns col:col+width of the rows ``index``, shape (len(index), width) uint8."""
        out = self.matrix[index, col : col + width]
        if out.shape[1] < width or col + width > self.width - 1:
            pad = np.full((out.shape[0], width), 32, dtype=np.uint8)
            keep = max(0, min(width, self.width - 1 - col))
            pad[:, :keep] = out[:, :keep]
            out = pad
        return out


# The fields _Rows.get is asked for, (first column, width) -> field name of the rows' structured view.
_ROW_FIELDS = {
    (c, w): f"c{c}w{w}"
    for c, w in (
        (0, 4), (12, 4), (16, 1), (17, 4), (17, 8), (21, 1), (21, 4), (22, 4), (25, 2), (26, 1), (72, 4), (76, 2)
    )
}
_ROW_DTYPES: dict = {}


def _row_dtype(stride: int, last: int) -> tuple[np.dtype, frozenset]:
    """Structured dtype of one row of ``stride`` bytes whose columns from ``last`` on are past the
    line's end: the :data:`_ROW_FIELDS` that end before ``last`` (overlapping fields are allowed),
    and "xyz", the 24 coordinate columns (every atom line has them). Also the names of those fields.
    Built once per (stride, last)."""
    key = (stride, last)
    found = _ROW_DTYPES.get(key)
    if found is None:
        inside = {cw: f for cw, f in _ROW_FIELDS.items() if cw[0] + cw[1] <= last}
        dtype = np.dtype({
            "names": list(inside.values()) + ["xyz"],
            "formats": [UINT[w] for _, w in inside] + ["V24"],
            "offsets": [c for c, _ in inside] + [30],
            "itemsize": stride,
        })
        found = _ROW_DTYPES[key] = (dtype, frozenset(inside.values()))
    return found


def _gather_rows(buf: np.ndarray, s: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """Rows of ``width`` bytes at the line starts ``s``, blank past each line's length."""
    cols = np.arange(width)
    idx = s[:, None] + cols
    np.minimum(idx, buf.shape[0] - 1, out=idx)
    rows = buf[idx]
    rows[cols >= lengths[:, None]] = 32
    return rows


def strip_keys(keys: np.ndarray, width: int) -> np.ndarray:
    """Fixed-width text fields held as unsigned integers (first character in the low byte) to a
    '<U{width}' array, blanks and NULs stripped from both ends as ``str.strip`` does.

    Word arithmetic on one integer per field, no Python loop: leading blanks are shifted out
    (at most width - 1 steps, stopping when no field has one), then trailing blanks zeroed from
    the top byte down; a '<U' string ends at its first trailing NUL, so the zeroed bytes vanish
    when the bytes are widened to UCS-4 code points and viewed as strings.
    """
    dtype = UINT[width]
    k = np.ascontiguousarray(keys, dtype=dtype)
    low, blank = dtype.type(0xFF), dtype.type(0x20)
    for _ in range(width - 1):
        lead = ((k | blank) & low) == blank  # first byte is a blank or NUL
        if not lead.any():
            break
        k = np.where(lead, k >> dtype.type(8), k)
    for byte in range(width - 1, -1, -1):
        shift = dtype.type(8 * byte)
        top = ((k >> shift) | blank) == blank  # byte is a blank/NUL and nothing follows it
        if top.any():
            k = np.where(top, k & dtype.type((1 << (8 * byte)) - 1), k)
    return widen(k, width)


def widen(keys: np.ndarray, width: int) -> np.ndarray:
    """Integer-held text fields to '<U{width}' as they are (latin-1: byte b is code point b)."""
    raw = np.ascontiguousarray(keys, dtype=UINT[width]).view(np.uint8).reshape(-1, width)
    return raw.astype(np.uint32).view(f"<U{width}").ravel()


def _distinct_text(keys: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct values of integer-held text fields, decoded (stripped) once each.

    Atom names, residue names and segment ids take few distinct values, so sorting the keys
    (a few microseconds for thousands of 4-byte integers) and decoding the distinct ones in Python
    costs less than word arithmetic on every field; many distinct values go through
    :func:`strip_keys` instead.

    Returns
    -------
    uniq : np.ndarray of uint, shape (k,)
        Sorted distinct keys.
    text : np.ndarray of '<U{width}', shape (k,)
        Their stripped text.
    inverse : np.ndarray of intp, shape (n,)
        ``text[inverse]`` is the text of every field.
    """
    n = keys.shape[0]
    srt = np.sort(keys)
    new = np.empty(n, dtype=bool)
    new[:1] = True
    np.not_equal(srt[1:], srt[:-1], out=new[1:])
    uniq = srt[new]
    if uniq.size > 256:
        text = strip_keys(uniq, width)
    else:
        # 'S' tolist drops trailing NULs; strip the rest as strip_keys does (blanks and NULs)
        text = np.array(
            [b.strip(b" \x00").decode("latin-1") for b in uniq.view(f"S{width}").tolist()], dtype=f"<U{width}"
        )
    return uniq, text, np.searchsorted(uniq, keys)


def _text_of(key, width: int) -> str:
    """One integer-held field as stripped text (see :func:`strip_keys`)."""
    return int(key).to_bytes(width, "little").strip(b" \x00").decode("latin-1")


class KeyMemo:
    """Decoded values of integer-held fields, kept across loads: sorted keys and their values.

    Atom names, residue names and residue numbers repeat from one file to the next (a few hundred
    distinct (atom name, residue name) pairs, residue numbers 1..a few thousand), so a lookup in
    what earlier loads decoded (one binary search per field, four NumPy calls in all) replaces
    decoding them again; only files with keys not seen before decode theirs and add them. The state
    is one tuple (keys, value arrays...) replaced whole, so concurrent loads (threads of the batch
    engine) read consistent arrays; an insertion lost to a race only costs a later re-decode.
    Growth stops at ``limit`` keys.
    """

    def __init__(self, key_dtype, *value_dtypes, limit: int = 1 << 16):
        self.state = (np.zeros(0, key_dtype), *(np.zeros(0, d) for d in value_dtypes))
        self.limit = limit

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, tuple] | None:
        """Positions of ``keys`` (shape (n,), the key dtype) among the known keys, and the state they
        index, or None when any key is not known."""
        state = self.state
        known = state[0]
        if not known.size:
            return None
        at = known.searchsorted(keys)  # (the method: np.searchsorted adds a wrapper call)
        # mode="clip": a key above every known one lands on the last and fails the comparison, done
        # on the bytes (one memcmp, cheaper than an elementwise comparison and a reduction)
        if known.take(at, mode="clip").tobytes() != keys.tobytes():
            return None
        return at, state

    def clear(self) -> None:
        """Forget every key."""
        self.state = tuple(a[:0] for a in self.state)

    def add(self, keys: np.ndarray, *values: np.ndarray, unique: bool = False) -> None:
        """Remember ``values[j][i]`` for ``keys[i]`` (keys may repeat; the first value is kept).
        ``unique``: the keys are sorted and distinct already (np.unique's), for a shortcut when
        nothing is known yet."""
        known, *old = self.state
        if known.size >= self.limit:
            return
        if unique and not known.size and keys.dtype == known.dtype:
            self.state = (keys, *(v.astype(o.dtype, copy=False) for o, v in zip(old, values, strict=True)))
            return
        keys = np.concatenate([known, keys.astype(known.dtype, copy=False)])
        # known keys first: np.unique's first occurrences keep the values remembered before
        uniq, first = np.unique(keys, return_index=True)
        merged = (np.concatenate([o, v.astype(o.dtype, copy=False)])[first] for o, v in zip(old, values, strict=True))
        self.state = (uniq, *merged)


# (atom name key | residue name key << 32), columns 13-16 and 18-21 -> atom name and residue
# name (stripped '<U4'); and -> the element guessed from them ('<U2'), for atoms without an element
# column (a separate memo: files with element columns never guess).
ATOM_MEMO = KeyMemo(np.uint64, "<U4", "<U4")
GUESS_MEMO = KeyMemo(np.uint64, "<U2")
# Residue-number fields (columns 23-26) -> int32.
RESID_MEMO = KeyMemo(np.uint32, np.int32)


def clear_memos() -> None:
    """Forget what earlier loads decoded (for tests, and benchmarks of a first load)."""
    for memo in (ATOM_MEMO, GUESS_MEMO, RESID_MEMO):
        memo.clear()


def _atom_text(pair: np.ndarray, name_key: np.ndarray, res_key: np.ndarray):
    """Atom and residue name of every row, as indexes into two small tables.

    Parameters
    ----------
    pair : np.ndarray of uint64, shape (n,)
        ``name_key | res_key << 32``.
    name_key, res_key : np.ndarray of uint32, shape (n,)
        Columns 13-16 and 18-21 as written (:meth:`_Rows.get`).

    Returns
    -------
    at : np.ndarray of intp, shape (n,)
    names, resnames : np.ndarray of '<U4'
        Row i has atom name ``names[at[i]]`` and residue name ``resnames[at[i]]``.
    """
    found = ATOM_MEMO.find(pair)
    if found is not None:
        at, (_, names, resnames) = found
        return at, names, resnames
    # New pairs: decode the distinct ones (names and residue names in one sort) and remember them.
    uniq, first, at = np.unique(pair, return_index=True, return_inverse=True)
    k = uniq.shape[0]
    _, text, inverse = _distinct_text(np.concatenate([name_key[first], res_key[first]]), 4)
    names, resnames = text[inverse[:k]], text[inverse[k:]]
    ATOM_MEMO.add(uniq, names, resnames, unique=True)
    return at.ravel(), names, resnames


def _guessed_elements(pair: np.ndarray, name_key: np.ndarray, res_key: np.ndarray) -> np.ndarray:
    """Elements ('<U2', shape (n,)) guessed from the atom and residue names of rows without an
    element column (arguments as :func:`_atom_text`), by :func:`_guess_pdb_elements` once per
    distinct pair and remembered."""
    found = GUESS_MEMO.find(pair)
    if found is not None:
        at, (_, elements) = found
        return elements.take(at)
    uniq, first, at = np.unique(pair, return_index=True, return_inverse=True)
    k = uniq.shape[0]
    keys, text, inverse = _distinct_text(np.concatenate([name_key[first], res_key[first]]), 4)
    elements = _guess_pdb_elements(keys, text, inverse[:k], inverse[k:], np.arange(k))
    GUESS_MEMO.add(uniq, elements, unique=True)
    return elements.take(at.ravel())


def _char_table() -> np.ndarray:
    """'<U1' text of each byte value for one-column fields (chain, insertion code); blank/NUL -> ''."""
    table = np.arange(256, dtype=np.uint32)
    table[[0, 32]] = 0
    return table.view("<U1")


_CHAR = _char_table()


def _char_column(keys: np.ndarray) -> np.ndarray:
    """One-column field (uint8 per row) to '<U1', by one lookup per row (``take``); a blank column
    (insertion codes, nearly always) is a zeroed array, the cheaper of the two."""
    if _is_blank(keys):
        return np.zeros(keys.shape[0], dtype="<U1")
    return _CHAR.take(keys)


def _is_blank(keys: np.ndarray) -> bool:
    """Whether a one-column field (uint8 per row, any stride) is blank on every row: one bytes
    comparison, the cheapest test of it."""
    raw = keys.tobytes()
    n = len(raw)
    return raw == (_BLANK_BYTES[:n] if n <= len(_BLANK_BYTES) else b" " * n)


_BLANK_BYTES = b" " * 65536
_ELEMENTS: tuple[np.ndarray, np.ndarray] | None = None


def element_table() -> tuple[np.ndarray, np.ndarray]:
    """Element symbol ('<U2') and validity of every 2-byte value of columns 77-78, built once.

    The text is upper-cased and stripped; a valid symbol is one or two letters, anything else
    (blank, digits) means "guess it from the atom name". One lookup per atom then replaces the
    per-file decoding.
    """
    global _ELEMENTS
    if _ELEMENTS is None:
        b = np.arange(65536, dtype=np.uint32).view(np.uint8).reshape(-1, 4)[:, :2].astype(np.uint32)
        b -= ((b >= 97) & (b <= 122)) * np.uint32(32)
        blank = (b == 32) | (b == 0)
        lead = blank[:, 0]  # " C" -> "C"
        b[lead, 0], b[lead, 1] = b[lead, 1], 0
        blank = (b == 32) | (b == 0)
        b[blank[:, 1], 1] = 0
        b[blank[:, 0] & (b[:, 1] == 0), 0] = 0
        letter = (b >= 65) & (b <= 90)
        valid = letter[:, 0] & (letter[:, 1] | (b[:, 1] == 0))
        symbols = np.ascontiguousarray(b).view("<U2").ravel()
        # virtual sites written in the element column ("M" of TIP4P, "EP", "LP", "VS"): no element
        symbols[np.isin(symbols, ["M", "EP", "LP", "VS"])] = ""
        _ELEMENTS = (symbols, valid)
    return _ELEMENTS


def _parse_coords(rows: _Rows, line_no, name: str) -> tuple[np.ndarray, bool]:
    """Coordinates (columns 31-38, 39-46, 47-54) of every row, shape (rows, 3) float32, and whether
    all are known finite (every field had the standard form).

    The 24 columns of each row are one 24-byte item of a strided view of the row matrix, decoded
    ``COORD_CHUNK`` fields (a third as many rows) at a time by :func:`parse_coord_fields`.

    Parameters
    ----------
    line_no : callable
        ``line_no(i)``: file line number of row i, for the error message.
    """
    n = rows.n
    out = np.empty((n, 3), dtype=np.float32)
    xyz = rows.fields["xyz"]
    step = max(1, COORD_CHUNK // 3)
    if n <= step:  # (one pass: no slicing)
        return out, parse_coord_fields(xyz, out, 0, line_no, name)
    finite = True
    for a in range(0, n, step):
        finite &= parse_coord_fields(xyz[a : a + step], out[a : a + step], a, line_no, name)
    return out, finite


# Fields decoded per pass. Smaller passes keep the work arrays in cache but cost more NumPy calls,
# which is the dearer side when other work has run in between (as in the benchmark, where mdtraj
# and Biopython run between loads).
COORD_CHUNK = 16384


def _coord_forms() -> np.ndarray:
    """The standard ``%8.3f`` fields with every digit written as '0', in a perfect-hash table.

    Such a field is k blanks (k = 0..3), an optional minus, at least one digit, a point and three
    digits: seven forms, as uint64 (first column in the low byte). ``(word * _HASH) >> 61`` puts
    each in its own of 8 slots; a slot holds its form ("form", 0 where none, which no 8-byte text
    equals) and the divisor that scales its thousandths ("divisor", -1000 with a minus). One
    16-byte record per slot: a single ``take`` fetches both (as fast as taking one of them).
    """
    table = np.zeros(8, dtype=np.dtype({"names": ["form", "divisor"], "formats": ["<u8", "<f4"], "itemsize": 16}))
    table["divisor"] = 1.0
    for k in range(4):
        for minus in (False, True):
            digits = 4 - k - minus
            if digits >= 1:
                word = int.from_bytes(b" " * k + b"-" * minus + b"0" * digits + b".000", "little")
                slot = ((word * _HASH) % (1 << 64)) >> 61
                if table["form"][slot]:  # pragma: no cover - fixed by the choice of _HASH
                    raise RuntimeError("coordinate form hash collision")
                table[slot] = (word, -1000.0 if minus else 1000.0)
    return table


_HASH = 11830416603374763041  # odd multiplier found by search: the seven forms hash apart
_COORD_FORMS = _coord_forms()
# The constants of parse_coord_fields as NumPy scalars made once (a scalar costs a fraction of a
# microsecond to make, a few percent of decoding a small file's coordinates).
_C48, _C10 = np.uint8(48), np.uint8(10)
_CHASH, _C8, _C16, _C32, _C61 = np.uint64(_HASH), np.uint64(8), np.uint64(16), np.uint64(32), np.uint64(61)
_C_MUL1, _C_MUL2, _C_MUL3 = np.uint64(1 + (10 << 8)), np.uint64(1 + (100 << 16)), np.uint64(1 + (1000 << 32))
_C_MASK1, _C_MASK2 = np.uint64(0x00FF00FF00FF00FF), np.uint64(0x0000FFFF0000FFFF)


def parse_coord_fields(fields: np.ndarray, out: np.ndarray, first: int, line_no, name: str) -> bool:
    """Coordinate columns of ``m`` rows ('V24' items, any stride) to float32 ``out`` of shape (m, 3).

    Fast path: every 8-column field has the standard ``%8.3f`` form (blanks, an optional minus,
    digits, a point in the fifth column, three decimals). The digits are cut out (byte minus '0',
    kept where below 10); the field with its digits replaced by '0' is then one of seven words,
    found by one multiplicative hash and one table comparison, which also gives the sign. The digits
    are combined into the value in thousandths with integer word arithmetic (exact, below 2**24,
    so exact in float32 too) and divided by +-1000 in float32: for every value of that range this
    equals ``float(text)`` rounded to float32 (checked exhaustively: float32 division rounds once,
    as float64 division then rounding to float32 does here). Anything else (other decimal counts,
    ``nan``) goes through NumPy's string-to-float conversion, which reports the bad line (``first``
    is the row index of ``fields[0]``). Returns whether the fast path was taken (the values are
    then finite).
    """
    m = fields.shape[0]
    k = 3 * m
    # one work array (see _scratch) holds the text, the digits and their mask, then the hash slots
    work = _scratch("coords", 72 * m, np.uint8)
    text, d, isdig = work[: 24 * m], work[24 * m : 48 * m], work[48 * m : 72 * m].view(bool)
    np.copyto(text.view("V24"), fields)  # the rows' columns 31-54 side by side: contiguous from here on
    np.subtract(text, _C48, out=d)
    d *= np.less(d, _C10, out=isdig).view(np.uint8)  # wrapped non-digits -> 0 (uint8 x uint8: no cast)
    form = np.subtract(text, d, out=text).view("<u8")  # (the text itself is not needed again)
    slot = np.multiply(form, _CHASH, out=isdig.view("<u8"))  # (the digit mask is not needed again)
    slot >>= _C61
    slot = slot.view(np.int64)  # 0..7
    expected = _COORD_FORMS.take(slot)
    if all_true(expected["form"] == form):
        # Digits to the value in thousandths inside each uint64 (first column in the low byte, the
        # point column holds 0): adjacent bytes, then 16-bit lanes, then the integer part (lane 0)
        # times 1000 plus the thousandths (lane 2), each step one multiply-shift-mask on every
        # field at once. (A float matrix product would be two calls, but OpenBLAS starts threads
        # for it above ~9k elements, which costs more than it saves.)
        v = d.view("<u8")
        v *= _C_MUL1
        v >>= _C8
        v &= _C_MASK1
        v *= _C_MUL2
        v >>= _C16
        v &= _C_MASK2
        v *= _C_MUL3  # (the product's bits past 64 are the part not wanted)
        v >>= _C32
        flat = out.reshape(k)
        np.copyto(flat, v, casting="unsafe")  # exact: below 2**24
        flat /= expected["divisor"]
        return True
    raw = np.empty(24 * m, dtype=np.uint8)
    np.copyto(raw.view("V24"), fields)
    text = raw.view("S8")
    # plain decimal numbers only: NumPy would also read "1_000", "1e30", "inf" and "nan"
    odd = ~_PLAIN_DECIMAL[raw].reshape(k, 8).all(axis=1)
    if odd.any():
        i = int(np.argmax(odd))
        raise InputError(
            f"{name}: line {line_no(first + i // 3)}: bad coordinate {text[i].decode('latin-1').strip()!r} in "
            "columns 31-54 (coordinates must be plain decimal numbers)"
        )
    try:
        values = text.astype(np.float64)
        big = np.abs(values) >= _MAX_COORD
        if big.any():
            i = int(np.argmax(big))
            raise InputError(
                f"{name}: line {line_no(first + i // 3)}: coordinate {text[i].decode('latin-1').strip()!r} out "
                f"of range (|x| must be below {_MAX_COORD:g} A)"
            )
        out.reshape(k)[:] = values
    except ValueError as exc:
        if isinstance(exc, InputError):
            raise
        for i, v in enumerate(text.tolist()):
            try:
                float(v)
            except ValueError:
                raise InputError(
                    f"{name}: line {line_no(first + i // 3)}: bad coordinate {v.decode('latin-1').strip()!r} "
                    "in columns 31-54"
                ) from None
        raise  # pragma: no cover - one field must have failed
    return False


_PLAIN_DECIMAL = np.zeros(256, dtype=bool)
_PLAIN_DECIMAL[list(b"0123456789.-+ ")] = True
_MAX_COORD = 1e5  # Angstrom (as protgpu.io.load.MAX_COORD)


def _hybrid36(text: str) -> int | None:
    """Decode a 4-character residue number that may be hybrid-36 encoded (A000 = 10000)."""
    t = text.strip()
    try:
        return int(t)
    except ValueError:
        pass
    if len(t) != 4 or not t.isalnum():
        return None
    try:
        v = int(t, 36)
    except ValueError:
        return None
    if t[0].isupper():
        return v - 10 * 36**3 + 10000
    return v + 16 * 36**3 + 10000


def _parse_resid(keys: np.ndarray, line_no, name: str) -> np.ndarray:
    """Residue-number fields (columns 23-26) as uint32 keys, shape (n,) -> (n,) int32.

    ``line_no(i)`` is the file line of ``keys[i]``, for the error message. Values already decoded
    by an earlier load come from :data:`RESID_MEMO`.
    """
    found = RESID_MEMO.find(keys)
    if found is None:
        values = _decode_resid(keys, line_no, name)
        RESID_MEMO.add(keys, values)
        return values
    at, (_, values) = found
    return values.take(at)


def _decode_resid(keys: np.ndarray, line_no, name: str) -> np.ndarray:
    """:func:`_parse_resid` without the memo."""
    n = keys.shape[0]
    rb = np.ascontiguousarray(keys, dtype="<u4").view(np.uint8).reshape(n, 4)
    d = rb - np.uint8(48)
    isdig = d < 10
    if n and (isdig | (rb == 32) | (rb == 45)).all() and isdig[:, 3].all():
        value = (d * isdig).astype(np.int32) @ _RESID_WEIGHTS
        neg = (rb == 45).view("<u4").ravel() != 0
        return np.where(neg, -value, value).astype(np.int32)
    # Unusual numbers (hybrid-36 beyond 9999, left-justified): decode each distinct value once.
    uniq = np.unique(keys)
    inverse = np.searchsorted(uniq, keys)
    values = []
    for k, r in enumerate(np.ascontiguousarray(uniq, dtype="<u4").view(np.uint8).reshape(-1, 4)):
        v = _hybrid36(bytes(r).decode("latin-1"))
        if v is None:
            row = int(np.flatnonzero(inverse == k)[0])
            raise InputError(
                f"{name}: line {line_no(row)}: bad residue number {bytes(r).decode('latin-1')!r} in columns 23-26"
            )
        values.append(v)
    return np.asarray(values, dtype=np.int32)[inverse]


def _parse_occupancy(raw: np.ndarray) -> np.ndarray:
    """Columns 55-60, (n, 6) bytes, as float64; a missing or unreadable occupancy reads 0 (it never wins)."""
    text = np.ascontiguousarray(raw).view("S6").ravel()
    try:
        return text.astype(np.float64)
    except ValueError:
        out = np.zeros(text.shape[0])
        for i, v in enumerate(text.tolist()):
            try:
                out[i] = float(v)
            except ValueError:
                pass
        return out


def _guess_pdb_elements(
    uniq: np.ndarray, text: np.ndarray, name_index: np.ndarray, res_index: np.ndarray, residue_index: np.ndarray
) -> np.ndarray:
    """Elements of atoms without an element column, from the 4-column padded name and residue name.

    Parameters
    ----------
    uniq, text : np.ndarray, shape (k,)
        Distinct name/residue-name keys (uint32, columns as written) and their stripped text
        (:func:`_distinct_text`).
    name_index : np.ndarray of intp, shape (m,)
        Each atom's name, as an index into ``uniq``.
    res_index : np.ndarray of intp, shape (R,)
        Each residue's name, as an index into ``uniq``.
    residue_index : np.ndarray of int, shape (m,)
        Each atom's residue.

    Notes
    -----
    Atoms of amino acids and water take the first letter of their name (selenium of MSE/SEC
    excepted): worked out once per distinct name and residue name. Others go through
    :func:`protgpu.structure.guess_elements`, once per distinct (name, residue name).
    """
    k = uniq.shape[0]
    raw = np.ascontiguousarray(uniq, dtype="<u4").view(np.uint8).reshape(k, 4)
    upper = raw & np.uint8(0xDF)  # ASCII upper-case; digits and blanks do not become letters
    is_letter = (upper >= 65) & (upper <= 90)
    first = np.argmax(is_letter, axis=1)
    rows = np.arange(k)
    letter = np.where(is_letter[rows, first], upper[rows, first], np.uint8(ord("X")))
    # "S" followed by "E" (upper-cased) in a name: selenium when the residue is MSE or SEC
    se_name = (letter == ord("S")) & (upper[rows, np.minimum(first + 1, 3)] == ord("E"))
    # A '<U2' string is two UCS-4 code points: write them directly (S1 -> U2 astype is slow).
    code_points = np.zeros((k, 2), dtype=np.uint32)
    code_points[:, 0] = letter
    guess = code_points.view("<U2").ravel()
    # residue classes, per distinct text (few), as standardize_resnames + the sets would give them
    polymer_t, selen_t = [], []
    for t in text.tolist():
        polymer_t.append(NONSTANDARD_RESNAMES.get(t.upper(), t) in AMINO_ACIDS or t in WATER_RESNAMES)
        selen_t.append(t in ("MSE", "SEC"))
    res_of_atom = res_index[residue_index]
    polymer = np.array(polymer_t)[res_of_atom]
    out = guess[name_index]
    out[se_name[name_index] & np.array(selen_t)[res_of_atom]] = "SE"
    water = np.array([t in WATER_RESNAMES for t in text.tolist()])[res_of_atom]
    if water.any():  # a water model's virtual sites (TIP4P MW, ...) have no element
        site = np.array([is_virtual_site(t, "HOH") for t in text.tolist()])  # (per distinct name)
        out[water & site[name_index]] = ""
    other = ~polymer
    if other.any():
        padded = widen(uniq[name_index[other]], 4)
        out[other] = guess_elements(padded, text[res_of_atom[other]])
    return out
