"""What leaving TM-align's stages out costs in accuracy, and what it saves: the experiment behind
``docs/design/tm-align.md`` ("Left for later": whether a faster, approximate alignment could keep the
issue's bound, TM-scores within 0.01 of TM-align's on every pair).

For ``--pairs`` SCOPe pairs of the shared corpus (``bench_align.accuracy_pairs``: 40% same superfamily,
30% same fold, 30% another fold; seed 0), the CPU path's NumPy twin (``numpy_twin.tm_align_pair``,
compiled loops off) with all five initial alignments - TM-align - and with some left out, their
refinement with them (``--variants``: stages joined by ``+``; ``numpy_twin.align_maps``' ``skip``).
Per variant: the fraction of TM-scores (both normalisations) within 1e-3 and 0.01 of the full run's,
the largest and mean difference, the mean TM-score against the full run's, and the NumPy twin's time
against the full run's (on a pool of ``--jobs`` processes: the share of the work the stages take there;
the GPU kernel's shares by stage are in ``results/align-h200.json``, ``search.bands``).

    python3 benchmarks/bench_align_shortcuts.py [--pairs 120] [--jobs 2] [--variants 3,2+3,2+3+4]
        [--json PATH]

Writes ``results/align_shortcuts-<device>.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from pathlib import Path

import bench_align
import numpy as np
from _common import print_table, write_results


def _variant_chunk(job):
    """TM-scores (mobile, target) of ``pairs`` with the stages ``skip`` left out, and the seconds taken."""
    from protgpu.align import numpy_twin
    from protgpu.scoring import _fast

    skip, pairs = job
    _fast.ENABLED = False  # the NumPy twin: stages as separate calls, so that leaving one out saves its time
    chains = bench_align._CHAINS
    t0 = time.perf_counter()
    out = []
    for a, b in pairs:
        x, y = chains[a], chains[b]
        r = numpy_twin.tm_align_pair(x.ca, y.ca, x.sequence, y.sequence, skip=skip)
        out.append((r.tm_mobile, r.tm_target))
    return out, time.perf_counter() - t0


def run_variants(chains, pairs, variants, jobs: int) -> dict:
    """Every variant (a tuple of stages to skip; ``()`` first, the reference) on every pair: TM-scores
    (P, 2) and the summed worker seconds."""
    pool = mp.get_context("spawn").Pool(jobs, initializer=bench_align._init, initargs=(chains,))
    try:
        chunk = max(1, -(-len(pairs) // (jobs * 4)))
        chunks = [[tuple(p) for p in pairs[k:k + chunk].tolist()] for k in range(0, len(pairs), chunk)]
        pool.map(_variant_chunk, [((), chunks[0][:1])] * jobs, chunksize=1)  # imports before the clock
        out = {}
        for skip in variants:
            res = pool.map(_variant_chunk, [(skip, c) for c in chunks], chunksize=1)
            out[skip] = (np.array([v for r, _ in res for v in r], dtype=np.float64).reshape(-1, 2),
                         sum(dt for _, dt in res))
            print(f"skip {skip}: {out[skip][1]:.1f} s of work", flush=True)
        return out
    finally:
        pool.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=120)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--variants", default="3,2+3,2+3+4", help="stages left out, joined by +; comma between variants")
    ap.add_argument("--corpus", type=Path, default=bench_align.CORPUS)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    variants = [()] + [tuple(int(k) for k in v.split("+")) for v in args.variants.split(",") if v]
    rows_scope, scope = bench_align.scope_set(args.corpus)
    pairs, kinds = bench_align.accuracy_pairs(rows_scope, args.pairs, np.random.default_rng(bench_align.SEED))
    res = run_variants(scope, pairs, variants, args.jobs)
    ref, ref_s = res[()]
    rows = []
    for skip in variants:
        tm, seconds = res[skip]
        diff = np.abs(tm - ref)
        worst = int(np.argmax(diff.max(axis=1)))
        rows.append({"skipped": "+".join(map(str, skip)) or "none (TM-align)", "pairs": len(pairs),
                     "within_1e-3": float(np.mean(diff.max(axis=1) <= 1e-3)),
                     "within_0.01": float(np.mean(diff.max(axis=1) <= 0.01)),
                     "max_diff": float(diff.max()), "mean_diff": float(diff.mean()),
                     "mean_tm": float(tm[:, 1].mean()), "mean_tm_full": float(ref[:, 1].mean()),
                     "worst_pair_kind": kinds[worst], "time_vs_full": seconds / ref_s})
    print_table(rows, list(rows[0]))
    out = write_results("align_shortcuts", rows, {
        "jobs": args.jobs, "variants": args.variants,
        "note": "TM-scores with stages of TM-align left out against all five (numpy_twin, compiled loops off); "
                "time_vs_full: the NumPy twin's seconds over the full run's"}, path=args.json)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
