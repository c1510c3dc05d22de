"""The fast CPU path of TM-align: numba-compiled loops, one pair per call (:func:`align_maps` runs all
its stages without returning to Python), and its DP, quick score and TM-score search on their own.

Optional, like :mod:`protgpu.scoring._fast` (whose switch, compile-on-first-use pattern and scalar QCP
fit this module reuses): without numba, or with ``PROTGPU_NUMBA=0``, the NumPy twins in
:mod:`protgpu.align.numpy_twin`, ``_dp`` and ``_search`` run, and they stay the specification. The DP
gives the twin's bits (same sums, same ties); the fits add their sums in another order than BLAS's, so
scores agree to ~1e-15 and the alignments are the twin's. Why and how: ``docs/design/cpu-speed.md``.
"""

from __future__ import annotations

import math

import numpy as np

from ..scoring import _fast as _sf


def enabled() -> bool:
    """Whether the compiled paths may be used: the scoring fast path's switch (numba importable, not
    turned off by ``PROTGPU_NUMBA=0`` or ``protgpu.scoring._fast.ENABLED``)."""
    return _sf.enabled()


# this module's loops, compiled after the scoring loops they call (the fits, the score sums)
_LOOPS = _sf.Loops(globals(), after=_sf._compile)
_jit, _jit_sum, _compile = _LOOPS.jit, _LOOPS.jit_sum, _LOOPS.compile


_DIAG, _LEFT, _UP = 0, 1, 2  # _dp's traceback moves
_MAX_ROUNDS = 20  # _search.MAX_ROUNDS (a compile-time constant here; a test checks they agree)
# How much a refinement round's or a stage's score must beat the best so far to replace its alignment.
# Alignments that differ only in pairs beyond score_d8 score exactly the same (those pairs add nothing
# and are never fitted); TM-align's in-order sums give them equal bits and its strict > keeps the
# first; the twin's sums happen to as well, but this path's reordered sums (and centring over every
# pair) leave them an ulp apart, and a later equal alignment would win (docs/design/tm-align.md, ties).
_TIE = 1e-12
# Where the DP's cell scores come from: a given matrix, or computed on the fly from a superposition
# (1 / (1 + d^2 / d0^2)), from secondary structure (1 for equal letters), or both (+0.5 for equal).
_MATRIX, _TM, _SS, _TM_SS = 0, 1, 2, 3


@_jit
def _dp_work(l1, l2):
    """Work arrays of _nw for chains of l1 and l2 residues: the superposed mobile chain and the target
    reversed (rows x, y, z), the target's letters reversed, three diagonals of values and two of
    gap costs, one diagonal of scores, and the moves by (diagonal, mobile residue)."""
    return (np.empty((3, l1)), np.empty((3, l2)), np.empty(l2, np.uint8), np.zeros((5, l1 + 1)),
            np.empty(l1 + 1), np.empty((l1 + l2 + 1, l1 + 1), np.int8))


@_jit
def _diag_tm(x0, x1, x2, y0, y1, y2, bx, by, bs, n, d0sq, sd):
    """One diagonal's _dp.tm_scores_matrix cells: d^2 summed x, y, z, then 1 / (1 + d^2 / d0sq)."""
    for t in range(n):
        e0 = x0[bx + t] - y0[by + t]
        e1 = x1[bx + t] - y1[by + t]
        e2 = x2[bx + t] - y2[by + t]
        sd[bs + t] = 1.0 / (1.0 + (e0 * e0 + e1 * e1 + e2 * e2) / d0sq)


@_jit
def _diag_ss(secx, sr, bx, by, bs, n, add, w, sd):
    """One diagonal's ss_scores_matrix cells: ``w`` for equal letters, else 0; added to sd if ``add``."""
    for t in range(n):
        e = w if secx[bx + t] == sr[by + t] else 0.0
        sd[bs + t] = sd[bs + t] + e if add else e


@_jit
def _diag_step(v2, v1, a1, v0, a0, sd, mk, bx, bs, n, gap):
    """One diagonal of _dp.nw_align: values v2 (diagonal k - 2), v1 and gap costs a1 (k - 1) give v0,
    a0 and the moves mk of diagonal k, with the twin's sums and tie rules."""
    for t in range(n):
        d = v2[bx + t] + sd[bs + t]
        h = v1[bx + t] + a1[bx + t]  # from (i - 1, j)
        v = v1[bs + t] + a1[bs + t]  # from (i, j - 1)
        dg = (d >= h) & (d >= v)
        lf = v >= h
        v0[bs + t] = d if dg else (v if lf else h)
        a0[bs + t] = gap if dg else 0.0
        mk[bs + t] = _DIAG if dg else (_LEFT if lf else _UP)


