"""The batch engine's journal, lock, progress and input safety (issues 16 and 21).

A complete run leaves only its output; the journal is written at least every few seconds of compute
and is kept only for a resume; two runs cannot write one output; progress counts work as it is done;
names, links, pipes and schedulers that used to end in tracebacks are one-line errors.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from protgpu import batch
from protgpu.batch import Job, Result
from protgpu.batch.inputs import display_path, expand_inputs, file_sha256, regular_file_or_error
from protgpu.batch.journal import OutputLock
from protgpu.batch.progress import BatchProgress
from protgpu.cli import main
from protgpu.commands._batch_options import write_stats_json
from protgpu.errors import InputError

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PROTGPU_DISABLE_GPU": "1", "PYTHONPATH": str(REPO)}


def cli(*args) -> int:
    return main([str(a) for a in args])


class NumbersJob(Job):
    """One row (name, sum) and the numbers as the input's array; files starting with BAD fail; each
    input's compute sleeps ``delay`` seconds."""

    name = "numbers"

    def __init__(self, delay: float = 0.0, batch_size: int = 256, arrays: bool = True):
        self.delay, self.batch_size, self.arrays = delay, batch_size, arrays

    def load(self, path):
        text = Path(path).read_text()
        if text.startswith("BAD"):
            raise InputError(f"{path}: bad")
        return os.path.basename(path), np.array(text.split(), dtype=np.float64)

    def compute_one(self, item):
        time.sleep(self.delay)
        n, x = item
        return Result(rows=[{"name": n, "sum": float(x.sum())}], arrays={"": x} if self.arrays else {})


