"""``protgpu distances INPUT... [--select ca] [--out FILE.npy|.npz]``: distance matrices per input.

Inputs run through the batch engine (:mod:`protgpu.batch`): parsed in worker processes, inputs with
the same atom count stacked into one :func:`protgpu.distances` call, journaled beside ``--out`` so that
``--resume`` picks up a killed run. ``.npz`` keys are the file stems (made unique) plus ``inputs``.
Without ``--out`` stdout is a table (header row, tab-separated) of each input's shape and distance
range; the closing note goes to stderr.
"""

from __future__ import annotations

import sys

from ..batch.inputs import expand_inputs
from ..errors import InputError
from ._batch_options import add_batch_options, job_device, late_device, report_failures, run_job
from ._cli_text import add_out, add_parser, translate_failures

COLUMNS = ("input", "frames", "atoms", "shape", "min_angstrom", "max_angstrom")


def register(sub, common) -> None:
    p = add_parser(
        sub, "distances", parents=common, help="all-atom (or selected) distance matrices, Angstrom",
        description="Distance matrices (frames, atoms, atoms) of every input, float32 Angstrom, of the atoms "
                    "--select picks (default all). Without --out, a table of each input's shape and its "
                    "smallest and largest distance between different atoms is printed.",
        example=[("protgpu distances datasets/adk_open.pdb --select ca",
                  "table of the shape and distance range (the matrix is not kept)"),
                 ("protgpu distances models/*.pdb -s ca --out d.npz", "one array per file, keyed by file stem"),
                 ("protgpu distances traj.dcd --top top.pdb -s backbone --periodic -o d.npy",
                  "minimum-image distances of every frame of a trajectory")])
    add_out(p, ".npy (one input) or .npz (one array per input, keyed by file stem, plus inputs)")
    p.add_argument("--top", "-t", help="topology file for trajectory inputs (PDB, mmCIF, ...)")
    p.add_argument("--periodic", action="store_true", help="minimum-image distances using the input's box")
    add_batch_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..batch import DistancesJob, parse_shard

    if args.out and not args.out.endswith((".npy", ".npz")):
        raise InputError(f"--out {args.out}: use a .npy or .npz file name")
    paths = expand_inputs(args.inputs)
    if args.out and args.out.endswith(".npy"):
        n = len(paths)
        if args.shard:
            i, k = parse_shard(args.shard)
            n = len(range(i, len(paths), k))
        if n != 1:
            raise InputError(f"--out {args.out}: a .npy file holds one input's result; use .npz for {n} inputs")
    device = late_device(args)  # auto: decided by the job's warm-up, after the parse workers started
    printing = not args.quiet and not args.out
    job = DistancesJob(select=args.select, top=args.top, periodic=args.periodic, summary=printing, device=device)

    if printing:
        print("\t".join(COLUMNS), flush=True)

    def show(r) -> None:
        if printing and r.ok:
            s = r.rows[0]
            print(f"{r.input}\t{s['frames']}\t{s['atoms']}\t({s['frames']}, {s['atoms']}, {s['atoms']})\t"
                  f"{s['min']:.3f}\t{s['max']:.3f}", flush=True)

    summary = run_job(args, job, paths, description="distances", on_result=show)
    where = job_device(args)[1]
    if not args.quiet:  # a note, not a row: stderr, so that stdout is the table alone
        dest = f" to {summary.out}" if summary.out else ""
        resumed = f" ({summary.n_resumed} resumed)" if summary.n_resumed else ""
        print(f"{summary.n_ok} input(s){resumed} on the {where} in {summary.elapsed_s:.2f} s{dest}", file=sys.stderr)
    report_failures(translate_failures(summary, "distances"), "distances")
    return summary.exit_code
