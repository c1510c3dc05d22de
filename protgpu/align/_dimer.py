"""US-align's TM-align of a whole complex with inter-chain cells masked (``TMalign_dimer_main``), the
"cross-chain" step of MM-align (``MMalign_dimer``), from the TM-align twin's pieces.

The chains assigned to each other are laid end to end (model chains in order, each with its target
chain) and aligned as one pair by TM-align's stages, except that the DP may align residues only within
an assigned chain pair (the mask) and charges its gap opening on leading end gaps too (its first row and
column are ``i * gap``, where TM-align's are 0); a masked cell's diagonal value is the smallest
positive float32 (US-align's ``FLT_MIN``), not a sum. Stages as in TM-align (``numpy_twin.align_maps``)
with US-align's dimer variants: the DP stages use the masked DP; the fourth stage (superposition of the
best alignment plus secondary structure) fills its score matrix with ``FLT_MIN`` before aligning (as
US-align's code does), which gives the diagonal ending at the last residues; the user's alignment
(``-i``: here the alignment MM-align's iterations ended with) is scored and refined last. With
``fast`` (MM-align sets it when the smaller complex has more than 500 residues: US-align's ``-fast``)
gapless threading tries every 5th offset, fragment threading every 3rd (on the mobile side), the
local superpositions every 5th jump, refinement runs 2 rounds, and the final search seeds every 40.
See ``docs/design/complexes.md``.
"""

from __future__ import annotations

import numpy as np

from ..scoring import _fast as _sf
from . import _fast
from ._dp import ss_scores_matrix, transform
from ._search import fast_scores, tm_search
from .numpy_twin import (
    best_last,
    detailed_search,
    final_search,
    initial_fragment_threading,
    initial_local,
    pairs_of,
    refine,
    search_parameters,
    threading_maps,
)

#: US-align's FLT_MIN: the diagonal value of a masked DP cell.
FLT_MIN = float(np.finfo(np.float32).tiny)

_LOOPS = _sf.Loops(globals())


@_LOOPS.jit
def _nw_masked_loop(s, mask, gap, j2i):
    """:func:`nw_masked` cell by cell (the compiled path)."""
    l1, l2 = s.shape
    val = np.empty((l1 + 1, l2 + 1))
    path = np.zeros((l1 + 1, l2 + 1), np.bool_)
    for i in range(l1 + 1):
        val[i, 0] = i * gap
    for j in range(l2 + 1):
        val[0, j] = j * gap
    for i in range(1, l1 + 1):
        for j in range(1, l2 + 1):
            d = 1.1754943508222875e-38  # FLT_MIN
            if mask[i - 1, j - 1]:
                d = val[i - 1, j - 1] + s[i - 1, j - 1]
            h, v = _gap_moves(val, path, i, j, gap)
            if d >= h and d >= v:
                path[i, j] = True
                val[i, j] = d
            else:
                val[i, j] = v if v >= h else h
    _traceback(val, path, gap, j2i)


@_LOOPS.jit
def _gap_moves(val, path, i, j, gap):
    """Values of cell (i, j) reached by a gap from (i - 1, j) and from (i, j - 1): the gap opening is
    charged after an aligned pair only."""
    h = val[i - 1, j]
    if path[i - 1, j]:
        h += gap
    v = val[i, j - 1]
    if path[i, j - 1]:
        v += gap
    return h, v


@_LOOPS.jit
def _traceback(val, path, gap, j2i):
    i, j = val.shape[0] - 1, val.shape[1] - 1
    while i > 0 and j > 0:
        if path[i, j]:
            j2i[j - 1] = i - 1
            i -= 1
            j -= 1
        else:
            h, v = _gap_moves(val, path, i, j, gap)
            if v >= h:
                j -= 1
            else:
                i -= 1


def nw_masked(score, mask, gap: float) -> np.ndarray:
    """US-align's masked DP (``NWDP_TM_dimer``) on one score matrix.

    Parameters
    ----------
    score : array_like, shape (L1, L2)
        Score of aligning mobile residue i with target residue j.
    mask : array_like of bool, shape (L1, L2)
        Cells that may be aligned; elsewhere the diagonal move is worth :data:`FLT_MIN` (not a sum).
    gap : float
        Gap opening (<= 0), charged after an aligned pair and along the first row and column
        (``val[i, 0] = i * gap``); no extension penalty.

    Returns
    -------
    ndarray of int64, shape (L2,)
        The mobile residue aligned to each target residue, or -1.

    Notes
    -----
    Ties as TM-align's DP (:func:`protgpu.align._dp.nw_align`): diagonal when it is >= both gap moves,
    else the move along the target when it is >= the other; the traceback recomputes the gap moves.
    """
    s = np.ascontiguousarray(score, dtype=np.float64)
    m = np.ascontiguousarray(mask, dtype=bool)
    l1, l2 = s.shape
    j2i = np.full(l2, -1, dtype=np.int64)
    if _fast.enabled():
        _LOOPS.compile()
        _nw_masked_loop(s, m, float(gap), j2i)
        return j2i
    val = np.zeros((l1 + 1, l2 + 1))
    path = np.zeros((l1 + 1, l2 + 1), dtype=bool)
    val[:, 0] = np.arange(l1 + 1) * gap
    val[0, :] = np.arange(l2 + 1) * gap
    for k in range(2, l1 + l2 + 1):  # anti-diagonals: every cell of one depends on the two before
        i = np.arange(max(1, k - l2), min(l1, k - 1) + 1)
        j = k - i
        d = np.where(m[i - 1, j - 1], val[i - 1, j - 1] + s[i - 1, j - 1], FLT_MIN)
        h = val[i - 1, j] + np.where(path[i - 1, j], gap, 0.0)
        v = val[i, j - 1] + np.where(path[i, j - 1], gap, 0.0)
        diag = (d >= h) & (d >= v)
        val[i, j] = np.where(diag, d, np.where(v >= h, v, h))
        path[i, j] = diag
    _traceback(val, path, float(gap), j2i)
    return j2i


