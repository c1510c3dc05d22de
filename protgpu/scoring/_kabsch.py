"""Batched optimal superposition (Kabsch problem) in float64 for the scoring package: the TM-score
search's fits of thousands of masked subsets at once (from sums), and the RMSD of each model's aligned
pairs after their own fit.

Both solve the problem with the QCP of :mod:`protgpu.superpose.qcp` (key-matrix quartic, guarded
Newton, the quaternion from the adjugate with the Jacobi fallback for repeated roots), so that the CPU
has one QCP implementation. What is specific to scoring stays here: fits from sums over masked subsets
(no coordinates, no sums of squares: Newton starts from the ``sqrt(3) |M|_F`` bound), per-model weights
and references, the identity for an empty subset. The CUDA side of the same problems is
``kernels/tmscore.cu`` (the search) and ``qcp.cu``'s ``aligned_rmsd_*`` (the RMSD column).
"""

from __future__ import annotations

import numpy as np

from ..superpose import qcp


def _check_numpy(xp):
    if xp is not np:
        raise TypeError("protgpu.scoring._kabsch is NumPy only (the GPU paths are kernels/tmscore.cu and "
                        "qcp.cu's aligned_rmsd_*)")


def superpose_from_sums(n, sx, sy, sxy, xp=np):
    """Best rigid superposition of x onto y from the sums over the (weighted) point pairs.

    Working from sums lets a caller superpose many masked subsets of the same pairs with one matrix
    product (``mask @ per_pair_terms``) instead of gathering every subset.

    Parameters
    ----------
    n : np.ndarray, shape (S,)
        Number (total weight) of pairs in each subset. Subsets with ``n == 0`` get the identity.
    sx, sy : np.ndarray, shape (S, 3)
        Sums of the mobile (x) and target (y) coordinates over each subset, Angstrom.
    sxy : np.ndarray, shape (S, 3, 3)
        ``sum_i x_i y_i^T`` over each subset (raw, not centred), Angstrom^2.
    xp : module
        NumPy (the only namespace accepted; kept for the callers' signature).

    Returns
    -------
    rotation : np.ndarray, shape (S, 3, 3), float64
        Proper rotations (det +1).
    translation : np.ndarray, shape (S, 3), float64
        With ``x @ rotation.T + translation`` the superposed mobile coordinates, Angstrom.
    """
    _check_numpy(xp)
    n = np.asarray(n, dtype=np.float64)
    safe = np.where(n > 0, n, 1.0)
    cx = sx / safe[:, None]
    cy = sy / safe[:, None]
    # centred cross-covariance; float64 sums of float32-exact products keep the cancellation harmless
    m = sxy - n[:, None, None] * cx[:, :, None] * cy[:, None, :]
    q, _ = qcp.top_quaternion(np.ascontiguousarray(m, dtype=np.float64))
    rot = qcp.quaternion_to_rotation(q)
    rot = np.where((n > 0)[:, None, None], rot, np.eye(3)[None])
    trans = cy - np.einsum("sij,sj->si", rot, cx)
    return rot, trans


def superpose(x, y, weights=None, xp=np):
    """Best rigid superposition of each x[s] onto y[s] (all points or weighted), float64.

    The RMSD is that of the returned superposition: from QCP's Rayleigh quotient, and measured on the
    coordinates instead where that formula has cancelled most of its digits (``RMSD^2 <= 1e-6 (G_A +
    G_B) / W``: near-identical sets), as :func:`protgpu.rmsd` and the ``aligned_rmsd_*`` kernel do.

    Parameters
    ----------
    x, y : np.ndarray, shape (S, N, 3)
        Mobile and target coordinates, Angstrom.
    weights : np.ndarray, shape (S, N), optional
        Non-negative pair weights (a 0/1 mask selects a subset).
    xp : module
        NumPy (the only namespace accepted; kept for the callers' signature).

    Returns
    -------
    rotation : np.ndarray, shape (S, 3, 3), float64
        Proper rotations (det +1); the identity where the weights are all zero.
    translation : np.ndarray, shape (S, 3), float64
        ``x @ rotation.T + translation`` is superposed on y.
    rmsd : np.ndarray, shape (S,), float64
        Root-mean-square deviation after superposition over the (weighted) pairs, Angstrom; NaN where
        the weights are all zero (an RMSD over no pairs is undefined, and ``aligned_rmsd_*`` says NaN).
    """
    _check_numpy(xp)
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.ones(x.shape[:2]) if weights is None else np.asarray(weights, dtype=np.float64)
    n = w.sum(axis=1)
    inv_n = 1.0 / np.where(n > 0, n, 1.0)
    cx = np.einsum("sn,sni->si", w, x) * inv_n[:, None]
    cy = np.einsum("sn,sni->si", w, y) * inv_n[:, None]
    xc = x - cx[:, None, :]
    yc = y - cy[:, None, :]
    wxc = xc * w[:, :, None]
    m = np.einsum("sni,snj->sij", wxc, yc)
    ga = np.einsum("sni,sni->s", wxc, xc)
    gb = np.einsum("sni,sni,sn->s", yc, yc, w)
    rmsd, rot = qcp.rmsd_and_rotation(m, ga, gb, inv_n)
    empty = ~(n > 0)
    rot[empty] = np.eye(3)
    rmsd[empty] = np.nan  # NaN never passes the re-measure test below, so it stays
    trans = cy - np.einsum("sij,sj->si", rot, cx)
    small = np.flatnonzero(qcp.near_identical(rmsd, ga + gb, inv_n))
    if small.size:
        d = np.einsum("sij,snj->sni", rot[small], xc[small]) - yc[small]
        rmsd[small] = np.sqrt(np.einsum("sni,sni,sn->s", d, d, w[small]) * inv_n[small])
    return rot, trans, rmsd
