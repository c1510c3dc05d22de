"""Memory budgets: how much work fits in one chunk, and whether a result fits in host memory at all.

Work is chunked so that peak device memory stays under a budget (by default half of the device's
free memory, or ``PROTGPU_GPU_MEMORY_BUDGET`` bytes, e.g. ``2e9``), and a result that cannot fit in
host memory is refused before anything is allocated, with its size in the message. This module is
imported on the CPU path too, so it imports CuPy only inside the functions that need the device.
"""

from __future__ import annotations

import os

from .errors import MemoryBudgetError


def format_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def _machine_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_available_bytes() -> int | None:
    """What this process's cgroup (v2) still allows: ``memory.max - memory.current``, None when
    unlimited or unknown. A container's limit is often far below the machine's MemAvailable."""
    try:
        with open("/proc/self/cgroup") as fh:
            path = next((line.strip().split(":", 2)[2] for line in fh if line.startswith("0::")), None)
        if path is None:
            return None
        base = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
        with open(os.path.join(base, "memory.max")) as fh:
            limit = fh.read().strip()
        if limit == "max":
            return None
        with open(os.path.join(base, "memory.current")) as fh:
            return max(0, int(limit) - int(fh.read().strip()))
    except (OSError, ValueError, IndexError):
        return None


def _rlimit_available_bytes() -> int | None:
    """Address space left under ``RLIMIT_AS`` (``ulimit -v``), None when unlimited or unknown."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/statm") as fh:
            used = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        return max(0, soft - used)
    except (ImportError, OSError, ValueError):
        return None


def host_available_bytes() -> int | None:
    """Host memory this process may still take, in bytes: the least of the machine's ``MemAvailable``,
    the cgroup's remaining limit and the ``RLIMIT_AS`` headroom; ``None`` where none is known."""
    known = [b for b in (_machine_available_bytes(), _cgroup_available_bytes(), _rlimit_available_bytes())
             if b is not None]
    return min(known) if known else None


def check_host_fits(nbytes: int, what: str) -> None:
    """Raise :class:`MemoryBudgetError` if a host allocation of ``nbytes`` cannot fit in memory."""
    avail = host_available_bytes()
    if avail is not None and nbytes > avail:
        raise MemoryBudgetError(
            f"{what} needs {format_bytes(nbytes)} but only {format_bytes(avail)} of host memory is "
            "available; pass out= (an np.memmap) or select fewer atoms/frames"
        )


def device_budget_bytes(fraction: float = 0.5) -> int:
    """Bytes of device memory one call may use: ``PROTGPU_GPU_MEMORY_BUDGET`` if set, else
    ``fraction`` of the current device's free memory (counting CuPy's pool's free blocks as free)."""
    env = os.environ.get("PROTGPU_GPU_MEMORY_BUDGET")
    if env:
        return int(float(env))
    import cupy

    free, _total = cupy.cuda.runtime.memGetInfo()
    free += cupy.get_default_memory_pool().free_bytes()
    return int(free * fraction)


def rows_per_chunk(bytes_per_row: int, n_rows: int, budget: int) -> int:
    """How many rows (frames, tiles) of ``bytes_per_row`` fit in ``budget``: at least 1, at most
    ``n_rows``."""
    if bytes_per_row <= 0:
        return max(n_rows, 1)
    return int(max(1, min(n_rows, budget // bytes_per_row)))


class DevicePeak:
    """Peak of live device memory in CuPy's pool while the ``with`` block runs (tests, benchmarks: the
    budget is a bound on what is allocated at once, which the pool's cached total does not show).

    Attributes
    ----------
    live : int
        Most bytes allocated at once from the pool, above what was live on entry.
    pool : int
        The pool's total (live and cached) bytes on exit.
    """

    def __enter__(self):
        import cupy as cp
        from cupy.cuda.memory_hook import MemoryHook

        pool = cp.get_default_memory_pool()
        base = pool.used_bytes()
        tracker = self

        class _Hook(MemoryHook):
            name = "protgpu_device_peak"

            def malloc_postprocess(self, **kwargs):
                tracker.live = max(tracker.live, pool.used_bytes() - base)

        self.live, self.pool, self._pool = 0, 0, pool
        self._hook = _Hook()
        self._hook.__enter__()
        return self

    def __exit__(self, *exc):
        self._hook.__exit__(*exc)
        self.pool = self._pool.total_bytes()
        return False
