"""The batch engine (protgpu.batch) and the subcommands routed through it (score, distances).

Results must not depend on how inputs were batched, parsed (inline, threads, processes) or sharded; a
run killed with SIGKILL at random moments and then resumed writes the bytes an uninterrupted run
writes; bad inputs, dying workers, out-of-memory batches and failing writes lose nothing completed.
"""

from __future__ import annotations

import csv
import errno
import gzip
import io
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protgpu import batch
from protgpu.batch import InputResult, Job, OutputError, Result, ScoreJob
from protgpu.batch.inputs import expand_inputs
from protgpu.batch.local import chunk_size
from protgpu.batch.progress import BatchProgress
from protgpu.cli import main
from protgpu.errors import InputError, MemoryBudgetError

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PROTGPU_DISABLE_GPU": "1", "PYTHONPATH": str(REPO)}


# --------------------------------------------------------------------------------------------------
# Inputs: small real structures (the first residues of adk_open.pdb, perturbed), and a cheap job


def _pdb_lines(datasets, n_res):
    with open(datasets / "adk_open.pdb") as fh:
        return [ln for ln in fh if ln.startswith("ATOM") and int(ln[22:26]) <= n_res]


def _perturbed(lines, rng, sigma=0.6):
    out = []
    for ln in lines:
        xyz = [float(ln[30 + 8 * k:38 + 8 * k]) + rng.normal(0, sigma) for k in range(3)]
        out.append(ln[:30] + "".join(f"{v:8.3f}" for v in xyz) + ln[54:])
    return "".join(out) + "END\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory, datasets):
    """A folder of 18 perturbed models of two lengths (25 and 40 residues; a subfolder, two gzipped),
    and the reference (first 40 residues)."""
    d = tmp_path_factory.mktemp("models")
    rng = np.random.default_rng(7)
    long, short = _pdb_lines(datasets, 40), _pdb_lines(datasets, 25)
    (d / "models" / "sub").mkdir(parents=True)
    for i in range(18):
        text = _perturbed(long if i % 3 else short, rng)
        where = d / "models" / ("sub" if i % 4 == 0 else "") / f"m{i:02d}.pdb"
        if i in (5, 11):
            with gzip.open(str(where) + ".gz", "wt") as fh:
                fh.write(text)
        else:
            where.write_text(text)
    (d / "ref.pdb").write_text("".join(long) + "END\n")
    return d


def _cli(*argv):
    return main([str(a) for a in argv])


def _run_cli(*argv, **kw):
    return subprocess.run([sys.executable, "-m", "protgpu.cli", *map(str, argv)], capture_output=True, text=True,
                          env=ENV, **kw)


class FakeOOM(Exception):
    """Stands in for cupy.cuda.memory.OutOfMemoryError (the engine knows OOM by name and text)."""

    def __init__(self):
        super().__init__("CUDA out of memory allocating 1 GiB")


FakeOOM.__name__ = "OutOfMemoryError"


class SumJob(Job):
    """Reads whitespace-separated numbers; one row (name, count, sum) and optionally the doubled array.

    Files starting with BAD fail to parse, CRASH kills the parse worker, HUGE runs out of memory even
    alone; a batch larger than ``oom_above`` runs out of memory."""

    name = "sum"

    def __init__(self, arrays=False, batch_size=4, oom_above=None, tag=""):
        self.arrays, self.batch_size, self.oom_above, self.tag = arrays, batch_size, oom_above, tag

    def options(self):
        return {"arrays": self.arrays, "tag": self.tag}

    def load(self, path):
        text = Path(path).read_text()
        if text.startswith("CRASH"):
            os._exit(7)
        if text.startswith("BAD"):
            raise InputError(f"{path}: not a list of numbers")
        return os.path.basename(path), np.array(text.split()[1:] if text.startswith("HUGE") else text.split(),
                                                dtype=np.float64), text.startswith("HUGE")

    def size(self, item):
        return len(item[1]) % 3

    def compute(self, items):
        if (self.oom_above and len(items) > self.oom_above) or any(it[2] for it in items):
            raise FakeOOM()
        return [Result(rows=[{"name": n, "n": len(x), "sum": float(x.sum()), "mean": float(x.mean())}],
                       arrays={"": 2 * x} if self.arrays else {}) for n, x, _ in items]


@pytest.fixture()
def numbers(tmp_path):
    """20 small files of numbers in tmp_path/in."""
    d = tmp_path / "in"
    d.mkdir()
    rng = np.random.default_rng(3)
    for i in range(20):
        (d / f"f{i:02d}.pdb").write_text(" ".join(f"{v:.6f}" for v in rng.normal(size=1 + i % 7)))
    return d


def _ordered_rows(results):
    return [row for r in sorted(results, key=lambda r: r.index) if r.ok for row in r.rows]


# --------------------------------------------------------------------------------------------------
# Inputs


def test_expand_inputs_dirs_globs_lists_stdin_gz(models, monkeypatch):
    d = models / "models"
    found = expand_inputs([str(d)])
    assert len(found) == 18 and sum(p.endswith(".pdb.gz") for p in found) == 2
    assert found == sorted(found)
    lst = models / "list.txt"
    lst.write_text(f"# two\n{found[3]}\n\n{found[0]}\n")
    assert expand_inputs([f"@{lst}"]) == [found[3], found[0]]
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{found[1]}\n{found[2]}\n"))
    assert expand_inputs(["-", found[1]]) == [found[1], found[2]]  # no duplicates
    assert expand_inputs([str(d / "sub" / "*.pdb")]) == sorted(str(p) for p in (d / "sub").glob("*.pdb"))


