"""Benchmark: ensemble consensus score (fused RMSD tiles + online softmax) against pairwise_rmsd alone.

The issue's target: 20,000 models x 300 CA atoms, coordinates on the device, ``pg.consensus_score``
within 1.3x of ``pg.pairwise_rmsd`` alone (which makes the same RMSDs and stores the M x M matrix, while
the consensus keeps O(tile^2) memory). Cases, same data for every tool, in one run:

1. GPU (when there is one): 20,000 x 300 (``--quick``: 4,000 x 300), CuPy in, timed with CUDA events:
   * ``pairwise_rmsd`` alone (float64 GEMM, the resident float32 M x M result);
   * ``consensus_score`` (the fused path; ratio to the above is the target), and the tile sizes of
     ``--tiles``;
   * the materialised anchor: ``pairwise_rmsd`` and then the softmax and score in CuPy on the M x M
     matrix (what one writes without the fused pass);
   * ``return_weights=True`` (materialises the M x M weights);
   * peak CuPy memory-pool bytes of each, and the GPU-vs-NumPy-twin difference on 600 models.
2. CPU: 1,500 x 300 (``--quick``: 300 x 300): the NumPy twin against ``pairwise_rmsd`` alone, and the
   anchor ``mdtraj.rmsd`` looped over references (a subset timed, extrapolated) plus the same NumPy
   softmax, when mdtraj is installed.

Models are real conformations (the AdK trajectory in ``datasets/``, CA atoms, tiled to 300 atoms),
each randomly moved, with 0.5 Angstrom of noise. Run: ``python3 benchmarks/bench_consensus.py
[--quick] [--json PATH] [--models M] [--tiles 2048,4096,8192]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, time_cpu, time_gpu, write_results  # noqa: E402

from protgpu._array import gpu_available  # noqa: E402
from protgpu.scoring import consensus as cs  # noqa: E402
from protgpu.scoring.tmscore import d0_tmscore  # noqa: E402
from protgpu.superpose import pairwise_rmsd, qcp  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TARGET = 1.3


def make_models(n_models: int, n_atoms: int, seed: int = 0) -> np.ndarray:
    """(n_models, n_atoms, 3) float32 Angstrom: AdK CA conformations (cycled; atoms tiled, shifted by 40
    Angstrom, past 214), randomly moved, plus 0.5 Angstrom noise."""
    rng = np.random.default_rng(seed)
    try:
        from protgpu.io import load

        t = load(REPO / "datasets" / "adk_dims.dcd", top=REPO / "datasets" / "adk_open.pdb")
        base = t.coords[:, t.select_indices("ca")]
    except Exception as exc:  # data or mdtraj missing: random blobs still measure speed
        print(f"(AdK trajectory not available: {exc}; using random coordinates)")
        base = (rng.normal(size=(50, 214, 3)) * 12).astype(np.float32)
    reps = -(-n_atoms // base.shape[1])
    base = np.concatenate([base + 40 * k for k in range(reps)], axis=1)[:, :n_atoms]
    out = np.empty((n_models, n_atoms, 3), dtype=np.float32)
    for f0 in range(0, n_models, 5000):
        f1 = min(n_models, f0 + 5000)
        q = rng.normal(size=(f1 - f0, 4))
        rot = qcp.quaternion_to_rotation(q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
        x = base[np.arange(f0, f1) % len(base)] + rng.normal(scale=0.5, size=(f1 - f0, n_atoms, 3)).astype(np.float32)
        out[f0:f1] = np.matmul(x, rot.transpose(0, 2, 1)) + rng.normal(scale=20, size=(f1 - f0, 1, 3))
    return out


def softmax_score(xp, r, temperature, d0):
    """The materialised computation on a full (M, M) RMSD matrix, in ``xp`` (numpy or cupy)."""
    r2 = r.astype(xp.float64) ** 2
    logit = -r2 / temperature
    idx = xp.arange(len(r))
    logit[idx, idx] = -xp.inf
    e = xp.exp(logit - logit.max(axis=1, keepdims=True))
    return (e / (1 + r2 / d0**2)).sum(axis=1) / e.sum(axis=1)


def _peak_pool_bytes(cp, fn):
    pool = cp.get_default_memory_pool()
    cp.cuda.get_current_stream().synchronize()
    pool.free_all_blocks()
    fn()
    cp.cuda.get_current_stream().synchronize()
    return int(pool.total_bytes())


def bench_gpu(m, n, tiles, rows):
    import cupy as cp

    x = make_models(m, n, seed=1)
    xd = cp.asarray(x)
    case = f"{m} models x {n} atoms (GPU, CuPy in)"
    temp, d0 = cs.DEFAULT_TEMPERATURE, float(d0_tmscore(n))
    t_pair = time_gpu(lambda: pairwise_rmsd(xd, device="gpu"), repeat=5, warmup=1)["median_s"]
    rows.append({"case": case, "tool": "pg.pairwise_rmsd alone (M x M float32)", "seconds": t_pair,
                 "ratio_to_pairwise": 1.0,
                 "peak_pool_GB": _peak_pool_bytes(cp, lambda: pairwise_rmsd(xd, device="gpu")) / 1e9})
    t = time_gpu(lambda: cs.consensus_score(xd), repeat=5, warmup=1)["median_s"]
    rows.append({"case": case, "tool": f"pg.consensus_score (fused, tile {cs._gpu_tile(m, None)})", "seconds": t,
                 "ratio_to_pairwise": t / t_pair, "target": f"<= {TARGET}", "meets_target": t / t_pair <= TARGET,
                 "peak_pool_GB": _peak_pool_bytes(cp, lambda: cs.consensus_score(xd)) / 1e9})
    for tile in tiles:
        t = time_gpu(lambda tile=tile: cs.consensus_cuda(xd, temp, tile=tile), repeat=3, warmup=1)["median_s"]
        rows.append({"case": case, "tool": f"consensus fused, tile {tile}", "seconds": t,
                     "ratio_to_pairwise": t / t_pair})
    # The materialised anchor: the whole matrix, then the softmax in CuPy.
    try:
        def materialised():
            return softmax_score(cp, pairwise_rmsd(xd, device="gpu"), temp, d0)

        t = time_gpu(materialised, repeat=3, warmup=1)["median_s"]
        rows.append({"case": case, "tool": "anchor: pairwise_rmsd + CuPy softmax (materialised)", "seconds": t,
                     "ratio_to_pairwise": t / t_pair, "peak_pool_GB": _peak_pool_bytes(cp, materialised) / 1e9})
    except cp.cuda.memory.OutOfMemoryError:
        print("materialised anchor: out of device memory, skipped")
    try:
        t = time_gpu(lambda: cs.consensus_score(xd, return_weights=True), repeat=3, warmup=1)["median_s"]
        rows.append({"case": case, "tool": "pg.consensus_score(return_weights=True)", "seconds": t,
                     "ratio_to_pairwise": t / t_pair})
    except Exception as exc:  # MemoryBudgetError on small devices
        print(f"return_weights: {exc}")
    sub = x[:600]
    g = cs.consensus_score(sub, device="gpu")
    c = cs.consensus_score(sub, device="cpu")
    rows.append({"case": "600 models (GPU vs NumPy twin)", "tool": "max |score difference|",
                 "max_abs_diff": float(np.abs(g - c).max())})


def bench_cpu(m, n, rows):
    x = make_models(m, n, seed=2)
    case = f"{m} models x {n} atoms (CPU)"
    temp, d0 = cs.DEFAULT_TEMPERATURE, float(d0_tmscore(n))
    t_pair = time_cpu(lambda: pairwise_rmsd(x, device="cpu"), repeat=2, warmup=0)["median_s"]
    rows.append({"case": case, "tool": "pg.pairwise_rmsd alone (CPU)", "seconds": t_pair, "ratio_to_pairwise": 1.0})
    t = time_cpu(lambda: cs.consensus_score(x, device="cpu"), repeat=2, warmup=0)["median_s"]
    rows.append({"case": case, "tool": "pg.consensus_score (NumPy twin)", "seconds": t,
                 "ratio_to_pairwise": t / t_pair})
    try:
        import mdtraj as md
    except ImportError:
        print("mdtraj not installed: anchor skipped")
        return
    top = md.Topology()
    res = top.add_residue("ALA", top.add_chain())
    for _ in range(n):
        top.add_atom("CA", md.element.carbon, res)
    traj = md.Trajectory(x / 10.0, top)
    traj.center_coordinates()
    n_ref = min(m, 30)
    t0 = time.perf_counter()
    r = np.empty((n_ref, m), dtype=np.float32)
    for j in range(n_ref):
        r[j] = md.rmsd(traj, traj, j, precentered=True) * 10
    t_md = (time.perf_counter() - t0) / n_ref * m
    rfull = pairwise_rmsd(x, device="cpu")
    t_soft = time_cpu(lambda: softmax_score(np, rfull, temp, d0), repeat=2, warmup=0)["median_s"]
    rows.append({"case": case, "tool": f"anchor: mdtraj.rmsd loop ({n_ref} refs timed, extrapolated) + NumPy softmax",
                 "seconds": t_md + t_soft, "ratio_to_pairwise": (t_md + t_soft) / t_pair})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (the CPU part runs in well under a minute)")
    ap.add_argument("--json", help="results file (default benchmarks/results/consensus-<device>.json)")
    ap.add_argument("--models", type=int, help="GPU case: number of models (default 20000, --quick 4000)")
    ap.add_argument("--atoms", type=int, default=300, help="atoms per model (default 300)")
    ap.add_argument("--tiles", default="", help="GPU: also time these tile sizes, e.g. 2048,4096,8192")
    args = ap.parse_args(argv)
    use_gpu = gpu_available()
    print(f"GPU: {'yes' if use_gpu else 'no (CPU path only)'}")
    rows: list[dict] = []
    tiles = [int(t) for t in args.tiles.split(",") if t.strip()]
    if use_gpu:
        bench_gpu(args.models or (4000 if args.quick else 20_000), args.atoms, tiles, rows)
    bench_cpu(300 if args.quick else 1500, args.atoms, rows)
    print_table(rows, ["case", "tool", "seconds", "ratio_to_pairwise", "target", "meets_target", "peak_pool_GB",
                       "max_abs_diff"])
    out = write_results("consensus", rows, {"quick": args.quick, "target_ratio": TARGET}, path=args.json)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
