"""TM-align on the GPU: ``kernels/tmalign.cu``, one thread block per pair, batched across pairs.

The kernel runs the whole of :func:`protgpu.align.numpy_twin.tm_align_pair` for each pair (secondary
structure, the five initial alignments, DP, the TM-score searches, refinement, the final scores) and
returns per pair the TM-scores, RMSD, aligned count, superposition and the alignment as a map (the
mobile residue of each target residue). This module packs the chains once (every CA concatenated, with
offsets), computes the per-pair parameters exactly as the CPU path does, launches the pairs in chunks
that keep the kernel's workspace (DP traceback and scratch, ~(L1 + 1)(L2 + 1) bytes a pair) under the
device memory budget, each chunk as a few concurrent pieces, and builds the printed alignment on the host
for all pairs of a piece at once (``numpy_twin._gapped_many``, equal to the CPU path's ``_gapped``) while
the later pieces run (``docs/design/tm-align.md``, "Host side").

The same kernel source compiles on the host as plain C++ (``TMALIGN_HOST``): the host test
(``tests/align/test_tmalign_kernel_host.py``) runs it through :func:`pack` and :func:`unpack` too.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .numpy_twin import CLOSE_PAIR, PairAlignment, _gapped, _gapped_many, d0_final, search_parameters

#: Threads of one block (one pair); the kernel's TA_THREADS.
THREADS = 256
#: Blocks per SM the kernel's registers are limited for (its TA_MIN_BLOCKS; 1 lets it use up to 255).
MIN_BLOCKS = 2
#: Values per pair in the kernel's parameter rows (its TA_NPARAM).
N_PARAM = 8
#: What the kernel's profile counters (SM clock cycles per pair, ``profile=True``) measure: the five
#: initial alignments each with its refinement, the final scores; then, across those, the time in the
#: block's DPs plus the local fragment stage's per-warp candidates (fit, DP, quick score), in TM-score
#: searches, in the threadings' quick scores; and the whole pair.
PROFILE_SLOTS = ("threading", "secondary_structure", "local_superposition", "best_plus_ss",
                 "fragment_threading", "final_scores", "dp", "tm_search", "quick_scores", "total")


#: TM-score search seeds a warp runs at once (the kernel's TA_SEARCH_SLOTS, 32 / TA_SEED_LANES): the
#: workspace holds that many slots of distances and selections a warp.
SEARCH_SLOTS = 2

#: Block size by pair size: rows (longest chain of the pair, TA_THREADS, TA_MIN_BLOCKS), by increasing
#: length; a pair takes the first row whose length is at least its longer chain's, pairs longer than
#: every row take THREADS and MIN_BLOCKS (so an empty table means THREADS and MIN_BLOCKS for all).
#: Pairs up to 600 residues run on 128 threads, four blocks an SM: twice the pairs at once, each on half
#: the warps (at these lengths an 8-warp block's DP strips and search seeds leave warps idle much of the
#: time), measured faster on real chains up to 600 residues and slower beyond (``bench_align.py
#: --block-sizes``; docs/design/tm-align.md).
#: Every block size gives the same results bit for bit.
BUCKETS: tuple = ((600, 128, 4),)


def defines(threads: int | None = None, min_blocks: int | None = None) -> dict:
    """The kernel's compile-time settings (also the prebuilt cubin's): THREADS and MIN_BLOCKS unless
    given."""
    return {"TA_THREADS": THREADS if threads is None else threads,
            "TA_MIN_BLOCKS": MIN_BLOCKS if min_blocks is None else min_blocks}


def launch_configs() -> list[tuple[int, int]]:
    """Every (TA_THREADS, TA_MIN_BLOCKS) :func:`tm_align_gpu` may launch: THREADS and MIN_BLOCKS, then
    :data:`BUCKETS`' (each once; the prebuilt cubins are built for all of them)."""
    out = [(THREADS, MIN_BLOCKS)]
    for _length, threads, min_blocks in BUCKETS:
        if (threads, min_blocks) not in out:
            out.append((threads, min_blocks))
    return out


def block_config(l1: int, l2: int) -> tuple[int, int]:
    """(TA_THREADS, TA_MIN_BLOCKS) of a pair of L1 and L2 residues (:data:`BUCKETS`)."""
    longest = max(l1, l2)
    for length, threads, min_blocks in BUCKETS:
        if longest <= length:
            return threads, min_blocks
    return THREADS, MIN_BLOCKS


