"""A structure database for TM-align search (``.pgdb``): many chains' CA traces, sequences and
secondary structure in one file that loads with one read and memory-maps.

Format (version 1; ``docs/design/tm-align-search.md``)::

    bytes 0-7    magic b"PGTMDB1\\n"
    bytes 8-15   header length H, uint64 little-endian
    bytes 16-    H bytes of UTF-8 JSON: {"version": 1, "n_chains": N, "n_residues": R,
                 "arrays": {name: {"dtype", "shape", "offset"}}}
    then each array, C order, at its ``offset`` from the file start (a multiple of 64)

Arrays: ``coords`` <f4 (R, 3) Angstrom (protgpu reads coordinates as float32, so nothing is lost);
``offsets`` <i8 (N + 1,) (chain k is residues offsets[k]:offsets[k + 1]); ``lengths`` <i4 (N,);
``sequence`` and ``secondary`` u1 (R,) ASCII letters (one-letter codes, 'X' unknown; TM-align's
H/E/T/C); ``n_skipped`` <i4 (N,); ``names`` u1 (B,) UTF-8 and ``name_offsets`` <i8 (N + 1,).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from .._inputs import as_structure, source_name
from ..errors import InputError
from ..io.write import write_atomic
from ._dp import secondary_structure
from .chains import Chain, one_chain

MAGIC = b"PGTMDB1\n"
VERSION = 1
_ALIGN = 64
_ARRAYS = {  # name: (dtype, trailing shape)
    "coords": ("<f4", (3,)), "offsets": ("<i8", ()), "lengths": ("<i4", ()), "sequence": ("u1", ()),
    "secondary": ("u1", ()), "n_skipped": ("<i4", ()), "names": ("u1", ()), "name_offsets": ("<i8", ()),
}


class StructureDB:
    """A loaded ``.pgdb`` database: arrays are read-only views of one memory map of the file.

    Attributes
    ----------
    path : str
    coords : float32, shape (R, 3)
        Every chain's CA coordinates, one after the other, Angstrom.
    offsets : int64, shape (N + 1,)
    lengths : int32, shape (N,)
    sequence, secondary : uint8, shape (R,)
        ASCII letters.
    n_skipped : int32, shape (N,)
    """

    def __init__(self, path: str, arrays: dict):
        self.path = path
        for k, v in arrays.items():
            setattr(self, k, v)
        self._names = None

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def names(self) -> list[str]:
        """Chain names (``file:chain``), decoded once."""
        if self._names is None:
            raw, off = self._raw_names, self.name_offsets
            b = raw.tobytes()
            self._names = [b[off[k]:off[k + 1]].decode() for k in range(len(self))]
        return self._names

    def chain(self, k: int) -> Chain:
        """Entry k as the aligner's :class:`~protgpu.align.chains.Chain` (float64 CA coordinates)."""
        a, b = int(self.offsets[k]), int(self.offsets[k + 1])
        return Chain(np.asarray(self.coords[a:b], dtype=np.float64), self.sequence[a:b].tobytes().decode("ascii"),
                     self.names[k], int(self.n_skipped[k]))

    def chains(self, start: int = 0, stop: int | None = None) -> list[Chain]:
        """Entries ``start:stop`` (default all) as :class:`~protgpu.align.chains.Chain`, in order (pass
        them to ``pg.tm_align``); a chunk at a time keeps the float64 copies bounded."""
        return [self.chain(k) for k in range(start, len(self) if stop is None else stop)]


#: Database entries per tm_align call in :func:`search`: a GPU batch large enough to fill the device,
#: and a bounded host footprint (float64 chains and alignments of one chunk, ~0.3 GB at 300 residues).
CHUNK = 32768

#: Entries per tm_align call while :func:`search` can skip entries (``top`` or ``min_tm`` given) and
#: the entries are shorter than the query: the skip is decided between calls, so smaller calls skip
#: more; this many still fill the device.
BOUNDED_CHUNK = 4096

