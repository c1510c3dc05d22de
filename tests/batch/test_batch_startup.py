"""The batch engine's start-up and shutdown (issue 7): how the parse pool starts (fork when it is safe),
that the workers parse while the job warms up, what the workers import, the engine's timers and the
CLI's ``PROTGPU_STATS_JSON`` record, the input listing, and two review fixes (0-d arrays keep their
shape; ``.npz`` keys of shards are those of the full run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest

from protgpu import batch
from protgpu.batch import Job, Result, local
from protgpu.batch.inputs import (
    ExpandedInputs,
    expand_inputs,
    has_ext,
)
from protgpu.batch.job import warm_device
from protgpu.batch.progress import BatchProgress
from protgpu.batch.results import as_result
from protgpu.errors import InputError
from protgpu.io.formats import readable_suffixes

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PROTGPU_DISABLE_GPU": "1", "PYTHONPATH": str(REPO)}
HEAVY = ("cupy", "scipy", "pandas", "matplotlib", "rich", "dask", "distributed", "torch")


class NumbersJob(Job):
    """One row (name, sum) and the numbers as the input's array; files starting with BAD fail."""

    name = "numbers"
    batch_size = 4

    def load(self, path):
        text = Path(path).read_text()
        if text.startswith("BAD"):
            raise InputError(f"{path}: bad")
        return os.path.basename(path), np.array(text.split(), dtype=np.float64)

    def compute(self, items):
        return [Result(rows=[{"name": n, "sum": float(x.sum())}], arrays={"": x}) for n, x in items]


class WaitingWarmUpJob(Job):
    """Each load leaves a marker file; warm_up waits (up to 60 s) until every input has one: it returns
    early only if all inputs were handed to the workers before it began."""

    name = "waiting"
    batch_size = 4

    def __init__(self, marks: str, n: int):
        self.marks, self.n = marks, n
        self.seen_in_warm_up = None

    def load(self, path):
        Path(self.marks, os.path.basename(path)).touch()
        return os.path.basename(path)

    def warm_up(self):
        t_end = time.monotonic() + 60
        while len(os.listdir(self.marks)) < self.n and time.monotonic() < t_end:
            time.sleep(0.02)
        self.seen_in_warm_up = len(os.listdir(self.marks))

    def compute(self, items):
        return [{"name": n} for n in items]


def _write_numbers(folder: Path, n: int, prefix: str = "f") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        p = folder / f"{prefix}{i:02d}.pdb"
        p.write_text(" ".join(str(i + k) for k in range(1 + i % 3)))
        out.append(p)
    return out


def _pdb_models(datasets: Path, folder: Path, n: int, n_res: int = 20) -> Path:
    lines = [ln for ln in (datasets / "adk_open.pdb").read_text().splitlines(keepends=True)
             if ln.startswith("ATOM") and int(ln[22:26]) <= n_res]
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    for i in range(n):
        text = "".join(ln[:30] + "".join(f"{float(ln[30 + 8 * k:38 + 8 * k]) + rng.normal(0, 0.5):8.3f}"
                                         for k in range(3)) + ln[54:] for ln in lines)
        (folder / f"m{i:02d}.pdb").write_text(text + "END\n")
    ref = folder.parent / "ref.pdb"
    ref.write_text("".join(lines) + "END\n")
    return ref


# --------------------------------------------------------------------------------------------------
# Review fixes


def test_as_result_keeps_zero_dimensional_arrays(tmp_path):
    r = as_result(np.float32(2.5))
    assert r.arrays[""].shape == () and r.arrays[""].dtype == np.float32
    r = as_result(Result(arrays={"x": np.array(3.0), "m": np.arange(6).reshape(2, 3).T}))
    assert r.arrays["x"].shape == () and r.arrays["m"].flags.c_contiguous and r.arrays["m"].shape == (3, 2)
    _write_numbers(tmp_path / "in", 3)
    job = batch.FunctionJob(lambda x: np.asarray(float(x.sum())), load=_load_numbers)
    batch.run(tmp_path / "in", job, out=tmp_path / "o.npz", pool="inline", quiet=True)
    with np.load(tmp_path / "o.npz") as z:
        assert z["f00"].shape == () and float(z["f01"]) == 1 + 2