def block_configs(l1, l2) -> np.ndarray:
    """:func:`block_config` of many pairs: int64 (P, 2), one call per distinct longer length."""
    longest = np.maximum(np.asarray(l1, dtype=np.int64), np.asarray(l2, dtype=np.int64))
    uniq, inv = np.unique(longest, return_inverse=True)
    table = np.array([block_config(v, v) for v in uniq.tolist()], dtype=np.int64).reshape(-1, 2)
    return table[inv.reshape(-1)]


def workspace_bytes(l1, l2, nwarps: int | None = None):
    """Bytes of global workspace one pair of L1 and L2 residues takes (the kernel's ``ta_layout``):
    coordinate copies and per-warp scratch (float64, :data:`SEARCH_SLOTS` slots of distances: the
    TM-score search's seeds a warp), alignment maps (int32), secondary structure, and per warp that many
    slots of selections (two each) and two DP slots, each with the DP's buffers and its traceback,
    (L1 + 1)(L2 + 1) bytes (the local fragment stage runs two DPs a warp at once). ``l1`` and ``l2`` may
    be int64 arrays (P,): an array of bytes comes back; ints give an int."""
    l1 = np.asarray(l1, dtype=np.int64)
    l2 = np.asarray(l2, dtype=np.int64)
    lm = np.minimum(l1, l2)
    w = THREADS // 32 if nwarps is None else nwarps  # THREADS read now: a sweep may set it

    def r8(v):
        return (v + 7) // 8 * 8

    q = SEARCH_SLOTS * w
    doubles = [3 * l1, 3 * l2, 2 * w * 3 * l1, 3 * lm, 3 * lm, 3 * lm, 3 * lm, 2 * w * (l2 + 1), q * l2]
    ints = [l2, l2, l2, l2, w * l2, w * l2]
    nbytes = [l1, l2, 2 * w * (l2 + 1), 2 * q * l2, 2 * w * (l1 + 1) * (l2 + 1)]
    total = sum(r8(8 * d) for d in doubles) + sum(r8(4 * i) for i in ints) + sum(r8(b) for b in nbytes)
    return int(total) if np.ndim(total) == 0 else total


def pair_params(l1: int, l2: int, l_norm: float) -> np.ndarray:
    """One pair's parameter row (N_PARAM float64), computed as the CPU path computes them: the search's
    d0, d0_search and score_d8 (:func:`search_parameters`), the final d0 of L2, L1 and ``l_norm``,
    ``l_norm`` itself, and which search's superposition is returned (0: by L2, 1: by L1, 2: by
    ``l_norm``; :func:`tm_align_pair`'s choice)."""
    p = search_parameters(l1, l2)
    mode = 0 if l_norm == l2 else 1 if l_norm == l1 else 2
    return np.array([p.d0, p.d0_search, p.score_d8, d0_final(float(l2)), d0_final(float(l1)),
                     d0_final(float(l_norm)), float(l_norm), float(mode)])


def pair_params_many(l1, l2, l_norms) -> np.ndarray:
    """:func:`pair_params` of many pairs, float64 (P, N_PARAM): one call per distinct (L1, L2,
    l_norm), so every row has the scalar function's bits."""
    keys = np.stack([np.asarray(l1, dtype=np.float64), np.asarray(l2, dtype=np.float64),
                     np.asarray(l_norms, dtype=np.float64)], axis=1).reshape(-1, 3)
    if not len(keys):
        return np.zeros((0, N_PARAM))
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    table = np.array([pair_params(int(a), int(b), n) for a, b, n in uniq.tolist()], dtype=np.float64)
    return table[inv.reshape(-1)]


class Packed(NamedTuple):
    """The kernel's inputs for P pairs of chains (see the argument list in ``kernels/tmalign.cu``).

    Attributes
    ----------
    coords : float64, shape (N, 3)
        Every chain's CA coordinates, mobile chains first, then target chains, Angstrom.
    chain_off : int64, shape (C,)
        First row of each chain in ``coords``.
    chain_len : int32, shape (C,)
    pair_chain : int32, shape (P, 2)
        (mobile chain, target chain) rows of each pair.
    params : float64, shape (P, N_PARAM)
        :func:`pair_params` of each pair.
    map_off : int64, shape (P,)
        Where each pair's alignment map (L2 int32) starts in the flat map output.
    map_total : int
        Length of the flat map output (sum of the pairs' L2).
    """

    coords: np.ndarray
    chain_off: np.ndarray
    chain_len: np.ndarray
    pair_chain: np.ndarray
    params: np.ndarray
    map_off: np.ndarray
    map_total: int


