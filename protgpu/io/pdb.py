"""The fast PDB reader: PDB text (bytes) to a :class:`~protgpu.structure.core.Structure`.

A vectorised fixed-column reader of the ATOM/HETATM/MODEL/ENDMDL records; the byte-level helpers
live in :mod:`protgpu.io._pdbscan`. ``docs/design/io.md`` explains the design and its measurements.
Internal API: :func:`parse_pdb` (for :mod:`protgpu.io.load`) and :func:`atom_block` (the fast
layout; tests turn it off to exercise the general reader).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..structure import AtomTable, Structure
from ._common import altloc_keep, cell_box, check_model_atoms, check_models, split_models
from ._pdbscan import (
    _BLANK_BYTES,
    _MAX_BLOCKS,
    _REC_ATOM,
    _REC_ENDM,
    _REC_HETA,
    _REC_MODE,
    _atom_text,
    _char_column,
    _distinct_text,
    _guessed_elements,
    _is_blank,
    _newlines,
    _parse_coords,
    _parse_occupancy,
    _parse_resid,
    _Rows,
    _scratch,
    _text_of,
    all_true,
    any_true,
    element_table,
)
from .mmcif import read_mmcif


def parse_pdb(data: bytes, name: str, *, altloc: str, model, path: str | Path | None = None) -> Structure:
    """Parse PDB text into a Structure (every model a frame). See :func:`load` for the rules.

    Vectorised: the atom lines become a fixed-width byte matrix (:class:`_Rows`) and every field is
    a strided integer view of it; Python loops run only over blocks of lines and MODEL records.
    The usual file, one run of equal-length ATOM/HETATM lines with no MODEL record, is recognised
    by a few byte searches and used in place (:func:`atom_block`); any other layout has its lines
    found with one comparison over the bytes (:func:`_atom_lines`).
    """
    if _looks_like_mmcif(data):
        # mmCIF saved as .pdb: its atom_site loop lines also start with ATOM, so decide first.
        if path is None:  # pragma: no cover - load always passes the path
            raise InputError(f"{name}: content is mmCIF; save it as .cif")
        return read_mmcif(path, name, altloc=altloc, model=model)
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark (it would hide the first record)
        data = data[3:]
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if not data.endswith(b"\n"):
        data += b"\n"  # so that every line, the last one too, ends at a newline
    if len(data) < 5:
        raise InputError(f"{name}: no ATOM/HETATM records found (not a PDB file?)")
    block = atom_block(data)
    if block is not None:
        rows, line_no, hetero = block
        model_id, model_numbers = None, [1]
    else:
        rows, atom_lines, hetero, model_id, model_numbers = _atom_lines(data, name)
        line_no = (lambda lines: lambda i: int(lines[i]) + 1)(atom_lines)

    all_models = model_numbers
    keep = None
    alt = rows.get(16, 1)
    if not _is_blank(alt):
        has_alt = alt != 32
        # Altlocs of one atom share model, chain, residue number, insertion code (cols 22-27) and name.
        key_a, key_b = rows.get(21, 4), rows.get(25, 2)
        change = np.ones(rows.n, dtype=bool)
        change[1:] = (key_a[1:] != key_a[:-1]) | (key_b[1:] != key_b[:-1])
        if model_id is not None:
            change[1:] |= model_id[1:] != model_id[:-1]
        keep = altloc_keep(
            np.cumsum(change), rows.get(12, 4), has_alt,
            lambda idx: _parse_occupancy(rows.columns(54, 6, idx)), altloc,
        )
    if model is not None:
        sel, model_numbers = split_models(
            np.zeros(rows.n, np.int64) if model_id is None else model_id, model_numbers, model, name
        )
        keep = sel if keep is None else keep & sel
    if keep is not None and not keep.all():
        idx = np.flatnonzero(keep)
        if not idx.size:  # (an ENDMDL before the first atom makes an empty model 1)
            raise InputError(f"{name}: model {model} has no atoms")
        rows, hetero = rows.take(idx), hetero[idx]
        line_no = (lambda of, idx: lambda i: of(int(idx[i])))(line_no, idx)
        model_id = None if model_id is None else model_id[idx]

    n_models = len(model_numbers)
    if n_models > 1:
        counts = np.bincount(model_id, minlength=n_models)
        check_models(counts, model_numbers, name)
        n = int(counts[0])

        def describe(m, a):
            row = bytes(rows.matrix[m * n + a, :21]).decode("latin-1")
            return f"{row[12:16].strip()} {row[17:21].strip()}"

        check_model_atoms(rows.get(12, 4), n_models, model_numbers, describe, name)
        check_model_atoms(rows.get(17, 4), n_models, model_numbers, describe, name)
    else:
        n = rows.n

    coords, finite = _parse_coords(rows, line_no, name)
    coords = coords.reshape(n_models, n, 3)
    atoms = _atom_table_from_pdb(rows, n, hetero[:n], line_no, name)
    box = cryst1_boxes(data, all_models, model_numbers, name) if b"CRYST1" in data else None
    if finite:  # C-contiguous float32 of the table's atoms, all finite: nothing for __init__ to check
        s = Structure._from_parts(coords, atoms, name)
        if box is not None:
            s.box, s.box_source = np.ascontiguousarray(np.broadcast_to(box, (n_models, 3, 3))), "crystal"
        return s
    return Structure(coords, atoms, source=name, box=box, box_source="crystal")


_CRYST1 = re.compile(rb"^CRYST1([^\n]*)", re.MULTILINE)


def cryst1_boxes(data: bytes, all_models: list[int], kept: list[int], name: str) -> np.ndarray | None:
    """Box vectors (Angstrom) of the CRYST1 records: shape (3, 3) for one cell, (kept models, 3, 3)
    when every model has its own; None for no record, the ``1 1 1`` placeholder or an all-zero cell.
    With neither one record nor one per model, the first record holds for every model."""
    cells = []
    for m in _CRYST1.finditer(data):
        rec = m.group(1).decode("latin-1").ljust(48)
        fields = [rec[0:9], rec[9:18], rec[18:27], rec[27:34], rec[34:41], rec[41:48]]
        try:
            cells.append([float(f) if f.strip() else 0.0 for f in fields])
        except ValueError:
            line = data.count(b"\n", 0, m.start()) + 1
            raise InputError(f"{name}: line {line}: bad CRYST1 record {m.group(0).decode('latin-1')!r}") from None
    if not cells:
        return None
    if len(cells) == len(all_models) > 1:
        cells = [cells[all_models.index(k)] for k in kept]
    else:
        cells = cells[:1]
    boxes = [cell_box(c, name) for c in cells]
    if any(b is None for b in boxes):
        return None
    return np.stack(boxes) if len(boxes) > 1 else boxes[0]


def atom_block(data: bytes) -> tuple[_Rows, Callable[[int], int], np.ndarray] | None:
    """The atom lines of the usual PDB file as rows, or None for any other layout.

    The usual file has its ATOM/HETATM lines in one run of consecutive lines of one length, or in a
    few such runs between other records (TER after each chain), with no MODEL or ENDMDL record
    among or before them (a single model). One regular-expression search finds the first line
    that starts with ATOM, HETA, MODE or ENDM (an atom line, or MODEL/ENDMDL first: the general
    reader) and byte searches from the back find the last atom line, so header and trailer are
    skipped rather than scanned line by line; a few comparisons over the rows confirm the layout:
    every row starts with ATOM or HETA, ends at a newline, and holds no other newline. One run is
    used in place (nothing is copied); several are copied next to each other (one copy per run;
    more than ``_MAX_BLOCKS`` runs go to the general reader). Line numbers are worked out only for an error message.

    ``data`` ends with a newline and holds no carriage return.

    Returns
    -------
    rows : _Rows
    line_no : callable
        ``line_no(i)``: file line (1-based) of row i.
    hetero : np.ndarray of bool, shape (n,)
        HETATM rows.
    """
    if data.startswith((b"ATOM", b"HETA")):
        first = 0
    else:
        # One search finds the first line that starts with any of the four records (the header is
        # a fifth of a small file: four separate byte searches through it cost twice as much).
        found = None if data.startswith((b"MODE", b"ENDM")) else _FIRST_RECORD.search(data)
        if found is None or data[found.start() + 1] in b"ME":
            return None  # no atom line at all, or MODEL/ENDMDL before them: the general reader
        first = found.start() + 1
    length = data.find(b"\n", first) - first  # of the first atom line: every row must have it
    stride = length + 1
    # The last atom line, searched from the back (the trailer - TER, CONECT, END - is short; a
    # HETATM search from the last ATOM line on does not scan a file without any).
    la = data.rfind(b"\nATOM", first)
    last = max(la, data.rfind(b"\nHETA", max(la, first))) + 1
    if last == 0:
        last = first  # (only the first line is an atom line)
    if length < 54 or _has_record(data, (b"MODE",), last, len(data)):
        return None  # (a MODEL after the atoms gives the only model its number)
    width = min(length, 80) + 1
    if not (last - first) % stride:
        n = (last - first) // stride + 1
        if last + 80 > len(data):
            # field views of the last row may read up to column 80 past its start (the values past
            # the line's end are masked to blanks): give them bytes to read
            data += b" " * 80
        found = _checked_rows(data, first, stride, n, width)
        if found is not None:
            return (*found[:1], lambda i: data.count(b"\n", 0, first) + 1 + i, found[1])
    # Runs between other records (TER after each chain, usually): the first row that is not an atom
    # line ends a run; it must be a record the reader skips (not MODEL/ENDMDL), and the next run
    # starts after it. (Every row of the runs is checked below.)
    runs = []
    start, end = first, last + stride
    while True:
        m = (end - start) // stride
        rec = np.ndarray((m,), "<u4", buffer=data, offset=start, strides=(stride,))
        atom = (rec == _REC_ATOM) | (rec == _REC_HETA)
        k = m if all_true(atom) else int(np.argmin(atom))
        runs.append((start, start + k * stride))
        if k == m:
            break
        other = start + k * stride
        if data[other : other + 4] in (b"MODE", b"ENDM") or len(runs) >= _MAX_BLOCKS:
            return None
        start = data.find(b"\n", other) + 1
    if runs[-1][1] != end or len(runs) == 1:
        return None
    n = sum(e - b for b, e in runs) // stride
    text = _scratch("rows", n * stride + 80, np.uint8)
    buf = np.frombuffer(data, dtype=np.uint8)
    at, row_of_run = 0, []
    for b, e in runs:
        row_of_run.append(at // stride)
        text[at : at + e - b] = buf[b:e]
        at += e - b
    text[at:] = 32  # 80 blanks after the last row: a field view may read up to column 80
    found = _checked_rows(text, 0, stride, n, width)
    if found is None:
        return None

    def line_no(i: int) -> int:
        k = bisect.bisect_right(row_of_run, i) - 1
        return data.count(b"\n", 0, runs[k][0]) + 1 + i - row_of_run[k]

    return found[0], line_no, found[1]


# A line that starts with an atom record or MODEL/ENDMDL, its newline included (the header's end, for
# atom_block). The literal newline lets the regex engine skip from line to line.
_FIRST_RECORD = re.compile(rb"\n(?:ATOM|HETA|MODE|ENDM)")


def _checked_rows(buffer, base: int, stride: int, n: int, width: int) -> tuple[_Rows, np.ndarray] | None:
    """``n`` rows of ``stride`` bytes at ``base`` of ``buffer`` as :class:`_Rows`, and their HETATM
    mask, if every row starts with ATOM or HETA and is one line (a newline at its end and none
    before); else None."""
    rows = _Rows(buffer, base, stride, n, width)
    rec = rows.fields["c0w4"]  # columns 1-4 (a field of the rows' view: cheaper than a new strided array)
    hetero = rec == _REC_HETA
    if not all_true(hetero | (rec == _REC_ATOM)):
        return None
    text = np.frombuffer(buffer, dtype=np.uint8, count=n * stride, offset=base)
    # (in the coordinate decoder's work array, next to be used: the load touches less memory, which
    # counts when other work has run in between and the caches are cold)
    newline = np.equal(text, 10, out=_scratch("coords", n * stride, np.uint8).view(bool))
    # Flip the last column's flags: one line per row leaves no flag set (one search for a set flag
    # instead of a count of them and a check of the row ends).
    ends = newline[stride - 1 :: stride]
    np.logical_not(ends, out=ends)
    if any_true(newline):
        return None
    return rows, hetero


def _has_record(data: bytes, records: tuple[bytes, ...], start: int, end: int) -> bool:
    """Whether a line of ``data[start:end]`` (``start`` at a line start) begins with one of ``records``."""
    for record in records:
        at = data.find(record, start, end)
        while at >= 0:
            if at == start or data[at - 1] == 10:
                return True
            at = data.find(record, at + 1, end)
    return False


def _atom_lines(data: bytes, name: str):
    """Atom lines of any PDB layout: (rows, atom_lines, hetero, model_id, model_numbers).

    Lines are found with one comparison over the bytes; ``atom_lines`` (int64) are their 0-based
    line numbers, ``model_id`` the model (0..M-1) of each (None for one model) and
    ``model_numbers`` the MODEL serials.
    """
    size = len(data)
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = _newlines(buf)  # line i is data[starts[i]:ends[i]]
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    # Record names: the first four bytes of every line. A line shorter than four bytes reads its
    # newline, so it can never match ATOM/HETA/MODE/ENDM; a short last line is read from size - 4.
    at = starts if starts[-1] <= size - 4 else np.minimum(starts, size - 4)
    rec = np.ndarray((size - 3,), dtype="<u4", buffer=data, strides=(1,))[at]
    is_het = rec == _REC_HETA
    atom_lines = np.flatnonzero((rec == _REC_ATOM) | is_het)
    if atom_lines.size == 0:
        raise InputError(f"{name}: no ATOM/HETATM records found (not a PDB file?)")

    s = starts[atom_lines]
    lengths = ends[atom_lines] - s
    shortest, longest = int(lengths.min()), int(lengths.max())
    if shortest < 54:
        i = int(np.argmax(lengths < 54))
        raise InputError(
            f"{name}: line {atom_lines[i] + 1}: truncated ATOM/HETATM record ({lengths[i]} characters; "
            "coordinates need 54)"
        )
    hetero = is_het[atom_lines]

    # Models: MODEL records delimit them; files with only ENDMDL separators are handled too.
    model_lines = np.flatnonzero(rec == _REC_MODE)
    if model_lines.size:
        model_id = np.maximum(np.searchsorted(model_lines, atom_lines) - 1, 0)
        numbers = []
        for k, a in enumerate(starts[model_lines].tolist()):
            text = data[a + 5 : a + 80].split(b"\n", 1)[0].split()
            try:
                numbers.append(int(text[0]))
            except (IndexError, ValueError):
                numbers.append(k + 1)
        # MODEL records after the last atom (a trailing empty MODEL) are dropped; an empty model
        # in the middle is a mismatch and is reported below.
        model_numbers = numbers[: int(model_id[-1]) + 1]
    else:
        endm = np.flatnonzero(rec == _REC_ENDM)
        if endm.size and endm[0] < atom_lines[-1]:
            model_id = np.searchsorted(endm, atom_lines)
            model_numbers = list(range(1, int(model_id[-1]) + 2))
        else:  # one model (an ENDMDL after the last atom ends it)
            model_id, model_numbers = None, [1]

    rows = _Rows.from_text(data, buf, s, lengths, shortest, longest)
    return rows, atom_lines, hetero, model_id, model_numbers


def _atom_table_from_pdb(rows: _Rows, n: int, hetero, line_no, name) -> AtomTable:
    """Atom table of the first ``n`` rows (one model)."""
    # A new residue wherever (resname, chain, resid, icode), columns 18-27, changes.
    key_a, key_b = rows.get(17, 8, n), rows.get(25, 2, n)
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(key_a[1:], key_a[:-1], out=new[1:])
    new[1:] |= key_b[1:] != key_b[:-1]
    rs = new.nonzero()[0]
    # (an in-place int32 accumulate costs half of cumsum's cast from bool)
    residue_index = new.view(np.uint8).astype(np.int32)
    residue_index[0] = 0
    np.add.accumulate(residue_index, out=residue_index)
    # Atom names and residue names (and guessed elements): one lookup of each row's (name, residue
    # name) columns among the pairs earlier loads decoded (_atom_text, _guessed_elements).
    name_key, res_key = rows.get(12, 4, n), rows.get(17, 4, n)
    pair = res_key.astype(np.uint64)
    pair <<= np.uint64(32)
    pair |= name_key
    at, names, resnames = _atom_text(pair, name_key, res_key)
    table, valid = element_table()
    el_key = rows.get(76, 2, n).astype(np.intp)  # (two lookups by intp: cheaper than two casts inside take)
    ok = valid.take(el_key)
    if all_true(ok):
        element = table.take(el_key)
    elif not any_true(ok):  # no element column (or nothing in it): every element is guessed
        element = _guessed_elements(pair, name_key, res_key)
    else:  # junk in some: guess those
        element = table.take(el_key)
        bad = np.flatnonzero(~ok)
        element[bad] = _guessed_elements(pair[bad], name_key[bad], res_key[bad])
    segid_key = rows.get(72, 4, n)
    segid_bytes = segid_key.tobytes()
    if segid_bytes == _BLANK_BYTES[: len(segid_bytes)]:  # the usual case: no segment ids
        segid = np.zeros(n, dtype="<U4")  # ('<U4' zeros are empty strings)
    elif segid_bytes == segid_bytes[:4] * n:  # one segment id for the file
        segid = np.empty(n, dtype="<U4")
        segid.fill(_text_of(segid_key[0], 4))
    else:
        _, text, inverse = _distinct_text(segid_key, 4)
        segid = text[inverse]
    resid = _parse_resid(rows.get(22, 4, n).take(rs), lambda k: line_no(int(rs[k])), name)
    return AtomTable._from_arrays(
        name=names.take(at),
        element=element,
        resname=resnames.take(at),
        resid=resid.take(residue_index),
        icode=_char_column(rows.get(26, 1, n)),
        chain=_char_column(rows.get(21, 1, n)),
        segid=segid,
        hetero=hetero,
        residue_index=residue_index,
    )


def _looks_like_mmcif(data: bytes) -> bool:
    # mmCIF opens with "data_" after blanks and '#' comment lines; a PDB file's first record
    # (HEADER, REMARK, ATOM, ...) rules that out without copying the 4 kB head.
    if data[:1].isalpha() and data[:1] not in (b"d", b"D"):
        return False
    head = data[:4096].lstrip()
    while head.startswith(b"#"):
        head = head.split(b"\n", 1)[-1].lstrip()
    return head[:5].lower() == b"data_"
