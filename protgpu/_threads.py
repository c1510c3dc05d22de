"""CPU thread control for the NumPy paths: the usable core count (:func:`cpu_threads`), a pool's task
runner (:func:`run_tasks`), the split of the cores between a QCP pool and BLAS (:func:`cpu_split`),
and BLAS's own thread count (:func:`blas_threads`, through threadpoolctl).
"""

from __future__ import annotations

import contextlib
import os


def cpu_threads() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else the machine's
    count); at least 1. The default worker count of the NumPy paths' thread pools."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def run_tasks(pool, fn, items):
    """``fn(item)`` for every item: on ``pool``'s threads when given (NumPy's ufuncs and BLAS release
    the GIL), else in order here. Each call writes its own part of the result, so the order of
    completion does not matter; the first exception is raised."""
    items = list(items)
    if pool is None or len(items) < 2:
        for it in items:
            fn(it)
    else:
        for fut in [pool.submit(fn, it) for it in items]:
            fut.result()


def cpu_split(n_threads: int) -> tuple[int, int]:
    """``(QCP pool threads, BLAS threads)`` for the CPU all-vs-all RMSD
    (:func:`protgpu.superpose.pairwise_cpu.pairwise_numpy`) on ``n_threads`` cores.

    The QCP threads and BLAS's threads (the next tile's GEMM) run at the same time, so together they
    must not exceed the cores: OpenBLAS's idle threads spin for ~0.1 s after each GEMM, and a tile's
    QCP takes less than that, so every core they share runs at half speed. Measured on 16 cores
    (4,000 x 500 frames): 16 QCP + 16 BLAS threads 2.77 s, 4 + 12 0.85 s, 8 + 8 0.98 s, 16 + 4 0.95 s,
    1 + 16 1.86 s (mdtraj.rmsd over every reference, same run: 1.67 s). A quarter of the cores for the QCP
    (at most 8: it scales sub-linearly, GIL hand-overs) and the rest for BLAS."""
    qcp = max(1, min(8, n_threads // 4))
    return qcp, max(1, n_threads - qcp)


_BLAS_CONTROLLER: list = []  # threadpoolctl's ThreadpoolController, made once (it scans the loaded libraries)


def blas_controller():
    """threadpoolctl's ``ThreadpoolController`` of this process (made on first use, then kept: making it
    scans the loaded libraries), or None without threadpoolctl."""
    if not _BLAS_CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController

            _BLAS_CONTROLLER.append(ThreadpoolController())
        except ImportError:  # (a dependency; without it BLAS keeps its own thread count)
            _BLAS_CONTROLLER.append(None)
    return _BLAS_CONTROLLER[0]


@contextlib.contextmanager
def blas_threads(n: int):
    """BLAS limited to ``n`` threads inside the block (threadpoolctl; the setting is process-wide)."""
    controller = blas_controller()
    if controller is None:
        yield
        return
    with controller.limit(limits=int(n), user_api="blas"):
        yield
