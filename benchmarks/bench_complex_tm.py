"""Cost of ``score_complex``'s tm_score in US-align's complex mode (``align.complex_mode.mm_align``, CPU)
per model of issue 18's complexes: the 305 + 150-residue cut of 1EUD and its synthetic perturbations
from ``bench_complex.py`` (chain B moved rigidly, residue and atom noise). Rows: one core (models one
after another, ``--mapping`` fixed as score_complex's default, and MM-align's own assignment), and a
process pool of ``--jobs`` workers (models/s of the whole pool); the share of the cross-chain step
(``_dimer.dimer_align``); for comparison the "mapped" TM-score (the TMscore program's search on the
mapped residues, one model at a time on the CPU).

    python3 benchmarks/bench_complex_tm.py [--models N] [--jobs J] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, write_results  # noqa: E402
from bench_complex import perturbed_complexes, reference_complex  # noqa: E402

_STATE: dict = {}


def _setup(n: int) -> None:
    from protgpu.align.complex_mode import protein_chain_cas

    ref = reference_complex()
    _, cas = protein_chain_cas(ref)
    y = np.asarray(ref.coords[0], np.float64)
    _STATE.update(ref=ref, cas=cas, target=[y[c] for c in cas], coords=perturbed_complexes(ref, n, seed=1))


def _one(k: int, mapping) -> float:
    from protgpu.align.complex_mode import mm_align

    x = _STATE["coords"][k].astype(np.float64)
    return mm_align([x[c] for c in _STATE["cas"]], _STATE["target"], mapping=mapping).tm


def _serial(n: int, mapping) -> tuple[float, list]:
    _one(0, mapping)  # compile / load the numba cache
    t0 = time.perf_counter()
    tms = [_one(k, mapping) for k in range(n)]
    return (time.perf_counter() - t0) / n, tms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=int, default=20, help="models (default 20)")
    ap.add_argument("--jobs", type=int, default=None, help="pool processes (default: all cores)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import os

    from protgpu.align import _dimer, complex_mode

    n, jobs = args.models, args.jobs or os.cpu_count() or 1
    _setup(n)
    fixed = {0: 0, 1: 1}
    rows = []
    per, tms = _serial(n, fixed)
    rows.append({"case": "mm_align, chain mapping given, 1 core", "models": n, "s_per_model": per,
                 "models_per_s": 1 / per, "tm_mean": float(np.mean(tms))})
    per_auto, tms_auto = _serial(n, None)
    rows.append({"case": "mm_align, own assignment, 1 core", "models": n, "s_per_model": per_auto,
                 "models_per_s": 1 / per_auto, "tm_mean": float(np.mean(tms_auto))})
    # share of the cross-chain step
    spent = [0.0]
    inner = complex_mode.dimer_align

    def timed(*a, **k):
        t = time.perf_counter()
        out = inner(*a, **k)
        spent[0] += time.perf_counter() - t
        return out

    complex_mode.dimer_align = timed
    t0 = time.perf_counter()
    for k in range(n):
        _one(k, fixed)
    total = time.perf_counter() - t0
    complex_mode.dimer_align = inner
    rows.append({"case": "cross-chain step share (_dimer.dimer_align)", "models": n, "share": spent[0] / total})
    # a process pool over the models (the per-model Python keeps threads from scaling)
    with ProcessPoolExecutor(jobs, initializer=_setup, initargs=(n,)) as pool:
        list(pool.map(_one, range(jobs), [fixed] * jobs))  # warm every worker
        t0 = time.perf_counter()
        list(pool.map(_one, range(n), [fixed] * n))
        dt = time.perf_counter() - t0
    rows.append({"case": f"mm_align, chain mapping given, {jobs} processes", "models": n, "s_per_model": dt / n,
                 "models_per_s": n / dt})
    # the mapped TM-score for comparison (pg.tm_score on the sequence mapping = here residue identity)
    import protgpu as pg

    ref = _STATE["ref"]
    ca = np.concatenate(_STATE["cas"])
    pg.tm_score(_STATE["coords"][0][ca], np.asarray(ref.coords[0])[ca], device="cpu")
    t0 = time.perf_counter()
    mapped = [float(pg.tm_score(_STATE["coords"][k][ca], np.asarray(ref.coords[0])[ca], device="cpu").tm)
              for k in range(n)]
    dt = (time.perf_counter() - t0) / n
    rows.append({"case": "mapped TM-score (pg.tm_score), 1 core", "models": n, "s_per_model": dt,
                 "models_per_s": 1 / dt, "tm_mean": float(np.mean(mapped))})
    print_table(rows, ["case", "models", "s_per_model", "models_per_s", "tm_mean", "share"])
    print("written:", write_results("complex_tm", rows, {"masked_dp": _dimer.__name__}, args.json))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
