"""The batch options of the subcommands that run through :mod:`protgpu.batch`, and the glue that runs a
subcommand's job with them.

A subcommand calls :func:`add_batch_options` in its ``register`` and, in its ``run``, builds a
:class:`protgpu.batch.Job` and hands it to :func:`run_job`; the engine does the parsing pool, batching,
journal, resume, shards, progress and Dask.

Where the time of a command went: with ``PROTGPU_STATS_JSON=PATH`` in the environment, ``protgpu``
writes a JSON file at PATH when the command is done (:func:`write_stats_json`): wall-clock stamps of its
steps (process start, ``main`` entered after the imports, the inputs listed, the job built, the engine
run started and done, the command done), the seconds between them, and the engine's
``Summary.stats``. What happens after the last stamp (interpreter exit) only the caller can time.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

from ..errors import InputError

STATS_ENV = "PROTGPU_STATS_JSON"
_marks: dict = {}  # step name -> time.time() of this command's steps, in order
_last: dict = {}  # "summary": the engine's Summary of this command's run


def mark(step: str) -> None:
    """Stamp the wall-clock time of a step of this command (for ``$PROTGPU_STATS_JSON``)."""
    _marks[step] = time.time()


def begin() -> None:
    """A command starts (``protgpu.cli.main`` entered): forget an earlier command's stamps."""
    _marks.clear()
    _last.clear()
    mark("main")


def _process_start() -> float | None:
    """Wall-clock time this process started (Linux, to 1/CLK_TCK s), or None where unknown."""
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()  # after "(comm)", field 3 is at index 0
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start, ticks after boot
        return time.time() - age
    except (OSError, ValueError, IndexError):
        return None


def write_stats_json(path: str, command: str) -> None:
    """Write the stamps of :func:`mark` and the engine's stats of the last :func:`run_job` to ``path``.

    Keys: ``command``, ``argv``, ``stamps`` (step -> ``time.time()``, with ``process_start`` when known),
    ``steps_s`` (seconds from each stamp to the next, named by the later one: ``main`` is the
    interpreter's start-up and the imports, ``listed`` the input listing, ``job`` building the job,
    ``run`` what came between, ``run_done`` the engine's run, ``end`` the rest of the command),
    ``stats`` (``Summary.stats``), ``elapsed_s`` and ``n_inputs`` (the Summary's).
    """
    mark("end")
    start = _process_start()
    stamps = {**({"process_start": start} if start is not None else {}), **_marks}
    names = list(stamps)
    steps = {b: stamps[b] - stamps[a] for a, b in zip(names[:-1], names[1:], strict=True)}
    summary = _last.get("summary")
    record = {"command": command, "argv": sys.argv, "stamps": stamps, "steps_s": steps,
              "stats": dict(summary.stats) if summary is not None else {},
              "elapsed_s": summary.elapsed_s if summary is not None else None,
              "n_inputs": summary.n_inputs if summary is not None else None}
    try:
        # not through a symbolic link: a link planted at PATH would have the file written elsewhere
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o666)
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh, indent=1)
    except OSError as exc:
        why = "a symbolic link; not followed" if os.path.islink(path) else exc.strerror
        print(f"protgpu {command}: cannot write {STATS_ENV}={path} ({why})", file=sys.stderr)


def check_table_out(out: str | None) -> None:
    """One-line errors for a table ``--out``, before any work: a suffix the table writer does not write,
    or ``.parquet`` without pyarrow."""
    from ..batch import TABLE_SUFFIXES

    if not out:
        return
    if not out.lower().endswith(TABLE_SUFFIXES):
        raise InputError(f"--out {out}: use a .csv, .jsonl or .parquet file name")
    if out.lower().endswith(".parquet"):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise InputError(f"--out {out}: writing parquet needs pyarrow (pip install pyarrow); "
                             "or use .csv / .jsonl") from None