@_jit
def _nw(mode, x, y, rot, trans, d0sq, secx, secy, smat, gap, work, j2i):
    """_dp.nw_align of one problem over anti-diagonals (cells i + j = k are independent, so each
    diagonal is one vectorised loop), its scores made on the fly: ``mode`` _MATRIX reads ``smat``
    (L1, L2); _TM, _SS, _TM_SS compute _dp.tm_scores_matrix's 1 / (1 + d^2 / d0sq) under (rot,
    trans) and / or ss_scores_matrix's letters in the twin's operation order. Each cell takes the
    twin's sums and tie rules, so the alignment ``j2i`` (L2,) is the twin's.

    Loop indices are unsigned so that numba drops its negative-index checks (which stop
    vectorisation)."""
    xt, yr, sr, val, sd, mv = work
    l1, l2 = mv.shape[1] - 1, sr.shape[0]
    u = np.uint64
    if mode == _TM or mode == _TM_SS:
        for i in range(l1):  # the transform summed u_k0 x_0 + u_k1 x_1 + u_k2 x_2, then + t_k
            a0, a1, a2 = x[i, 0], x[i, 1], x[i, 2]
            for k in range(3):
                xt[k, i] = (rot[k, 0] * a0 + rot[k, 1] * a1 + rot[k, 2] * a2) + trans[k]
        for m in range(l2):  # cell (i, k - i) reads target residue k - i - 1: reversed, it runs forward
            for k in range(3):
                yr[k, m] = y[l2 - 1 - m, k]
    if mode == _SS or mode == _TM_SS:
        for m in range(l2):
            sr[m] = secy[l2 - 1 - m]
    val[:, :] = 0.0
    x0, x1, x2, y0, y1, y2 = xt[0], xt[1], xt[2], yr[0], yr[1], yr[2]
    v2, v1, v0, a1, a0 = val[0], val[1], val[2], val[3], val[4]
    for k in range(2, l1 + l2 + 1):
        lo, hi = max(1, k - l2), min(l1, k - 1)
        n = u(hi - lo + 1)
        bx, by, bs = u(lo - 1), u(l2 - k + lo), u(lo)
        if k <= l2:  # boundary cells (0, k) and (k, 0): value 0, not from the diagonal
            v0[0] = 0.0
            a0[0] = 0.0
        if k <= l1:
            v0[k] = 0.0
            a0[k] = 0.0
        if mode == _MATRIX:
            for t in range(hi - lo + 1):
                i = lo + t
                sd[lo + t] = smat[i - 1, k - i - 1]
        elif mode == _SS:
            _diag_ss(secx, sr, bx, by, bs, n, np.bool_(False), 1.0, sd)
        else:
            _diag_tm(x0, x1, x2, y0, y1, y2, bx, by, bs, n, d0sq, sd)
            if mode == _TM_SS:
                _diag_ss(secx, sr, bx, by, bs, n, np.bool_(True), 0.5, sd)
        _diag_step(v2, v1, a1, v0, a0, sd, mv[k], bx, bs, n, gap)
        v2, v1, v0 = v1, v0, v2
        a1, a0 = a0, a1
    for j in range(l2):
        j2i[j] = -1
    i, j = l1, l2
    while i > 0 and j > 0:
        m = mv[i + j, i]
        if m == _DIAG:
            j2i[j - 1] = i - 1
        if m != _LEFT:
            i -= 1
        if m != _UP:
            j -= 1


@_jit
def _nw_all(s, gap, j2i):
    """_dp.nw_align for each problem b of the score matrices s (B, L1, L2)."""
    b_n, l1, l2 = s.shape
    work = _dp_work(l1, l2)
    pts = np.zeros((0, 3))  # no coordinates or letters: the scores are given
    sec = np.zeros(0, np.uint8)
    eye, zero = np.eye(3), np.zeros(3)
    for b in range(b_n):
        _nw(np.int64(_MATRIX), pts, pts, eye, zero, 1.0, sec, sec, s[b], gap[b], work, j2i[b])


def nw_align(score, gap_open) -> np.ndarray:
    """:func:`protgpu.align._dp.nw_align`, compiled (same arguments, equal result)."""
    _compile()
    s = np.ascontiguousarray(score, dtype=np.float64)
    gap = np.ascontiguousarray(np.broadcast_to(np.asarray(gap_open, dtype=np.float64), (s.shape[0],)))
    j2i = np.full((s.shape[0], s.shape[2]), -1, dtype=np.int64)
    _nw_all(s, gap, j2i)
    return j2i


