"""The batch options of the subcommands that run through :mod:`protgpu.batch`, and the glue that runs a
subcommand's job with them.

A subcommand calls :func:`add_batch_options` in its ``register`` and, in its ``run``, builds a
:class:`protgpu.batch.Job` and hands it to :func:`run_job`; the engine does the parsing pool, batching,
journal, resume, shards, progress and Dask.
"""

from __future__ import annotations

import sys

from ..errors import InputError


def add_batch_options(p) -> None:
    """Add ``--resume --keep-going --shard --jobs --batch-size --scheduler --workers --gpus`` to ``p``."""
    g = p.add_argument_group("batch options")
    g.add_argument("--resume", action="store_true",
                   help="skip inputs that OUT.manifest.jsonl records as done with the same content sha256")
    g.add_argument("--keep-going", "-k", action="store_true",
                   help="record bad inputs (file and reason) in OUT.errors.tsv and go on; exit 1 if any failed")
    g.add_argument("--shard", metavar="i/N",
                   help="process shard i of N (i from 0, e.g. $SLURM_ARRAY_TASK_ID/N); the output gets "
                        ".shard-i-of-N before its suffix ({shard} in its name is replaced instead)")
    g.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="parse worker processes (default: the usable CPUs, at most 32)")
    g.add_argument("--batch-size", type=int, metavar="N", help="most inputs per compute batch")
    g.add_argument("--scheduler", metavar="ADDRESS",
                   help="run on an existing Dask distributed scheduler (e.g. tcp://host:8786)")
    g.add_argument("--workers", type=int, metavar="N", help="run on a local Dask cluster of N worker processes")
    g.add_argument("--gpus", metavar="all|N",
                   help="run on dask-cuda's LocalCUDACluster, one worker per GPU (needs dask-cuda)")


def job_device(args) -> tuple[str, str]:
    """(device the job gets, device named in messages). On Dask each worker decides ``auto`` itself."""
    from .._array import dispatch

    local = dispatch(device=args.device).device  # a forced GPU without one is an error here, at once
    on_dask = any(getattr(args, k, None) is not None for k in ("scheduler", "workers", "gpus"))
    return (args.device if on_dask else local), (f"Dask workers (device {args.device})" if on_dask
                                                 else local.upper())


def run_job(args, job, paths: list[str], *, description: str, on_result=None):
    """Run ``job`` over ``paths`` with the batch options in ``args``; return the
    :class:`protgpu.batch.Summary`. Notes go to stderr unless ``--quiet``."""
    from .. import batch

    if args.batch_size is not None and args.batch_size < 1:
        raise InputError(f"--batch-size {args.batch_size}: need at least 1")
    if args.jobs is not None and args.jobs < 1:
        raise InputError(f"--jobs {args.jobs}: need at least 1")

    def note(msg: str) -> None:
        print(f"protgpu {description}: {msg}", file=sys.stderr)

    return batch.run(paths, job, out=args.out, resume=args.resume, keep_going=args.keep_going, shard=args.shard,
                     jobs=args.jobs, batch_size=args.batch_size, scheduler=args.scheduler, workers=args.workers,
                     gpus=args.gpus, progress=not args.quiet, quiet=args.quiet, description=description,
                     log=None if args.quiet else note, on_result=on_result)


def report_failures(summary, description: str, quiet: bool = False) -> None:
    """One stderr line per failed input when there is no errors file, else one line naming the file."""
    if not summary.n_failed:
        return
    if summary.errors is not None:
        print(f"protgpu {description}: {summary.n_failed} input(s) failed; see {summary.errors}", file=sys.stderr)
        return
    for path, why in summary.failed:
        print(f"protgpu {description}: {path}: {why}", file=sys.stderr)
