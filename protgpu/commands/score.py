"""``protgpu score MODELS... --ref REF [--metrics tm,lddt,gdt,rmsd] [--out scores.csv|.jsonl|.parquet]``.

``protgpu score MODELS... --consensus [--temperature T]`` ranks an ensemble without a reference, by
:func:`protgpu.consensus_score`.

One row per model (per frame of a multi-model file) with its file name: TM-score, RMSD of the common
residues, GDT-TS/GDT-HA, MaxSub (the TMscore program's numbers) and lDDT (OpenStructure's). Models run
through the batch engine (:mod:`protgpu.batch`): parsed in worker processes while earlier batches are
scored, grouped by length, each group scored with one batched ``tm_score`` and one ``lddt`` call (on
the GPU when there is one), journaled in ``OUT.manifest.jsonl`` so that ``--resume`` picks up a killed
run. ``--plot`` draws the per-residue lDDT along the reference.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from ..batch.inputs import expand_inputs
from ..errors import InputError
from ._batch_options import (
    add_batch_options,
    check_table_out,
    job_device,
    late_device,
    mark,
    print_run_line,
    report_failures,
    run_job,
)
from ._cli_text import add_out, add_parser, translate_failures

METRICS = ("tm", "lddt", "gdt", "rmsd")


def register(sub, common) -> None:
    p = add_parser(
        sub, "score", parents=common, help="TM-score, GDT, MaxSub, RMSD and lDDT of models against a reference",
        description="One row per model (per frame of a multi-model file or trajectory): TM-score, RMSD of the "
                    "common residues, GDT-TS/GDT-HA, MaxSub (the TMscore program's numbers) and lDDT "
                    "(OpenStructure's); or, with --consensus, a ranking of the models by their similarity to "
                    "each other. Without --out, stdout is the table (header row, tab-separated) and the "
                    "summary goes to stderr.",
        example=[("protgpu score models/*.pdb --ref native.pdb -o scores.csv",
                  "every metric of every model, a resumable table"),
                 ("protgpu score model.pdb --ref native.pdb -m tm,lddt --mapping sequence --plot lddt.svg",
                  "match residues by alignment; draw the per-residue lDDT"),
                 ("protgpu score decoys/ --consensus --out ranking.csv",
                  "rank an ensemble without a reference")])
    add_out(p, ".csv, .jsonl or .parquet (one row per model)")
    p.add_argument("--ref", "-r", help="reference (native) structure (required unless --consensus)")
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
    p.add_argument("--plot", metavar="FIGURE", help="per-residue lDDT line plot (.png, .svg or .pdf)")
    p.add_argument("--consensus", action="store_true",
                   help="rank the models by ensemble consensus (no reference): softmax(-RMSD^2/T)-weighted "
                        "TM-style similarity to the other models, on CA atoms")
    p.add_argument("--temperature", type=float, default=None,
                   help="consensus softmax temperature in Angstrom^2 (default 4.0)")
    add_batch_options(p)
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


def run_consensus(args) -> int:
    """``--consensus``: one ranked table of every model (frame) of every input."""
    from ..batch import write_table
    from ..scoring.consensus import DEFAULT_TEMPERATURE, consensus_ranking_table

    if args.ref:
        raise InputError("--consensus ranks models against each other: leave out --ref")
    check_table_out(args.out)
    temperature = DEFAULT_TEMPERATURE if args.temperature is None else args.temperature
    device, where = job_device(args)
    paths = expand_inputs(args.inputs)
    rows = consensus_ranking_table(paths, temperature=temperature, top=args.top, select=args.select,
                                   device=device)
    if args.out:
        write_table(args.out, rows, ["rank", "model", "consensus"])
    if not args.quiet:
        if not args.out:
            print("rank\tmodel\tconsensus")
            for r in rows:
                print(f"{r['rank']}\t{r['model']}\t{_fmt(r['consensus'])}")
        dest = f" -> {args.out}" if args.out else ""
        print(f"{len(rows)} model(s) from {len(paths)} file(s) ranked by consensus (T = {temperature:g} A^2) "
              f"on the {where}{dest}", file=sys.stderr)
    return 0


def score_job(args, device: str):
    """The :class:`protgpu.batch.ScoreJob` that ``protgpu score`` runs for parsed ``args`` (the batch
    benchmark runs exactly this job)."""
    from ..batch import ScoreJob

    return ScoreJob(args.ref, metrics=_metrics(args.metrics), mapping=args.mapping,
                    normalize_by=_normalize_by(args.normalize_by), lddt_atoms=args.lddt_atoms,
                    symmetry=not args.no_symmetry, per_residue=args.per_residue, keep_per_residue=bool(args.plot),
                    select=args.select, top=args.top, device=device)


def run(args) -> int:
    if args.consensus:
        return run_consensus(args)
    if not args.ref:
        raise InputError("--ref is required (or --consensus to rank models against each other)")
    if args.temperature is not None:
        raise InputError("--temperature only applies with --consensus")
    _metrics(args.metrics)  # option errors first, before any file is touched
    _normalize_by(args.normalize_by)
    check_table_out(args.out)
    if args.plot:
        from ..plotting import require_figure

        require_figure(args.plot)  # before any model is scored
    device = late_device(args)  # auto: decided by the job's warm-up, after the parse workers started
    paths = expand_inputs(args.inputs)
    mark("listed")
    job = score_job(args, device)
    mark("job")
    summary = run_job(args, job, paths, description="score")
    where = job_device(args)[1]
    rows = summary.rows
    if not args.out:
        shown = [c for c in job.columns if not c.startswith("lddt:")]
        print("\t".join(shown))
        for r in rows:
            print("\t".join(_fmt(r.get(c)) for c in shown))
    if args.plot and rows:
        from ..plotting import per_residue_plot

        labels = job.residue_labels
        per = np.array([[np.nan if r.get(f"lddt:{lab}") is None else r[f"lddt:{lab}"] for lab in labels]
                        for r in rows], dtype=np.float64)
        per_residue_plot(per, args.plot, labels=labels, names=[r["model"] for r in rows],
                         title=f"per-residue lDDT vs {os.path.basename(args.ref)}")
    if not args.quiet:
        print_run_line(summary, f"{len(rows)} model(s)", where)
    report_failures(translate_failures(summary, "score"), "score")
    return summary.exit_code


def _fmt(v) -> str:
    if v is None:
        return "nan"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)
