"""The parse workers' share of the cores (protgpu._threads.share_cores, set by the pool's initializer)
and the fork rule with numba loaded (protgpu.batch.local.fork_is_safe): issue 18's end-to-end
throughput of ``protgpu evaluate`` (docs/design/batch-engine.md, "Parse workers and threads")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from protgpu import _threads
from protgpu.batch import Job, Result, local

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PROTGPU_DISABLE_GPU": "1", "PYTHONPATH": str(REPO), "PROTGPU_BATCH_START_METHOD": ""}


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def test_cpu_threads_is_capped_by_the_environment(monkeypatch):
    monkeypatch.delenv(_threads.CPU_THREADS_ENV, raising=False)
    assert _threads.cpu_threads() == _cores()
    monkeypatch.setenv(_threads.CPU_THREADS_ENV, "1")
    assert _threads.cpu_threads() == 1
    monkeypatch.setenv(_threads.CPU_THREADS_ENV, str(_cores() + 5))  # a cap above the cores: the cores
    assert _threads.cpu_threads() == _cores()
    for bad in ("0", "-2", "x", ""):  # not a count: ignored
        monkeypatch.setenv(_threads.CPU_THREADS_ENV, bad)
        assert _threads.cpu_threads() == _cores()


@pytest.mark.parametrize("n", [1, 2, 3, 16, 64])
def test_share_cores_divides_the_cores(monkeypatch, n):
    monkeypatch.delenv(_threads.CPU_THREADS_ENV, raising=False)
    share = _threads.share_cores(n)
    assert share == max(1, _cores() // n)
    assert _threads.cpu_threads() == share and os.environ[_threads.CPU_THREADS_ENV] == str(share)
    # a cap already set (the user's, or an outer pool's share) is divided, never raised
    monkeypatch.setenv(_threads.CPU_THREADS_ENV, "1")
    assert _threads.share_cores(n) == 1


class ThreadsJob(Job):
    """Each input's row: the parse worker's cpu_threads() (what its thread pools are sized to)."""

    name = "threads"
    batch_size = 4

    def load(self, path):
        return _threads.cpu_threads(), os.getpid()

    def compute(self, items):
        return [Result(rows=[{"threads": t, "pid": p}]) for t, p in items]


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_parse_workers_get_their_share_of_the_cores(tmp_path, monkeypatch, method):
    if method not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip(f"no {method} here")
    monkeypatch.delenv(_threads.CPU_THREADS_ENV, raising=False)
    paths = []
    for i in range(12):
        p = tmp_path / f"in{i}.txt"
        p.write_text(str(i))
        paths.append(str(p))
    job = ThreadsJob()
    rows = [r for out in local.iter_local(job, list(enumerate(paths)), jobs=2, pool="process", start_method=method,
                                          batch_size=4, log=lambda m: None)
            for res in out for r in res.rows]
    assert len(rows) == 12
    assert {r["threads"] for r in rows} == {max(1, _cores() // 2)}
    assert os.getpid() not in {r["pid"] for r in rows}
    assert _threads.CPU_THREADS_ENV not in os.environ  # the rule is the workers', not this process's


def _in_fresh_process(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, check=True,
                          cwd=REPO).stdout.strip().splitlines()[-1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is the default on Linux only")
def test_numba_loaded_still_forks_until_its_threads_start():
    pytest.importorskip("numba")
    code = ("import numba, numpy as np, protgpu.batch.local as b\n"
            "f = numba.njit(lambda x: x.sum())\n"
            "f(np.ones(3))\n"  # a compiled function ran (no parallel loop): no thread
            "before = b.pool_start_method(None)\n"
            "from numba.np.ufunc import parallel\n"
            "parallel._launch_threads()\n"  # what a parallel=True loop does first
            "print(before, b.fork_is_safe())")
    assert _in_fresh_process(code) == "fork False"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is the default on Linux only")
def test_evaluate_job_with_a_reference_keeps_the_pool_forked(datasets):
    # its reference loads the compiled contact searches (numba, when installed): the CLI's pool must still
    # fork, as before numba (a forkserver pool took 1-2 s more to start, each worker importing afresh)
    ref = datasets / "openstructure" / "1eud_ref.pdb"
    code = ("import sys, protgpu.batch.local as b\n"
            "from protgpu.batch.jobs.evaluate import EvaluateJob\n"
            f"EvaluateJob({str(ref)!r}, confidence='none', device='cpu')\n"
            "print(b.pool_start_method(None))")
    assert _in_fresh_process(code) == "fork"