def pack(mobile_ca, target_ca, pairs, l_norms) -> Packed:
    """Pack the chains once and describe the pairs.

    Parameters
    ----------
    mobile_ca, target_ca : list of ndarray, each shape (L, 3)
        CA coordinates of the mobile and target chains, Angstrom.
    pairs : array_like of int, shape (P, 2)
        (mobile index, target index) of each pair.
    l_norms : array_like of float, shape (P,)
        Each pair's extra normalisation length (``tm``).
    """
    chains = [np.asarray(c, dtype=np.float64).reshape(-1, 3) for c in (*mobile_ca, *target_ca)]
    lengths = np.array([len(c) for c in chains], dtype=np.int32)
    off = np.zeros(len(chains), dtype=np.int64)
    off[1:] = np.cumsum(lengths[:-1], dtype=np.int64)
    coords = np.ascontiguousarray(np.concatenate(chains) if chains else np.zeros((0, 3)))
    pp = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    pair_chain = np.ascontiguousarray(np.stack([pp[:, 0], pp[:, 1] + len(mobile_ca)], axis=1).astype(np.int32))
    l1 = lengths[pair_chain[:, 0]]
    l2 = lengths[pair_chain[:, 1]]
    norms = np.asarray(l_norms, dtype=np.float64).reshape(-1)
    if len(norms) != len(pp):
        raise ValueError(f"{len(pp)} pairs but {len(norms)} normalisation lengths")
    params = pair_params_many(l1, l2, norms)
    map_off = np.zeros(len(pp), dtype=np.int64)
    map_off[1:] = np.cumsum(l2[:-1], dtype=np.int64)
    return Packed(coords, off, lengths, pair_chain, params, map_off, int(l2.sum()))


class AlignmentBatch:
    """P pairs' results as columns (the fields of :class:`PairAlignment`, each with a leading pair axis
    as in :class:`protgpu.align.TMAlignResult`), also a sequence of :class:`PairAlignment` rows
    (``batch[k]``, iteration, ``len``) as the CPU path gives them.

    Attributes
    ----------
    tm_mobile, tm_target, tm, rmsd, seq_identity : float64, shape (P,)
    n_aligned : int64, shape (P,)
    rotation : float64, shape (P, 3, 3)
    translation : float64, shape (P, 3)
    aligned, mobile_aligned, target_aligned, match : object, shape (P,)
        Per pair an int64 (n, 2) array of (mobile, target) residue indices; the printed alignment.
    """

    __slots__ = PairAlignment._fields

    def __init__(self, n: int):
        for name in ("tm_mobile", "tm_target", "tm", "rmsd", "seq_identity"):
            setattr(self, name, np.full(n, np.nan))
        self.n_aligned = np.zeros(n, dtype=np.int64)
        self.rotation = np.zeros((n, 3, 3))
        self.translation = np.zeros((n, 3))
        for name in ("aligned", "mobile_aligned", "target_aligned", "match"):
            setattr(self, name, np.empty(n, dtype=object))

    def __len__(self) -> int:
        return len(self.tm)

    def __getitem__(self, k: int) -> PairAlignment:
        return PairAlignment(float(self.tm_mobile[k]), float(self.tm_target[k]), float(self.tm[k]),
                             float(self.rmsd[k]), int(self.n_aligned[k]), float(self.seq_identity[k]),
                             self.rotation[k].copy(), self.translation[k].copy(), self.aligned[k],
                             self.mobile_aligned[k], self.target_aligned[k], self.match[k])

    def __iter__(self):
        return (self[k] for k in range(len(self)))

    @classmethod
    def from_rows(cls, rows) -> AlignmentBatch:
        """The columns of a list of :class:`PairAlignment` (the CPU path's rows)."""
        rows = list(rows)
        out = cls(len(rows))
        if rows:
            for name in PairAlignment._fields:
                getattr(out, name)[:] = [getattr(r, name) for r in rows]
        return out

    def put(self, idx, part: AlignmentBatch) -> None:
        """Store ``part``'s rows at rows ``idx`` (int, shape (len(part),))."""
        for name in PairAlignment._fields:
            getattr(self, name)[idx] = getattr(part, name)


