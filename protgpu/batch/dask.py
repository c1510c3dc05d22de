"""Running a job on a Dask distributed cluster: each task parses and computes one batch of inputs
of similar file size; the client journals and writes as a local run does (internal: :func:`iter_dask`)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from ..errors import InputError
from .job import Job
from .local import Parsed, compute_group, parse_one
from .results import Failure, InputResult, failed_result

_logger = logging.getLogger("protgpu.batch")


def _dask_batch(job: Job, items: list) -> list[InputResult]:
    """One Dask task: parse and compute a batch of (index, path) on a worker."""
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
    return out


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


def _plan_batches(todo: list, batch_size: int) -> list[list]:
    """Batches of inputs of similar file size (a proxy for structure size before parsing)."""
    def nbytes(p):
        try:
            return os.path.getsize(p)
        except OSError:
            return 0

    ordered = sorted(todo, key=lambda t: (nbytes(t[1]), t[0]))
    return [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]


def iter_dask(job: Job, todo: list, *, scheduler, workers, gpus, batch_size: int,
               log, tls: dict | None = None) -> Iterator[list[InputResult]]:
    """Yield lists of results, one list per batch, from a Dask cluster (``scheduler``, ``workers`` or
    ``gpus``, one of them; see :func:`protgpu.batch.iter_results`). A batch whose task killed its worker
    is retried input by input; an input that kills a worker alone is a failed result.

    Raises
    ------
    InputError
        Dask (or dask-cuda for ``gpus``) is not installed, or more than one cluster option is given.
    """
    with _dask_client(scheduler, workers, gpus, tls) as client:
        from distributed import as_completed

        job_f = client.scatter(job, broadcast=True, hash=False)
        futs = {}
        for b in _plan_batches(todo, batch_size):
            futs[client.submit(_dask_batch, job_f, b, pure=False)] = b
        ac = as_completed(list(futs))
        try:
            for fut in ac:
                batch = futs.pop(fut)
                try:
                    results = fut.result()
                except Exception as exc:
                    if type(exc).__name__ != "KilledWorker":
                        raise
                    if len(batch) > 1:
                        log(f"a Dask worker died on a batch of {len(batch)}; retrying its inputs one by one")
                        for item in batch:
                            nf = client.submit(_dask_batch, job_f, [item], pure=False)
                            futs[nf] = [item]
                            ac.add(nf)
                        continue
                    index, path = batch[0]
                    f = Failure("the Dask worker computing it died, also when retried alone", "crash")
                    results = [failed_result(index, path, None, f)]
                yield results
        finally:
            for fut in futs:
                fut.cancel()