def _load_numbers(path):
    return np.array(Path(path).read_text().split(), dtype=np.float64)


def test_npz_keys_of_shards_are_those_of_the_full_run(tmp_path):
    # the same stem in three folders; shards of 2 put them in different shards
    for sub in ("a", "b", "c"):
        _write_numbers(tmp_path / sub, 2, prefix="x")
    (tmp_path / "a" / "x00.pdb").write_text("BAD")  # a failing input still claims its key
    full = tmp_path / "full.npz"
    batch.run(tmp_path, NumbersJob(), out=full, keep_going=True, pool="inline", quiet=True)
    with np.load(full) as z:
        want = {k: z[k] for k in z.files if k != "inputs"}
        want_inputs = list(z["inputs"])
    # keyed by the path relative to the inputs' folder; a/x00 failed
    assert set(want) == {"a/x01", "b/x00", "b/x01", "c/x00", "c/x01"}
    union, inputs = {}, []
    for i in range(2):
        batch.run(tmp_path, NumbersJob(), out=tmp_path / "s.npz", shard=(i, 2), keep_going=True, pool="inline",
                  quiet=True)
        with np.load(tmp_path / f"s.shard-{i}-of-2.npz") as z:
            part = {k: z[k] for k in z.files if k != "inputs"}
            inputs += list(z["inputs"])
        assert not set(part) & set(union)
        union.update(part)
    assert union.keys() == want.keys() and sorted(inputs) == sorted(want_inputs)
    for k in want:
        np.testing.assert_array_equal(union[k], want[k])


# --------------------------------------------------------------------------------------------------
# Input listing


def test_directory_listing_equals_pathlib_rglob(tmp_path):
    root = tmp_path / "tree"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "other").mkdir()
    for p in ("a.pdb", "B.PDB", ".hidden.pdb", "notes.txt", "sub/c.cif.gz", "sub/deeper/d.xtc", "other/e.ent"):
        (root / p).write_text("x")
    (root / "dir.pdb").mkdir()  # a folder with a structure's name is not a file
    (root / "link.pdb").symlink_to(root / "a.pdb")  # a symlinked file is listed
    (root / "broken.pdb").symlink_to(root / "missing.pdb")  # a broken one is not
    (root / "linked_dir").symlink_to(root / "other", target_is_directory=True)  # not entered
    exts = readable_suffixes()
    for spelled in (str(root), str(root) + "/", str(root / "sub" / "..")):
        want = sorted(str(p) for p in Path(spelled).rglob("*") if p.is_file() and has_ext(p.name, exts))
        got = expand_inputs([spelled])
        assert got == want and isinstance(got, ExpandedInputs)
    assert len(want) == 7


def test_an_expanded_list_is_not_expanded_again(tmp_path):
    paths = expand_inputs([str(p) for p in _write_numbers(tmp_path / "in", 4)])
    os.unlink(paths[1])  # gone after listing: the engine does not list again, the input fails as unreadable
    s = batch.run(paths, NumbersJob(), keep_going=True, pool="inline", quiet=True)
    assert s.n_ok == 3 and s.failed[0][0] == paths[1] and "no such file" in s.failed[0][1]
    with pytest.raises(InputError, match="no such file"):
        batch.run([str(p) for p in paths], NumbersJob(), pool="inline", quiet=True)  # a plain list is checked


# --------------------------------------------------------------------------------------------------
# The parse pool


