"""Benchmark: the README's main job on a fresh machine (cold) and again (warm), with the installed protgpu.

Runs ``protgpu contacts datasets/adk_open.pdb --out adk_contacts.npz`` in a new process each time, from an
empty temporary folder, with the protgpu installed for ``--python`` (the wheel), or the one installed with
``pip install --target DIR`` given as ``--site DIR`` (``PYTHONPATH`` is otherwise unset, and the folder is
not the checkout, so the checkout is not imported). For each repeat, with fresh caches:

- ``cold``: an empty kernel cache (``PROTGPU_CACHE_DIR``) and, as on a fresh machine, an empty CuPy kernel
  cache (``CUPY_CACHE_DIR``);
- ``warm``: the same job again, the caches now filled (median of ``--warm`` runs);
- ``cold_kernels_only``: protgpu's kernel cache emptied again, CuPy's kept (what protgpu's own kernels cost).

Each with the wheel's prebuilt cubins (``prebuilt``) and, with ``--before``, without them
(``PROTGPU_NO_PREBUILT=1``: the number before this change). Target: cold within 1.5x of warm. Prints a
table and writes ``results/first_run-<gpu>.json`` (GPU model, commit, date, every time, the ratios).

Usage::

    python benchmarks/bench_first_run.py [--before] [--repeat 3] [--warm 3] [--python PY] [--site DIR]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import print_table, write_results

REPO = Path(__file__).resolve().parents[1]
INPUT = REPO / "datasets" / "adk_open.pdb"
TARGET = 1.5


SITE: list = []  # --site


def _env(caches: Path, prebuilt: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PROTGPU_NO_PREBUILT")}
    # --site first; other PYTHONPATH entries (dependencies carried as wheels) stay, the checkout does not
    keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and not Path(p).resolve().is_relative_to(REPO)]
    if SITE or keep:
        env["PYTHONPATH"] = os.pathsep.join([*SITE, *keep])
    env |= {"PROTGPU_CACHE_DIR": str(caches / "protgpu"), "CUPY_CACHE_DIR": str(caches / "cupy")}
    if not prebuilt:
        env["PROTGPU_NO_PREBUILT"] = "1"
    return env


def run_job(py: str, work: Path, env: dict) -> float:
    """Seconds of one ``protgpu contacts`` process, start to exit; raises if it fails."""
    out = work / "adk_contacts.npz"
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    r = subprocess.run([py, "-m", "protgpu.cli", "contacts", str(INPUT), "--out", out.name], cwd=work, env=env,
                       capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0 or not out.is_file():
        raise SystemExit(f"protgpu contacts failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return dt


def describe(py: str, work: Path) -> dict:
    """Where the measured protgpu lives, and what ``protgpu info`` says of the GPU and the prebuilt cubins."""
    env = _env(work / "probe", prebuilt=True)
    r = subprocess.run([py, "-c", "import protgpu; print(protgpu.__file__)"], cwd=work, env=env,
                       capture_output=True, text=True)
    path = r.stdout.strip() or f"not importable: {r.stderr.strip()[-300:]}"
    r = subprocess.run([py, "-m", "protgpu.cli", "info", "--no-compile"], cwd=work, env=env, capture_output=True,
                       text=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("prebuilt", "GPU", "NVRTC", "protgpu "))]
    # What the job's kernels came from: the main job through the API, then the prebuilt lookup's counts
    # (a cubin the driver refused would be listed under "rejected").
    code = ("import json, protgpu as pg; from protgpu._cuda import prebuilt; "
            f"pg.contacts(pg.load({str(INPUT)!r})); print(json.dumps(prebuilt.status()))")
    r = subprocess.run([py, "-c", code], cwd=work, env=env, capture_output=True, text=True)
    used = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else r.stderr[-500:]
    return {"protgpu_path": path, "has_prebuilt": not any(ln.startswith("prebuilt       none") for ln in lines),
            "info": lines, "prebuilt_in_a_run": used}


def measure(py: str, prebuilt: bool, repeat: int, warm: int) -> dict:
    cold, warm_t, kernels_only = [], [], []
    for _ in range(repeat):
        work = Path(tempfile.mkdtemp(prefix="protgpu-first-run-"))
        try:
            env = _env(work / "caches", prebuilt)
            cold.append(run_job(py, work, env))
            warm_t.append(statistics.median(run_job(py, work, env) for _ in range(warm)))
            shutil.rmtree(work / "caches" / "protgpu", ignore_errors=True)  # (none on a CPU run)
            kernels_only.append(run_job(py, work, env))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    row = {"mode": "prebuilt" if prebuilt else "no_prebuilt (before)",
           "cold_s": statistics.median(cold), "warm_s": statistics.median(warm_t),
           "cold_kernels_only_s": statistics.median(kernels_only),
           "cold_runs": cold, "warm_runs": warm_t, "cold_kernels_only_runs": kernels_only}
    row["ratio_cold_warm"] = row["cold_s"] / row["warm_s"]
    row["ratio_kernels_only_warm"] = row["cold_kernels_only_s"] / row["warm_s"]
    row["within_target"] = row["ratio_cold_warm"] <= TARGET
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=sys.executable, help="interpreter whose installed protgpu is measured")
    p.add_argument("--site", default=None, help="a folder the wheel was installed into with pip --target")
    p.add_argument("--before", action="store_true", help="also measure without the prebuilt cubins")
    p.add_argument("--repeat", type=int, default=3, help="cold starts per mode (fresh caches each)")
    p.add_argument("--warm", type=int, default=3, help="warm runs after each cold start (median)")
    p.add_argument("--json", default=None, help="results file (default: results/first_run-<gpu>.json)")
    args = p.parse_args(argv)
    if args.site:
        SITE.append(str(Path(args.site).resolve()))
    with tempfile.TemporaryDirectory(prefix="protgpu-first-run-") as d:
        about = describe(args.python, Path(d))
    print(f"protgpu: {about['protgpu_path']}")
    for line in about["info"]:
        print(f"  {line}")
    print(f"  prebuilt lookups in one run: {about['prebuilt_in_a_run']}")
    if not about["has_prebuilt"]:
        print("warning: this protgpu has no prebuilt cubins (a checkout or an editable install, not the wheel)",
              file=sys.stderr)
    rows = [measure(args.python, True, args.repeat, args.warm)]
    if args.before:
        rows.append(measure(args.python, False, args.repeat, args.warm))
    print_table(rows, ["mode", "cold_s", "warm_s", "cold_kernels_only_s", "ratio_cold_warm", "within_target"])
    out = write_results("first_run", rows, {"job": f"protgpu contacts {INPUT.relative_to(REPO)} --out adk_contacts.npz",
                                            "target_ratio": TARGET, **about}, args.json)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
