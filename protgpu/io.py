"""Reading structures and trajectories into :class:`~protgpu.structure.Structure`, and writing result
arrays atomically.

:func:`load` is the single entry point (exported as ``protgpu.load``):

* PDB (``.pdb``, ``.ent``, and ``.gz`` of them) is parsed by a vectorised fixed-column NumPy reader
  of the ATOM/HETATM/MODEL/ENDMDL records (:func:`_parse_pdb`), not by gemmi (gemmi's reader plus
  flattening costs about 2.5 ms for a 3.5k-atom file). The atom lines become a fixed-width byte
  matrix (:class:`_Rows`) whose fields are views of one structured array: for the usual file, one
  run of equal-length ATOM/HETATM lines, the file's own bytes, found by a few byte searches
  (:func:`_atom_block`); otherwise the lines are cut with one NumPy comparison and copied
  (:func:`_atom_lines`). Coordinates are decoded with integer word arithmetic; atom names,
  residue names, guessed elements and residue numbers are looked up among those earlier loads
  decoded (:class:`_KeyMemo`), so a load costs a fixed ~90 NumPy calls plus work per byte.
  ``benchmarks/bench_io.py`` compares it with ``mdtraj.load_pdb`` and Biopython's ``PDBParser``.
  Atoms stay exactly in file order, which a trajectory's atoms follow. Coordinates not in the
  standard ``%8.3f`` layout go through NumPy's string-to-float conversion instead. A ``.pdb``
  whose content is mmCIF is handed to gemmi.
* mmCIF (``.cif``, ``.mmcif``, and ``.gz``) is read with gemmi and flattened with
  ``gemmi.FlatStructure`` (NumPy arrays, no per-atom Python).
* Trajectories (``.xtc``, ``.dcd``, ``.trr``, ``.nc``, ``.h5``, ... anything mdtraj reads) go through
  ``mdtraj.load`` and are converted from nm to Angstrom.
* ``mdtraj.Trajectory`` and Biopython ``Structure``/``Model``/``Chain`` objects are converted.

mdtraj, Biopython and gemmi are imported inside the functions that need them so that
``import protgpu`` stays light.

Every failure is an :class:`~protgpu.errors.InputError` whose one-line message names the file (and
the line, model or frame when known); no gemmi or mdtraj exception escapes unwrapped.
"""

from __future__ import annotations

import bisect
import gzip
import os
import re
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path

import numpy as np

from .errors import InputError
from .structure import (
    AMINO_ACIDS,
    NONSTANDARD_RESNAMES,
    WATER_RESNAMES,
    AtomTable,
    Structure,
    guess_elements,
    standardize_resnames,
)

__all__ = [
    "PDB_EXTENSIONS",
    "MMCIF_EXTENSIONS",
    "TRAJECTORY_EXTENSIONS",
    "load",
    "atomic_path",
    "write_atomic",
    "save_array",
]

PDB_EXTENSIONS = (".pdb", ".ent")
MMCIF_EXTENSIONS = (".cif", ".mmcif")
#: Files that hold only coordinates and need ``top=`` for their atoms.
TRAJECTORY_EXTENSIONS = (
    ".xtc", ".trr", ".dcd", ".nc", ".netcdf", ".ncdf", ".binpos", ".mdcrd", ".crd", ".lammpstrj",
    ".xyz", ".dtr", ".stk", ".ncrst", ".rst7", ".restrt", ".inpcrd", ".tng",
)
#: Files that mdtraj reads with their own topology (no ``top=`` needed).
_MDTRAJ_SELF_CONTAINED = (".h5", ".hdf5", ".lh5", ".gro", ".mol2", ".arc", ".hoomdxml", ".gsd")

_ALTLOC_MODES = ("first", "occupancy")

# ----------------------------------------------------------------------------------------------------
# Public entry point
# ----------------------------------------------------------------------------------------------------


