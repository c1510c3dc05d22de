"""TM-align on the GPU: ``kernels/tmalign.cu``, one thread block per pair, batched across pairs.

The kernel runs the whole of :func:`protgpu.align.numpy_twin.tm_align_pair` for each pair (secondary
structure, the five initial alignments, DP, the TM-score searches, refinement, the final scores) and
returns per pair the TM-scores, RMSD, aligned count, superposition and the alignment as a map (the
mobile residue of each target residue). This module packs the chains once (every CA concatenated, with
offsets), computes the per-pair parameters exactly as the CPU path does, launches the pairs in chunks
that keep the kernel's workspace (DP traceback and scratch, ~(L1 + 1)(L2 + 1) bytes a pair) under the
device memory budget, and builds the printed alignment on the host with the CPU path's helper.

The same kernel source compiles on the host as plain C++ (``TMALIGN_HOST``): the host test
(``tests/align/test_tmalign_kernel_host.py``) runs it through :func:`pack` and :func:`unpack` too.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .numpy_twin import CLOSE_PAIR, PairAlignment, _gapped, d0_final, search_parameters

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


#: Block size by pair size: rows (longest chain of the pair, TA_THREADS, TA_MIN_BLOCKS), by increasing
#: length; a pair takes the first row whose length is at least its longer chain's, pairs longer than
#: every row take THREADS and MIN_BLOCKS (so an empty table means THREADS and MIN_BLOCKS for all).
BUCKETS: tuple = ()


def defines(threads: int | None = None, min_blocks: int | None = None) -> dict:
    """The kernel's compile-time settings (also the prebuilt cubin's): THREADS and MIN_BLOCKS unless
    given."""
    return {"TA_THREADS": THREADS if threads is None else threads,
            "TA_MIN_BLOCKS": MIN_BLOCKS if min_blocks is None else min_blocks}


def block_config(l1: int, l2: int) -> tuple[int, int]:
    """(TA_THREADS, TA_MIN_BLOCKS) of a pair of L1 and L2 residues (:data:`BUCKETS`)."""
    longest = max(l1, l2)
    for length, threads, min_blocks in BUCKETS:
        if longest <= length:
            return threads, min_blocks
    return THREADS, MIN_BLOCKS


def workspace_bytes(l1: int, l2: int, nwarps: int | None = None) -> int:
    """Bytes of global workspace one pair of L1 and L2 residues takes (the kernel's ``ta_layout``):
    coordinate copies and per-warp scratch (float64), alignment maps (int32), secondary structure, and
    per warp the DP's buffers, its selections and its traceback, (L1 + 1)(L2 + 1) bytes (the local
    fragment stage runs one DP per warp)."""
    lm = min(l1, l2)
    w = THREADS // 32 if nwarps is None else nwarps  # THREADS read now: a sweep may set it

    def r8(v):
        return (v + 7) // 8 * 8

    doubles = [3 * l1, 3 * l2, w * 3 * l1, 3 * lm, 3 * lm, 3 * lm, 3 * lm, w * (l2 + 1), w * l2]
    ints = [l2, l2, l2, l2, w * l2, w * l2]
    nbytes = [l1, l2, w * (l2 + 1), 2 * w * l2, w * (l1 + 1) * (l2 + 1)]
    return sum(r8(8 * d) for d in doubles) + sum(r8(4 * i) for i in ints) + sum(r8(b) for b in nbytes)


def pair_params(l1: int, l2: int, l_norm: float) -> np.ndarray:
    """One pair's parameter row (N_PARAM float64), computed as the CPU path computes them: the search's
    d0, d0_search and score_d8 (:func:`search_parameters`), the final d0 of L2, L1 and ``l_norm``,
    ``l_norm`` itself, and which search's superposition is returned (0: by L2, 1: by L1, 2: by
    ``l_norm``; :func:`tm_align_pair`'s choice)."""
    p = search_parameters(l1, l2)
    mode = 0 if l_norm == l2 else 1 if l_norm == l1 else 2
    return np.array([p.d0, p.d0_search, p.score_d8, d0_final(float(l2)), d0_final(float(l1)),
                     d0_final(float(l_norm)), float(l_norm), float(mode)])


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
    params = np.array([pair_params(int(a), int(b), float(n)) for a, b, n in zip(l1, l2, l_norms, strict=True)],
                      dtype=np.float64).reshape(-1, N_PARAM)
    map_off = np.zeros(len(pp), dtype=np.int64)
    map_off[1:] = np.cumsum(l2[:-1], dtype=np.int64)
    return Packed(coords, off, lengths, pair_chain, params, map_off, int(l2.sum()))


