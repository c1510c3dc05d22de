"""All-vs-all RMSD over several GPUs of one host: one host thread per device takes row tiles (or
condensed strips) from a shared queue and streams them into the one host destination
(:mod:`.streaming`). Internal API: :func:`device_ids`, :func:`pairwise_multi_gpu`.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np

from .._memory import check_host_fits, device_budget_bytes
from ..errors import InputError
from . import kernels, streaming
from .pairwise_gpu import PairPlan


def device_ids(devices) -> list[int]:
    """GPU ordinals from ``devices``: None (the current one), "all", a count, or a list of ordinals."""
    import cupy as cp

    n_visible = cp.cuda.runtime.getDeviceCount()
    if devices is None:
        return [cp.cuda.runtime.getDevice()]
    if isinstance(devices, str):
        if devices != "all":
            raise InputError(f"devices={devices!r}: use 'all', a count, or a list of GPU ordinals")
        return list(range(n_visible))
    if isinstance(devices, (int, np.integer)):
        if not 1 <= int(devices) <= n_visible:
            raise InputError(f"devices={devices}: {n_visible} GPU(s) visible")
        return list(range(int(devices)))
    ids = [int(d) for d in devices]
    if not ids or len(set(ids)) != len(ids) or not all(0 <= d < n_visible for d in ids):
        raise InputError(f"devices={list(devices)}: give distinct GPU ordinals in 0..{n_visible - 1}")
    return ids


def pairwise_multi_gpu(x, y, *, fit, weights, precision, out, condensed, devices, tile=None,
                        out_dtype=np.float32, check_names=(None, None)):
    """:func:`pairwise_cuda`'s streaming path spread over several GPUs: one host thread per device
    takes row tiles from a shared queue (largest first, so the triangle's work evens out), with its own
    copy of the centred frames, its own streams and writer, into the one host destination (tiles are
    disjoint regions of it)."""
    import threading
    from collections import deque

    import cupy as cp

    f = x.shape[0]
    g = f if y is None else y.shape[0]
    symmetric = y is None
    shape = (f * (f - 1) // 2,) if condensed else (f, g)
    odt = np.dtype(out.dtype if out is not None else out_dtype)
    if out is None:
        check_host_fits(int(np.prod(shape)) * odt.itemsize, "the RMSD matrix")
        out = np.empty(shape, dtype=odt)
        if symmetric and not condensed:
            out[np.arange(f), np.arange(f)] = 0
    sink = streaming.Sink(out, f, symmetric, condensed)
    strips = condensed and not tile
    if strips:
        t = streaming.condensed_strip_rows(f, odt.itemsize)
    else:
        t = max(1, min(int(tile or streaming.STREAM_TILE), max(f, g), 65535 * kernels.PAIR_BLOCK[1]))
    queue = deque(range(0, f, t))
    lock = threading.Lock()

    def row_starts():
        while True:
            with lock:
                if not queue:
                    return
                i0 = queue.popleft()
            yield i0

    def work(dev):
        with cp.cuda.Device(dev):
            plan = PairPlan(x, y, fit, weights, precision, odt, check_names)
            if strips:
                streaming.stream_condensed(plan, out, device_budget_bytes(), row_starts(), rows=t)
            else:
                streaming.stream_tiles(plan, sink, t, device_budget_bytes(), row_starts())
            cp.cuda.get_current_stream().synchronize()

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(devices)) as pool:
        for fut in [pool.submit(work, d) for d in devices]:
            fut.result()
    return out
