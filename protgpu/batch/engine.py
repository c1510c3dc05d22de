"""The driver: :func:`iter_results` and :func:`run` take inputs and a job through expansion, sharding,
resume, the local parse pool or Dask, the journal and the output."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import InputError
from ..io.write import remove_stale_temps
from .dask import iter_dask
from .inputs import common_root, hash_all, input_paths, parse_shard, shard_path
from .job import as_job
from .journal import OutputLock, Store, blas_setting
from .local import default_jobs, iter_local
from .progress import BatchProgress
from .results import InputResult, Summary, raise_for
from .writers import check_out_suffix

__all__ = ["iter_results", "run"]

_logger = logging.getLogger("protgpu.batch")


class _Run:
    """State of one iter_results call, filled in as it goes (for run's Summary)."""

    def __init__(self):
        self.n_inputs = self.n_ok = self.n_failed = self.n_resumed = 0
        self.rows: list = []
        self.failed: list = []
        self.out = self.manifest = self.errors = None
        self.collected: list[InputResult] = []
        self.stats: dict = {}  # seconds by step (Summary.stats)


def iter_results(inputs, job, *, out=None, resume: bool = False, keep_going: bool = False, shard=None,
                 jobs: int | None = None, pool: str = "auto", batch_size: int | None = None,
                 scheduler: str | None = None, tls: dict | None = None, workers: int | None = None,
                 gpus=None, progress=False,
                 quiet: bool = False, description: str | None = None, start_method: str | None = None,
                 log: Callable[[str], None] | None = None, journal_interval: float = 5.0,
                 progress_interval: float | None = None, _state: _Run | None = None,
                 _resumed_arrays: bool = True) -> Iterator[InputResult]:
    """Process many inputs with a job and yield each input's :class:`InputResult` as it finishes.

    Parameters
    ----------
    inputs : str, os.PathLike or sequence of them
        Paths, globs, directories (searched recursively for structure and trajectory files, ``.gz``
        included), ``@list.txt`` files (one path per line), ``-`` (the list on standard input).
    job : Job or callable
        What to compute (:class:`ScoreJob`, :class:`DistancesJob`, any :class:`Job`), or a function of
        a loaded Structure returning a dict (one row), a list of dicts, an array or a :class:`Result`.
    out : str or os.PathLike, optional
        Output file: ``.csv``, ``.jsonl``, ``.parquet`` (rows) or ``.npz``, ``.npy`` (arrays), written
        after the last input, and ``OUT.errors.tsv`` when inputs failed. While the run goes, inputs are
        journaled as they finish in ``OUT.manifest.jsonl`` and ``OUT.parts/`` beside it, and
        ``.OUT.lock`` keeps other runs off ``OUT``; once every input succeeded only ``OUT`` remains
        (after failures under ``keep_going`` the journal stays, for ``resume``). None: results are
        only yielded.
    resume : bool
        Skip inputs that the manifest records as done with the same content sha256 (needs ``out``).
    keep_going : bool
        Record a failing input and go on; otherwise the first failure raises (after journaling what
        had finished).
    shard : str or (int, int), optional
        ``"i/N"`` or ``(i, N)``: only the inputs at positions i, i+N, i+2N, ... of the expanded list;
        ``out`` gets ``.shard-i-of-N`` before its suffix (or replaces ``{shard}`` in its name).
    jobs : int, optional
        Parse workers (default: the CPUs this process may use, at most 32).
    pool : {"auto", "process", "thread", "inline"}
        Parse workers as processes (true parallel parsing; the default for 32 inputs or more; each task
        parses a chunk of up to 16 inputs), threads, or inline in the calling thread (no overlap).
    batch_size : int, optional
        Most inputs per compute call (default: the job's).
    scheduler : str, optional
        Address of a running Dask scheduler to run the batches on. The scheduler and its workers are
        trusted: jobs and results travel to and from them by pickle.
    tls : dict, optional
        For a ``tls://`` scheduler: ``tls_ca_file``, ``tls_cert``, ``tls_key`` (PEM files), made into a
        ``distributed.security.Security``.
    workers : int, optional
        Start a local Dask cluster of this many worker processes.
    gpus : "all" or int, optional
        Start dask-cuda's LocalCUDACluster, one worker per GPU.
    progress : bool
        Show progress on stderr: a bar on a terminal, a log line every ``progress_interval`` seconds
        otherwise. Progress counts inputs as they finish and, within a batch, the work its job reports
        (:meth:`Job.report_progress`).
    quiet : bool
        No progress and no notes.
    description : str, optional
        Label of the progress display (default: the job name).
    start_method : str, optional
        multiprocessing start method of the parse processes. Default: ``$PROTGPU_BATCH_START_METHOD``,
        else ``fork`` on Linux while this process runs one thread and has imported no GPU library
        (workers start at once and import nothing), else ``forkserver`` (scripts using the process
        pool then need the ``if __name__ == "__main__":`` guard).
    log : callable, optional
        Receives one-line notes (worker died, batch split); default: the ``protgpu.batch`` logger.
    journal_interval : float
        Most seconds of compute between two journal writes: a local run's batches are cut to what
        the compute so far says fits in this time (at most ``batch_size``), so that a killed run
        loses at most about this much work.
    progress_interval : float, optional
        Seconds between progress log lines off a terminal; default ``$PROTGPU_PROGRESS_INTERVAL`` or 5.

    Yields
    ------
    InputResult
        Resumed inputs first (``resumed=True``), then each input as its batch finishes. Only after
        the last one is the output written.

    Raises
    ------
    InputError
        Bad options, no inputs, another run writing ``out``, a different manifest on resume (job,
        options, BLAS threads), a journal that is a symbolic link, or (without ``keep_going``) the first
        input that failed, named.
    OutputError
        An output, part or manifest could not be written; what was journaled before stays valid.

    Examples
    --------
    Any function of a Structure that returns a row is a job; ``pool="inline"`` parses in this
    thread (no worker processes, for a few small inputs):

    >>> def count_ca(s):
    ...     return {"ca_atoms": s.select("ca").n_atoms, "frames": s.n_frames}
    >>> inputs = ["datasets/adk_open.pdb", "datasets/adk_closed.pdb"]
    >>> for r in iter_results(inputs, count_ca, pool="inline", quiet=True):
    ...     print(r.input, r.status, r.rows)
    datasets/adk_open.pdb ok [{'ca_atoms': 214, 'frames': 1}]
    datasets/adk_closed.pdb ok [{'ca_atoms': 214, 'frames': 1}]
    """
    job = as_job(job)
    state = _state if _state is not None else _Run()
    stats = state.stats
    job_stats0 = dict(getattr(job, "stats", None) or {})
    if log is None:
        log = (lambda m: None) if quiet else _logger.warning
    if pool not in ("auto", "process", "thread", "inline"):
        raise InputError(f"pool must be auto, process, thread or inline, not {pool!r}")
    batch_size = int(batch_size or job.batch_size)
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    jobs = default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise InputError(f"jobs must be at least 1, got {jobs}")
    if gpus is not None and gpus != "all":
        try:
            gpus = int(gpus)
        except (TypeError, ValueError):
            raise InputError(f"--gpus {gpus!r}: use all or a number") from None
        if gpus < 1:
            raise InputError(f"--gpus {gpus}: use all or a number >= 1")
    if not journal_interval > 0:
        raise InputError(f"journal interval {journal_interval!r}: need a number of seconds above 0")
    if workers is not None and int(workers) < 1:
        raise InputError(f"--workers {workers}: need at least 1")
    use_dask = scheduler is not None or workers is not None or gpus is not None

    out_path = None
    if out is not None:
        out_path = Path(out)
        if shard is not None:
            i, n = shard if isinstance(shard, tuple) else parse_shard(shard)
            out_path = shard_path(out_path, i, n)
        check_out_suffix(out_path)
        folder = out_path.parent if str(out_path.parent) else Path(".")
        if not folder.is_dir():
            raise InputError(f"--out {out_path}: folder {folder} does not exist")
    elif resume:
        raise InputError("--resume needs --out (the manifest lives beside the output)")

    t0 = time.perf_counter()
    paths = input_paths(inputs)
    stats["list_s"] = stats.get("list_s", 0.0) + time.perf_counter() - t0
    t0 = time.perf_counter()
    order = list(enumerate(paths))
    if shard is not None:
        i, n = shard if isinstance(shard, tuple) else parse_shard(shard)
        order = [t for t in order if t[0] % n == i]
    state.n_inputs = len(order)
    # rows name inputs relative to the folder of all of them (every shard's the same)
    job.input_root = common_root(paths)
    # .npz keys come from the whole input list, so that every shard names an input as the full run does
    blas = None
    if out_path is not None and job.uses_blas:
        # Dask workers run with their own setting (one thread, by default): "dask" stands for it
        blas = "dask" if use_dask else blas_setting()
    store = Store(out_path, job, paths, blas) if out_path is not None else None
    lock = None
    if store is not None:
        lock = OutputLock(out_path)
        lock.acquire()  # before touching anything of OUT's: a second run stops here
    try:
        yield from _iter_locked(state, job, order, store, resume=resume, keep_going=keep_going, jobs=jobs,
                                pool=pool, batch_size=batch_size, use_dask=use_dask, scheduler=scheduler, tls=tls,
                                workers=workers, gpus=gpus, progress=progress, quiet=quiet,
                                description=description, start_method=start_method, log=log,
                                journal_interval=journal_interval, progress_interval=progress_interval,
                                resumed_arrays=_resumed_arrays, job_stats0=job_stats0, t0=t0)
    finally:
        if lock is not None:
            lock.release()


def _iter_locked(state: _Run, job, order: list, store: Store | None, *, resume, keep_going, jobs, pool,
                 batch_size, use_dask, scheduler, tls, workers, gpus, progress, quiet, description, start_method,
                 log, journal_interval, progress_interval, resumed_arrays, job_stats0,
                 t0) -> Iterator[InputResult]:
    """The body of :func:`iter_results` once the inputs are listed and the output (if any) locked."""
    stats = state.stats
    if store is not None:
        state.out, state.manifest = store.out, store.manifest
        remove_stale_temps(store.out)

    resumed: list = []  # (index, path, journal entry): made into results one at a time, as yielded
    if resume and store.read():
        hashes = hash_all([p for _, p in order], jobs)
        for index, path in order:
            e = store.done(path, hashes[path])
            if e is not None:
                resumed.append((index, path, e))
        del hashes
    done_idx = {index for index, _, _ in resumed}
    todo = [t for t in order if t[0] not in done_idx]
    if pool == "auto":
        pool = "process" if len(todo) >= 32 and jobs > 1 else ("thread" if len(todo) > 1 else "inline")

    bar = BatchProgress(len(order), description=description or job.name, quiet=quiet or not progress,
                        interval=progress_interval)
    stats["setup_s"] = stats.get("setup_s", 0.0) + time.perf_counter() - t0
    try:
        for index, path, e in resumed:
            state.n_ok += 1
            state.n_resumed += 1
            bar.advance(ok=True)
            yield InputResult(index, path, "ok", e.sha256, rows=e.rows,
                              arrays=store.arrays_of(e) if resumed_arrays else {}, resumed=True)
        if use_dask:
            batches = iter_dask(job, todo, scheduler=scheduler, tls=tls, workers=workers, gpus=gpus,
                                 batch_size=batch_size, log=bar.note_to(log), journal_s=journal_interval)
        else:
            batches = iter_local(job, todo, jobs=jobs, pool=pool, start_method=start_method,
                                  batch_size=batch_size, log=bar.note_to(log), stats=stats,
                                  journal_s=journal_interval, on_progress=bar.partial,
                                  stop_at_failure=not keep_going)
        try:
            for results in batches:
                results.sort(key=lambda r: r.index)
                fatal = next((r for r in results if not r.ok and r._failure is not None
                              and r._failure.kind == "fatal"), None)
                if fatal is not None:
                    raise_for(fatal)
                if store is not None:
                    t0 = time.perf_counter()
                    store.commit(results if keep_going else [r for r in results if r.ok])
                    stats["write_s"] = stats.get("write_s", 0.0) + time.perf_counter() - t0
                for r in results:
                    if r.ok:
                        state.n_ok += 1
                    else:
                        state.n_failed += 1
                        state.failed.append((r.input, r.error))
                    bar.advance(ok=r.ok)
                first_bad = next((r for r in results if not r.ok), None)
                if first_bad is not None and not keep_going:
                    for r in results:  # what finished in this batch was journaled; hand it out too
                        if r.ok:
                            yield r
                    raise_for(first_bad)
                for r in results:
                    yield r
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
    finally:
        bar.close()
        # the job's own timers (ScoreJob.stats), as far as this run added to them
        for k, v in (getattr(job, "stats", None) or {}).items():
            if isinstance(v, float):
                stats[k] = stats.get(k, 0.0) + v - job_stats0.get(k, 0.0)
    t0 = time.perf_counter()
    if store is not None:
        if not store.started:  # nothing at all to journal (no inputs left): still write an (empty) output
            store._start()
        rows, failed, errors = store.finish(order)
        state.rows, state.failed, state.errors = rows, failed, errors
        if not failed:
            # complete: the output alone remains. With failed inputs (keep_going) the journal stays, so
            # that --resume retries only those
            store.remove()
            state.manifest = None
    stats["write_s"] = stats.get("write_s", 0.0) + time.perf_counter() - t0


def run(inputs, job, *, on_result: Callable[[InputResult], None] | None = None, **kwargs) -> Summary:
    """Process many inputs with a job; write the output (if ``out=``) and return a :class:`Summary`.

    Takes the parameters of :func:`iter_results`, plus ``on_result``, called with each
    :class:`InputResult` as it finishes. With ``out=None`` the rows of every input come back in
    ``Summary.rows`` (input order) and nothing is written.

    Examples
    --------
    >>> import protgpu as pg, os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> for i in range(3):
    ...     with open(os.path.join(d, f"m{i}.pdb"), "w") as fh:
    ...         _ = fh.write(f"ATOM      1  CA  GLY A   1      {i:6.3f}   0.000   0.000  1.00  0.00           C\\n")
    >>> s = pg.batch.run(d, lambda st: {"x": float(st.coords[0, 0, 0])}, pool="inline")
    >>> [r["x"] for r in s.rows], s.n_ok, s.exit_code
    ([0.0, 1.0, 2.0], 3, 0)
    """
    t0 = time.perf_counter()
    state = _Run()
    collect = kwargs.get("out") is None
    for r in iter_results(inputs, job, _state=state, _resumed_arrays=False, **kwargs):
        if on_result is not None:
            on_result(r)
        if collect:
            state.collected.append(r)
    if collect:
        state.collected.sort(key=lambda r: r.index)
        state.rows = [row for r in state.collected if r.ok for row in r.rows]
        state.failed = [(r.input, r.error) for r in state.collected if not r.ok]
    return Summary(n_inputs=state.n_inputs, n_ok=state.n_ok, n_failed=state.n_failed, n_resumed=state.n_resumed,
                   rows=state.rows, failed=state.failed, out=state.out, manifest=state.manifest,
                   errors=state.errors, elapsed_s=time.perf_counter() - t0, stats=dict(state.stats))
