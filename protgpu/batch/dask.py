"""Running a job on a Dask distributed cluster: each task parses and computes one batch of inputs
of similar file size, batches no longer than the journal interval of work; the client journals and
writes as a local run does (internal: :func:`iter_dask`)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Iterator

from ..errors import InputError
from .job import Job
from .local import Parsed, compute_group, parse_one
from .results import Failure, InputResult, failed_result

_logger = logging.getLogger("protgpu.batch")


def _dask_batch(job: Job, items: list) -> tuple[list[InputResult], float]:
    """One Dask task: parse and compute a batch of (index, path) on a worker; its results and the
    seconds the task took (the client sizes later batches by them)."""
    t0 = time.perf_counter()
    out, entries = [], []
    for index, path in items:
        i, sha, item, fail = parse_one(job, index, path)
        if fail is not None:
            out.append(failed_result(index, path, sha, fail))
        else:
            entries.append(Parsed(index, path, sha, item))
    if entries:
        out += compute_group(job, entries, _logger.warning)
    for r in out:  # exceptions stay on the worker; the text travels
        if r._failure is not None:
            r._failure.exc = None
    return out, time.perf_counter() - t0


def _security(scheduler: str, tls: dict | None):
    """``distributed.security.Security`` of the ``tls`` files (None without them), checked here so that
    a missing file or a tls:// address without certificates is one line, not Dask's traceback."""
    tls = {k: v for k, v in (tls or {}).items() if v is not None}
    if not tls:
        if scheduler.startswith("tls://"):
            raise InputError(f"--scheduler {scheduler}: a tls:// scheduler needs --tls-ca-file, --tls-cert "
                             "and --tls-key (the certificates Dask's TLS uses)")
        return None
    for option, path in tls.items():
        if not os.path.isfile(path):
            raise InputError(f"--{option.replace('_', '-')} {path}: no such file")
    from distributed.security import Security

    return Security(tls_ca_file=tls.get("tls_ca_file"), tls_client_cert=tls.get("tls_cert"),
                    tls_client_key=tls.get("tls_key"), require_encryption=True)


def _connect(Client, scheduler: str, tls: dict | None):
    """A Client of the scheduler at ``scheduler``; a failure to connect is one InputError line."""
    security = _security(scheduler, tls)
    try:
        # the connect timeout is Dask's own (distributed.comm.timeouts.connect)
        return Client(scheduler, security=security)
    except (OSError, TimeoutError, TypeError, ValueError) as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"--scheduler {scheduler}: cannot connect ({why[:200]})") from None


@contextlib.contextmanager
def _dask_client(scheduler: str | None, workers: int | None, gpus, tls: dict | None = None):
    try:
        import dask
        from distributed import Client, LocalCluster
    except ImportError:
        raise InputError("running on Dask needs dask[distributed]: pip install 'protgpu[dask]'") from None
    if sum(x is not None for x in (scheduler, workers, gpus)) > 1:
        raise InputError("give one of --scheduler, --workers and --gpus")
    if scheduler is not None:
        with _connect(Client, scheduler, tls) as client:
            yield client
        return
    # a task that kills its worker is retried once by the scheduler, then reported (KilledWorker)
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        if gpus is not None:
            try:
                from dask_cuda import LocalCUDACluster
            except ImportError:
                raise InputError("--gpus needs dask-cuda: pip install dask-cuda") from None
            kw = {} if gpus == "all" else {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(int(gpus)))}
            cluster = LocalCUDACluster(dashboard_address=None, silence_logs=logging.ERROR, **kw)
        else:
            cluster = LocalCluster(n_workers=int(workers), threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=logging.ERROR)
        with cluster, Client(cluster) as client:
            yield client


def _by_size(todo: list) -> deque:
    """The inputs ordered by file size (a proxy for structure size before parsing), so that a batch
    holds inputs of similar size."""
    def nbytes(p):
        try:
            return os.path.getsize(p)
        except OSError:
            return 0

    return deque(sorted(todo, key=lambda t: (nbytes(t[1]), t[0])))


class _Sizer:
    """Inputs per Dask batch: at most ``batch_size``, and no more than the batches so far say a worker
    computes in ``journal_s`` seconds (the first ones: at most 8), so that the client journals finished
    work about that often, as a local run does (:func:`protgpu.batch.local.iter_local`)."""

    def __init__(self, batch_size: int, journal_s: float):
        self.batch_size, self.journal_s = int(batch_size), float(journal_s)
        self.per_input = None  # seconds a worker takes per input, from the last finished batch

    def next(self) -> int:
        if self.per_input is None:
            return min(self.batch_size, 8)
        return max(1, min(self.batch_size, int(self.journal_s / max(self.per_input, 1e-9))))

    def saw(self, n: int, seconds: float) -> None:
        if n:
            self.per_input = seconds / n


def iter_dask(job: Job, todo: list, *, scheduler, workers, gpus, batch_size: int,
               log, tls: dict | None = None, journal_s: float = 5.0) -> Iterator[list[InputResult]]:
    """Yield lists of results, one list per batch, from a Dask cluster (``scheduler``, ``workers`` or
    ``gpus``, one of them; see :func:`protgpu.batch.iter_results`). A batch whose task killed its worker
    is retried input by input; an input that kills a worker alone is a failed result.

    Batches are submitted as earlier ones finish (two per worker thread in flight), each sized by
    :class:`_Sizer` so that finished work reaches the journal every ``journal_s`` seconds or so.

    Raises
    ------
    InputError
        Dask (or dask-cuda for ``gpus``) is not installed, or more than one cluster option is given.
    """
    with _dask_client(scheduler, workers, gpus, tls) as client:
        from distributed import as_completed

        job_f = client.scatter(job, broadcast=True, hash=False)
        queue = _by_size(todo)
        sizer = _Sizer(batch_size, journal_s)
        futs: dict = {}

        def slots() -> int:
            # workers may join or leave a running cluster: asked again at each refill
            with contextlib.suppress(Exception):
                return 2 * max(1, sum(client.nthreads().values()))
            return 2

        def submit(batch):
            fut = client.submit(_dask_batch, job_f, batch, pure=False)
            futs[fut] = batch
            return fut

        def refill():
            new = []
            want = slots()
            while queue and len(futs) < want:
                new.append(submit([queue.popleft() for _ in range(min(sizer.next(), len(queue)))]))
            return new

        ac = as_completed(refill())
        try:
            for fut in ac:
                batch = futs.pop(fut)
                try:
                    results, seconds = fut.result()
                    sizer.saw(len(batch), seconds)
                except Exception as exc:
                    if type(exc).__name__ != "KilledWorker":
                        raise
                    if len(batch) > 1:
                        log(f"a Dask worker died on a batch of {len(batch)}; retrying its inputs one by one")
                        for item in batch:
                            ac.add(submit([item]))
                        continue
                    index, path = batch[0]
                    f = Failure("the Dask worker computing it died, also when retried alone", "crash")
                    results = [failed_result(index, path, None, f)]
                for nf in refill():
                    ac.add(nf)
                yield results
        finally:
            for fut in futs:
                fut.cancel()
