"""Batch engine end to end, issue 7's case: ``protgpu score --metrics tm,lddt`` over a folder of PDB files
against one reference, vs a script doing the same with biotite and tmtools in a process pool.

Same data, same run. F model files (default 10,000; ``--quick`` 120) of the first L residues (default
300; ``--quick`` 40) of 7W1F chain B from the shared datasets (else the repository's adk_open.pdb):
bench_scoring's perturbed models (rigid motion, residue-correlated noise of 0.3-3 A, a hinge in a
third), written to a temporary folder by bench_scoring's writer; the reference is the unperturbed
structure. Variants:

* ``protgpu score``: the CLI's own job (``score_job`` from the parsed command line
  ``protgpu score DIR --ref REF --metrics tm,lddt --out scores.csv -q [-j J]``) through the CLI's
  ``run_job``: expanding the folder, parsing and matching in ``-j`` worker processes (default: every
  CPU), batched TM-score and lDDT, the journal and the CSV. Its breakdown comes from the engine's
  timers (``Summary.stats``): read (parse), hash, match (worker CPU seconds, summed over workers);
  in the main process one after the other: listing, set-up, starting the pool, warm-up, stack +
  transfer + GPU scoring + rows (the compute loop), waiting for parsed files, stopping the pool, write
  (journal, CSV), and what no timer holds (the loop's bookkeeping).
* ``protgpu score command``: the same as a user runs it, ``python -m protgpu.cli score ...`` in a new
  process, with ``PROTGPU_STATS_JSON`` set: its breakdown adds the process's own steps (start-up and
  imports, listing, building the job, the engine run with its timers, the interpreter's exit).
* ``anchor``: what a script does without protgpu, in a ``multiprocessing.Pool`` of min(16, CPUs)
  processes: per file, biotite reads the PDB, ``tmtools.tm_align`` scores its CA trace against the
  reference's (TM-score normalised by the reference; TM-align also searches the alignment, so it
  does more work than the TMscore program's fixed residue pairing), ``biotite.structure.lddt`` scores
  all atoms (no symmetry resolution); then one CSV. Timed on ``--anchor-files`` files (the pool warm);
  the ratio uses its rate.
* ``parse only``: the worker pool reading every file (``protgpu.load``) and doing nothing else: the
  ceiling of the host side.
* ``--dask-workers N``: the same job on a local Dask cluster of N processes.
* ``--stub-scores``: also run ``protgpu score`` with the TM-score search and lDDT counting replaced by
  no-ops - the host pipeline alone, to predict a GPU run on a machine without one.

On a machine without a GPU everything runs on the CPU (the NumPy twins take ~0.5 s per 300-residue
TM-score: use ``--quick`` there).

    python3 benchmarks/bench_batch.py [--quick] [--files F] [--residues L] [--jobs J] [--anchor-files N]
                                      [--stub-scores] [--dask-workers N] [--json PATH]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from _common import HERE, print_table, write_results
from bench_scoring import perturbed_models, reference_structure, write_pdbs

from protgpu.batch import Job

# --------------------------------------------------------------------------------------------------
# the anchor: biotite + tmtools, one process per core

_ANCHOR: dict = {}
_ONE = {"ALA": "A", "ARG": "R", "ASN": "N", "ASP": "D", "CYS": "C", "GLN": "Q", "GLU": "E", "GLY": "G", "HIS": "H",
        "ILE": "I", "LEU": "L", "LYS": "K", "MET": "M", "PHE": "F", "PRO": "P", "SER": "S", "THR": "T", "TRP": "W",
        "TYR": "Y", "VAL": "V"}


def _ca_and_sequence(atoms):
    ca = atoms[atoms.atom_name == "CA"]
    return np.ascontiguousarray(ca.coord, dtype=np.float64), "".join(_ONE.get(r, "X") for r in ca.res_name)


def _anchor_init(ref_path: str) -> None:
    import biotite.structure.io.pdb as bpdb

    ref = bpdb.PDBFile.read(ref_path).get_structure(model=1)
    ca, seq = _ca_and_sequence(ref)
    _ANCHOR.update(ref=ref, ca=ca, seq=seq)


def _anchor_one(path: str) -> tuple[str, float, float]:
    """One file as a script scores it: read (biotite), TM-score (tmtools), lDDT (biotite)."""
    import biotite.structure as bs
    import biotite.structure.io.pdb as bpdb
    import tmtools

    model = bpdb.PDBFile.read(path).get_structure(model=1)
    ca, seq = _ca_and_sequence(model)
    tm = tmtools.tm_align(ca, _ANCHOR["ca"], seq, _ANCHOR["seq"]).tm_norm_chain2
    return os.path.basename(path), float(tm), float(bs.lddt(_ANCHOR["ref"], model))


def time_anchor(paths: list[str], ref_path: str, n_procs: int, out: Path) -> float:
    """Seconds for the anchor to score ``paths`` and write its CSV (the pool started and warm)."""
    # spawned, not forked: this process may hold a CUDA context and threads
    with get_context("spawn").Pool(n_procs, initializer=_anchor_init, initargs=(ref_path,)) as pool:
        pool.map(_anchor_one, paths[:n_procs])  # start-up: imports, the reference
        t0 = time.perf_counter()
        rows = pool.map(_anchor_one, paths, chunksize=max(1, len(paths) // (8 * n_procs)))
        with open(out, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["model", "tm", "lddt"])
            w.writerows(rows)
        return time.perf_counter() - t0


# --------------------------------------------------------------------------------------------------
# protgpu


def score_args(folder: Path, ref_path: Path, out: Path, metrics: str, jobs: int | None, extra=()):
    """The parsed ``protgpu score`` command line."""
    from protgpu.cli import build_parser

    argv = ["score", str(folder), "--ref", str(ref_path), "--metrics", metrics, "--out", str(out), "-q", *extra]
    if jobs is not None:
        argv += ["-j", str(jobs)]
    return build_parser().parse_args(argv)


def run_score(args):
    """What ``protgpu score`` does with ``args``, minus its printing: the engine's Summary."""
    from protgpu.batch.inputs import expand_inputs
    from protgpu.commands._batch_options import job_device, run_job
    from protgpu.commands.score import score_job

    device, _ = job_device(args)
    return run_job(args, score_job(args, device), expand_inputs(args.inputs), description="score")


