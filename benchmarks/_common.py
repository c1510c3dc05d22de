"""Shared pieces of the benchmark scripts: timers, machine description, the results file.

Each ``bench_<module>.py`` times protgpu and its anchors on the same data in the same run, prints a
table with ratios, and writes ``results/<module>-<device>.json`` holding the machine (GPU model,
CPU count), the git commit and the date next to every number.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing


def time_cpu(fn, *, repeat: int = 5, warmup: int = 1) -> dict:
    """Wall-clock seconds of ``fn()`` (median, min, max over ``repeat`` runs after ``warmup``)."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "runs": repeat}


def time_gpu(fn, *, repeat: int = 20, warmup: int = 3, inner: int = 1) -> dict:
    """GPU seconds of ``fn()`` on CuPy's current stream, measured with CUDA events (median of
    ``repeat`` after ``warmup``). ``fn`` must only enqueue work (no host synchronisation). With
    ``inner > 1`` that many calls run back to back between the two events and the time per call is
    reported, which hides the host's launch overhead behind the GPU work."""
    import cupy

    for _ in range(warmup):
        fn()
    cupy.cuda.get_current_stream().synchronize()
    ts = []
    for _ in range(repeat):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3 / inner)
    return {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "runs": repeat}


def machine() -> dict:
    """GPU model (if any), CPU count, host, Python, and the git commit of this checkout."""
    info = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    # PROTGPU_COMMIT first: on the GPU machine the checkout arrives without its git history.
    info["commit"] = os.environ.get("PROTGPU_COMMIT")
    if not info["commit"]:
        try:
            info["commit"] = subprocess.run(
                ["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            info["commit"] = "unknown"
    try:
        from protgpu._array import gpu_available

        if gpu_available():
            import cupy

            props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
            info["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            info["gpu_memory_bytes"] = int(props["totalGlobalMem"])
        else:
            info["gpu"] = None
    except Exception as exc:  # a benchmark must still write its CPU numbers
        info["gpu"] = f"unknown ({exc})"
    return info


def device_tag(info: dict) -> str:
    gpu = info.get("gpu")
    return (gpu or "cpu").lower().replace("nvidia ", "").replace(" ", "-")


def write_results(module: str, rows: list[dict], extra: dict | None = None, path: str | None = None) -> Path:
    """Write ``{"machine": ..., "rows": rows, ...}`` to ``results/<module>-<device>.json`` (or ``path``)
    atomically, and return the path."""
    info = machine()
    out = Path(path) if path else RESULTS / f"{module}-{device_tag(info)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": module, "machine": info, "rows": rows, **(extra or {})}
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=float) + "\n")
    os.replace(tmp, out)
    return out


def print_table(rows: list[dict], columns: list[str]) -> None:
    """Print ``rows`` as a Markdown table with the given columns."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        print("| " + " | ".join(fmt(r.get(c)) for c in columns) + " |")
