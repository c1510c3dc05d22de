"""Where all-vs-all tiles go: the tile and panel schedules, :class:`Sink` (finished tiles into a host
destination, dense or condensed, mirrored for symmetric runs), and the one host-streaming pipeline
of the GPU path: square tiles (:func:`stream_tiles`) or condensed row strips
(:func:`stream_condensed`) copied device-to-host on a second stream while the next ones compute,
stored by writer threads, or written by the copy engines straight into a page-locked destination
(:func:`page_locked`). Several GPUs share one queue of row tiles or strips
(:mod:`.multigpu`). The design and its measurements: ``docs/design/pairwise-streaming.md``.

Internal API (tests and benchmarks use it): every function and class here, and the tunables
``STREAM_TILE``, ``STREAM_PANEL_BYTES``, ``STREAM_PANEL_COLS``, ``STREAM_PANEL_QUANTUM``,
``STREAM_STRIP_BYTES`` and ``STORE_PIECE_BYTES``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib

import numpy as np

from .._threads import cpu_threads
from . import kernels

STREAM_TILE = 4096  # frames per tile side when streaming to host memory (see pairwise_gpu.pairwise_cuda)
STREAM_PANEL_BYTES = 3 << 30  # most bytes of 3x3 blocks per GEMM panel when streaming
STREAM_PANEL_COLS = 16384  # column width of the condensed strips' GEMM panels (see stream_condensed)
STREAM_PANEL_QUANTUM = 1024  # a strip's first panel starts this close left of the diagonal, or closer
STREAM_STRIP_BYTES = 256 << 20  # most bytes of a condensed row strip when streaming (see stream_condensed)


def tiles(n_rows: int, n_cols: int, tile: int, symmetric: bool):
    """Tile schedule ``(i0, i1, j0, j1)``: all tiles, or (symmetric) those with ``j0 >= i0``."""
    for i0 in range(0, n_rows, tile):
        i1 = min(n_rows, i0 + tile)
        for j0 in range(i0 if symmetric else 0, n_cols, tile):
            yield i0, i1, j0, min(n_cols, j0 + tile)


def condensed_index(i, j, n):
    """Index of pair (i, j), i < j, in SciPy's condensed distance vector of n items."""
    return n * i - i * (i + 1) // 2 + (j - i - 1)


class Sink:
    """Writes finished tiles into the destination (a NumPy array, np.memmap, Zarr array, or anything
    with ``__setitem__``): dense (mirrored across the diagonal for symmetric runs) or condensed."""

    def __init__(self, out, n: int, symmetric: bool, condensed: bool):
        import threading

        self.out, self.n, self.symmetric, self.condensed = out, n, symmetric, condensed
        # Tiles are disjoint regions, so NumPy destinations (np.memmap too) take writes from several
        # threads at once; other stores (Zarr) may share a chunk between tiles and rewrite it whole,
        # so their writes go one at a time.
        self._lock = None if isinstance(out, np.ndarray) else threading.Lock()

    def write(self, i0, i1, j0, j1, tile):
        """``tile`` (i1 - i0, j1 - j0) on the host; for symmetric runs it holds valid values at
        least for the pairs with i < j (diagonal tiles: upper triangle and a zero diagonal)."""
        if self._lock is None:
            self._write(i0, i1, j0, j1, tile)
        else:
            with self._lock:
                self._write(i0, i1, j0, j1, tile)

    def _write(self, i0, i1, j0, j1, tile):
        out = self.out
        if self.condensed:
            for i in range(i0, i1):
                js = max(j0, i + 1)
                if js < j1:
                    k0 = condensed_index(i, js, self.n)
                    out[k0:k0 + (j1 - js)] = tile[i - i0, js - j0:]
            return
        if self.symmetric and i0 == j0:
            up = np.triu(tile, 1)
            out[i0:i1, j0:j1] = up + up.T
        else:
            out[i0:i1, j0:j1] = tile
            if self.symmetric:
                # The mirrored block in column strips: a whole transposed tile gathers every element
                # from a different cache line (~3.5x slower into an np.memmap).
                for b0 in range(0, i1 - i0, 512):
                    b1 = min(i1 - i0, b0 + 512)
                    out[j0:j1, i0 + b0:i0 + b1] = tile[b0:b1].T