def add_batch_options(p) -> None:
    """Add the batch options (``--resume --keep-going --shard --jobs --batch-size --journal-interval
    --progress-interval --scheduler --tls-ca-file --tls-cert --tls-key --workers --gpus``) to ``p``."""
    g = p.add_argument_group(
        "batch options",
        "While a run is in progress its journal lives beside the output: OUT.manifest.jsonl (each finished "
        "input's sha256, status and rows) and OUT.parts/ (their arrays), with the lock .OUT.lock. When every "
        "input succeeded, the output is written and the journal removed: only OUT remains. A killed run, or "
        "one stopped by a bad input, leaves the journal for --resume; so does a --keep-going run with failed "
        "inputs (listed in OUT.errors.tsv), so that --resume retries only those.")
    g.add_argument("--resume", action="store_true",
                   help="skip inputs that the journal (OUT.manifest.jsonl) of an interrupted run records as done "
                        "with the same content sha256")
    g.add_argument("--keep-going", "-k", action="store_true",
                   help="record bad inputs (file and reason) in OUT.errors.tsv and go on; exit 1 if any failed "
                        "(the journal is then kept: --resume retries only the failed inputs)")
    g.add_argument("--shard", metavar="i/N",
                   help="process shard i of N (i from 0, e.g. $SLURM_ARRAY_TASK_ID/N); the output gets "
                        ".shard-i-of-N before its suffix ({shard} in its name is replaced instead)")
    g.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="parse workers: processes for 32 inputs or more, threads for fewer (default: the CPUs "
                        "this process may use, at most 32; with Dask the Dask workers parse)")
    g.add_argument("--batch-size", type=int, metavar="N", help="most inputs per compute batch")
    g.add_argument("--journal-interval", type=float, metavar="SECONDS", default=5.0,
                   help="journal finished inputs at least this often (default 5): batches are cut to what "
                        "fits in this much compute, so a killed run loses at most about this much work")
    g.add_argument("--progress-interval", type=float, metavar="SECONDS",
                   help="seconds between progress lines when stderr is not a terminal (default "
                        "$PROTGPU_PROGRESS_INTERVAL or 5)")
    g.add_argument("--scheduler", metavar="ADDRESS",
                   help="run on an existing Dask distributed scheduler (e.g. tcp://host:8786, or tls://host:8786 "
                        "with the --tls options). The scheduler and its workers are trusted: inputs' results "
                        "travel to and from them by pickle")
    g.add_argument("--tls-ca-file", metavar="PEM", help="CA certificate(s) for a tls:// --scheduler")
    g.add_argument("--tls-cert", metavar="PEM", help="client certificate for a tls:// --scheduler")
    g.add_argument("--tls-key", metavar="PEM",
                   help="client private key for a tls:// --scheduler (default: in --tls-cert)")
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


def late_device(args) -> str:
    """The device a batch job gets when the job's :meth:`~protgpu.batch.Job.warm_up` decides ``auto``.

    ``auto`` stays ``auto``: the engine calls the warm-up once its parse workers have started, whereas
    deciding here would import CuPy and start the CUDA driver (about a second) before the first file is
    parsed, and a process that has loaded CuPy no longer forks its workers (a forkserver costs ~0.5 s
    more). A forced device is checked at once (:func:`job_device`), so ``--device gpu`` without a GPU is
    still a one-line error before any input is read. Name the device in messages with
    ``job_device(args)[1]`` after the run, when ``auto`` has been decided.
    """
    return args.device if args.device == "auto" else job_device(args)[0]


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

    mark("run")
    if not args.journal_interval > 0:
        raise InputError(f"--journal-interval {args.journal_interval}: need a number of seconds above 0")
    if args.progress_interval is not None and not args.progress_interval >= 0:
        raise InputError(f"--progress-interval {args.progress_interval}: need a number of seconds, 0 or more")
    tls = {k: getattr(args, k) for k in ("tls_ca_file", "tls_cert", "tls_key") if getattr(args, k) is not None}
    # what the process holds before the run (modules, the job, its reference) is left out of the garbage
    # collector's passes during it: a full pass over a process with CuPy loaded took ~60 ms on the GPU
    # machine, and the parsed inputs streaming in set off several
    gc.freeze()
    try:
        summary = batch.run(paths, job, out=args.out, resume=args.resume, keep_going=args.keep_going,
                            shard=args.shard, jobs=args.jobs, batch_size=args.batch_size,
                            scheduler=args.scheduler, tls=tls or None,
                            workers=args.workers, gpus=args.gpus, progress=not args.quiet, quiet=args.quiet,
                            description=description, log=None if args.quiet else note, on_result=on_result,
                            journal_interval=args.journal_interval, progress_interval=args.progress_interval)
    finally:
        gc.unfreeze()
    mark("run_done")
    _last["summary"] = summary
    return summary


def print_run_line(summary, what: str, where: str) -> None:
    """The closing line of a table command on stderr: ``what`` (e.g. "12 model(s)"), the files, resumed
    ones, the device, seconds, files per second and the output."""
    dest = f" -> {summary.out}" if summary.out else ""
    resumed = f" ({summary.n_resumed} resumed)" if summary.n_resumed else ""
    rate = summary.n_inputs / summary.elapsed_s if summary.elapsed_s > 0 else 0.0
    print(f"{what} from {summary.n_ok} file(s){resumed} on the {where}: {summary.elapsed_s:.2f} s, "
          f"{rate:.1f} files/s{dest}", file=sys.stderr)


def report_failures(summary, description: str, quiet: bool = False) -> None:
    """One stderr line per failed input when there is no errors file, else one line naming the file."""
    if not summary.n_failed:
        return
    if summary.errors is not None:
        print(f"protgpu {description}: {summary.n_failed} input(s) failed; see {summary.errors}", file=sys.stderr)
        return
    from ..batch.inputs import display_path

    for path, why in summary.failed:
        print(f"protgpu {description}: {display_path(path)}: {display_path(why)}", file=sys.stderr)