class Letters(NamedTuple):
    """Chain sequences as ASCII codes for :func:`numpy_twin._gapped_many`.

    Attributes
    ----------
    seqs : list of str
        The sequences (mobile chains first, then target chains: ``Packed``'s chain order).
    codes : uint8, shape (N,)
        The ASCII ones concatenated.
    start, length : int64, shape (C,)
        Each sequence's place in ``codes`` and its length in letters.
    ascii : bool, shape (C,)
        Whether the sequence is ASCII without NUL (pairs with another one are printed by ``_gapped``
        itself).
    """

    seqs: list
    codes: np.ndarray
    start: np.ndarray
    length: np.ndarray
    ascii: np.ndarray


def letters(seq_mobile, seq_target) -> Letters:
    """:class:`Letters` of the mobile and target sequences (``Packed``'s chain order)."""
    seqs = [*seq_mobile, *seq_target]
    ok = np.array([s.isascii() and "\x00" not in s for s in seqs], dtype=bool)
    raw = [s.encode("ascii") if a else b"" for s, a in zip(seqs, ok.tolist(), strict=True)]
    nbytes = np.array([len(r) for r in raw], dtype=np.int64)
    return Letters(seqs, np.frombuffer(b"".join(raw), dtype=np.uint8), np.cumsum(nbytes) - nbytes,
                   np.array([len(s) for s in seqs], dtype=np.int64), ok)


def unpack(packed: Packed, values, n_aligned, rt, maps, seq_mobile, seq_target) -> AlignmentBatch:
    """The kernel's per-pair outputs as :class:`PairAlignment` rows (an :class:`AlignmentBatch`),
    finished as :func:`tm_align_pair` finishes its own: aligned index pairs from the map, the match line
    (``:`` closer than 5 A under the returned superposition) and sequence identity as ``_gapped``
    gives them (built for all pairs at once by ``_gapped_many``).

    Parameters
    ----------
    packed : Packed
    values : float64, shape (P, 4)
        tm_mobile, tm_target, tm, rmsd.
    n_aligned : int, shape (P,)
    rt : float64, shape (P, 12)
        Rotation (row-major) and translation.
    maps : int, shape (map_total,)
        Flat alignment maps.
    seq_mobile, seq_target : list of str
        Sequences of the mobile and target chains (indexed like the chains given to :func:`pack`).
    """
    return finish(packed, packed.pair_chain, packed.map_off, values, n_aligned, rt, maps,
                  letters(seq_mobile, seq_target))


