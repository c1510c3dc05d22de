"""CPU thread control for the NumPy paths: the usable core count (:func:`cpu_threads`; a batch parse
worker's share of them, :func:`share_cores`), a pool's task
runner (:func:`run_tasks`), the split of the cores between a QCP pool and BLAS (:func:`cpu_split`),
and BLAS's own thread count (:func:`blas_threads`, through threadpoolctl).
"""

from __future__ import annotations

import contextlib
import os

#: Environment variable that caps :func:`cpu_threads` (a batch parse worker's share of the cores: set
#: by the worker's initializer, :func:`share_cores`, and inherited by what it starts)
CPU_THREADS_ENV = "PROTGPU_CPU_THREADS"


def cpu_threads() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else the machine's
    count), at most ``$PROTGPU_CPU_THREADS`` when set; at least 1. The default worker count of the
    NumPy paths' thread pools."""
    try:
        n = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        n = max(1, os.cpu_count() or 1)
    cap = os.environ.get(CPU_THREADS_ENV, "")
    if cap.strip().isdigit() and int(cap) >= 1:
        n = min(n, int(cap))
    return n


def share_cores(n_processes: int) -> int:
    """Cap this process's :func:`cpu_threads` at its share of the cores when ``n_processes`` processes
    (a batch's parse workers) run at once: ``max(1, cores // n_processes)``, so that their thread pools
    together do not exceed the cores (each pool sized to every core, 16 workers on 16 cores would start
    256 threads). Returns the share. BLAS's thread count is left alone: the batch jobs' numbers depend on
    it in their last digits (``Job.uses_blas``), and a parse worker's BLAS threads stay idle (measured:
    the evaluate job's load runs on one thread)."""
    share = max(1, cpu_threads() // max(1, int(n_processes)))  # of a cap already set, if any
    os.environ[CPU_THREADS_ENV] = str(share)
    return share


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