@contextmanager
def stubbed_scores():
    """TM-score search and lDDT counting as no-ops (zeros), everything else as it is."""
    import importlib

    lddt_mod = importlib.import_module("protgpu.scoring.lddt")  # (the package exports functions by these names)
    tm_mod = importlib.import_module("protgpu.scoring.tmscore")

    def tm_stub(x, y, n_ali, params, **kw):
        xp = np if isinstance(x, np.ndarray) else __import__("cupy")
        m = x.shape[0]
        return {"score": xp.zeros(m), "rotation": xp.tile(xp.eye(3), (m, 1, 1)), "translation": xp.zeros((m, 3)),
                "gdt_counts": xp.zeros((m, 5), dtype=xp.int64), "maxsub_sum": xp.zeros(m)}

    def lddt_stub(coords, ref, thresholds=(), symmetry=True, **kw):
        xp = np if isinstance(coords, np.ndarray) else __import__("cupy")
        return xp.zeros((coords.shape[0], ref.n_res), dtype=xp.int64)

    saved = (tm_mod.tm_search_numpy, tm_mod.tm_search_cuda, lddt_mod.lddt_counts_numpy, lddt_mod.lddt_counts_cuda)
    tm_mod.tm_search_numpy = tm_mod.tm_search_cuda = tm_stub
    lddt_mod.lddt_counts_numpy = lddt_mod.lddt_counts_cuda = lddt_stub
    try:
        yield
    finally:
        tm_mod.tm_search_numpy, tm_mod.tm_search_cuda, lddt_mod.lddt_counts_numpy, lddt_mod.lddt_counts_cuda = saved


def engine_steps(stats: dict, elapsed: float) -> list[tuple[str, str, float]]:
    """(step, where, seconds) of an engine run from its ``Summary.stats``: worker steps as CPU seconds
    summed over the workers, main-process steps as wall seconds, then what no timer holds."""
    s = {k: float(v) for k, v in stats.items()}
    scoring = s.get("tm_s", 0.0) + s.get("lddt_s", 0.0)
    gpu = max(0.0, scoring - s.get("stack_s", 0.0) - s.get("transfer_s", 0.0))
    main = [
        ("listing the inputs", "main", s.get("list_s", 0.0)),
        ("set-up (output checks, manifest, progress)", "main", s.get("setup_s", 0.0)),
        ("starting the parse pool (first inputs in)", "main", s.get("pool_start_s", 0.0)),
        ("warm-up (device, GPU context, kernels, lDDT pairs)", "main", s.get("warmup_s", 0.0)),
        ("handing the workers inputs", "main", s.get("submit_s", 0.0)),
        ("stack (batches on the host)", "main", s.get("stack_s", 0.0)),
        ("transfer (host to device)", "main", s.get("transfer_s", 0.0)),
        ("scores (kernels, incl. sync)", "main", gpu),
        ("rows + journal bookkeeping", "main", max(0.0, s.get("compute_s", 0.0) - scoring)),
        ("waiting for parsed files", "main", s.get("wait_s", 0.0)),
        ("stopping the parse pool", "main", s.get("pool_shutdown_s", 0.0)),
        ("write (journal, CSV)", "main", s.get("write_s", 0.0)),
    ]
    other = elapsed - sum(sec for _, _, sec in main)
    return [
        ("parse (read + parse files)", "workers", s.get("read_s", s.get("load_s", 0.0))),
        ("hash (sha256 for the journal)", "workers", s.get("hash_s", 0.0)),
        ("match (residues/atoms to the reference)", "workers", s.get("match_s", 0.0)),
        *main,
        ("no timer (loop bookkeeping, taking results in)", "main", other),
    ]