def finish(packed: Packed, pair_chain, map_off, values, n_aligned, rt, maps, seqs: Letters) -> AlignmentBatch:
    """:func:`unpack` of some of the pairs: those of ``pair_chain`` (C, 2), whose maps start at
    ``map_off`` (C,) in ``maps``; ``values``, ``n_aligned``, ``rt`` are theirs (C rows)."""
    pc = np.asarray(pair_chain, dtype=np.int64).reshape(-1, 2)
    n_pairs = len(pc)
    out = AlignmentBatch(n_pairs)
    if n_pairs == 0:
        return out
    values = np.asarray(values, dtype=np.float64).reshape(n_pairs, 4)
    rt = np.asarray(rt, dtype=np.float64).reshape(n_pairs, 12)
    a, b = pc[:, 0], pc[:, 1]
    l1 = packed.chain_len[a].astype(np.int64)
    l2 = packed.chain_len[b].astype(np.int64)
    pid = np.arange(n_pairs)
    # every pair's map, gathered flat (pair after pair), and its aligned entries
    y_end = np.cumsum(l2)
    y_off = y_end - l2
    map_off = np.asarray(map_off, dtype=np.int64).reshape(n_pairs)
    if np.array_equal(map_off - map_off[0], y_off):  # maps laid end to end, as pack and the pieces lay them
        y2x = np.asarray(maps)[map_off[0]:map_off[0] + int(y_end[-1])]
    else:
        y2x = np.asarray(maps)[np.repeat(map_off - y_off, l2) + np.arange(int(y_end[-1]))]
    aligned_mask = y2x >= 0
    sel = np.flatnonzero(aligned_mask)
    upto = np.concatenate([[0], np.cumsum(aligned_mask)])
    counts = upto[y_end] - upto[y_off]
    p_a = np.repeat(pid, counts)
    ja = sel - np.repeat(y_off, counts)
    ia = np.take(y2x, sel).astype(np.int64)
    ali_off = np.concatenate([[0], np.cumsum(counts)])
    # pairs _gapped_many does not take (non-ASCII letters, indices outside the sequences or the chain,
    # a map that goes back): the per-pair code, which behaves as before on them
    odd = ~(seqs.ascii[a] & seqs.ascii[b])
    bad = (ia >= np.repeat(np.minimum(seqs.length[a], l1), counts)) | (ja >= np.repeat(seqs.length[b], counts))
    bad[1:] |= (p_a[1:] == p_a[:-1]) & (ia[1:] <= ia[:-1])
    odd[p_a[bad]] = True
    # distances under each pair's superposition, all pairs at once; pairs with a distance within
    # rounding of the cutoff redo it as tm_align_pair writes it (another sum order could flip them)
    flat = packed.coords.reshape(-1)
    rx = 3 * (np.repeat(packed.chain_off[a], counts) + (np.minimum(ia, np.repeat(l1 - 1, counts)) if bad.any() else ia))
    ry = 3 * (np.repeat(packed.chain_off[b], counts) + ja)
    x = [np.take(flat, rx + j) for j in range(3)]
    m = np.repeat(rt.T, counts, axis=1)
    d2 = np.zeros(len(sel))
    scale = 1.0 + float(np.abs(rt[:, 9:]).max())  # (n_pairs > 0 here)
    for j in range(3):
        y = np.take(flat, ry + j)
        c = x[0] * m[3 * j]
        c += x[1] * m[3 * j + 1]
        c += x[2] * m[3 * j + 2]
        c += m[9 + j]
        c -= y
        d2 += c * c
        if len(sel):
            scale += float(np.abs(x[j]).max()) + float(np.abs(y).max())
    dist = np.sqrt(d2)
    close = dist < CLOSE_PAIR
    odd[p_a[np.abs(dist - CLOSE_PAIR) <= 1e-9 * scale]] = True
    ok = ~odd
    aligned = np.stack([ia, ja], axis=1)
    n = np.asarray(n_aligned).reshape(n_pairs).astype(np.int64)
    out.tm_mobile[:], out.tm_target[:], out.tm[:], out.rmsd[:] = values.T
    out.n_aligned[:] = n
    out.rotation[:] = rt[:, :9].reshape(n_pairs, 3, 3)
    out.translation[:] = rt[:, 9:]
    out.aligned[:] = [aligned[s:e] for s, e in zip((ali_off[:-1]).tolist(), ali_off[1:].tolist(), strict=True)]
    if ok.any():
        keep = ok[p_a]
        lines = _gapped_many(seqs.codes, seqs.start[a[ok]], seqs.length[a[ok]], seqs.start[b[ok]],
                             seqs.length[b[ok]], counts[ok], ia[keep], ja[keep], close[keep])
        rows = slice(None) if ok.all() else ok
        out.mobile_aligned[rows], out.match[rows], out.target_aligned[rows], same = lines
        with np.errstate(divide="ignore", invalid="ignore"):
            out.seq_identity[rows] = np.where(n[ok] > 0, same / np.where(n[ok] > 0, n[ok], 1), np.nan)
    for p in np.flatnonzero(odd).tolist():
        out.put([p], _finish_one(packed, pc[p], values[p], int(n[p]), rt[p], y2x[y_off[p]:y_off[p] + l2[p]], seqs))
    return out