_FIELDS = (("tm_query", "tm_mobile"), ("tm_target", "tm_target"), ("rmsd", "rmsd"), ("n_aligned", "n_aligned"),
           ("seq_identity", "seq_identity"))


def tm_query_bound(query_length: int, lengths) -> np.ndarray:
    """The highest ``tm_query`` an entry of each length can reach: min(Lq, Lt) / Lq.

    A TM-score normalised by the query's length Lq is a sum over aligned residue pairs of terms of at
    most 1, over Lq, and at most min(Lq, Lt) pairs align.

    Parameters
    ----------
    query_length : int
        Lq, residues.
    lengths : array of int, shape (N,)
        The entries' lengths Lt, residues.

    Returns
    -------
    float64, shape (N,)
    """
    return np.minimum(np.asarray(lengths, dtype=np.float64), query_length) / query_length


def search(query, db, *, top=None, min_tm=0.0, device="auto", chunk=CHUNK) -> list[dict]:
    """TM-align one query chain (Chain_1) onto every entry (Chain_2) of a database: the hits, sorted.

    The entries go to :func:`~protgpu.align.tm_align` in chunks of ``chunk`` (one call each, batched
    on the GPU), so host memory is bounded by the chunk, not the database. With ``top`` or
    ``min_tm``, entries that cannot make the list are not aligned: the entries at least as long as
    the query first (in chunks of ``chunk``), then the shorter ones from the longest down (in chunks
    of at most :data:`BOUNDED_CHUNK`), and an entry is skipped once its bound
    (:func:`tm_query_bound`) is below ``min_tm`` or below the ``top``-th best ``tm_query`` found so far.
    The rows are those of aligning every entry.

    Parameters
    ----------
    query : Chain
        From :func:`read_chain` (or :func:`~protgpu.align.chains.one_chain`).
    db : StructureDB
        From :func:`load`.
    top : int, optional
        Keep the first ``top`` rows (after ``min_tm``).
    min_tm : float
        Keep rows with ``tm_query`` at least this.
    device : {"auto", "cpu", "gpu"}
    chunk : int
        Entries per ``tm_align`` call (at most :data:`BOUNDED_CHUNK` for the entries shorter than the
        query, with ``top`` or ``min_tm``).

    Returns
    -------
    list of dict
        One row per hit: query, target (names), tm_query (normalised by the query's length),
        tm_target (by the entry's), rmsd (Angstrom), n_aligned, seq_identity; sorted by tm_query from
        the highest, ties by tm_target, then database order.
    """
    from .api import tm_align

    if top is not None and (isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1):
        raise InputError(f"top must be a positive integer, not {top!r}")
    if not 0.0 <= float(min_tm) <= 1.0:
        raise InputError(f"min_tm must be between 0 and 1, not {min_tm!r}")
    names = db.names
    bounded = top is not None or min_tm > 0.0
    bound = tm_query_bound(len(query.ca), db.lengths)
    # Highest bound first (database order among equals), so that the skipped entries are a tail.
    order = np.argsort(-bound, kind="stable") if bounded else np.arange(len(db))
    # The entries at least as long as the query (bound 1) are never skipped: they go in whole chunks,
    # the rest in smaller ones (the cut is updated between calls).
    whole = int(np.count_nonzero(bound >= 1.0)) if bounded else len(db)
    # 1e-12: the kernel's and the CPU path's scores may round the bound's division differently by a few
    # units in the last place; skip only what is below the cut by more. Ascending, for searchsorted.
    lowered = -bound[order] * (1.0 + 1e-12)
    done, cols = [], {k: [] for k, _ in _FIELDS}
    start, cut = 0, float(min_tm)
    while start < len(order):
        # the entries that can still make the list: a prefix of those left, as the bound decreases
        alive = int(np.searchsorted(lowered, -cut, side="right"))
        if start >= alive:
            break
        stop = min(start + chunk, whole) if start < whole else min(start + min(chunk, BOUNDED_CHUNK), alive)
        idx = order[start:stop]
        start += len(idx)
        r = tm_align(query, [db.chain(k) for k in idx.tolist()], device=device)
        done.append(idx)
        for k, field in _FIELDS:
            cols[k].append(np.asarray(getattr(r, field)).reshape(-1))
        if top is not None and sum(map(len, done)) >= top:
            tm = np.concatenate(cols["tm_query"])
            cut = max(cut, float(np.partition(tm, len(tm) - top)[len(tm) - top]))
    if not done:
        return []
    entry = np.concatenate(done)
    c = {k: np.concatenate(v) for k, v in cols.items()}
    rank = np.lexsort((entry, -c["tm_target"], -c["tm_query"]))
    rank = rank[c["tm_query"][rank] >= min_tm]
    if top is not None:
        rank = rank[:top]
    return [{"query": query.name, "target": names[entry[t]], "tm_query": float(c["tm_query"][t]),
             "tm_target": float(c["tm_target"][t]), "rmsd": float(c["rmsd"][t]),
             "n_aligned": int(c["n_aligned"][t]), "seq_identity": float(c["seq_identity"][t])}
            for t in rank.tolist()]