@_jit
def _tm_matrix(x, y, rot, trans, d0sq, out):
    """_dp.tm_scores_matrix: transform summed u_k0 x_0 + u_k1 x_1 + u_k2 x_2 + t_k, then d^2 x, y, z."""
    for b in range(rot.shape[0]):
        for i in range(x.shape[0]):
            a0, a1, a2 = x[i, 0], x[i, 1], x[i, 2]
            t0 = (rot[b, 0, 0] * a0 + rot[b, 0, 1] * a1 + rot[b, 0, 2] * a2) + trans[b, 0]
            t1 = (rot[b, 1, 0] * a0 + rot[b, 1, 1] * a1 + rot[b, 1, 2] * a2) + trans[b, 1]
            t2 = (rot[b, 2, 0] * a0 + rot[b, 2, 1] * a1 + rot[b, 2, 2] * a2) + trans[b, 2]
            for j in range(y.shape[0]):
                e0 = t0 - y[j, 0]
                e1 = t1 - y[j, 1]
                e2 = t2 - y[j, 2]
                out[b, i, j] = 1.0 / (1.0 + (e0 * e0 + e1 * e1 + e2 * e2) / d0sq)


def tm_scores_matrix(x, y, rot, trans, d0: float) -> np.ndarray:
    """:func:`protgpu.align._dp.tm_scores_matrix`, compiled (equal result)."""
    _compile()
    x = np.ascontiguousarray(x, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    rot = np.ascontiguousarray(rot, dtype=np.float64)
    trans = np.ascontiguousarray(trans, dtype=np.float64)
    out = np.empty((len(rot), len(x), len(y)))
    _tm_matrix(x, y, rot, trans, float(d0) * float(d0), out)
    return out


@_jit
def _fit_scratch():
    """Work arrays of scoring._fast._fit_subset: rotation, translation, QCP scratch."""
    return np.empty((3, 3)), np.empty(3), np.empty(10), np.empty(4), np.empty((4, 4)), np.empty(15)


@_jit_sum
def _score_d8(d2, d0sq, d8sq, norm):
    """Sum of 1 / (1 + d^2 / d0sq) over the pairs with d^2 <= d8sq (all when d8sq < 0), over norm.
    Without branches in the loops (a pair past the cutoff adds 0.0), so that they vectorise."""
    s = 0.0
    if d8sq < 0.0:
        for p in range(d2.shape[0]):
            s += 1.0 / (1.0 + d2[p] / d0sq)
    else:
        for p in range(d2.shape[0]):
            v = d2[p]
            w = 1.0 / (1.0 + v / d0sq)
            s += w if v <= d8sq else 0.0
    return s / norm


@_jit
def _store(rot, trans, out_rt):
    for i in range(3):
        for j in range(3):
            out_rt[3 * i + j] = rot[i, j]
        out_rt[9 + i] = trans[i]


@_jit
def _settled(new, cur):
    """Whether the kept set ``new`` equals ``cur``; ``cur`` becomes ``new``."""
    same = True
    for p in range(cur.shape[0]):
        same &= new[p] == cur[p]
        cur[p] = new[p]
    return same


_EXPLORED = 1 << 40  # a memo entry whose rounds settled: explored for any number of rounds


@_jit
def _pack(sel, words):
    """The kept set as bits in ``words``; returns their hash (FNV-1a over the words)."""
    words[:] = 0
    for p in range(sel.shape[0]):
        words[p >> 6] |= np.uint64(sel[p]) << np.uint64(p & 63)
    h = np.uint64(14695981039346656037)
    for w in range(words.shape[0]):
        h = (h ^ words[w]) * np.uint64(1099511628211)
    return h


@_jit
def _memo_find(words, h, keys, hashes, table):
    """Index of the stored set equal to ``words`` (-1 if none) and the table slot where it is or would
    go (open addressing, linear probing)."""
    mask = np.uint64(table.shape[0] - 1)
    slot = h & mask
    while True:
        e = table[slot]
        if e < 0:
            return -1, slot
        if hashes[e] == h:
            same = True
            for w in range(words.shape[0]):
                if keys[e, w] != words[w]:
                    same = False
                    break
            if same:
                return e, slot
        slot = (slot + np.uint64(1)) & mask


@_jit
def _search(x, y, seeds, d0, d0_search, norm, d8, out_rt, memo):
    """_search.tm_search's seeds and rounds on centred (3, n) rows; returns the best score, its
    superposition (of the centred sets) in out_rt[:9], out_rt[9:]. A new score is kept only when
    strictly higher, in seed then round order: the twin's choice. ``d8`` < 0: no score_d8 cutoff.

    A round's fit, score and next kept set depend on its kept set only. With ``memo``, every kept set
    that started a round is remembered with the number of rounds explored from it (all, once its
    rounds settled); a seed that reaches a set already explored as far as this seed may go stops
    there: its remaining rounds would repeat scores that were compared already, and a repeated score
    is never strictly higher than the best. The result is the same bits either way (a test checks)."""
    n = x.shape[1]
    max_rounds = _MAX_ROUNDS
    d0sq = d0 * d0
    d8sq = d8 * d8 if d8 >= 0.0 else -1.0
    best = -np.inf
    rot, trans, kbuf, q, rows, wk = _fit_scratch()
    d2 = np.empty(n)
    cur = np.empty(n, dtype=np.bool_)
    new = np.empty(n, dtype=np.bool_)
    n_words = (n + 63) >> 6
    cap = seeds.shape[0] * max_rounds + 1 if memo else 1
    keys = np.empty((cap, n_words), np.uint64)
    hashes = np.empty(cap, np.uint64)
    explored = np.empty(cap, np.int64)
    size = 1
    while size < 2 * cap:
        size *= 2
    table = np.full(size if memo else 1, -1, np.int64)
    words = np.empty(n_words, np.uint64)
    path = np.empty(max_rounds, np.int64)  # memo entries of this seed's rounds, in order
    stored = np.int64(0)
    for t in range(seeds.shape[0]):
        _sf._fit_subset(x, y, cur, seeds[t, 1], seeds[t, 0], rot, trans, kbuf, q, rows, wk)
        _sf._dist2(x, y, rot, trans, d2)
        _sf._select(d2, d0_search - 1.0, cur)
        sc = _score_d8(d2, d0sq, d8sq, norm)
        if sc > best:
            best = sc
            _store(rot, trans, out_rt)
        steps = np.int64(0)
        settled = False
        for r in range(max_rounds):
            if memo:
                h = _pack(cur, words)
                e, slot = _memo_find(words, h, keys, hashes, table)
                if e >= 0 and explored[e] >= max_rounds - r:
                    settled = explored[e] == _EXPLORED
                    break
                if e < 0:
                    e = stored
                    for w in range(n_words):
                        keys[e, w] = words[w]
                    hashes[e] = h
                    explored[e] = -1
                    table[slot] = e
                    stored += 1
                path[steps] = e
                steps += 1
            _sf._fit_subset(x, y, cur, 0, -1, rot, trans, kbuf, q, rows, wk)
            _sf._dist2(x, y, rot, trans, d2)
            _sf._select(d2, d0_search + 1.0, new)
            sc = _score_d8(d2, d0sq, d8sq, norm)
            if sc > best:
                best = sc
                _store(rot, trans, out_rt)
            if _settled(new, cur):
                settled = True
                break
        for s in range(steps):  # the seed's r-th set was explored for max_rounds - r rounds, or all
            e = path[s]
            explored[e] = max(explored[e], _EXPLORED if settled else max_rounds - s)
    return best


def tm_search(x, y, *, d0: float, d0_search: float, norm: float, step: int = 1, score_d8: float | None = None):
    """:func:`protgpu.align._search.tm_search`, compiled (same arguments and result, scores to ~1e-15)."""
    _compile()
    n = len(x)
    if n == 0:
        return -1.0, np.eye(3), np.zeros(3)
    rot, trans = np.empty((3, 3)), np.empty(3)
    score = _search_rows(np.array(np.asarray(x, dtype=np.float64).T, order="C"),
                         np.array(np.asarray(y, dtype=np.float64).T, order="C"), int(step), float(d0),
                         float(d0_search), float(norm), -1.0 if score_d8 is None else float(score_d8),
                         np.empty((6 * n + 12, 2), np.int64), np.empty(12), rot, trans)
    return float(score), rot, trans


@_jit
def _relaxed_cut(d2, n, cut2):
    """_search._relaxed_cut for one candidate's n pairs (all valid)."""
    cnt = 0
    for p in range(n):
        cnt += d2[p] <= cut2
    if cnt >= 3 or n <= 3:
        return cut2
    m0 = m1 = m2 = np.inf  # the third smallest d^2
    for p in range(n):
        v = d2[p]
        if v < m0:
            m0, m1, m2 = v, m0, m1
        elif v < m1:
            m1, m2 = v, m1
        elif v < m2:
            m2 = v
    m = max(np.ceil((m2 - cut2) / 0.5), 0.0)
    for _ in range(3):  # the twin's settling of the closed form's rounding
        if cut2 + 0.5 * m < m2:
            m += 1.0
        if m > 0 and cut2 + 0.5 * (m - 1.0) >= m2:
            m -= 1.0
    return cut2 + 0.5 * m


@_jit
def _gather(x, y, m, xs, ys):
    """The aligned pairs of map ``m`` (L2,) into the rows xs, ys (3, >= n), in target order; returns n."""
    n = np.int64(0)
    for j in range(m.shape[0]):
        i = m[j]
        if i >= 0:
            for k in range(3):
                xs[k, n] = x[i, k]
                ys[k, n] = y[j, k]
            n += 1
    return n


@_jit
def _fast_work(l2):
    """Work arrays of _fast_score for targets of l2 residues: gathered pairs, d^2, kept set."""
    return np.empty((3, l2)), np.empty((3, l2)), np.empty(l2), np.empty(l2, dtype=np.bool_)


@_jit
def _fast_score(x, y, m, d0, d0_search, fw, fs):
    """_search.fast_scores of one candidate map ``m`` (L2,) on centred (L, 3) coordinates: its valid
    pairs gathered into (3, n) rows, three fits (the later two skipped when the first cutoff keeps
    every pair). ``fw``: _fast_work's arrays; ``fs``: _fit_scratch's."""
    xs, ys, d2, sel = fw
    rot, trans, kbuf, q, rows, wk = fs
    d02 = d0 * d0
    d002 = d0_search * d0_search
    n = _gather(x, y, m, xs, ys)
    # views of the (3, L2) rows: the fits' sums in the order test_align_fast's bounds were set with
    xv, yv, dv, sv = xs[:, :n], ys[:, :n], d2[:n], sel[:n]
    _sf._fit_subset(xv, yv, sv, 0, n, rot, trans, kbuf, q, rows, wk)
    _sf._dist2(xv, yv, rot, trans, dv)
    best = _score_d8(dv, d02, -1.0, 1.0)
    cut = _relaxed_cut(dv, n, d002)
    kept = 0
    for p in range(n):
        sv[p] = dv[p] <= cut
        kept += sv[p]
    if kept != n:
        _sf._fit_subset(xv, yv, sv, 0, -1, rot, trans, kbuf, q, rows, wk)
        _sf._dist2(xv, yv, rot, trans, dv)
        s1 = _score_d8(dv, d02, -1.0, 1.0)
        cut = _relaxed_cut(dv, n, d002 + 1.0)
        for p in range(n):
            sv[p] = dv[p] <= cut
        _sf._fit_subset(xv, yv, sv, 0, -1, rot, trans, kbuf, q, rows, wk)
        _sf._dist2(xv, yv, rot, trans, dv)
        s2 = _score_d8(dv, d02, -1.0, 1.0)
        best = max(max(best, s1), s2)
    return best


@_jit
def _fast_scores(x, y, maps, d0, d0_search, out):
    """_search.fast_scores of every candidate map (B, L2)."""
    fw = _fast_work(maps.shape[1])
    fs = _fit_scratch()
    for b in range(maps.shape[0]):
        out[b] = _fast_score(x, y, maps[b], d0, d0_search, fw, fs)


def fast_scores(x, y, maps, *, d0: float, d0_search: float) -> np.ndarray:
    """:func:`protgpu.align._search.fast_scores`, compiled (same arguments and result, to ~1e-15)."""
    _compile()
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    maps = np.ascontiguousarray(maps, dtype=np.int64)
    out = np.empty(len(maps))
    _fast_scores(np.ascontiguousarray(x - x.mean(axis=0)), np.ascontiguousarray(y - y.mean(axis=0)), maps,
                 float(d0), float(d0_search), out)
    return out


# --------------------------------------------------------------------------------------------------
# One pair's alignment stages (numpy_twin.align_maps) in one compiled call


@_jit
def _copy(src, dst):
    """dst[:] = src for two maps of one length (a loop: numba's checked slice copy compiles its error
    message's formatting, seconds of compile time)."""
    for j in range(src.shape[0]):
        dst[j] = src[j]


@_jit
def _seeds(n, step, out):
    """_search.seeds(n, step) written to ``out`` as (length, start) rows; returns the row count."""
    lmin = min(4, n)
    c = 0
    for i in range(6):  # scoring.tmscore.seed_lengths: n, n/2, ... (>= lmin), at most six
        length = n >> i if i < 5 else lmin
        final = length <= lmin or i == 5
        if final:
            length = lmin
        last = n - length
        for s in range(0, last, step):
            out[c, 0] = length
            out[c, 1] = s
            c += 1
        out[c, 0] = length
        out[c, 1] = last
        c += 1
        if final:
            break
    return c


@_jit
def _search_rows(xs, ys, step, d0, d0_search, norm, d8, seeds, rt, rot, trans):
    """_search.tm_search on the pairs in (3, n) rows (n > 0; centred here, in place, by their means
    as the twin centres them): returns the score; ``rot``, ``trans`` receive its superposition of the
    raw coordinates. ``d8`` < 0: no score_d8 cutoff."""
    n = xs.shape[1]
    cx = np.zeros(3)
    cy = np.zeros(3)
    for k in range(3):  # NumPy's mean over the pairs: summed in order, then divided
        for p in range(n):
            cx[k] += xs[k, p]
            cy[k] += ys[k, p]
        cx[k] /= n
        cy[k] /= n
        for p in range(n):
            xs[k, p] -= cx[k]
            ys[k, p] -= cy[k]
    ns = _seeds(n, step, seeds)
    rt[:] = 0.0
    rt[0] = rt[4] = rt[8] = 1.0
    score = _search(xs, ys, seeds[:ns], d0, d0_search, norm, d8, rt, np.bool_(True))
    for k in range(3):
        for m in range(3):
            rot[k, m] = rt[3 * k + m]
    for k in range(3):
        trans[k] = (rt[9 + k] + cy[k]) - (rot[k, 0] * cx[0] + rot[k, 1] * cx[1] + rot[k, 2] * cx[2])
    return score


@_jit
def _pair_search(x, y, y2x, d0, d0_search, norm, d8, sw, rot, trans):
    """numpy_twin.detailed_search: the TM-score search (seeds every 40, pairs beyond ``d8`` score
    nothing) on the aligned pairs of ``y2x``. Returns the score (-1 for no pair); ``rot``, ``trans``
    receive its superposition of the raw coordinates."""
    n = np.int64(0)
    for j in range(y2x.shape[0]):
        n += y2x[j] >= 0
    if n == 0:
        for k in range(3):
            for m in range(3):
                rot[k, m] = 1.0 if k == m else 0.0
            trans[k] = 0.0
        return -1.0
    xs, ys = np.empty((3, n)), np.empty((3, n))
    _gather(x, y, y2x, xs, ys)
    seeds, rt = sw
    return _search_rows(xs, ys, np.int64(40), d0, d0_search, norm, d8, seeds, rt, rot, trans)


@_jit
def _superpose_rows(xs, ys, n, rot, trans, fs):
    """scoring._kabsch.superpose of the n pairs in (3, n) rows (raw coordinates): QCP on the
    cross-covariance of the centred pairs, the translation ``cy - rot cx``."""
    _, _, kbuf, q, rows, wk = fs
    inv_n = 1.0 / n
    cx = np.zeros(3)
    cy = np.zeros(3)
    for k in range(3):
        for p in range(n):
            cx[k] += xs[k, p]
            cy[k] += ys[k, p]
        cx[k] *= inv_n
        cy[k] *= inv_n
    wk[:] = 0.0  # sums of the centred coordinates (0) and their cross products
    for a in range(3):
        for b in range(3):
            s = 0.0
            for p in range(n):
                s += (xs[a, p] - cx[a]) * (ys[b, p] - cy[b])
            wk[6 + 3 * a + b] = s
    _sf._fit_from_sums(float(n), wk[0:3], wk[3:6], wk[6:15], rot, trans, kbuf, q, rows)
    for k in range(3):
        trans[k] = cy[k] - (rot[k, 0] * cx[0] + rot[k, 1] * cx[1] + rot[k, 2] * cx[2])


@_jit
def _threading(xc, yc, f0, lf, on_x, min_ali, d0, d0_search, fw, fs, m, best_map, best):
    """numpy_twin.threading_maps of the fragment [f0, f0 + lf) (on the mobile chain if ``on_x``, else
    on the target), each offset scored by _fast_score in ascending order; the last best (>=) is kept
    in ``best_map`` and its score returned (``best`` if none reaches it)."""
    l1, l2 = xc.shape[0], yc.shape[0]
    if on_x:
        k0, k1 = -l2 + min_ali, lf - min_ali
    else:
        k0, k1 = -lf + min_ali, l1 - min_ali
    for k in range(k0, k1 + 1):
        m[:] = -1
        if on_x:
            for j in range(l2):
                if 0 <= j + k < lf:
                    m[j] = f0 + j + k
        else:
            for c in range(lf):
                if 0 <= c + k < l1:
                    m[f0 + c] = c + k
        sc = _fast_score(xc, yc, m, d0, d0_search, fw, fs)
        if sc >= best:
            best = sc
            _copy(m, best_map)
    return best


@_jit
def _max_fragment(x, dcu0):
    """numpy_twin.max_fragment: (start, end) of the longest run of CA steps below the cutoff."""
    n = x.shape[0]
    r_min = min(int(n / 3.0), 4)
    step2 = np.empty(max(n - 1, 0))
    for i in range(n - 1):
        e0, e1, e2 = x[i + 1, 0] - x[i, 0], x[i + 1, 1] - x[i, 1], x[i + 1, 2] - x[i, 2]
        step2[i] = e0 * e0 + e1 * e1 + e2 * e2
    cut2 = dcu0 * dcu0
    inc = 0
    while True:
        best = start_max = end_max = 0
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
        c = math.pow(1.1, float(inc)) * dcu0  # Python's 1.1 ** inc, then squared
        cut2 = c * c


@_jit
def _refine(x, y, rot, trans, d0, d0_search, l_norm, d8, gap_a, n_gaps, max_iter, work, sw, m, best_map):
    """numpy_twin.refine (gap openings ``gap_a`` then 0 when ``n_gaps`` is 2, else 0 only): DP under
    the current superposition, the search on its alignment, until the score settles. Returns the best
    score (its map in ``best_map``); ``rot``, ``trans`` end as the last search's."""
    best, old = -1.0, 0.0
    none = np.zeros(0, np.uint8)
    smat = np.zeros((0, 0))
    for gi in range(n_gaps):
        gap = gap_a if gi == 0 and n_gaps == 2 else 0.0
        for it in range(max_iter):
            _nw(np.int64(_TM), x, y, rot, trans, d0 * d0, none, none, smat, gap, work, m)
            score = _pair_search(x, y, m, d0, d0_search, l_norm, d8, sw, rot, trans)
            if score > best + _TIE:  # an equal score is a tie: the first alignment stays
                best = score
                _copy(m, best_map)
            if it > 0 and abs(old - score) < 1e-6:
                break
            old = score
    return best


@_jit
def _jump(length):
    j = 45 if length > 250 else 35 if length > 200 else 25 if length > 150 else 15
    return min(j, length // 3)


@_jit
def _local(x, y, xc, yc, d0, d0_search, work, fw, fs, rot, trans, m, best_map):
    """numpy_twin.initial_local: fragment pairs superposed, DP with no gap penalty, the first strict
    best quick score above 0 kept in ``best_map``; returns whether one was found."""
    l1, l2 = x.shape[0], y.shape[0]
    jump1, jump2 = _jump(l1), _jump(l2)
    al = min(l1, l2)
    d01 = d0 + 1.5
    xs, ys, _, _ = fw
    none = np.zeros(0, np.uint8)
    smat = np.zeros((0, 0))
    best = 0.0
    found = False
    for f in range(2):
        nf = min(20, al // 3) if f == 0 else min(100, al // 2)
        for i in range(0, l1 - nf + 1, jump1):
            for j in range(0, l2 - nf + 1, jump2):
                for p in range(nf):
                    for k in range(3):
                        xs[k, p] = x[i + p, k]
                        ys[k, p] = y[j + p, k]
                _superpose_rows(xs, ys, nf, rot, trans, fs)
                _nw(np.int64(_TM), x, y, rot, trans, d01 * d01, none, none, smat, 0.0, work, m)
                sc = _fast_score(xc, yc, m, d0, d0_search, fw, fs)
                if sc > best:
                    best = sc
                    _copy(m, best_map)
                    found = True
    return found


@_jit
def _frag_threading(x, xc, yc, y, dcu0, d0, d0_search, fw, fs, m, best_map):
    """numpy_twin.initial_fragment_threading: the shorter continuous fragment threaded along the other
    chain (both chains when fragments and chains are equally long); the last best kept."""
    l1, l2 = x.shape[0], y.shape[0]
    xs0, xe = _max_fragment(x, dcu0)
    ys0, ye = _max_fragment(y, dcu0)
    lx, ly = xe - xs0 + 1, ye - ys0 + 1
    best = -np.inf
    for c in range(2):
        if lx == ly and l1 == l2:
            on_x, f0, lf, l0 = c == 0, xs0 if c == 0 else ys0, lx, l1
        elif c == 0:
            on_x = lx < ly or (lx == ly and l1 < l2)
            f0, lf, l0 = xs0 if on_x else ys0, min(lx, ly), min(l1, l2)
        else:
            break
        if lf == l0:  # numpy_twin._fragment_maps: a fragment spanning the chain keeps its 10-89% part
            f0, lf = f0 + int(l0 * 0.1), int(l0 * 0.89) + 1 - int(l0 * 0.1)
        min_ali = max(int(min(lf, l2 if on_x else l1) / 2.5), 3)
        best = _threading(xc, yc, f0, lf, on_x, min_ali, d0, d0_search, fw, fs, m, best_map, best)


@_jit
def _align_maps(x, y, xc, yc, secx, secy, d0, d0_search, d8, l_norm, dcu0, best):
    """numpy_twin.align_maps: every initial alignment, each searched and refined past its gate; the
    best map (strictly higher score wins) written to ``best`` (L2,)."""
    l1, l2 = x.shape[0], y.shape[0]
    work = _dp_work(l1, l2)
    sw = np.empty((6 * l2 + 12, 2), np.int64), np.empty(12)  # _pair_search's seed rows and result
    fw = _fast_work(l2)
    fs = _fit_scratch()
    rot = np.eye(3)
    trans = np.zeros(3)
    m = np.empty(l2, np.int64)  # the stage's map
    tmp = np.empty(l2, np.int64)  # the DP's / threading's scratch map
    rbest = np.empty(l2, np.int64)  # refine's best map
    smat = np.zeros((0, 0))
    best[:] = -1
    tm_max = -1.0
    ddcc = 0.1 if l_norm <= 40 else 0.4
    for stage in range(5):
        if stage == 0:  # gapless threading
            _threading(xc, yc, np.int64(0), l1, np.bool_(True), max(min(l1, l2) // 2, 5), d0, d0_search, fw,
                       fs, tmp, m, -np.inf)
        elif stage == 1:  # secondary structure
            _nw(np.int64(_SS), x, y, rot, trans, 1.0, secx, secy, smat, -1.0, work, m)
        elif stage == 2:  # local fragment superposition
            if not _local(x, y, xc, yc, d0, d0_search, work, fw, fs, rot, trans, tmp, m):
                continue
        elif stage == 3:  # the best so far superposed, plus secondary structure
            # numpy_twin._fit_map: the superposition of every aligned pair of the best so far
            _superpose_rows(fw[0], fw[1], _gather(x, y, best, fw[0], fw[1]), rot, trans, fs)
            d01 = d0 + 1.5
            _nw(np.int64(_TM_SS), x, y, rot, trans, d01 * d01, secx, secy, smat, -1.0, work, m)
        else:  # fragment gapless threading
            _frag_threading(x, xc, yc, y, dcu0, d0, d0_search, fw, fs, tmp, m)
        score = _pair_search(x, y, m, d0, d0_search, l_norm, d8, sw, rot, trans)
        if score > tm_max + _TIE:  # ties keep the earlier alignment, as in _refine
            tm_max = score
            _copy(m, best)
        gate = -np.inf if stage == 0 else tm_max * (0.2 if stage == 1 else ddcc)
        if score > gate:
            n_gaps = 1 if stage == 4 else 2
            max_iter = 2 if stage == 2 or stage == 4 else 30
            score = _refine(x, y, rot, trans, d0, d0_search, l_norm, d8, -0.6, n_gaps, max_iter, work, sw,
                            tmp, rbest)
            if score > tm_max + _TIE:
                tm_max = score
                _copy(rbest, best)


def align_maps(x, y, sec_x: str, sec_y: str, p) -> np.ndarray:
    """:func:`protgpu.align.numpy_twin.align_maps`, compiled as one call (same arguments, the same
    alignment; its scores within ~1e-15 of the twin's, as the searches')."""
    _compile()
    x = np.ascontiguousarray(x, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    best = np.empty(len(y), np.int64)
    # centred for the quick scores exactly as fast_scores centres them
    _align_maps(x, y, np.ascontiguousarray(x - x.mean(axis=0)), np.ascontiguousarray(y - y.mean(axis=0)),
                np.frombuffer(sec_x.encode(), np.uint8).copy(), np.frombuffer(sec_y.encode(), np.uint8).copy(),
                float(p.d0), float(p.d0_search), float(p.score_d8), float(p.l_norm), float(p.dcu0), best)
    return best