def _finish_one(packed: Packed, chains, values, n: int, rt, y2x, seqs: Letters) -> AlignmentBatch:
    """One pair finished by ``tm_align_pair``'s own expressions (:func:`finish`'s exceptions)."""
    a, b = int(chains[0]), int(chains[1])
    x = packed.coords[packed.chain_off[a]:packed.chain_off[a] + packed.chain_len[a]]
    y = packed.coords[packed.chain_off[b]:packed.chain_off[b] + packed.chain_len[b]]
    ja = np.flatnonzero(y2x >= 0)
    ia = np.asarray(y2x[ja], dtype=np.int64)
    rot = np.array(rt[:9], dtype=np.float64).reshape(3, 3)
    trans = np.array(rt[9:], dtype=np.float64)
    close = np.sqrt(np.sum((x[ia] @ rot.T + trans - y[ja]) ** 2, axis=1)) < CLOSE_PAIR
    top, mid, bottom, same = _gapped(seqs.seqs[a], seqs.seqs[b], ia, ja, close)
    return AlignmentBatch.from_rows([PairAlignment(
        float(values[0]), float(values[1]), float(values[2]), float(values[3]), n, same / n if n else float("nan"),
        rot, trans, np.stack([ia, ja], axis=1).astype(np.int64), top, bottom, mid)])


