"""TM-align in NumPy, stage by stage: the specification of the GPU kernels and the CPU path.

One pair at a time (:func:`tm_align_pair`), each stage batched over its own candidates (threading
offsets, fragment pairs, seeds). The stages and their parameters are TM-align's (Zhang & Skolnick
2005; US-align's TMalign code, which tmtools wraps): see ``docs/design/tm-align.md``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._threads import blas_threads
from ..scoring._kabsch import superpose
from . import _fast
from ._dp import nw_align, secondary_structure, ss_scores_matrix, tm_scores_matrix
from ._search import fast_scores, tm_search

#: Memory (bytes) one batch of DP problems may take; larger batches of fragment superpositions are
#: split.
DP_BATCH_BYTES = 256 * 2**20
#: Distance (A) under which an aligned pair is marked ``:`` in the match line (TM-align's d0_out).
CLOSE_PAIR = 5.0


class SearchParameters(NamedTuple):
    """The parameters of the alignment stages (TM-align's parameter_set4search).

    Attributes
    ----------
    l_norm : float
        min(L1, L2): the search's normalisation length.
    d0 : float
        1.24 (L - 15)^(1/3) - 1.8 (0.168 for L <= 19), plus 0.8, for L = l_norm.
    d0_search : float
        d0 clamped to [4.5, 8].
    score_d8 : float
        1.5 L^0.3 + 3.5: pairs farther than this count for nothing in the search and are left out of
        the final alignment.
    dcu0 : float
        4.25 A: CA-CA distance under which consecutive residues continue a fragment.
    """

    l_norm: float
    d0: float
    d0_search: float
    score_d8: float
    dcu0: float


def search_parameters(l1: int, l2: int) -> SearchParameters:
    """TM-align's search parameters for chains of L1 and L2 residues."""
    ln = float(min(l1, l2))
    d0 = (0.168 if ln <= 19 else 1.24 * (ln - 15) ** (1.0 / 3) - 1.8) + 0.8
    return SearchParameters(ln, d0, min(max(d0, 4.5), 8.0), 1.5 * ln**0.3 + 3.5, 4.25)


def d0_final(length: float) -> float:
    """TM-score's d0 for a normalisation length: 1.24 (L - 15)^(1/3) - 1.8, 0.5 for L <= 21, >= 0.5."""
    if length <= 21:
        return 0.5
    return max(1.24 * (length - 15) ** (1.0 / 3) - 1.8, 0.5)


# --------------------------------------------------------------------------------------------------
# Initial alignments


def threading_maps(l1: int, l2: int, frag: np.ndarray | None = None, *, on_x: bool = True,
                   min_ali: int) -> np.ndarray:
    """Gapless threadings as alignment maps (B, L2): every offset that aligns at least ``min_ali``
    residues, in ascending offset order.

    Without ``frag``: mobile residue j + k against target residue j. With ``frag`` (residue indices of
    one chain's fragment): the fragment slides along the other chain (``on_x``: the fragment is on the
    mobile chain).
    """
    if frag is None:
        frag, on_x = np.arange(l1), True
    lf = len(frag)
    if on_x:
        ks = np.arange(-l2 + min_ali, lf - min_ali + 1)
        pos = np.arange(l2)[None, :] + ks[:, None]
        ok = (pos >= 0) & (pos < lf)
        return np.where(ok, frag[np.clip(pos, 0, lf - 1)], -1)
    ks = np.arange(-lf + min_ali, l1 - min_ali + 1)
    maps = np.full((len(ks), l2), -1, dtype=np.int64)
    pos = np.arange(lf)[None, :] + ks[:, None]
    ok = (pos >= 0) & (pos < l1)
    rows, cols = np.nonzero(ok)
    maps[rows, frag[cols]] = pos[rows, cols]
    return maps


def best_last(scores: np.ndarray) -> int:
    """Index of the last maximum: the reference code keeps a candidate whose score is >= the best."""
    return int(len(scores) - 1 - np.argmax(scores[::-1]))


def initial_threading(x, y, p: SearchParameters) -> np.ndarray:
    """Gapless threading: the offset with the best quick score (min aligned: max(min(L1,L2)/2, 5))."""
    min_ali = max(min(len(x), len(y)) // 2, 5)
    maps = threading_maps(len(x), len(y), min_ali=min_ali)
    return maps[best_last(fast_scores(x, y, maps, d0=p.d0, d0_search=p.d0_search))]


def initial_ss(sec_x: str, sec_y: str) -> np.ndarray:
    """Secondary structure alignment: DP on equal-letter scores with gap opening -1."""
    return nw_align(ss_scores_matrix(sec_x, sec_y)[None], -1.0)[0]


def initial_local(x, y, p: SearchParameters, *, dp=None, jump_factor: int = 1) -> np.ndarray | None:
    """Local fragment superposition: for fragment pairs (lengths min(20, L/3) and min(100, L/2), L =
    min(L1, L2); starts every 15-45 residues by chain length, times ``jump_factor``), superpose the
    fragments, align by DP on 1 / (1 + d^2 / (d0 + 1.5)^2) with no gap penalty, and keep the alignment
    with the best quick score (the first on ties; None when no score beats 0). ``dp(scores (C, L1, L2),
    gap) -> y2x (C, L2)``: the DP (default :func:`nw_align`; the complex mode's masked one)."""
    dp = nw_align if dp is None else dp
    l1, l2 = len(x), len(y)
    jump1, jump2 = _jump(l1) * jump_factor, _jump(l2) * jump_factor
    al = min(l1, l2)
    cands = []
    for nf in (min(20, al // 3), min(100, al // 2)):
        for i in range(0, l1 - nf + 1, jump1):
            for j in range(0, l2 - nf + 1, jump2):
                cands.append((nf, i, j))
    d01 = p.d0 + 1.5
    best_map, best = None, 0.0
    per = (l1 + 1) * (l2 + 1) * 2 + (l1 + 1) * (l1 + l2 + 1) + l1 * l2 * 48
    step = max(1, DP_BATCH_BYTES // per)
    for c0 in range(0, len(cands), step):
        part = cands[c0:c0 + step]
        rot, trans = _fragment_fits(x, y, part)
        maps = dp(tm_scores_matrix(x, y, rot, trans, d01), 0.0)
        sc = fast_scores(x, y, maps, d0=p.d0, d0_search=p.d0_search)
        k = int(np.argmax(sc))  # first strict maximum
        if sc[k] > best:
            best, best_map = float(sc[k]), maps[k]
    return best_map


def _jump(length: int) -> int:
    j = 45 if length > 250 else 35 if length > 200 else 25 if length > 150 else 15
    return min(j, length // 3)


def _fragment_fits(x, y, part):
    """Superpositions of each (length, mobile start, target start) fragment pair, batched by length."""
    rot = np.empty((len(part), 3, 3))
    trans = np.empty((len(part), 3))
    lengths = np.array([c[0] for c in part])
    for nf in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == nf)
        xs = np.stack([x[part[r][1]:part[r][1] + nf] for r in rows])
        ys = np.stack([y[part[r][2]:part[r][2] + nf] for r in rows])
        rot[rows], trans[rows], _ = superpose(xs, ys)
    return rot, trans


def initial_ss_plus(x, y, sec_x: str, sec_y: str, y2x_best: np.ndarray, p: SearchParameters) -> np.ndarray:
    """Superposition of the best alignment so far plus secondary structure: DP on
    1 / (1 + d^2 / (d0 + 1.5)^2) + 0.5 where the letters agree, gap opening -1."""
    rot, trans = _fit_map(x, y, y2x_best)
    score = tm_scores_matrix(x, y, rot[None], trans[None], p.d0 + 1.5)[0]
    score = score + 0.5 * ss_scores_matrix(sec_x, sec_y)
    return nw_align(score[None], -1.0)[0]


def _fit_map(x, y, y2x):
    j = np.flatnonzero(y2x >= 0)
    r, t, _ = superpose(np.asarray(x)[y2x[j]][None], np.asarray(y)[j][None])
    return r[0], t[0]


def max_fragment(ca, dcu0: float) -> tuple[int, int]:
    """Start and end (inclusive) of the longest run of consecutive residues with CA-CA < dcu0, the
    cutoff raised by factors of 1.1 until the run has at least min(L / 3, 4) residues."""
    x = np.asarray(ca, dtype=np.float64)
    n = len(x)
    r_min = min(int(n / 3.0), 4)
    step2 = np.sum(np.diff(x, axis=0) ** 2, axis=1)
    cut2, inc = dcu0 * dcu0, 0
    while True:
        best, start_max, end_max = 0, 0, 0
        run, start = 1, 0
        for i in range(1, n):
            if step2[i - 1] < cut2:
                run += 1
                if i == n - 1:
                    if run > best:
                        best, start_max, end_max = run, start, i
                    run = 1
            else:
                if run > best:
                    best, start_max, end_max = run, start, i - 1
                run, start = 1, i
        if best >= r_min:
            return start_max, end_max
        inc += 1
        cut2 = (1.1**inc * dcu0) ** 2


def initial_fragment_threading(x, y, p: SearchParameters, *, mobile_stride: int = 1) -> np.ndarray:
    """Fragment gapless threading: the longest continuous fragment of the chain whose fragment is
    shorter (trimmed to its 10-89% part when it is the whole shorter chain) slides along the other
    chain; best quick score, the last on ties. Equal fragment and chain lengths try both chains.
    ``mobile_stride``: every so many offsets when the mobile chain's fragment slides (US-align's
    ``-fast``: 3)."""
    l1, l2 = len(x), len(y)
    xs, xe = max_fragment(x, p.dcu0)
    ys, ye = max_fragment(y, p.dcu0)
    lx, ly = xe - xs + 1, ye - ys + 1
    cands = []
    if lx == ly and l1 == l2:
        cands.append(_fragment_maps(l1, l2, np.arange(xs, xs + lx), True, l1))
        cands.append(_fragment_maps(l1, l2, np.arange(ys, ys + ly), False, l1))
    else:
        on_x = lx < ly or (lx == ly and l1 < l2)
        frag = np.arange(xs, xs + min(lx, ly)) if on_x else np.arange(ys, ys + min(lx, ly))
        cands.append(_fragment_maps(l1, l2, frag, on_x, min(l1, l2))[::mobile_stride if on_x else 1])
    maps = np.concatenate(cands)
    return maps[best_last(fast_scores(x, y, maps, d0=p.d0, d0_search=p.d0_search))]


def _fragment_maps(l1: int, l2: int, frag: np.ndarray, on_x: bool, l0: int) -> np.ndarray:
    if len(frag) == l0:
        frag = frag[int(l0 * 0.1):int(l0 * 0.89) + 1]
    min_ali = max(int(min(len(frag), l2 if on_x else l1) / 2.5), 3)
    return threading_maps(l1, l2, frag, on_x=on_x, min_ali=min_ali)


# --------------------------------------------------------------------------------------------------
# Refinement and the final scores


def pairs_of(x, y, y2x):
    """The aligned pairs of a map: (mobile coords, target coords, mobile index, target index)."""
    j = np.flatnonzero(y2x >= 0)
    i = y2x[j]
    return np.asarray(x)[i], np.asarray(y)[j], i, j


def detailed_search(x, y, y2x, p: SearchParameters, step: int = 40):
    """TM-score search (seeds every ``step``, pairs beyond score_d8 count nothing) on an alignment."""
    xa, ya, _, _ = pairs_of(x, y, y2x)
    return tm_search(xa, ya, d0=p.d0, d0_search=p.d0_search, norm=p.l_norm, step=step, score_d8=p.score_d8)


def refine(x, y, rot, trans, p: SearchParameters, gaps=(-0.6, 0.0), max_iter: int = 30, *, dp=None):
    """Iterative refinement: DP on 1 / (1 + d^2 / d0^2) under the current superposition, then a TM-score
    search on the new alignment gives the next superposition; for each gap-opening penalty in turn,
    until the score changes by less than 1e-6 or ``max_iter`` rounds. Returns the best score, its
    alignment and the last superposition. ``dp`` as :func:`initial_local`'s."""
    dp = nw_align if dp is None else dp
    best, best_map = -1.0, None
    old = 0.0
    for gap in gaps:
        for it in range(max_iter):
            y2x = dp(tm_scores_matrix(x, y, rot[None], trans[None], p.d0), gap)[0]
            score, rot, trans = detailed_search(x, y, y2x, p)
            if score > best + _fast._TIE:  # an equal score is a tie: the first alignment stays, as TM-align
                best, best_map = score, y2x
            if it > 0 and abs(old - score) < 1e-6:
                break
            old = score
    return best, best_map, rot, trans


class PairAlignment(NamedTuple):
    """One pair's TM-align result (see :class:`protgpu.align.TMAlignResult` for the fields)."""

    tm_mobile: float
    tm_target: float
    tm: float
    rmsd: float
    n_aligned: int
    seq_identity: float
    rotation: np.ndarray
    translation: np.ndarray
    aligned: np.ndarray
    mobile_aligned: str
    target_aligned: str
    match: str


def align_maps(x, y, sec_x: str, sec_y: str, p: SearchParameters, *, skip: tuple = ()) -> np.ndarray:
    """TM-align's alignment of the pair: every initial alignment, each refined, the best kept.

    ``skip``: stages (1-5, in the order below) left out, with their refinement - not TM-align, an
    experiment's knob (``benchmarks/align_shortcuts.py``: what leaving stages out costs in accuracy)."""
    if _fast.enabled() and not skip:  # the same stages as one compiled call (docs/design/cpu-speed.md)
        return _fast.align_maps(x, y, sec_x, sec_y, p)
    tm_max, best = -1.0, np.full(len(y), -1, dtype=np.int64)

    def keep(score, y2x):
        nonlocal tm_max, best
        if score > tm_max + _fast._TIE:
            tm_max, best = score, y2x

    ddcc = 0.1 if p.l_norm <= 40 else 0.4
    # 1. gapless threading
    if 1 not in skip:
        y2x = initial_threading(x, y, p)
        score, rot, trans = detailed_search(x, y, y2x, p)
        keep(score, y2x)
        score, y2x, rot, trans = refine(x, y, rot, trans, p)
        keep(score, y2x)
    # 2. secondary structure
    if 2 not in skip:
        y2x = initial_ss(sec_x, sec_y)
        score, rot, trans = detailed_search(x, y, y2x, p)
        keep(score, y2x)
        if score > tm_max * 0.2:
            score, y2x, rot, trans = refine(x, y, rot, trans, p)
            keep(score, y2x)
    # 3. local fragment superposition
    y2x = initial_local(x, y, p) if 3 not in skip else None
    if y2x is not None:
        score, rot, trans = detailed_search(x, y, y2x, p)
        keep(score, y2x)
        if score > tm_max * ddcc:
            score, y2x, rot, trans = refine(x, y, rot, trans, p, max_iter=2)
            keep(score, y2x)
    # 4. superposition of the best so far plus secondary structure
    if 4 not in skip:
        y2x = initial_ss_plus(x, y, sec_x, sec_y, best, p)
        score, rot, trans = detailed_search(x, y, y2x, p)
        keep(score, y2x)
        if score > tm_max * ddcc:
            score, y2x, rot, trans = refine(x, y, rot, trans, p)
            keep(score, y2x)
    # 5. fragment gapless threading
    if 5 not in skip:
        y2x = initial_fragment_threading(x, y, p)
        score, rot, trans = detailed_search(x, y, y2x, p)
        keep(score, y2x)
        if score > tm_max * ddcc:
            score, y2x, rot, trans = refine(x, y, rot, trans, p, gaps=(0.0,), max_iter=2)
            keep(score, y2x)
    return best


def final_search(xa, ya, length: float):
    """The TM-score search of the final scores: every seed (step 1), d0 of ``length``
    (:func:`d0_final`), normalised by ``length``; (score, rotation, translation)."""
    d0 = d0_final(length)
    return tm_search(xa, ya, d0=d0, d0_search=min(max(d0, 4.5), 8.0), norm=length, step=1)


def tm_align_pair(x, y, seq_x: str, seq_y: str, *, l_norm: float | None = None, skip: tuple = ()) -> PairAlignment:
    """TM-align one pair: mobile CA ``x`` (L1, 3) onto target CA ``y`` (L2, 3).

    ``l_norm``: an extra normalisation length for :attr:`PairAlignment.tm` (None: the target's, as
    TM-align reports first); its superposition is the returned one. ``skip``: :func:`align_maps`'
    experiment's knob (empty: TM-align).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    l1, l2 = len(x), len(y)
    p = search_parameters(l1, l2)
    with blas_threads(1):
        y2x = align_maps(x, y, secondary_structure(x), secondary_structure(y), p, skip=skip)
        # final superposition of the alignment: a full search (every seed), scores over L_ali
        xa, ya, ia, ja = pairs_of(x, y, y2x)
        _, rot, trans = tm_search(xa, ya, d0=p.d0, d0_search=p.d0_search, norm=len(xa), step=1,
                                  score_d8=p.score_d8)
        d = np.sqrt(np.sum((xa @ rot.T + trans - ya) ** 2, axis=1))
        keep = d <= p.score_d8
        xa, ya, ia, ja = xa[keep], ya[keep], ia[keep], ja[keep]
        n_ali = len(xa)
        rmsd = float(superpose(xa[None], ya[None])[2][0]) if n_ali else float("nan")

        tm_t, rot_t, tr_t = final_search(xa, ya, float(l2))
        tm_m, rot_m, tr_m = final_search(xa, ya, float(l1))
        if l_norm is None or l_norm == l2:
            tm, rot, trans = tm_t, rot_t, tr_t
        elif l_norm == l1:
            tm, rot, trans = tm_m, rot_m, tr_m
        else:
            tm, rot, trans = final_search(xa, ya, float(l_norm))
    close = np.sqrt(np.sum((xa @ rot.T + trans - ya) ** 2, axis=1)) < CLOSE_PAIR
    top, mid, bottom, same = _gapped(seq_x, seq_y, ia, ja, close)
    return PairAlignment(tm_m, tm_t, tm, rmsd, n_ali, same / n_ali if n_ali else float("nan"), rot, trans,
                         np.stack([ia, ja], axis=1).astype(np.int64), top, bottom, mid)


def _gapped(seq_x: str, seq_y: str, ia, ja, close):
    """TM-align's printed alignment: gapped mobile sequence, match line (``:`` closer than 5 A, ``.``
    other aligned pairs), gapped target sequence; and the count of identical aligned letters."""
    top, mid, bottom = [], [], []
    io = jo = same = 0
    for i, j, c in zip(ia.tolist(), ja.tolist(), close.tolist(), strict=True):
        top.append(seq_x[io:i] + "-" * (j - jo))
        bottom.append("-" * (i - io) + seq_y[jo:j])
        mid.append(" " * (i - io + j - jo))
        top.append(seq_x[i])
        bottom.append(seq_y[j])
        mid.append(":" if c else ".")
        same += seq_x[i] == seq_y[j]
        io, jo = i + 1, j + 1
    top.append(seq_x[io:] + "-" * (len(seq_y) - jo))
    bottom.append("-" * (len(seq_x) - io) + seq_y[jo:])
    mid.append(" " * (len(seq_x) - io + len(seq_y) - jo))
    return "".join(top), "".join(mid), "".join(bottom), same


def _gapped_many(codes, x_start, x_len, y_start, y_len, counts, ia, ja, close):
    """:func:`_gapped` of many pairs at once, as whole-array operations (the GPU path's unpacking).

    ``_gapped`` lays out each pair as its mobile sequence with runs of ``-`` inserted (before aligned
    mobile residue i_k, one for each target residue skipped since the last aligned pair; after the
    last letter, one for each target residue after the last aligned pair), its target sequence
    likewise, and the match line with ``:`` or ``.`` in the aligned columns. So a letter's column is
    its index plus the dashes inserted up to it: a cumulative sum over all pairs' letters laid end to
    end, each pair's lines closed by a NUL so that one ``split`` cuts them apart.

    Parameters
    ----------
    codes : uint8, shape (N,)
        ASCII letters of every sequence, concatenated (no NUL among them).
    x_start, x_len, y_start, y_len : int, shape (P,)
        Where each pair's mobile and target sequences lie in ``codes`` and their lengths (L1, L2).
    counts : int, shape (P,)
        Aligned pairs of each pair.
    ia, ja : int, shape (sum(counts),)
        Mobile and target residue of every aligned pair, pair after pair; within a pair both strictly
        increasing, ``0 <= ia < L1`` and ``0 <= ja < L2`` (what ``_gapped`` is given by the aligners;
        the caller checks it).
    close : bool, shape (sum(counts),)
        ``:`` (True) or ``.`` in the match line.

    Returns
    -------
    top, mid, bottom : list of str, length P
        Each pair's ``_gapped`` strings, equal to them byte for byte.
    same : int64, shape (P,)
        Identical aligned letters per pair.
    """
    n_letters = int(np.sum(x_len)) + int(np.sum(y_len))
    # int32 indices where they fit (half the memory traffic of int64: this is memory-bound)
    it = np.int32 if len(codes) + 2 * n_letters + len(counts) < 2**31 - 1 else np.int64
    x_start, x_len, y_start, y_len, counts = (np.asarray(v).astype(it).reshape(-1) for v in
                                              (x_start, x_len, y_start, y_len, counts))
    ia = np.asarray(ia).astype(it)
    ja = np.asarray(ja).astype(it)
    n_pairs = len(counts)
    p_a = np.repeat(np.arange(n_pairs, dtype=it), counts)
    ali_end = np.cumsum(counts, dtype=it)
    has = counts > 0
    first = (ali_end - counts)[has]
    i_prev = np.empty_like(ia)  # the aligned pair before, -1 at a pair's first
    j_prev = np.empty_like(ja)
    i_prev[1:], j_prev[1:] = ia[:-1], ja[:-1]
    i_prev[first] = -1
    j_prev[first] = -1
    i_last = np.where(has, np.concatenate([ia, np.array([-1], it)])[ali_end - 1], -1).astype(it)
    j_last = np.where(has, np.concatenate([ja, np.array([-1], it)])[ali_end - 1], -1).astype(it)
    x_off = np.cumsum(x_len, dtype=it) - x_len  # the pairs' letters end to end
    y_off = np.cumsum(y_len, dtype=it) - y_len
    s1, s2 = int(x_len.sum()), int(y_len.sum())
    total = s1 + s2 - len(ia) + n_pairs  # columns, with one NUL a pair
    ramp = np.arange(max(s1, s2), dtype=it)
    # mobile line: dashes before each aligned mobile residue; after the pair's letters, the rest and the NUL
    col_x = _columns(ramp[:s1], np.concatenate([np.repeat(x_off, counts) + ia, x_off + x_len]),
                     np.concatenate([ja - j_prev - 1, y_len - j_last]))
    top = np.full(total, ord("-"), dtype=np.uint8)
    top[col_x] = np.take(codes, ramp[:s1] + np.repeat(x_start - x_off, x_len))
    # target line: dashes after each aligned target residue (before the unaligned ones that follow)
    col_y = _columns(ramp[:s2],
                     np.concatenate([np.repeat(y_off, counts) + j_prev + 1, y_off + j_last + 1, y_off + y_len]),
                     np.concatenate([ia - i_prev - 1, x_len - i_last - 1, np.ones(n_pairs, dtype=it)]))
    bottom = np.full(total, ord("-"), dtype=np.uint8)
    bottom[col_y] = np.take(codes, ramp[:s2] + np.repeat(y_start - y_off, y_len))
    mid = np.full(total, ord(" "), dtype=np.uint8)
    mid[np.take(col_x, np.repeat(x_off, counts) + ia)] = np.where(np.asarray(close, dtype=bool), ord(":"), ord("."))
    ends = np.cumsum(x_len + y_len - counts + 1, dtype=np.int64) - 1
    eq = np.take(codes, np.repeat(x_start, counts) + ia) == np.take(codes, np.repeat(y_start, counts) + ja)
    same = np.bincount(p_a, weights=eq, minlength=n_pairs).astype(np.int64)
    out = []
    for line in (top, mid, bottom):
        line[ends] = 0
        out.append(line.tobytes().decode("ascii").split("\x00")[:n_pairs])
    return out[0], out[1], out[2], same


def _columns(ramp, at, dashes) -> np.ndarray:
    """Columns of n letters laid end to end (``ramp`` = arange(n)) with ``dashes[k]`` columns inserted
    before letter ``at[k]`` (``at`` may repeat, and be n: after the last letter)."""
    n = len(ramp)
    ins = np.zeros(n + 1, dtype=ramp.dtype)
    np.add.at(ins, at, dashes)
    np.cumsum(ins, out=ins)
    ins[:n] += ramp
    return ins[:n]
