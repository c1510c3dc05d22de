"""OpenStructure's GDT (``protgpu.scoring.gdt_windows``) alone: per-model cost for complex-sized models
(455 mapped CA pairs, a 305 + 150 complex; 2,181 seed windows x 5 cutoffs), on the CPU (NumPy twin on a
few models, numba over the process's threads) and on the GPU (the kernel over N models, CUDA events),
with the GPU counts checked against the CPU path's.

Data: a synthetic CA chain (random walk of 2.2 A steps) and models of it with Gaussian noise of 0.3-3 A.

    python3 benchmarks/bench_gdt_windows.py [--models N] [--pairs L] [--cpu-models K] [--no-numpy]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import print_table, time_cpu, time_gpu, write_results

from protgpu.scoring import _fast
from protgpu.scoring import gdt_windows as gw


def _data(m: int, n: int):
    rng = np.random.default_rng(5)
    y = np.cumsum(rng.normal(size=(n, 3)) * 2.2, axis=0)
    x = y[None] + rng.normal(size=(m, n, 3)) * rng.uniform(0.3, 3.0, size=(m, 1, 1))
    return x, y[None], np.full(m, n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=455)
    ap.add_argument("--cpu-models", type=int, default=32)
    ap.add_argument("--no-numpy", action="store_true")
    a = ap.parse_args()
    rows = []
    x, y, n = _data(a.models, a.pairs)
    k = min(a.cpu_models, a.models)
    cpu_counts = None
    if _fast.enabled():
        gw.gdt_windows_fast(x[:1], y, n[:1])  # compile
        t = time_cpu(lambda: gw.gdt_windows_fast(x[:k], y, n[:k]), repeat=3)
        from protgpu._threads import cpu_threads

        rows.append({"path": f"numba ({cpu_threads()} threads)", "models": k,
                     "ms_per_model": 1e3 * t["median_s"] / k, "models_per_s": k / t["median_s"]})
        cpu_counts = gw.gdt_windows_fast(x[:k], y, n[:k])
    if not a.no_numpy:
        t0 = time.perf_counter()
        gw.gdt_windows_numpy(x[:2], y, n[:2])
        s = (time.perf_counter() - t0) / 2
        rows.append({"path": "numpy twin (1 thread)", "models": 2, "ms_per_model": 1e3 * s, "models_per_s": 1 / s})
    from protgpu._array import gpu_available

    if gpu_available():
        import cupy

        xd, yd = cupy.asarray(x), cupy.asarray(y)
        got = cupy.asnumpy(gw.gdt_windows_cuda(xd[:k], yd, n[:k]))
        if cpu_counts is not None:
            assert np.array_equal(got, cpu_counts), "GPU counts differ from the CPU path's"
        t = time_gpu(lambda: gw.gdt_windows_cuda(xd, yd, n), repeat=5, warmup=1)
        rows.append({"path": "cuda (kernels/gdt_windows.cu)", "models": a.models,
                     "ms_per_model": 1e3 * t["median_s"] / a.models, "models_per_s": a.models / t["median_s"]})
    print_table(rows, ["path", "models", "ms_per_model", "models_per_s"])
    print("wrote", write_results("gdt_windows", rows, {"pairs": a.pairs}))


if __name__ == "__main__":
    main()