def write_numbers(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = folder / f"f{i:03d}.pdb"
        p.write_text(f"{i} {i + 0.5}")
        paths.append(p)
    return paths


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --------------------------------------------------------------------------------------------------
# 1. Litter: only the output remains after a complete run


def test_contacts_quick_start_leaves_only_its_output(tmp_path, datasets, capsys):
    out = tmp_path / "adk_contacts.npz"
    assert cli("contacts", datasets / "adk_open.pdb", "--out", out, "--device", "cpu", "-q") == 0
    assert names(tmp_path) == ["adk_contacts.npz"]  # no .manifest.jsonl, no .parts/, no lock
    assert cli("distances", datasets / "adk_open.pdb", "-s", "ca", "--out", tmp_path / "d.npz", "--device", "cpu",
               "-q") == 0
    assert names(tmp_path) == ["adk_contacts.npz", "d.npz"]


def test_keep_going_failures_keep_the_journal_and_resume_retries_only_them(tmp_path):
    paths = write_numbers(tmp_path / "in", 6)
    paths[2].write_text("BAD")
    out = tmp_path / "o.npz"
    s = batch.run(tmp_path / "in", NumbersJob(), out=out, keep_going=True, pool="inline")
    assert s.n_failed == 1 and s.manifest == tmp_path / "o.npz.manifest.jsonl"
    assert names(tmp_path) == ["in", "o.npz", "o.npz.errors.tsv", "o.npz.manifest.jsonl", "o.npz.parts"]
    paths[2].write_text("2 2.5")
    seen = list(batch.iter_results(tmp_path / "in", NumbersJob(), out=out, resume=True, pool="inline"))
    assert [Path(r.input).name for r in seen if not r.resumed] == ["f002.pdb"]
    assert names(tmp_path) == ["in", "o.npz"]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    batch.run(tmp_path / "in", NumbersJob(), out=fresh / "o.npz", pool="inline")
    assert out.read_bytes() == (fresh / "o.npz").read_bytes()


def test_help_and_docs_say_where_the_journal_lives():
    p = subprocess.run([sys.executable, "-m", "protgpu.cli", "contacts", "--help"], capture_output=True, text=True,
                       env={**ENV, "COLUMNS": "200"})
    text = " ".join(p.stdout.split())
    assert "OUT.manifest.jsonl" in text and "journal removed" in text and "--resume retries only" in text
    doc = " ".join((REPO / "docs" / "cli.rst").read_text().split())
    assert "journal" in doc and "removed" in doc and ".OUT.lock" in doc


# --------------------------------------------------------------------------------------------------
# 3. The journal is written every few seconds of compute, whatever the batch size


def test_journal_is_written_at_the_interval_with_the_default_batch_size(tmp_path):
    write_numbers(tmp_path / "in", 30)
    out = tmp_path / "o.csv"
    man = tmp_path / "o.csv.manifest.jsonl"
    journaled = []  # manifest entries on disk as each result is handed out

    def on(r):
        journaled.append(len(man.read_text().splitlines()) - 1)

    job = NumbersJob(delay=0.04, batch_size=256)
    s = batch.run(tmp_path / "in", job, out=out, pool="inline", journal_interval=0.25, on_result=on)
    assert s.n_ok == 30
    # a batch of 256 would have journaled all 30 at once, at the end; the first write holds at most 8
    assert 0 < journaled[0] <= 8
    assert len(set(journaled)) >= 4, journaled
    assert names(tmp_path) == ["in", "o.csv"]


def test_a_run_stopped_midway_has_journaled_what_finished(tmp_path):
    write_numbers(tmp_path / "in", 30)
    out = tmp_path / "o.csv"
    it = batch.iter_results(tmp_path / "in", NumbersJob(delay=0.03), out=out, pool="inline", journal_interval=0.2)
    list(itertools.islice(it, 12))
    it.close()  # as if killed: the output is not written, the journal holds what finished
    lines = (tmp_path / "o.csv.manifest.jsonl").read_text().splitlines()
    assert len(lines) - 1 >= 12 and not out.exists()
    s = batch.run(tmp_path / "in", NumbersJob(), out=out, resume=True, pool="inline")
    assert s.n_resumed == len(lines) - 1 and s.n_ok == 30


def test_journal_interval_option_is_checked(tmp_path, capsys):
    write_numbers(tmp_path / "in", 2)
    with pytest.raises(InputError, match="journal interval"):
        batch.run(tmp_path / "in", NumbersJob(), journal_interval=0, pool="inline")


# --------------------------------------------------------------------------------------------------
# 2. Progress counts work as it is done


def test_progress_partial_work_rate_and_last_line():
    clock = [0.0]
    buf = io.StringIO()
    p = BatchProgress(4, description="score", stream=buf, interval=1.0, tty=False)
    p._time = lambda: clock[0]
    p.t0 = p.last = 0.0
    clock[0] = 1.0
    p.partial(0.5)  # half a batch of one input's worth reported by the job
    clock[0] = 2.0
    p.advance(n=2)  # two finish at once: the rate comes from the work over the time, not the burst
    clock[0] = 2.5
    p.advance()
    p.advance()
    p.close()
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("score: 0.5/4 inputs (12%)") and "0.5 files/s" in lines[0]
    assert lines[1].startswith("score: 2/4 inputs (50%)") and "1.0 files/s" in lines[1] and "ETA 0:00:02" in lines[1]
    assert lines[-1].startswith("score: 4/4 inputs (100%)") and "1.6 files/s" in lines[-1]  # close: the last line


def test_progress_bar_shows_rich_columns_with_a_sane_rate():
    buf = io.StringIO()
    p = BatchProgress(200, description="score", stream=buf, tty=True)
    time.sleep(0.2)
    p.advance(n=199)
    p.advance()
    p.close()
    text = buf.getvalue()
    assert "200/200" in text
    rate = float(text.split(" files/s")[0].split()[-1])
    assert rate < 1200  # 200 inputs in >= 0.2 s: not the 71957.6 files/s of a burst


class FramesJob(Job):
    """One long input: reports its frames as it computes them."""

    name = "frames"

    def load(self, path):
        return path

    def compute(self, items):
        for k in range(10):
            time.sleep(0.05)
            self.report_progress((k + 1) / 10)
        return [{"frames": 10} for _ in items]


def test_engine_logs_progress_lines_at_the_interval_off_a_terminal(tmp_path, capsys):
    write_numbers(tmp_path / "in", 12)
    batch.run(tmp_path / "in", NumbersJob(delay=0.05, arrays=False), pool="inline", progress=True,
              progress_interval=0.15, description="nums")
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("nums: ")]
    counts = [float(ln.split()[1].split("/")[0]) for ln in lines]
    assert len(lines) >= 3 and counts == sorted(counts) and counts[0] < 12 and counts[-1] == 12

    # one long input: its frames, as the job reports them, move the count between 0 and 1
    batch.run([tmp_path / "in" / "f000.pdb"], FramesJob(), pool="inline", progress=True, progress_interval=0.1,
              description="traj")
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("traj: ")]
    assert any(ln.split()[1].startswith("0.") for ln in lines) and lines[-1].startswith("traj: 1/1")