def read_chain(path, chain: str | None = None) -> Chain:
    """One file's chain as TM-align reads it (the first protein chain, or ``chain``; the first
    model), named ``file:chain_id``, through the front door (:func:`protgpu.align.chains.one_chain`,
    which also warns of the chains it skips)."""
    s = as_structure(str(path), str(path))
    c = one_chain(s, str(path), chain)
    if chain is None:
        ca = s.select_indices("ca")
        # the chain of the first CA atom: the first chain with one, which one_chain picked
        chain = str(s.atoms.chain[ca[0]]) if len(ca) else None
    name = source_name(s, str(path))
    return c._replace(name=f"{name}:{chain}" if chain is not None else name)


def write(path, chains) -> Path:
    """Write ``chains`` (a sequence of :class:`~protgpu.align.chains.Chain`) as a ``.pgdb`` file,
    atomically (temp then rename, :func:`protgpu.io.write.write_atomic`).

    Parameters
    ----------
    path : str or os.PathLike
    chains : sequence of Chain
        CA coordinates (L, 3) Angstrom, sequence (L letters), name, skipped count.

    Returns
    -------
    pathlib.Path
    """
    chains = list(chains)
    if not chains:
        raise InputError(f"{path}: a database needs at least one chain")
    lengths = np.array([len(c.ca) for c in chains], dtype="<i4")
    offsets = np.zeros(len(chains) + 1, dtype="<i8")
    np.cumsum(lengths, out=offsets[1:])
    names = [c.name.encode() for c in chains]
    name_offsets = np.zeros(len(chains) + 1, dtype="<i8")
    np.cumsum([len(b) for b in names], out=name_offsets[1:])
    arrays = {
        "coords": np.concatenate([np.asarray(c.ca, dtype="<f4") for c in chains]).reshape(-1, 3),
        "offsets": offsets, "lengths": lengths,
        "sequence": np.frombuffer("".join(c.sequence for c in chains).encode("ascii"), dtype="u1"),
        "secondary": np.frombuffer("".join(secondary_structure(c.ca) for c in chains).encode("ascii"),
                                   dtype="u1"),
        "n_skipped": np.array([c.n_skipped for c in chains], dtype="<i4"),
        "names": np.frombuffer(b"".join(names), dtype="u1"), "name_offsets": name_offsets,
    }
    return write_atomic(path, lambda tmp: _write_file(tmp, arrays, len(chains), int(offsets[-1])))