def unpack(packed: Packed, values, n_aligned, rt, maps, seq_mobile, seq_target) -> list[PairAlignment]:
    """The kernel's per-pair outputs as :class:`PairAlignment` rows, finished as
    :func:`tm_align_pair` finishes its own: aligned index pairs from the map, the match line (``:``
    closer than 5 A under the returned superposition) and sequence identity by ``_gapped``.

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
    rows = []
    n_mob = len(seq_mobile)
    for p, (a, b) in enumerate(packed.pair_chain.tolist()):
        x = packed.coords[packed.chain_off[a]:packed.chain_off[a] + packed.chain_len[a]]
        y = packed.coords[packed.chain_off[b]:packed.chain_off[b] + packed.chain_len[b]]
        y2x = np.asarray(maps[packed.map_off[p]:packed.map_off[p] + len(y)], dtype=np.int64)
        ja = np.flatnonzero(y2x >= 0)
        ia = y2x[ja]
        rot = np.array(rt[p, :9], dtype=np.float64).reshape(3, 3)
        trans = np.array(rt[p, 9:], dtype=np.float64)
        close = np.sqrt(np.sum((x[ia] @ rot.T + trans - y[ja]) ** 2, axis=1)) < CLOSE_PAIR
        top, mid, bottom, same = _gapped(seq_mobile[a], seq_target[b - n_mob], ia, ja, close)
        n = int(n_aligned[p])
        rows.append(PairAlignment(float(values[p, 0]), float(values[p, 1]), float(values[p, 2]), float(values[p, 3]), n,
                                  same / n if n else float("nan"), rot, trans,
                                  np.stack([ia, ja], axis=1).astype(np.int64), top, bottom, mid))
    return rows


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
    list of PairAlignment
        One per pair, in order; the same values the CPU path gives (TM-scores to ~1e-12).
    ndarray of int64, shape (P, len(PROFILE_SLOTS))
        Only with ``profile``: SM clock cycles per pair in each of :data:`PROFILE_SLOTS`.

    Notes
    -----
    Pairs run by block size (:func:`block_config`), each group largest workspace first, in chunks whose
    workspace fits the device memory budget (:func:`protgpu._memory.device_budget_bytes`), so memory
    does not grow with the number of pairs.
    """
    import cupy as cp

    from .._cuda import get_kernel, launch
    from .._memory import device_budget_bytes, rows_per_chunk

    packed = pack(mobile_ca, target_ca, pairs, l_norms)
    n_pairs = len(packed.pair_chain)
    values = np.empty((n_pairs, 4))
    n_ali = np.empty(n_pairs, dtype=np.int32)
    rt = np.empty((n_pairs, 12))
    prof = np.zeros((n_pairs, len(PROFILE_SLOTS)), dtype=np.int64)
    if n_pairs == 0:
        return ([], prof) if profile else []
    coords = cp.asarray(packed.coords)
    chain_off = cp.asarray(packed.chain_off)
    chain_len = cp.asarray(packed.chain_len)
    maps = cp.empty(max(packed.map_total, 1), dtype=cp.int32)
    lens = packed.chain_len
    configs = [block_config(int(lens[a]), int(lens[b])) for a, b in packed.pair_chain.tolist()]
    budget = device_budget_bytes()
    for threads, min_blocks in sorted(set(configs)):
        kernel = get_kernel("tmalign", "tmalign_pairs", defines=defines(threads, min_blocks))
        mine = np.flatnonzero([c == (threads, min_blocks) for c in configs])
        ws = np.array([workspace_bytes(int(lens[a]), int(lens[b]), threads // 32)
                       for a, b in packed.pair_chain[mine].tolist()], dtype=np.int64)
        by_size = np.argsort(-ws, kind="stable")
        order, ws = mine[by_size], ws[by_size]
        start = 0
        while start < len(order):
            stride = int(ws[start])  # the largest of this chunk (sorted): every slice fits
            step = min(rows_per_chunk(stride, len(order) - start, budget), 1 << 20)
            idx = order[start:start + step]
            c = len(idx)
            out_val = cp.empty((c, 4))
            out_n = cp.empty(c, dtype=cp.int32)
            out_rt = cp.empty((c, 12))
            out_prof = cp.zeros((c, len(PROFILE_SLOTS)), dtype=cp.int64) if profile else None
            work = cp.empty(c * stride, dtype=cp.uint8)
            pair_chain = cp.asarray(np.ascontiguousarray(packed.pair_chain[idx]))
            params = cp.asarray(np.ascontiguousarray(packed.params[idx]))
            map_off = cp.asarray(np.ascontiguousarray(packed.map_off[idx]))
            launch(kernel, (c,), (threads,), coords, chain_off, chain_len, pair_chain, params, map_off, np.int32(c),
                   work, np.int64(stride), out_val, out_n, out_rt, maps, out_prof)
            values[idx] = cp.asnumpy(out_val)
            n_ali[idx] = cp.asnumpy(out_n)
            rt[idx] = cp.asnumpy(out_rt)
            if profile:
                prof[idx] = cp.asnumpy(out_prof)
            del work
            start += c
    rows = unpack(packed, values, n_ali, rt, cp.asnumpy(maps), seq_mobile, seq_target)
    return (rows, prof) if profile else rows