def panels(plan, t, avail, row_starts=None):
    """``(i0, i1, p0, p1)``: row tiles of ``t`` frames (those starting at ``row_starts``, default all),
    each against its columns (from ``i0`` when symmetric) in panels of whole tiles (one GEMM each),
    panels as wide as ``avail`` bytes allow. The caller runs each panel's GEMM after dropping the
    previous panel, so one panel is alive at a time."""
    for i0 in (range(0, plan.f, t) if row_starts is None else row_starts):
        i1 = min(plan.f, i0 + t)
        start = i0 if plan.symmetric else 0
        p0 = start
        while p0 < plan.g:
            p1 = p0 + plan.panel_cols(i1 - i0, avail, t, p0)
            yield i0, i1, p0, p1
            p0 = p1


def condensed_strip_rows(f: int, itemsize: int) -> int:
    """Rows per strip when streaming a condensed result: a strip's part of the vector (at most
    ~``STREAM_STRIP_BYTES``, its first rows being the longest) is one contiguous block."""
    rows = STREAM_STRIP_BYTES // max(1, itemsize * max(f - 1, 1))
    return int(max(32, min(8192, rows - rows % 32 if rows >= 64 else rows)))


def stream_condensed(plan, out, budget, row_starts=None, rows=None):
    """The condensed vector of a symmetric run streamed to the host in row strips: the pairs of rows
    [i0, i1) against every later frame are one contiguous block of SciPy's layout, so the kernel writes
    them straight into a device strip buffer in that order, one device-to-host copy moves the block and
    one NumPy copy stores it (few large operations per strip: the host side releases the GIL and keeps
    up with several GPUs, where a tile's row segments would be one Python-level copy each). Page-locking
    ``out`` instead, for the copy engines to write it directly, was measured slower: registering 20 GB
    took 1.25 s (and 0.39 s to release), more than the whole run with staging buffers."""
    import threading

    import cupy as cp
    import cupyx

    f, odt = plan.f, plan.odt
    rows = rows or condensed_strip_rows(f, odt.itemsize)
    rows = max(1, min(int(rows), f, 65535 * kernels.PAIR_BLOCK[1]))

    def start(i):  # condensed index of pair (i, i + 1)
        return i * f - i * (i + 1) // 2

    cap = start(min(f, rows)) - start(0)  # the first strip is the longest
    # A page-locked destination is written by the copy engine straight from the device strip: no
    # staging buffer, no host-side copy, and so no bound from the host's memcpy bandwidth.
    direct = page_locked(out)
    n_writers = stream_writers()
    n_buf = n_writers + 1
    compute = cp.cuda.get_current_stream()
    copy_stream = cp.cuda.Stream(non_blocking=True)
    dev_bufs = [cp.empty(max(cap, 1), dtype=odt) for _ in range(n_buf)]
    host_bufs = [] if direct else [cupyx.empty_pinned(max(cap, 1), dtype=odt) for _ in range(n_buf)]
    avail = min(max(budget - plan.fixed - n_buf * dev_bufs[0].nbytes, 0), STREAM_PANEL_BYTES)
    width = max(32, min(plan.panel_cols(rows, avail, 32, 0), STREAM_PANEL_COLS))
    quantum = max(32, min(STREAM_PANEL_QUANTUM, width) // 32 * 32)
    width = max(quantum, width // quantum * quantum)  # grid lines fall on the quantum's
    copied: list = [None] * n_buf
    pending: list = [None] * n_buf
    # NumPy destinations take strips from several writers at once (disjoint blocks); others (Zarr may
    # share a chunk between strips) one at a time.
    lock = None if isinstance(out, np.ndarray) else threading.Lock()

    # A strip's store into a NumPy destination is split over helper threads as well: one thread's
    # copy into pageable memory runs at a fraction of the host's memory bandwidth.
    n_pieces = store_pieces()  # (the helper pool, ``helpers``, is opened below with the writers)

    def store(ev, buf, k0, k1):
        ev.synchronize()
        if lock is not None:
            with lock:
                out[k0:k1] = buf
            return
        m = int(min(n_pieces, max(1, (k1 - k0) * buf.itemsize // STORE_PIECE_BYTES)))
        cuts = [k0 + (k1 - k0) * q // m for q in range(m + 1)]

        def piece(q):
            out[cuts[q]:cuts[q + 1]] = buf[cuts[q] - k0:cuts[q + 1] - k0]

        others = [helpers.submit(piece, q) for q in range(1, m)]
        piece(0)
        for o in others:
            o.result()

    with concurrent.futures.ThreadPoolExecutor(max_workers=n_writers) as writer, \
            (concurrent.futures.ThreadPoolExecutor(max_workers=n_writers * (n_pieces - 1)) if n_pieces > 1
             else contextlib.nullcontext()) as helpers:
        k = 0
        for i0 in (range(0, f, rows) if row_starts is None else row_starts):
            i1 = min(f, i0 + rows)
            k0, k1 = start(i0), start(i1)
            if k1 == k0:
                continue
            s = k % n_buf
            k += 1
            if copied[s] is not None:
                compute.wait_event(copied[s])
            dst = dev_bufs[s][:k1 - k0]
            # Panels on a fixed grid of one width, so that every strip's GEMMs have a few shapes and reuse
            # their cuBLAS plans (planning a new shape costs milliseconds of host time). The first panel
            # starts on the quantum's grid just left of the diagonal (the kernel skips the pairs left of
            # it) and runs to the next grid line: at most width / quantum first-panel shapes, and little
            # GEMM work wasted left of the diagonal (up to a whole panel would be ~8% of the GEMMs at
            # 100,000 frames), with wide panels: fewer launches, whose host time bounds several GPUs.
            p0 = (i0 // quantum) * quantum
            blocks = None
            while p0 < f:
                p1 = min(f, (p0 // width + 1) * width)
                blocks = None  # one panel alive at a time
                blocks = plan.gemm(i0, i1, p0, p1)
                plan.qcp(blocks, p0, i0, i1, p0, p1, dst, 0, k0, 0, kernels.CONDENSED)
                p0 = p1
            blocks = None
            done = compute.record()
            copy_stream.wait_event(done)
            if direct:
                cp.asnumpy(dst, stream=copy_stream, out=out[k0:k1], blocking=False)
                copied[s] = copy_stream.record()
                if row_starts is not None and copied[k % n_buf] is not None:
                    # Several devices share the queue of strips: take the next one only once this device
                    # has its buffer free (the copy of the strip that used it last is done), so that the
                    # strips go to the devices at the pace they finish them. Unpaced, each host thread
                    # took strips as fast as it could enqueue them, far ahead of its device and unevenly
                    # (measured: 87 against 70 strips, one GPU idle for the last 0.25 s of 0.58 s).
                    copied[k % n_buf].synchronize()
                continue
            if pending[s] is not None:
                pending[s].result()
            host_view = host_bufs[s][:k1 - k0]
            cp.asnumpy(dst, stream=copy_stream, out=host_view, blocking=False)
            copied[s] = copy_stream.record()
            pending[s] = writer.submit(store, copied[s], host_view, k0, k1)
        for p in pending:
            if p is not None:
                p.result()
        copy_stream.synchronize()


def page_locked(out) -> bool:
    """Whether ``out`` is a C-contiguous NumPy array in page-locked host memory (``cupyx.empty_pinned``,
    ``cudaHostAlloc`` or ``cudaHostRegister``): the copy engines can then write into it directly."""
    if type(out) is not np.ndarray or out.size == 0 or not out.flags.c_contiguous:
        return False
    import cupy as cp

    rt = cp.cuda.runtime
    host_kind = getattr(rt, "memoryTypeHost", 1)
    query = getattr(rt, "pointerGetAttributes", None)
    if query is None:
        return False
    try:  # both ends: a registered range must cover the whole array
        ends = (out.ctypes.data, out.ctypes.data + out.nbytes - 1)
        return all(query(p).type == host_kind for p in ends)
    except getattr(rt, "CUDARuntimeError", RuntimeError):  # memory the driver does not know
        return False


def stream_tiles(plan, sink, t, budget, row_starts=None):
    """Every tile of the row tiles ``row_starts`` (default all) computed on the current device and
    stored into ``sink``: each finished tile is copied device-to-host on a second stream into one of two
    pinned buffers while the next tile computes, and a writer thread stores it."""
    import cupy as cp
    import cupyx

    odt, symmetric = plan.odt, plan.symmetric
    compute = cp.cuda.get_current_stream()
    copy_stream = cp.cuda.Stream(non_blocking=True)
    # Host memory bandwidth (writes into out) is what bounds streaming, so several writer threads
    # store tiles at once (NumPy copies release the GIL); each needs its own pinned buffer, plus one
    # being filled by the copy engine.
    n_writers = stream_writers()
    n_buf = n_writers + 1
    dev_tiles = [cp.empty((t, t), dtype=odt) for _ in range(n_buf)]
    host_tiles = [cupyx.empty_pinned((t, t), dtype=odt) for _ in range(n_buf)]
    avail = min(max(budget - plan.fixed - n_buf * dev_tiles[0].nbytes, 0), STREAM_PANEL_BYTES)
    copied: list = [None] * n_buf
    pending: list = [None] * n_buf

    def store(ev, buf, i0, i1, j0, j1):
        ev.synchronize()
        sink.write(i0, i1, j0, j1, buf[: i1 - i0, : j1 - j0])

    with concurrent.futures.ThreadPoolExecutor(max_workers=n_writers) as writer:
        k = 0
        blocks = None
        for i0, i1, p0, p1 in panels(plan, t, avail, row_starts):
            blocks = None  # back to the pool (stream-ordered) before the next panel is allocated
            blocks = plan.gemm(i0, i1, p0, p1)
            for j0 in range(p0, p1, t):
                j1 = min(p1, j0 + t)
                s = k % n_buf
                k += 1
                ti, tj = i1 - i0, j1 - j0
                if copied[s] is not None:
                    compute.wait_event(copied[s])  # the device tile buffer must have been copied out
                dst = dev_tiles[s].reshape(-1)[: ti * tj].reshape(ti, tj)
                diag = symmetric and i0 == j0
                mode = (kernels.UPPER_ONLY | kernels.ZERO_DIAG) if diag else 0
                plan.qcp(blocks, p0, i0, i1, j0, j1, dst, tj, 0, 0, mode)
                done = compute.record()
                if pending[s] is not None:
                    pending[s].result()  # the writer must be finished with this pinned buffer
                copy_stream.wait_event(done)
                host_view = host_tiles[s].reshape(-1)[: ti * tj]
                cp.asnumpy(dst.reshape(-1), stream=copy_stream, out=host_view, blocking=False)
                copied[s] = copy_stream.record()
                pending[s] = writer.submit(store, copied[s], host_view.reshape(ti, tj), i0, i1, j0, j1)
        for p in pending:
            if p is not None:
                p.result()


def stream_writers() -> int:
    """Writer threads per device when streaming to the host: up to 3, fewer on small machines."""
    return int(max(1, min(3, cpu_threads() // 2)))


STORE_PIECE_BYTES = 16 << 20  # smallest piece of a strip's store given to a helper thread


def store_pieces() -> int:
    """Pieces each writer splits a condensed strip's store into (1: no helpers): up to 4, on machines
    with at least 4 cores per writer."""
    return int(max(1, min(4, cpu_threads() // (4 * stream_writers()) + 1)))
