"""The CPU all-vs-all RMSD, :func:`pairwise_numpy`: the NumPy twin of
:func:`protgpu.superpose.pairwise_rmsd` (also its CPU path). The centred frames are stacked as a
(3F, N) float64 matrix; each tile's 3x3 blocks come from one BLAS GEMM on this thread while the
previous tile's vectorised QCP (:func:`qcp_tile_numpy`, row groups of :data:`.qcp.CHUNK_PAIRS` pairs)
runs on a thread pool. The result does not depend on the thread count or the tile size.

Internal API (tests and benchmarks use it): :func:`pairwise_numpy`, :func:`centre_frames_numpy`,
:func:`qcp_group`, :func:`qcp_tile_numpy`, :func:`qcp_tile_start` and ``CPU_TILE``.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np

from .._memory import check_host_fits, rows_per_chunk
from .._threads import blas_threads, cpu_split, cpu_threads, run_tasks
from . import qcp, streaming

CPU_TILE = 512  # frames per all-vs-all tile side: the tile's GEMM blocks are 9 * 512^2 float64 (19 MB)


def centre_frames_numpy(x, w, fit, pool=None):
    """Centred, weight-scaled frames as the stacked (3F, N) float64 matrix of the GEMM formulation,
    and ``G`` (F,) float64. Row ``3f + c`` is coordinate c of frame f times sqrt(w).

    Frames go in cache-sized chunks (their float64 temporaries stay in cache), on ``pool``'s threads
    when one is given; each frame's numbers do not depend on the chunking or on the threads."""
    f = x.shape[0]
    n = x.shape[1] if fit is None else len(fit)
    a = np.empty((3 * f, n))
    g = np.empty(f)
    sw = None if w is None else np.sqrt(w)
    chunk = rows_per_chunk(n * 3 * 8 * 3, f, qcp.CACHE_CHUNK_BYTES)

    def work(f0):
        f1 = min(f, f0 + chunk)
        xd = np.asarray(x[f0:f1] if fit is None else x[f0:f1, fit], dtype=np.float64)
        cx = xd.mean(axis=1) if w is None else np.einsum("fni,n->fi", xd, w) / w.sum()
        c = (xd - cx[:, None, :]).transpose(0, 2, 1)
        if sw is not None:
            c = c * sw
        g[f0:f1] = np.einsum("fin,fin->f", c, c)
        a[3 * f0:3 * f1] = c.reshape(-1, n)

    run_tasks(pool, work, range(0, f, chunk))
    return a, g


def qcp_group(threads: int) -> int:
    """Pairs (or frames) per vectorised QCP call with ``threads`` workers: ``qcp.CHUNK_PAIRS`` on one
    thread, four times that on a pool. Each NumPy call holds the GIL for ~1 us of Python around its
    loop, and a thread waiting for the GIL takes a wake-up to get it: with calls of ~3 us (8192 pairs)
    two threads run no faster than one (measured), with ~12 us calls (32768 pairs) they do (1.3x on 2
    cores), at a few % more time per pair on one core. Results do not depend on it."""
    return qcp.CHUNK_PAIRS if threads < 2 else 4 * qcp.CHUNK_PAIRS


def qcp_tile_numpy(blocks, ga, gb, inv_w, upper: bool, pool=None, group: int | None = None):
    """RMSD for a tile of 3x3 blocks (3 Ti, 3 Tj) (float32 or float64): (Ti, Tj) float64. With
    ``upper`` (a diagonal tile of a symmetric run) only the pairs i < j are computed; the rest is 0.

    The vectorised QCP runs on groups of whole rows of about ``group`` pairs (counting only the pairs
    computed; default ``qcp.CHUNK_PAIRS``): its temporaries then stay in the CPU's cache (on a whole
    512 x 512 tile they are 2 MB each, and every step of the QCP would stream from memory), and each
    group is one task for ``pool``'s threads. Every pair's value is computed elementwise, whatever its
    group or thread."""
    res, futures = qcp_tile_start(blocks, ga, gb, inv_w, upper, pool, group)
    for fut in futures:
        fut.result()
    return res