def _masked_dp(mask):
    """:func:`nw_masked` as the twin's stages call their DP: scores (C, L1, L2), gap -> y2x (C, L2)."""
    return lambda scores, gap: np.stack([nw_masked(sc, mask, gap) for sc in scores])


def dimer_align(x, y, sec_x: str, sec_y: str, mask, given, l_norm: float, fast: bool):
    """TM-align the concatenated complexes with the masked DP, and the superposition MM-align keeps.

    Parameters
    ----------
    x : ndarray, shape (L1, 3)
        Mobile CA coordinates of the assigned chains end to end (model chains in order).
    y : ndarray, shape (L2, 3)
        Their target chains likewise (in the same order).
    sec_x, sec_y : str
        Per-chain secondary structure (:func:`_dp.secondary_structure`), concatenated.
    mask : ndarray of bool, shape (L1, L2)
        True within each assigned chain pair's block.
    given : ndarray of int64, shape (L2,)
        An alignment to start from as well (``-i``), as ``y2x``.
    l_norm : float
        The TM-score normalisation of the returned superposition (MM-align's ``L``).
    fast : bool
        US-align's ``-fast`` choices (module docstring).

    Returns
    -------
    rotation : ndarray, shape (3, 3)
    translation : ndarray, shape (3,)
        The TM-score search's best superposition (step 1, d0 of ``l_norm``) on the best alignment's
        pairs closer than score_d8.
    """
    l1, l2 = len(x), len(y)
    p = search_parameters(l1, l2)
    ddcc = 0.1 if p.l_norm <= 40 else 0.4
    rounds = 2 if fast else 30
    tm_max, best = -1.0, np.full(l2, -1, dtype=np.int64)

    dp = _masked_dp(mask)

    def keep(score, y2x):
        nonlocal tm_max, best
        if score > tm_max + _fast._TIE:
            tm_max, best = score, y2x

    # 1. gapless threading (every 5th offset with fast), refined with the masked DP
    maps = threading_maps(l1, l2, min_ali=max(min(l1, l2) // 2, 5))[::5 if fast else 1]
    y2x = maps[best_last(fast_scores(x, y, maps, d0=p.d0, d0_search=p.d0_search))]
    score, rot, trans = detailed_search(x, y, y2x, p)
    keep(score, y2x)
    score, y2x, rot, trans = refine(x, y, rot, trans, p, dp=dp, max_iter=rounds)
    keep(score, y2x)
    # 2. secondary structure, masked, gap -1
    y2x = nw_masked(ss_scores_matrix(sec_x, sec_y), mask, -1.0)
    score, rot, trans = detailed_search(x, y, y2x, p)
    keep(score, y2x)
    if score > tm_max * 0.2:
        score, y2x, rot, trans = refine(x, y, rot, trans, p, dp=dp, max_iter=rounds)
        keep(score, y2x)
    # 3. local fragment superposition, masked
    y2x = initial_local(x, y, p, dp=dp, jump_factor=5 if fast else 1)
    if y2x is not None:
        score, rot, trans = detailed_search(x, y, y2x, p)
        keep(score, y2x)
        if score > tm_max * ddcc:
            score, y2x, rot, trans = refine(x, y, rot, trans, p, dp=dp, max_iter=2)
            keep(score, y2x)
    # 4. US-align's dimer variant scores every cell FLT_MIN: the diagonal ending at (L1, L2)
    jj = np.arange(l2) + (l1 - l2)
    y2x = np.where((jj >= 0) & (jj < l1), jj, -1)
    score, rot, trans = detailed_search(x, y, y2x, p)
    keep(score, y2x)
    if score > tm_max * ddcc:
        score, y2x, rot, trans = refine(x, y, rot, trans, p, dp=dp, max_iter=rounds)
        keep(score, y2x)
    # 5. fragment gapless threading
    y2x = initial_fragment_threading(x, y, p, mobile_stride=3 if fast else 1)
    score, rot, trans = detailed_search(x, y, y2x, p)
    keep(score, y2x)
    if score > tm_max * ddcc:
        score, y2x, rot, trans = refine(x, y, rot, trans, p, dp=dp, gaps=(0.0,), max_iter=2)
        keep(score, y2x)
    # 6. the given alignment, then refined
    score, rot, trans = detailed_search(x, y, given, p)
    keep(score, given)
    score, y2x, rot, trans = refine(x, y, rot, trans, p, dp=dp, max_iter=rounds)
    keep(score, y2x)
    # final: pairs within score_d8 of the search's superposition, then the search with d0 of l_norm
    xa, ya, _, _ = pairs_of(x, y, best)
    _, rot, trans = tm_search(xa, ya, d0=p.d0, d0_search=p.d0_search, norm=len(xa), step=40 if fast else 1,
                              score_d8=p.score_d8)
    diff = transform(xa, rot[None], trans[None])[0] - ya
    near = np.sqrt((diff[:, 0] * diff[:, 0] + diff[:, 1] * diff[:, 1]) + diff[:, 2] * diff[:, 2]) <= p.score_d8
    _, rot, trans = final_search(xa[near], ya[near], l_norm)
    return rot, trans
