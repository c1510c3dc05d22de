"""Benchmark: loading PDB files with protgpu vs mdtraj and Biopython.

Times ``protgpu.io.load``, ``mdtraj.load_pdb`` and ``Bio.PDB.PDBParser(QUIET=True).get_structure`` on
the same files (the shipped ``datasets/adk_open.pdb`` and the parity data beside it). Each loader is
warmed up, then ``--repeat`` rounds alternate the three tools, so that machine noise hits them alike.
Each round times every tool in two ways (see :func:`bench_file`):
five consecutive calls (the headline: how a program loading many files sees it) and one call right
after the other tools' (caches cold). Calls are timed as timeit does (no garbage collection inside
them; each run of consecutive calls collects before it starts). Prints a table with the speed-ups of protgpu over each
anchor and writes JSON (date, git commit, machine, numbers) to
``benchmarks/results/io-<hostname>.json`` or ``--json PATH``.

protgpu remembers the atom names, residue names and residue numbers it has decoded (they repeat
from file to file), so after the warm-up its loads are those of a batch in its steady state;
``--cold`` makes it forget them before every load, which times a process's first sight of a file.

Usage::

    python benchmarks/bench_io.py [--repeat 50] [--cold] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHARED = REPO / "datasets"  # the parity data shipped with the repository
FILES = [
    REPO / "datasets" / "adk_open.pdb",
    SHARED / "openstructure" / "7W1F_B_target.pdb",
    SHARED / "openstructure" / "T1118v1.pdb",
    SHARED / "openstructure" / "1eud_ref.pdb",
    SHARED / "mdtraj" / "2EQQ.pdb",
    SHARED / "mdtraj" / "1vii.pdb",
]


def _git_commit() -> str | None:
    if os.environ.get("PROTGPU_COMMIT"):  # the GPU machine's checkout has no git history
        return os.environ["PROTGPU_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _loaders(cold: bool = False):
    import mdtraj
    from Bio.PDB import PDBParser

    from protgpu.io import load
    from protgpu.io._pdbscan import clear_memos

    def load_cold(p):
        clear_memos()
        return load(p)

    return {
        "protgpu": load_cold if cold else load,
        "mdtraj": lambda p: mdtraj.load_pdb(p),
        "biopython": lambda p: PDBParser(QUIET=True).get_structure("s", p),
    }


def _timed(fn, path: str) -> float:
    """Seconds of one call, as timeit times: no garbage collection inside the call (the consecutive
    runs collect before they start, outside the clock)."""
    gc.disable()
    try:
        t0 = time.perf_counter()
        fn(path)
        return time.perf_counter() - t0
    finally:
        gc.enable()


def bench_file(path: Path, loaders: dict, repeat: int, warmup: int = 3, run: int = 5) -> dict:
    """Two designs, both reported. Interleaved: each round calls the tools in turn, so every call
    follows another tool's (its caches cold: a large share of a small file's time). Consecutive (the
    headline): each round calls one tool ``run`` times in a row and then the next tool, as a program
    loading many files sees it. Rounds alternate the tools either way, so machine noise hits all."""
    p = str(path)
    for fn in loaders.values():
        for _ in range(warmup):
            fn(p)
    inter = {k: [] for k in loaders}
    consec = {k: [] for k in loaders}
    for _ in range(repeat):
        for name, fn in loaders.items():
            inter[name].append(_timed(fn, p))
        for name, fn in loaders.items():
            gc.collect()
            consec[name].extend(_timed(fn, p) for _ in range(run))
    from protgpu.io import load

    s = load(path)
    med = {k: statistics.median(v) * 1e3 for k, v in consec.items()}
    low = {k: min(v) * 1e3 for k, v in consec.items()}
    med_i = {k: statistics.median(v) * 1e3 for k, v in inter.items()}
    return {
        "file": str(path.relative_to(REPO.parent)) if path.is_relative_to(REPO.parent) else str(path),
        "atoms": s.n_atoms,
        "residues": s.n_residues,
        "frames": s.n_frames,
        "median_ms": med,
        "min_ms": low,
        "speedup_vs_mdtraj": med["mdtraj"] / med["protgpu"],
        "speedup_vs_biopython": med["biopython"] / med["protgpu"],
        # best-case ratios: less sensitive to other processes on a shared machine
        "speedup_vs_mdtraj_min": low["mdtraj"] / low["protgpu"],
        "speedup_vs_biopython_min": low["biopython"] / low["protgpu"],
        "interleaved_median_ms": med_i,
        "interleaved_speedup_vs_mdtraj": med_i["mdtraj"] / med_i["protgpu"],
        "interleaved_speedup_vs_biopython": med_i["biopython"] / med_i["protgpu"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30, help="timed rounds per file (default 30)")
    ap.add_argument("--json", type=Path, default=None, help="output JSON path")
    ap.add_argument("--cold", action="store_true", help="protgpu forgets decoded names/numbers before every load")
    args = ap.parse_args(argv)

    # mdtraj warns about dummy CRYST1 records on every call; the timings do not need to hear it.
    warnings.simplefilter("ignore")
    loaders = _loaders(args.cold)
    files = [f for f in FILES if f.is_file()]
    rows = [bench_file(f, loaders, args.repeat) for f in files]

    print(f"{'file':44s} {'atoms':>6s} {'fr':>3s} {'protgpu ms':>10s} {'mdtraj ms':>10s} {'Bio ms':>8s} "
          f"{'x mdtraj':>9s} {'x Bio':>7s} {'interleaved: x mdtraj':>22s} {'x Bio':>6s}")
    for r in rows:
        m = r["median_ms"]
        print(f"{r['file'][-44:]:44s} {r['atoms']:6d} {r['frames']:3d} {m['protgpu']:10.3f} {m['mdtraj']:10.2f} "
              f"{m['biopython']:8.2f} {r['speedup_vs_mdtraj']:9.1f} {r['speedup_vs_biopython']:7.1f} "
              f"{r['interleaved_speedup_vs_mdtraj']:22.1f} {r['interleaved_speedup_vs_biopython']:6.1f}")

    import Bio
    import mdtraj
    import numpy

    result = {
        "benchmark": "io",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "machine": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        "versions": {"numpy": numpy.__version__, "mdtraj": mdtraj.__version__, "biopython": Bio.__version__},
        "repeat": args.repeat,
        "protgpu_memo": "cleared before every load" if args.cold else "warm (kept across loads)",
        "statistic": "median of consecutive calls (5 per tool per round, rounds alternating the tools) after "
                     "warm-up, milliseconds; interleaved_*: one call per tool per round",
        "results": rows,
    }
    out = args.json or REPO / "benchmarks" / "results" / f"io-{socket.gethostname()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
