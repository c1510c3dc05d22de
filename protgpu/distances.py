"""Distance matrices and pair distances, exact, with periodic boxes.

Three layers, as everywhere in protgpu: :func:`distances` (validates, picks the backend, converts
back), :func:`distances_numpy` (the NumPy twin: the specification and the CPU path), and the CUDA path
(``kernels/distances.cu``). Every distance comes from a direct coordinate difference, never from
``|a|^2 + |b|^2 - 2 a.b``, so that float32 keeps 1e-4 Angstrom accuracy far from the origin.
"""

from __future__ import annotations

import numpy as np

from ._array import dispatch, to_numpy
from ._autograd import refuse_grad_of, single_tensor, wants_grad
from ._inputs import check_finite, check_shape, coordinates, host_view
from ._memory import check_host_fits, device_budget_bytes, rows_per_chunk
from ._pbc import PBC_NONE, PBC_ORTHO, PBC_TRICLINIC, minimum_image_numpy, normalize_box
from .errors import InputError

__all__ = ["distances"]  # distances_numpy: the CPU twin, for tests (distances(device="cpu"))


# --------------------------------------------------------------------------------------------------
# Input handling shared by both paths


def _as_frames(x, name: str, be):
    """(N, 3) -> (1, N, 3) on the work device; validate (F, N, 3); float32 unless float64 came in.

    Host input is checked for NaN/inf (naming the first bad frame and atom). Device-resident input is not:
    the check would synchronise the caller's stream; NaN there propagates to NaN distances.
    """
    xp = be.xp
    check_shape(x.shape, name)
    check_finite(host_view(x, name), name)
    a = be.asarray(x)
    a = a.astype(xp.float64 if a.dtype == np.float64 else xp.float32, copy=False)
    squeeze = a.ndim == 2
    if squeeze:
        a = a[None]
    return xp.ascontiguousarray(a), squeeze


def _check_pairs(pairs, n_atoms: int, n_frames: int = 1):
    shape = np.shape(pairs) if not hasattr(pairs, "shape") else tuple(pairs.shape)
    if len(shape) == 2:  # the result's size before any copy of an index array that may be huge
        check_host_fits(shape[0] * (4 * n_frames + 16), f"{shape[0]} pairs over {n_frames} frames")
    try:
        p = np.asarray(to_numpy(pairs))
    except (TypeError, ValueError):
        raise InputError("pairs must be a (k, 2) array of integer atom indices") from None
    if p.ndim != 2 or p.shape[1] != 2:
        raise InputError(f"pairs must have shape (k, 2), got {p.shape}")
    if p.size and not np.issubdtype(p.dtype, np.integer):
        raise InputError(f"pairs must be integer atom indices, got dtype {p.dtype}")
    p = p.astype(np.int64)
    if p.size and (p.min() < 0 or p.max() >= n_atoms):
        raise InputError(f"pairs index atoms outside 0..{n_atoms - 1}")
    return np.ascontiguousarray(p)


def _out_shape(n_frames, n, m, pairs):
    return (n_frames, len(pairs)) if pairs is not None else (n_frames, n, m)


def _check_out(out, shape, dtype):
    if out is None:
        return
    if not (isinstance(out, np.ndarray) or type(out).__module__.split(".")[0] == "cupy"):
        raise InputError(f"out= must be a NumPy or CuPy array, got {type(out).__name__}")
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise InputError("out= is read-only")
    if tuple(out.shape) != tuple(shape):
        raise InputError(f"out= has shape {tuple(out.shape)}, the result needs {tuple(shape)}")
    if np.dtype(out.dtype) != np.dtype(dtype):
        raise InputError(f"out= has dtype {out.dtype}, the result is {np.dtype(dtype)}")


# --------------------------------------------------------------------------------------------------
# NumPy twin


def _finish(d2, out):
    """Round the float64 squared distances to the output dtype, then take the square root there.

    This is the kernels' arithmetic: for float32 output the differences and squared norms are exact
    or nearly so in float64, and only the last two roundings happen in float32.
    """
    out[...] = d2
    np.sqrt(out, out=out)