# --------------------------------------------------------------------------------------------------
# 5. One run per output


def test_a_second_run_on_the_same_output_fails_with_one_line(tmp_path, capsys, datasets):
    out = tmp_path / "s.csv"
    held = OutputLock(out)
    held.acquire()
    try:
        assert (tmp_path / ".s.csv.lock").exists()
        code = cli("score", datasets / "adk_closed.pdb", "--ref", datasets / "adk_open.pdb", "-o", out, "--device",
                   "cpu", "-q")
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1 and str(out) in err and "another protgpu run" in err
        assert not out.exists()
    finally:
        held.release()
    assert not (tmp_path / ".s.csv.lock").exists()
    assert cli("score", datasets / "adk_closed.pdb", "--ref", datasets / "adk_open.pdb", "-o", out, "--device",
               "cpu", "-q") == 0
    assert names(tmp_path) == ["s.csv"]


def test_a_killed_run_leaves_no_lock_behind_in_its_workers(tmp_path):
    # a run holding the lock forks a worker (as the parse pool does) and is killed; the worker lives on
    # for a while: the --resume started right after must get the lock (flock belongs to the open file,
    # which the worker shared until it closed its copy)
    out = tmp_path / "o.csv"
    code = f"""
import os, signal, time
from pathlib import Path
from protgpu.batch.journal import OutputLock
OutputLock(Path({str(out)!r})).acquire()
if os.fork() == 0:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)  # the test reads the parent's output to its end: not this child's
    time.sleep(20)
    os._exit(0)
print("locked", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert p.stdout.strip() == "locked" and p.returncode == -signal.SIGKILL, p.stderr
    lock = OutputLock(out)
    lock.acquire()  # raised "another protgpu run is writing this output" while the worker lived
    lock.release()


def test_concurrent_runs_never_both_write(tmp_path):
    write_numbers(tmp_path / "in", 10)
    out = tmp_path / "o.csv"
    errors, done = [], []

    def one():
        try:
            batch.run(tmp_path / "in", NumbersJob(delay=0.02, arrays=False), out=out, pool="inline")
            done.append(1)
        except InputError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) == 1 and len(errors) == 1 and "another protgpu run" in errors[0]
    assert names(tmp_path) == ["in", "o.csv"]


class FakeMsvcrt:
    """Stands in for Windows' ``msvcrt`` (this machine has none): ``locking`` on the file's first byte,
    with msvcrt's modes and its error (OSError) when another holder has the byte, backed by flock
    (which, like msvcrt's locks, conflicts between two opens in one process). Records every call
    with the file position it was made at."""

    LK_UNLCK, LK_NBLCK = 0, 2

    def __init__(self, fcntl):
        self.fcntl, self.calls = fcntl, []

    def locking(self, fd, mode, nbytes):
        self.calls.append((mode, nbytes, os.lseek(fd, 0, os.SEEK_CUR)))
        if mode == self.LK_NBLCK:
            try:
                self.fcntl.flock(fd, self.fcntl.LOCK_EX | self.fcntl.LOCK_NB)
            except BlockingIOError:
                raise PermissionError(13, "Permission denied") from None  # what msvcrt raises (EACCES)
        elif mode == self.LK_UNLCK:
            self.fcntl.flock(fd, self.fcntl.LOCK_UN)
        else:
            raise ValueError(mode)


def test_output_lock_on_windows_uses_msvcrt(tmp_path, monkeypatch):
    """Untested on Windows itself: ``fcntl`` hidden and ``msvcrt`` faked (see FakeMsvcrt)."""
    fcntl = pytest.importorskip("fcntl")
    fake = FakeMsvcrt(fcntl)
    monkeypatch.setitem(sys.modules, "fcntl", None)  # import fcntl -> ImportError, as on Windows
    monkeypatch.setitem(sys.modules, "msvcrt", fake)
    out = tmp_path / "o.csv"
    first = OutputLock(out)
    first.acquire()
    with pytest.raises(InputError, match="another protgpu run is writing this output") as e:
        OutputLock(out).acquire()
    assert "\n" not in str(e.value)
    first.release()
    assert not (tmp_path / ".o.csv.lock").exists()
    # one byte at position 0: locked, refused to the second, unlocked (before the close and the unlink)
    assert fake.calls == [(2, 1, 0), (2, 1, 0), (0, 1, 0)]
    # a whole run takes and leaves it
    write_numbers(tmp_path / "in", 3)
    batch.run(tmp_path / "in", NumbersJob(arrays=False), out=out, pool="inline")
    assert names(tmp_path) == ["in", "o.csv"] and len(fake.calls) == 5
    # neither fcntl nor msvcrt: nothing is locked, the run still works
    monkeypatch.setitem(sys.modules, "msvcrt", None)
    held = OutputLock(out)
    held.acquire()
    assert held.fd is None and not (tmp_path / ".o.csv.lock").exists()
    held.release()


# --------------------------------------------------------------------------------------------------
# 7. Security: the journal is never followed out of its place; inputs are regular files


def _interrupted(tmp_path, n=6):
    """A journal of a run stopped after its inputs finished (arrays in parts), output not written."""
    write_numbers(tmp_path / "in", n)
    out = tmp_path / "o.npz"
    it = batch.iter_results(tmp_path / "in", NumbersJob(), out=out, pool="inline")
    assert len(list(itertools.islice(it, n))) == n  # every input journaled, the output not yet written
    it.close()
    return out


def test_a_part_outside_the_parts_folder_is_refused(tmp_path):
    out = _interrupted(tmp_path)
    secret = tmp_path / "secret.npz"
    np.savez(secret, **{"0:": np.arange(3.0)})
    man = tmp_path / "o.npz.manifest.jsonl"
    lines = man.read_text().splitlines()
    e = json.loads(lines[1])
    e["part"] = "../secret.npz"
    man.write_text("\n".join([lines[0], json.dumps(e), *lines[2:]]) + "\n")
    with pytest.raises(InputError, match="not a part file"):
        batch.run(tmp_path / "in", NumbersJob(), out=out, resume=True, pool="inline")


def test_journal_symlinks_are_refused_and_their_targets_untouched(tmp_path):
    write_numbers(tmp_path / "in", 3)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "part-deadbeef-000001.npz").write_bytes(b"keep me")
    (victim / "notes.jsonl").write_text("keep me too\n")
    out = tmp_path / "o.npz"
    (tmp_path / "o.npz.parts").symlink_to(victim)
    with pytest.raises(InputError, match="symbolic link"):
        batch.run(tmp_path / "in", NumbersJob(), out=out, pool="inline")
    (tmp_path / "o.npz.parts").unlink()
    (tmp_path / "o.npz.manifest.jsonl").symlink_to(victim / "notes.jsonl")
    with pytest.raises(InputError, match="symbolic link"):
        batch.run(tmp_path / "in", NumbersJob(), out=out, resume=True, pool="inline")
    assert (victim / "part-deadbeef-000001.npz").read_bytes() == b"keep me"
    assert (victim / "notes.jsonl").read_text() == "keep me too\n"


def test_stats_json_is_not_written_through_a_symlink(tmp_path, capsys):
    target = tmp_path / "target.txt"
    target.write_text("untouched")
    link = tmp_path / "stats.json"
    link.symlink_to(target)
    write_stats_json(str(link), "score")
    assert target.read_text() == "untouched" and "symbolic link" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes")
def test_pipes_and_devices_are_not_hashed(tmp_path):
    fifo = tmp_path / "pipe.pdb"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.pdb"
    zero.symlink_to("/dev/zero")
    t0 = time.perf_counter()
    for p, kind in ((fifo, "named pipe"), (zero, "device")):
        with pytest.raises(InputError, match=f"not a regular file \\(a {kind}\\)"):
            file_sha256(p)
        with pytest.raises(InputError, match=kind):
            regular_file_or_error(p)
    big = tmp_path / "big.pdb"
    big.write_bytes(b"x" * 100)
    with pytest.raises(InputError, match="more than the 10"):
        file_sha256(big, max_bytes=10)
    assert time.perf_counter() - t0 < 5
    write_numbers(tmp_path / "in", 2)
    s = batch.run([tmp_path / "in" / "f000.pdb", fifo, zero], NumbersJob(), keep_going=True, pool="inline")
    assert s.n_ok == 1 and [why for _, why in s.failed] == ["not a regular file (a named pipe)",
                                                             "not a regular file (a device)"]


# --------------------------------------------------------------------------------------------------
# 8. Names that used to be tracebacks


def test_names_with_glob_characters_are_taken_literally(tmp_path, datasets, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("star*.pdb", "glob[1].pdb", "plain.pdb"):
        shutil.copy(datasets / "adk_closed.pdb", tmp_path / name)
    assert expand_inputs(["star*.pdb"]) == ["star*.pdb"]  # not globbed again and again (RecursionError)
    assert expand_inputs(["glob[1].pdb"]) == ["glob[1].pdb"]  # exists: itself, not the pattern glob1.pdb
    assert expand_inputs(["*.pdb"]) == ["glob[1].pdb", "plain.pdb", "star*.pdb"]
    assert cli("score", "star*.pdb", "glob[1].pdb", "--ref", datasets / "adk_open.pdb", "-o", "s.csv", "--device",
               "cpu", "-q") == 0
    assert [ln.split(",")[0] for ln in Path("s.csv").read_text().splitlines()] == ["model", "star*.pdb", "glob[1].pdb"]


def test_undecodable_file_names_are_written_and_shown_readably(tmp_path, datasets, capsys):
    d = tmp_path / "in"
    d.mkdir()
    odd = os.fsdecode(bytes(d) + b"/m_\xff.pdb")
    shutil.copy(datasets / "adk_closed.pdb", odd)
    shutil.copy(datasets / "adk_open.pdb", d / "plain.pdb")
    assert display_path(odd).endswith("m_\\xff.pdb")
    out = tmp_path / "s.csv"
    assert cli("score", d, "--ref", datasets / "adk_open.pdb", "-o", out, "--device", "cpu", "-q") == 0
    assert out.read_text().splitlines()[1].startswith("m_\\xff.pdb,")  # sorted: "m" before "p"
    assert names(tmp_path) == ["in", "s.csv"]
    assert cli("contacts", d, "-o", tmp_path / "c.npz", "--device", "cpu", "-q") == 0
    with np.load(tmp_path / "c.npz") as z:
        assert "m_\\xff/frequency" in z.files
    with open(odd, "w") as fh:
        fh.write("not a structure\n")
    assert cli("score", d, "--ref", datasets / "adk_open.pdb", "-o", out, "--device", "cpu", "-q", "-k") == 1
    capsys.readouterr()
    errors = (tmp_path / "s.csv.errors.tsv").read_text()
    assert "m_\\xff.pdb" in errors and "\\udcff" not in errors


def test_scheduler_errors_are_one_line(tmp_path, datasets, capsys):
    pytest.importorskip("distributed")
    import dask

    args = [datasets / "adk_closed.pdb", "--ref", datasets / "adk_open.pdb", "-o", tmp_path / "s.csv", "--device",
            "cpu", "-q"]
    assert cli("score", *args, "--scheduler", "tls://127.0.0.1:9") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--tls-ca-file" in err
    assert cli("score", *args, "--scheduler", "tls://127.0.0.1:9", "--tls-ca-file", tmp_path / "none.pem") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "none.pem: no such file" in err
    with dask.config.set({"distributed.comm.timeouts.connect": "0.5s"}):
        assert cli("score", *args, "--scheduler", "tcp://127.0.0.1:9") == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "cannot connect" in err and "Traceback" not in err
    assert names(tmp_path) == []


# --------------------------------------------------------------------------------------------------
# 9. Inputs named by their path below the inputs' common folder


def test_equal_base_names_in_different_folders_stay_apart(tmp_path, datasets):
    for sub, src in (("a", "adk_open.pdb"), ("b", "adk_closed.pdb")):
        (tmp_path / "af" / sub).mkdir(parents=True)
        shutil.copy(datasets / src, tmp_path / "af" / sub / "ranked_0.pdb")
    out = tmp_path / "s.csv"
    assert cli("score", tmp_path / "af", "--ref", datasets / "adk_open.pdb", "-o", out, "--device", "cpu", "-q") == 0
    assert [ln.split(",")[0] for ln in out.read_text().splitlines()] == ["model", "a/ranked_0.pdb", "b/ranked_0.pdb"]
    assert cli("contacts", tmp_path / "af", "-o", tmp_path / "c.npz", "--device", "cpu", "-q") == 0
    with np.load(tmp_path / "c.npz") as z:
        assert {k.rsplit("/", 1)[0] for k in z.files if "/" in k} == {"a/ranked_0", "b/ranked_0"}


# --------------------------------------------------------------------------------------------------
# 6. Memory per input stays small


def test_memory_per_input_is_bounded(tmp_path):
    n = 3000
    write_numbers(tmp_path / "in", n)
    out = tmp_path / "o.csv"
    peak = [0]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]

        def on(r):
            if r.index % 100 == 0:
                peak[0] = max(peak[0], tracemalloc.get_traced_memory()[0] - base)

        s = batch.run(tmp_path / "in", NumbersJob(arrays=False, batch_size=64), out=out, pool="inline", on_result=on)
    finally:
        tracemalloc.stop()
    assert s.n_ok == n and len(s.rows) == n and s.rows[5] == {"name": "f005.pdb", "sum": 10.5}
    # the row dicts kept for the final table took ~1 KB per input; now ~0.65 KB (path, key, hash, row text)
    assert peak[0] / n < 800, f"{peak[0] / n:.0f} bytes per input"


# --------------------------------------------------------------------------------------------------
# 4. BLAS threads: recorded, and a resume under another setting refused


def test_resume_under_another_blas_setting_is_refused(tmp_path, datasets):
    from protgpu.batch import ScoreJob
    from protgpu.batch.journal import blas_setting

    d = tmp_path / "in"
    d.mkdir()
    shutil.copy(datasets / "adk_closed.pdb", d / "a.pdb")
    (d / "bad.pdb").write_text("not a structure\n")
    out = tmp_path / "s.csv"
    job = ScoreJob(datasets / "adk_open.pdb", device="cpu", metrics=("tm",))
    batch.run(d, job, out=out, keep_going=True, pool="inline")
    man = tmp_path / "s.csv.manifest.jsonl"
    lines = man.read_text().splitlines()
    head = json.loads(lines[0])
    assert head["blas"] == blas_setting() and ":" in head["blas"]
    head["blas"] = "openblas:999"
    man.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    with pytest.raises(InputError, match="BLAS threads openblas:999"):
        batch.run(d, job, out=out, resume=True, keep_going=True, pool="inline")
    with contextlib.suppress(FileNotFoundError):
        man.unlink()


def test_a_long_trajectory_reports_its_frames_and_chunks_change_no_value(datasets):
    from protgpu.batch import DistancesJob
    from protgpu.batch.job import progress_sink
    from protgpu.io import load

    s = load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb").select("ca")
    item = {"coords": s.coords, "box": None}
    job = DistancesJob(device="cpu")
    whole = job.compute([item])[0].arrays[""]
    job.progress_bytes = 4 * s.n_atoms ** 2 * 7  # 7 frames a chunk
    seen: list = []
    with progress_sink(seen.append):
        chunked = job.compute([item])[0].arrays[""]
    np.testing.assert_array_equal(chunked, whole)
    assert len(seen) == -(-s.n_frames // 7) + 1 and seen == sorted(seen) and seen[0] < 0.1 and seen[-1] == 1.0
