"""Complex scoring, issue 18's case: 2-chain complexes of ~300 + ~150 residues, N models against one
reference, every metric of ``pg.score_complex`` (lDDT, backbone and interface lDDT, TM-score, GDT, RMSD,
QS-score, DockQ with its parts).

Data (synthetic perturbations of a real complex, said so in the results): the reference is
``datasets/openstructure/1eud_ref.pdb`` (PDB 1EUD, OpenStructure's test pair) cut to its chain A (306
residues) and the 150-residue window of chain B with the most heavy-atom contacts to A, heavy atoms
of the standard amino acids only (its three modified residues left out: DockQ keeps their extra atoms,
OpenStructure and protgpu do not). Each model moves chain B rigidly against A (a rotation of up to 10
degrees about B's centre, a shift of up to 3 A), deforms the complex smoothly (three plane waves of
60 A wavelength and 0.1-0.5 A amplitude) and adds 0.005 A atom noise, so that bonds stay within the
stereochecks' 12 sd as a real model's do (until 2 December 2026: independent noise of 0.2-1.5 A per
residue and 0.2 A per atom, which the stereochecks would strip to almost nothing); written as PDB
files to a temporary folder. Rows:

* ``protgpu evaluate (end to end)``: the CLI's own job (``evaluate_job`` of ``protgpu evaluate DIR --ref
  REF --confidence none --out x.csv -q``) through ``run_job``: parse and map chains in worker processes,
  design-sanity columns, batched scores, journal, CSV. Models/s from files.
* ``batched metrics``: the metrics that are one batched call on the device (lDDT, backbone and
  interface lDDT, TM-score/GDT/RMSD) over the N models as one stack (parsed, mapped, their per-model
  host parts given, as evaluate's parse workers hand them over): the GPU part.
* ``per-model CPU parts``: QS-score, the DockQ contacts and the stereochecks of up to 200 models on
  one core (evaluate counts them in its parse workers, in parallel).
* ``DockQ 2.1.3 (anchor, 1 core)``: DockQ's Python API (``load_PDB`` + ``run_on_all_native_interfaces``
  with the chain map given) per model file, one process. Runs when ``import DockQ`` works in
  ``--anchor-python`` (default: this Python). DockQ's wheels are built against NumPy 1.x: in a NumPy 1.x
  environment (``python3 -m venv v && v/bin/pip install DockQ``) its Cython module runs and its rate is
  the ratios' denominator; under NumPy 2 (the GPU machine's Python: ``pip install --no-deps --target
  DIR`` of the DockQ, networkx, parallelbar, colorama and tqdm wheels, ``PYTHONPATH=DIR``) DockQ runs
  its own pure-NumPy fallback, slower, so that row's rate is shown but the ratios use the Cython rate of
  ``results/complex-cpu.json``. Either way its DockQ values are compared with ours (max abs difference).
  OpenStructure's scorer is not on PyPI (conda or a source build): not run.

    python3 benchmarks/bench_complex.py [--models N | --quick] [--anchor-models K] [--anchor-python PATH]
                                        [--device auto|cpu|gpu] [--jobs J] [--json PATH]

Default N: 10,000 on a GPU, 64 on the CPU; ``--quick``: 2,000 (under two minutes on one H200). The
per-model split (``per_model_ms`` in the results, printed under the table): each load step on one core
(read, confidence, sanity, chain mapping, QS/DockQ contacts), the load as the end-to-end run's workers
saw it, and the compute in the main process (batched scores, rows), in milliseconds per model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import HERE, machine, print_table, write_results
from bench_scoring import write_pdbs

REF = HERE.parent / "datasets" / "openstructure" / "1eud_ref.pdb"
STANDARD = ("ALA", "ARG", "ASN", "ASP", "CYS", "GLN", "GLU", "GLY", "HIS", "ILE", "LEU", "LYS", "MET", "PHE",
            "PRO", "SER", "THR", "TRP", "TYR", "VAL")
GPU_METRICS = ("lddt", "bb_lddt", "ilddt", "tm_score", "gdtts", "gdtha", "rmsd")


def reference_complex():
    """1eud chain A + the 150-residue window of chain B closest to A (heavy atoms, renumbered atoms)."""
    import protgpu as pg

    s = pg.load(REF).select("heavy and protein")
    # the modified residues (CME, CSS, NEP) go: OpenStructure and protgpu cut them to their parent's
    # atoms, DockQ keeps every atom; without them both count the same contacts
    s = s.select(np.flatnonzero(np.isin(s.atoms.resname, STANDARD)))
    a = s.atoms
    xa = s.coords[0][a.chain == "A"]
    b_idx = np.flatnonzero(a.chain == "B")
    from scipy.spatial import cKDTree

    near = cKDTree(xa).query(s.coords[0][b_idx], distance_upper_bound=8.0)[0] < 8.0
    b_res = a.residue_index[b_idx]
    res_ids = np.unique(b_res)
    per_res = np.array([near[b_res == r].sum() for r in res_ids])
    window = np.convolve(per_res, np.ones(150), mode="valid")
    start = int(np.argmax(window))
    keep_b = res_ids[start:start + 150]
    keep = np.flatnonzero((a.chain == "A") | np.isin(a.residue_index, keep_b))
    return s.select(keep)


def perturbed_complexes(ref, n: int, seed: int = 0) -> np.ndarray:
    """(n, atoms, 3) float32: chain B moved rigidly against A, then a smooth deformation of the whole
    complex (three plane waves of 60 A wavelength, 0.1-0.5 A each) and 0.005 A atom noise: a model's
    geometry stays as ideal as the reference's (bonds within 12 sd, as a predicted or designed model's
    are), so that OpenStructure's stereochecks, which the scores apply, remove what they would in real
    models, not every residue (independent noise of 0.2 A per atom breaks most bonds beyond 12 sd)."""
    rng = np.random.default_rng(seed)
    x0 = ref.coords[0].astype(np.float64)
    a = ref.atoms
    isb = a.chain == "B"
    cb = x0[isb].mean(axis=0)
    out = np.empty((n, len(x0), 3), np.float32)
    for k in range(n):
        axis = rng.normal(size=3)
        axis /= np.linalg.norm(axis)
        ang = np.deg2rad(rng.uniform(0, 10))
        kx = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
        rot = np.eye(3) + np.sin(ang) * kx + (1 - np.cos(ang)) * kx @ kx
        x = x0.copy()
        x[isb] = (x[isb] - cb) @ rot.T + cb + rng.uniform(-1, 1, 3) * 3.0 / np.sqrt(3)
        for _ in range(3):  # a displacement field smooth on the scale of a bond (strain < 2%)
            wave = rng.normal(size=3)
            wave *= 2 * np.pi / 60.0 / np.linalg.norm(wave)
            amp = rng.normal(size=3)
            amp *= rng.uniform(0.1, 0.5) / np.linalg.norm(amp)
            x += np.sin(x @ wave + rng.uniform(0, 2 * np.pi))[:, None] * amp
        x += rng.normal(scale=0.005, size=x.shape)
        out[k] = x
    return out


# DockQ's wheels are built against NumPy 1.x: under NumPy 2 its Cython module does not load and DockQ
# falls back to its pure-NumPy twin (operations_nocy), which it imports as a top-level module: put its
# package folder on the path so that the fallback is found (harmless when the Cython module loads)
_DOCKQ_PATH = r"""
import importlib.util, os, sys
_spec = importlib.util.find_spec("DockQ")
if _spec is not None and _spec.origin:
    sys.path.append(os.path.dirname(_spec.origin))