def _frame_matrix_numpy(xf, yf, vec, inv, mode, out):
    """Fill ``out`` (n, m) with distances between rows of xf (n, 3) and yf (m, 3)."""
    xf = xf.astype(np.float64, copy=False)
    yf = yf.astype(np.float64, copy=False)
    if mode == PBC_TRICLINIC:
        d = minimum_image_numpy(yf[None, :, :] - xf[:, None, :], vec, inv, mode)
        _finish(np.einsum("ijk,ijk->ij", d, d), out)
        return
    if mode == PBC_NONE:
        try:
            # scipy's C loop gives the same float64 squared distances ~3x faster than NumPy passes
            from scipy.spatial.distance import cdist
        except ImportError:
            pass
        else:
            _finish(cdist(xf, yf, "sqeuclidean"), out)
            return
    # Per component with preallocated float64 buffers: no (n, m, 3) temporary.
    acc = np.empty(out.shape, dtype=np.float64)
    tmp = np.empty_like(acc)
    for c in range(3):
        target = acc if c == 0 else tmp
        np.subtract(yf[None, :, c], xf[:, None, c], out=target)
        if mode == PBC_ORTHO:
            target -= vec[c, c] * np.rint(target * inv[c, c])
        np.multiply(target, target, out=target)
        if c:
            acc += tmp
    _finish(acc, out)