def qcp_tile_start(blocks, ga, gb, inv_w, upper: bool, pool, group=None):
    """:func:`qcp_tile_numpy` without the wait: ``(res, futures)``, ``res`` complete once every future
    is (all done here, and no futures, when ``pool`` is None)."""
    ti, tj = blocks.shape[0] // 3, blocks.shape[1] // 3
    b4 = blocks.reshape(ti, 3, tj, 3)
    res = np.zeros((ti, tj))
    counts = np.maximum(tj - 1 - np.arange(ti), 0) if upper else np.full(ti, tj)
    groups, r0, acc = [], 0, 0
    for i, c in enumerate(counts.tolist()):
        acc += c
        if acc >= (group or qcp.CHUNK_PAIRS) or i == ti - 1:
            if acc:
                groups.append((r0, i + 1))
            r0, acc = i + 1, 0

    def work(rows):
        r0, r1 = rows
        if upper:
            ii, jj = np.nonzero(np.arange(tj)[None, :] > np.arange(r0, r1)[:, None])
            ii += r0
            m = np.empty((3, 3, ii.size))
            np.copyto(m, b4[ii, :, jj, :].transpose(1, 2, 0))  # one gather; float64 whatever the GEMM's
            s = [m[p, q] for p in range(3) for q in range(3)]
            res[ii, jj] = qcp.rmsd_only(s, ga[ii] + gb[jj], inv_w)
        else:
            m = np.empty((3, 3, r1 - r0, tj))
            np.copyto(m, b4[r0:r1].transpose(1, 3, 0, 2))
            s = [m[p, q].reshape(-1) for p in range(3) for q in range(3)]
            gsum = (ga[r0:r1, None] + gb[None, :]).reshape(-1)
            res[r0:r1] = qcp.rmsd_only(s, gsum, inv_w).reshape(r1 - r0, tj)

    if pool is None:
        for rows in groups:
            work(rows)
        return res, []
    return res, [pool.submit(work, rows) for rows in groups]


def pairwise_numpy(x, y=None, *, fit=None, weights=None, precision="float64", out=None, condensed=False,
                    tile: int | None = None, out_dtype=np.float32, threads: int | None = None):
    """The NumPy twin of :func:`pairwise_rmsd` (also its CPU path): the same GEMM formulation through
    NumPy's BLAS and a vectorised QCP, tile by tile.

    Parallel on the CPU's cores: each tile's GEMM is one BLAS call from this thread (BLAS threads it),
    and the tile's QCP row groups (:func:`qcp_tile_numpy`) run on a pool of threads (NumPy's ufuncs
    release the GIL) while this thread makes the next tile's GEMM; the centring goes over frame chunks
    on the same pool. The cores are split between the two (:func:`cpu_split`: a quarter for the QCP
    pool, the rest for BLAS, which is limited to them during the call). Tiles are written to ``out``
    from this thread, in order, once complete. The result is bitwise the same for any ``threads`` (the
    groups and chunks do not depend on it, every pair is computed elementwise, and BLAS gets the same
    thread count whatever ``threads`` is) and for any ``tile`` as long as BLAS sums each block entry in
    the same order whatever the GEMM's shape (OpenBLAS's small-matrix kernels, for tiles of a few
    frames, can differ by ~1e-13 relative).

    Parameters
    ----------
    x : np.ndarray, shape (F, N, 3)
    y : np.ndarray, shape (G, N, 3), optional
    fit : np.ndarray of int64, optional
        Atom indices used (both inputs).
    weights : np.ndarray (n_fit,), optional
    precision : {"float64", "float32"}
        dtype of the stacked coordinates and of the 3x3 blocks (the GEMM).
    out : array-like, optional
        Destination (F, G) or condensed (F (F - 1) / 2,); written tile by tile.
    condensed : bool
        Condensed output (``y`` None only).
    tile : int, optional
        Frames per tile side (default ``CPU_TILE``, 512); the result does not depend on it.
    out_dtype : dtype
        Result dtype when ``out`` is None.
    threads : int, optional
        Cores to use (default: the usable CPU cores): a quarter of them (1 to 8) run the QCP pool; the
        result does not depend on it.

    Returns
    -------
    np.ndarray (or ``out``), Angstrom.
    """
    n_threads = cpu_threads() if threads is None else max(1, int(threads))
    n_pairs = x.shape[0] * (x.shape[0] if y is None else y.shape[0])
    # BLAS gets the cores the default QCP pool leaves, whatever ``threads`` is: its thread count can
    # change a GEMM's rounding, and the result must not depend on ``threads``.
    with blas_threads(cpu_split(cpu_threads())[1]):
        # A pool only where there is work for several threads (starting one costs ~0.1 ms).
        if n_threads > 1 and n_pairs >= 8 * qcp.CHUNK_PAIRS:
            qcp_threads = cpu_split(n_threads)[0]
            with concurrent.futures.ThreadPoolExecutor(qcp_threads, thread_name_prefix="protgpu-rmsd") as pool:
                return _pairwise_numpy_run(x, y, fit, weights, precision, out, condensed, tile, out_dtype, pool,
                                           qcp_group(qcp_threads))
        return _pairwise_numpy_run(x, y, fit, weights, precision, out, condensed, tile, out_dtype, None,
                                   qcp.CHUNK_PAIRS)