def test_gzipped_pdb_and_mmcif_score_like_plain(tmp_path, models):
    gemmi = pytest.importorskip("gemmi")
    src = models / "models" / "m01.pdb"
    doc = gemmi.read_structure(str(src)).make_mmcif_document()
    doc.write_file(str(tmp_path / "m01.cif"))
    with open(tmp_path / "m01.cif", "rb") as fh, gzip.open(tmp_path / "m01c.cif.gz", "wb") as gz:
        gz.write(fh.read())
    with open(src, "rb") as fh, gzip.open(tmp_path / "m01p.pdb.gz", "wb") as gz:
        gz.write(fh.read())
    job = ScoreJob(models / "ref.pdb", metrics=("tm", "lddt"), device="cpu")
    s = batch.run([src, tmp_path], job, pool="inline")
    assert s.n_ok == 4 and s.n_failed == 0
    base = s.rows[0]
    for r in s.rows[1:]:
        assert r["tm"] == pytest.approx(base["tm"], abs=1e-12) and r["lddt"] == pytest.approx(base["lddt"], abs=1e-12)


# --------------------------------------------------------------------------------------------------
# Shards and batching do not change results


def test_parse_shard_and_shard_path():
    assert batch.parse_shard("0/1") == (0, 1) and batch.parse_shard("3/4") == (3, 4)
    for bad in ("4/4", "-1/3", "1", "a/b", "0/0"):
        with pytest.raises(InputError, match="shard"):
            batch.parse_shard(bad)
    assert batch.shard_path("out/scores.csv", 2, 8) == Path("out/scores.shard-2-of-8.csv")
    assert batch.shard_path("s.{shard}.npz", 0, 2) == Path("s.0-of-2.npz")


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 5), bs=st.integers(1, 6), jobs=st.integers(1, 3), pool=st.sampled_from(["inline", "thread"]))
def test_shards_partition_and_batching_is_invisible(tmp_path_factory, n, bs, jobs, pool):
    d = tmp_path_factory.getbasetemp() / "shard-inputs"
    if not d.exists():
        d.mkdir()
        rng = np.random.default_rng(1)
        for i in range(13):
            (d / f"g{i:02d}.pdb").write_text(" ".join(map(str, rng.integers(0, 100, size=1 + i % 5))))
    full = batch.run(d, SumJob(batch_size=64), pool="inline")
    shard_results = []
    for i in range(n):
        shard_results += list(batch.iter_results(d, SumJob(), shard=(i, n), batch_size=bs, jobs=jobs, pool=pool))
    idx = sorted(r.index for r in shard_results)
    assert idx == list(range(13))  # every input in exactly one shard
    assert _ordered_rows(shard_results) == full.rows


def test_shard_outputs_union_equals_full_run(tmp_path, models):
    ref, d = models / "ref.pdb", models / "models"
    assert _cli("score", d, "--ref", ref, "-m", "tm,rmsd", "--device", "cpu", "-o", tmp_path / "full.csv", "-q") == 0
    for i in range(3):
        assert _cli("score", d, "--ref", ref, "-m", "tm,rmsd", "--device", "cpu", "-o", tmp_path / "s.csv", "-q",
                    "--shard", f"{i}/3", "--batch-size", "2") == 0
    full = (tmp_path / "full.csv").read_text().splitlines()
    parts = [(tmp_path / f"s.shard-{i}-of-3.csv").read_text().splitlines() for i in range(3)]
    assert all(p[0] == full[0] for p in parts)
    assert sorted(ln for p in parts for ln in p[1:]) == sorted(full[1:])
    assert all(len(p) > 1 for p in parts)


def test_score_job_matches_direct_calls_and_batch_size(tmp_path, models):
    from protgpu import lddt, load, tm_score

    d, ref = models / "models", models / "ref.pdb"
    paths = expand_inputs([str(d)])
    out1, out2 = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert _cli("score", d, "--ref", ref, "--device", "cpu", "-o", out1, "-q", "--batch-size", "1") == 0
    assert _cli("score", d, "--ref", ref, "--device", "cpu", "-o", out2, "-q", "--batch-size", "64", "-j", "2") == 0
    assert out1.read_bytes() == out2.read_bytes()
    rows = [json.loads(x) for x in out1.read_text().splitlines()]
    # named relative to the inputs' folder: a model in sub/ keeps its folder in its name
    assert [r["model"] for r in rows] == [os.path.relpath(p, d).replace(os.sep, "/") for p in paths]
    assert "sub/m00.pdb" in [r["model"] for r in rows]
    structures = [load(p) for p in paths]
    tm = tm_score(structures, load(ref), device="cpu")
    ld = lddt(structures, load(ref), device="cpu")
    np.testing.assert_array_equal([r["tm"] for r in rows], tm.tm)
    np.testing.assert_array_equal([r["gdt_ts"] for r in rows], tm.gdt_ts)
    np.testing.assert_array_equal([r["lddt"] for r in rows], ld)


def test_parquet_output(tmp_path, models):
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "s.parquet"
    assert _cli("score", models / "models", "--ref", models / "ref.pdb", "-m", "tm", "--device", "cpu", "-o", out,
                "-q") == 0
    t = pq.read_table(out)
    assert t.column_names == ["model", "tm", "n_aligned"] and t.num_rows == 18


