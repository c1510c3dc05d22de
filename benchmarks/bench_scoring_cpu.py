"""CPU rows of the scoring table: protgpu's TM-score and lDDT on the CPU against the tools people run.

Data: the AdK trajectory of the repository (datasets/adk_dims.dcd on adk_closed.pdb: 214 residues,
1,656 heavy atoms), frames cycled up to ``--models``; the reference is adk_closed.pdb.

* TM-score: ``pg.tm_score(device="cpu")`` (the TMscore program's full search: both searches, every
  seed) against ``tmtools.tm_align`` (TM-align: it also searches the alignment, so it does more work
  than a fixed-alignment TM-score; the TMscore program itself is not installed here). One model on
  one core; many models on every core (protgpu's threads vs a process pool of tm_align), and per core.
* lDDT: ``pg.lddt(device="cpu")`` all heavy atoms against ``biotite.structure.lddt`` (one process;
  biotite has no symmetry resolution: the like-for-like row is ``symmetry=False``, the default
  ``symmetry=True`` row does more work). One model and many models.
* TM-align: ``pg.tm_align(device="cpu")`` against ``tmtools.tm_align`` on the same CA arrays, one core
  (both run pairs one after another in one thread): one pair of ~100, ~300 and ~1,000 residues
  (``datasets/tmalign/``: d1cida1-d1dcea2, d4n91a_-d4oana1, d1y5ia2-d1kqfa2), and the 90 ordered pairs
  of the ten small chains there (59-109 residues) as one call. The NumPy twin is timed on the two
  smaller single pairs only (it takes minutes on the others).

Each protgpu row is timed with the compiled path (numba) and with the NumPy twin (``PROTGPU_NUMBA``'s
switch, :data:`protgpu.scoring._fast.ENABLED`): the twin is the before. Ratios are anchor time /
protgpu time (above 1: protgpu faster). Anchors that are not installed are skipped. ``--only METRIC``
times one metric's rows and keeps the other rows of the results file from its earlier run.

    python3 benchmarks/bench_scoring_cpu.py [--models M] [--repeat R] [--only METRIC] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from _common import HERE, RESULTS, device_tag, machine, print_table, time_cpu, write_results

DATA = HERE.parent / "datasets"


def _load(m: int):
    import protgpu as pg

    traj = pg.load(DATA / "adk_dims.dcd", top=DATA / "adk_closed.pdb")
    idx = np.arange(m) % traj.n_frames
    return traj.frames(idx), pg.load(DATA / "adk_closed.pdb")


def _ca(s) -> np.ndarray:
    ca = np.flatnonzero(s.atoms.name == "CA")
    return np.ascontiguousarray(s.coords[:, ca], dtype=np.float64)


def _tm_align_one(args):
    import tmtools

    x, y = args
    seq = "A" * len(x)
    return tmtools.tm_align(x, y, seq, seq).tm_norm_chain2


def _tmtools_rows(x: np.ndarray, y: np.ndarray, threads: int, repeat: int) -> dict:
    try:
        import tmtools  # noqa: F401
    except ImportError:
        print("tmtools not installed: TM-score anchors skipped")
        return {}
    out = {"one": time_cpu(lambda: _tm_align_one((x[0], y)), repeat=repeat)["median_s"],
           "serial": time_cpu(lambda: [_tm_align_one((xi, y)) for xi in x], repeat=1)["median_s"]}
    with Pool(threads) as pool:
        out["pool"] = time_cpu(lambda: pool.map(_tm_align_one, [(xi, y) for xi in x], chunksize=8),
                               repeat=1)["median_s"]
    return out


def _biotite_rows(models, ref, repeat: int) -> dict:
    try:
        import biotite.structure as bs
        from biotite.structure.io import pdb
    except ImportError:
        print("biotite not installed: lDDT anchors skipped")
        return {}
    arr = pdb.PDBFile.read(str(DATA / "adk_closed.pdb")).get_structure(model=1)
    heavy = arr.element != "H"
    ref_a = arr[heavy]
    coords = models.coords[:, heavy].astype(np.float64)
    return {"one": time_cpu(lambda: bs.lddt(ref_a, coords[0]), repeat=repeat)["median_s"],
            "many": time_cpu(lambda: bs.lddt(ref_a, coords), repeat=1)["median_s"]}


# (case, mobile, target) of the single-pair TM-align rows, files in datasets/tmalign/
TM_ALIGN_PAIRS = (("~100 residues", "d1cida1.pdb", "d1dcea2.pdb"), ("~300 residues", "d4n91a_.pdb", "d4oana1.pdb"),
                  ("~1,000 residues", "d1y5ia2.pdb.gz", "d1kqfa2.pdb.gz"))
# the small chains of datasets/tmalign/: every ordered pair of them is the many-pairs row
TM_ALIGN_SMALL = ("d1cxya_.pdb", "d3lf5a_.pdb", "d2a6ca1.pdb", "d1neqa_.pdb", "d1t3ba2.pdb", "d2nwta1.pdb",
                  "d1cida1.pdb", "d1dcea2.pdb", "1e79h.pdb", "1fs0e.pdb")


def _tm_align_rows(row, timed, fast_ok: bool, repeat: int) -> None:
    """pg.tm_align against tmtools.tm_align on one core: three single pairs and the small chains' 90
    ordered pairs (``row`` appends a result row; ``timed`` switches the fast path)."""
    import protgpu as pg
    from protgpu.align.chains import one_chain

    try:
        import tmtools
    except ImportError:
        tmtools = None
        print("tmtools not installed: TM-align anchors skipped")

    def chain(name):
        c = one_chain(str(DATA / "tmalign" / name), name)
        return np.ascontiguousarray(c.ca, dtype=np.float64), c.sequence

    for case, mob, tgt in TM_ALIGN_PAIRS:
        (x, sx), (y, sy) = chain(mob), chain(tgt)
        big = max(len(x), len(y)) > 500
        reps = min(repeat, 3) if big else repeat
        one = lambda x=x, y=y: pg.tm_align(x, y, device="cpu")  # noqa: E731
        anchor = (time_cpu(lambda x=x, y=y, sx=sx, sy=sy: tmtools.tm_align(x, y, sx, sy), repeat=reps)["median_s"]
                  if tmtools else None)
        row("tm_align", f"1 pair, {case} ({len(x)} x {len(y)}: {mob.split('.')[0]}-{tgt.split('.')[0]})",
            "tmtools.tm_align", anchor, timed(one, fast=True, repeat=reps) if fast_ok else None,
            None if big else timed(one, fast=False, repeat=1), 1)
    chains = [chain(n) for n in TM_ALIGN_SMALL]
    pairs = [(i, j) for i in range(len(chains)) for j in range(len(chains)) if i != j]
    cas = [c for c, _ in chains]
    many = lambda: pg.tm_align(cas, cas, pairs=pairs, device="cpu")  # noqa: E731
    anchor = (time_cpu(lambda: [tmtools.tm_align(chains[i][0], chains[j][0], chains[i][1], chains[j][1])
                                for i, j in pairs], repeat=1)["median_s"] if tmtools else None)
    sizes = sorted(len(c) for c in cas)
    row("tm_align", f"{len(pairs)} pairs ({sizes[0]}-{sizes[-1]} residues), 1 core", "tmtools.tm_align serial",
        anchor, timed(many, fast=True, repeat=1) if fast_ok else None, None, 1)


def _merge_earlier(rows: list[dict], metrics: set, path) -> dict:
    """Rows of the other metrics from the results file's earlier run (kept in front, in their order),
    and that run's description; nothing when there is no earlier file."""
    out = Path(path) if path else RESULTS / f"scoring_cpu-{device_tag(machine())}.json"
    if not out.is_file():
        return {}
    old = json.loads(out.read_text())
    kept = [r for r in old.get("rows", []) if r.get("metric") not in metrics]
    rows[:0] = kept
    earlier = {k: v for k, v in old.items() if k not in ("rows", "benchmark", "machine", "earlier_run")}
    m = old.get("machine", {})
    return {"earlier_run": {"metrics": ", ".join(sorted({r["metric"] for r in kept})), "commit": m.get("commit"),
                            "date": m.get("date"), **{k: v for k, v in earlier.items() if not isinstance(v, dict)}}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=200)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--only", choices=("tm_score", "lddt", "tm_align"), default=None,
                   help="time only this metric's rows; the file keeps the other rows of its earlier run")
    p.add_argument("--skip-numpy-many", action="store_true",
                   help="leave out the NumPy twin's timings of the many-model rows (the slowest part of a run; "
                        "the fast path and the anchors are timed as always)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    want = {a.only} if a.only else {"tm_score", "lddt", "tm_align"}

    import protgpu as pg
    from protgpu._threads import cpu_threads
    from protgpu.scoring import _fast

    threads = cpu_threads()
    models, ref = _load(a.models)
    one = models.frames([0])
    ref_path = str(DATA / "adk_closed.pdb")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    fast_ok = _fast.enabled()

    def timed(fn, *, fast: bool, single_thread: bool = False, repeat: int = a.repeat):
        saved_en, saved_threads = _fast.ENABLED, _fast.cpu_threads
        _fast.ENABLED = fast and fast_ok
        if single_thread:
            _fast.cpu_threads = lambda: 1
        try:
            return time_cpu(fn, repeat=repeat)["median_s"]
        finally:
            _fast.ENABLED, _fast.cpu_threads = saved_en, saved_threads

    tm_one = lambda: pg.tm_score(one, ref_path, device="cpu")  # noqa: E731
    tm_many = lambda: pg.tm_score(models, ref_path, device="cpu")  # noqa: E731
    m = a.models
    rows = []

    def row(metric, case, anchor_name, anchor_s, fast_s, numpy_s, cores):
        rows.append({"metric": metric, "case": case, "cores": cores, "anchor": anchor_name,
                     "anchor_s": anchor_s, "protgpu_fast_s": fast_s, "protgpu_numpy_s": numpy_s,
                     "ratio_fast": anchor_s / fast_s if anchor_s and fast_s else None,
                     "ratio_numpy": anchor_s / numpy_s if anchor_s and numpy_s else None})
        # each row as it is measured: a run cut short by a time limit still shows what it got
        print(f"{metric} | {case} | {anchor_name} {anchor_s} | fast {fast_s} | numpy {numpy_s}", flush=True)

    reps = max(1, a.repeat // 5)
    if "tm_score" in want:
        anchors = _tmtools_rows(_ca(models), _ca(ref)[0], threads, a.repeat)
        row("tm_score", "1 model", "tmtools.tm_align", anchors.get("one"),
            timed(tm_one, fast=True) if fast_ok else None, timed(tm_one, fast=False), 1)
        row("tm_score", f"{m} models, 1 core", "tmtools.tm_align serial", anchors.get("serial"),
            timed(tm_many, fast=True, single_thread=True, repeat=reps) if fast_ok else None,
            None if a.skip_numpy_many else timed(tm_many, fast=False, repeat=reps), 1)
        row("tm_score", f"{m} models, all cores", f"tmtools.tm_align Pool({threads})", anchors.get("pool"),
            timed(tm_many, fast=True, repeat=reps) if fast_ok else None, None, threads)

    bio = _biotite_rows(models, ref, a.repeat) if "lddt" in want else {}
    for sym in (False, True) if "lddt" in want else ():
        l_one = lambda s=sym: pg.lddt(one, ref_path, device="cpu", symmetry=s)  # noqa: E731
        l_many = lambda s=sym: pg.lddt(models, ref_path, device="cpu", symmetry=s)  # noqa: E731
        tag = "symmetry" if sym else "no symmetry"
        row("lddt", f"1 model, {tag}", "biotite.structure.lddt", bio.get("one"),
            timed(l_one, fast=True) if fast_ok else None, timed(l_one, fast=False), 1)
        row("lddt", f"{m} models, {tag}, all cores", "biotite.structure.lddt", bio.get("many"),
            timed(l_many, fast=True, repeat=reps) if fast_ok else None,
            None if a.skip_numpy_many else timed(l_many, fast=False, repeat=reps),
            threads)
    if "tm_align" in want:
        _tm_align_rows(row, timed, fast_ok, a.repeat)
    print_table(rows, ["metric", "case", "cores", "anchor", "anchor_s", "protgpu_fast_s", "protgpu_numpy_s",
                       "ratio_fast", "ratio_numpy"])
    extra = _merge_earlier(rows, want, a.json) if a.only else {}
    # no "gpu": None entry on a CPU-only machine (notebook 05 formats the GPU name of every result)
    info = {k: v for k, v in machine().items() if v is not None}
    path = write_results("scoring_cpu", rows, {"machine": info, "models": m, "threads": threads,
                                                "loadavg_before": load, "numba": fast_ok,
                                                "loadavg_after": os.getloadavg() if load else None, **extra},
                         a.json)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