def load(source, *, top=None, frames=None, altloc: str = "first", model: int | None = None) -> Structure:
    """Load a structure or trajectory as a :class:`Structure` (coordinates in Angstrom).

    Parameters
    ----------
    source : str, os.PathLike, Structure, mdtraj.Trajectory, Bio.PDB entity, array or sequence
        * path to a PDB/mmCIF file (``.pdb .ent .cif .mmcif``, optionally ``.gz``): every model
          becomes a frame; all models must have the same atoms in the same order;
        * path to a trajectory mdtraj reads (``.xtc .dcd .trr .nc .netcdf .h5`` ...): coordinates
          and box vectors converted from nm to Angstrom, time in ps;
        * a ``Structure``: returned as is (or its ``frames`` subset);
        * an ``mdtraj.Trajectory`` (nm, converted) or a Biopython ``Structure``/``Model``/``Chain``
          (Angstrom; each Bio model a frame; disordered atoms as Biopython selects them);
        * a NumPy array of shape (frames, atoms, 3) or (atoms, 3): wrapped by
          :meth:`Structure.from_coords`;
        * a list/tuple of any of these: loaded one by one and stacked as frames; their atom
          tables must be equal.
    top : str, os.PathLike, Structure or mdtraj.Topology, optional
        Topology for trajectory files that carry none (xtc, dcd, trr, nc, ...): a PDB/mmCIF path or a
        Structure gives the atom table (its atoms must match the trajectory's count); a
        ``.prmtop``/``.psf``/``.gro``/``.h5`` path is read by mdtraj. Ignored for PDB/mmCIF sources.
    frames : int, slice or array_like, optional
        Keep only these frames (models for PDB/mmCIF), as :meth:`Structure.frames`.
    altloc : {"first", "occupancy"}
        Alternate locations (PDB/mmCIF): for each atom (same residue and atom name) keep its first
        record in the file ("first", the default, as mdtraj and gemmi do) or the record with the
        highest occupancy, the first one on ties ("occupancy", as Biopython does). Atoms without an
        altloc are always kept.
    model : int, optional
        Keep only the model with this number (the MODEL serial in PDB, ``pdbx_PDB_model_num`` in
        mmCIF; a file without MODEL records has model 1).

    Returns
    -------
    Structure
        ``coords`` (frames, atoms, 3) float32 Angstrom. Hydrogens, waters and ligands are kept. For
        PDB/mmCIF ``box`` is None (a crystal unit cell is not a periodic simulation box) and the
        chain id is kept as written (blank -> ``""``; the segid is stored separately).

    Raises
    ------
    InputError
        Missing file, directory, empty file, unreadable content or no atoms, truncated PDB record
        (with its line number), models with different atoms (with the model number and both atom
        counts), NaN/inf coordinates, unknown extension (the supported ones are listed), trajectory
        without ``top``.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "two.pdb")
    >>> with open(path, "w") as fh:
    ...     _ = fh.write("ATOM      1  N   GLY A   1      11.104   6.134  -6.504  1.00  0.00           N\\n"
    ...                  "ATOM      2  CA  GLY A   1      11.639   6.071  -5.147  1.00  0.00           C\\n")
    >>> s = load(path)
    >>> s.n_frames, s.n_atoms, s.n_residues
    (1, 2, 1)
    >>> s.coords[0, 1].tolist()
    [11.638999938964844, 6.071000099182129, -5.146999835968018]
    >>> s.select("ca").atoms.name.tolist()
    ['CA']
    """
    if altloc not in _ALTLOC_MODES:
        raise InputError(f"altloc must be one of {_ALTLOC_MODES}, got {altloc!r}")
    if isinstance(source, Structure):
        s = source
    elif isinstance(source, (str, os.PathLike)):
        s, frames_done = _load_path(_path_name(source), top=top, altloc=altloc, model=model, frames=frames)
        if frames_done:
            frames = None
    elif isinstance(source, np.ndarray):
        s = Structure.from_coords(source, source="array")
    elif isinstance(source, (list, tuple)):
        s = _load_many(source, top=top, altloc=altloc, model=model)
    elif _module_of(source).startswith("mdtraj") and hasattr(source, "xyz"):
        s = _from_mdtraj(source, "mdtraj.Trajectory")
    elif _module_of(source).startswith("Bio.PDB"):
        s = _from_biopython(source)
    else:
        raise InputError(
            f"cannot load an object of type {type(source).__name__}: expected a path, a Structure, an "
            "mdtraj.Trajectory, a Bio.PDB Structure/Model/Chain, an array or a list of these"
        )
    if frames is not None:
        s = s.frames(frames)
    return s


def _module_of(obj) -> str:
    return type(obj).__module__ or ""


def _load_many(items: Sequence, *, top, altloc: str, model) -> Structure:
    if not items:
        raise InputError("load: empty list of inputs")
    structures = [load(x, top=top, altloc=altloc, model=model) for x in items]
    first = structures[0]
    for item, s in zip(items, structures, strict=True):
        if s.atoms != first.atoms:
            name = s.source or str(item)
            raise InputError(
                f"{name}: atoms differ from {first.source} ({s.n_atoms} vs {first.n_atoms} atoms, or "
                "different names/residues); files stacked as frames must have identical atoms"
            )
    boxes = [s.box for s in structures]
    times = [s.time for s in structures]
    return Structure(
        np.concatenate([s.coords for s in structures]),
        first.atoms,
        source=f"{first.source} (+{len(structures) - 1} more)" if len(structures) > 1 else first.source,
        box=np.concatenate(boxes) if all(b is not None for b in boxes) else None,
        time=np.concatenate(times) if all(t is not None for t in times) else None,
    )


def _path_name(source) -> str:
    """``str(Path(source))``, without building the Path when ``source`` is a string already in that
    form (no empty or '.' component, no trailing slash): pathlib's parsing costs several
    microseconds, a noticeable part of loading a small PDB file."""
    if (
        type(source) is str
        and os.sep == "/"
        and source not in ("", ".")
        and "//" not in source
        and "/./" not in source
        and not source.startswith("./")
        and not source.endswith(("/", "/."))
    ):
        return source
    return str(Path(source))


def _split_ext(path) -> tuple[str, bool]:
    """Lower-case extension of the file with ``.gz`` peeled off, and whether it was gzipped.

    ``path`` is a str or path-like; the suffixes are those of ``pathlib.PurePath.suffixes`` (none
    for a name ending in '.', leading dots belong to the stem), found without building a Path.
    """
    name = os.path.basename(os.fspath(path))
    if name.endswith("."):
        return "", False
    suffixes = name.lstrip(".").lower().split(".")[1:]
    gz = bool(suffixes) and suffixes[-1] == "gz"
    if gz:
        suffixes = suffixes[:-1]
    return ("." + suffixes[-1] if suffixes else ""), gz


def _supported() -> str:
    exts = PDB_EXTENSIONS + MMCIF_EXTENSIONS
    return ", ".join(
        list(exts) + [e + ".gz" for e in exts] + list(TRAJECTORY_EXTENSIONS) + list(_MDTRAJ_SELF_CONTAINED)
    )


def _check_file(path: Path) -> None:
    name = str(path)
    try:
        st = os.stat(path)  # one system call answers exists / directory / empty
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{name}: is a directory, not a structure file")
    if st.st_size == 0:
        raise InputError(f"{name}: file is empty")


def _read_bytes(path: str | Path, gz: bool) -> bytes:
    """The file's bytes (gunzipped when ``gz``); a missing, unreadable or empty file, or a directory,
    raises the same InputError as :func:`_check_file` (no separate stat call on the way)."""
    name = str(path)
    try:
        # os.read of the size fstat reports: the whole file in one read straight into the bytes
        # object, four system calls in all (a file object also seeks and reads once more to meet
        # the end: a few microseconds, a noticeable part of loading a small file)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise InputError(f"{name}: no such file") from None
    except OSError as exc:
        _check_file(path)  # a directory (PermissionError on Windows) ...
        raise InputError(f"{name}: cannot read ({exc.strerror or exc})") from None
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size + 1)
        if len(data) != size:
            # a short read (a huge file, some file systems), a file that grew, or one whose size is
            # not known (a pipe reports 0): read on to the end
            chunks = [data]
            while chunks[-1]:
                chunks.append(os.read(fd, 1 << 20))
            data = b"".join(chunks)
    except OSError as exc:
        _check_file(path)  # a directory (it opens, and reading it fails with EISDIR) ...
        raise InputError(f"{name}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if not data:
        raise InputError(f"{name}: file is empty")
    if gz:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, ValueError) as exc:
            raise InputError(f"{name}: not a valid gzip file ({exc})") from None
        if not data:
            raise InputError(f"{name}: file is empty (after gunzip)")
    return data


