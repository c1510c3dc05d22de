"""``protgpu evaluate DESIGNS... [--ref REF] [--confidence auto|none] --out designs.parquet``.

One row per design (per frame of a multi-model file): with ``--ref``, the complex scores
(:func:`protgpu.score_complex`: lDDT, backbone and interface lDDT, TM-score, GDT, RMSD, QS-score, DockQ
with its parts per reference interface as ``dockq:AB``, ``fnat:AB``, ... columns, and the chain mapping);
always, the model confidence (pLDDT, pTM, ipTM, ipSAE, pDockQ, pDockQ2, LIS where the predictor's
files are found next to the design) and the design-sanity metrics (clashes, radius of gyration, residue
and interface counts). Runs through the batch engine: resume, keep-going, shards, Dask.
"""

from __future__ import annotations

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
from .score import _fmt


def register(sub, common) -> None:
    p = add_parser(
        sub, "evaluate", parents=common,
        help="one table per design: complex scores, model confidence, design sanity",
        description="One row per design (per frame of a multi-model file). With --ref: lDDT, backbone and "
                    "interface lDDT, TM-score, GDT-TS/HA, RMSD, QS-score and DockQ (per reference interface: "
                    "dockq:AB, fnat:AB, irmsd:AB, lrmsd:AB, ...) on the chain mapping (column chain_mapping, "
                    "reference:model pairs). Always: pLDDT, pTM, ipTM, ipSAE, pDockQ, pDockQ2 and LIS where the "
                    "predictor's confidence files lie next to the design (AlphaFold 3, Boltz, Chai-1, ColabFold; "
                    "else pLDDT from B-factors when they are pLDDT), and clashes, radius of gyration, residue and "
                    "interface counts. A design whose chains cannot be mapped onto the reference is a bad input.",
        example=[("protgpu evaluate designs/ --ref target_complex.pdb --out designs.parquet",
                  "score every design against the reference complex"),
                 ("protgpu evaluate af3_out/*_model_*.cif --out confidence.csv",
                  "confidence and sanity of predictions, no reference")])
    add_out(p, ".csv, .jsonl or .parquet (one row per design)")
    p.add_argument("--ref", "-r", help="reference complex (without it: confidence and sanity columns only)")
    p.add_argument("--confidence", choices=("auto", "none"), default="auto",
                   help="auto (default): read the predictor's confidence files found next to each design, else "
                        "its B-factors when they are pLDDT; none: no confidence columns' values")
    p.add_argument("--min-identity", type=float, default=30.0, metavar="PERCENT",
                   help="a model chain maps to a reference chain only above this sequence identity (default 30)")
    p.add_argument("--tm-mode", choices=("mapped", "usalign", "usalign-auto"), default="mapped",
                   help="tm_score: mapped (default: the TMscore search on the chain-mapped residues, batched on "
                        "the GPU); usalign: US-align's complex mode on protgpu's chain mapping, as OpenStructure "
                        "reports it (CPU, about 0.4 s a design); usalign-auto: MM-align maps the chains itself")
    p.add_argument("--no-stereochecks", dest="stereochecks", action="store_false",
                   help="lddt and ilddt without OpenStructure's stereochecks (by default atoms with bond, angle or "
                        "clash problems leave model and reference first, as OpenStructure's Scorer does)")
    add_batch_options(p)
    p.set_defaults(func=run)


def evaluate_job(args, device: str):
    """The :class:`~protgpu.batch.jobs.evaluate.EvaluateJob` that ``protgpu evaluate`` runs for ``args``."""
    from ..batch.jobs.evaluate import EvaluateJob

    return EvaluateJob(args.ref, confidence=args.confidence, min_identity=args.min_identity, device=device,
                       tm_mode=args.tm_mode, stereochecks=args.stereochecks)


def run(args) -> int:
    check_table_out(args.out)
    if not 0 <= args.min_identity <= 100:
        raise InputError(f"--min-identity {args.min_identity}: a percentage from 0 to 100")
    if getattr(args, "select", None):
        raise InputError("--select does not apply to evaluate: a design is scored whole")
    device = late_device(args)
    paths = expand_inputs(args.inputs)
    mark("listed")
    job = evaluate_job(args, device)
    mark("job")
    summary = run_job(args, job, paths, description="evaluate")
    rows = summary.rows
    if not args.out:
        print("\t".join(job.columns))
        for r in rows:
            print("\t".join(_fmt(r.get(c)) for c in job.columns))
    if not args.quiet:
        print_run_line(summary, f"{len(rows)} design(s)", job_device(args)[1])
    report_failures(translate_failures(summary, "evaluate"), "evaluate")
    return summary.exit_code

