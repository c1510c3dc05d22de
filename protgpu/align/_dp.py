"""TM-align's secondary structure assignment from CA geometry and its dynamic programming, in NumPy.

The DP is Needleman-Wunsch with a gap-opening penalty and no extension penalty, as TM-align runs it:
free end gaps (the first row and column are 0), a gap costs ``gap_open`` only when it opens after an
aligned pair, and the tie rules of the reference code (diagonal when it is at least both gap moves;
else the move along the target (j - 1) when it is at least the move along the mobile chain). It is
batched over score matrices (a leading axis) and runs over anti-diagonals: every cell of one
anti-diagonal depends only on the two before it, so one diagonal is one vector step - the order a
GPU kernel will follow too.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import _fast

# Secondary structure codes as TM-align writes them.
COIL, HELIX, TURN, STRAND = "C", "H", "T", "E"

# Ideal CA-CA distances (i, i+2), (i, i+3), (i, i+4) of a helix and a strand, and the tolerances.
_HELIX = (5.45, 5.18, 6.37, 2.1)
_STRAND = (6.1, 10.4, 13.0, 1.42)


def secondary_structure(ca) -> str:
    """TM-align's secondary structure of each residue from its CA geometry.

    For residue i with neighbours i-2..i+2, the six distances between them are compared with a helix
    (|i-2,i| 5.45, |i-2,i+1| 5.18, |i-2,i+2| 6.37 A, each within 2.1 A, and likewise for the inner
    pairs) and a strand (6.1, 10.4, 13 A within 1.42 A); otherwise a turn when |i-2,i+2| < 8 A, else
    coil. The two residues at each end are coil. (TM-align does not smooth this assignment; the
    smoothing function in its source is unused.)

    Parameters
    ----------
    ca : array_like, shape (L, 3)
        CA coordinates, Angstrom.

    Returns
    -------
    str
        One of ``"H"``, ``"E"``, ``"T"``, ``"C"`` per residue, length L.
    """
    x = np.asarray(ca, dtype=np.float64)
    n = len(x)
    sec = np.full(n, COIL, dtype="<U1")
    if n >= 5:
        def d(a, b):
            diff = x[2 + a:n - 2 + a] - x[2 + b:n - 2 + b]
            return np.sqrt(np.einsum("ij,ij->i", diff, diff))

        d13, d14, d15 = d(-2, 0), d(-2, 1), d(-2, 2)
        d24, d25, d35 = d(-1, 1), d(-1, 2), d(0, 2)

        def near(ref):
            i3, i4, i5, tol = ref
            return ((np.abs(d15 - i5) < tol) & (np.abs(d14 - i4) < tol) & (np.abs(d25 - i4) < tol)
                    & (np.abs(d13 - i3) < tol) & (np.abs(d24 - i3) < tol) & (np.abs(d35 - i3) < tol))

        helix, strand = near(_HELIX), near(_STRAND)
        inner = np.where(helix, HELIX, np.where(strand, STRAND, np.where(d15 < 8.0, TURN, COIL)))
        sec[2:n - 2] = inner
    return "".join(sec.tolist())


# Traceback moves stored per cell.
_DIAG, _LEFT, _UP = 0, 1, 2
# Largest score copy (elements) laid out by anti-diagonals; larger batches read strided views instead.
_SKEW_ELEMENTS = 4 * 2**20


def nw_align(score, gap_open) -> np.ndarray:
    """Needleman-Wunsch alignments as TM-align computes them, batched.

    Parameters
    ----------
    score : array_like, shape (B, L1, L2)
        Score of aligning mobile residue i with target residue j, for each of B problems.
    gap_open : float or array_like, shape (B,)
        Added (it is <= 0) when a gap opens after an aligned pair; gaps do not cost to extend, and end
        gaps are free.

    Returns
    -------
    ndarray of int64, shape (B, L2)
        ``j2i[b, j]``: the mobile residue aligned to target residue j, or -1.

    Notes
    -----
    Cell (i, j) (1-based) takes the diagonal value ``V[i-1, j-1] + score`` when it is at least both gap
    moves, else the larger gap move, the one from (i, j-1) on a tie; the traceback from (L1, L2)
    follows the same choices. Values are sums in the reference code's order, so equal inputs give
    equal bits.
    """
    if _fast.enabled():  # the same cells compiled: equal result (docs/design/cpu-speed.md)
        return _fast.nw_align(score, gap_open)
    s = np.ascontiguousarray(score, dtype=np.float64)
    b, l1, l2 = s.shape
    flat = s.reshape(b, l1 * l2)
    skew = None
    if b * (l1 + l2 + 1) * (l1 + 1) <= _SKEW_ELEMENTS:
        # small batches: one gather lays every anti-diagonal out contiguously (cells off the matrix
        # read cell 0 and are never used)
        k, i = np.meshgrid(np.arange(l1 + l2 + 1), np.arange(l1 + 1), indexing="ij")
        cell = np.where((i >= 1) & (k - i >= 1) & (k - i <= l2), (i - 1) * l2 + (k - i - 1), 0)
        skew = flat[:, cell]
    gap = np.broadcast_to(np.asarray(gap_open, dtype=np.float64), (b,))[:, None]
    # Diagonal k holds cells i + j = k, indexed by i (0..L1); only the last two diagonals' values and
    # "came from the diagonal" flags are needed going forward, the moves are kept for the traceback.
    moves = np.zeros((b, l1 + l2 + 1, l1 + 1), dtype=np.int8)
    v1 = np.zeros((b, l1 + 1))
    p1 = np.zeros((b, l1 + 1), dtype=bool)
    v2 = np.zeros((b, l1 + 1))
    for k in range(2, l1 + l2 + 1):
        lo, hi = max(1, k - l2), min(l1, k - 1)
        # cells (i - 1, k - i - 1) of the score matrix, i = lo..hi: L2 - 1 apart in memory
        if skew is not None:
            diag_s = skew[:, k, lo:hi + 1]
        else:
            first = (lo - 1) * l2 + (k - lo - 1)
            diag_s = as_strided(flat[:, first:], shape=(b, hi - lo + 1), strides=(flat.strides[0], (l2 - 1) * 8))
        d = v2[:, lo - 1:hi] + diag_s
        h = v1[:, lo - 1:hi] + np.where(p1[:, lo - 1:hi], gap, 0.0)  # from (i-1, j)
        v = v1[:, lo:hi + 1] + np.where(p1[:, lo:hi + 1], gap, 0.0)  # from (i, j-1)
        diag = (d >= h) & (d >= v)
        left = v >= h
        val = np.where(diag, d, np.where(left, v, h))
        vn = np.zeros((b, l1 + 1))
        pn = np.zeros((b, l1 + 1), dtype=bool)
        vn[:, lo:hi + 1] = val
        pn[:, lo:hi + 1] = diag
        moves[:, k, lo:hi + 1] = np.where(diag, _DIAG, np.where(left, _LEFT, _UP))
        v2, v1, p1 = v1, vn, pn
    return _traceback(moves, l1, l2)


def _traceback(moves: np.ndarray, l1: int, l2: int) -> np.ndarray:
    b = moves.shape[0]
    j2i = np.full((b, l2), -1, dtype=np.int64)
    if b == 1:  # one problem: a scalar walk is cheaper than vector steps
        mv, i, j = moves[0], l1, l2
        while i > 0 and j > 0:
            m = mv[i + j, i]
            if m == _DIAG:
                j2i[0, j - 1] = i - 1
            i -= m != _LEFT
            j -= m != _UP
        return j2i
    i = np.full(b, l1)
    j = np.full(b, l2)
    rows = np.arange(b)
    while True:
        act = np.flatnonzero((i > 0) & (j > 0))
        if act.size == 0:
            return j2i
        ia, ja = i[act], j[act]
        mv = moves[rows[act], ia + ja, ia]
        dg = mv == _DIAG
        j2i[act[dg], ja[dg] - 1] = ia[dg] - 1
        i[act] = ia - (mv != _LEFT)
        j[act] = ja - (mv != _UP)


def transform(x, rot, trans) -> np.ndarray:
    """Superposed coordinates ``x @ rot.T + trans`` for B superpositions, shape (B, L, 3), summed in the
    reference code's order (u_k0 x_0 + u_k1 x_1 + u_k2 x_2, then + t_k) so that equal superpositions
    give equal bits."""
    x = np.asarray(x, np.float64)
    rot = np.asarray(rot, np.float64)
    trans = np.asarray(trans, np.float64)
    out = np.empty((len(rot), len(x), 3))
    for k in range(3):
        out[:, :, k] = (rot[:, k, 0:1] * x[None, :, 0] + rot[:, k, 1:2] * x[None, :, 1]
                        + rot[:, k, 2:3] * x[None, :, 2]) + trans[:, k:k + 1]
    return out


def tm_scores_matrix(x, y, rot, trans, d0: float) -> np.ndarray:
    """DP scores 1 / (1 + d^2 / d0^2) between every superposed mobile residue and every target residue.

    Parameters
    ----------
    x : array_like, shape (L1, 3)
    y : array_like, shape (L2, 3)
    rot : array_like, shape (B, 3, 3)
    trans : array_like, shape (B, 3)
        B superpositions of x onto y.
    d0 : float
        Distance scale, Angstrom.

    Returns
    -------
    ndarray, shape (B, L1, L2)
    """
    if _fast.enabled():
        return _fast.tm_scores_matrix(x, y, rot, trans, d0)
    xt = transform(x, rot, trans)
    y = np.asarray(y, np.float64)
    d2 = None
    for k in range(3):  # squared differences summed x, y, z in order, as the reference code does
        dk = xt[:, :, k, None] - y[None, None, :, k]
        dk *= dk
        d2 = dk if d2 is None else np.add(d2, dk, out=d2)
    return 1.0 / (1.0 + d2 / (d0 * d0))


def ss_scores_matrix(sec_x: str, sec_y: str) -> np.ndarray:
    """1 where the two residues' secondary structure letters agree, else 0; shape (L1, L2)."""
    a = np.frombuffer(sec_x.encode(), dtype=np.uint8)
    c = np.frombuffer(sec_y.encode(), dtype=np.uint8)
    return (a[:, None] == c[None, :]).astype(np.float64)