def _rows(steps, n_files: int, jobs: int) -> list[dict]:
    return [{"step": name, "where": where, "seconds": sec, "ms_per_file": 1e3 * sec / n_files,
             "note": (f"summed over {jobs} workers: ms per file per core" if where == "workers" else "")}
            for name, where, sec in steps]


def breakdown(stats: dict, n_files: int, elapsed: float, jobs: int) -> list[dict]:
    """Rows of where the time of an in-process run went (ms per file; per core for worker steps)."""
    return _rows([*engine_steps(stats, elapsed), ("end to end", "wall", elapsed)], n_files, jobs)


def cli_breakdown(record: dict, t_spawn: float, t_done: float, n_files: int, jobs: int) -> list[dict]:
    """Rows of where the time of a ``protgpu`` process went, from its ``PROTGPU_STATS_JSON`` record and
    the wall-clock times this process started it (``t_spawn``) and saw it end (``t_done``)."""
    st = record["stamps"]
    start = st.get("process_start", t_spawn)
    steps = [("process start (fork/exec)", "process", start - t_spawn),
             ("interpreter start-up + imports", "process", st["main"] - start),
             ("options + listing the inputs", "process", st.get("listed", st["main"]) - st["main"]),
             ("building the job (reference)", "process", st.get("job", st.get("listed", st["main"]))
              - st.get("listed", st["main"])),
             ("between job and engine", "process", st["run"] - st.get("job", st["main"]))]
    steps += [(f"  engine: {name}", where, sec) for name, where, sec in engine_steps(record["stats"],
                                                                                  st["run_done"] - st["run"])]
    steps += [("after the engine (messages, stats file)", "process", st["end"] - st["run_done"]),
              ("interpreter exit", "process", t_done - st["end"]),
              ("end to end", "wall", t_done - t_spawn)]
    return _rows(steps, n_files, jobs)


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
    ap.add_argument("--residues", type=int, default=300)
    ap.add_argument("--anchor-files", type=int, default=2000, help="files the anchor scores (its rate is used)")
    ap.add_argument("--metrics", default="tm,lddt", help="protgpu score --metrics (the anchor does tm,lddt)")
    ap.add_argument("--jobs", "-j", type=int, default=None, help="parse worker processes (default: the CLI's)")
    ap.add_argument("--anchor-procs", type=int, default=None, help="anchor pool size (default: min(16, CPUs))")
    ap.add_argument("--dask-workers", type=int, default=0, help="also run on a local Dask cluster of N workers")
    ap.add_argument("--stub-scores", action="store_true", help="also run with the score kernels stubbed out")
    ap.add_argument("--no-anchor", action="store_true")
    ap.add_argument("--quick", action="store_true", help="small sizes (CPU-only machines)")
    ap.add_argument("--json", help="results file (default: benchmarks/results/batch-<device>.json)")
    args = ap.parse_args()
    if args.quick:
        args.files, args.residues, args.anchor_files = min(args.files, 120), min(args.residues, 40), 40

    import protgpu as pg
    from protgpu import batch
    from protgpu._array import gpu_available
    from protgpu.batch.local import default_jobs

    device = "gpu" if gpu_available() else "cpu"
    cores = os.cpu_count() or 1
    jobs = args.jobs or default_jobs()
    anchor_procs = args.anchor_procs or min(16, cores)
    tmp = Path(tempfile.mkdtemp(prefix="bench_batch_"))
    try:
        ref, source = reference_structure(args.residues)
        t0 = time.perf_counter()
        (tmp / "ref").mkdir()
        ref_path = Path(write_pdbs(ref, ref.coords, tmp / "ref")[0])
        folder = tmp / "models"
        folder.mkdir()
        paths = write_pdbs(ref, perturbed_models(ref, args.files), folder)
        size = sum(os.path.getsize(p) for p in paths[:10]) / min(10, len(paths))
        print(f"{args.files} files of {ref.n_residues} residues ({ref.n_atoms} atoms, {size / 1024:.0f} KiB) from "
              f"{source} written in {time.perf_counter() - t0:.1f} s; {cores} CPUs, scoring {args.metrics} on the "
              f"{device.upper()}", flush=True)

        # warm-up: imports, kernel compilation, and (32 files: a process pool) the forkserver that later
        # in-process runs use once CuPy is loaded (the command, a fresh process, forks its workers)
        run_score(score_args(folder, ref_path, tmp / "warm.csv", args.metrics, args.jobs,
                             ["--shard", f"0/{max(1, len(paths) // 32)}"]))

        rows: list[dict] = []
        tables: dict = {}

        def record(impl, n, seconds, note=""):
            rows.append({"impl": impl, "files": n, "seconds": seconds, "files_per_s": n / seconds, "note": note})
            print(f"  {impl:34s} {n:6d} files {seconds:8.2f} s {n / seconds:9.1f} files/s  {note}", flush=True)

        if not args.no_anchor:
            try:
                import biotite  # noqa: F401
                import tmtools  # noqa: F401

                n = min(args.anchor_files, len(paths))
                secs = time_anchor(paths[:n], str(ref_path), anchor_procs, tmp / "anchor.csv")
                record(f"anchor: biotite+tmtools, {anchor_procs} procs", n, secs, "rate on a subset")
            except ImportError as exc:
                print(f"  anchor skipped ({exc})")

        def score(name, extra=(), **kw):
            out = tmp / f"{name.replace(' ', '_')}.csv"
            a = score_args(folder, ref_path, out, args.metrics, args.jobs, extra)
            t0 = time.perf_counter()
            s = run_score(a)
            dt = time.perf_counter() - t0
            if s.n_ok != len(paths):
                raise SystemExit(f"{name}: {s.n_failed} file(s) failed: {s.failed[:3]}")
            record(name, s.n_ok, dt, kw.get("note", ""))
            tables[name] = breakdown(s.stats, s.n_ok, dt, jobs)
            return out

        # the command as a user runs it: a fresh process (interpreter, imports, GPU context included)
        cli = score_args(folder, ref_path, tmp / "cli.csv", args.metrics, args.jobs)
        argv = [sys.executable, "-m", "protgpu.cli", "score", str(folder), "--ref", str(ref_path), "--metrics",
                args.metrics, "--out", str(cli.out), "-q"] + (["-j", str(args.jobs)] if args.jobs else [])
        stats_json = tmp / "cli-stats.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
               "PROTGPU_STATS_JSON": str(stats_json)}
        t_spawn = time.time()
        t0 = time.perf_counter()
        r = subprocess.run(argv, capture_output=True, text=True, env=env)
        dt = time.perf_counter() - t0
        t_done = time.time()
        if r.returncode != 0:
            raise SystemExit(f"protgpu score failed: {r.stderr.strip()}")
        name = f"protgpu score command (-j {jobs}, {device})"
        record(name, len(paths), dt, "end to end: new process, CSV written")
        if stats_json.is_file():
            tables[name] = cli_breakdown(json.loads(stats_json.read_text()), t_spawn, t_done, len(paths), jobs)
        main_csv = score(f"protgpu score in-process (-j {jobs})", note="the same, timers below")
        if main_csv.read_bytes() != Path(cli.out).read_bytes():
            rows[-1]["note"] += "; OUTPUT DIFFERS from the command's"
        if args.stub_scores:
            with stubbed_scores():
                score(f"protgpu score, scores stubbed (-j {jobs})", note="host pipeline alone")
        if args.dask_workers:
            out = score(f"protgpu score --workers {args.dask_workers}", ("--workers", str(args.dask_workers)))
            same = out.read_bytes() == main_csv.read_bytes()
            rows[-1]["note"] = "same output" if same else "OUTPUT DIFFERS"
        t0 = time.perf_counter()
        s = batch.run(folder, ParseOnly(), pool="process", jobs=jobs, quiet=True)
        record(f"parse only (-j {jobs} processes)", s.n_ok, time.perf_counter() - t0, "ceiling of the host side")

        anchor = next((r["files_per_s"] for r in rows if r["impl"].startswith("anchor")), None)
        for r in rows:
            r["x_anchor"] = r["files_per_s"] / anchor if anchor else None
        print()
        print_table(rows, ["impl", "files", "seconds", "files_per_s", "x_anchor", "note"])
        for name, table in tables.items():
            print(f"\nwhere the time goes: {name}")
            print_table(table, ["step", "where", "seconds", "ms_per_file", "note"])
        out = write_results("batch", rows, {"files": args.files, "residues": ref.n_residues, "atoms": ref.n_atoms,
                                            "metrics": args.metrics, "device": device, "source": source,
                                            "jobs": jobs, "anchor_procs": anchor_procs, "breakdown": tables,
                                            "quick": args.quick, "version": pg.__version__}, path=args.json)
        print(f"wrote {out}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
