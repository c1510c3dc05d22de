"""TM-align's superposition searches, in NumPy: the NumPy twin of the kernels that will score many seeds
(and many candidate alignments) at once.

Two searches, both on an alignment given as paired coordinates:

* :func:`tm_search` - TM-align's TM-score search (the TMscore8 search of the reference code): seed
  fragments of the aligned pairs (lengths n, n/2, n/4, ... at least 4; starts every ``step`` positions
  plus the last one), superpose each seed, keep the pairs closer than d0_search - 1 (relaxed by 0.5 A
  while fewer than 3 pass), then re-superpose on the kept pairs and re-select with d0_search + 1 for up
  to 20 rounds, until the kept set stops changing. The result is the best score met on the way and its
  superposition. All seeds of one alignment run as one batch (the leading axis of every array).
* :func:`fast_scores` - the quick three-fit estimate that ranks candidate initial alignments (TM-align's
  get_score_fast), batched over candidates.

Superpositions come from sums over masked pairs (:func:`protgpu.scoring._kabsch.superpose_from_sums`,
QCP in float64), so that a batch of subsets is one matrix product.
"""

from __future__ import annotations

import numpy as np

from ..scoring._kabsch import superpose_from_sums
from ..scoring.tmscore import _select, seed_lengths
from . import _fast
from ._dp import transform

#: Extension rounds of one seed in the TM-score search (the reference code's n_it).
MAX_ROUNDS = 20


def seed_starts(n: int, length: int, step: int) -> np.ndarray:
    """Start positions of the seeds of one length: 0, step, 2 step, ... and the last start n - length."""
    last = n - length
    starts = list(range(0, last, step)) + [last]
    return np.asarray(starts, dtype=np.int64)


def seeds(n: int, step: int) -> np.ndarray:
    """Every seed of the search as (length, start) rows, shape (S, 2), in the reference code's order."""
    rows = [(length, s) for length in seed_lengths(n) for s in seed_starts(n, length, step)]
    return np.asarray(rows, dtype=np.int64).reshape(-1, 2)


def _fit(w: np.ndarray, x: np.ndarray, y: np.ndarray, pxy: np.ndarray):
    """Superpositions of x on y over each row of the (T, n) 0/1 weights (identity for empty rows)."""
    return superpose_from_sums(w.sum(axis=1), w @ x, w @ y, (w @ pxy).reshape(-1, 3, 3))


