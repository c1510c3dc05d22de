"""The fast CPU path of TM-align: its DP, score matrices and TM-score search as numba-compiled loops.

Optional, like :mod:`protgpu.scoring._fast` (whose switch, compile-on-first-use pattern and scalar QCP
fit this module reuses): without numba, or with ``PROTGPU_NUMBA=0``, the NumPy twins in
:mod:`protgpu.align._dp` and :mod:`protgpu.align._search` run, and they stay the specification.

* :func:`nw_align` and :func:`tm_scores_matrix` follow their twins operation by operation (no
  reassociation), so they give equal bits.
* :func:`tm_search` visits the seeds and rounds in the twin's order with the same selection and tie
  rule; only the fits' sums are added in another order than BLAS's (as in the scoring fast path), so
  scores agree to ~1e-15. Why numba: ``docs/design/cpu-speed.md``.
"""

from __future__ import annotations

import threading

import numpy as np

from ..scoring import _fast as _sf

_KERNELS: list[str] = []
_compile_lock = threading.Lock()
_READY = False  # every loop compiled (skips the check on the ~100 calls of one pair)


def enabled() -> bool:
    """Whether the compiled paths may be used: the scoring fast path's switch (numba importable, not
    turned off by ``PROTGPU_NUMBA=0`` or ``protgpu.scoring._fast.ENABLED``)."""
    return _sf.enabled()


def _jit(fn):
    _KERNELS.append(fn.__name__)
    return fn


def _compile() -> None:
    """Replace this module's loops by numba dispatchers, once (after the scoring loops they call)."""
    global _READY
    if _READY:
        return
    _sf._compile()
    with _compile_lock:
        import numba

        for name in _KERNELS:
            if not hasattr(globals()[name], "py_func"):
                globals()[name] = numba.njit(cache=True, nogil=True, error_model="numpy")(globals()[name])
        _READY = True


_DIAG, _LEFT, _UP = 0, 1, 2  # _dp's traceback moves


@_jit
def _nw_all(s, gap, j2i):
    """_dp.nw_align for each problem b: cell by cell, the same sums and tie rules as the twin."""
    b_n, l1, l2 = s.shape
    val = np.zeros((l1 + 1, l2 + 1))
    frm = np.zeros((l1 + 1, l2 + 1), dtype=np.bool_)  # the cell took the diagonal move
    moves = np.zeros((l1 + 1, l2 + 1), dtype=np.int8)
    for b in range(b_n):
        g = gap[b]
        for i in range(1, l1 + 1):
            for j in range(1, l2 + 1):
                d = val[i - 1, j - 1] + s[b, i - 1, j - 1]
                h = val[i - 1, j] + (g if frm[i - 1, j] else 0.0)
                v = val[i, j - 1] + (g if frm[i, j - 1] else 0.0)
                if d >= h and d >= v:
                    val[i, j] = d
                    frm[i, j] = True
                    moves[i, j] = _DIAG
                elif v >= h:
                    val[i, j] = v
                    frm[i, j] = False
                    moves[i, j] = _LEFT
                else:
                    val[i, j] = h
                    frm[i, j] = False
                    moves[i, j] = _UP
        i, j = l1, l2
        while i > 0 and j > 0:
            m = moves[i, j]
            if m == _DIAG:
                j2i[b, j - 1] = i - 1
            if m != _LEFT:
                i -= 1
            if m != _UP:
                j -= 1


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


@_jit
def _score_d8(d2, d0sq, d8sq, use_d8, norm):
    s = 0.0
    for p in range(d2.shape[0]):
        if not use_d8 or d2[p] <= d8sq:
            s += 1.0 / (1.0 + d2[p] / d0sq)
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
        same = same and new[p] == cur[p]
        cur[p] = new[p]
    return same


