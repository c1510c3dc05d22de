"""Benchmark: pg.cluster (GROMOS, k-medoids, hierarchical) against its anchors, in one run.

Cases (``--quick`` divides the frame counts by 50):

1. GROMOS, 100,000 frames x 300 CA atoms, cutoff 2 Angstrom, coordinates on the device (the issue's
   target: at most 10 s end to end), with the peak of live device memory (bounded independent of F^2:
   the F x F float32 matrix alone would be 40 GB; at most the budget), and again on half the frames: a
   peak that follows the budget, not F^2, stays about the same (``--budget BYTES`` sets
   ``PROTGPU_GPU_MEMORY_BUDGET``; the default budget is half the free device memory).
2. k-medoids (FasterPAM), k = 50, on the same 100,000 frames (target: at most 30 s).
3. protgpu's own all-vs-all matrix of the 100,000 frames (condensed, resident on the device, float32: 20
   GB): the time of making the matrix the clustering never stores, as a ratio.
4. Anchors on 20,000 frames (CPU, precomputed matrix): SciPy's ``linkage`` (average) on the condensed
   matrix and the ``kmedoids`` package's FasterPAM from protgpu's k-means++ start (k = 50), against
   protgpu's GPU hierarchical / k-medoids of the same frames; the objective ratio must be <= 1.

Frames: the AdK trajectory's CA conformations (``datasets/``; 214 CA atoms, tiled to 300, whose
open-to-closed motion spans 6.8 Angstrom of RMSD, so a 2 Angstrom cutoff gives several clusters), each
moved rigidly with 0.3 Angstrom noise (``bench_rmsd.make_frames``). Without a GPU only the CPU anchors run. Writes
``benchmarks/results/cluster-<gpu>.json``. Run: ``python3 benchmarks/bench_cluster.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_results  # noqa: E402
from bench_rmsd import make_frames  # noqa: E402

import protgpu as pg  # noqa: E402
from protgpu._array import gpu_available  # noqa: E402
from protgpu.cluster import kmedoids as km_mod  # noqa: E402
from protgpu.cluster.source import MatrixRows  # noqa: E402


def _sync():
    import cupy as cp

    cp.cuda.get_current_stream().synchronize()


def timed_gpu(fn):
    """Wall seconds of ``fn()`` with the device synchronised before and after, and the peak of live device
    memory over the call (what the budget bounds; CuPy's pool is emptied first, and what it kept cached
    after the call is printed beside it)."""
    import cupy as cp

    from protgpu._memory import DevicePeak

    pool = cp.get_default_memory_pool()
    _sync()
    pool.free_all_blocks()
    with DevicePeak() as peak:
        t0 = time.perf_counter()
        out = fn()
        _sync()
        dt = time.perf_counter() - t0
    print(f"  live peak {peak.live / 1e9:.2f} GB, pool after {peak.pool / 1e9:.2f} GB", flush=True)
    return out, dt, peak.live


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--anchor-frames", type=int, default=20_000)
    ap.add_argument("--budget", type=float, default=None,
                    help="device memory budget in bytes (PROTGPU_GPU_MEMORY_BUDGET) for every protgpu call")
    args = ap.parse_args()
    if args.budget:
        import os

        os.environ["PROTGPU_GPU_MEMORY_BUDGET"] = str(int(args.budget))
    f_big = args.frames // (50 if args.quick else 1)
    f_anchor = args.anchor_frames // (50 if args.quick else 1)
    k = 50 if not args.quick else 10
    rows, extra = [], {}
    gpu = gpu_available()
    if gpu:
        import cupy as cp

        x = make_frames(f_big, 300, ca_only=True)
        xd = cp.asarray(x)
        pg.cluster(xd[:2000], cutoff=2.0, device="gpu")  # compile and warm cuBLAS outside the timings
        res, dt, peak = timed_gpu(lambda: pg.cluster(xd, method="gromos", cutoff=2.0, device="gpu"))
        rows.append({"case": f"GROMOS {f_big} x 300, cutoff 2 A (GPU)", "seconds": dt,
                     "clusters": int(len(res.sizes)), "largest": int(res.sizes.max()),
                     "peak_live_GB": peak / 1e9, "target_s": 10.0})
        # the peak against F: half the frames (a quarter of F^2) should keep about the same peak
        res_h, dt_h, peak_h = timed_gpu(lambda: pg.cluster(xd[:f_big // 2], method="gromos", cutoff=2.0,
                                                           device="gpu"))
        rows.append({"case": f"GROMOS {f_big // 2} x 300, cutoff 2 A (GPU)", "seconds": dt_h,
                     "clusters": int(len(res_h.sizes)), "largest": int(res_h.sizes.max()),
                     "peak_live_GB": peak_h / 1e9})
        res, dt, peak = timed_gpu(lambda: pg.cluster(xd, method="kmedoids", k=k, seed=0, device="gpu"))
        rows.append({"case": f"k-medoids k={k}, {f_big} x 300 (GPU)", "seconds": dt, "clusters": k,
                     "objective": res.objective, "peak_live_GB": peak / 1e9, "target_s": 30.0})
        try:
            _, dt_m, peak = timed_gpu(lambda: pg.pairwise_rmsd(xd, condensed=True, device="gpu"))
            rows.append({"case": f"pg.pairwise_rmsd {f_big} x 300 condensed, resident float32 (GPU)", "seconds": dt_m,
                         "peak_live_GB": peak / 1e9})
            extra["gromos_over_matrix"] = rows[0]["seconds"] / dt_m
            extra["kmedoids_over_matrix"] = rows[2]["seconds"] / dt_m
        except pg.MemoryBudgetError as exc:
            rows.append({"case": f"pg.pairwise_rmsd {f_big} x 300 (GPU)", "note": str(exc)})
        del xd
        cp.get_default_memory_pool().free_all_blocks()

    # Anchors on f_anchor frames: a precomputed matrix on the host.
    xa = make_frames(f_anchor, 300, seed=1, ca_only=True)
    t0 = time.perf_counter()
    cond = pg.pairwise_rmsd(xa, condensed=True, out=np.empty(f_anchor * (f_anchor - 1) // 2))
    rows.append({"case": f"pg.pairwise_rmsd {f_anchor} x 300 condensed float64 ({'GPU' if gpu else 'CPU'})",
                 "seconds": time.perf_counter() - t0})
    from scipy.cluster.hierarchy import linkage

    t0 = time.perf_counter()
    z = linkage(cond, method="average")
    t_scipy = time.perf_counter() - t0
    rows.append({"case": f"SciPy linkage average {f_anchor} (CPU, precomputed)", "seconds": t_scipy})
    dev = "gpu" if gpu else "cpu"
    t0 = time.perf_counter()
    h = pg.cluster(xa, method="hierarchical", linkage="average", k=k, device=dev)
    t_h = time.perf_counter() - t0
    rows.append({"case": f"pg.cluster hierarchical average {f_anchor} ({dev.upper()}, from coordinates)",
                 "seconds": t_h, "vs_scipy": t_h / t_scipy,
                 "same_as_scipy": bool(np.allclose(h.linkage[:, 2], z[:, 2], rtol=1e-9))})
    from scipy.spatial.distance import squareform

    d = squareform(cond)
    del cond
    src = MatrixRows(d)
    meds, _ = km_mod.kmeanspp_seed(src, k, 0)
    try:
        import kmedoids

        t0 = time.perf_counter()
        # n_cpu=1: the sequential FasterPAM (with more threads the package runs its parallel variant, which
        # shuffles the processing order: another algorithm, not the same start; 6,000 frames: 1.6e-4 apart)
        ref = kmedoids.fasterpam(d, meds.copy(), max_iter=100, n_cpu=1)
        t_km = time.perf_counter() - t0
        rows.append({"case": f"kmedoids package FasterPAM k={k}, {f_anchor} (CPU, 1 thread, precomputed)",
                     "seconds": t_km, "objective": float(ref.loss)})
    except ImportError:
        ref, t_km = None, None
    if ref is not None:
        # the test: the objective from the same start on the same data (this matrix; from
        # coordinates below the RMSDs differ in the last bits, so near-ties can lead elsewhere)
        t0 = time.perf_counter()
        same = pg.cluster(metric=d, method="kmedoids", k=k, seed=0, device=dev)
        rows.append({"case": f"pg.cluster k-medoids k={k}, {f_anchor} ({dev.upper()}, the same precomputed matrix)",
                     "seconds": time.perf_counter() - t0, "objective": same.objective,
                     "objective_ratio": same.objective / float(ref.loss)})
    del d, src
    t0 = time.perf_counter()
    c = pg.cluster(xa, method="kmedoids", k=k, seed=0, device=dev)
    t_c = time.perf_counter() - t0
    row = {"case": f"pg.cluster k-medoids k={k}, {f_anchor} ({dev.upper()}, from coordinates)", "seconds": t_c,
           "objective": c.objective}
    if ref is not None:
        row.update(vs_kmedoids=t_c / t_km, objective_ratio=c.objective / float(ref.loss))
    rows.append(row)
    print_table(rows, ["case", "seconds", "clusters", "largest", "objective", "peak_live_GB", "vs_scipy", "vs_kmedoids",
                       "objective_ratio", "target_s"])
    print(extra)
    print("wrote", write_results("cluster", rows, {"ratios": extra, "quick": bool(args.quick),
                                                   "budget_bytes": args.budget}, args.json))


if __name__ == "__main__":
    main()