def _load_path(name: str, *, top, altloc: str, model, frames):
    """Load the file ``name`` (``str(Path(source))``); returns (structure, whether ``frames`` was applied)."""
    ext, gz = _split_ext(name)
    if ext in PDB_EXTENSIONS:
        data = _read_bytes(name, gz)  # checks the file as _check_file does
        return _parse_pdb(data, name, altloc=altloc, model=model, path=name), False
    path = Path(name)
    _check_file(path)
    if ext in MMCIF_EXTENSIONS:
        return _read_mmcif(path, name, altloc=altloc, model=model), False
    if not gz and (ext in TRAJECTORY_EXTENSIONS or ext in _MDTRAJ_SELF_CONTAINED or ext in _mdtraj_exts()):
        # trajectory loading applies ``frames`` itself (reading one frame is cheaper than all)
        return _load_trajectory(path, ext, top=top, frames=frames), True
    raise InputError(f"{name}: unknown file extension {ext or '(none)'!r}; supported: {_supported()}")


def _mdtraj_exts() -> tuple[str, ...]:
    # Whatever else the installed mdtraj registers; only consulted for extensions we do not know,
    # so the common paths never import mdtraj.
    try:
        from mdtraj.formats.registry import FormatRegistry
    except ImportError:  # pragma: no cover - mdtraj is a dependency
        return ()
    return tuple(k for k in FormatRegistry.loaders if not k.endswith(".gz"))


# ----------------------------------------------------------------------------------------------------
# PDB: vectorised fixed-column parser
# ----------------------------------------------------------------------------------------------------