def _write_file(tmp: str, arrays: dict, n: int, r: int) -> None:
    meta, pos = {}, 0
    for k, a in arrays.items():
        meta[k] = {"dtype": _ARRAYS[k][0], "shape": list(a.shape), "offset": pos}
        pos += -(-a.nbytes // _ALIGN) * _ALIGN
    head = {"version": VERSION, "n_chains": n, "n_residues": r, "arrays": meta}
    # Offsets count from the file start, so the data start (a multiple of 64 after the header) and
    # the header's length depend on each other: grow the start until the header fits before it.
    rel = {k: m["offset"] for k, m in meta.items()}
    start = _ALIGN
    while True:
        for k, m in meta.items():
            m["offset"] = rel[k] + start
        text = json.dumps(head).encode()
        if 16 + len(text) <= start:
            break
        start = -(-(16 + len(text)) // _ALIGN) * _ALIGN
    with open(tmp, "wb") as fh:
        fh.write(MAGIC + struct.pack("<Q", len(text)) + text)
        for k, a in arrays.items():
            fh.seek(meta[k]["offset"])
            fh.write(np.ascontiguousarray(a).tobytes())
        fh.truncate(max(start, fh.tell()))


def load(path) -> StructureDB:
    """Open a ``.pgdb`` database: one memory map of the file, every array a view of it.

    Raises
    ------
    InputError
        Not a file, not a protgpu structure database, another version, or a truncated or corrupt
        file (one line naming the file).
    """
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise InputError(f"{p}: no such database file")

    def bad(why: str):
        return InputError(f"{p}: not a valid protgpu structure database ({why})")

    size = os.path.getsize(p)
    with open(p, "rb") as fh:
        head = fh.read(16)
        if len(head) < 16 or head[:8] != MAGIC:
            if head[:6] == MAGIC[:6]:
                raise bad(f"format version {head[6:7].decode(errors='replace')}, this protgpu reads {VERSION}")
            raise bad("wrong magic bytes; build one with protgpu db build")
        (h,) = struct.unpack("<Q", head[8:])
        if h > size - 16:
            raise bad("truncated header")
        try:
            meta = json.loads(fh.read(h).decode())
            n, r, specs = int(meta["n_chains"]), int(meta["n_residues"]), meta["arrays"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise bad("unreadable header") from None
    if meta.get("version") != VERSION:
        raise bad(f"format version {meta.get('version')!r}, this protgpu reads {VERSION}")
    mm = np.memmap(p, dtype="u1", mode="r") if size else np.zeros(0, "u1")
    arrays = {}
    for k, (dt, tail) in _ARRAYS.items():
        spec = specs.get(k) if isinstance(specs, dict) else None
        if not isinstance(spec, dict) or spec.get("dtype") != dt:
            raise bad(f"array {k!r} missing or of the wrong type")
        try:
            shape, off = tuple(int(s) for s in spec["shape"]), int(spec["offset"])
        except (KeyError, TypeError, ValueError):
            raise bad(f"array {k!r}: unreadable shape or offset") from None
        if shape[1:] != tail or any(s < 0 for s in shape) or off < 16 + h:
            raise bad(f"array {k!r} has shape {shape}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        if off + nbytes > size:
            raise bad(f"truncated: array {k!r} ends at byte {off + nbytes}, the file has {size}")
        arrays[k] = mm[off:off + nbytes].view(dt).reshape(shape)
    arrays["_raw_names"] = arrays.pop("names")
    off, lens = arrays["offsets"], arrays["lengths"]
    if (len(off) != n + 1 or len(lens) != n or len(arrays["name_offsets"]) != n + 1 or len(arrays["coords"]) != r
            or len(arrays["sequence"]) != r or len(arrays["secondary"]) != r or len(arrays["n_skipped"]) != n):
        raise bad("array lengths disagree with the header")
    if n == 0 or off[0] != 0 or off[-1] != r or not np.array_equal(np.diff(off), lens) or (lens < 1).any():
        raise bad("chain offsets are inconsistent")
    no = arrays["name_offsets"]
    if no[0] != 0 or no[-1] != len(arrays["_raw_names"]) or (np.diff(no) < 0).any():
        raise bad("name offsets are inconsistent")
    return StructureDB(p, arrays)
