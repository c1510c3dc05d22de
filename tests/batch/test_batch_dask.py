"""The batch engine on Dask: a local cluster of 2 worker processes (CPU) gives the bytes a
single-process run gives; an existing scheduler is used by address; bad inputs are recorded."""

from __future__ import annotations

import gzip
import logging

import numpy as np
import pytest

pytest.importorskip("distributed")

from protgpu import batch  # noqa: E402
from protgpu.cli import main  # noqa: E402
from protgpu.errors import InputError  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory, datasets):
    d = tmp_path_factory.mktemp("dask-models")
    with open(datasets / "adk_open.pdb") as fh:
        lines = [ln for ln in fh if ln.startswith("ATOM") and int(ln[22:26]) <= 30]
    rng = np.random.default_rng(11)
    (d / "models").mkdir()
    for i in range(10):
        text = "".join(ln[:30] + "".join(f"{float(ln[30 + 8 * k:38 + 8 * k]) + rng.normal(0, 0.5):8.3f}"
                                         for k in range(3)) + ln[54:] for ln in lines[: 300 + 20 * i]) + "END\n"
        if i == 4:
            with gzip.open(d / "models" / f"m{i}.pdb.gz", "wt") as fh:
                fh.write(text)
        else:
            (d / "models" / f"m{i}.pdb").write_text(text)
    (d / "models" / "bad.pdb").write_text("garbage\n")
    (d / "ref.pdb").write_text("".join(lines) + "END\n")
    return d


def _score(*argv):
    return main(["score", *map(str, argv)])


def test_local_cluster_of_two_workers_matches_single_process(tmp_path, models):
    common = [models / "models", "--ref", models / "ref.pdb", "--device", "cpu", "-q", "-k", "--batch-size", "3"]
    assert _score(*common, "-o", tmp_path / "one.csv") == 1  # bad.pdb failed: exit 1
    assert _score(*common, "-o", tmp_path / "dask.csv", "--workers", "2") == 1
    assert (tmp_path / "dask.csv").read_bytes() == (tmp_path / "one.csv").read_bytes()
    errors = (tmp_path / "dask.csv.errors.tsv").read_text().splitlines()
    assert len(errors) == 2 and errors[1].startswith(str(models / "models" / "bad.pdb"))
    # resume on Dask skips everything done and writes the same bytes again
    s = batch.run(models / "models", batch.ScoreJob(models / "ref.pdb", device="cpu"), out=tmp_path / "dask.csv",
                  resume=True, keep_going=True, workers=2, batch_size=3)
    assert s.n_resumed == 10 and s.n_failed == 1
    assert (tmp_path / "dask.csv").read_bytes() == (tmp_path / "one.csv").read_bytes()


def test_existing_scheduler_by_address(tmp_path, models):
    from distributed import LocalCluster

    job = batch.DistancesJob(select="ca", device="cpu")
    paths = sorted(str(p) for p in (models / "models").glob("m*.pdb*"))
    local = batch.run(paths, job, out=tmp_path / "local.npz", pool="inline")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster:
        s = batch.run(paths, job, out=tmp_path / "remote.npz", scheduler=cluster.scheduler_address, batch_size=4)
    assert s.n_ok == local.n_ok == 10
    assert (tmp_path / "remote.npz").read_bytes() == (tmp_path / "local.npz").read_bytes()


def test_cluster_option_errors(models):
    job = batch.DistancesJob(select="ca", device="cpu")
    with pytest.raises(InputError, match="one of --scheduler, --workers and --gpus"):
        batch.run(models / "models" / "m0.pdb", job, workers=2, gpus="all")
    with pytest.raises(InputError, match="--gpus"):
        batch.run(models / "models" / "m0.pdb", job, gpus="some")
    try:
        import dask_cuda  # noqa: F401
    except ImportError:
        with pytest.raises(InputError, match="dask-cuda"):
            batch.run(models / "models" / "m0.pdb", job, gpus=1)


class _SlowJob(batch.Job):
    """Each input: its file's text as one row, after ``delay`` seconds of 'compute'."""

    name = "slow"

    def __init__(self, delay):
        self.delay, self.batch_size = delay, 256

    def load(self, path):
        return open(path).read()

    def compute_one(self, item):
        import time

        time.sleep(self.delay)
        return {"text": item}


def test_dask_batches_are_cut_by_the_journal_interval(tmp_path):
    """The default batch size (256) is one Dask task for a small run, journaled only at its end; batches
    now hold about a journal interval of work (the first: at most 8 inputs)."""
    from distributed import LocalCluster

    from protgpu.batch.dask import iter_dask

    paths = []
    for i in range(30):
        paths.append(tmp_path / f"f{i:02d}.txt")
        paths[-1].write_text(str(i))
    todo = list(enumerate(map(str, paths)))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster:
        sizes, seen = [], []
        for results in iter_dask(_SlowJob(0.02), todo, scheduler=cluster.scheduler_address, workers=None,
                                 gpus=None, batch_size=256, log=print, journal_s=0.1):
            sizes.append(len(results))
            seen += [(r.index, r.rows[0]["text"]) for r in results]
        assert sorted(seen) == [(i, str(i)) for i in range(30)]
        # the first two (one worker thread, two in flight) before any timing: 8; then 0.1 s / 0.02 s per input = 5
        # (6: timing slack)
        assert max(sizes[:2]) <= 8 and max(sizes[2:]) <= 6, sizes
        # through the engine: a journaled run gives what a local run gives
        out = tmp_path / "o.csv"
        s = batch.run(paths, _SlowJob(0.0), out=out, scheduler=cluster.scheduler_address, journal_interval=0.1)
        assert s.n_ok == 30
    batch.run(paths, _SlowJob(0.0), out=tmp_path / "l.csv", pool="inline")
    assert out.read_bytes() == (tmp_path / "l.csv").read_bytes()