def distances_numpy(x, y=None, *, pairs=None, box=None, out=None):
    """The NumPy twin of :func:`distances` (also its CPU path).

    Parameters
    ----------
    x : ndarray, shape (F, N, 3)
    y : ndarray, shape (F, M, 3) or (1, M, 3), optional
    pairs : ndarray, shape (K, 2) int64, optional
    box : as :func:`protgpu._pbc.normalize_box` accepts
    out : ndarray, optional
        Preallocated result, (F, N, M) or (F, K).

    Returns
    -------
    ndarray, (F, N, M) or (F, K), dtype of ``x``, Angstrom.
    """
    n_frames, n = x.shape[:2]
    vec, inv, mode = normalize_box(box, n_frames)
    if pairs is not None:
        res = out if out is not None else np.empty((n_frames, len(pairs)), dtype=x.dtype)
        for f in range(n_frames):
            xf = x[f].astype(np.float64, copy=False)
            d = xf[pairs[:, 1]] - xf[pairs[:, 0]]
            if mode:
                b = min(f, len(vec) - 1)
                d = minimum_image_numpy(d, vec[b], inv[b], mode)
            _finish(np.einsum("ij,ij->i", d, d), res[f])
        return res
    yy = x if y is None else y
    m = yy.shape[1]
    res = out if out is not None else np.empty((n_frames, n, m), dtype=x.dtype)
    # Rows in blocks so that the triclinic (rows, m, 27, 3) temporary stays small.
    rows = n if mode != PBC_TRICLINIC else max(1, 2_000_000 // max(m * 27 * 3, 1))
    block = np.empty((min(rows, n), m), dtype=x.dtype)
    for f in range(n_frames):
        yf = yy[f if len(yy) > 1 else 0]
        b = min(f, len(vec) - 1) if mode else 0
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            buf = block[: r1 - r0]
            _frame_matrix_numpy(x[f, r0:r1], yf, vec[b] if mode else None, inv[b] if mode else None, mode, buf)
            res[f, r0:r1] = buf
    return res


# --------------------------------------------------------------------------------------------------
# CUDA path

_BLOCK = 256
# Matrix kernel geometry, from the sweep in benchmarks/bench_distances.py on the H200: 32 rows per block
# and 64 threads (each writing 4 consecutive columns of every row, looping along wide rows) reach
# 2.25 TB/s of stores for 500 x 1000 x 1000, against 1.80 TB/s for 8 rows and 256 threads.
_ROWS_PER_BLOCK = 32
_MATRIX_THREADS = 64


def _distances_cuda(x, y, pairs, box, out_host):
    """Run the kernels on CuPy arrays ``x`` (F, N, 3), ``y`` (Fy, M, 3) or None, ``pairs`` (K, 2).

    Frames go in chunks sized by the device memory budget; with ``out_host`` each chunk is copied into
    it (a NumPy array or memmap) as soon as it is done, so the result never has to fit on the device.
    """
    import cupy

    from . import _cuda

    suffix = "f64" if x.dtype == np.float64 else "f32"
    n_frames, n = x.shape[:2]
    vec, inv, mode = normalize_box(box, n_frames)
    box_d = cupy.asarray(vec.reshape(-1, 9)) if mode else cupy.zeros((1, 9), dtype=np.float64)
    inv_d = cupy.asarray(inv.reshape(-1, 9)) if mode else cupy.zeros((1, 9), dtype=np.float64)
    box_step = 1 if (mode and len(vec) > 1) else 0
    itemsize = x.dtype.itemsize

    if pairs is not None:
        pairs_d = cupy.asarray(pairs)
        k = len(pairs)
        h = _cuda.get_kernel("distances", f"pair_distances_{suffix}")
        per_frame = k * itemsize
        m = None
    else:
        yy = x if y is None else y
        m = yy.shape[1]
        y_step = 1 if len(yy) > 1 else 0
        h = _cuda.get_kernel("distances", f"distance_matrix_{suffix}", {"ROWS_PER_BLOCK": _ROWS_PER_BLOCK})
        # one thread per 4 columns, in whole warps, at most _MATRIX_THREADS (they loop over wider rows)
        threads = int(min(_MATRIX_THREADS, max(32, -(-((m + 3) // 4) // 32) * 32)))
        tiles = -(-n // _ROWS_PER_BLOCK)
        per_frame = n * m * itemsize
    shape = _out_shape(n_frames, n, m, pairs)
    chunk = rows_per_chunk(per_frame, n_frames, device_budget_bytes())
    if out_host is None and chunk >= n_frames:
        result = cupy.empty(shape, dtype=x.dtype)
    else:
        result = None
    for f0 in range(0, n_frames, chunk):
        f1 = min(n_frames, f0 + chunk)
        nf = f1 - f0
        dst = result[f0:f1] if result is not None else cupy.empty((nf, *shape[1:]), dtype=x.dtype)
        bx = box_d[f0:f1] if box_step else box_d
        ix = inv_d[f0:f1] if box_step else inv_d
        if pairs is not None:
            total = nf * k
            grid = max(1, min((total + _BLOCK - 1) // _BLOCK, 65535 * 8))
            if total:
                _cuda.launch(h, grid, _BLOCK, x[f0:f1], pairs_d, bx, ix, dst, nf, n, k, box_step, mode)
        else:
            yf = yy[f0:f1] if y_step else yy
            _cuda.launch(h, nf * tiles, threads, x[f0:f1], yf, bx, ix, dst, nf, n, m, y_step, box_step, mode)
        if result is None:
            out_host[f0:f1] = dst.get()
    return result if result is not None else out_host


# --------------------------------------------------------------------------------------------------
# Public function


def distances(x, y=None, *, pairs=None, box=None, out=None, device: str = "auto"):
    """Exact interatomic distances: self matrices, cross matrices, or selected pairs.

    Parameters
    ----------
    x : array_like or Structure
        Coordinates (N, 3) or (F, N, 3) in Angstrom (NumPy, CuPy or torch), or a Structure (its
        ``coords``). float64 input is computed in float64; anything else in float32.
    y : array_like or Structure, optional
        Second set, (M, 3) or (F, M, 3) (or one frame, used for every frame of ``x``). Gives cross
        matrices (F, N, M).
    pairs : array_like of int, shape (K, 2), optional
        Atom index pairs into ``x``; gives (F, K), as ``mdtraj.compute_distances`` does. Not with ``y``.
    box : array_like, optional
        Periodic box for minimum-image distances: (3,) or (F, 3) orthorhombic lengths, or (3, 3) /
        (F, 3, 3) box vectors (rows a, b, c), in Angstrom (``Structure.box`` has this form).
    out : ndarray or np.memmap, optional
        Preallocated host array for the result (F, N, M) or (F, K), of the result's dtype. Results
        larger than the device memory budget are computed in chunks of frames and copied into it.
    device : {"auto", "cpu", "gpu"}
        Where to compute. ``"auto"`` uses the GPU when one is usable.

    Returns
    -------
    array
        Distances in Angstrom, (N, M) / (K,) for 2-D input, else (F, N, M) / (F, K), of the input's
        array type (``out`` itself when given).

    Raises
    ------
    InputError
        Wrong shapes, NaN coordinates, bad pairs or box.
    MemoryBudgetError
        The result cannot fit in host memory (raised before anything is allocated).

    Notes
    -----
    Differentiable with respect to ``x`` and ``y`` when they are torch tensors that require grad: the
    forward pass is the one above (the same numbers), the backward pass torch operations,
    ``dd_ij/dx_i = -(y_j - x_i)' / d_ij`` with ``'`` the minimum image the forward measured (so the
    gradient of a periodic distance points along the wrapped displacement). A distance of 0 (an atom
    to itself, coincident atoms) is the tip of a cone: its gradient is 0. Not with respect to ``box``
    (an error if it requires grad), and not with ``out=``.

    Examples
    --------
    >>> import numpy as np, protgpu as pg
    >>> x = np.array([[0.0, 0, 0], [3, 4, 0], [0, 0, 1]], dtype=np.float32)
    >>> pg.distances(x, device="cpu")[0]
    array([0., 5., 1.], dtype=float32)
    >>> pg.distances(x, pairs=[[0, 1]], box=[4.0, 4.0, 4.0], device="cpu")
    array([1.], dtype=float32)
    """
    if wants_grad(x, y, box):
        return _distances_with_grad(x, y, pairs, box, out, device)
    x, _, xname = coordinates(x, "x")
    if y is not None:
        y, _, yname = coordinates(y, "y")
    be = dispatch(x, y, device=device)
    xa, squeeze = _as_frames(x, xname, be)
    ya = None
    if y is not None:
        if pairs is not None:
            raise InputError("give either y or pairs, not both")
        ya, _ = _as_frames(y, yname, be)
        ya = ya.astype(xa.dtype, copy=False)
        if len(ya) not in (1, len(xa)):
            raise InputError(f"y has {len(ya)} frames; it needs 1 or as many as x ({len(xa)})")
    n_frames, n = xa.shape[:2]
    pairs_a = _check_pairs(pairs, n, n_frames) if pairs is not None else None
    m = (ya if ya is not None else xa).shape[1]
    shape = _out_shape(n_frames, n, m, pairs_a)
    nbytes = int(np.prod(shape)) * xa.dtype.itemsize
    _check_out(out, shape, xa.dtype)
    if out is None and be.kind in ("numpy", "torch-cpu"):
        check_host_fits(nbytes, f"the distance result {shape}")

    if not be.on_gpu:
        res = distances_numpy(xa, ya, pairs=pairs_a, box=box, out=out)
    elif out is not None:
        res = _distances_cuda(xa, ya, pairs_a, box, out)
    elif be.kind in ("numpy", "torch-cpu") and nbytes > device_budget_bytes():
        # Larger than the device budget: chunks computed on the GPU are gathered on the host.
        res = _distances_cuda(xa, ya, pairs_a, box, np.empty(shape, dtype=xa.dtype))
    else:
        res = _distances_cuda(xa, ya, pairs_a, box, None)
    if out is not None:
        return out
    if squeeze:
        res = res[0]
    return be.wrap(res)



# --------------------------------------------------------------------------------------------------
# Gradients for torch tensors that require grad


def _minimum_image_torch(d, vec, inv, mode):
    """The torch twin of :func:`protgpu._pbc.minimum_image_numpy` (same rules), for the backward pass:
    displacements ``d`` (..., 3) with one box's ``vec`` / ``inv`` (3, 3) tensors."""
    import torch

    if mode == PBC_ORTHO:
        lengths = torch.diagonal(vec)
        return d - lengths * torch.round(d * torch.diagonal(inv))
    s = d @ inv
    d = (s - torch.round(s)) @ vec
    grid = torch.tensor([-1.0, 0.0, 1.0], dtype=d.dtype, device=d.device)
    shifts = torch.cartesian_prod(grid, grid, grid) @ vec  # (27, 3)
    images = d[..., None, :] + shifts
    best = (images * images).sum(-1).argmin(-1)
    return torch.take_along_dim(images, best[..., None, None], dim=-2)[..., 0, :]


def _distances_grad_input(a, dev):
    import torch

    t = a if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(to_numpy(a)))
    t = t.to(dev)
    return t if t.is_floating_point() else t.to(torch.float64)


def _distances_with_grad(x, y, pairs, box, out, device):
    """:func:`distances` when ``x`` or ``y`` is a torch tensor that requires grad (see its Notes)."""
    import torch

    single_tensor(x, "x", "pg.distances")
    single_tensor(y, "y", "pg.distances")
    refuse_grad_of("pg.distances", "box", box)
    if out is not None:
        raise InputError("out= holds a host copy, which cuts the graph: call without out= when inputs require grad")
    x, _, _ = coordinates(x, "x")
    y = None if y is None else coordinates(y, "y")[0]
    dev = next(a.device for a in (x, y) if isinstance(a, torch.Tensor) and a.requires_grad)
    xt = _distances_grad_input(x, dev)
    yt = None if y is None else _distances_grad_input(y, dev)
    if yt is not None:
        yt = yt.to(xt.dtype if xt.dtype == torch.float64 else yt.dtype)
    # the forward: distances() itself on detached inputs (validation, kernels, dtype rules)
    res = distances(xt.detach(), None if yt is None else yt.detach(), pairs=pairs, box=box, device=device)
    res = res.to(dev)
    squeeze = xt.ndim == 2
    n_frames = 1 if squeeze else xt.shape[0]
    pairs_a = None if pairs is None else torch.as_tensor(_check_pairs(pairs, xt.shape[-2], n_frames), device=dev)
    return _distance_function().apply(xt, yt, res, pairs_a, box)


_DISTANCE_FUNCTION = []


def _distance_function():
    """The autograd Function (built on first use: torch is optional)."""
    if _DISTANCE_FUNCTION:
        return _DISTANCE_FUNCTION[0]
    import torch

    class _Distances(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y, res, pairs, box):
            ctx.save_for_backward(x, y, res, pairs)
            ctx.box = box
            return res.clone()

        @staticmethod
        def backward(ctx, grad):
            x, y, res, pairs = ctx.saved_tensors
            gx, gy = _distances_backward(x, y, res, pairs, ctx.box, grad)
            return (gx if ctx.needs_input_grad[0] else None), (gy if ctx.needs_input_grad[1] else None), \
                None, None, None

    _DISTANCE_FUNCTION.append(_Distances)
    return _Distances


def _distances_backward(x, y, res, pairs, box, grad):
    """Gradients of the distances ``res`` with respect to ``x`` and ``y`` (None when absent), torch."""
    import torch

    squeeze = x.ndim == 2
    x3 = x[None] if squeeze else x
    g = (grad[None] if squeeze else grad).to(x.dtype)
    d = (res[None] if squeeze else res).to(x.dtype)
    n_frames = x3.shape[0]
    vec, inv, mode = normalize_box(box, n_frames)
    if mode:
        vec_t = torch.as_tensor(vec, dtype=x.dtype, device=x.device)
        inv_t = torch.as_tensor(inv, dtype=x.dtype, device=x.device)
    # d(d_ij)/d(end point) is the unit displacement; the cone's tip (d = 0) gives 0
    wgt = torch.where(d > 0, g / torch.where(d > 0, d, 1.0), 0.0)
    if pairs is not None:
        a, b = pairs[:, 0], pairs[:, 1]
        disp = x3[:, b] - x3[:, a]
        if mode:
            disp = torch.stack([_minimum_image_torch(disp[f], vec_t[min(f, len(vec) - 1)],
                                                     inv_t[min(f, len(vec) - 1)], mode) for f in range(n_frames)])
        gk = wgt[..., None] * disp
        gx = torch.zeros_like(x3).index_add_(1, b, gk).index_add_(1, a, -gk)
        return (gx[0] if squeeze else gx), None
    y3 = x3 if y is None else (y[None] if y.ndim == 2 else y)
    if not mode:
        # sum_j w_ij (x_i - y_j) without the (F, N, M, 3) displacements
        gx = x3 * wgt.sum(-1, keepdim=True) - wgt @ y3
        gy = y3 * wgt.sum(-2)[..., None] - wgt.transpose(-1, -2) @ x3
    else:
        gx = torch.empty_like(x3)
        gy = torch.empty((n_frames, *y3.shape[1:]), dtype=x3.dtype, device=x3.device)
        for f in range(n_frames):
            b = min(f, len(vec) - 1)
            disp = _minimum_image_torch(y3[min(f, len(y3) - 1)][None, :, :] - x3[f][:, None, :], vec_t[b], inv_t[b],
                                        mode)
            wd = wgt[f][..., None] * disp
            gx[f], gy[f] = -wd.sum(1), wd.sum(0)
    if y is None:
        return ((gx + gy)[0] if squeeze else gx + gy), None
    if len(y3) == 1 and n_frames > 1:
        gy = gy.sum(0, keepdim=True)
    gx = gx[0] if squeeze else gx
    gy = gy[0] if y.ndim == 2 else gy
    return gx, gy.to(y.dtype)
