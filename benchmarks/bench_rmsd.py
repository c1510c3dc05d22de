"""Benchmark: RMSD to one reference, and all-vs-all RMSD (GEMM + QCP), protgpu vs its anchors.

Cases (same data for every tool, in one run):

1. all-vs-all, 4,000 frames x 500 atoms (``--quick``: 400 x 500): ``pg.pairwise_rmsd`` (float64 and
   float32 GEMM) in pairs/s, against
   * ``mdtraj.rmsd`` looped over references: only a subset of the references is timed and pairs/s
     extrapolated from it (each call does the same work, F pairs);
   * torch (when importable), the best plain-torch formulation: one GEMM for the 3x3 blocks and a
     batched 3x3 SVD (``eigvalsh`` on 4x4 key matrices fails in cuSOLVER), on the GPU if there is one;
   * the bare cuBLAS GEMM of the same shape (``A @ A.T`` in CuPy, float64), the floor the GEMM
     formulation can reach: the ratio says what the QCP step and the triangular schedule cost.
   Accuracy against a float64 Kabsch (SVD) reference on 60 x 60 of the pairs is reported too. The CPU
   path's row has ``cpu_vs_mdtraj`` (same run), and a "CPU parts" row says how its centring, GEMM and
   QCP scale from 1 thread to every core.
2. ``--full`` only (GPU): 50,000 x 300 all-vs-all streamed to an on-disk np.memmap (10 GB, float32).
3. RMSD to one reference, 100,000 frames x 1,000 atoms (``--quick``: 5,000), vs ``mdtraj.rmsd``.

Frames are real protein conformations (the AdK trajectory in ``datasets/``, first atoms), each with
a random rigid motion and 0.3 Angstrom of noise, so that QCP sees realistic eigenvalue spectra.
Without a GPU only the CPU paths are timed. Run: ``python3 benchmarks/bench_rmsd.py [--quick]
[--full] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, time_cpu, time_gpu, write_results  # noqa: E402

from protgpu import _threads  # noqa: E402
from protgpu._array import gpu_available  # noqa: E402
from protgpu.superpose import kernels, pairwise_cpu, pairwise_gpu, pairwise_rmsd, qcp, rmsd, streaming  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _random_rotations(rng, n):
    q = rng.normal(size=(n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return qcp.quaternion_to_rotation(q)


def make_frames(n_frames: int, n_atoms: int, seed: int = 0, ca_only: bool = False) -> np.ndarray:
    """(n_frames, n_atoms, 3) float32 Angstrom: AdK conformations (cycled, atoms tiled if more are
    asked for than the protein has; all atoms, or with ``ca_only`` the 214 CA atoms, whose open-to-closed
    motion spans 6.8 Angstrom of RMSD), randomly moved, plus 0.3 Angstrom noise."""
    rng = np.random.default_rng(seed)
    base = None
    try:
        import mdtraj as md

        t = md.load(str(REPO / "datasets" / "adk_dims.dcd"), top=str(REPO / "datasets" / "adk_open.pdb"))
        base = t.xyz.astype(np.float32) * 10
        if ca_only:
            base = base[:, t.topology.select("name CA")]
    except Exception as exc:  # the data set or mdtraj missing: Gaussian blobs still benchmark speed
        print(f"(AdK trajectory not available: {exc}; using random coordinates)")
    if base is None:
        base = rng.normal(size=(50, max(n_atoms, 100), 3)).astype(np.float32) * 12
    reps = -(-n_atoms // base.shape[1])
    base = np.concatenate([base + 40 * k for k in range(reps)], axis=1)[:, :n_atoms]
    out = np.empty((n_frames, n_atoms, 3), dtype=np.float32)
    chunk = 5000
    for f0 in range(0, n_frames, chunk):
        f1 = min(n_frames, f0 + chunk)
        k = np.arange(f0, f1) % len(base)
        rot = _random_rotations(rng, f1 - f0).astype(np.float32)
        x = base[k] + rng.normal(scale=0.3, size=(f1 - f0, n_atoms, 3)).astype(np.float32)
        out[f0:f1] = np.matmul(x, rot.transpose(0, 2, 1)) + rng.normal(scale=20, size=(f1 - f0, 1, 3))
    return out


def kabsch_matrix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """float64 Kabsch (SVD) RMSD of every pair, the accuracy reference."""
    xc = x.astype(np.float64) - x.mean(axis=1, keepdims=True, dtype=np.float64)
    yc = y.astype(np.float64) - y.mean(axis=1, keepdims=True, dtype=np.float64)
    m = np.einsum("fni,gnj->fgij", xc, yc)
    u, s, vt = np.linalg.svd(m)
    d = np.sign(np.linalg.det(u @ vt))
    s[..., 2] *= d
    g = (xc**2).sum(axis=(1, 2))[:, None] + (yc**2).sum(axis=(1, 2))[None, :]
    return np.sqrt(np.maximum(g - 2 * s.sum(-1), 0) / x.shape[1])


def mdtraj_traj(x: np.ndarray):
    import mdtraj as md

    top = md.Topology()
    res = top.add_residue("ALA", top.add_chain())
    for _ in range(x.shape[1]):
        top.add_atom("CA", md.element.carbon, res)
    return md.Trajectory(x / 10.0, top)


def torch_pairwise(x, device):
    """All-vs-all RMSD in plain torch: centred stacked GEMM for the 3x3 blocks, batched SVD."""
    import torch

    xt = torch.as_tensor(x, dtype=torch.float64, device=device)
    xt = xt - xt.mean(dim=1, keepdim=True)
    f, n = xt.shape[:2]
    a = xt.transpose(1, 2).reshape(3 * f, n)
    g = (xt * xt).sum(dim=(1, 2))
    out = torch.empty((f, f), dtype=torch.float64, device=device)
    rows = max(1, min(f, 4_000_000 // f))
    for i0 in range(0, f, rows):
        i1 = min(f, i0 + rows)
        blocks = (a[3 * i0:3 * i1] @ a.T).reshape(i1 - i0, 3, f, 3).transpose(1, 2).reshape(-1, 3, 3)
        s = torch.linalg.svdvals(blocks)
        d = torch.sign(torch.linalg.det(blocks))
        tr = s[:, 0] + s[:, 1] + d * s[:, 2]
        e = (g[i0:i1, None] + g[None, :] - 2 * tr.reshape(i1 - i0, f)) / n
        out[i0:i1] = torch.sqrt(torch.clamp(e, min=0))
    return out


def _resident_strips(plan):
    """The (i0, i1, p0, p1) GEMM panels of a symmetric resident run, as pairwise_gpu.pairwise_cuda makes them."""
    rows = pairwise_gpu.strip_rows(plan.f)
    out = []
    for i0 in range(0, plan.f, rows):
        out.append((i0, min(plan.f, i0 + rows), i0, plan.f))
    return out


def _gpu_parts(x_dev, f, prec):
    """Median GPU seconds of (centring, the strips' GEMMs, the strips' QCP kernels) for one precision."""
    import cupy as cp

    t_c = time_gpu(lambda: pairwise_gpu.PairPlan(x_dev, None, None, None, prec, np.float32), repeat=5, warmup=1)
    plan = pairwise_gpu.PairPlan(x_dev, None, None, None, prec, np.float32)
    strips = _resident_strips(plan)
    t_g = time_gpu(lambda: [plan.gemm(*s) for s in strips], repeat=5, warmup=1)
    blocks = [plan.gemm(*s) for s in strips]
    dst = cp.empty((f, f), dtype=np.float32)
    mode = kernels.MIRROR | kernels.UPPER_ONLY | kernels.ZERO_DIAG

    def qcp():
        for (i0, i1, p0, p1), bl in zip(strips, blocks, strict=True):
            plan.qcp(bl, p0, i0, i1, p0, p1, dst, f, i0, p0, mode)

    t_q = time_gpu(qcp, repeat=5, warmup=1)
    frac = sum((i1 - i0) * (p1 - p0) for i0, i1, p0, p1 in strips) / (f * f)
    return t_c["median_s"], t_g["median_s"], t_q["median_s"], len(strips), frac


def bench_gpu_parts(x_dev, f, n, rows):
    """Where the GPU all-vs-all time goes: centring, the strips' GEMMs, the QCP kernels (the sum is a
    little below the whole call, which also allocates and launches from Python)."""
    for prec in ("float64", "float32"):
        t_c, t_g, t_q, k, frac = _gpu_parts(x_dev, f, prec)
        rows.append({"case": f"all-vs-all {f}x{n} parts ({prec} GEMM)",
                     "tool": f"protgpu GPU: centre {t_c * 1e3:.3f} ms, GEMM {t_g * 1e3:.3f} ms ({k} strips, "
                             f"{frac:.0%} of the square), QCP {t_q * 1e3:.3f} ms",
                     "centre_s": t_c, "gemm_s": t_g, "qcp_s": t_q, "gemm_fraction_of_square": frac})


def bench_cpu_parts(x, rows, max_tiles=8):
    """Where the CPU all-vs-all time goes and how each part scales with threads, to predict other core
    counts: the centring and the QCP (on ``pairwise_cpu.pairwise_numpy``'s pool) on 1 thread and on every core, and
    the GEMM of every tile through NumPy's BLAS (its own threads). The QCP is timed on up to
    ``max_tiles`` tiles (each tile's 3x3 blocks take 19 MB): on 1 thread with the single-thread groups,
    on every core with the pool's groups (``pairwise_cpu.qcp_group``) and with ``qcp.CHUNK_PAIRS`` (the GIL
    hand-overs per pair are what the group size trades against cache)."""
    import concurrent.futures as cf

    f, n = x.shape[:2]
    threads = _threads.cpu_threads()
    a, g = pairwise_cpu.centre_frames_numpy(x, None, None)
    tiles = list(streaming.tiles(f, f, pairwise_cpu.CPU_TILE, True))
    t_gemm = time_cpu(lambda: [a[3 * i0:3 * i1] @ a[3 * j0:3 * j1].T for i0, i1, j0, j1 in tiles], repeat=3)
    sample = tiles[::max(1, len(tiles) // max_tiles)][:max_tiles]
    blocks = [a[3 * i0:3 * i1] @ a[3 * j0:3 * j1].T for i0, i1, j0, j1 in sample]
    n_pairs = sum((i1 - i0) * (i1 - i0 - 1) // 2 if i0 == j0 else (i1 - i0) * (j1 - j0) for i0, i1, j0, j1 in sample)

    def run_qcp(pool, group):
        for bl, (i0, i1, j0, j1) in zip(blocks, sample, strict=True):
            pairwise_cpu.qcp_tile_numpy(bl, g[i0:i1], g[j0:j1], 1.0 / n, upper=i0 == j0, pool=pool, group=group)

    base, used = qcp.CHUNK_PAIRS, pairwise_cpu.qcp_group(threads)
    t_c1 = time_cpu(lambda: pairwise_cpu.centre_frames_numpy(x, None, None), repeat=3)
    t_q1 = time_cpu(lambda: run_qcp(None, base), repeat=3)
    with cf.ThreadPoolExecutor(threads) as pool:
        t_cn = time_cpu(lambda: pairwise_cpu.centre_frames_numpy(x, None, None, pool), repeat=3)
        t_qn = time_cpu(lambda: run_qcp(pool, used), repeat=3)
        t_qb = time_cpu(lambda: run_qcp(pool, base), repeat=3)
    q1, qn, qb = (n_pairs / t["median_s"] for t in (t_q1, t_qn, t_qb))
    rows.append({"case": f"all-vs-all {f}x{n} CPU parts",
                 "tool": f"protgpu CPU: centre {t_c1['median_s'] * 1e3:.1f} -> {t_cn['median_s'] * 1e3:.1f} ms "
                         f"(1 -> {threads} threads); GEMM {t_gemm['median_s']:.3f} s (BLAS threads, all tiles); "
                         f"QCP {q1:.3g} -> {qn:.3g} pairs/s (x{qn / q1:.2f}, groups of {base} -> {used}; "
                         f"{threads} threads with groups of {base}: {qb:.3g})",
                 "threads": threads, "centre_1thread_s": t_c1["median_s"], "centre_s": t_cn["median_s"],
                 "gemm_s": t_gemm["median_s"], "qcp_1thread_pairs_per_s": q1, "qcp_pairs_per_s": qn,
                 "qcp_pairs_per_s_small_groups": qb, "qcp_thread_scaling": qn / q1, "qcp_group": used})


def bench_pairwise(f, n, rows, use_gpu, quick):
    x = make_frames(f, n, seed=1)
    pairs = f * f
    # Accuracy on a subset, against float64 Kabsch.
    sub = x[:60]
    ref = kabsch_matrix(sub, sub)
    for prec in ("float64", "float32"):
        d = pairwise_cpu.pairwise_numpy(sub, precision=prec, out_dtype=np.float64)
        off = ~np.eye(len(sub), dtype=bool)
        rows.append({"case": f"accuracy {prec} GEMM (60x60, CPU twin)", "tool": "protgpu",
                     "max_err_A": float(np.abs(d - ref)[off].max()), "self_rmsd_A": float(np.abs(np.diag(d)).max())})
    # Anchors first: OpenBLAS threads still spinning after protgpu's GEMMs would slow MDTraj's OpenMP.
    # The accuracy rows above ran GEMMs too: give OpenBLAS's threads time to go to sleep (they spin for
    # ~0.1 s; on 2 cores the --quick loop otherwise measured 40x below MDTraj's own speed).
    md_pairs_per_s = None
    try:
        import mdtraj as md

        traj = mdtraj_traj(x)
        traj.center_coordinates()
        n_ref = 10 if quick else 40
        time.sleep(0.5)
        md.rmsd(traj, traj, 0, precentered=True)
        t0 = time.perf_counter()
        for j in range(n_ref):
            md.rmsd(traj, traj, j, precentered=True)
        dt = time.perf_counter() - t0
        md_pairs_per_s = f * n_ref / dt
        rows.append({"case": f"all-vs-all {f}x{n}", "tool": f"mdtraj.rmsd loop ({n_ref} refs timed, extrapolated)",
                     "seconds": dt / n_ref * f, "pairs_per_s": md_pairs_per_s})
    except ImportError:
        print("mdtraj not installed: skipped")
    # The CPU path (NumPy BLAS GEMM + vectorised QCP), whole matrix, on every machine: the issue asks it
    # to be no slower than the mdtraj loop on the same machine.
    t = time_cpu(lambda: pairwise_rmsd(x, device="cpu"), repeat=1 if not quick else 2, warmup=0 if not quick else 1)
    row = {"case": f"all-vs-all {f}x{n}", "tool": "protgpu CPU (float64 GEMM)",
           "seconds": t["median_s"], "pairs_per_s": pairs / t["median_s"]}
    if md_pairs_per_s:
        row["cpu_vs_mdtraj"] = row["pairs_per_s"] / md_pairs_per_s
    rows.append(row)
    bench_cpu_parts(x, rows)
    if use_gpu:
        import cupy as cp

        xd = cp.asarray(x)
        for prec in ("float64", "float32"):
            t = time_gpu(lambda p=prec: pairwise_rmsd(xd, precision=p, device="gpu"), repeat=5, warmup=1)
            rows.append({"case": f"all-vs-all {f}x{n}", "tool": f"protgpu GPU ({prec} GEMM)",
                         "seconds": t["median_s"], "pairs_per_s": pairs / t["median_s"]})
        bench_gpu_parts(xd, f, n, rows)
        dg = cp.asnumpy(pairwise_rmsd(xd[:60], device="gpu", precision="float64")).astype(np.float64)
        rows.append({"case": "accuracy float64 GEMM (60x60, GPU)", "tool": "protgpu",
                     "max_err_A": float(np.abs(dg - ref)[~np.eye(60, dtype=bool)].max())})
        a, _ = pairwise_gpu.centre_frames_cuda(xd, None, None, np.dtype(np.float64))
        t = time_gpu(lambda: a @ a.T, repeat=5, warmup=1)
        rows.append({"case": f"all-vs-all {f}x{n}", "tool": "bare cuBLAS A @ A.T (float64, full square)",
                     "seconds": t["median_s"], "pairs_per_s": pairs / t["median_s"]})
    try:
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        if dev == "cpu" and not quick and f > 2000:
            print("torch without CUDA: timing a 1000-frame subset and extrapolating")
            xs = x[:1000]
        else:
            xs = x
        torch_pairwise(xs[:8], dev)
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch_pairwise(xs, dev)
        if dev == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rows.append({"case": f"all-vs-all {f}x{n}", "tool": f"torch GEMM + batched 3x3 SVD ({dev})",
                     "seconds": dt * (f / len(xs)) ** 2, "pairs_per_s": len(xs) ** 2 / dt})
    except ImportError:
        print("torch not installed: skipped")
    return rows


def bench_streamed(rows, f=50_000, n=300):
    """The issue's scale case: 50,000 x 300 all-vs-all, condensed float32 (5 GB) streamed into an on-disk
    ``np.memmap``, end to end (compute, copies, writes, and the flush to disk); peak device memory is
    sampled from cudaMemGetInfo every 5 ms while it runs."""
    import threading

    import cupy as cp

    x = make_frames(f, n, seed=2)
    free0, total = cp.cuda.runtime.memGetInfo()
    peak = [0]
    running = [True]

    def poll():
        while running[0]:
            free, _ = cp.cuda.runtime.memGetInfo()
            peak[0] = max(peak[0], free0 - free)
            time.sleep(0.005)

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        path = os.path.join(d, "pairwise.npy")
        shape = (f * (f - 1) // 2,)
        mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        t0 = time.perf_counter()
        pairwise_rmsd(x, out=mm, condensed=True, device="gpu")
        t1 = time.perf_counter()
        mm.flush()
        dt = time.perf_counter() - t0
        running[0] = False
        watcher.join()
        idx = np.arange(50)
        ii, jj = np.triu_indices(50, 1)
        probe = np.asarray(mm[ii * f - ii * (ii + 1) // 2 + (jj - ii - 1)], dtype=np.float64)
        ref = kabsch_matrix(x[idx], x[idx])[ii, jj]
        rows.append({"case": f"all-vs-all {f}x{n} condensed -> np.memmap on disk ({len(mm) * 4 / 1e9:.1f} GB)",
                     "tool": "protgpu GPU (float64 GEMM, streamed)", "seconds": dt, "pairs_per_s": len(mm) / dt,
                     "compute_and_write_s": t1 - t0, "flush_s": dt - (t1 - t0),
                     "peak_device_gb": peak[0] / 1e9, "max_err_A": float(np.abs(probe - ref).max())})
        del mm
    return rows


def bench_to_reference(f, n, rows, use_gpu, quick):
    x = make_frames(f, n, seed=3)
    ref = x[0]
    try:
        import mdtraj as md

        traj = mdtraj_traj(x)
        t = time_cpu(lambda: md.rmsd(traj, traj, 0), repeat=3 if quick else 1)
        t_md = t["median_s"]
        rows.append({"case": f"rmsd to one reference {f}x{n}", "tool": "mdtraj.rmsd",
                     "seconds": t["median_s"], "frames_per_s": f / t["median_s"]})
        r_md = md.rmsd(traj, traj, 0) * 10
    except ImportError:
        r_md = None
        print("mdtraj not installed: skipped")
    if use_gpu:
        import cupy as cp

        xd = cp.asarray(x)
        t = time_gpu(lambda: rmsd(xd, ref, device="gpu"), repeat=10, warmup=2)
        rows.append({"case": f"rmsd to one reference {f}x{n}", "tool": "protgpu GPU (CuPy in)",
                     "seconds": t["median_s"], "frames_per_s": f / t["median_s"]})
        t = time_cpu(lambda: rmsd(x, ref, device="gpu"), repeat=3)
        rows.append({"case": f"rmsd to one reference {f}x{n}", "tool": "protgpu GPU (NumPy in, incl. copies)",
                     "seconds": t["median_s"], "frames_per_s": f / t["median_s"]})
    t = time_cpu(lambda: rmsd(x, ref, device="cpu"), repeat=3 if quick else 1)
    row = {"case": f"rmsd to one reference {f}x{n}", "tool": "protgpu CPU",
           "seconds": t["median_s"], "frames_per_s": f / t["median_s"]}
    if r_md is not None:
        row["cpu_vs_mdtraj"] = t_md / t["median_s"]
    rows.append(row)
    if r_md is not None:
        rows.append({"case": f"rmsd to one reference {f}x{n}", "tool": "|protgpu - mdtraj| max (A)",
                     "max_err_A": float(np.abs(r_md - rmsd(x, ref, device="cpu")).max())})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (runs on a CPU in < 60 s)")
    ap.add_argument("--full", action="store_true", help="also the 50,000 x 300 streamed case (GPU)")
    ap.add_argument("--json", help="results file (default benchmarks/results/rmsd-<device>.json)")
    args = ap.parse_args(argv)
    use_gpu = gpu_available()
    print(f"GPU: {'yes' if use_gpu else 'no (CPU paths only)'}")
    rows: list[dict] = []
    f_pair = 400 if args.quick else 4000
    f_ref = 5000 if args.quick else 100_000
    bench_pairwise(f_pair, 500, rows, use_gpu, args.quick)
    if args.full:
        if use_gpu:
            bench_streamed(rows)
        else:
            print("--full: the streamed 50,000 x 300 case needs a GPU: skipped")
    bench_to_reference(f_ref, 1000, rows, use_gpu, args.quick)
    # Ratios against protgpu's best time in each case.
    best: dict = {}
    for r in rows:
        if r.get("seconds") and r["tool"].startswith("protgpu"):
            best[r["case"]] = min(best.get(r["case"], np.inf), r["seconds"])
    for r in rows:
        if r.get("seconds") and r["case"] in best:
            r["x_protgpu_time"] = r["seconds"] / best[r["case"]]
    print_table(rows, ["case", "tool", "seconds", "pairs_per_s", "frames_per_s", "x_protgpu_time", "cpu_vs_mdtraj",
                       "max_err_A", "self_rmsd_A"])
    out = write_results("rmsd", rows, {"quick": args.quick, "full": args.full}, path=args.json)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
