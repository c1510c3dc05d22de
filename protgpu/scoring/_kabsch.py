"""Batched optimal superposition (Kabsch problem) in float64, solved through the quaternion key matrix.

This is the scoring package's own small helper (the TM-score search needs thousands of superpositions
of masked subsets at once); it is deliberately independent of :mod:`protgpu.superpose`. The NumPy path
takes the eigenvector of the largest eigenvalue of the 4x4 key matrix K with ``eigh`` (exact and robust
for every input, including degenerate ones); the CUDA kernel solves the same problem with QCP's
Newton iteration (SCORING.md), and the parity tests hold the two equal.
"""

from __future__ import annotations

import numpy as np


def key_matrix(m, xp=np):
    """The 4x4 symmetric key matrix K of SCORING.md from centred cross-covariances.

    Parameters
    ----------
    m : array, shape (..., 3, 3), float64
        ``m[..., a, b] = sum_i (x_ia - xbar_a) (y_ib - ybar_b)`` with x the mobile and y the target
        coordinates (Angstrom^2).

    Returns
    -------
    array, shape (..., 4, 4), float64
    """
    sxx, sxy, sxz = m[..., 0, 0], m[..., 0, 1], m[..., 0, 2]
    syx, syy, syz = m[..., 1, 0], m[..., 1, 1], m[..., 1, 2]
    szx, szy, szz = m[..., 2, 0], m[..., 2, 1], m[..., 2, 2]
    k = xp.empty(m.shape[:-2] + (4, 4), dtype=xp.float64)
    k[..., 0, 0] = sxx + syy + szz
    k[..., 0, 1] = k[..., 1, 0] = syz - szy
    k[..., 0, 2] = k[..., 2, 0] = szx - sxz
    k[..., 0, 3] = k[..., 3, 0] = sxy - syx
    k[..., 1, 1] = sxx - syy - szz
    k[..., 1, 2] = k[..., 2, 1] = sxy + syx
    k[..., 1, 3] = k[..., 3, 1] = szx + sxz
    k[..., 2, 2] = -sxx + syy - szz
    k[..., 2, 3] = k[..., 3, 2] = syz + szy
    k[..., 3, 3] = -sxx - syy + szz
    return k


def quaternion_to_rotation(q, xp=np):
    """Rotation matrices from unit quaternions ``(w, x, y, z)``, shape (..., 4) -> (..., 3, 3)."""
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    r = xp.empty(q.shape[:-1] + (3, 3), dtype=xp.float64)
    r[..., 0, 0] = w * w + x * x - y * y - z * z
    r[..., 0, 1] = 2 * (x * y - w * z)
    r[..., 0, 2] = 2 * (x * z + w * y)
    r[..., 1, 0] = 2 * (x * y + w * z)
    r[..., 1, 1] = w * w - x * x + y * y - z * z
    r[..., 1, 2] = 2 * (y * z - w * x)
    r[..., 2, 0] = 2 * (x * z - w * y)
    r[..., 2, 1] = 2 * (y * z + w * x)
    r[..., 2, 2] = w * w - x * x - y * y + z * z
    return r


def superpose_from_sums(n, sx, sy, sxy, xp=np):
    """Best rigid superposition of x onto y from the sums over the (weighted) point pairs.

    Working from sums lets a caller superpose many masked subsets of the same pairs with one matrix
    product (``mask @ per_pair_terms``) instead of gathering every subset.

    Parameters
    ----------
    n : array, shape (S,)
        Number (total weight) of pairs in each subset. Subsets with ``n == 0`` get the identity.
    sx, sy : array, shape (S, 3)
        Sums of the mobile (x) and target (y) coordinates over each subset, Angstrom.
    sxy : array, shape (S, 3, 3)
        ``sum_i x_i y_i^T`` over each subset (raw, not centred), Angstrom^2.

    Returns
    -------
    rotation : array, shape (S, 3, 3), float64
        Proper rotations (det +1).
    translation : array, shape (S, 3), float64
        With ``x @ rotation.T + translation`` the superposed mobile coordinates, Angstrom.
    """
    n = xp.asarray(n, dtype=xp.float64)
    safe = xp.where(n > 0, n, 1.0)
    cx = sx / safe[:, None]
    cy = sy / safe[:, None]
    # centred cross-covariance; float64 sums of float32-exact products keep the cancellation harmless
    m = sxy - n[:, None, None] * cx[:, :, None] * cy[:, None, :]
    k = key_matrix(m, xp)
    _, vecs = xp.linalg.eigh(k)
    q = vecs[..., :, -1]  # eigenvector of the largest eigenvalue
    rot = quaternion_to_rotation(q, xp)
    rot = xp.where((n > 0)[:, None, None], rot, xp.eye(3)[None])
    trans = cy - xp.einsum("sij,sj->si", rot, cx)
    return rot, trans


def superpose(x, y, weights=None, xp=np):
    """Best rigid superposition of each x[s] onto y[s] (all points or weighted), float64.

    Parameters
    ----------
    x, y : array, shape (S, N, 3)
        Mobile and target coordinates, Angstrom.
    weights : array, shape (S, N), optional
        Non-negative pair weights (a 0/1 mask selects a subset).

    Returns
    -------
    rotation : array, shape (S, 3, 3)
    translation : array, shape (S, 3)
        ``x @ rotation.T + translation`` is superposed on y.
    rmsd : array, shape (S,)
        Root-mean-square deviation after superposition over the (weighted) pairs, Angstrom.
    """
    x = xp.asarray(x, dtype=xp.float64)
    y = xp.asarray(y, dtype=xp.float64)
    w = xp.ones(x.shape[:2]) if weights is None else xp.asarray(weights, dtype=xp.float64)
    n = w.sum(axis=1)
    xw = x * w[:, :, None]
    sx = xw.sum(axis=1)
    sy = (y * w[:, :, None]).sum(axis=1)
    sxy = xp.einsum("sni,snj->sij", xw, y)
    rot, trans = superpose_from_sums(n, sx, sy, sxy, xp)
    moved = xp.einsum("sij,snj->sni", rot, x) + trans[:, None, :]
    d2 = ((moved - y) ** 2).sum(axis=2)
    rmsd = xp.sqrt((w * d2).sum(axis=1) / xp.where(n > 0, n, 1.0))
    return rot, trans, rmsd