"""

_ANCHOR = _DOCKQ_PATH + r"""
import json, time, importlib.metadata, logging
logging.disable(logging.WARNING)  # the fallback's warning
import DockQ.DockQ as D
from DockQ.DockQ import load_PDB, run_on_all_native_interfaces
ref, paths = sys.argv[1], json.loads(sys.stdin.read())
native = load_PDB(ref)
vals = []
t0 = time.perf_counter()
for p in paths:
    model = load_PDB(p)
    res, total = run_on_all_native_interfaces(model, native, chain_map={"A": "A", "B": "B"})
    vals.append(float(total))
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "dockq": vals, "version": importlib.metadata.version("DockQ"),
                  "cython": D.residue_distances.__module__ == "DockQ.operations"}))
"""


def run_anchor(python: str, ref: str, paths: list[str]) -> dict | None:
    probe = subprocess.run([python, "-c", _DOCKQ_PATH + "import DockQ.DockQ"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"DockQ anchor skipped: 'import DockQ' fails in {python}: "
              f"{(probe.stderr.strip().splitlines() or ['?'])[-1]}", file=sys.stderr)
        return None
    r = subprocess.run([python, "-c", _ANCHOR, ref], input=json.dumps(paths), capture_output=True, text=True)
    if r.returncode != 0:
        print(f"DockQ anchor failed: {r.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


#: The load steps of EvaluateJob.load, in order (its item's ``timings``).
LOAD_STEPS = ("read_s", "confidence_s", "sanity_s", "map_s", "host_scores_s")


def step_split(job, paths: list[str], stats: dict, n: int) -> dict:
    """Milliseconds per model of each step: the load steps on one core (``job.load`` of ``paths`` in
    this process, after a first model that fills the per-atom-table caches), the whole load in the
    end-to-end run's workers (summed over them: a worker's cost, contention included) and the compute
    (in the main process: batched scores, rows)."""
    job.load(paths[0])
    total = dict.fromkeys(LOAD_STEPS, 0.0)
    t0 = time.perf_counter()
    for p in paths:
        for k, v in job.load(p).timings.items():
            total[k] += v
    out = {f"1 core: {k[:-2]}": 1000 * v / len(paths) for k, v in total.items()}
    out["1 core: load (all steps)"] = 1000 * (time.perf_counter() - t0) / len(paths)
    for k in ("hash_s", "load_s", "compute_s", "wait_s"):
        if k in stats:
            out[f"end to end: {k[:-2]}"] = 1000 * stats[k] / n
    # the compute's steps (the job adds them up in this process); batches: how many computes shared them
    for k, v in getattr(job, "stats", {}).items():
        if not k.startswith("warmup"):  # once per run, not per model: in main_process_s
            out[f"compute: {k[:-2] if k.endswith('_s') else k}"] = 1000 * v / n if k.endswith("_s") else v
    return out


#: The end-to-end run's main process, in order (engine stats, seconds): what the run's time is made of.
MAIN_STEPS = ("list_s", "setup_s", "pool_start_s", "warmup_s", "warmup_score_s", "submit_s", "wait_s", "compute_s",
              "write_s", "pool_shutdown_s")


def main_process_split(stats: dict, e2e_s: float) -> dict:
    """Seconds of the end-to-end run's main process by step (``warmup_score_s`` is part of ``warmup_s``:
    scoring the reference once the device is up), and ``other`` (the rest of the run: receiving the
    parse results, the rows, the journal's bookkeeping)."""
    out = {k[:-2]: stats[k] for k in MAIN_STEPS if k in stats}
    out["other"] = e2e_s - sum(v for k, v in out.items() if k != "warmup_score")
    return out


def uses_gpu(device: str) -> bool:
    """Whether ``device`` resolves to the GPU, decided in a child process: this one then has not
    imported CuPy when the end-to-end run starts its parse workers, which are forked as the CLI's are
    (``protgpu.batch.local.fork_is_safe``; with CuPy loaded they come from a forkserver: 1-2 s more to
    start, each worker importing protgpu afresh)."""
    code = f"from protgpu._array import dispatch; print(int(dispatch(device={device!r}).on_gpu))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode != 0:  # the same error, here, with its traceback
        from protgpu._array import dispatch

        return dispatch(device=device).on_gpu
    return r.stdout.strip().splitlines()[-1] == "1"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=int, default=None, help="models (default 10000 on a GPU, 64 on the CPU)")
    ap.add_argument("--anchor-models", type=int, default=20, help="models the DockQ anchor scores")
    ap.add_argument("--anchor-python", default=sys.executable, help="a Python where 'import DockQ' works")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--jobs", type=int, default=None, help="parse workers of the end-to-end run")
    ap.add_argument("--batch-size", type=int, default=None, help="designs per batch (default: the job's)")
    ap.add_argument("--quick", action="store_true",
                    help="2,000 models (unless --models says otherwise): under two minutes on one GPU")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.quick and args.models is None:
        args.models = 2000

    from protgpu.batch.jobs.evaluate import EvaluateJob
    from protgpu.commands._batch_options import run_job
    from protgpu.complexes.scores import ComplexReference, host_scores, map_model, score_mapped

    on_gpu = uses_gpu(args.device)
    device = "gpu" if on_gpu else "cpu"
    n = args.models or (10000 if on_gpu else 64)
    ref = reference_complex()
    chains = {c: int(len(np.unique(ref.atoms.residue_index[ref.atoms.chain == c]))) for c in ("A", "B")}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "ref_dir").mkdir()
        (tmp / "models").mkdir()
        ref_path = write_pdbs(ref, ref.coords[:1], tmp / "ref_dir")[0]
        t0 = time.perf_counter()
        coords = perturbed_complexes(ref, n)
        paths = write_pdbs(ref, coords, tmp / "models")
        write_s = time.perf_counter() - t0

        # end to end: the CLI's job through the CLI's run_job
        ns = argparse.Namespace(out=str(tmp / "x.csv"), resume=False, keep_going=False, shard=None, jobs=args.jobs,
                                batch_size=args.batch_size, scheduler=None, tls_ca_file=None, tls_cert=None,
                                tls_key=None, workers=None, gpus=None, quiet=True, journal_interval=5.0,
                                progress_interval=None)
        job = EvaluateJob(str(ref_path), confidence="none", device=device)
        from protgpu.batch.local import pool_start_method

        start_method = pool_start_method(None)  # fork unless CuPy or a thread is already here
        import gc

        gc_s = {"n": 0, "s": 0.0, "t": 0.0}  # the main process's garbage collections during the run

        def gc_timer(phase, info):
            if phase == "start":
                gc_s["t"] = time.perf_counter()
            else:
                gc_s["n"] += 1
                gc_s["s"] += time.perf_counter() - gc_s["t"]

        gc.callbacks.append(gc_timer)
        t0 = time.perf_counter()
        summary = run_job(ns, job, [str(tmp / "models")], description="evaluate")
        e2e = time.perf_counter() - t0
        gc.callbacks.remove(gc_timer)
        assert summary.n_ok == n, summary.failed[:3]
        rows.append({"variant": "protgpu evaluate (end to end, files)", "models": n, "seconds": e2e,
                     "models_per_s": n / e2e})
        steps = step_split(job, paths[:min(n, 200)], summary.stats, n)

        # the batched scoring of N parsed, mapped models: every model has model 0's atom table and
        # mapping (one design's models), so the stack is built from the coordinates directly
        import protgpu as pg

        cref = ComplexReference(str(ref_path))
        cs0, cm0 = map_model(pg.load(paths[0]), cref)
        assert cs0.n_atoms == ref.n_atoms  # nothing for the clean-up to cut: the coordinates line up
        structs = [pg.Structure(coords[k], cs0.atoms, source=f"model {k}") for k in range(n)]
        maps = [cm0] * n
        gref = ComplexReference(str(ref_path), GPU_METRICS)
        # the per-model host parts (the stereochecks, which lddt and ilddt read) are evaluate's parse
        # workers' work: computed before the clock, as the workers hand them over
        _, _, gtable = map_model(pg.load(paths[0]), gref, table=True)
        ghost = [host_scores(structs[k], cm0, gref, gtable) for k in range(n)]
        score_mapped(structs[:8], maps[:8], gref, device, host=ghost[:8])  # warm: context, kernels, numba
        t0 = time.perf_counter()
        score_mapped(structs, maps, gref, device, host=ghost)
        gpu_s = time.perf_counter() - t0
        del ghost
        rows.append({"variant": f"batched metrics on the {device.upper()} ({', '.join(GPU_METRICS)})", "models": n,
                     "seconds": gpu_s, "models_per_s": n / gpu_s})
        # the per-model host parts (QS-score, DockQ contacts), one core: evaluate counts them in its workers
        # (with the memo of the models' one atom table, as there)
        h = min(n, 200)
        _, _, table0 = map_model(pg.load(paths[0]), cref, table=True)
        host_scores(structs[0], cm0, cref, table0)
        t0 = time.perf_counter()
        host = [host_scores(structs[k], cm0, cref, table0) for k in range(h)]
        host_s = time.perf_counter() - t0
        rows.append({"variant": "per-model CPU parts (QS-score, DockQ contacts, stereochecks), 1 core", "models": h,
                     "seconds": host_s, "models_per_s": h / host_s})
        # all metrics of those models, the host parts given: the DockQ values the anchor is held to
        table = score_mapped(structs[:h], maps[:h], cref, device, host=host)

        k = min(args.anchor_models, n)
        anchor = run_anchor(args.anchor_python, str(ref_path), paths[:k])
        extra = {"data": "synthetic perturbations (rigid motion of chain B, a smooth deformation, 0.005 A atom "
                         "noise) of 1eud_ref.pdb cut to "
                         f"chain A ({chains['A']} residues) + a 150-residue window of chain B ({chains['B']})",
                 "device": device, "write_pdbs_s": write_s, "engine_stats": dict(summary.stats),
                 "per_model_ms": steps, "main_process_s": main_process_split(summary.stats, e2e),
                 "parse_pool_start_method": start_method,
                 "main_process_gc": {"collections": gc_s["n"], "seconds": gc_s["s"]}}
        per = None
        if anchor is not None:
            diff = np.abs(np.asarray(anchor["dockq"]) - table["dockq"][:k])
            extra["dockq_max_abs_diff_vs_anchor"] = float(np.max(diff))
            how = "Cython" if anchor["cython"] else "its NumPy fallback: NumPy 2 does not load its Cython module"
            rows.append({"variant": f"DockQ {anchor['version']} (anchor, 1 core, per model file, {how})",
                         "models": k, "seconds": anchor["seconds"], "models_per_s": k / anchor["seconds"]})
            if anchor["cython"]:
                per = anchor["seconds"] / k
        if per is None:
            # DockQ does not install on the GPU machine (no network; needs numpy < 2): the CPU run's
            # measurement of the anchor, another machine's core, is the ratio's denominator
            # (a fallback anchor is slower than DockQ as installed with NumPy 1.x: not the denominator)
            why = "no DockQ built with Cython" if anchor is not None else "DockQ not importable"
            cpu_json = HERE / "results" / "complex-cpu.json"
            if cpu_json.is_file():
                for r in json.loads(cpu_json.read_text())["rows"]:
                    if r["variant"].startswith("DockQ") and "fallback" not in r["variant"]:
                        per = 1 / r["models_per_s"]
                        extra["anchor"] = (f"{why} in {args.anchor_python}; the ratio uses the DockQ "
                                           f"rate of {cpu_json.name} ({r['models_per_s']:.2f} models/s, another "
                                           "machine's core)")
            else:
                extra["anchor"] = f"{why} in {args.anchor_python}: no anchor rate in this run"
        if per is not None:
            for r in rows:
                if not r["variant"].startswith("DockQ"):
                    r["x_vs_dockq_1core"] = r["models_per_s"] * per
    print_table(rows, ["variant", "models", "seconds", "models_per_s", "x_vs_dockq_1core"])
    print("per model, ms: " + ", ".join(f"{k} {v:.2f}" for k, v in extra["per_model_ms"].items()))
    print("end to end, main process, s: " + ", ".join(f"{k} {v:.3f}" for k, v in extra["main_process_s"].items()))
    for key in ("parse_pool_start_method", "data", "dockq_max_abs_diff_vs_anchor", "anchor"):
        if key in extra:
            print(f"{key}: {extra[key]}")
    info = machine()
    if info.get("gpu") is None:  # no key rather than null: the results readers take a missing GPU as the CPU
        info.pop("gpu", None)
    out = write_results("complex", rows, {"machine": info, **extra}, args.json)
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