def test_start_method_is_fork_only_when_safe(monkeypatch):
    monkeypatch.delenv("PROTGPU_BATCH_START_METHOD", raising=False)
    assert local.pool_start_method("spawn") == "spawn"
    monkeypatch.setenv("PROTGPU_BATCH_START_METHOD", "forkserver")
    assert local.pool_start_method(None) == "forkserver"
    monkeypatch.delenv("PROTGPU_BATCH_START_METHOD")
    fallback = "forkserver" if sys.platform.startswith("linux") else local.pool_start_method(None)
    # a GPU library loaded (CUDA may be initialised): not forked
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    assert not local.fork_is_safe() and local.pool_start_method(None) == fallback
    monkeypatch.delitem(sys.modules, "cupy")
    # another thread running (it may hold a lock the child would inherit): not forked
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not local.fork_is_safe()
    finally:
        stop.set()
        t.join()
    # a fresh process that imported protgpu forks (on Linux)
    code = "import protgpu.batch.local as b, protgpu.cli; print(b.pool_start_method(None))"
    out = subprocess.run([sys.executable, "-c", code], env={**ENV, "PROTGPU_BATCH_START_METHOD": ""},
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == ("fork" if sys.platform.startswith("linux") else fallback)


PROBE = textwrap.dedent('''
    import json, sys
    from protgpu import batch

    HEAVY = {heavy!r}

    class Probe(batch.ScoreJob):
        def load(self, path):
            item = super().load(path)
            item.timings["heavy_modules"] = float(sum(m in sys.modules for m in HEAVY))
            return item

    if __name__ == "__main__":
        folder, ref, method = sys.argv[1:]
        job = Probe(ref, metrics=("tm", "lddt"), device="cpu")
        s = batch.run(folder, job, pool="process", jobs=2, quiet=True, start_method=method or None)
        parent = sorted(m for m in HEAVY if m in sys.modules)
        print(json.dumps({{"n_ok": s.n_ok, "heavy": s.stats.get("heavy_modules"), "parent": parent,
                          "stats": s.stats}}))
''')


@pytest.mark.parametrize("method", ["", "forkserver"])
def test_parse_workers_import_nothing_heavy(tmp_path, datasets, method):
    ref = _pdb_models(datasets, tmp_path / "models", 34)
    script = tmp_path / "probe.py"
    script.write_text(PROBE.format(heavy=HEAVY))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "models"), str(ref), method], env=ENV,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["n_ok"] == 34 and out["heavy"] == 0.0
    for k in ("list_s", "setup_s", "pool_start_s", "warmup_s", "wait_s", "compute_s", "pool_shutdown_s", "write_s"):
        assert out["stats"].get(k, -1) >= 0, k


def test_workers_parse_while_the_job_warms_up(tmp_path):
    n = 40  # more than the usual look-ahead of 2 workers (3 chunks of 5 each): only a deeper one fills it
    _write_numbers(tmp_path / "in", n)
    (tmp_path / "marks").mkdir()
    job = WaitingWarmUpJob(str(tmp_path / "marks"), n)
    assert local.warmup_prefetch([(i, str(p)) for i, p in enumerate(sorted((tmp_path / "in").iterdir()))], 30) == n
    s = batch.run(tmp_path / "in", job, pool="process", jobs=2, quiet=True)
    assert s.n_ok == n and job.seen_in_warm_up == n
    assert [r["name"] for r in s.rows] == sorted(os.listdir(tmp_path / "in"))
    main = ("list_s", "setup_s", "pool_start_s", "warmup_s", "submit_s", "wait_s", "compute_s", "pool_shutdown_s")
    assert all(s.stats.get(k, 0.0) >= 0 for k in main)
    assert sum(s.stats.get(k, 0.0) for k in main) <= s.elapsed_s * 1.01 + 1e-3


def test_warm_up_prefetch_is_bounded_by_file_bytes(tmp_path, monkeypatch):
    paths = [(i, str(p)) for i, p in enumerate(_write_numbers(tmp_path / "in", 20))]
    monkeypatch.setenv("PROTGPU_BATCH_PREFETCH_MB", str(5 * 4 / 2**20))  # room for ~5 files of ~4 bytes
    assert 4 <= local.warmup_prefetch(paths, 2) <= 7
    assert local.warmup_prefetch(paths, 12) == 12  # never below the usual look-ahead
    monkeypatch.setenv("PROTGPU_BATCH_PREFETCH_MB", "nonsense")
    assert local.warmup_prefetch(paths, 2) == 20