def _pairwise_numpy_run(x, y, fit, weights, precision, out, condensed, tile, out_dtype, pool, group):
    """:func:`pairwise_numpy` with its thread pool (or None: all in this thread) and QCP group size."""
    prec = np.dtype(precision)
    symmetric = y is None
    a, ga = centre_frames_numpy(x, weights, fit, pool)
    if symmetric:
        b, gb = a, ga
    else:
        b, gb = centre_frames_numpy(y, weights, fit, pool)
    a = a.astype(prec, copy=False)
    b = a if symmetric else b.astype(prec, copy=False)
    n = a.shape[1]
    inv_w = 1.0 / (n if weights is None else float(weights.sum()))
    f, g = len(ga), len(gb)
    if out is None:
        shape = (f * (f - 1) // 2,) if condensed else (f, g)
        check_host_fits(int(np.prod(shape)) * np.dtype(out_dtype).itemsize, "the RMSD matrix")
        out = np.empty(shape, dtype=out_dtype)
        if not condensed and symmetric:
            out[np.arange(f), np.arange(f)] = 0
    sink = streaming.Sink(out, f, symmetric, condensed)
    t = int(tile or CPU_TILE)
    # With a pool, the QCP of one tile runs on the pool's threads while this thread makes the next
    # tile's GEMM (BLAS holds no GIL: its threads use the cores the QCP threads leave while they wait
    # for the GIL); tiles are written here, in order, once their QCP is complete.
    pending = None
    for i0, i1, j0, j1 in streaming.tiles(f, g, t, symmetric):
        blocks = a[3 * i0:3 * i1] @ b[3 * j0:3 * j1].T
        diag = symmetric and i0 == j0
        job = (i0, i1, j0, j1, *qcp_tile_start(blocks, ga[i0:i1], gb[j0:j1], inv_w, diag, pool, group))
        if pending is not None:
            _write_tile(sink, *pending)
        pending = job
    if pending is not None:
        _write_tile(sink, *pending)
    return out


def _write_tile(sink, i0, i1, j0, j1, res, futures):
    for fut in futures:
        fut.result()
    sink.write(i0, i1, j0, j1, res)


class RowsNumpy:
    """Rows of the symmetric all-vs-all RMSD matrix of ``x``, for rows of the caller's choosing (the
    strips :mod:`protgpu.cluster` folds into counts and medoid state without holding F x F numbers).
    The frames are centred once; :meth:`rows` is one GEMM and :func:`qcp_tile_numpy`, the same
    elementwise QCP as :func:`pairwise_numpy`.

    Parameters
    ----------
    x : np.ndarray, shape (F, N, 3)
    fit : np.ndarray of int, optional
    weights : np.ndarray (n_fit,), optional
    precision : {"float64", "float32"}
        dtype of the GEMM, as :func:`pairwise_numpy`.
    """

    def __init__(self, x, *, fit=None, weights=None, precision="float64"):
        a, self.g = centre_frames_numpy(x, weights, fit)
        self.a = a.astype(np.dtype(precision), copy=False)
        self.inv_w = 1.0 / (self.a.shape[1] if weights is None else float(weights.sum()))
        self.n = len(self.g)

    def rows(self, idx) -> np.ndarray:
        """RMSD of frames ``idx`` (int array, or a slice) to every frame: (len(idx), F) float64, Angstrom."""
        idx = np.arange(self.n)[idx] if isinstance(idx, slice) else np.asarray(idx, dtype=np.int64)
        r3 = (3 * idx[:, None] + np.arange(3)).reshape(-1)
        with blas_threads(cpu_split(cpu_threads())[1]):
            blocks = self.a[r3] @ self.a.T
        return qcp_tile_numpy(blocks, self.g[idx], self.g, self.inv_w, False)
