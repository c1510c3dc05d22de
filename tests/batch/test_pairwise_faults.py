"""``protgpu pairwise-rmsd`` under faults: killed with SIGKILL at chosen and at random moments (inside the
tile loop, just before and just after each rename), then run again; and a real full disk (a file size
limit, ``RLIMIT_FSIZE``, so that writes fail with EFBIG as on a full filesystem).

pairwise-rmsd writes one matrix, not a journal of inputs, so it has no ``--resume``: a killed run is
run again from the start. What a kill may never do: leave a temporary file behind after the next
successful run, change an older output before the new one is complete, or make the next run's matrix
differ in one byte.
"""

from __future__ import annotations

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

try:
    import zarr
except ImportError:  # pragma: no cover
    zarr = None

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PROTGPU_DISABLE_GPU": "1", "PYTHONPATH": str(REPO)}

# Runs protgpu's CLI with one fault planted by KILL_AT: "tile:K" (SIGKILL when the K-th CPU tile starts),
# "rename:K" (just before the K-th os.replace), "renamed:K" (just after it).
_DRIVER = r"""
import os, signal, sys
where, k = os.environ["KILL_AT"].split(":")
k = int(k)
count = {"tile": 0, "rename": 0}

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if where == "tile":
    from protgpu.superpose import pairwise_cpu
    real_tile = pairwise_cpu.qcp_tile_start

    def tile(*a, **kw):
        count["tile"] += 1
        if count["tile"] == k:
            die()
        return real_tile(*a, **kw)
    pairwise_cpu.qcp_tile_start = tile
else:
    real_replace = os.replace

    def replace(src, dst, *a, **kw):
        count["rename"] += 1
        if where == "rename" and count["rename"] == k:
            die()
        real_replace(src, dst, *a, **kw)
        if where == "renamed" and count["rename"] == k:
            die()
    os.replace = replace
from protgpu.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def long_traj(long_ca_dcd):
    """The 1,960-frame CA trajectory and its topology (tests/batch/conftest.py)."""
    return long_ca_dcd


def _args(long_traj, out, *extra):
    traj, top = long_traj
    return ["pairwise-rmsd", str(traj), "--top", str(top), "--device", "cpu", "-q", "-o", str(out), *extra]


def _run(argv, kill_at=None, **kw):
    if kill_at is None:
        cmd = [sys.executable, "-m", "protgpu.cli", *argv]
        env = ENV
    else:
        cmd = [sys.executable, "-c", _DRIVER, *argv]
        env = {**ENV, "KILL_AT": kill_at}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, **kw)


def _manifest(out) -> list:
    """The run record without its time stamp."""
    lines = [json.loads(ln) for ln in Path(f"{out}.manifest.jsonl").read_text().splitlines()]
    lines[0].pop("created")
    return lines


def _read(out):
    if str(out).endswith(".zarr"):
        return zarr.open_array(str(out), mode="r")[:]
    return Path(out).read_bytes()


def _same(a, b) -> bool:
    return np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b


@pytest.fixture(scope="module")
def reference(long_traj, tmp_path_factory):
    """The uninterrupted runs' outputs and records, by suffix; and an older, different output
    (frames 0-97 only) that a killed run must leave as it was."""
    ref, old = {}, {}
    d = tmp_path_factory.mktemp("reference")
    short = d / "short.dcd"
    import mdtraj as md

    md.load(str(long_traj[0]), top=str(long_traj[1]))[:98].save_dcd(str(short))
    for suffix in (".npy", ".npz", ".zarr"):
        if suffix == ".zarr" and zarr is None:
            continue
        out = d / f"full{suffix}"
        r = _run(_args(long_traj, out))
        assert r.returncode == 0, r.stderr
        ref[suffix] = (_read(out), _manifest(out))
        o = d / f"old{suffix}"
        assert _run(_args((short, long_traj[1]), o)).returncode == 0
        old[suffix] = _read(o)
    return ref, old, short


def _old_output(reference, long_traj, out, suffix):
    short = reference[2]
    r = _run(_args((short, long_traj[1]), out))
    assert r.returncode == 0, r.stderr


def _check_rerun(reference, long_traj, out, suffix):
    r = _run(_args(long_traj, out))
    assert r.returncode == 0, r.stderr
    data, record = reference[0][suffix]
    assert _same(_read(out), data)
    assert _manifest(out) == record
    # only the output and its record: no temporary file or folder, no journal
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([out.name, f"{out.name}.manifest.jsonl"])


# (suffix, where to kill, whether the old output must still be there whole: killed before the new one took the name)
KILLS = [
    (".npy", "tile:8", True), (".npy", "rename:1", True),
    (".npy", "renamed:1", False), (".npy", "rename:2", False),  # the 2nd rename: the record
    (".npz", "tile:8", True), (".npz", "rename:1", True),
    # a store replacing an old one takes two renames: the old store aside, then the new one in
    (".zarr", "tile:8", True), (".zarr", "rename:1", True), (".zarr", "rename:2", False),
    (".zarr", "renamed:2", False),
]


@pytest.mark.parametrize("suffix,kill_at,old_intact", KILLS)
def test_kill_at_a_chosen_moment_then_rerun_gives_identical_output(tmp_path, long_traj, reference, suffix, kill_at,
                                                                   old_intact):
    if suffix == ".zarr" and zarr is None:
        pytest.skip("zarr is not installed")
    out = tmp_path / f"m{suffix}"
    _old_output(reference, long_traj, out, suffix)
    r = _run(_args(long_traj, out), kill_at=kill_at)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    if old_intact:
        assert _same(_read(out), reference[1][suffix])
    _check_rerun(reference, long_traj, out, suffix)


def test_kill_at_random_moments_then_rerun_gives_identical_output(tmp_path, long_traj, reference):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    out = tmp_path / "m.npy"
    t0 = time.perf_counter()
    assert _run(_args(long_traj, out)).returncode == 0
    took = time.perf_counter() - t0
    moments = []
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-m", "protgpu.cli", *_args(long_traj, out)], env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        moments.append(round(took * rng.uniform(0.3, 1.0), 3))
        time.sleep(moments[-1])
        p.send_signal(signal.SIGKILL)
        p.wait()
        # whenever it died, the output is a whole matrix: the earlier run's or (killed after the rename) its own
        assert _same(_read(out), reference[0][".npy"][0]), f"seed {seed}, kills at {moments} s"
    _check_rerun(reference, long_traj, out, ".npy")


# --------------------------------------------------------------------------------------------------
# A real full disk: RLIMIT_FSIZE makes every write past the limit fail with EFBIG, as a full filesystem
# fails with ENOSPC (SIGXFSZ, which would kill the process instead, is ignored as a batch system may).

_FSIZE_DRIVER = r"""
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from protgpu.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs POSIX file size limits")
@pytest.mark.parametrize("suffix", [".npy", ".npz", ".zarr"])
def test_full_disk_is_one_line_and_leaves_the_old_output(tmp_path, long_traj, reference, suffix):
    if suffix == ".zarr" and zarr is None:
        pytest.skip("zarr is not installed")
    out = tmp_path / f"m{suffix}"
    _old_output(reference, long_traj, out, suffix)
    before = sorted(p.name for p in tmp_path.iterdir())
    # 20 kB: more than a run record, less than any file of the new matrix (15 MB as .npy; 0.78 MB as .npz
    # and 40 kB per .zarr chunk, 20 repeats compressing well)
    limit = 20_000
    r = subprocess.run([sys.executable, "-c", _FSIZE_DRIVER, str(limit), *_args(long_traj, out)], env=ENV,
                       capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert "cannot write" in lines[0] and str(out) in lines[0] and "Traceback" not in r.stderr
    assert _same(_read(out), reference[1][suffix])
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing left behind
    _check_rerun(reference, long_traj, out, suffix)


def test_a_second_run_on_the_same_out_stops_at_once(long_traj, tmp_path):
    # a run holding the output's lock (here: this process) makes a second run fail in one line, before
    # it removes or writes anything of OUT's
    from protgpu.batch.journal import OutputLock

    out = tmp_path / "m.npy"
    stale = tmp_path / ".m.npy.abcd1234.tmp.npy"  # what the first run is writing, as the cleanup sees it
    stale.write_bytes(b"in progress")
    lock = OutputLock(out)
    lock.acquire()
    try:
        r = _run(_args(long_traj, out))
    finally:
        lock.release()
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "another protgpu run is writing this output" in r.stderr
    assert stale.read_bytes() == b"in progress" and not out.exists()