def _d2(rot: np.ndarray, trans: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Squared distances (T, n) between the superposed x (one superposition per row) and y."""
    diff = transform(x, rot, trans) - y[None]
    diff *= diff
    return (diff[:, :, 0] + diff[:, :, 1]) + diff[:, :, 2]


def _scores(d2: np.ndarray, d0: float, score_d8: float | None, norm: float) -> np.ndarray:
    terms = 1.0 / (1.0 + d2 / (d0 * d0))
    if score_d8 is not None:
        terms = np.where(d2 <= score_d8 * score_d8, terms, 0.0)
    return terms.sum(axis=1) / norm


def tm_search(x, y, *, d0: float, d0_search: float, norm: float, step: int = 1, score_d8: float | None = None,
              chunk: int = 4096):
    """TM-align's TM-score search on one alignment.

    Parameters
    ----------
    x, y : array_like, shape (n, 3)
        The aligned pairs: mobile and target CA coordinates, Angstrom.
    d0 : float
        The score's distance scale: each pair scores 1 / (1 + (d / d0)^2).
    d0_search : float
        Selection cutoffs are d0_search - 1 (after a seed's fit) and d0_search + 1 (extension rounds).
    norm : float
        The score is the sum over pairs divided by this (the normalisation length).
    step : int
        Seed starts are every ``step`` positions (40 while aligning, 1 in the final search).
    score_d8 : float, optional
        Pairs farther than this add nothing to the score (the reference code's score_sum_method 8).
    chunk : int
        Seeds superposed at once.

    Returns
    -------
    score : float
        The best score met (-1 for n == 0).
    rotation : ndarray, shape (3, 3)
    translation : ndarray, shape (3,)
        ``x @ rotation.T + translation`` is the best superposition found.

    Notes
    -----
    Ties: the reference code keeps a new superposition only when its score is strictly higher, visiting
    seeds in order (longest first, starts ascending) and each seed's rounds in order; here each seed
    keeps its first strict maximum and the first seed with the highest maximum wins, which is the same
    choice.
    """
    if _fast.enabled():  # the same seeds and rounds compiled (scores to ~1e-15: fits' sums reordered)
        return _fast.tm_search(x, y, d0=d0, d0_search=d0_search, norm=norm, step=step, score_d8=score_d8)
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = len(x)
    if n == 0:
        return -1.0, np.eye(3), np.zeros(3)
    # Centred copies: the fits' sums cancel less; the translation is turned back at the end.
    cx, cy = x.mean(axis=0), y.mean(axis=0)
    x = x - cx
    y = y - cy
    pxy = (x[:, :, None] * y[:, None, :]).reshape(n, 9)
    sd = seeds(n, step)
    idx = np.arange(n)
    best = (-np.inf, np.eye(3), np.zeros(3))
    for c0 in range(0, len(sd), chunk):
        part = sd[c0:c0 + chunk]
        t_n = len(part)
        w = ((idx[None] >= part[:, 1:2]) & (idx[None] < part[:, 1:2] + part[:, 0:1])).astype(np.float64)
        rot, trans = _fit(w, x, y, pxy)
        d2 = _d2(rot, trans, x, y)
        cur = _select(d2, d0_search - 1.0, n)
        bs, brot, btr = _scores(d2, d0, score_d8, norm), rot, trans
        active = np.arange(t_n)
        for _ in range(MAX_ROUNDS):
            if active.size == 0:
                break
            rot, trans = _fit(cur[active].astype(np.float64), x, y, pxy)
            d2 = _d2(rot, trans, x, y)
            new = _select(d2, d0_search + 1.0, n)
            sc = _scores(d2, d0, score_d8, norm)
            up = sc > bs[active]
            hit = active[up]
            bs[hit], brot[hit], btr[hit] = sc[up], rot[up], trans[up]
            done = (new == cur[active]).all(axis=1)
            cur[active] = new
            active = active[~done]
        k = int(np.argmax(bs))  # first occurrence: the first strict maximum in the reference order
        if bs[k] > best[0]:
            best = (float(bs[k]), brot[k], btr[k])
    score, rot, trans = best
    return score, rot, trans + cy - rot @ cx


def _relaxed_cut(d2: np.ndarray, valid: np.ndarray, cut2: float, n_ali: np.ndarray) -> np.ndarray:
    """Per-row squared cutoff: ``cut2`` raised by 0.5 A^2 steps until at least 3 valid pairs have
    d2 <= cutoff, for rows with more than 3 pairs (the reference code's loop, in closed form)."""
    cut = np.full(len(d2), cut2)
    count = (valid & (d2 <= cut2)).sum(axis=1)
    need = np.flatnonzero((count < 3) & (n_ali > 3))
    if need.size:
        third = np.partition(np.where(valid[need], d2[need], np.inf), 2, axis=1)[:, 2]
        m = np.maximum(np.ceil((third - cut2) / 0.5), 0.0)
        # settle the closed form's rounding against the loop's own test (d2 <= cut2 + 0.5 m)
        for _ in range(3):
            m = np.where(cut2 + 0.5 * m < third, m + 1.0, m)
            m = np.where((m > 0) & (cut2 + 0.5 * (m - 1.0) >= third), m - 1.0, m)
        cut[need] = cut2 + 0.5 * m
    return cut


def fast_scores(x, y, maps, *, d0: float, d0_search: float) -> np.ndarray:
    """TM-align's quick estimate of each candidate alignment (three fits), batched over candidates.

    Parameters
    ----------
    x : array_like, shape (L1, 3)
        Mobile CA coordinates, Angstrom.
    y : array_like, shape (L2, 3)
        Target CA coordinates.
    maps : array_like of int, shape (B, L2)
        Candidate alignments: ``maps[b, j]`` is the mobile residue aligned to target residue j, or -1.
    d0, d0_search : float
        The search's d0 and d0_search.

    Returns
    -------
    ndarray, shape (B,)
        The best of three un-normalised scores (sum over aligned pairs of 1 / (1 + d^2 / d0^2)): after
        a fit on all aligned pairs, after a refit on those within d0_search (squared cutoff relaxed by
        0.5 A^2 while fewer than 3 pass), and after a refit on those within d0_search^2 + 1 A^2 (same
        relaxation). The second and third fits are skipped when the first cutoff keeps every pair.
    """
    if _fast.enabled():
        return _fast.fast_scores(x, y, maps, d0=d0, d0_search=d0_search)
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    maps = np.asarray(maps, dtype=np.int64)
    # The score is invariant to moving both sets; centred copies keep the sums' cancellation small.
    x = x - x.mean(axis=0)
    y = y - y.mean(axis=0)
    valid = maps >= 0
    xa = x[np.where(valid, maps, 0)]  # (B, L2, 3) mobile partner of each target residue
    n_ali = valid.sum(axis=1)
    d02 = d0 * d0
    d002 = d0_search * d0_search

    def fit_d2(w, xs):
        # fit of each row's weighted pairs (xs: those rows' mobile partners), then every pair's d^2
        sxy = np.einsum("bj,bjk,jl->bkl", w, xs, y)
        rot, trans = superpose_from_sums(w.sum(axis=1), np.einsum("bj,bjk->bk", w, xs), w @ y, sxy)
        diff = np.einsum("bij,bnj->bni", rot, xs) + trans[:, None, :] - y[None]
        return np.einsum("bni,bni->bn", diff, diff)

    def score(d2, ok):
        return np.where(ok, 1.0 / (1.0 + d2 / d02), 0.0).sum(axis=1)

    d2 = fit_d2(valid.astype(np.float64), xa)
    best = score(d2, valid)
    cut = _relaxed_cut(d2, valid, d002, n_ali)
    sel = valid & (d2 <= cut[:, None])
    # rows whose first cutoff keeps every pair stop here (the reference code skips the refits)
    rows = np.flatnonzero(sel.sum(axis=1) != n_ali)
    if rows.size:
        ok, xs = valid[rows], xa[rows]
        d2 = fit_d2(sel[rows].astype(np.float64), xs)
        s1 = score(d2, ok)
        cut = _relaxed_cut(d2, ok, d002 + 1.0, n_ali[rows])
        d2 = fit_d2((ok & (d2 <= cut[:, None])).astype(np.float64), xs)
        s2 = score(d2, ok)
        best[rows] = np.maximum(np.maximum(best[rows], s1), s2)
    return best
