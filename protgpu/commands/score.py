"""``protgpu score MODELS... --ref REF [--metrics tm,lddt,gdt,rmsd] [--out scores.csv|.jsonl|.parquet]``.

One row per model (per frame of a multi-model file) with its file name: TM-score, RMSD of the common
residues, GDT-TS/GDT-HA, MaxSub (the TMscore program's numbers) and lDDT (OpenStructure's). All models
are loaded first, then scored in one batch per metric, on the GPU when there is one. ``--plot`` draws the
per-residue lDDT along the reference.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import InputError
from ._inputs import expand_inputs
from ._progress import progress

METRICS = ("tm", "lddt", "gdt", "rmsd")
_OUT_SUFFIXES = (".csv", ".jsonl", ".parquet")


def register(sub, common) -> None:
    p = sub.add_parser("score", parents=common,
                       help="TM-score, GDT, MaxSub, RMSD and lDDT of models against a reference")
    p.add_argument("--ref", "-r", required=True, help="reference (native) structure")
    p.add_argument("--top", "-t", help="topology for trajectory inputs (every frame is scored as a model)")
    p.add_argument("--metrics", "-m", default="tm,lddt,gdt,rmsd",
                   help="comma-separated subset of tm,lddt,gdt,rmsd (default: all)")
    p.add_argument("--mapping", choices=("resnum", "sequence"), default="resnum",
                   help="match residues by (chain, number, insertion code) or by sequence alignment")
    p.add_argument("--normalize-by", default="reference",
                   help="TM-score length: reference (default), model, or a number of residues")
    p.add_argument("--lddt-atoms", choices=("heavy", "ca"), default="heavy", help="atoms lDDT scores (default heavy)")
    p.add_argument("--no-symmetry", action="store_true", help="lDDT without resolving symmetric side chains")
    p.add_argument("--per-residue", action="store_true", help="add per-residue lDDT columns (lddt:<chain>:<resid>)")
    p.add_argument("--plot", help="per-residue lDDT line plot (.png)")
    p.set_defaults(func=run)


def _metrics(text: str) -> list[str]:
    wanted = [m.strip().lower() for m in text.split(",") if m.strip()]
    bad = [m for m in wanted if m not in METRICS]
    if bad or not wanted:
        raise InputError(f"--metrics {text!r}: choose from {','.join(METRICS)}")
    return wanted


def _normalize_by(text: str):
    if text in ("reference", "model"):
        return text
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"--normalize-by {text!r}: use reference, model or a length") from None
    if not value > 0:
        raise InputError(f"--normalize-by {text!r}: a length must be positive")
    return value


def _value(v):
    if isinstance(v, (np.floating, float)):
        v = float(v)
        return None if math.isnan(v) else v
    if isinstance(v, (np.integer, int)):
        return int(v)
    return v


def _write(path: str, columns: list[str], rows: list[dict]) -> None:
    from ..io import write_atomic

    low = path.lower()
    if low.endswith(".csv"):
        def write_csv(tmp):
            with open(tmp, "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=columns)
                w.writeheader()
                for r in rows:
                    w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})

        write_atomic(path, write_csv)
    elif low.endswith(".jsonl"):
        def write_jsonl(tmp):
            with open(tmp, "w") as fh:
                for r in rows:
                    fh.write(json.dumps({k: r.get(k) for k in columns}) + "\n")

        write_atomic(path, write_jsonl)
    elif low.endswith(".parquet"):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise InputError(f"--out {path}: writing parquet needs pyarrow (pip install pyarrow); "
                             "or use .csv / .jsonl") from None
        table = pa.table({k: [r.get(k) for r in rows] for k in columns})
        write_atomic(path, lambda tmp: pq.write_table(table, tmp))
    else:
        raise InputError(f"--out {path}: use a .csv, .jsonl or .parquet file name")


def run(args) -> int:
    from .._array import dispatch
    from ..io import load
    from ..scoring import lddt, lddt_residue_labels, tm_score

    metrics = _metrics(args.metrics)
    norm = _normalize_by(args.normalize_by)
    if args.out and not args.out.lower().endswith(_OUT_SUFFIXES):
        raise InputError(f"--out {args.out}: use a .csv, .jsonl or .parquet file name")
    if args.plot and not args.plot.lower().endswith(".png"):
        raise InputError(f"--plot {args.plot}: use a .png file name")
    want_lddt = "lddt" in metrics or args.per_residue or bool(args.plot)
    want_tm = any(m in metrics for m in ("tm", "gdt", "rmsd"))
    device = dispatch(device=args.device).device
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    paths = expand_inputs(args.inputs)
    ref = load(args.ref)
    if args.select:
        ref = ref.select(args.select)
    def load_one(path):
        s = load(path, top=args.top)
        return s.select(args.select) if args.select else s

    # Parsing is NumPy work on bytes that partly releases the GIL: a few threads help with many files.
    workers = min(8, os.cpu_count() or 1) if len(paths) > 8 else 1
    with ThreadPoolExecutor(workers) as pool:
        loaded = pool.map(load_one, paths)
        models = [s for _, s in zip(progress(paths, description="loading", quiet=args.quiet), loaded, strict=True)]
    timings["load"] = time.perf_counter() - t0

    # rows by position: two inputs may share a file name
    rows = [{"model": name} for name in _model_names(models)]
    columns = ["model"]

    if want_tm:
        t1 = time.perf_counter()
        r = tm_score(models, ref, normalize_by=norm, mapping=args.mapping, device=device)
        timings["tm_score"] = time.perf_counter() - t1
        fields = []
        if "tm" in metrics:
            fields += ["tm"]
        if "rmsd" in metrics:
            fields += ["rmsd"]
        if "gdt" in metrics:
            fields += ["gdt_ts", "gdt_ha", "maxsub"]
        fields += ["n_aligned"]
        columns += fields
        for i, rr in enumerate(rows):
            for f in fields:
                rr[f] = _value(getattr(r, f)[i])
    per = labels = None
    if want_lddt:
        t1 = time.perf_counter()
        g, per = lddt(models, ref, atoms=args.lddt_atoms, per_residue=True, symmetry=not args.no_symmetry,
                      mapping=args.mapping, device=device)
        timings["lddt"] = time.perf_counter() - t1
        labels = lddt_residue_labels(ref)
        if "lddt" in metrics:
            columns.append("lddt")
            for i, rr in enumerate(rows):
                rr["lddt"] = _value(g[i])
        if args.per_residue:
            res_cols = [f"lddt:{lab}" for lab in labels]
            columns += res_cols
            for i, rr in enumerate(rows):
                for c, v in zip(res_cols, per[i].tolist(), strict=True):
                    rr[c] = _value(v)

    t1 = time.perf_counter()
    ordered = rows
    if args.out:
        _write(args.out, columns, ordered)
    else:
        shown = [c for c in columns if not c.startswith("lddt:")]
        print("\t".join(shown))
        for r in ordered:
            print("\t".join(_fmt(r.get(c)) for c in shown))
    if args.plot:
        from ..scoring._plot import plot_lddt_per_residue

        plot_lddt_per_residue(per, args.plot, labels=labels, names=_model_names(models),
                              title=f"per-residue lDDT vs {os.path.basename(args.ref)}")
    timings["write"] = time.perf_counter() - t1
    if not args.quiet:
        where = " + ".join(f"{k} {v:.2f} s" for k, v in timings.items())
        dest = f" -> {args.out}" if args.out else ""
        print(f"{len(ordered)} model(s) from {len(paths)} file(s) on the {device.upper()}: {where}{dest}",
              file=sys.stderr)
    return 0


def _model_names(models) -> list[str]:
    """Row names in the order the scores come back: file name, with [i] for frames of a multi-model file."""
    out = []
    for s in models:
        base = os.path.basename(str(s.source)) if s.source else "model"
        out += [base] if s.n_frames == 1 else [f"{base}[{i}]" for i in range(s.n_frames)]
    return out


def _fmt(v) -> str:
    if v is None:
        return "nan"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)
