"""All-vs-all RMSD after optimal superposition, :func:`pairwise_rmsd`: validates, picks the CPU path
(:mod:`.pairwise_cpu`), one GPU (:mod:`.pairwise_gpu`) or several (:mod:`.multigpu`), and converts
back.
"""

from __future__ import annotations

import numpy as np

from .._array import dispatch, is_cupy_array, to_numpy
from .._autograd import refuse_grad
from .._inputs import check_finite, check_shape, coordinates, host_view
from ..errors import InputError
from ._prepare import resolve_selection, resolve_weights
from .multigpu import device_ids, pairwise_multi_gpu
from .pairwise_cpu import pairwise_numpy
from .pairwise_gpu import pairwise_cuda


def _check_out(out, shape, condensed: bool):
    if out is None:
        return
    if not (hasattr(out, "shape") and hasattr(out, "dtype") and hasattr(out, "__setitem__")):
        raise InputError("out= must be an array-like with shape, dtype and item assignment "
                         "(np.ndarray, np.memmap, Zarr array)")
    if tuple(out.shape) != tuple(shape):
        what = "condensed " if condensed else ""
        raise InputError(f"out= has shape {tuple(out.shape)}, the {what}RMSD result needs {tuple(shape)}")
    if np.dtype(out.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise InputError(f"out= must be float32 or float64, not {out.dtype}")
    if is_cupy_array(out):
        raise InputError("out= is for host destinations (np.memmap, Zarr); a CuPy result is returned "
                         "when the input is CuPy")


def pairwise_rmsd(x, y=None, *, fit=None, weights=None, out=None, precision: str = "float64",
                  condensed: bool = False, device: str = "auto", devices=None):
    """All-vs-all RMSD after optimal superposition of every pair of frames (QCP on GEMM blocks).

    The centred frames are stacked as a (3F, N) matrix; one matrix product ``A B^T`` (cuBLAS on the
    GPU, NumPy's BLAS on the CPU) holds every pair's 3x3 correlation block ``M``, and a QCP step per
    block (the ``qcp_pairs`` kernel, or its vectorised NumPy twin) turns it and the two traces into
    the RMSD. With ``y`` None each pair is computed once (triangular tiles) and mirrored.

    Parameters
    ----------
    x : array (frames, atoms, 3), Structure, list of Structures
        Angstrom.
    y : same, optional
        Second set of frames, same atoms: an (F, G) matrix. Default: ``x`` against itself.
    fit : str or array_like, optional
        Atoms used (selection string with Structures, index array or mask); default all.
    weights : array_like (atoms,), optional
        Per-atom weights (of the full atom list or of the selection).
    out : np.ndarray, np.memmap or Zarr array, optional
        Destination, float32 or float64, shape (F, G) or condensed (F (F - 1) / 2,); filled tile by
        tile (on the GPU the copies overlap the compute), so the result never has to fit in device
        memory. Returned as given. A condensed destination in page-locked memory
        (``cupyx.empty_pinned``) is written by the GPUs' copy engines directly, without staging
        buffers or host-side copies: the fastest way to take a large result into host memory, as
        a pageable destination is bound by the host's memory-copy bandwidth (tens of GB/s).
    precision : {"float64", "float32"}
        dtype of the GEMM. float64 (default) keeps every RMSD within ~1e-6 Angstrom of a float64
        Kabsch reference, and is nearly free on GPUs with FP64 tensor cores; float32 blocks lose up
        to ~5e-3 Angstrom for near-identical frames (the cancellation in ``G_A + G_B - 2 l_max``) and
        ~1e-4 elsewhere. The QCP step is float64 either way.
    condensed : bool
        Return SciPy's condensed vector (pairs i < j, row by row) instead of the square matrix;
        ``y`` must be None.
    device : {"auto", "cpu", "gpu"}
    devices : "all", int or list of int, optional
        GPUs to spread the tiles over (GPU runs with a host result: NumPy input or ``out=``): "all", the
        first n, or ordinals. Each GPU takes row tiles from a shared queue and writes its finished
        tiles into the same destination. Default: the current GPU only.

    Returns
    -------
    array, shape (F, G) (or (F, F)) or (F (F - 1) / 2,), float32, Angstrom
        float32 (values are accurate far beyond float32's 6e-8 relative rounding) unless ``out`` is
        float64. Same array type as ``x``. With ``y`` None the matrix is exactly symmetric with a zero
        diagonal.

    Raises
    ------
    InputError
        Atom counts differing, ``condensed`` with ``y``, bad ``out``, NaN coordinates (host input),
        bad ``precision``.
    MemoryBudgetError
        A CuPy-resident result that does not fit in the device budget without ``out=``, or a host
        result larger than free memory.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(4, 10, 3))
    >>> d = pairwise_rmsd(x, device="cpu")
    >>> d.shape, bool(np.allclose(d, d.T)), float(d[0, 0])
    ((4, 4), True, 0.0)
    """
    refuse_grad("pg.pairwise_rmsd", x, y, weights)
    if precision not in ("float32", "float64"):
        raise InputError(f"precision must be 'float32' or 'float64', not {precision!r}")
    if condensed and y is not None:
        raise InputError("condensed=True needs y=None (a condensed vector holds one symmetric matrix)")
    xa, xs, xname = coordinates(x, "x")
    ya, ys, yname = coordinates(y, "y") if y is not None else (None, None, None)
    be = dispatch(xa, ya, device=device)
    xshape = tuple(getattr(xa, "shape", None) or np.shape(xa))
    check_shape(xshape, xname)
    if y is not None:
        yshape = tuple(getattr(ya, "shape", None) or np.shape(ya))
        check_shape(yshape, yname)
    n_x = xshape[-2]
    fit_x = resolve_selection(fit, xs, n_x, xname, "fit", other=None if y is None else ys)
    if y is not None:
        fit_y = resolve_selection(fit, ys, yshape[-2], yname, "fit", other=xs)
        nx = n_x if fit_x is None else len(fit_x)
        ny = yshape[-2] if fit_y is None else len(fit_y)
        if nx != ny:
            raise InputError(f"x and y differ in atom count after selection: {xname} has {nx}, {yname} has {ny}")
    w = resolve_weights(weights, n_x, fit_x, xname)

    # Per input (x, then y): its name where the GPU path checks it for NaN on the device (host float
    # input, by the traces of the centred frames: check_traces), else None.
    check_names = []

    def frames(arr, shape, name, sel):
        host = host_view(arr, name)
        if not be.on_gpu:
            check_finite(host, name, sel)
        check_names.append(name if be.on_gpu and host is not None and host.dtype.kind == "f" else None)
        a = host if host is not None else arr
        if host is None and be.kind.startswith("torch"):
            a = be.asarray(a)
        if isinstance(a, np.ndarray) and a.dtype.kind != "f":
            a = a.astype(np.float64)
        return a if len(shape) == 3 else a[None]

    xx = frames(xa, xshape, xname, fit_x)
    yy = None
    if y is not None:
        yy = frames(ya, yshape, yname, fit_y)
        if fit_y is not None and fit_x is not None and not np.array_equal(fit_x, fit_y):
            # Different index sets on the two sides: gather both, then fit on all.
            xx, yy = xx[:, fit_x], yy[:, fit_y]
            fit_x = None
    f = xx.shape[0]
    g = f if y is None else yy.shape[0]
    shape = (f * (f - 1) // 2,) if condensed else (f, g)
    _check_out(out, shape, condensed)
    check_names = (check_names[0], check_names[1] if y is not None else None)
    if be.on_gpu:
        ids = device_ids(devices)
        host_result = be.kind == "numpy" or out is not None
        if len(ids) > 1:
            if not host_result:
                raise InputError(f"devices={devices!r}: several GPUs write into host memory; pass NumPy "
                                 "coordinates or out= (an np.ndarray, np.memmap or Zarr array)")
            res = pairwise_multi_gpu(to_numpy(xx), None if yy is None else to_numpy(yy), fit=fit_x, weights=w,
                                      precision=precision, out=out, condensed=condensed, devices=ids,
                                      check_names=check_names)
        else:
            import cupy as cp

            with cp.cuda.Device(ids[0]):
                res = pairwise_cuda(xx, yy, fit=fit_x, weights=w, precision=precision, out=out,
                                     condensed=condensed, host_result=host_result, check_names=check_names)
    elif devices is not None:
        raise InputError("devices= is for GPU runs (device='gpu' or 'auto' with a GPU)")
    else:
        if not isinstance(xx, np.ndarray):
            xx = np.asarray(be.asarray(xx))
        if yy is not None and not isinstance(yy, np.ndarray):
            yy = np.asarray(be.asarray(yy))
        res = pairwise_numpy(xx, yy, fit=fit_x, weights=w, precision=precision, out=out, condensed=condensed)
    if out is not None:
        return out
    return be.wrap(res)