# --------------------------------------------------------------------------------------------------
# Manifest, resume, keep-going


def test_manifest_records_hash_and_status_and_resume_skips(tmp_path, numbers):
    (numbers / "f05.pdb").write_text("BAD")
    out = tmp_path / "o.csv"
    s = batch.run(numbers, SumJob(), out=out, keep_going=True, pool="inline")
    assert (s.n_ok, s.n_failed, s.exit_code) == (19, 1, 1)
    lines = [json.loads(x) for x in (tmp_path / "o.csv.manifest.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "header" and lines[0]["job"] == "sum"
    entries = {Path(e["input"]).name: e for e in lines[1:]}
    assert entries["f05.pdb"]["status"] == "failed" and "not a list of numbers" in entries["f05.pdb"]["error"]
    assert entries["f00.pdb"]["sha256"] == batch.file_sha256(numbers / "f00.pdb")
    errors = (tmp_path / "o.csv.errors.tsv").read_text().splitlines()
    assert errors[0] == "input\tsha256\terror" and errors[1].startswith(str(numbers / "f05.pdb") + "\t")
    first = out.read_bytes()

    # resume: only the failed input and the changed file are computed again
    (numbers / "f05.pdb").write_text("1 2 3")
    (numbers / "f07.pdb").write_text("10 20")
    seen = list(batch.iter_results(numbers, SumJob(), out=out, resume=True, pool="inline"))
    fresh = sorted(Path(r.input).name for r in seen if not r.resumed)
    assert fresh == ["f05.pdb", "f07.pdb"]
    assert not (tmp_path / "o.csv.errors.tsv").exists()  # nothing failed this time
    rows = {r["name"]: r for r in batch.run(numbers, SumJob(), pool="inline").rows}
    assert out.read_text().count("\n") == 21 and rows["f07.pdb"]["sum"] == 30.0
    assert out.read_bytes() != first
    # complete: the journal is gone, only the output remains
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("o.")) == ["o.csv"]

    # different job options: refused, with a clear message (a journal left by a failed input)
    (numbers / "f05.pdb").write_text("BAD")
    batch.run(numbers, SumJob(), out=out, keep_going=True, pool="inline")
    with pytest.raises(InputError, match="different options tag"):
        batch.run(numbers, SumJob(tag="x"), out=out, resume=True, pool="inline")
    with pytest.raises(InputError, match="needs --out"):
        batch.run(numbers, SumJob(), resume=True)


def test_without_keep_going_first_bad_input_stops_and_written_stays_valid(tmp_path, numbers):
    (numbers / "f13.pdb").write_text("BAD")
    out = tmp_path / "o.csv"
    out.write_text("previous\n")
    with pytest.raises(InputError, match=r"f13\.pdb: not a list of numbers"):
        batch.run(numbers, SumJob(batch_size=2), out=out, pool="inline")
    assert out.read_text() == "previous\n"  # the old output is untouched
    done = [json.loads(x) for x in (tmp_path / "o.csv.manifest.jsonl").read_text().splitlines()[1:]]
    assert done and all(e["status"] == "ok" for e in done)
    (numbers / "f13.pdb").write_text("4 5")
    s = batch.run(numbers, SumJob(batch_size=2), out=out, resume=True, pool="inline")
    assert s.n_resumed == len(done) and s.n_ok == 20
    assert out.read_bytes() == _fresh_bytes(tmp_path, numbers, SumJob(batch_size=2), "o.csv")


class SlowWarmUpSumJob(SumJob):
    """SumJob whose warm-up outlasts the parsing of every input (as a GPU job's can)."""

    def warm_up(self):
        time.sleep(0.5)


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_stopping_at_a_failure_journals_every_input_before_it(tmp_path, numbers, pool):
    # every parse result (f13's failure among them) arrives at once after the warm-up: the inputs before
    # f13 are computed and journaled before the run stops, whatever order the results came in
    (numbers / "f13.pdb").write_text("BAD")
    out = tmp_path / "o.csv"
    with pytest.raises(InputError, match=r"f13\.pdb"):
        batch.run(numbers, SlowWarmUpSumJob(batch_size=1), out=out, pool=pool, jobs=2, quiet=True)
    done = [json.loads(x) for x in (tmp_path / "o.csv.manifest.jsonl").read_text().splitlines()[1:]]
    names = {Path(e["input"]).name for e in done if e["status"] == "ok"}
    assert {f"f{i:02d}.pdb" for i in range(13)} <= names and "f13.pdb" not in names
    (numbers / "f13.pdb").write_text("4 5")
    s = batch.run(numbers, SumJob(batch_size=1), out=out, resume=True, pool="inline")
    assert s.n_resumed == len(names) and s.n_ok == 20
    assert out.read_bytes() == _fresh_bytes(tmp_path, numbers, SumJob(batch_size=1), "o.csv")


def _fresh_bytes(tmp_path, inputs, job, name):
    d = tmp_path / f"fresh-{name}"
    d.mkdir(exist_ok=True)
    batch.run(inputs, job, out=d / name, pool="inline")
    return (d / name).read_bytes()


def test_cli_keep_going_exit_codes_and_errors_file(tmp_path, models):
    d = tmp_path / "in"
    d.mkdir()
    for p in sorted((models / "models").glob("m0[0-3].pdb")):
        (d / p.name).write_bytes(p.read_bytes())
    (d / "empty.pdb").write_text("")
    (d / "junk.pdb").write_text("not a structure\n" * 3)
    out = tmp_path / "s.csv"
    r = _run_cli("score", d, "--ref", models / "ref.pdb", "-m", "tm", "-o", out, "-k", "-q")
    assert r.returncode == 1, r.stderr
    assert "2 input(s) failed; see" in r.stderr and "Traceback" not in r.stderr
    errors = (tmp_path / "s.csv.errors.tsv").read_text().splitlines()
    assert [ln.split("\t")[0] for ln in errors[1:]] == [str(d / "empty.pdb"), str(d / "junk.pdb")]
    assert "file is empty" in errors[1]
    assert len(out.read_text().splitlines()) == 4  # header + the 3 models m01..m03 (m00 lives in sub/)
    r = _run_cli("score", d, "--ref", models / "ref.pdb", "-m", "tm", "-o", tmp_path / "t.csv", "-q")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "empty.pdb" in r.stderr or "junk.pdb" in r.stderr
    assert not (tmp_path / "t.csv").exists()


def test_torn_manifest_line_and_orphan_parts_are_dropped_on_resume(tmp_path, numbers):
    out = tmp_path / "o.npz"
    batch.run(numbers, SumJob(arrays=True), out=out, pool="inline")
    expected = out.read_bytes()
    man = tmp_path / "o.npz.manifest.jsonl"
    assert not man.exists()  # a complete run leaves only its output
    # a run stopped after its last input was journaled, before the output was written
    it = batch.iter_results(numbers, SumJob(arrays=True), out=out, pool="inline")
    assert len(list(itertools.islice(it, 20))) == 20
    it.close()
    lines = man.read_text().splitlines(keepends=True)
    # as if killed: the last batch half journaled (a torn line), a part written but never journaled
    man.write_text("".join(lines[:-3]) + lines[-3][: len(lines[-3]) // 2])
    orphan = tmp_path / "o.npz.parts" / "part-deadbeef-000001.npz"
    orphan.write_bytes(b"junk")
    out.unlink()
    s = batch.run(numbers, SumJob(arrays=True), out=out, resume=True, pool="inline")
    assert s.n_resumed == 17 and not orphan.exists()
    assert out.read_bytes() == expected
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "in") == ["o.npz"]
    with np.load(out) as z:
        assert z.files[:3] == ["f00", "f01", "f02"] and list(z["inputs"]) == sorted(str(p) for p in numbers.iterdir())
        np.testing.assert_array_equal(z["f03"], 2 * np.loadtxt(numbers / "f03.pdb", ndmin=1))


def _kill_and_resume(base, inputs, tmp_path, suffix, kills, seed):
    """Run ``protgpu BASE INPUTS -o full`` (the reference; its duration T) and ``BASE INPUT0`` (the start-up
    time S), then ``BASE INPUTS -o k --resume`` killed with SIGKILL ``kills`` times, each at a random moment
    while work remains (between S and S plus the time the remaining inputs take), then once to the end."""
    rng = random.Random(seed)
    full, out = tmp_path / f"full{suffix}", tmp_path / f"k{suffix}"
    t0 = time.perf_counter()
    r = _run_cli(*base, inputs[0], "-o", tmp_path / f"one{suffix}")
    startup = time.perf_counter() - t0
    t0 = time.perf_counter()
    r = _run_cli(*base, *inputs, "-o", full)
    work = max(time.perf_counter() - t0 - startup, 0.2)
    assert r.returncode == 0, r.stderr
    cmd = [sys.executable, "-m", "protgpu.cli", *map(str, base), *map(str, inputs), "-o", str(out), "--resume"]
    manifest = Path(f"{out}.manifest.jsonl")
    journaled = [0]
    for _ in range(kills):
        left = 1 - journaled[-1] / len(inputs)
        p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(startup * rng.uniform(0.5, 1.0) + work * left * rng.uniform(0, 1.1))
        p.send_signal(signal.SIGKILL)
        p.wait()
        # whatever moment it died at, every complete journal line parses (a torn last one may not)
        lines = manifest.read_bytes().split(b"\n") if manifest.exists() else [b"", b""]
        for ln in lines[1:-1]:
            assert json.loads(ln)["kind"] == "input"
        journaled.append(len(lines) - 2)
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == full.read_bytes(), f"seed {seed}, inputs journaled at each kill: {journaled}"
    assert not list(tmp_path.glob(f".k{suffix}.*"))  # no temporary file left behind
    return full, journaled


def test_sigkill_at_random_moments_then_resume_gives_identical_output(tmp_path, models):
    # 36 inputs: parsed in worker processes (-j 2), the pool a kill leaves orphaned must go away too
    inputs = []
    for k, p in enumerate(expand_inputs([str(models / "models")]) * 2):
        inputs.append(tmp_path / f"in{k:02d}_{os.path.basename(p)}")
        inputs[-1].write_bytes(Path(p).read_bytes())
    base = ["score", "--ref", models / "ref.pdb", "--device", "cpu", "-q", "--batch-size", "2", "-j", "2"]
    _, journaled = _kill_and_resume(base, inputs, tmp_path, ".csv", kills=4,
                                    seed=int.from_bytes(os.urandom(4), "little"))
    print("inputs journaled at each kill:", journaled)


def test_sigkill_distances_npz_then_resume_gives_identical_output(tmp_path, models):
    base = ["distances", "-s", "ca", "--device", "cpu", "-q", "--batch-size", "2", "-j", "1"]
    inputs = expand_inputs([str(models / "models")])
    full, _ = _kill_and_resume(base, inputs, tmp_path, ".npz", kills=2, seed=int.from_bytes(os.urandom(4), "little"))
    with np.load(full) as z:
        assert len(z.files) == 19 and z["m01"].shape == (1, 40, 40) and z["sub/m00"].shape == (1, 25, 25)


# --------------------------------------------------------------------------------------------------
# Faults


def test_worker_process_death_is_retried_once_then_recorded(tmp_path, numbers):
    (numbers / "f04.pdb").write_text("CRASH")
    notes = []
    s = batch.run(numbers, SumJob(), out=tmp_path / "o.csv", keep_going=True, pool="process", jobs=2,
                  log=notes.append)
    assert (s.n_ok, s.n_failed) == (19, 1)
    assert s.failed[0][0] == str(numbers / "f04.pdb") and "died" in s.failed[0][1]
    assert any("worker process died" in n for n in notes)
    assert (tmp_path / "o.csv").read_bytes() == _fresh_bytes(tmp_path, [p for p in sorted(numbers.iterdir())
                                                                        if p.name != "f04.pdb"], SumJob(), "o.csv")


def test_out_of_memory_batches_are_split_then_a_clear_error(tmp_path, numbers):
    notes = []
    small = batch.run(numbers, SumJob(batch_size=8, oom_above=2), pool="inline", log=notes.append)
    assert small.n_ok == 20 and any("out of memory with a batch of" in n for n in notes)
    assert small.rows == batch.run(numbers, SumJob(batch_size=1), pool="inline").rows
    (numbers / "f09.pdb").write_text("HUGE 1 2")
    s = batch.run(numbers, SumJob(batch_size=8), pool="inline", keep_going=True, log=notes.append)
    assert s.n_failed == 1 and "out of memory" in s.failed[0][1]
    with pytest.raises(MemoryBudgetError, match=r"f09\.pdb: out of memory.*even alone"):
        batch.run(numbers, SumJob(batch_size=8), pool="inline")


def test_disk_full_while_writing_is_a_clear_error_and_nothing_is_lost(tmp_path, numbers, monkeypatch):
    out = tmp_path / "o.npz"
    real = np.lib.format.write_array
    calls = {"n": 0}

    def full_disk(*a, **k):
        calls["n"] += 1
        if calls["n"] > 9:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(np.lib.format, "write_array", full_disk)
    with pytest.raises(OutputError, match="No space left on device"):
        batch.run(numbers, SumJob(arrays=True, batch_size=3), out=out, pool="inline")
    assert not out.exists() and not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]
    journaled = (tmp_path / "o.npz.manifest.jsonl").read_text().count('"status": "ok"')
    assert journaled >= 3  # the batches written before the disk filled up
    monkeypatch.setattr(np.lib.format, "write_array", real)
    s = batch.run(numbers, SumJob(arrays=True, batch_size=3), out=out, pool="inline", resume=True)
    assert s.n_resumed == journaled and s.n_ok == 20
    assert out.read_bytes() == _fresh_bytes(tmp_path, numbers, SumJob(arrays=True, batch_size=3), "o.npz")

    # the final table fails to write: the previous output stays, the journal resumes everything
    table = tmp_path / "t.csv"
    table.write_text("old\n")

    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(csv, "writer", no_space)
    with pytest.raises(OutputError, match=r"t\.csv: cannot write"):
        batch.run(numbers, SumJob(), out=table, pool="inline")
    assert table.read_text() == "old\n"
    monkeypatch.undo()
    assert batch.run(numbers, SumJob(), out=table, pool="inline", resume=True).n_resumed == 20


def test_unreadable_inputs_are_recorded(tmp_path, numbers):
    (numbers / "dir.pdb").mkdir()
    target = numbers / "f02.pdb"
    if os.geteuid() != 0:  # root reads anything: there the permission case is the simulated one below
        target.chmod(0)
    s = batch.run(numbers, SumJob(), keep_going=True, pool="thread", jobs=2)
    reasons = dict(s.failed)
    if os.geteuid() != 0:
        assert "Permission denied" in reasons[str(target)]

    class Denied(SumJob):
        def load(self, path):
            raise PermissionError(errno.EACCES, "Permission denied", path)

    s = batch.run([numbers / "f00.pdb"], Denied(), keep_going=True, pool="inline")
    assert s.failed == [(str(numbers / "f00.pdb"), "cannot read (Permission denied)")]


# --------------------------------------------------------------------------------------------------
# Python API


def test_iter_results_streams_and_a_stopped_consumer_leaves_a_valid_journal(tmp_path, numbers):
    out = tmp_path / "o.jsonl"
    it = batch.iter_results(numbers, SumJob(batch_size=2), out=out, pool="thread", jobs=2)
    first = [next(it) for _ in range(5)]
    it.close()
    assert all(isinstance(r, InputResult) and r.ok for r in first) and not out.exists()
    s = batch.run(numbers, SumJob(batch_size=2), out=out, resume=True, pool="inline")
    assert s.n_resumed >= 5 and s.n_ok == 20
    assert [json.loads(x)["name"] for x in out.read_text().splitlines()] == [f"f{i:02d}.pdb" for i in range(20)]


def test_run_with_a_function_and_unpicklable_job_falls_back_to_threads(models):
    notes = []
    paths = expand_inputs([str(models / "models")])[:6]
    s = batch.run(paths * 6, lambda st: {"atoms": st.n_atoms, "res": st.n_residues}, pool="process", jobs=2,
                  log=notes.append)
    assert s.n_ok == 6 and any("cannot be pickled" in n for n in notes)  # duplicates dropped
    assert {r["res"] for r in s.rows} == {25, 40}


def test_docstring_examples():
    import doctest

    assert doctest.testmod(batch, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0


def test_score_job_bad_options_and_reference():
    with pytest.raises(InputError, match="metrics"):
        ScoreJob("x.pdb", metrics=("tm", "foo"))
    with pytest.raises(InputError, match="no such file"):
        ScoreJob("/nonexistent/ref.pdb")


# --------------------------------------------------------------------------------------------------
# Progress


def test_progress_bar_log_lines_and_quiet():
    buf = io.StringIO()
    p = BatchProgress(4, description="score", stream=buf, interval=0.0, tty=False)
    for ok in (True, False, True, True):
        p.advance(ok=ok)
    p.close()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 4 and lines[-1].startswith("score: 4/4 inputs (100%), 1 failed, ")
    assert "files/s" in lines[0] and "ETA" in lines[0]

    buf = io.StringIO()
    p = BatchProgress(4, description="score", stream=buf, tty=True)
    p.advance()
    p.note("a note")
    p.close()
    assert "a note" in buf.getvalue()

    buf = io.StringIO()
    p = BatchProgress(4, description="score", stream=buf, quiet=True, interval=0.0, tty=False)
    p.advance()
    p.close()
    assert buf.getvalue() == ""


def test_cli_progress_lines_when_not_a_terminal(tmp_path, models):
    args = ["score", models / "models", "--ref", models / "ref.pdb", "-m", "tm", "-o", tmp_path / "s.csv"]
    env = {**ENV, "PROTGPU_PROGRESS_INTERVAL": "0"}
    r = subprocess.run([sys.executable, "-m", "protgpu.cli", *map(str, args)], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("score: ")]
    assert len(progress) == 18 and "18/18 inputs (100%)" in progress[-1]
    assert "18 model(s) from 18 file(s) on the CPU" in r.stderr
    r = subprocess.run([sys.executable, "-m", "protgpu.cli", *map(str, args), "-q", "--resume"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 0 and r.stderr == "" and r.stdout == ""


# --------------------------------------------------------------------------------------------------
# Residue matching: cached per atom table, prepared in the parse workers


def _with_atoms(s, **fields):
    """``s`` with some atom-table fields replaced (same coordinates)."""
    from protgpu.structure import AtomTable, Structure

    a = s.atoms
    kw = {f: fields.get(f, getattr(a, f)) for f in ("name", "element", "resname", "resid", "icode", "chain",
                                                      "segid", "hetero")}
    return Structure(s.coords.copy(), AtomTable(**kw), source=s.source)


def _resnum_pairs_by_loop(model, ref, cmap):
    """The specification of resnum mapping, one residue at a time."""
    first = {}
    for j in np.flatnonzero(ref.polymer).tolist():
        first.setdefault((ref.chain[j], int(ref.resid[j]), ref.icode[j]), j)
    pairs = []
    for i in np.flatnonzero(model.polymer).tolist():
        if model.chain[i] not in cmap:
            continue
        j = first.get((cmap[model.chain[i]], int(model.resid[i]), model.icode[i]))
        if j is not None:
            pairs.append((i, j))
    return pairs


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_vectorised_resnum_mapping_equals_the_loop(data):
    from protgpu.scoring import _mapping as mp

    def table(n):
        chain = np.array(data.draw(st.lists(st.sampled_from(["A", "B", "C", ""]), min_size=n, max_size=n)) or [""],
                         dtype="<U4")[:n]
        resid = np.array(data.draw(st.lists(st.integers(-3, 6), min_size=n, max_size=n)), dtype=np.int64)
        icode = np.array(data.draw(st.lists(st.sampled_from(["", "", "A"]), min_size=n, max_size=n)), dtype="<U1")
        polymer = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
        z = np.zeros(n, np.int64)
        return mp.ResidueInfo(chain, resid, icode, np.full(n, "ALA"), polymer, polymer, z, np.zeros(0, str),
                              np.zeros(0, np.int64))

    model = table(data.draw(st.integers(1, 12)))
    ref = table(data.draw(st.integers(1, 12)))
    mc = mp._chain_order(model.chain, model.polymer)
    rc = mp._chain_order(ref.chain, ref.polymer)
    cmap = data.draw(st.dictionaries(st.sampled_from(mc), st.sampled_from(rc))) if mc and rc else {}
    got = mp._resnum_pairs(model, ref, cmap)
    assert list(zip(got[0].tolist(), got[1].tolist(), strict=True)) == _resnum_pairs_by_loop(model, ref, cmap)


def test_mapping_cache_never_reuses_a_match_for_another_residue_table(datasets):
    from protgpu import load
    from protgpu.scoring import _mapping as mp

    mp.clear_caches()
    ref = load(datasets / "adk_open.pdb")
    rinfo = mp.residue_info(ref)
    first = mp.match_ca(mp.residue_info(ref), rinfo, "resnum", "a")
    assert len(first.ref_pos) == 214 and not first.ref_pos.flags.writeable  # shared: read-only
    # same table, other coordinates: the cached match is reused
    moved = _with_atoms(ref)
    moved.coords[:] += 1.0
    hits = mp._MATCH_CACHE.hits
    assert mp.residue_info(moved) is rinfo and mp.match_ca(mp.residue_info(moved), rinfo, "resnum", "b") is first
    assert mp._MATCH_CACHE.hits == hits + 1
    # residues 101.. renumbered by +1000: a different table, matched anew (only 100 residues in common)
    shifted = _with_atoms(ref, resid=np.where(ref.atoms.resid > 100, ref.atoms.resid + 1000, ref.atoms.resid))
    assert mp.topology_key(shifted) != mp.topology_key(ref)
    cm = mp.match_ca(mp.residue_info(shifted), rinfo, "resnum", "c")
    assert len(cm.ref_pos) == 100 and cm.ref_pos.tolist() == list(range(100))
    # one atom renamed: same residues, but the atom match must not come from the cache
    ref_atoms = np.flatnonzero(ref.atoms.element != "H")
    full = mp.match_atoms(rinfo, rinfo, ref_atoms, "resnum", "d")
    names = ref.atoms.name.copy()
    k = int(np.flatnonzero(names == "CB")[0])
    names[k] = "CX"
    renamed = mp.residue_info(_with_atoms(ref, name=names))
    part = mp.match_atoms(renamed, rinfo, ref_atoms, "resnum", "e")
    assert len(part[0]) == len(full[0]) - 1 and k not in part[0].tolist()
    # ... and the cache answers those tables as a fresh computation does
    again = (mp.match_ca(mp.residue_info(shifted), rinfo, "resnum", "c"),
             mp.match_atoms(renamed, rinfo, ref_atoms, "resnum", "e"))
    mp.clear_caches()
    rinfo = mp.residue_info(ref)
    fresh = (mp.match_ca(mp.residue_info(shifted), rinfo, "resnum", "c"),
             mp.match_atoms(mp.residue_info(_with_atoms(ref, name=names)), rinfo, ref_atoms, "resnum", "e"))
    np.testing.assert_array_equal(again[0].ref_pos, fresh[0].ref_pos)
    np.testing.assert_array_equal(again[0].model_atoms, fresh[0].model_atoms)
    np.testing.assert_array_equal(again[1][0], fresh[1][0])
    np.testing.assert_array_equal(again[1][1], fresh[1][1])


def test_sequence_mapping_with_gaps_survives_renumbering_and_the_cache(datasets):
    from protgpu import load
    from protgpu.scoring import _mapping as mp

    ref = load(datasets / "adk_open.pdb")
    res = ref.atoms.residue_index
    # drop residues 30-39 and 120-124 (gaps), renumber the rest from 1000: resnum finds nothing
    keep_res = np.setdiff1d(np.arange(214), np.r_[30:40, 120:125])
    model = ref.select(np.flatnonzero(np.isin(res, keep_res)))
    model = _with_atoms(model, resid=model.atoms.residue_index + 1000)
    rinfo = mp.residue_info(ref)
    for _ in range(2):  # computed, then from the cache
        minfo = mp.residue_info(model)
        mres, rres = mp.map_residues(minfo, rinfo, "sequence", "gapped")
        assert rres.tolist() == keep_res.tolist() and mres.tolist() == list(range(len(keep_res)))
        cm = mp.match_ca(minfo, rinfo, "sequence", "gapped")
        assert cm.ref_pos.tolist() == keep_res.tolist()
    assert len(mp.map_residues(mp.residue_info(model), rinfo, "resnum", "gapped")[0]) == 0


def test_prepared_models_score_like_structures(models):
    from protgpu import lddt, load, tm_score
    from protgpu.scoring._batch import PreparedReference, prepare_model

    ref = load(models / "ref.pdb")
    paths = expand_inputs([str(models / "models")])[:6]
    structures = [load(p) for p in paths]
    pref = PreparedReference(ref)
    for mapping in ("resnum", "sequence"):
        prepared = [prepare_model(s, pref, mapping=mapping) for s in structures]
        a, b = tm_score(structures, ref, mapping=mapping, device="cpu"), tm_score(prepared, ref, mapping=mapping,
                                                                                    device="cpu")
        for f in a._fields:
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
        ga, pa = lddt(structures, ref, per_residue=True, mapping=mapping, device="cpu")
        gb, pb = lddt(prepared, ref, per_residue=True, mapping=mapping, device="cpu")
        np.testing.assert_array_equal(ga, gb)
        np.testing.assert_array_equal(pa, pb)
    # prepared against another reference (or mapping): refused, not silently mis-scored
    other = load(models / "models" / "m03.pdb")  # 25 residues: another table
    with pytest.raises(InputError, match="prepared against another reference"):
        tm_score([prepare_model(structures[1], other)], ref, device="cpu")
    with pytest.raises(InputError, match="prepared against another reference"):
        lddt([prepared[0]], ref, mapping="resnum", device="cpu")
    with pytest.raises(InputError, match="bare array"):
        tm_score([prepared[0]], ref.coords[0, ref.select_indices("ca")], device="cpu")
    # a model without residues in common fails at preparation with tm_score's own message
    far = _with_atoms(structures[1], resid=structures[1].atoms.resid + 500)
    with pytest.raises(InputError) as e1:
        prepare_model(far, pref)
    with pytest.raises(InputError) as e2:
        tm_score(far, ref, device="cpu")
    assert str(e1.value) == str(e2.value)


def test_score_job_reports_where_the_time_went(tmp_path, models):
    job = ScoreJob(models / "ref.pdb", metrics=("tm", "lddt"), device="cpu")
    s = batch.run(models / "models", job, out=tmp_path / "s.csv", pool="process", jobs=2, quiet=True)
    assert s.n_ok == 18
    for k in ("hash_s", "load_s", "read_s", "match_s", "warmup_s", "wait_s", "compute_s", "tm_s", "lddt_s", "stack_s",
              "write_s"):
        assert s.stats.get(k, -1) >= 0, k
    assert s.stats["read_s"] + s.stats["match_s"] <= s.stats["load_s"] * 1.01 + 1e-3
    assert s.stats["tm_s"] + s.stats["lddt_s"] <= s.stats["compute_s"] * 1.01 + 1e-3
    assert s.stats["transfer_s"] == 0.0  # no GPU here
    # the job can be run again: its timers count per run (the engine reports what the job's own running
    # totals grew by during this run, not the totals; inline, the job that computes is this object)
    before = dict(job.stats)
    s2 = batch.run(models / "models", job, pool="inline", quiet=True)
    assert s2.rows == s.rows
    assert s2.stats["tm_s"] == pytest.approx(job.stats["tm_s"] - before.get("tm_s", 0.0), rel=1e-9, abs=1e-12)
    assert 0 < s2.stats["tm_s"] < job.stats["tm_s"]


def test_process_pool_chunks_and_a_dying_worker_in_a_chunk(tmp_path, numbers):
    assert chunk_size("process", 10_000, 16) == 16 and chunk_size("process", 20, 2) == 2
    assert chunk_size("thread", 10_000, 16) == 1 and chunk_size("process", 3, 8) == 1
    for i in range(20, 60):
        (numbers / f"f{i:02d}.pdb").write_text(f"{i} 1 2")
    (numbers / "f33.pdb").write_text("CRASH")
    s = batch.run(numbers, SumJob(), keep_going=True, pool="process", jobs=2, quiet=True)
    assert s.n_ok == 59 and [Path(p).name for p, _ in s.failed] == ["f33.pdb"]
    (numbers / "f33.pdb").unlink()  # (inline, it would take this process down)
    assert s.rows == batch.run(numbers, SumJob(), pool="inline", quiet=True).rows


# --------------------------------------------------------------------------------------------------
# GPU: a model's scores must not depend on its batch-mates (what makes a resumed run byte-identical)


@pytest.mark.gpu
def test_gpu_scores_do_not_depend_on_batching_and_match_cpu(models, gpu):
    ref = models / "ref.pdb"
    one = batch.run(models / "models", ScoreJob(ref, device="gpu"), pool="inline", batch_size=1).rows
    many = batch.run(models / "models", ScoreJob(ref, device="gpu"), pool="process", jobs=2, batch_size=64).rows
    mixed = batch.run(models / "models", ScoreJob(ref, device="gpu"), pool="thread", batch_size=5).rows
    assert one == many == mixed  # bitwise: batch composition and padding change nothing
    cpu = batch.run(models / "models", ScoreJob(ref, device="cpu"), pool="inline").rows
    for g, c in zip(one, cpu, strict=True):
        assert g["model"] == c["model"] and g["n_aligned"] == c["n_aligned"]
        for k in ("tm", "gdt_ts", "gdt_ha", "maxsub"):
            assert g[k] == pytest.approx(c[k], abs=1e-6), (g["model"], k)
        # lDDT counts pairs within thresholds: a float32 distance within rounding of a threshold may
        # flip one pair against the float64 CPU run (one of ~20,000 pairs x 4 thresholds is 1.2e-5;
        # seen on the H200); allow two
        assert g["lddt"] == pytest.approx(c["lddt"], abs=2.6e-5), g["model"]
        assert g["rmsd"] == pytest.approx(c["rmsd"], abs=1e-4)


@pytest.mark.gpu
def test_gpu_distances_batched_equal_one_by_one(models, gpu, tmp_path):
    job = batch.DistancesJob(device="gpu")
    batch.run(models / "models", job, out=tmp_path / "a.npz", pool="inline", batch_size=1)
    batch.run(models / "models", job, out=tmp_path / "b.npz", pool="inline", batch_size=64)
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    batch.run(models / "models", batch.DistancesJob(device="cpu"), out=tmp_path / "c.npz", pool="inline")
    with np.load(tmp_path / "a.npz") as a, np.load(tmp_path / "c.npz") as c:
        for k in c.files:
            if k != "inputs":
                np.testing.assert_allclose(a[k], c[k], atol=2e-4)


@pytest.mark.gpu
def test_gpu_pinned_staging_is_reused_and_changes_no_score(models, gpu, monkeypatch):
    from protgpu._array import dispatch
    from protgpu.scoring import _batch as sb

    be = dispatch(device="gpu")
    a = sb.host_buffer((4, 5, 3), np.float32, np.nan, be, "test")
    assert np.isnan(a).all()
    a[:] = 1.5
    d = sb.to_work(a, be, np.float32)
    b = sb.host_buffer((2, 5, 3), np.float32, 0.0, be, "test")  # the same page-locked memory, refilled
    assert b.ctypes.data == a.ctypes.data and (b == 0).all()
    assert float(d.sum()) == 1.5 * 60  # the device copy was complete before the buffer was reused
    ref = models / "ref.pdb"
    pinned = batch.run(models / "models", ScoreJob(ref, device="gpu"), pool="inline", batch_size=64).rows
    monkeypatch.setattr(sb, "_PINNED_MAX", 0)  # every batch through CuPy's own copy
    plain = batch.run(models / "models", ScoreJob(ref, device="gpu"), pool="inline", batch_size=64).rows
    assert pinned == plain