_REC_ATOM = int(np.frombuffer(b"ATOM", dtype="<u4")[0])
_REC_HETA = int(np.frombuffer(b"HETA", dtype="<u4")[0])
_REC_MODE = int(np.frombuffer(b"MODE", dtype="<u4")[0])
_REC_ENDM = int(np.frombuffer(b"ENDM", dtype="<u4")[0])
_RESID_WEIGHTS = np.array([1000, 100, 10, 1], dtype=np.int32)
_UINT = {1: np.dtype(np.uint8), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_BLANKS = {w: int.from_bytes(b" " * w, "little") for w in _UINT}
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
_SCAN_BLOCK = 1 << 16


def _all(mask: np.ndarray) -> bool:
    """``mask.all()`` for a 1-D bool array, as the value at ``argmin`` (NumPy finds the first False
    of a bool array with a vectorised byte search and stops there): about a fifth of the cost of
    NumPy's reduction for the arrays of a small file (whose per-call overhead is most of the cost),
    and a third of a search in a copy of the bytes for a large one."""
    return not mask.shape[0] or bool(mask[mask.argmin()])


def _any(mask: np.ndarray) -> bool:
    """``mask.any()`` for a 1-D bool array (see :func:`_all`)."""
    return bool(mask.shape[0]) and bool(mask[mask.argmax()])


def _newlines(buf: np.ndarray) -> np.ndarray:
    """Positions of the newline bytes of ``buf``, int64, found a block at a time."""
    if buf.shape[0] <= _SCAN_BLOCK:
        return np.flatnonzero(np.equal(buf, 10, out=_scratch("scan", buf.shape[0], bool)))
    found = []
    for a in range(0, buf.shape[0], _SCAN_BLOCK):
        block = buf[a : a + _SCAN_BLOCK]
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
        dtype = _UINT[width]
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
            "formats": [_UINT[w] for _, w in inside] + ["V24"],
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


def _strip_keys(keys: np.ndarray, width: int) -> np.ndarray:
    """Fixed-width text fields held as unsigned integers (first character in the low byte) to a
    '<U{width}' array, blanks and NULs stripped from both ends as ``str.strip`` does.

    Word arithmetic on one integer per field, no Python loop: leading blanks are shifted out
    (at most width - 1 steps, stopping when no field has one), then trailing blanks zeroed from
    the top byte down; a '<U' string ends at its first trailing NUL, so the zeroed bytes vanish
    when the bytes are widened to UCS-4 code points and viewed as strings.
    """
    dtype = _UINT[width]
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
    return _widen(k, width)


def _widen(keys: np.ndarray, width: int) -> np.ndarray:
    """Integer-held text fields to '<U{width}' as they are (latin-1: byte b is code point b)."""
    raw = np.ascontiguousarray(keys, dtype=_UINT[width]).view(np.uint8).reshape(-1, width)
    return raw.astype(np.uint32).view(f"<U{width}").ravel()


def _distinct_text(keys: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct values of integer-held text fields, decoded (stripped) once each.

    Atom names, residue names and segment ids take few distinct values, so sorting the keys
    (a few microseconds for thousands of 4-byte integers) and decoding the distinct ones in Python
    costs less than word arithmetic on every field; many distinct values go through
    :func:`_strip_keys` instead.

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
        text = _strip_keys(uniq, width)
    else:
        # 'S' tolist drops trailing NULs; strip the rest as _strip_keys does (blanks and NULs)
        text = np.array(
            [b.strip(b" \x00").decode("latin-1") for b in uniq.view(f"S{width}").tolist()], dtype=f"<U{width}"
        )
    return uniq, text, np.searchsorted(uniq, keys)


def _text_of(key, width: int) -> str:
    """One integer-held field as stripped text (see :func:`_strip_keys`)."""
    return int(key).to_bytes(width, "little").strip(b" \x00").decode("latin-1")


class _KeyMemo:
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
_ATOM_MEMO = _KeyMemo(np.uint64, "<U4", "<U4")
_GUESS_MEMO = _KeyMemo(np.uint64, "<U2")
# Residue-number fields (columns 23-26) -> int32.
_RESID_MEMO = _KeyMemo(np.uint32, np.int32)


def _clear_memos() -> None:
    """Forget what earlier loads decoded (for tests, and benchmarks of a first load)."""
    for memo in (_ATOM_MEMO, _GUESS_MEMO, _RESID_MEMO):
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
    found = _ATOM_MEMO.find(pair)
    if found is not None:
        at, (_, names, resnames) = found
        return at, names, resnames
    # New pairs: decode the distinct ones (names and residue names in one sort) and remember them.
    uniq, first, at = np.unique(pair, return_index=True, return_inverse=True)
    k = uniq.shape[0]
    _, text, inverse = _distinct_text(np.concatenate([name_key[first], res_key[first]]), 4)
    names, resnames = text[inverse[:k]], text[inverse[k:]]
    _ATOM_MEMO.add(uniq, names, resnames, unique=True)
    return at.ravel(), names, resnames


def _guessed_elements(pair: np.ndarray, name_key: np.ndarray, res_key: np.ndarray) -> np.ndarray:
    """Elements ('<U2', shape (n,)) guessed from the atom and residue names of rows without an
    element column (arguments as :func:`_atom_text`), by :func:`_guess_pdb_elements` once per
    distinct pair and remembered."""
    found = _GUESS_MEMO.find(pair)
    if found is not None:
        at, (_, elements) = found
        return elements.take(at)
    uniq, first, at = np.unique(pair, return_index=True, return_inverse=True)
    k = uniq.shape[0]
    keys, text, inverse = _distinct_text(np.concatenate([name_key[first], res_key[first]]), 4)
    elements = _guess_pdb_elements(keys, text, inverse[:k], inverse[k:], np.arange(k))
    _GUESS_MEMO.add(uniq, elements, unique=True)
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


def _element_table() -> tuple[np.ndarray, np.ndarray]:
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
        _ELEMENTS = (np.ascontiguousarray(b).view("<U2").ravel(), valid)
    return _ELEMENTS


def _parse_coords(rows: _Rows, line_no, name: str) -> tuple[np.ndarray, bool]:
    """Coordinates (columns 31-38, 39-46, 47-54) of every row, shape (rows, 3) float32, and whether
    all are known finite (every field had the standard form).

    The 24 columns of each row are one 24-byte item of a strided view of the row matrix, decoded
    ``_COORD_CHUNK`` fields (a third as many rows) at a time by :func:`_parse_coord_fields`.

    Parameters
    ----------
    line_no : callable
        ``line_no(i)``: file line number of row i, for the error message.
    """
    n = rows.n
    out = np.empty((n, 3), dtype=np.float32)
    xyz = rows.fields["xyz"]
    step = max(1, _COORD_CHUNK // 3)
    if n <= step:  # (one pass: no slicing)
        return out, _parse_coord_fields(xyz, out, 0, line_no, name)
    finite = True
    for a in range(0, n, step):
        finite &= _parse_coord_fields(xyz[a : a + step], out[a : a + step], a, line_no, name)
    return out, finite


# Fields decoded per pass. Smaller passes keep the work arrays in cache but cost more NumPy calls,
# which is the dearer side when other work has run in between (as in the benchmark, where mdtraj
# and Biopython run between loads).
_COORD_CHUNK = 16384


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
# The constants of _parse_coord_fields as NumPy scalars made once (a scalar costs a fraction of a
# microsecond to make, a few percent of decoding a small file's coordinates).
_C48, _C10 = np.uint8(48), np.uint8(10)
_CHASH, _C8, _C16, _C32, _C61 = np.uint64(_HASH), np.uint64(8), np.uint64(16), np.uint64(32), np.uint64(61)
_C_MUL1, _C_MUL2, _C_MUL3 = np.uint64(1 + (10 << 8)), np.uint64(1 + (100 << 16)), np.uint64(1 + (1000 << 32))
_C_MASK1, _C_MASK2 = np.uint64(0x00FF00FF00FF00FF), np.uint64(0x0000FFFF0000FFFF)


def _parse_coord_fields(fields: np.ndarray, out: np.ndarray, first: int, line_no, name: str) -> bool:
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
    if _all(expected["form"] == form):
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
    try:
        out.reshape(k)[:] = text.astype(np.float64)
    except ValueError:
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
    by an earlier load come from :data:`_RESID_MEMO`.
    """
    found = _RESID_MEMO.find(keys)
    if found is None:
        values = _decode_resid(keys, line_no, name)
        _RESID_MEMO.add(keys, values)
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
def _altloc_keep(group: np.ndarray, name_key: np.ndarray, has_alt: np.ndarray, occupancy, mode: str) -> np.ndarray:
    """Boolean keep-mask resolving alternate locations atom by atom.

    Parameters
    ----------
    group : np.ndarray of int64, shape (n,)
        Residue block of each atom (changes with model, chain, residue number or insertion code).
    name_key : np.ndarray of int, shape (n,)
        Atom-name code; atoms with equal (group, name_key) are altlocs of one atom.
    has_alt : np.ndarray of bool, shape (n,)
        True where the record carries an altloc letter.
    occupancy : callable
        ``occupancy(indices) -> float array``, called only in "occupancy" mode.
    mode : {"first", "occupancy"}
    """
    keep = ~has_alt
    alt_idx = np.flatnonzero(has_alt)
    if alt_idx.size == 0:
        return keep
    key = (group[alt_idx].astype(np.int64) << 32) | name_key[alt_idx].astype(np.int64)
    if mode == "first":
        _, first = np.unique(key, return_index=True)
        keep[alt_idx[first]] = True
        return keep
    occ = np.asarray(occupancy(alt_idx), dtype=np.float64)
    order = np.lexsort((np.arange(alt_idx.size), -occ, key))
    ks = key[order]
    lead = np.ones(ks.size, dtype=bool)
    lead[1:] = ks[1:] != ks[:-1]
    keep[alt_idx[order[lead]]] = True
    return keep


def _split_models(model_id: np.ndarray, model_numbers: list[int], model, name: str):
    """Validate the model selection; return (kept atom mask or None, kept model numbers)."""
    if model is None:
        return None, model_numbers
    if model not in model_numbers:
        shown = ", ".join(map(str, model_numbers[:10])) + (" ..." if len(model_numbers) > 10 else "")
        raise InputError(f"{name}: no model {model} (models in the file: {shown})")
    k = model_numbers.index(model)
    return model_id == k, [model]


def _check_models(counts: np.ndarray, model_numbers: list[int], name: str) -> None:
    bad = np.flatnonzero(counts != counts[0])
    if bad.size:
        k = int(bad[0])
        raise InputError(
            f"{name}: model {model_numbers[k]} has {counts[k]} atoms but model {model_numbers[0]} has "
            f"{counts[0]}; every model must have the same atoms in the same order"
        )


def _check_model_atoms(keys: np.ndarray, n_models: int, model_numbers: list[int], describe, name: str) -> None:
    """keys: (n_models * n,) per-atom identity codes, models concatenated."""
    if n_models < 2:
        return
    k2 = keys.reshape(n_models, -1)
    diff = k2 != k2[0]
    if diff.any():
        m, a = np.argwhere(diff)[0]
        raise InputError(
            f"{name}: model {model_numbers[m]} atom {a} is {describe(m, a)} but model {model_numbers[0]} "
            f"has {describe(0, a)}; every model must have the same atoms in the same order"
        )


def _parse_pdb(data: bytes, name: str, *, altloc: str, model, path: str | Path | None = None) -> Structure:
    """Parse PDB text into a Structure (every model a frame). See :func:`load` for the rules.

    Vectorised: the atom lines become a fixed-width byte matrix (:class:`_Rows`) and every field is
    a strided integer view of it; Python loops run only over blocks of lines and MODEL records.
    The usual file, one run of equal-length ATOM/HETATM lines with no MODEL record, is recognised
    by a few byte searches and used in place (:func:`_atom_block`); any other layout has its lines
    found with one comparison over the bytes (:func:`_atom_lines`).
    """
    if _looks_like_mmcif(data):
        # mmCIF saved as .pdb: its atom_site loop lines also start with ATOM, so decide first.
        if path is None:  # pragma: no cover - load always passes the path
            raise InputError(f"{name}: content is mmCIF; save it as .cif")
        return _read_mmcif(path, name, altloc=altloc, model=model)
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    if not data.endswith(b"\n"):
        data += b"\n"  # so that every line, the last one too, ends at a newline
    if len(data) < 5:
        raise InputError(f"{name}: no ATOM/HETATM records found (not a PDB file?)")
    block = _atom_block(data)
    if block is not None:
        rows, line_no, hetero = block
        model_id, model_numbers = None, [1]
    else:
        rows, atom_lines, hetero, model_id, model_numbers = _atom_lines(data, name)
        line_no = (lambda lines: lambda i: int(lines[i]) + 1)(atom_lines)

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
        keep = _altloc_keep(
            np.cumsum(change), rows.get(12, 4), has_alt,
            lambda idx: _parse_occupancy(rows.columns(54, 6, idx)), altloc,
        )
    if model is not None:
        sel, model_numbers = _split_models(
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
        _check_models(counts, model_numbers, name)
        n = int(counts[0])

        def describe(m, a):
            row = bytes(rows.matrix[m * n + a, :21]).decode("latin-1")
            return f"{row[12:16].strip()} {row[17:21].strip()}"

        _check_model_atoms(rows.get(12, 4), n_models, model_numbers, describe, name)
        _check_model_atoms(rows.get(17, 4), n_models, model_numbers, describe, name)
    else:
        n = rows.n

    coords, finite = _parse_coords(rows, line_no, name)
    coords = coords.reshape(n_models, n, 3)
    atoms = _atom_table_from_pdb(rows, n, hetero[:n], line_no, name)
    if finite:  # C-contiguous float32 of the table's atoms, all finite: nothing for __init__ to check
        return Structure._from_parts(coords, atoms, name)
    return Structure(coords, atoms, source=name)


def _atom_block(data: bytes) -> tuple[_Rows, Callable[[int], int], np.ndarray] | None:
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
        k = m if _all(atom) else int(np.argmin(atom))
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
# _atom_block). The literal newline lets the regex engine skip from line to line.
_FIRST_RECORD = re.compile(rb"\n(?:ATOM|HETA|MODE|ENDM)")


def _checked_rows(buffer, base: int, stride: int, n: int, width: int) -> tuple[_Rows, np.ndarray] | None:
    """``n`` rows of ``stride`` bytes at ``base`` of ``buffer`` as :class:`_Rows`, and their HETATM
    mask, if every row starts with ATOM or HETA and is one line (a newline at its end and none
    before); else None."""
    rows = _Rows(buffer, base, stride, n, width)
    rec = rows.fields["c0w4"]  # columns 1-4 (a field of the rows' view: cheaper than a new strided array)
    hetero = rec == _REC_HETA
    if not _all(hetero | (rec == _REC_ATOM)):
        return None
    text = np.frombuffer(buffer, dtype=np.uint8, count=n * stride, offset=base)
    # (in the coordinate decoder's work array, next to be used: the load touches less memory, which
    # counts when other work has run in between and the caches are cold)
    newline = np.equal(text, 10, out=_scratch("coords", n * stride, np.uint8).view(bool))
    # Flip the last column's flags: one line per row leaves no flag set (one search for a set flag
    # instead of a count of them and a check of the row ends).
    ends = newline[stride - 1 :: stride]
    np.logical_not(ends, out=ends)
    if _any(newline):
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
    table, valid = _element_table()
    el_key = rows.get(76, 2, n).astype(np.intp)  # (two lookups by intp: cheaper than two casts inside take)
    ok = valid.take(el_key)
    if _all(ok):
        element = table.take(el_key)
    elif not _any(ok):  # no element column (or nothing in it): every element is guessed
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
    other = ~polymer
    if other.any():
        padded = _widen(uniq[name_index[other]], 4)
        out[other] = guess_elements(padded, text[res_of_atom[other]])
    return out


def _looks_like_mmcif(data: bytes) -> bool:
    # mmCIF opens with "data_" after blanks and '#' comment lines; a PDB file's first record
    # (HEADER, REMARK, ATOM, ...) rules that out without copying the 4 kB head.
    if data[:1].isalpha() and data[:1] not in (b"d", b"D"):
        return False
    head = data[:4096].lstrip()
    while head.startswith(b"#"):
        head = head.split(b"\n", 1)[-1].lstrip()
    return head[:5].lower() == b"data_"


# ----------------------------------------------------------------------------------------------------
# mmCIF through gemmi
# ----------------------------------------------------------------------------------------------------


def _read_mmcif(path: Path, name: str, *, altloc: str, model) -> Structure:
    import gemmi

    try:
        # merge_chain_parts=False keeps atoms in file order (gemmi otherwise moves a chain's
        # waters/ligands next to its polymer).
        st = gemmi.read_structure(str(path), merge_chain_parts=False, format=gemmi.CoorFormat.Mmcif)
    except Exception as exc:  # gemmi raises RuntimeError, ValueError, ...: all become one line
        raise InputError(f"{name}: cannot read mmCIF: {_one_line(exc)}") from None
    return _from_gemmi(st, name, altloc=altloc, model=model)


def _from_gemmi(st, name: str, *, altloc: str, model) -> Structure:
    import gemmi

    flat = gemmi.FlatStructure(st)
    if len(flat) == 0:
        raise InputError(f"{name}: no atoms found")
    flat.strings_as_numbers = False

    def text(a):
        return np.char.strip(np.asarray(a).astype("U"))

    model_num = np.asarray(flat.model_num)
    # FlatStructure lists models in file order; renumber them 0..M-1 for splitting.
    change = np.ones(model_num.size, dtype=bool)
    change[1:] = model_num[1:] != model_num[:-1]
    model_id = np.cumsum(change) - 1
    model_numbers = model_num[change].tolist()

    atom_name = text(flat.atom_names)
    chain = text(flat.chain_ids)
    resname = text(flat.residue_names)
    resid = np.asarray(flat.resnums).astype(np.int32)
    ic = np.asarray(flat.icodes)
    alt = np.asarray(flat.altlocs)
    has_alt = (alt != 0) & (alt != 32)
    keep = None
    if has_alt.any():
        grp_change = np.ones(resid.size, dtype=bool)
        grp_change[1:] = (chain[1:] != chain[:-1]) | (resid[1:] != resid[:-1])
        grp_change[1:] |= (ic[1:] != ic[:-1]) | (model_id[1:] != model_id[:-1])
        _, name_key = np.unique(atom_name, return_inverse=True)
        occ_all = np.asarray(flat.occ)
        keep = _altloc_keep(np.cumsum(grp_change), name_key.ravel(), has_alt, lambda idx: occ_all[idx], altloc)
    sel, model_numbers = _split_models(model_id, model_numbers, model, name)
    if sel is not None:
        keep = sel if keep is None else keep & sel
    pos = np.asarray(flat.pos)
    het = np.asarray(flat.het_flags) == ord("H")
    element = np.char.upper(text(flat.element_names))
    if keep is not None:
        atom_name, chain, resname, resid, ic = atom_name[keep], chain[keep], resname[keep], resid[keep], ic[keep]
        pos, het, element, model_id = pos[keep], het[keep], element[keep], model_id[keep]
    n_models = len(model_numbers)
    n = atom_name.size
    if n_models > 1:
        counts = np.bincount(model_id - model_id.min(), minlength=n_models)
        _check_models(counts, model_numbers, name)
        n = int(counts[0])

        def describe(m, a):
            return f"{atom_name[m * n + a]} {resname[m * n + a]}"

        _, nk = np.unique(atom_name, return_inverse=True)
        _check_model_atoms(nk.ravel(), n_models, model_numbers, describe, name)
    icode = np.where(ic[:n] == 32, "", np.char.decode(ic[:n].astype(np.uint8).view("S1"), "latin-1"))
    atoms = AtomTable(
        name=atom_name[:n],
        element=element[:n],
        resname=resname[:n],
        resid=resid[:n],
        icode=np.char.strip(icode.astype("U1")),
        chain=chain[:n],
        segid=np.full(n, "", dtype="<U1"),
        hetero=het[:n],
    )
    return Structure(pos.reshape(n_models, n, 3), atoms, source=name)


# ----------------------------------------------------------------------------------------------------
# mdtraj: trajectories and Trajectory objects
# ----------------------------------------------------------------------------------------------------


def _chain_letters(k: int) -> str:
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out = ""
    k += 1
    while k:
        k, r = divmod(k - 1, 26)
        out = letters[r] + out
    return out


def _table_from_mdtraj_topology(top) -> AtomTable:
    names, elements, resnames, resids, chains, segids, hetero, counts = [], [], [], [], [], [], [], []
    for chain in top.chains:
        cid = (getattr(chain, "chain_id", None) or "").strip() or _chain_letters(chain.index)
        for res in chain.residues:
            atoms = list(res.atoms)
            counts.append(len(atoms))
            resnames.append(res.name)
            resids.append(res.resSeq)
            chains.append(cid)
            segids.append((getattr(res, "segment_id", "") or "").strip())
            # mdtraj does not keep the HETATM flag: everything that is not polymer counts as hetero.
            hetero.append(not (res.is_protein or res.is_nucleic))
            names.extend(a.name for a in atoms)
            elements.extend(
                (a.element.symbol if a.element is not None and a.element.symbol not in ("VS", "") else "")
                for a in atoms
            )
    counts = np.asarray(counts, dtype=np.int64)
    rep = np.repeat(np.arange(counts.size), counts)
    resname = np.asarray(resnames, dtype=str)[rep] if rep.size else np.zeros(0, "<U1")
    element = np.char.upper(np.asarray(elements, dtype=str)) if elements else np.zeros(0, "<U1")
    name_arr = np.asarray(names, dtype=str) if names else np.zeros(0, "<U1")
    # mdtraj guesses elements from names when a PDB has no element column, and reads the CHARMM
    # left-justified "CA  " as calcium; an amino-acid or water atom is never a two-letter element
    # (selenium excepted), so those get the name-based guess.
    std = standardize_resnames(resname)
    polymer = np.isin(std, list(AMINO_ACIDS)) | np.isin(resname, list(WATER_RESNAMES))
    missing = (element == "") | (polymer & (np.char.str_len(element) == 2) & (element != "SE"))
    if missing.any():
        element = element.astype("<U2")
        element[missing] = guess_elements(name_arr[missing], resname[missing])
    return AtomTable(
        name=name_arr,
        element=element,
        resname=resname,
        resid=np.asarray(resids, dtype=np.int32)[rep] if rep.size else np.zeros(0, np.int32),
        icode=np.full(rep.size, "", dtype="<U1"),
        chain=np.asarray(chains, dtype=str)[rep] if rep.size else np.zeros(0, "<U1"),
        segid=np.asarray(segids, dtype=str)[rep] if rep.size else np.zeros(0, "<U1"),
        hetero=np.asarray(hetero, dtype=bool)[rep] if rep.size else np.zeros(0, bool),
        # mdtraj residues are residues: keep its grouping (two residues with equal ids stay apart).
        residue_index=rep.astype(np.int32),
    )


def _from_mdtraj(traj, source: str, atoms: AtomTable | None = None) -> Structure:
    xyz = np.asarray(traj.xyz, dtype=np.float32) * np.float32(10.0)
    box = traj.unitcell_vectors
    box = None if box is None else np.asarray(box, dtype=np.float32) * np.float32(10.0)
    time = None if traj.time is None else np.asarray(traj.time, dtype=np.float64)
    if atoms is None:
        atoms = _table_from_mdtraj_topology(traj.topology)
    return Structure(xyz, atoms, source=source, box=box, time=time)


def _placeholder_topology(n_atoms: int):
    """An mdtraj Topology with n atoms and nothing else: enough for mdtraj to read coordinates, and
    far cheaper than having mdtraj parse the topology file a second time."""
    import mdtraj

    top = mdtraj.Topology()
    res = top.add_residue("UNK", top.add_chain())
    for _ in range(n_atoms):
        top.add_atom("X", None, res)
    return top


def _load_trajectory(path: Path, ext: str, *, top, frames) -> Structure:
    import mdtraj

    name = str(path)
    atoms = None
    md_top = None
    if top is None:
        if ext in TRAJECTORY_EXTENSIONS:
            raise InputError(
                f"{name}: a {ext} trajectory holds no topology; pass top= (a PDB/mmCIF file or a Structure)"
            )
    elif isinstance(top, Structure):
        atoms = top.atoms
    elif _module_of(top).startswith("mdtraj"):
        md_top = top.topology if hasattr(top, "xyz") else top
    elif isinstance(top, (str, os.PathLike)):
        tpath = Path(top)
        t_ext, _ = _split_ext(tpath)
        if t_ext in PDB_EXTENSIONS + MMCIF_EXTENSIONS:
            atoms = load(tpath).atoms
        else:
            _check_file(tpath)
            try:
                md_top = mdtraj.load_topology(str(tpath))
            except Exception as exc:  # mdtraj raises many types; report them all the same way
                raise InputError(f"{tpath}: cannot read topology: {_one_line(exc)}") from None
    else:
        raise InputError(f"{name}: top must be a path, a Structure or an mdtraj Topology, not {type(top).__name__}")
    if atoms is not None:
        md_top = _placeholder_topology(len(atoms))
    kwargs = {} if md_top is None else {"top": md_top}
    try:
        if isinstance(frames, (int, np.integer)) and not isinstance(frames, bool) and frames >= 0:
            traj = mdtraj.load_frame(str(path), int(frames), **kwargs)
            frames_left = None
        else:
            traj = mdtraj.load(str(path), **kwargs)
            frames_left = frames
    except IndexError as exc:
        raise InputError(f"{name}: frame {frames} out of range ({_one_line(exc)})") from None
    except Exception as exc:  # wrap whatever mdtraj/netCDF/HDF5 raise with the file name
        msg = _one_line(exc)
        if md_top is not None:
            msg += f" (topology has {md_top.n_atoms} atoms)"
        raise InputError(f"{name}: cannot read trajectory: {msg}") from None
    if traj.n_frames == 0:
        raise InputError(f"{name}: trajectory has no frames")
    if atoms is None:
        atoms = _table_from_mdtraj_topology(traj.topology)
    s = _from_mdtraj(traj, name, atoms=atoms)
    return s.frames(frames_left) if frames_left is not None else s


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ----------------------------------------------------------------------------------------------------
# Biopython
# ----------------------------------------------------------------------------------------------------


def _from_biopython(obj) -> Structure:
    level = getattr(obj, "level", None)
    if level == "S":
        models = list(obj)
        source = f"Bio.PDB structure {obj.id}"
    elif level in ("M", "C"):
        models = [obj]
        source = f"Bio.PDB {'model' if level == 'M' else 'chain'} {obj.id}"
    else:
        raise InputError(f"cannot load Bio.PDB object at level {level!r}: pass a Structure, Model or Chain")
    if not models:
        raise InputError(f"{source}: no models")
    coords, tables = [], []
    for m in models:
        atoms = list(m.get_atoms())
        if not atoms:
            raise InputError(f"{source}: model {getattr(m, 'serial_num', m.id)} has no atoms")
        coords.append(np.array([a.coord for a in atoms], dtype=np.float32))
        tables.append(atoms)
    first = tables[0]

    def number(m):  # Bio's serial_num is the MODEL number (1-based); id is 0-based
        return getattr(m, "serial_num", m.id)

    for m, atoms in zip(models[1:], tables[1:], strict=True):
        if len(atoms) != len(first):
            raise InputError(
                f"{source}: model {number(m)} has {len(atoms)} atoms but model {number(models[0])} has "
                f"{len(first)}; every model must have the same atoms in the same order"
            )
        pairs = enumerate(zip(atoms, first, strict=True))
        diff = next((i for i, (a, b) in pairs if a.get_name() != b.get_name()), None)
        if diff is not None:
            raise InputError(
                f"{source}: model {number(m)} atom {diff} is {atoms[diff].get_name()} but model "
                f"{number(models[0])} has {first[diff].get_name()}; every model must have the same atoms in the "
                "same order"
            )
    names, elements, resnames, resids, icodes, chains, segids, hetero = [], [], [], [], [], [], [], []
    for a in first:
        res = a.get_parent()
        hetflag, resseq, icode = res.id
        names.append(a.get_name())
        elements.append((a.element or "").strip().upper())
        resnames.append(res.get_resname().strip())
        resids.append(resseq)
        icodes.append(icode.strip())
        chains.append(res.get_parent().id.strip())
        segids.append((res.segid or "").strip())
        hetero.append(hetflag.strip() != "")
    name_arr = np.asarray(names, dtype=str)
    resname_arr = np.asarray(resnames, dtype=str)
    element = np.asarray(elements, dtype="<U2")
    missing = (element == "") | (element == "X")
    if missing.any():
        element[missing] = guess_elements(name_arr[missing], resname_arr[missing])
    atoms_table = AtomTable(
        name=name_arr, element=element, resname=resname_arr, resid=np.asarray(resids, dtype=np.int32),
        icode=np.asarray(icodes, dtype=str), chain=np.asarray(chains, dtype=str),
        segid=np.asarray(segids, dtype=str), hetero=np.asarray(hetero, dtype=bool),
    )
    return Structure(np.stack(coords), atoms_table, source=source)


# ----------------------------------------------------------------------------------------------------
# Atomic writes
# ----------------------------------------------------------------------------------------------------


def _default_mode() -> int:
    # mkstemp creates 0600 files; give results the permissions a plain open() would (0666 & ~umask).
    # Reading the umask means setting it; done once, at import, before any worker threads exist.
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _default_mode() if sys.platform != "win32" else None


@contextmanager
def atomic_path(path):
    """Context manager yielding a temporary path beside ``path``; renamed onto ``path`` on success.

    The temporary file lives in the same directory (so :func:`os.replace` is an atomic rename on the
    same filesystem) and ends with the same suffix (so ``np.save`` adds no second ``.npy``). On any
    exception it is removed and ``path`` is left untouched: a reader never sees a half-written file.

    Parameters
    ----------
    path : str or os.PathLike
        Final destination.

    Yields
    ------
    str
        Temporary path to write to.

    Examples
    --------
    >>> import os, tempfile
    >>> dest = os.path.join(tempfile.mkdtemp(), "notes.txt")
    >>> with atomic_path(dest) as tmp:
    ...     with open(tmp, "w") as fh:
    ...         _ = fh.write("frame 0")
    ...     print(os.path.exists(dest))  # nothing at the destination until the block ends
    False
    >>> open(dest).read()
    'frame 0'
    """
    dest = Path(path)
    directory = dest.parent if str(dest.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"{dest}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{dest.name}.", suffix=f".tmp{''.join(dest.suffixes[-1:])}")
    os.close(fd)
    try:
        yield tmp
        if _FILE_MODE is not None:
            os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_atomic(path, write_fn: Callable[[str], object]) -> Path:
    """Write a file atomically: ``write_fn(tmp_path)`` then rename ``tmp_path`` onto ``path``.

    Parameters
    ----------
    path : str or os.PathLike
        Destination.
    write_fn : callable
        Called with a temporary path (same directory, same suffix) that it must write.

    Returns
    -------
    pathlib.Path
        ``path``.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> p = write_atomic(os.path.join(d, "x.npy"), lambda tmp: np.save(tmp, np.arange(3)))
    >>> np.load(p).tolist()
    [0, 1, 2]
    """
    with atomic_path(path) as tmp:
        write_fn(tmp)
    return Path(path)


def _to_numpy(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__cuda_array_interface__") and hasattr(x, "get"):  # CuPy
        return x.get()
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch
        return x.detach().cpu().numpy()
    return np.asarray(x)


def save_array(path, data) -> Path:
    """Save an array (``.npy``) or arrays (``.npz``, compressed) atomically.

    Parameters
    ----------
    path : str or os.PathLike
        ``.npy`` (``data`` must be one array) or ``.npz``.
    data : array_like or dict of str to array_like
        A dict is saved as an ``.npz`` with its keys; a single array to ``.npz`` is stored under
        ``"arr_0"``. CuPy and torch arrays are copied to host first.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    InputError
        Other suffix, or a dict given for ``.npy``.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> path = os.path.join(tempfile.mkdtemp(), "rmsd.npz")
    >>> out = save_array(path, {"rmsd": np.zeros((3, 3), np.float32), "frame": np.arange(3)})
    >>> with np.load(out) as z:
    ...     print(sorted(z.files), z["frame"].tolist())
    ['frame', 'rmsd'] [0, 1, 2]
    """
    dest = Path(path)
    suffix = dest.suffix.lower()
    if suffix == ".npy":
        if isinstance(data, dict):
            raise InputError(f"{dest}: a dict of arrays needs a .npz file, not .npy")
        arr = _to_numpy(data)
        return write_atomic(dest, lambda tmp: np.save(tmp, arr))
    if suffix == ".npz":
        items = data.items() if isinstance(data, dict) else [("arr_0", data)]
        arrays = {str(k): _to_numpy(v) for k, v in items}
        return write_atomic(dest, lambda tmp: np.savez_compressed(tmp, **arrays))
    raise InputError(f"{dest}: unsupported output suffix {suffix or '(none)'!r}; use .npy or .npz")