def test_results_equal_across_start_methods_and_pools(tmp_path):
    _write_numbers(tmp_path / "in", 36)
    want = batch.run(tmp_path / "in", NumbersJob(), pool="inline", quiet=True).rows
    for method in ("fork", "forkserver"):
        s = batch.run(tmp_path / "in", NumbersJob(), pool="process", jobs=2, start_method=method, quiet=True)
        assert s.rows == want, method


# --------------------------------------------------------------------------------------------------
# Progress display and the CLI process


def test_progress_bar_starts_no_thread():
    import io

    n0 = threading.active_count()
    stream = io.StringIO()
    bar = BatchProgress(3, description="x", stream=stream, tty=True)
    assert threading.active_count() == n0
    for _ in range(3):
        bar.advance()
    bar.close()
    assert "3/3" in stream.getvalue()


def test_cli_stats_json_and_fast_exit(tmp_path, datasets):
    ref = _pdb_models(datasets, tmp_path / "models", 33)
    stats = tmp_path / "stats.json"
    base = [sys.executable, "-m", "protgpu.cli", "score", str(tmp_path / "models"), "--ref", str(ref), "-m", "tm,lddt",
            "-j", "2", "-q"]
    t0 = time.time()
    r = subprocess.run([*base, "-o", str(tmp_path / "a.csv")], env={**ENV, "PROTGPU_STATS_JSON": str(stats)},
                       capture_output=True, text=True, timeout=300)
    t1 = time.time()
    assert r.returncode == 0 and r.stderr == "", r.stderr
    rec = json.loads(stats.read_text())
    assert rec["command"] == "score" and rec["n_inputs"] == 33
    stamps = rec["stamps"]
    order = [k for k in ("process_start", "main", "listed", "job", "run", "run_done", "end") if k in stamps]
    assert order[1:] == ["main", "listed", "job", "run", "run_done", "end"]
    assert all(stamps[a] <= stamps[b] + 0.02 for a, b in zip(order[:-1], order[1:], strict=True))
    assert t0 - 0.05 <= stamps[order[0]] and stamps["end"] <= t1
    assert abs(sum(rec["steps_s"].values()) - (stamps["end"] - stamps[order[0]])) < 1e-6
    for k in ("list_s", "setup_s", "pool_start_s", "warmup_s", "compute_s", "pool_shutdown_s", "write_s"):
        assert rec["stats"].get(k, -1) >= 0, k
    # the interpreter's teardown is skipped or not: the same output, rows on stdout complete
    r2 = subprocess.run([*base, "-o", str(tmp_path / "b.csv")], env={**ENV, "PROTGPU_FAST_EXIT": "0"},
                        capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0 and (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    r3 = subprocess.run(base, env=ENV, capture_output=True, text=True, timeout=300)  # the table on a pipe
    lines = r3.stdout.splitlines()
    assert r3.returncode == 0 and lines[0] == "model\ttm\tn_aligned\tlddt" and len(lines) == 34
    assert [ln.split("\t")[0] for ln in lines[1:]] == [f"m{i:02d}.pdb" for i in range(33)]


@pytest.mark.gpu
def test_gpu_cli_forks_before_cuda_and_scores_like_a_forced_gpu(tmp_path, datasets, gpu):
    # --device auto: decided in the warm-up, after the workers were forked; --device gpu: decided at
    # once (CuPy loaded, so the workers come from a forkserver). Same bytes either way.
    ref = _pdb_models(datasets, tmp_path / "models", 40, n_res=60)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROTGPU_STATS_JSON": str(tmp_path / "stats.json")}
    env.pop("PROTGPU_DISABLE_GPU", None)
    base = [sys.executable, "-m", "protgpu.cli", "score", str(tmp_path / "models"), "--ref", str(ref), "-j", "2"]
    r = subprocess.run([*base, "-o", str(tmp_path / "auto.csv")], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "on the GPU" in r.stderr, r.stderr
    assert json.loads((tmp_path / "stats.json").read_text())["stats"]["warmup_s"] > 0
    r = subprocess.run([*base, "--device", "gpu", "-o", str(tmp_path / "gpu.csv")], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "auto.csv").read_bytes() == (tmp_path / "gpu.csv").read_bytes()


# --------------------------------------------------------------------------------------------------
# distances, contacts and rmsd decide --device auto in their warm-up, like score


def _device_job(kind: str, ref: Path, device: str):
    from protgpu.batch import ContactsJob, RmsdJob
    from protgpu.io import load

    if kind == "distances":
        return batch.DistancesJob(select="name CA", summary=True, device=device)
    if kind == "contacts":
        return ContactsJob(scheme="ca", cutoff=8.0, device=device)
    return RmsdJob(load(ref), reference_name=str(ref), fit="name CA", device=device)


def _outputs(job, folder: Path, **kw) -> tuple[dict, dict]:
    """Each input's rows (without the contacts row's timing) and arrays, by file name."""
    got: dict = {}
    s = batch.run(folder, job, quiet=True, on_result=lambda r: got.__setitem__(os.path.basename(r.input), r), **kw)
    assert s.n_failed == 0 and s.n_ok == len(got)
    rows = {k: [{c: v for c, v in row.items() if c != "seconds"} for row in r.rows] for k, r in got.items()}
    return rows, {k: r.arrays for k, r in got.items()}


@pytest.fixture
def device_events(monkeypatch):
    """In order: ("pool", kind, start method) when a parse pool is handed a task, ("decide",) when a
    device is decided (the step that imports CuPy on a GPU machine). The recorder answers "no GPU", so
    "auto" gives the CPU here and on a GPU machine alike."""
    from protgpu import _array

    events: list = []

    def no_gpu() -> bool:
        events.append(("decide",))
        return False

    monkeypatch.setattr(_array, "gpu_available", no_gpu)
    monkeypatch.setattr(_array, "_gpu_reason", "none in this test")
    submit = local.Parser.submit

    def recording_submit(self, chunk):
        events.append(("pool", self.kind, self.start_method))
        return submit(self, chunk)

    monkeypatch.setattr(local.Parser, "submit", recording_submit)
    return events


@pytest.mark.parametrize("kind", ["distances", "contacts", "rmsd"])
def test_job_decides_auto_after_the_pool_started(tmp_path, datasets, device_events, kind):
    ref = _pdb_models(datasets, tmp_path / "models", 34)
    job = _device_job(kind, ref, "auto")
    assert device_events == []  # building the job decides nothing
    got = _outputs(job, tmp_path / "models", pool="process", jobs=2)
    assert device_events[0][:2] == ("pool", "process") and ("decide",) in device_events
    first = device_events.index(("decide",))
    assert all(e[0] == "pool" for e in device_events[:first]), device_events
    # the pool was started (workers forked when safe) before the warm-up decided: same results as the CPU's
    n = len(device_events)
    want = _outputs(_device_job(kind, ref, "cpu"), tmp_path / "models", pool="inline")
    assert device_events[n:] == []  # an explicit CPU decides nothing
    assert got[0] == want[0] and len(got[0]) == 34
    for name, arrays in want[1].items():
        assert arrays.keys() == got[1][name].keys()
        for key, a in arrays.items():
            np.testing.assert_array_equal(got[1][name][key], a)


@pytest.mark.parametrize("kind", ["distances", "contacts", "rmsd"])
def test_cli_decides_auto_after_the_pool_started(tmp_path, datasets, device_events, capsys, kind):
    from protgpu.cli import main

    ref = _pdb_models(datasets, tmp_path / "models", 34)
    suffix = ".csv" if kind == "rmsd" else ".npz"
    extra = {"distances": ["-s", "name CA"], "contacts": ["--scheme", "ca", "--cutoff", "8"],
             "rmsd": ["--ref", str(ref), "-s", "name CA"]}[kind]

    def cli(device: str) -> tuple[Path, str]:
        out = tmp_path / f"{device}{suffix}"
        assert main([kind, str(tmp_path / "models"), *extra, "-j", "2", "--device", device, "-o", str(out)]) == 0
        text = capsys.readouterr()
        return out, text.out + text.err

    auto, said = cli("auto")
    first = device_events.index(("decide",))
    assert first > 0 and all(e[0] == "pool" for e in device_events[:first]), device_events
    assert "on the CPU" in said
    cpu, _ = cli("cpu")
    if suffix == ".csv":
        assert auto.read_bytes() == cpu.read_bytes()
    else:
        with np.load(auto) as a, np.load(cpu) as c:
            assert a.files == c.files and len(a.files) > 34
            for k in a.files:
                np.testing.assert_array_equal(a[k], c[k])
    # a forced GPU is still checked at once: one line, before any input is parsed, nothing written
    del device_events[:]
    out = tmp_path / f"gpu{suffix}"
    assert main([kind, str(tmp_path / "models"), *extra, "-j", "2", "--device", "gpu", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no GPU is usable" in err and len(err.strip().splitlines()) == 1
    assert device_events == [("decide",)] and not out.exists()


def test_gpu_warm_up_calls_are_well_formed(tmp_path, datasets, monkeypatch):
    # Without a GPU the warm-ups' GPU step never runs: run it here with the jobs' own (CPU) device
    from protgpu import _cuda
    from protgpu.batch.jobs import contacts, distances, rmsd
    from protgpu.io import load

    def always(device, on_gpu=None):
        on_gpu()  # errors not swallowed: they would show here
        return True

    for module in (contacts, distances, rmsd):
        monkeypatch.setattr(module, "warm_device", always)
    loaded = []
    monkeypatch.setattr(_cuda, "get_kernel", lambda *a, **k: loaded.append((a, k)))
    ref = _pdb_models(datasets, tmp_path / "models", 1)
    for kind in ("distances", "contacts", "rmsd"):
        _device_job(kind, ref, "cpu").warm_up()
    assert loaded == [(("contacts", "contact_map_f32"), {})]
    assert "contact_map_f32" in _cuda.entry_points("contacts")
    rmsd.RmsdJob(load(ref), fit="name CA", atoms="name N", device="cpu").warm_up()  # measured atoms apart


def test_warm_device_decides_and_swallows(monkeypatch):
    from protgpu import _array

    calls = []
    assert warm_device("cpu", lambda: calls.append("cpu")) is False and calls == []
    monkeypatch.setattr(_array, "gpu_available", lambda: False)
    monkeypatch.setattr(_array, "_gpu_reason", "none in this test")
    assert warm_device("auto", lambda: calls.append("auto")) is False and calls == []
    assert warm_device("gpu", lambda: calls.append("gpu")) is None and calls == []  # first batch says why
    assert warm_device("tpu") is None
    monkeypatch.setattr(_array, "gpu_available", lambda: True)

    def fails():
        calls.append("failed")
        raise RuntimeError("no kernel")

    assert warm_device("auto", fails) is True and calls == ["failed"]


PROBE_CLI = textwrap.dedent('''
    import json, sys
    from protgpu.batch.local import Parser
    from protgpu.cli import main

    events = []
    submit = Parser.submit

    def recording_submit(self, chunk):
        events.append(["pool", self.start_method, "cupy" in sys.modules])
        return submit(self, chunk)

    Parser.submit = recording_submit
    code = main(sys.argv[1:])
    events.append(["end", None, "cupy" in sys.modules])
    print(json.dumps({"code": code, "events": events}))
''')


def _probe_cli(tmp_path, env, *argv):
    script = tmp_path / "probe_cli.py"
    script.write_text(PROBE_CLI)
    r = subprocess.run([sys.executable, str(script), *map(str, argv)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stdout + r.stderr


@pytest.mark.parametrize("kind", ["distances", "contacts", "rmsd"])
def test_fresh_cli_process_forks_its_parse_workers(tmp_path, datasets, kind):
    ref = _pdb_models(datasets, tmp_path / "models", 34)
    extra = ["--ref", ref] if kind == "rmsd" else []
    out, _ = _probe_cli(tmp_path, {**ENV, "PROTGPU_BATCH_START_METHOD": ""}, kind, tmp_path / "models", *extra,
                        "-s", "name CA", "-j", "2", "-q", "-o", tmp_path / ("o.csv" if kind == "rmsd" else "o.npz"))
    assert out["code"] == 0
    pool = [e for e in out["events"] if e[0] == "pool"]
    assert pool and not pool[0][2]  # no CuPy in the process when its workers started
    if sys.platform.startswith("linux"):
        assert pool[0][1] == "fork"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["distances", "contacts", "rmsd"])
def test_gpu_cli_forks_before_cuda_and_computes_like_a_forced_gpu(tmp_path, datasets, gpu, kind):
    ref = _pdb_models(datasets, tmp_path / "models", 40, n_res=60)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROTGPU_BATCH_START_METHOD": ""}
    env.pop("PROTGPU_DISABLE_GPU", None)
    extra = ["--ref", ref] if kind == "rmsd" else []
    suffix = ".csv" if kind == "rmsd" else ".npz"
    base = [kind, tmp_path / "models", *extra, "-s", "name CA", "-j", "2"]
    out, said = _probe_cli(tmp_path, env, *base, "-o", tmp_path / f"auto{suffix}")
    pool = [e for e in out["events"] if e[0] == "pool"]
    assert out["code"] == 0 and pool and not pool[0][2] and out["events"][-1][2]  # CuPy came after the pool
    if sys.platform.startswith("linux"):
        assert pool[0][1] == "fork"
    r = subprocess.run([sys.executable, "-m", "protgpu.cli", *map(str, base), "--device", "gpu", "-o",
                        str(tmp_path / f"gpu{suffix}")], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "on the GPU" in (said + r.stdout + r.stderr)
    if suffix == ".csv":
        assert (tmp_path / "auto.csv").read_bytes() == (tmp_path / "gpu.csv").read_bytes()
    else:
        with np.load(tmp_path / "auto.npz") as a, np.load(tmp_path / "gpu.npz") as g:
            assert a.files == g.files
            for k in a.files:
                np.testing.assert_array_equal(a[k], g[k])


def test_pairwise_rmsd_decides_auto_after_loading_and_checks_a_forced_gpu_first(tmp_path, capsys, monkeypatch):
    """pairwise-rmsd: --device auto is decided after the inputs are loaded (their workers may fork);
    a forced --device gpu without a GPU is one line before any input is read (the input here does not
    exist, and the message is about the GPU)."""
    import protgpu._array as pa
    from protgpu.cli import main

    monkeypatch.setenv("PROTGPU_DISABLE_GPU", "1")
    assert main(["pairwise-rmsd", str(tmp_path / "missing.pdb"), "--device", "gpu"]) == 2
    err = capsys.readouterr().err
    assert "GPU" in err and "missing.pdb" not in err and len(err.strip().splitlines()) == 1
    events = []
    real = pa.dispatch

    def recording(*a, **k):
        events.append(k.get("device"))
        return real(*a, **k)

    monkeypatch.setattr(pa, "dispatch", recording)
    assert main(["pairwise-rmsd", str(tmp_path / "missing.pdb")]) == 2  # auto: the input fails first
    assert "missing.pdb" in capsys.readouterr().err and "auto" not in events
