"""Batch engine: a folder of many small PDB files scored end to end, protgpu's engine vs a per-file loop.

Same data, same run. F model files (default 10,000; ``--quick`` 120) of the first L residues (default
120; ``--quick`` 40) of 7W1F chain B from the shared datasets (else the repository's adk_open.pdb),
each under a random rigid motion and 0.3-2 A of noise, written to a temporary folder; the reference is
the unperturbed structure. Every variant parses every file, scores TM-score + lDDT (``--metrics``) and
writes one CSV row per model:

* ``loop`` (the anchor): ``for f in files: tm_score(load(f), ref); lddt(load(f), ref)`` - what a
  script does without the engine: one call (one set of GPU launches) per file, nothing overlapped.
  Timed on at most ``--anchor-files`` files; its rate is what the ratios divide by.
* ``engine inline``: ``protgpu.batch.run(..., pool="inline")`` - batching by length, parsing in the
  same thread (shows what batching alone buys).
* ``engine processes``: parsing in ``-j`` worker processes overlapped with the batched compute (the
  CLI's default for 32 files or more).
* ``engine dask N``: a local Dask cluster of N worker processes (skipped without dask.distributed).
* ``engine dask-cuda``: dask-cuda's LocalCUDACluster, one worker per GPU (skipped without dask-cuda or
  without a GPU).
* ``parse only``: the process pool's parsing rate with a job that computes nothing - the ceiling the
  engine approaches when the compute is fast (GPU).

On a machine without a GPU everything runs on the CPU (the script still runs: ``--quick`` is for that).

    python3 benchmarks/bench_batch.py [--quick] [--files F] [--residues L] [--jobs J] [--json PATH]
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import HERE, print_table, write_results

from protgpu.batch import Job

SHARED = HERE.parent.parent / "shared" / "datasets"


def reference_lines(n_res: int) -> tuple[list[str], str]:
    """ATOM lines of the first ``n_res`` residues of 7W1F chain B (or adk_open.pdb)."""
    path = SHARED / "openstructure" / "7W1F_B_target.pdb"
    if not path.is_file():
        path = HERE.parent / "datasets" / "adk_open.pdb"
    lines, seen = [], []
    with open(path) as fh:
        for ln in fh:
            if not ln.startswith("ATOM"):
                continue
            key = (ln[21], ln[22:27])
            if key not in seen:
                seen.append(key)
            if len(seen) > n_res:
                break
            lines.append(ln)
    return lines, path.name


def write_models(folder: Path, lines: list[str], n: int, seed: int = 0) -> list[str]:
    """``n`` perturbed copies of ``lines`` as PDB files; returns their paths."""
    rng = np.random.default_rng(seed)
    xyz = np.array([[float(ln[30 + 8 * k:38 + 8 * k]) for k in range(3)] for ln in lines])
    centre = xyz.mean(axis=0)
    paths = []
    for i in range(n):
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        w, x, y, z = q
        rot = np.array([[w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y)],
                        [2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x)],
                        [2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z]])
        noise = rng.normal(size=xyz.shape) * rng.uniform(0.3, 2)
        new = (xyz - centre) @ rot.T + centre + rng.normal(size=3) * 5 + noise
        text = "".join(ln[:30] + f"{a:8.3f}{b:8.3f}{c:8.3f}" + ln[54:]
                       for ln, (a, b, c) in zip(lines, new, strict=True))
        p = folder / f"model_{i:05d}.pdb"
        p.write_text(text + "END\n")
        paths.append(str(p))
    return paths


def loop_anchor(paths: list[str], ref_path: str, metrics: list[str], out: Path) -> None:
    """The script without the engine: one load and one call per metric per file."""
    import protgpu as pg

    ref = pg.load(ref_path)
    rows = []
    for p in paths:
        s = pg.load(p)
        row = {"model": os.path.basename(p)}
        if "tm" in metrics:
            row["tm"] = float(pg.tm_score(s, ref).tm)
        if "lddt" in metrics:
            row["lddt"] = float(pg.lddt(s, ref))
        rows.append(row)
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


class ParseOnly(Job):
    """A job that parses and computes nothing (module level, so worker processes can unpickle it)."""

    name = "parse-only"
    batch_size = 256

    def load(self, path):
        from protgpu.io import load

        return load(path).n_atoms

    def compute(self, items):
        return [{"atoms": n} for n in items]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--residues", type=int, default=120)
    ap.add_argument("--anchor-files", type=int, default=1000, help="files the per-file loop scores (rate scales)")
    ap.add_argument("--metrics", default="tm,lddt", help="comma-separated subset of tm,lddt")
    ap.add_argument("--jobs", "-j", type=int, default=None, help="parse worker processes (default: engine's)")
    ap.add_argument("--dask-workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="small sizes (CPU-only machines)")
    ap.add_argument("--json", help="results file (default: benchmarks/results/batch-<device>.json)")
    args = ap.parse_args()
    if args.quick:
        args.files, args.residues, args.anchor_files = min(args.files, 120), min(args.residues, 40), 40
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]

    import protgpu as pg
    from protgpu import batch
    from protgpu._array import gpu_available

    device = "gpu" if gpu_available() else "cpu"
    tmp = Path(tempfile.mkdtemp(prefix="bench_batch_"))
    try:
        lines, source = reference_lines(args.residues)
        ref_path = tmp / "ref.pdb"
        ref_path.write_text("".join(lines) + "END\n")
        folder = tmp / "models"
        folder.mkdir()
        t0 = time.perf_counter()
        paths = write_models(folder, lines, args.files)
        print(f"{args.files} files of {args.residues} residues ({len(lines)} atoms) from {source} written in "
              f"{time.perf_counter() - t0:.1f} s; scoring {','.join(metrics)} on the {device.upper()}")
        job_metrics = tuple(m for m in metrics if m in ("tm", "lddt"))

        # warm-up: imports, kernel compilation, BLAS threads
        batch.run(paths[:4], batch.ScoreJob(ref_path, metrics=job_metrics), pool="inline")
        loop_anchor(paths[:2], str(ref_path), metrics, tmp / "warm.csv")

        rows = []

        def record(impl, n, seconds, note=""):
            rows.append({"impl": impl, "files": n, "seconds": seconds, "files_per_s": n / seconds, "note": note})
            print(f"  {impl:24s} {n:6d} files {seconds:8.2f} s {n / seconds:9.1f} files/s {note}", flush=True)

        n_anchor = min(args.anchor_files, len(paths))
        t0 = time.perf_counter()
        loop_anchor(paths[:n_anchor], str(ref_path), metrics, tmp / "loop.csv")
        record("loop (anchor)", n_anchor, time.perf_counter() - t0, "one call per file")

        variants = [("engine inline", {"pool": "inline"}), ("engine processes", {"pool": "process", "jobs": args.jobs})]
        try:
            import distributed  # noqa: F401

            variants.append((f"engine dask {args.dask_workers}", {"workers": args.dask_workers}))
        except ImportError:
            print("  engine dask: skipped (dask.distributed not installed)")
        try:
            import dask_cuda  # noqa: F401

            if device == "gpu":
                variants.append(("engine dask-cuda", {"gpus": "all"}))
            else:
                print("  engine dask-cuda: skipped (no GPU)")
        except ImportError:
            print("  engine dask-cuda: skipped (dask-cuda not installed)")
        reference_csv = None
        for name, kw in variants:
            out = tmp / f"{name.replace(' ', '_')}.csv"
            t0 = time.perf_counter()
            s = batch.run(folder, batch.ScoreJob(ref_path, metrics=job_metrics), out=out, **kw)
            dt = time.perf_counter() - t0
            same = ""
            if reference_csv is None:
                reference_csv = out.read_bytes()
            else:
                same = "same output" if out.read_bytes() == reference_csv else "OUTPUT DIFFERS"
            record(name, s.n_ok, dt, same)
        t0 = time.perf_counter()
        s = batch.run(folder, ParseOnly(), pool="process", jobs=args.jobs)
        record("parse only (processes)", s.n_ok, time.perf_counter() - t0, "ceiling of the pipeline")

        loop_rate = rows[0]["files_per_s"]
        for r in rows:
            r["x_loop"] = r["files_per_s"] / loop_rate
        print()
        print_table(rows, ["impl", "files", "seconds", "files_per_s", "x_loop", "note"])
        out = write_results("batch", rows, {"files": args.files, "residues": args.residues, "atoms": len(lines),
                                            "metrics": metrics, "device": device, "source": source,
                                            "version": pg.__version__}, path=args.json)
        print(f"wrote {out}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