@_jit
def _search(x, y, seeds, d0, d0_search, norm, d8, use_d8, max_rounds, out_rt):
    """_search.tm_search's seeds and rounds on centred (3, n) rows; returns the best score, its
    superposition (of the centred sets) in out_rt[:9], out_rt[9:]. A new score is kept only when
    strictly higher, in seed then round order: the twin's choice."""
    n = x.shape[1]
    d0sq = d0 * d0
    d8sq = d8 * d8
    best = -np.inf
    rot, trans, kbuf, q, rows, wk = _fit_scratch()
    d2 = np.empty(n)
    cur = np.empty(n, dtype=np.bool_)
    new = np.empty(n, dtype=np.bool_)
    for t in range(seeds.shape[0]):
        _sf._fit_subset(x, y, cur, seeds[t, 1], seeds[t, 0], rot, trans, kbuf, q, rows, wk)
        _sf._dist2(x, y, rot, trans, d2)
        _sf._select(d2, d0_search - 1.0, cur)
        sc = _score_d8(d2, d0sq, d8sq, use_d8, norm)
        if sc > best:
            best = sc
            _store(rot, trans, out_rt)
        for _ in range(max_rounds):
            _sf._fit_subset(x, y, cur, 0, -1, rot, trans, kbuf, q, rows, wk)
            _sf._dist2(x, y, rot, trans, d2)
            _sf._select(d2, d0_search + 1.0, new)
            sc = _score_d8(d2, d0sq, d8sq, use_d8, norm)
            if sc > best:
                best = sc
                _store(rot, trans, out_rt)
            if _settled(new, cur):
                break
    return best


def tm_search(x, y, *, d0: float, d0_search: float, norm: float, step: int = 1, score_d8: float | None = None):
    """:func:`protgpu.align._search.tm_search`, compiled (same arguments and result, scores to ~1e-15)."""
    from ._search import MAX_ROUNDS, seeds

    _compile()
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = len(x)
    if n == 0:
        return -1.0, np.eye(3), np.zeros(3)
    cx, cy = x.mean(axis=0), y.mean(axis=0)  # centred as the twin, the translation turned back below
    xc = np.ascontiguousarray((x - cx).T)
    yc = np.ascontiguousarray((y - cy).T)
    rt = np.zeros(12)
    rt[0] = rt[4] = rt[8] = 1.0
    score = _search(xc, yc, seeds(n, step), float(d0), float(d0_search), float(norm),
                    0.0 if score_d8 is None else float(score_d8), score_d8 is not None, MAX_ROUNDS, rt)
    rot = rt[:9].reshape(3, 3).copy()
    return float(score), rot, rt[9:] + cy - rot @ cx


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
def _fast_scores(x, y, maps, d0, d0_search, out):
    """_search.fast_scores on centred (L, 3) coordinates: each candidate's valid pairs gathered into
    (3, n) rows, three fits (the later two skipped when the first cutoff keeps every pair)."""
    l2 = maps.shape[1]
    xs = np.empty((3, l2))
    ys = np.empty((3, l2))
    d2 = np.empty(l2)
    sel = np.empty(l2, dtype=np.bool_)
    rot, trans, kbuf, q, rows, wk = _fit_scratch()
    d02 = d0 * d0
    d002 = d0_search * d0_search
    for b in range(maps.shape[0]):
        n = 0
        for j in range(l2):
            i = maps[b, j]
            if i >= 0:
                for k in range(3):
                    xs[k, n] = x[i, k]
                    ys[k, n] = y[j, k]
                n += 1
        xv, yv, dv, sv = xs[:, :n], ys[:, :n], d2[:n], sel[:n]
        _sf._fit_subset(xv, yv, sv, 0, n, rot, trans, kbuf, q, rows, wk)
        _sf._dist2(xv, yv, rot, trans, dv)
        best = _score_d8(dv, d02, 0.0, False, 1.0)
        cut = _relaxed_cut(dv, n, d002)
        kept = 0
        for p in range(n):
            sv[p] = dv[p] <= cut
            kept += sv[p]
        if kept != n:
            _sf._fit_subset(xv, yv, sv, 0, -1, rot, trans, kbuf, q, rows, wk)
            _sf._dist2(xv, yv, rot, trans, dv)
            s1 = _score_d8(dv, d02, 0.0, False, 1.0)
            cut = _relaxed_cut(dv, n, d002 + 1.0)
            for p in range(n):
                sv[p] = dv[p] <= cut
            _sf._fit_subset(xv, yv, sv, 0, -1, rot, trans, kbuf, q, rows, wk)
            _sf._dist2(xv, yv, rot, trans, dv)
            s2 = _score_d8(dv, d02, 0.0, False, 1.0)
            best = max(max(best, s1), s2)
        out[b] = best


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
