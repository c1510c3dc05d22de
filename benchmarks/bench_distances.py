"""Distance matrices: protgpu against torch.cdist, mdtraj.compute_distances and scipy's cdist.

Same data, same run. Default problem (the issue's): 500 frames x 1,000 atoms, all self-distance
matrices in float32 (2 GB written). GPU times are CUDA-event times with the coordinates already on
the device; CPU anchors are wall-clock. ``--quick`` shrinks everything so the script runs on a laptop.

    python3 benchmarks/bench_distances.py [--quick] [--frames F --atoms N] [--json PATH]
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from _common import print_table, time_cpu, time_gpu, write_results

COPY_BANDWIDTH = 4.24e12  # bytes read + written per second, device-to-device copy, measured on the H200


def sweep(xd, rows, n_frames, n, out_bytes) -> None:
    """Time the float32 matrix kernel alone for several ROWS_PER_BLOCK / block sizes."""
    import cupy

    from protgpu import _cuda

    zeros = cupy.zeros((1, 9), np.float64)
    out = cupy.empty((n_frames, n, n), np.float32)
    for rpb in (4, 8, 16, 32):
        h = _cuda.get_kernel("distances", "distance_matrix_f32", {"ROWS_PER_BLOCK": rpb})
        for threads in (64, 128, 256):
            grid = n_frames * (-(-n // rpb))
            t = time_gpu(lambda h=h, threads=threads, grid=grid: _cuda.launch(
                h, grid, threads, xd, xd, zeros, zeros, out, n_frames, n, n, 1, 0, 0), repeat=10)
            rows.append({"impl": f"sweep: kernel ROWS_PER_BLOCK={rpb}, {threads} threads", "frames_timed": n_frames,
                         "s_per_frame": t["median_s"] / n_frames, "total_s_for_all_frames": t["median_s"],
                         "note": f"{out_bytes / t['median_s'] / 1e12:.2f} TB/s"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=500)
    ap.add_argument("--atoms", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="small sizes (CPU-only machines)")
    ap.add_argument("--json", help="results file (default: benchmarks/results/distances-<device>.json)")
    ap.add_argument("--sweep", action="store_true", help="also time the kernel's ROWS_PER_BLOCK and block sizes")
    args = ap.parse_args()
    if args.quick:
        args.frames, args.atoms = 20, 300
    n_frames, n = args.frames, args.atoms

    import protgpu as pg
    from protgpu.distances import distances_numpy

    rng = np.random.default_rng(0)
    # protein-like coordinates: a random walk of 3.8 Angstrom steps, perturbed per frame
    steps = rng.normal(size=(n, 3))
    walk = np.cumsum(3.8 * steps / np.linalg.norm(steps, axis=1, keepdims=True), axis=0)
    x = (walk[None] + rng.normal(scale=1.0, size=(n_frames, n, 3))).astype(np.float32)
    out_bytes = n_frames * n * n * 4
    rows: list[dict] = []

    def add(impl, t, frames, note=""):
        per_frame = t["median_s"] / frames
        rows.append({"impl": impl, "frames_timed": frames, "s_per_frame": per_frame,
                     "total_s_for_all_frames": per_frame * n_frames, "note": note})

    gpu = pg.gpu_available()
    if gpu:
        import cupy

        xd = cupy.asarray(x)
        res = {}

        def run_pg():
            res["d"] = pg.distances(xd)

        t = time_gpu(run_pg, repeat=20)
        add("protgpu GPU (float32, exact)", t, n_frames,
            f"{out_bytes / t['median_s'] / 1e12:.2f} TB/s written; write floor "
            f"{out_bytes / (COPY_BANDWIDTH / 2) * 1e3:.3f} ms")
        ref64 = distances_numpy(x[:2].astype(np.float64))
        err_pg = float(np.max(np.abs(res["d"][:2].get() - ref64)))
        del res["d"]
        try:
            import torch

            xt = torch.as_tensor(x, device="cuda")

            def cdist_fast():
                return torch.cdist(xt, xt)

            # torch and CuPy both use the legacy default stream here, so CuPy's events time torch's work.
            t = time_gpu(cdist_fast, repeat=20)
            err = float(np.max(np.abs(cdist_fast()[:2].double().cpu().numpy() - ref64)))
            add("torch.cdist GPU (default, mm)", t, n_frames, f"max error {err:.3g} A")
            k = min(n_frames, 20)
            xk = xt[:k]
            t = time_gpu(lambda: torch.cdist(xk, xk, compute_mode="donot_use_mm_for_euclid_dist"), repeat=3)
            add("torch.cdist GPU (exact mode)", t, k, f"timed on {k} frames, scaled")
            rows[0]["note"] += f"; max error {err_pg:.3g} A"
        except ImportError:
            print("torch not installed: torch.cdist skipped")
        if args.sweep:
            sweep(xd, rows, n_frames, n, out_bytes)
        cupy.get_default_memory_pool().free_all_blocks()
    else:
        print("no usable GPU: GPU rows skipped")

    # CPU path of protgpu, per frame, against scipy's cdist per frame
    k = min(n_frames, 5)
    t = time_cpu(lambda: pg.distances(x[:k], device="cpu"), repeat=3)
    add("protgpu CPU (NumPy twin)", t, k)
    try:
        from scipy.spatial.distance import cdist

        t = time_cpu(lambda: [cdist(x[f], x[f]) for f in range(k)], repeat=3)
        add("scipy cdist (per frame, float64)", t, k)
    except ImportError:
        print("scipy not installed: cdist skipped")
    try:
        import mdtraj as md

        top = md.Topology()
        chain = top.add_chain()
        for _ in range(n):
            top.add_atom("CA", md.element.carbon, top.add_residue("ALA", chain))
        k = min(n_frames, 50)
        traj = md.Trajectory(x[:k] / 10.0, top)
        iu = np.triu_indices(n, 1)
        pairs = np.stack(iu, axis=1)
        t = time_cpu(lambda: md.compute_distances(traj, pairs, periodic=False), repeat=3)
        add(f"mdtraj.compute_distances (all pairs, {os.cpu_count()} cores)", t, k,
            "upper triangle only (half the output)")
    except ImportError:
        print("mdtraj not installed: skipped")

    base = rows[0]["s_per_frame"]
    for r in rows:
        r["ratio_to_protgpu"] = r["s_per_frame"] / base
    print(f"\n{n_frames} frames x {n} atoms, self-distance matrices ({out_bytes / 1e9:.2f} GB float32)\n")
    print_table(rows, ["impl", "s_per_frame", "total_s_for_all_frames", "ratio_to_protgpu", "note"])
    path = write_results("distances", rows, {"frames": n_frames, "atoms": n, "output_bytes": out_bytes}, args.json)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
