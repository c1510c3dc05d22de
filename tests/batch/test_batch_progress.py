"""Progress inside one long input (issue 16, section 3): ``protgpu contacts`` and ``protgpu rmsd`` over a
single 1,960-frame trajectory advance their progress by pieces of frames while the input computes, with
rate and ETA from the work done, and off a terminal log a line at the interval; the pieces change no
value."""

from __future__ import annotations

import re

import numpy as np
import pytest

from protgpu.batch.job import frame_slices, progress_sink
from protgpu.batch.jobs import ContactsJob, RmsdJob
from protgpu.cli import main
from protgpu.io import load


@pytest.fixture(scope="module")
def traj(datasets):
    return load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb")


@pytest.fixture(scope="module")
def long_dcd(long_ca_dcd):
    """The 1,960-frame CA trajectory and its topology (tests/batch/conftest.py)."""
    return long_ca_dcd


def test_frame_slices():
    assert frame_slices(1, 20, 16) == [slice(0, 1)]
    assert frame_slices(1960, 20, 16) == [slice(f, min(1960, f + 98)) for f in range(0, 1960, 98)]
    assert frame_slices(100, 20, 16)[-1] == slice(96, 100) and len(frame_slices(100, 20, 16)) == 7
    assert frame_slices(0, 20, 16) == [slice(0, 0)]


def _compute(job, item):
    seen: list = []
    with progress_sink(seen.append):
        out = job.compute([item])[0]
    return out, seen


@pytest.mark.parametrize("kw", [{}, {"frequency": True}, {"scheme": "ca", "residues": "resid 1-60"}])
def test_contacts_in_pieces_of_frames_equal_the_whole(traj, kw):
    s = traj.frames(slice(0, 30))
    job = ContactsJob(device="cpu", **kw)
    job.progress_chunks = 1  # one piece: the whole call
    whole, seen_whole = _compute(job, ("t", s))
    job.progress_chunks, job.progress_min_frames = 4, 1
    pieces, seen = _compute(job, ("t", s))
    assert seen_whole == [1.0] and seen == [8 / 30, 16 / 30, 24 / 30, 1.0, 1.0]
    assert whole.arrays.keys() == pieces.arrays.keys()
    for k, a in whole.arrays.items():
        b = pieces.arrays[k]
        assert a.dtype == b.dtype and np.array_equal(a, b), k  # bit for bit, frequency included
    w, p = dict(whole.rows[0]), dict(pieces.rows[0])
    w.pop("seconds"), p.pop("seconds")
    assert w == p


def test_rmsd_in_pieces_of_frames_equal_the_whole(traj):
    ref = traj.frames(0)
    job = RmsdJob(ref, device="cpu", fit="ca")
    ca = traj.select_indices("ca")
    item = {"path": "t", "coords": np.ascontiguousarray(traj.coords[:, ca]), "structure": None}
    whole, seen_whole = _compute(job, item)
    job.progress_chunks, job.progress_min_frames = 5, 1
    pieces, seen = _compute(job, item)
    assert seen_whole[0] == 1.0 and len(seen) == 6 and seen == sorted(seen) and seen[0] < 0.25
    assert [r["rmsd_angstrom"] for r in whole] == [r["rmsd_angstrom"] for r in pieces]


def _progress_lines(err: str, name: str) -> list[tuple[float, str]]:
    out = []
    for ln in err.splitlines():
        m = re.match(rf"{name}: ([0-9.]+)/1 inputs .* files/s, ETA (\S+)$", ln)
        if m:
            out.append((float(m.group(1)), m.group(2)))
    return out


@pytest.mark.parametrize("cmd", ["contacts", "rmsd"])
def test_one_long_trajectory_logs_progress_while_it_computes(long_dcd, tmp_path, monkeypatch, capsys, cmd):
    traj, top = long_dcd
    monkeypatch.setenv("PROTGPU_PROGRESS_INTERVAL", "0.001")  # a log line at every piece of frames
    # (--frequency: 1,960 dense maps would make a 450 MB .npz, whose writing is not what is tested)
    extra = ["--scheme", "ca", "--frequency"] if cmd == "contacts" else ["--ref", str(top)]
    out = tmp_path / ("c.npz" if cmd == "contacts" else "r.csv")
    assert main([cmd, str(traj), "--top", str(top), *extra, "--device", "cpu", "-o", str(out)]) == 0
    lines = _progress_lines(capsys.readouterr().err, cmd)
    done = [n for n, _ in lines]
    # several lines inside the one input (between 0 and 1 inputs), counting up, each with an ETA
    assert sum(0 < n < 1 for n in done) >= 3 and done == sorted(done), lines
    assert all(re.fullmatch(r"\d+:\d\d:\d\d", eta) for _, eta in lines)