def tm_align_gpu(mobile_ca, target_ca, seq_mobile, seq_target, pairs, l_norms, *, profile: bool = False):
    """:func:`protgpu.align.numpy_twin.tm_align_pair` for every pair, on the current GPU.

    Parameters
    ----------
    mobile_ca, target_ca : list of ndarray, each shape (L, 3)
        CA coordinates, Angstrom.
    seq_mobile, seq_target : list of str
        Their one-letter sequences.
    pairs : array_like of int, shape (P, 2)
        (mobile index, target index) pairs.
    l_norms : array_like of float, shape (P,)
        The length each pair's ``tm`` is normalised by.
    profile : bool
        Also return the kernel's clock counters (benchmarks: where the time goes).

    Returns
    -------
    AlignmentBatch
        The P pairs' results as columns, also a sequence of :class:`PairAlignment` rows, in order; the
        same values the CPU path gives (TM-scores to ~1e-12).
    ndarray of int64, shape (P, len(PROFILE_SLOTS))
        Only with ``profile``: SM clock cycles per pair in each of :data:`PROFILE_SLOTS`.

    Notes
    -----
    Pairs run by block size (:func:`block_config`), each group largest workspace first, in chunks whose
    workspace fits the device memory budget (:func:`protgpu._memory.device_budget_bytes`) and at most
    :data:`WORKSPACE_BYTES` (or :data:`WORKSPACE_PAIRS` pairs' worth), so memory does not grow with the
    number of pairs. A chunk is launched as up to :data:`PIECES` kernels on as
    many streams, each on its own slice of the chunk's workspace: the pieces run concurrently (no idle
    tail between them) and the host unpacks piece k while the later ones run.
    """
    import cupy as cp

    from .._cuda import get_kernel
    from .._memory import device_budget_bytes, rows_per_chunk

    packed = pack(mobile_ca, target_ca, pairs, l_norms)
    n_pairs = len(packed.pair_chain)
    out = AlignmentBatch(n_pairs)
    prof = np.zeros((n_pairs, len(PROFILE_SLOTS)), dtype=np.int64)
    if n_pairs == 0:
        return (out, prof) if profile else out
    seqs = letters(seq_mobile, seq_target)
    dev = _Inputs(cp.asarray(packed.coords), cp.asarray(packed.chain_off), cp.asarray(packed.chain_len))
    uploaded = cp.cuda.get_current_stream().record()  # the pieces' streams wait for the uploads
    streams = _piece_streams(cp, max(1, PIECES))
    for s in streams:
        s.wait_event(uploaded)
    lens = packed.chain_len
    l1, l2 = lens[packed.pair_chain[:, 0]], lens[packed.pair_chain[:, 1]]
    configs = block_configs(l1, l2)
    budget = device_budget_bytes()
    for threads, min_blocks in np.unique(configs, axis=0).tolist():
        kernel = get_kernel("tmalign", "tmalign_pairs", defines=defines(threads, min_blocks))
        mine = np.flatnonzero((configs[:, 0] == threads) & (configs[:, 1] == min_blocks))
        ws = np.asarray(workspace_bytes(l1[mine], l2[mine], threads // 32), dtype=np.int64)
        by_size = np.argsort(-ws, kind="stable")
        order, ws = mine[by_size], ws[by_size]
        start = 0
        while start < len(order):
            stride = int(ws[start])  # the largest of this chunk (sorted): every slice fits
            # the workspace is per pair, but only ~2 blocks per SM run at once: a chunk larger than
            # WORKSPACE_BYTES (or WORKSPACE_PAIRS pairs, for long chains) buys no speed, and a search
            # of many chunks would otherwise hold half the device and fragment CuPy's pool
            cap = min(budget, max(WORKSPACE_BYTES, WORKSPACE_PAIRS * stride))
            step = min(rows_per_chunk(stride, len(order) - start, cap), 1 << 20)
            idx = order[start:start + step]
            work = cp.empty(len(idx) * stride, dtype=cp.uint8)
            # the streams wait for this chunk's workspace (freed memory of the last chunk is reused)
            ready = cp.cuda.get_current_stream().record()
            cuts = np.linspace(0, len(idx), min(len(streams), -(-len(idx) // MIN_PIECE)) + 1).astype(np.int64)
            running = []
            for k, s in enumerate(streams[:len(cuts) - 1]):
                s.wait_event(ready)
                running.append(_launch_piece(kernel, threads, packed, dev, idx[cuts[k]:cuts[k + 1]],
                                             work[cuts[k] * stride:cuts[k + 1] * stride], stride, s, profile))
            for piece in running:  # in launch order: piece k is unpacked while the later ones run
                out.put(piece.idx, _finish_piece(packed, piece, seqs, prof if profile else None))
            del work, running
            start += len(idx)
    return (out, prof) if profile else out


#: Device workspace of one chunk at most (bytes), unless WORKSPACE_PAIRS pairs need more: enough pairs
#: to keep every SM busy through a chunk's tail (2 blocks per SM at 300 residues: 264 on an H200).
WORKSPACE_BYTES = 4 << 30
WORKSPACE_PAIRS = 2048


#: Kernels (and streams) a chunk is launched as, so that the host unpacks the first ones while the
#: others run; pieces of at least MIN_PIECE pairs.
PIECES = 4
MIN_PIECE = 256


#: Per device, the streams the pieces run on (kept: their memory pool arenas are reused call after call).
_STREAMS: dict = {}


def _piece_streams(cp, n: int) -> list:
    have = _STREAMS.setdefault(cp.cuda.Device().id, [])
    while len(have) < n:
        have.append(cp.cuda.Stream(non_blocking=True))
    return have[:n]


class _Inputs(NamedTuple):
    coords: object
    chain_off: object
    chain_len: object


class _Piece(NamedTuple):
    idx: np.ndarray
    map_off: np.ndarray
    stream: object
    out: tuple  # device arrays: values, n_aligned, rt, maps, profile (or None)


def _launch_piece(kernel, threads, packed: Packed, dev: _Inputs, idx, work, stride, stream, profile) -> _Piece:
    """Launch the pairs ``idx`` on ``stream`` with their own outputs (maps: the pieces' own layout)."""
    import cupy as cp

    from .._cuda import launch

    c = len(idx)
    l2 = packed.chain_len[packed.pair_chain[idx, 1]].astype(np.int64)
    map_off = np.cumsum(l2) - l2
    with stream:  # allocated on the stream that uses them (the pool reuses memory per stream)
        out = (cp.empty((c, 4)), cp.empty(c, dtype=cp.int32), cp.empty((c, 12)),
               cp.empty(max(int(l2.sum()), 1), dtype=cp.int32),
               cp.zeros((c, len(PROFILE_SLOTS)), dtype=cp.int64) if profile else None)
        pair_chain = cp.asarray(np.ascontiguousarray(packed.pair_chain[idx]))
        params = cp.asarray(np.ascontiguousarray(packed.params[idx]))
        offsets = cp.asarray(map_off)
    launch(kernel, (c,), (threads,), dev.coords, dev.chain_off, dev.chain_len, pair_chain, params, offsets, np.int32(c),
           work, np.int64(stride), out[0], out[1], out[2], out[3], out[4], stream=stream)
    return _Piece(idx, map_off, stream, out)


def _finish_piece(packed: Packed, piece: _Piece, seqs: Letters, prof) -> AlignmentBatch:
    """Copy a piece's outputs (waiting for its kernel only) and unpack them."""
    import cupy as cp

    values, n_ali, rt, maps, out_prof = (None if a is None else cp.asnumpy(a, stream=piece.stream) for a in piece.out)
    if prof is not None:
        prof[piece.idx] = out_prof
    return finish(packed, packed.pair_chain[piece.idx], piece.map_off, values, n_ali, rt, maps, seqs)
