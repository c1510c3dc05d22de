"""The NumPy twin of :func:`protgpu.attention` (:func:`attention_numpy`: the specification and the CPU
path, float64 inside) and bfloat16 as raw 16-bit words (NumPy has no bfloat16; CuPy may not either).

Internal API (tests, benchmarks): :func:`bf16_bits_to_float32`, :func:`float32_to_bf16_bits`.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["attention_numpy"]


def bf16_bits_to_float32(bits, xp=np):
    """bfloat16 bit patterns (uint16) to float32, exactly (the 16 bits are the float32's high half).

    Parameters
    ----------
    bits : ndarray of uint16 (NumPy or CuPy, per ``xp``)
    xp : module
        ``numpy`` or ``cupy``.

    Returns
    -------
    ndarray of float32, same shape.
    """
    return (xp.asarray(bits).astype(xp.uint32) << 16).view(xp.float32)


def float32_to_bf16_bits(x, xp=np):
    """float32 values to bfloat16 bit patterns (uint16), rounding to nearest even as CUDA's
    ``__float2bfloat16`` does; infinities stay infinite, NaN stays a (quiet) NaN of the same sign.

    Parameters
    ----------
    x : ndarray (NumPy or CuPy, per ``xp``), converted to float32 first
    xp : module

    Returns
    -------
    ndarray of uint16, same shape.
    """
    f = xp.ascontiguousarray(xp.asarray(x, dtype=xp.float32))
    u = f.view(xp.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even, in integer arithmetic;
    # the carry propagates into the exponent (and to infinity) exactly as IEEE rounding would.
    rounded = (u + (xp.uint32(0x7FFF) + ((u >> 16) & xp.uint32(1)))) >> 16
    quiet_nan = (u >> 16) | xp.uint32(0x0040)
    return xp.where(xp.isnan(f), quiet_nan, rounded).astype(xp.uint16)


def attention_numpy(q, k, v, coords, *, gamma, cutoff=None, mask=None, scale=None, return_weights=False,
                    dtype=np.float64):
    """The NumPy twin of :func:`~protgpu.attention.api.attention` (also its CPU path), computing in ``dtype``.

    Parameters
    ----------
    q, k, v : ndarray, shape (B, L, H, d) or (L, H, d)
        Queries, keys, values (any float dtype; converted to ``dtype``).
    coords : ndarray, shape (B, L, 3) or (L, 3)
        Residue coordinates in Angstrom; taken as float32 (the kernels' input), then ``dtype``.
    gamma : float or ndarray, shape (H,)
        Distance penalty per head, per Angstrom^2.
    cutoff : float, optional
        Keys farther than this (Angstrom) are excluded.
    mask : ndarray of bool, shape (B, L) or (L,), optional
        False marks padding keys.
    scale : float, optional
        Multiplies ``q . k``; default ``1 / sqrt(d)``.
    return_weights : bool
        Also return the weights.
    dtype : dtype
        Compute (and result) dtype; float64 is the reference, float32 the "same precision" run.

    Returns
    -------
    out : ndarray, shape of ``q``, ``dtype``
    weights : ndarray, shape (B, H, L, L) or (H, L, L), ``dtype`` (only with ``return_weights``)

    Examples
    --------
    Six residues, two heads; the second head penalises distance and ignores keys beyond 5 Angstrom:

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.normal(size=(6, 2, 4)) for _ in range(3))
    >>> x = np.cumsum(rng.normal(size=(6, 3)) * 2.2, axis=0)
    >>> out, w = attention_numpy(q, k, v, x, gamma=np.array([0.0, 0.1]), cutoff=5.0, return_weights=True)
    >>> out.shape, w.shape, out.dtype
    ((6, 2, 4), (2, 6, 6), dtype('float64'))
    >>> np.linalg.norm(x - x[0], axis=1).round(1).tolist()  # distances from residue 0
    [0.0, 3.0, 1.9, 3.8, 5.8, 9.0]
    >>> w[1, 0].round(3).tolist()  # residue 0's weights in head 1: zero past the cutoff
    [0.196, 0.309, 0.19, 0.304, 0.0, 0.0]
    """
    ct = np.dtype(dtype)
    q = np.asarray(q)
    squeeze = q.ndim == 3
    qc, kc, vc = (np.asarray(a).astype(ct)[None] if squeeze else np.asarray(a).astype(ct) for a in (q, k, v))
    B, L, H, d = qc.shape
    x = np.asarray(coords, dtype=np.float32).astype(ct)
    if x.ndim == 2:
        x = np.broadcast_to(x[None], (B, L, 3))
    keep = np.ones((B, L), dtype=bool) if mask is None else np.broadcast_to(np.asarray(mask, dtype=bool), (B, L))
    g = np.broadcast_to(np.asarray(gamma, dtype=np.float64), (H,)).astype(ct)
    sc = ct.type(1.0 / math.sqrt(d) if scale is None else scale)
    c2 = None if cutoff is None else ct.type(float(cutoff) ** 2)
    ninf = ct.type(-np.inf)

    out = np.empty((B, L, H, d), dtype=ct)
    weights = np.empty((B, H, L, L), dtype=ct) if return_weights else None
    rows = max(1, min(L, (1 << 20) // L))  # query rows per block: keeps the (rows, L, 3) temporary small
    for b in range(B):
        xb = x[b]
        for i0 in range(0, L, rows):
            i1 = min(L, i0 + rows)
            diff = xb[i0:i1, None, :] - xb[None, :, :]
            d2 = diff[..., 0] * diff[..., 0] + diff[..., 1] * diff[..., 1] + diff[..., 2] * diff[..., 2]
            invalid = np.broadcast_to(~keep[b][None, :], d2.shape)
            if c2 is not None:
                invalid = invalid | (d2 > c2)
            for h in range(H):
                t = sc * (qc[b, i0:i1, h] @ kc[b, :, h].T) - g[h] * d2
                t = np.where(invalid, ninf, t)
                mx = t.max(axis=1, keepdims=True)
                mx = np.where(np.isfinite(mx), mx, ct.type(0))  # all keys masked: exp(-inf) = 0, no NaN
                p = np.exp(t - mx)
                z = p.sum(axis=1, keepdims=True)
                w = np.divide(p, z, out=np.zeros_like(p), where=z > 0)
                out[b, i0:i1, h] = w @ vc[b, :, h]
                if weights is not None:
                    weights[b, h, i0:i1] = w
    if squeeze:
        out = out[0]
        weights = weights[0] if weights is not None else None
    return (out, weights) if return_weights else out
