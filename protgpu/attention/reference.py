"""The NumPy twin of :func:`protgpu.attention` (:func:`attention_numpy`: the specification and the CPU
path, float64 inside) and bfloat16 as raw 16-bit words (NumPy has no bfloat16; CuPy may not either).

Internal API (tests, benchmarks): :func:`bf16_bits_to_float32`, :func:`float32_to_bf16_bits`.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["attention_backward_numpy", "attention_lse_numpy", "attention_numpy"]


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


def _batched(q, k, v, coords, gamma, mask, scale, ct, coords_float32: bool):
    """The operands batched in compute dtype ``ct``: q, k, v (B, L, H, d), x (B, L, 3), keep (B, L),
    gamma (H,), scale, and whether the caller gave unbatched (L, H, d) input."""
    q = np.asarray(q)
    squeeze = q.ndim == 3
    qc, kc, vc = (np.asarray(a).astype(ct)[None] if squeeze else np.asarray(a).astype(ct) for a in (q, k, v))
    B, L, H, d = qc.shape
    x = np.asarray(coords)
    # The kernels read float32 coordinates; the gradient's specification keeps them in ``ct`` (finite
    # differences in float64 need the unrounded values).
    x = (x.astype(np.float32) if coords_float32 else x).astype(ct)
    if x.ndim == 2:
        x = x[None]
    x = np.broadcast_to(x, (B, L, 3))
    keep = np.ones((B, L), dtype=bool) if mask is None else np.broadcast_to(np.asarray(mask, dtype=bool), (B, L))
    g = np.broadcast_to(np.asarray(gamma, dtype=np.float64), (H,)).astype(ct)
    sc = ct.type(1.0 / math.sqrt(d) if scale is None else scale)
    return qc, kc, vc, x, keep, g, sc, squeeze


def _row_blocks(L: int):
    """Query-row blocks that keep the (rows, L, 3) temporaries near 2^20 elements."""
    rows = max(1, min(L, (1 << 20) // L))
    for i0 in range(0, L, rows):
        yield i0, min(L, i0 + rows)


def _block_d2(xb, i0, i1, keep_b, c2):
    """Squared distances (rows, L) of query rows i0:i1 to every key, and which pairs are excluded."""
    diff = xb[i0:i1, None, :] - xb[None, :, :]
    d2 = diff[..., 0] * diff[..., 0] + diff[..., 1] * diff[..., 1] + diff[..., 2] * diff[..., 2]
    invalid = np.broadcast_to(~keep_b[None, :], d2.shape)
    if c2 is not None:
        invalid = invalid | (d2 > c2)
    return d2, invalid


def _forward(qc, kc, vc, x, keep, g, sc, cutoff, ct, return_weights: bool):
    """Attention on batched operands; returns (out, lse (B, H, L), weights or None)."""
    B, L, H, d = qc.shape
    c2 = None if cutoff is None else ct.type(float(cutoff) ** 2)
    ninf = ct.type(-np.inf)
    out = np.empty((B, L, H, d), dtype=ct)
    lse = np.empty((B, H, L), dtype=ct)
    weights = np.empty((B, H, L, L), dtype=ct) if return_weights else None
    for b in range(B):
        for i0, i1 in _row_blocks(L):
            d2, invalid = _block_d2(x[b], i0, i1, keep[b], c2)
            for h in range(H):
                t = sc * (qc[b, i0:i1, h] @ kc[b, :, h].T) - g[h] * d2
                t = np.where(invalid, ninf, t)
                mx = t.max(axis=1, keepdims=True)
                mx = np.where(np.isfinite(mx), mx, ct.type(0))  # all keys masked: exp(-inf) = 0, no NaN
                p = np.exp(t - mx)
                z = p.sum(axis=1, keepdims=True)
                w = np.divide(p, z, out=np.zeros_like(p), where=z > 0)
                out[b, i0:i1, h] = w @ vc[b, :, h]
                with np.errstate(divide="ignore"):
                    lse[b, h, i0:i1] = (mx + np.log(z))[:, 0]  # log(0) = -inf: a row with no key
                if weights is not None:
                    weights[b, h, i0:i1] = w
    return out, lse, weights


def attention_numpy(q, k, v, coords, *, gamma, cutoff=None, mask=None, scale=None, return_weights=False,
                    return_lse=False, dtype=np.float64):
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
    return_lse : bool
        Also return the log-sum-exp of each row's logits (natural log; -inf for a row with no key), the
        backward's input (see :func:`attention_backward_numpy`).
    dtype : dtype
        Compute (and result) dtype; float64 is the reference, float32 the "same precision" run.

    Returns
    -------
    out : ndarray, shape of ``q``, ``dtype``
    weights : ndarray, shape (B, H, L, L) or (H, L, L), ``dtype`` (only with ``return_weights``)
    lse : ndarray, shape (B, H, L) or (H, L), ``dtype`` (only with ``return_lse``; last)

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
    qc, kc, vc, x, keep, g, sc, squeeze = _batched(q, k, v, coords, gamma, mask, scale, ct, coords_float32=True)
    out, lse, weights = _forward(qc, kc, vc, x, keep, g, sc, cutoff, ct, return_weights)
    if squeeze:
        out, lse = out[0], lse[0]
        weights = weights[0] if weights is not None else None
    res = (out,) + ((weights,) if return_weights else ()) + ((lse,) if return_lse else ())
    return res if len(res) > 1 else out


def attention_lse_numpy(q, k, v, coords, gamma, cutoff=None, mask=None, scale=None, dtype=np.float64):
    """Forward with log-sum-exp, the specification the backward pairs with: as :func:`attention_numpy`
    with ``return_lse=True``, except that the coordinates stay in ``dtype`` (not rounded to float32
    first), so that finite differences in float64 see the function the gradient describes.

    Parameters
    ----------
    q, k, v, coords, gamma, cutoff, mask, scale, dtype
        As :func:`attention_numpy`.

    Returns
    -------
    out : ndarray, shape of ``q``
    lse : ndarray, shape (B, H, L) or (H, L): ``log(sum_j exp(logit_ij))``, -inf for a row with no key.

    Examples
    --------
    Four residues, one head; residue 3 is padding, and the weights are ``exp(logits - lse)``:

    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> q, k, v = (rng.normal(size=(4, 1, 2)) for _ in range(3))
    >>> x = np.arange(12.0).reshape(4, 3)
    >>> out, lse = attention_lse_numpy(q, k, v, x, [0.01], mask=[True, True, True, False])
    >>> out.shape, lse.shape
    ((4, 1, 2), (1, 4))
    >>> _, w = attention_numpy(q, k, v, x, gamma=[0.01], mask=[True, True, True, False], return_weights=True)
    >>> bool(np.allclose(w.sum(-1), 1.0)), bool(np.isfinite(lse).all())
    (True, True)
    """
    ct = np.dtype(dtype)
    qc, kc, vc, x, keep, g, sc, squeeze = _batched(q, k, v, coords, gamma, mask, scale, ct, coords_float32=False)
    out, lse, _ = _forward(qc, kc, vc, x, keep, g, sc, cutoff, ct, False)
    return (out[0], lse[0]) if squeeze else (out, lse)


def attention_backward_numpy(q, k, v, coords, gamma, cutoff, mask, scale, out, lse, dout, dtype=np.float64):
    """Gradients of attention (``docs/design/differentiable.md``; the kernels' specification).

    With ``P = exp(logits - lse)``, ``Delta_i = dO_i . out_i`` and ``dS_ij = P_ij (dO_i . v_j - Delta_i)``:
    ``dV_j = sum_i P_ij dO_i``, ``dQ_i = scale sum_j dS_ij k_j``, ``dK_j = scale sum_i dS_ij q_i``,
    ``dgamma_h = -sum dS_hij |x_i - x_j|^2`` and
    ``dx_i = -2 sum_h gamma_h sum_j (dS_hij + dS_hji) (x_i - x_j)``. The mask and the cutoff are steps:
    no gradient flows through them, and a row with no key gives zeros.

    Parameters
    ----------
    q, k, v, coords, gamma, cutoff, mask, scale
        The forward's inputs (as :func:`attention_lse_numpy`; coordinates kept in ``dtype``).
    out, lse : ndarray
        The forward's results (:func:`attention_lse_numpy`).
    dout : ndarray, shape of ``q``
        Gradient of the loss with respect to ``out``.
    dtype : dtype
        Compute (and result) dtype.

    Returns
    -------
    dq, dk, dv : ndarray, shape of ``q``
    dcoords : ndarray, shape of ``coords`` (a shared (L, 3) gets the sum over the batch)
    dgamma : ndarray, shape (H,)

    Examples
    --------
    The gradient of ``sum(out * dout)`` with respect to gamma, against a central finite difference:

    >>> import numpy as np
    >>> rng = np.random.default_rng(2)
    >>> q, k, v = (rng.normal(size=(6, 2, 4)) for _ in range(3))
    >>> x, g, dout = rng.normal(size=(6, 3)) * 3, np.array([0.05, 0.2]), rng.normal(size=(6, 2, 4))
    >>> out, lse = attention_lse_numpy(q, k, v, x, g)
    >>> dq, dk, dv, dx, dg = attention_backward_numpy(q, k, v, x, g, None, None, None, out, lse, dout)
    >>> f = lambda g: (attention_lse_numpy(q, k, v, x, g)[0] * dout).sum()
    >>> fd = (f(g + [1e-6, 0]) - f(g - [1e-6, 0])) / 2e-6
    >>> bool(abs(dg[0] - fd) < 1e-6), dx.shape
    (True, (6, 3))
    """
    ct = np.dtype(dtype)
    qc, kc, vc, x, keep, g, sc, squeeze = _batched(q, k, v, coords, gamma, mask, scale, ct, coords_float32=False)
    oc, doc = (np.asarray(a).astype(ct)[None] if squeeze else np.asarray(a).astype(ct) for a in (out, dout))
    lc = np.asarray(lse).astype(ct)[None] if squeeze else np.asarray(lse).astype(ct)
    B, L, H, d = qc.shape
    c2 = None if cutoff is None else ct.type(float(cutoff) ** 2)
    dq, dk, dv = (np.zeros((B, L, H, d), dtype=ct) for _ in range(3))
    dx = np.zeros((B, L, 3), dtype=ct)
    dg = np.zeros(H, dtype=ct)
    delta = np.einsum("bihc,bihc->bhi", doc, oc)
    for b in range(B):
        xb = x[b]
        for i0, i1 in _row_blocks(L):
            d2, invalid = _block_d2(xb, i0, i1, keep[b], c2)
            acc = np.zeros((i1 - i0, L), dtype=ct)  # sum_h gamma_h dS_h: the coordinates' share
            for h in range(H):
                t = sc * (qc[b, i0:i1, h] @ kc[b, :, h].T) - g[h] * d2
                ls = lc[b, h, i0:i1, None]
                # A row with no key (lse = -inf) has P = 0, not exp(-inf + inf).
                p = np.where(invalid | ~np.isfinite(ls), ct.type(0), np.exp(t - np.where(np.isfinite(ls), ls, 0)))
                do = doc[b, i0:i1, h]
                dv[b, :, h] += p.T @ do
                ds = p * (do @ vc[b, :, h].T - delta[b, h, i0:i1, None])
                dq[b, i0:i1, h] = sc * (ds @ kc[b, :, h])
                dk[b, :, h] += sc * (ds.T @ qc[b, i0:i1, h])
                dg[h] -= (ds * d2).sum()
                acc += g[h] * ds
            # d|x_i - x_j|^2 / dx_i = 2 (x_i - x_j): rows get it as queries, columns as keys.
            xr = xb[i0:i1]
            dx[b, i0:i1] += -2.0 * (acc.sum(axis=1)[:, None] * xr - acc @ xb)
            dx[b] += -2.0 * (acc.sum(axis=0)[:, None] * xb - acc.T @ xr)
    cshape = np.shape(coords)
    # A shared or broadcast coordinate set gets the sum over the batch entries that read it.
    dx = dx.sum(axis=0) if len(cshape) == 2 else dx.sum(axis=0, keepdims=True) if cshape[0] != B else dx
    if squeeze:
        dq, dk, dv = dq[0], dk[0], dv[0]
    return dq, dk, dv, dx, dg
