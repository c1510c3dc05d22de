"""The GPU all-vs-all RMSD, :func:`pairwise_cuda`: ``centre_frames_*`` stacks the centred frames on the
device (:func:`centre_frames_cuda`), cuBLAS GEMMs give every pair's 3x3 block, and ``qcp_pairs_*``
(+ ``qcp_refine_*``) turn blocks into RMSDs (:class:`PairPlan` holds that state). A result that fits
the device budget stays resident (row strips of ~F/6 frames against their later columns); otherwise
it streams to the host (:mod:`.streaming`). :func:`pairwise_tiles_cuda` yields device tiles for
callers that fold them into their own state (``protgpu.scoring.consensus``).

Internal API (tests and benchmarks use it): every function and class here.
"""

from __future__ import annotations

import numpy as np

from .._array import is_cupy_array
from .._memory import check_host_fits, device_budget_bytes, format_bytes, rows_per_chunk
from ..errors import InputError, MemoryBudgetError
from . import kernels, streaming
from ._prepare import float_dtype

#: Largest GEMM panel (its 3x3 blocks) the device paths make, bytes.
TILE_PANEL_BYTES = 8 << 30


def panel_bytes(free: int) -> int:
    """Bytes one GEMM panel may take out of ``free`` device bytes: half (cuBLAS takes its workspace beside
    the panel: a 100,000-frame GROMOS run asked for 54 GB of workspace after a 121 GB panel), and at most
    :data:`TILE_PANEL_BYTES` (wider GEMMs are no faster)."""
    return min(max(int(free), 0) // 2, TILE_PANEL_BYTES)


def gpu_tile_size(f, g, prec_size, out_size, budget, fixed):
    """Frames per tile side on the GPU: the 3x3 blocks (9 T^2 * precision) plus two output tiles fit in
    what the budget leaves after the resident stacked coordinates (``fixed`` bytes)."""
    avail = budget - fixed
    per = 9 * prec_size + 2 * out_size + 16
    if avail < per * 8 * 8:
        raise MemoryBudgetError(
            f"pairwise RMSD: the stacked coordinates need {format_bytes(fixed)} of the device budget of "
            f"{format_bytes(budget)}; select fewer atoms or frames, or raise PROTGPU_GPU_MEMORY_BUDGET")
    t = int(np.sqrt(avail / per))
    t = min(t, 8192, max(f, g))
    if t >= 64:
        t -= t % 32
    return max(t, 1)


def centre_frames_cuda(x, w, fit, prec):
    """Device twin of :func:`centre_frames_numpy` (kernel ``centre_frames_*``, one warp per frame):
    the stacked (3F, N) ``prec`` CuPy array and G (F,) float64. ``x`` may be host or device (float32
    stays float32 on the way); host input is uploaded frame chunk by frame chunk."""
    import cupy as cp

    f, n_atoms = x.shape[:2]
    n = n_atoms if fit is None else len(fit)
    dt = float_dtype(x.dtype)
    h = kernels.get(f"centre_frames_{'f32' if dt == np.float32 else 'f64'}_{'b32' if prec == np.float32 else 'b64'}")
    a = cp.empty((3 * f, n), dtype=prec)
    g = cp.empty(f)
    idx_d = None if fit is None else cp.asarray(np.asarray(fit, dtype=np.int32))
    w_d = None if w is None else cp.asarray(w)
    sw_d = None if w is None else cp.asarray(np.sqrt(w))
    inv_w = 1.0 / (n if w is None else float(w.sum()))
    if is_cupy_array(x):
        chunk = f
    else:
        chunk = rows_per_chunk(n_atoms * 3 * np.dtype(dt).itemsize, f, max(device_budget_bytes() // 4, 1 << 24))
    for f0 in range(0, f, chunk):
        f1 = min(f, f0 + chunk)
        xs = cp.ascontiguousarray(cp.asarray(x[f0:f1]), dtype=dt)
        kernels.launch(h, kernels.warp_grid(f1 - f0), (kernels.WARP_THREADS,), xs, idx_d, w_d, sw_d,
                       a[3 * f0:3 * f1], g[f0:f1], f1 - f0, n_atoms, n, inv_w)
    return a, g


class PairPlan:
    """The device state of one all-vs-all run: the stacked centred frames ``a`` (3F, N) and ``b``
    (3G, N) in the GEMM precision (``b is a`` when symmetric), their traces ``ga``, ``gb``, and the
    pair kernels. :meth:`gemm` makes a panel's 3x3 blocks, :meth:`qcp` turns (part of) a panel into
    RMSDs."""

    def __init__(self, x, y, fit, weights, precision, out_dtype, check_names=(None, None)):
        prec = np.dtype(precision)
        self.prec, self.odt = prec, np.dtype(out_dtype)
        self.symmetric = y is None
        self.a, self.ga = centre_frames_cuda(x, weights, fit, prec)
        if self.symmetric:
            self.b, self.gb = self.a, self.ga
        else:
            self.b, self.gb = centre_frames_cuda(y, weights, fit, prec)
        check_traces(self.ga, check_names[0])
        if not self.symmetric:
            check_traces(self.gb, check_names[1])
        n = self.a.shape[1]
        self.inv_w = 1.0 / (n if weights is None else float(weights.sum()))
        self.f, self.g = len(self.ga), len(self.gb)
        sfx = f"{'b32' if prec == np.float32 else 'b64'}_{'o32' if self.odt == np.float32 else 'o64'}"
        self.h_pairs, self.h_refine = kernels.get(f"qcp_pairs_{sfx}"), kernels.get(f"qcp_refine_{sfx}")
        self.fixed = self.a.nbytes + (0 if self.symmetric else self.b.nbytes) + 8 * (self.f + self.g)

    def gemm(self, i0, i1, j0, j1):
        """Blocks of rows i0:i1 against columns j0:j1: (3 (i1 - i0), 3 (j1 - j0)), row-major (cuBLAS through
        nvmath follows the row-major first operand; a column-major result is copied to be safe)."""
        import cupy as cp

        from .._cuda.blas import matmul

        blocks = matmul(self.a[3 * i0:3 * i1], self.b[3 * j0:3 * j1].T)
        return blocks if blocks.flags.c_contiguous else cp.ascontiguousarray(blocks)

    def qcp(self, blocks, p0, i0, i1, j0, j1, dst, out_ld, out_row0, out_col0, mode):
        """Pairs (i0:i1) x (j0:j1) from ``blocks`` (a panel whose first column frame is ``p0``) into ``dst``."""
        ti, tj = i1 - i0, j1 - j0
        bx, by = kernels.PAIR_BLOCK
        grid = ((tj + bx - 1) // bx, (ti + by - 1) // by)
        args = (blocks, blocks.shape[1], 3 * (j0 - p0), self.ga, self.gb, dst, ti, tj, i0, j0, out_ld, out_row0,
                out_col0, self.f, float(self.inv_w), mode)
        kernels.launch(self.h_pairs, grid, kernels.PAIR_BLOCK, *args)
        kernels.launch(self.h_refine, grid, kernels.PAIR_BLOCK, *args)

    def panel_cols(self, rows, avail, granule, start):
        """Columns of one GEMM panel of ``rows`` rows: a multiple of ``granule`` whose blocks fit in
        ``avail`` bytes (at least one granule), at most what is left from column ``start``."""
        left = self.g - start
        per_col = 9 * rows * self.prec.itemsize
        k = max(1, int(avail // (per_col * granule)))
        return min(left, k * granule)


def check_traces(g, name: str | None) -> None:
    """:func:`check_finite` for the GPU paths, on the device: a frame with a NaN or infinite coordinate
    among the fitted atoms has a non-finite trace ``g`` (its centred sum of squares), whatever its
    weights (0 x inf is NaN). Checking the (F,) traces costs one small reduction, where scanning the
    host coordinates cost ~70 ms for 100,000 x 300 frames, before any GPU could start. ``name`` None:
    no check (device input: NaN propagates into the results, as documented)."""
    if name is None:
        return
    import cupy as cp

    bad = ~cp.isfinite(g)
    if bool(bad.any()):
        raise InputError(f"{name}: NaN or infinite coordinates in frame {int(cp.argmax(bad))}")


def strip_rows(f: int) -> int:
    """Rows of a GEMM strip in a symmetric resident run: about 1/6 of the frames, at least 256, a
    multiple of 32. A strip's GEMM covers its rows against every later column, so 6 strips do ~58% of
    the full square's work (k strips: (k + 1) / 2k), while each GEMM stays large enough for cuBLAS's full
    speed and the strips are few enough for the host to enqueue them (~0.1-0.3 ms of Python each)
    faster than the device runs them."""
    r = max(256, -(-f // 6))
    return min(f, -(-r // 32) * 32)


def pairwise_tiles_cuda(x, *, fit=None, weights=None, precision="float64", tile=None, out_dtype=np.float32):
    """Square tiles of the symmetric all-vs-all RMSD matrix on the device, one at a time (for callers
    that fold each tile into their own state, e.g. ``protgpu.scoring.consensus``).

    Parameters
    ----------
    x : np.ndarray or cupy.ndarray, shape (F, N, 3)
        Frames, Angstrom (float32 or float64; host input is uploaded once).
    fit : np.ndarray of int, optional
        Atom indices used (default all).
    weights : np.ndarray (n_fit,), optional
    precision : {"float64", "float32"}
        GEMM precision, as :func:`pairwise_rmsd`.
    tile : int, optional
        Frames per tile side (default: from the device memory budget, at most 8192).
    out_dtype : dtype
        float32 or float64 tiles.

    Yields
    ------
    (i0, i1, j0, j1, dst)
        For ``i0`` over the row tiles and ``j0 >= i0`` over the column tiles (the upper triangle of
        tiles, row by row, as :func:`.streaming.tiles`): ``dst`` a C-contiguous CuPy (i1 - i0, j1 - j0)
        array of RMSDs, Angstrom. A diagonal tile (``i0 == j0``) is complete: symmetric, zero diagonal
        (made with ``MIRROR | UPPER_ONLY | ZERO_DIAG``). ``dst`` is written on CuPy's current stream and
        reused for the next tile: consume it (launch on the same stream, or copy) before advancing.

    Raises
    ------
    MemoryBudgetError
        The stacked coordinates and one tile do not fit in the device budget.
    """
    import cupy as cp

    plan = PairPlan(x, None, fit, weights, precision, out_dtype)
    f = plan.f
    budget = device_budget_bytes()
    t = int(tile) if tile else gpu_tile_size(f, f, plan.prec.itemsize, plan.odt.itemsize, budget, plan.fixed)
    t = max(1, min(t, f, 65535 * kernels.PAIR_BLOCK[1]))
    buf = cp.empty(t * t, dtype=plan.odt)
    avail = panel_bytes(budget - plan.fixed - buf.nbytes)
    blocks = None
    for i0, i1, p0, p1 in streaming.panels(plan, t, avail):
        blocks = None  # one panel alive at a time
        blocks = plan.gemm(i0, i1, p0, p1)
        for j0 in range(p0, p1, t):
            j1 = min(p1, j0 + t)
            dst = buf[:(i1 - i0) * (j1 - j0)].reshape(i1 - i0, j1 - j0)
            mode = (kernels.MIRROR | kernels.UPPER_ONLY | kernels.ZERO_DIAG) if i0 == j0 else 0
            plan.qcp(blocks, p0, i0, i1, j0, j1, dst, j1 - j0, 0, 0, mode)
            yield i0, i1, j0, j1, dst


def pairwise_cuda(x, y=None, *, fit=None, weights=None, precision="float64", out=None, condensed=False,
                   tile: int | None = None, out_dtype=np.float32, host_result: bool = True, check_names=(None, None)):
    """CUDA path of :func:`pairwise_rmsd`: ``centre_frames_*`` stacks the centred frames on the device,
    one cuBLAS GEMM per panel of the stacked (3F, N) coordinates gives every pair's 3x3 block, and
    ``qcp_pairs_*`` (+ ``qcp_refine_*`` for the rare near-repeated roots) turns blocks into RMSDs.

    Resident result (it fits in half the device budget, no ``out``): symmetric runs go in row strips of
    ~F/6 frames, each strip's GEMM against its own and every later column only (~58% of the square's
    work), the kernel mirroring each pair (or writing the condensed vector); ``tile`` replaces the strips
    by square tiles. Otherwise tiles stream to the host: each finished tile is copied device-to-host on a
    second stream into one of two pinned buffers while the next tile computes, and a writer thread stores
    it into ``out``. Returns ``out``, the host result, or (``host_result=False``) the CuPy result.
    """
    import cupy as cp

    plan = PairPlan(x, y, fit, weights, precision, out.dtype if out is not None else out_dtype, check_names)
    f, g, odt, symmetric = plan.f, plan.g, plan.odt, plan.symmetric
    budget = device_budget_bytes()
    shape = (f * (f - 1) // 2,) if condensed else (f, g)
    result_bytes = int(np.prod(shape)) * odt.itemsize
    # Resident when the whole result takes at most half the budget (panels get the rest); else stream.
    resident = out is None and result_bytes + plan.fixed <= budget // 2
    if out is None and not resident and not host_result:
        raise MemoryBudgetError(
            f"pairwise RMSD: the {shape} result ({format_bytes(result_bytes)}) does not fit in the device "
            f"budget ({format_bytes(budget)}); pass out= (an np.memmap or Zarr array) to stream it")
    if resident:
        dst = cp.empty(shape, dtype=odt)
        avail = panel_bytes(budget - plan.fixed - result_bytes)
        if tile:
            rows = cols = max(1, min(int(tile), max(f, g)))
        else:
            rows = strip_rows(f) if symmetric else f
            cols = 32
        rows = min(rows, f, 65535 * kernels.PAIR_BLOCK[1])  # grid.y limit
        if 9 * rows * cols * plan.prec.itemsize > avail:  # a budget too small for the strip: square tiles
            rows = cols = gpu_tile_size(f, g, plan.prec.itemsize, odt.itemsize, budget - result_bytes, plan.fixed)
        if condensed:
            mode = kernels.CONDENSED
        elif symmetric:
            mode = kernels.MIRROR | kernels.UPPER_ONLY | kernels.ZERO_DIAG  # no-ops away from the diagonal
        else:
            mode = 0
        for i0 in range(0, f, rows):
            i1 = min(f, i0 + rows)
            p0 = i0 if symmetric else 0
            while p0 < g:
                p1 = p0 + plan.panel_cols(i1 - i0, avail, cols, p0)
                if tile:
                    p1 = min(p1, p0 + cols)
                blocks = plan.gemm(i0, i1, p0, p1)
                plan.qcp(blocks, p0, i0, i1, p0, p1, dst, g, 0 if condensed else i0, p0, mode)
                del blocks
                p0 = p1
        return dst.get() if host_result else dst
    # Streaming to the host, tile by tile.
    if out is None:
        check_host_fits(result_bytes, "the RMSD matrix")
        out = np.empty(shape, dtype=odt)
        if symmetric and not condensed:
            out[np.arange(f), np.arange(f)] = 0
    sink = streaming.Sink(out, f, symmetric, condensed)
    # The host writes bound a streamed run's speed, not the tile size: tiles of at most streaming.STREAM_TILE
    # frames and GEMM panels of at most streaming.STREAM_PANEL_BYTES keep its device footprint to a few GB
    # (50,000 x 300 frames: ~3 GB) however large the budget.
    if condensed and not tile:
        streaming.stream_condensed(plan, out, budget)
        return out
    t = tile or min(streaming.STREAM_TILE, gpu_tile_size(f, g, plan.prec.itemsize, odt.itemsize, budget, plan.fixed))
    t = max(1, min(int(t), max(f, g), 65535 * kernels.PAIR_BLOCK[1]))
    streaming.stream_tiles(plan, sink, t, budget)
    return out


def pairwise_rows_cuda(plan: PairPlan, idx, out_dtype=np.float64):
    """RMSD of frames ``idx`` of a symmetric :class:`PairPlan` to every frame, on the device: a CuPy
    (len(idx), F) array (the strips :mod:`protgpu.cluster` folds into its own state). The rows' stacked
    coordinates are gathered from ``plan.a``; columns go in GEMM panels that fit half the device budget.

    Parameters
    ----------
    plan : PairPlan
        Made with ``y=None`` (its ``b`` is its ``a``).
    idx : array of int (NumPy or CuPy)
        Frame indices, at most 65535 * 8 of them (the kernel's grid.y).
    out_dtype : dtype
        float64 (default) or float32 (the plan's output dtype is used for the kernel's choice).
    """
    import copy

    import cupy as cp

    idx = cp.asarray(idx, dtype=cp.int64)
    m = int(idx.size)
    sub = copy.copy(plan)  # the plan's columns, the gathered rows
    sub.a = plan.a[(3 * idx[:, None] + cp.arange(3)).reshape(-1)]
    sub.ga, sub.f, sub.symmetric = plan.ga[idx], m, False
    dst = cp.empty((m, plan.g), dtype=plan.odt)
    # the panel shares the budget with what stays resident: coordinates, the gathered rows, the strip
    resident = plan.fixed + sub.a.nbytes + dst.nbytes
    avail = max(panel_bytes(device_budget_bytes() - resident), 9 * m * 32 * plan.prec.itemsize)
    p0 = 0
    while p0 < plan.g:
        p1 = p0 + sub.panel_cols(m, avail, 32, p0)
        blocks = sub.gemm(0, m, p0, p1)
        sub.qcp(blocks, p0, 0, m, p0, p1, dst, plan.g, 0, p0, 0)
        del blocks
        p0 = p1
    return dst if dst.dtype == np.dtype(out_dtype) else dst.astype(out_dtype)
