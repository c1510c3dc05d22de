"""Running a job in this process: a pool of parse workers (processes, threads or inline) that parse
inputs while batches compute; forked when that is safe; dying workers survived.

Internal API (the engine, the Dask runner, tests and benchmarks): :func:`iter_local`,
:func:`parse_one`, :class:`Parsed`, :func:`compute_group` (a batch, split on failure),
:func:`default_jobs`, :func:`fork_is_safe`, :func:`pool_start_method`, :class:`Parser`,
:func:`chunk_size` and :func:`warmup_prefetch`. The design is in ``docs/design/batch-engine.md``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor
from dataclasses import dataclass

from .._threads import share_cores
from .inputs import file_sha256
from .job import Job, progress_sink
from .results import Failure, InputResult, as_result, failed_result, failure_of

_WORKER_JOB: Job | None = None


def _install_job(job_bytes: bytes, owner: int, n_workers: int = 1) -> None:
    """Process-pool initializer: the worker's thread pools sized to its share of the cores
    (:func:`protgpu._threads.share_cores`: ``n_workers`` workers run at once); the job unpickled once
    per worker, not once per input; and a watch on the process that owns the pool, since a pool worker
    whose owner was SIGKILLed would otherwise wait for work forever (a forked worker is orphaned; a
    forkserver's worker has the server as its parent, which outlives the owner)."""
    global _WORKER_JOB
    share_cores(n_workers)
    _WORKER_JOB = pickle.loads(job_bytes)

    def watch():
        while True:
            time.sleep(0.5)
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                os._exit(0)
            except OSError:
                pass

    threading.Thread(target=watch, name="protgpu-owner-watch", daemon=True).start()


def parse_one(job: Job, index: int, path: str, times: dict | None = None):
    """(index, sha256, parsed item, None) or (index, sha256 or None, None, Failure); adds the seconds
    spent hashing and loading to ``times``."""
    sha = None
    t0 = time.perf_counter()
    try:
        sha = file_sha256(path)
        t1 = time.perf_counter()
        item = job.load(path)
    except Exception as exc:  # recorded per input; the engine decides whether to stop
        return index, sha, None, failure_of(exc, path)
    if times is not None:
        t2 = time.perf_counter()
        times["hash_s"] = times.get("hash_s", 0.0) + (t1 - t0)
        times["load_s"] = times.get("load_s", 0.0) + (t2 - t1)
    return index, sha, item, None


def _parse_chunk(job: Job, chunk: list) -> tuple[list, dict]:
    """Parse a chunk of (index, path): one task per chunk, so that the pool's per-task cost (pickling,
    queues, a future) is paid once per chunk and not once per small file."""
    times: dict = {}
    return [parse_one(job, index, path, times) for index, path in chunk], times


def _parse_in_worker(index: int, path: str):
    return parse_one(_WORKER_JOB, index, path)


def _parse_chunk_in_worker(chunk: list) -> tuple[list, dict]:
    return _parse_chunk(_WORKER_JOB, chunk)


@dataclass
class Parsed:
    """One parsed input waiting for its batch: position, path, content sha256 and the job's item."""

    index: int
    path: str
    sha256: str | None
    item: object


def _free_gpu_memory() -> None:
    cp = sys.modules.get("cupy")
    if cp is not None:
        with contextlib.suppress(Exception):
            cp.get_default_memory_pool().free_all_blocks()
            cp.get_default_pinned_memory_pool().free_all_blocks()


def compute_group(job: Job, entries: list[Parsed], log: Callable[[str], None]) -> list[InputResult]:
    """Compute one batch; on failure split it in halves until the failing input is alone."""
    try:
        outs = job.compute([e.item for e in entries])
        if len(outs) != len(entries):
            raise RuntimeError(f"{job.name}: compute returned {len(outs)} results for {len(entries)} inputs")
        results = [as_result(o) for o in outs]
    except Exception as exc:
        f = failure_of(exc, entries[0].path if len(entries) == 1 else "")
        if f.kind == "fatal":
            raise
        if len(entries) == 1:
            e = entries[0]
            return [InputResult(e.index, e.path, "failed", e.sha256, error=f.reason, _failure=f)]
        if f.kind == "oom":
            _free_gpu_memory()
            log(f"{job.name}: out of memory with a batch of {len(entries)}; retrying in halves")
        mid = len(entries) // 2
        return compute_group(job, entries[:mid], log) + compute_group(job, entries[mid:], log)
    return [InputResult(e.index, e.path, "ok", e.sha256, rows=r.rows, arrays=r.arrays)
            for e, r in zip(entries, results, strict=True)]


def default_jobs() -> int:
    """Parse workers by default: every CPU this process may run on (at most 32). The compute loop
    shares a CPU with them, but it mostly waits (for the GPU, or for parsed inputs)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(32, n))


# Modules whose presence means this process may have started CUDA (or a library's thread pool that a
# forked child would inherit in a locked state): parse workers are then not forked. numba is not among
# them: it starts threads only for its parallel loops (its threading layer, see _numba_threads_started),
# and the evaluate job imports it with its reference (the compiled contact searches), before the pool.
_NO_FORK_MODULES = ("cupy", "cuda", "torch", "nvmath", "jax", "tensorflow", "pycuda")


def _numba_threads_started() -> bool:
    """Whether numba (when imported) has launched its threading layer (workqueue, OpenMP or TBB: not
    fork-safe once running); True when that cannot be told. Importing numba and running its ``njit``
    functions (protgpu's, none of them parallel) starts no thread."""
    if "numba" not in sys.modules:
        return False
    try:
        from numba.np.ufunc import parallel
    except Exception:  # another numba layout: assume the worst
        return True
    return bool(getattr(parallel, "_is_initialized", True))


def fork_is_safe() -> bool:
    """Whether parse workers may be forked from this process: on Linux, while it runs a single Python
    thread and has not imported a GPU library. A forked worker starts in about a millisecond and
    inherits every module already imported, where a forkserver costs a fresh interpreter (~0.5 s,
    before the first worker exists) and a spawned worker re-imports everything; but a child forked
    after CUDA was initialised, or while another thread held a lock, can hang. The CLI starts its pool
    before the job's warm-up imports CuPy, so it forks."""
    if not sys.platform.startswith("linux") or "fork" not in multiprocessing.get_all_start_methods():
        return False
    if threading.active_count() > 1:
        return False
    return not any(m in sys.modules for m in _NO_FORK_MODULES) and not _numba_threads_started()


def pool_start_method(start_method: str | None) -> str:
    """The parse pool's start method: the caller's, else ``$PROTGPU_BATCH_START_METHOD``, else fork when
    :func:`fork_is_safe`, else forkserver (spawn where there is none)."""
    if start_method:
        return start_method
    env = os.environ.get("PROTGPU_BATCH_START_METHOD")
    if env:
        return env
    if fork_is_safe():
        return "fork"
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _mp_context(start_method: str | None):
    start_method = pool_start_method(start_method)
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        # imported once in the server, inherited by every worker it forks
        ctx.set_forkserver_preload(["numpy", "protgpu.io", "protgpu.batch", "protgpu.scoring._batch"])
    return ctx


class Parser:
    """Parses inputs in a process pool, a thread pool, or inline; survives dying worker processes."""

    def __init__(self, job: Job, kind: str, n: int, start_method: str | None, log, job_bytes: bytes | None = None):
        self.job, self.kind, self.n, self.log = job, kind, n, log
        self.executor = self._solo = None
        self.start_method_arg = start_method
        self.start_method = None  # of the current process pool
        self.closed = False
        self._joining: list = []
        if kind == "process":
            self.job_bytes = pickle.dumps(job) if job_bytes is None else job_bytes
        self._start()

    def _context(self):
        # decided at each pool start: a pool restarted after the job's warm-up (CuPy loaded) is not forked
        ctx = _mp_context(self.start_method_arg)
        self.start_method = ctx.get_start_method()
        return ctx

    def _start(self):
        if self.kind == "process":
            self.executor = ProcessPoolExecutor(self.n, mp_context=self._context(), initializer=_install_job,
                                                initargs=(self.job_bytes, os.getpid(), self.n))
        elif self.kind == "thread":
            self.executor = ThreadPoolExecutor(self.n, thread_name_prefix="protgpu-parse")

    def submit(self, chunk: list):
        """Parse a list of (index, path) in one task; its future gives ``_parse_chunk``'s result."""
        if self.kind != "process":
            return self.executor.submit(_parse_chunk, self.job, chunk)
        if self.start_method != "fork":
            return self.executor.submit(_parse_chunk_in_worker, chunk)
        with warnings.catch_warnings():  # a forking pool forks all its workers at its first task
            # Python 3.12+ warns about fork() whenever the process has other OS threads, and NumPy's
            # BLAS always starts some (idle, and fork-safe through its atfork handlers); fork_is_safe
            # has checked this process's own threads
            warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)
            return self.executor.submit(_parse_chunk_in_worker, chunk)

    def restart(self):
        self.executor.shutdown(wait=False, cancel_futures=True)
        self._start()

    def isolated(self, index: int, path: str):
        """Parse one input alone in a single-worker pool; None when that worker dies too."""
        if self._solo is None:
            self._solo = ProcessPoolExecutor(1, mp_context=_mp_context(self.start_method_arg),
                                             initializer=_install_job, initargs=(self.job_bytes, os.getpid()))
        try:
            return self._solo.submit(_parse_in_worker, index, path).result()
        except BrokenProcessPool:
            self._solo.shutdown(wait=False, cancel_futures=True)
            self._solo = None
            return None

    def close(self, wait: bool = True):
        """Stop the workers. ``wait=False`` (every input parsed, the compute still running) lets idle
        workers exit in the background instead of holding up the run; a later ``close()`` joins them."""
        self.closed = True
        for ex in (self.executor, self._solo):
            if ex is not None:
                # shutdown(wait=False) forgets the thread that joins the workers: keep it to join later
                self._joining.append(getattr(ex, "_executor_manager_thread", None))
                ex.shutdown(wait=wait, cancel_futures=True)
        if wait:
            for t in self._joining:
                if t is not None:
                    t.join()
            self._joining = []


def _add_times(stats: dict, times) -> None:
    for k, v in (times or {}).items():
        stats[k] = stats.get(k, 0.0) + v


def chunk_size(kind: str, n_inputs: int, jobs: int) -> int:
    """Inputs per parse task: up to 16 for processes (IPC per task costs about as much as hashing a
    small file), fewer when there are few inputs so that every worker gets some; 1 for threads."""
    if kind != "process":
        return 1
    return max(1, min(16, n_inputs // (4 * jobs)))


def iter_local(job: Job, todo: list, *, jobs: int, pool: str, start_method, batch_size: int,
                log, stats: dict | None = None, journal_s: float = 5.0,
                on_progress: Callable[[float], None] | None = None,
                stop_at_failure: bool = False) -> Iterator[list[InputResult]]:
    """Yield lists of results, one list per computed batch (plus lists of parse failures).

    ``stop_at_failure`` (the engine's run without keep-going, which stops at the first failure): before
    a list of parse failures, compute the inputs already parsed that come before the first of them, so
    that the journal holds every input before the failed one whatever order the parse results came in.

    A batch holds at most ``batch_size`` inputs, and no more than the compute of earlier batches says
    fit in ``journal_s`` seconds (the first batch: at most 8), so that the engine journals finished
    work at least that often whatever the batch size. ``on_progress(n)`` hears of work within a
    batch: ``n`` inputs' worth of it finished (a fraction of the batch), as the job reports it
    (:meth:`Job.report_progress`).

    ``stats`` (if given) receives seconds: ``hash_s``/``load_s`` (parse work, summed over workers),
    whatever the parsed items report in a ``timings`` dict, ``pool_start_s`` (starting the parse pool
    and handing it its first inputs), ``submit_s`` (handing it the others), ``warmup_s``, ``wait_s``
    (waiting for parse results), ``compute_s`` (the job's compute) and ``pool_shutdown_s``.
    """
    stats = {} if stats is None else stats

    def add_time(key: str, t0: float) -> None:
        stats[key] = stats.get(key, 0.0) + time.perf_counter() - t0

    t_start = time.perf_counter()
    job_bytes = None
    if pool == "process":
        try:
            job_bytes = pickle.dumps(job)
        except Exception:  # a lambda inside the job: threads can still parse
            log(f"{job.name}: the job cannot be pickled for worker processes; parsing in threads")
            pool = "thread"
    parser = Parser(job, pool, jobs, start_method, log, job_bytes) if pool != "inline" else None
    queue = deque(todo)
    in_flight: dict = {}  # future -> its chunk of (index, path)
    n_in_flight = 0
    groups: dict = {}
    n_buffered = 0
    chunk = chunk_size(pool, len(todo), jobs)
    # parsed ahead while a batch computes (the overlap): three chunks per worker keep each one busy
    # through a batch's compute, when no new chunk is submitted
    ahead = max(3 * jobs * chunk, batch_size)
    max_buffer = 2 * batch_size
    # The job's warm-up (in a fresh process: importing CuPy, a CUDA context, kernels; a second or more)
    # holds up the compute loop, but not the workers: they are handed more inputs before it
    has_warm_up = type(job).warm_up is not Job.warm_up
    warm_ahead = warmup_prefetch(todo, ahead) if parser is not None and has_warm_up else ahead

    def add(res):
        nonlocal n_buffered
        index, sha, item, fail = res
        path = paths[index]
        if fail is None:
            _add_times(stats, getattr(item, "timings", None))
            try:
                key = job.size(item)
            except Exception as exc:
                fail = failure_of(exc, path)
        if fail is not None:
            return [failed_result(index, path, sha, fail)]
        groups.setdefault(key, []).append(Parsed(index, path, sha, item))
        n_buffered += 1
        return []

    # seconds of compute per input, from the batches so far (None before the first)
    per_input: list = [None]

    def cap() -> int:
        """Inputs in the next batch: what fits in journal_s at the rate seen so far."""
        if per_input[0] is None:
            return min(batch_size, 8)
        return max(1, min(batch_size, int(journal_s / max(per_input[0], 1e-9))))

    def flush(key) -> list[InputResult]:
        nonlocal n_buffered
        group = groups[key]
        n = cap()
        entries, rest = group[:n], group[n:]
        if rest:
            groups[key] = rest
        else:
            del groups[key]
        n_buffered -= len(entries)
        t0 = time.perf_counter()
        with progress_sink(None if on_progress is None else (lambda f: on_progress(f * len(entries)))):
            out = compute_group(job, entries, log)
        dt = time.perf_counter() - t0
        per_input[0] = dt / len(entries)
        add_time("compute_s", t0)
        return out

    def before_failure(failed: list) -> Iterator[list[InputResult]]:
        """With ``stop_at_failure``: the batches of the parsed inputs ahead of the first failure."""
        if not stop_at_failure:
            return
        first = min(r.index for r in failed)
        while True:
            key = next((k for k, g in groups.items() if any(e.index < first for e in g)), None)
            if key is None:
                return
            groups[key].sort(key=lambda e: e.index)  # (flush takes a group's first entries)
            if not warmed:
                warm_up()
            yield flush(key)

    warmed = False

    def warm_up():
        nonlocal warmed
        warmed = True
        t0 = time.perf_counter()
        job.warm_up()
        add_time("warmup_s", t0)

    if parser is not None:
        add_time("pool_start_s", t_start)

    paths = dict(todo)
    try:
        while queue or in_flight or groups:
            # a full group, a full buffer, or nothing more to parse: compute
            full = next((k for k, g in groups.items() if len(g) >= cap()), None)
            if full is None and groups:
                if not queue and not in_flight:  # everything parsed: drain, lowest input first
                    full = min(groups, key=lambda k: groups[k][0].index)
                elif n_buffered >= max_buffer:  # memory bound reached before any group filled
                    full = max(groups, key=lambda k: len(groups[k]))
            if full is not None:
                yield flush(full)
                continue
            if parser is None:
                if not warmed:
                    warm_up()
                index, path = queue.popleft()
                failed = add(parse_one(job, index, path, stats))
                if failed:
                    yield from before_failure(failed)
                    yield failed
                continue
            t0 = time.perf_counter()
            limit = ahead if warmed else warm_ahead
            broken = False
            while queue and n_in_flight < limit and n_buffered + n_in_flight < max_buffer + limit:
                part = [queue.popleft() for _ in range(min(chunk, len(queue)))]
                try:
                    in_flight[parser.submit(part)] = part  # the first submit forks the workers
                except BrokenProcessPool:  # a worker died since the last results came in
                    queue.extendleft(reversed(part))
                    broken = True
                    break
                n_in_flight += len(part)
            add_time("submit_s" if warmed else "pool_start_s", t0)
            if broken:
                failed = _recover(parser, in_flight, add, log)
                n_in_flight = 0
                if failed:
                    yield from before_failure(failed)
                    yield failed
                continue
            if not warmed:  # while the workers start and parse the first chunks
                warm_up()
            t0 = time.perf_counter()
            done, _ = wait(list(in_flight), return_when=FIRST_COMPLETED)
            add_time("wait_s", t0)
            failed: list = []
            broken = False
            for fut in done:
                try:
                    results, times = fut.result()
                except BrokenProcessPool:
                    broken = True
                    continue
                n_in_flight -= len(in_flight.pop(fut))
                _add_times(stats, times)
                for res in results:
                    failed += add(res)
            if broken:
                failed += _recover(parser, in_flight, add, log)
                n_in_flight = 0
            if not queue and not in_flight and not parser.closed:
                # every input parsed: the workers go while the last batches compute
                t0 = time.perf_counter()
                parser.close(wait=False)
                add_time("pool_shutdown_s", t0)
            if failed:
                yield from before_failure(failed)
                yield failed
    finally:
        if parser is not None:
            t0 = time.perf_counter()
            parser.close()
            add_time("pool_shutdown_s", t0)


def warmup_prefetch(todo: list, ahead: int) -> int:
    """Inputs handed to the parse workers before the job's warm-up: at least ``ahead``, else as many as
    fit in ``$PROTGPU_BATCH_PREFETCH_MB`` (default 1024) MiB of input files, judged from the sizes of the
    first 16 (parsed items are smaller than their files: a PDB's text is ~7x its coordinates)."""
    try:
        budget = float(os.environ.get("PROTGPU_BATCH_PREFETCH_MB") or 1024) * 2**20
    except ValueError:
        budget = 1024 * 2**20
    sizes = []
    for _, p in todo[:16]:
        with contextlib.suppress(OSError):
            sizes.append(os.path.getsize(p))
    mean = max(sum(sizes) / len(sizes), 1.0) if sizes else 1 << 20
    return max(ahead, min(len(todo), int(budget // mean)))


def _recover(parser: Parser, in_flight: dict, add, log) -> list[InputResult]:
    """A parse worker died: every input of every chunk in flight is a suspect; retry each once, alone."""
    suspects, failed = [], []
    for fut, part in list(in_flight.items()):
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            for res in fut.result()[0]:
                failed += add(res)
        else:
            suspects += part
    in_flight.clear()
    parser.restart()
    log(f"a parse worker process died; retrying {len(suspects)} input(s) one at a time")
    for index, path in sorted(suspects):
        res = parser.isolated(index, path)
        if res is None:
            f = Failure("the worker process parsing it died, also when retried alone", "crash")
            failed.append(failed_result(index, path, None, f))
        else:
            failed += add(res)
    return failed

