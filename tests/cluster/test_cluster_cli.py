"""``protgpu cluster``: the table, the representatives, the plots, and one-line errors with exit 2."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

import protgpu as pg
from protgpu.cli import main
from protgpu.cluster import gromos

ROOT = Path(__file__).resolve().parents[2]
DATA = str(ROOT / "datasets/adk_dims.dcd")
TOP = str(ROOT / "datasets/adk_open.pdb")


def test_cluster_gromos_table_and_representatives(tmp_path, capsys):
    out, reps = tmp_path / "c.csv", tmp_path / "reps.pdb"
    rc = main(["cluster", DATA, "--top", TOP, "--select", "ca", "--cutoff", "2.0", "--out", str(out),
               "--representatives", str(reps)])
    assert rc == 0
    rows = list(csv.DictReader(out.open()))
    traj = pg.load(DATA, top=TOP).select("ca")
    d = pg.pairwise_rmsd(traj, out=np.empty((traj.n_frames,) * 2), device="cpu")
    labels, centres = gromos.gromos_numpy(d, 2.0)
    assert [int(r["cluster"]) for r in rows] == labels.tolist()
    assert [int(r["frame"]) for r in rows] == list(range(traj.n_frames))
    assert [i for i, r in enumerate(rows) if r["representative"] == "True"] == sorted(centres.tolist())
    r = pg.load(str(reps))
    assert r.n_frames == len(centres) and r.n_atoms == traj.n_atoms
    np.testing.assert_allclose(r.coords, traj.coords[centres], atol=1e-3)
    assert "clusters (gromos" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.csv", "reps.pdb"]


def test_cluster_two_inputs_one_clustering(tmp_path):
    import shutil

    out, second = tmp_path / "c.jsonl", tmp_path / "second.dcd"
    shutil.copy(DATA, second)
    rc = main(["cluster", DATA, str(second), "--top", TOP, "-s", "ca", "--method", "kmedoids", "--k", "3",
               "-o", str(out), "-q"])
    assert rc == 0
    import json

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 196 and rows[98]["input"] == str(second) and rows[98]["frame"] == 0  # one clustering
    # The same frames in both inputs: each frame and its copy are in the same cluster.
    assert [r["cluster"] for r in rows[:98]] == [r["cluster"] for r in rows[98:]]


def test_cluster_plots(tmp_path):
    pytest.importorskip("matplotlib")
    for method, extra, name in (("gromos", ["--cutoff", "2"], "g.png"),
                                ("hierarchical", ["--k", "4", "--linkage", "single"], "h.svg")):
        rc = main(["cluster", DATA, "-t", TOP, "-s", "ca", "--method", method, *extra, "--plot",
                   str(tmp_path / name), "-o", str(tmp_path / f"{name}.csv"), "-q"])
        assert rc == 0 and (tmp_path / name).stat().st_size > 0


@pytest.mark.parametrize("argv, match", [
    (["--cutoff", "0"], "cutoff 0.0: must be a positive"),
    (["--method", "kmedoids", "--k", "500"], "k=500: more clusters than the 98 frames"),
    (["--method", "kmedoids"], "k-medoids needs k="),
    ([], "GROMOS clustering needs cutoff"),
    (["--cutoff", "2", "--out", "x.npy"], "use a file name ending in .csv"),
    (["--cutoff", "2", "--representatives", "r.txt"], "--representatives r.txt: use a file name ending in"),
])
def test_cluster_bad_input_exit_2(tmp_path, capsys, monkeypatch, argv, match):
    monkeypatch.chdir(tmp_path)
    rc = main(["cluster", DATA, "-t", TOP, "-s", "ca", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and match in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_cluster_one_frame_exit_2(tmp_path, capsys):
    rc = main(["cluster", TOP, "--cutoff", "2", "-o", str(tmp_path / "c.csv")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "at least 2 frames, got 1" in err
    assert list(tmp_path.iterdir()) == []


def test_cluster_metric_tm(tmp_path):
    frames = pg.load(DATA, top=TOP).frames(np.arange(0, 98, 10))
    src, out = tmp_path / "ten.pdb", tmp_path / "c.csv"
    pg.save(frames, str(src))
    assert main(["cluster", str(src), "--select", "ca", "--metric", "tm", "--cutoff", "0.05", "--out", str(out)]) == 0
    want = pg.cluster(frames.select("ca").coords, metric="tm", cutoff=0.05, device="cpu")
    assert [int(r["cluster"]) for r in csv.DictReader(out.open())] == want.labels.tolist()
    assert len(want.sizes) > 1


def test_cluster_metric_tm_needs_ca(tmp_path, capsys):
    out = tmp_path / "c.csv"
    assert main(["cluster", DATA, "--top", TOP, "--metric", "tm", "--cutoff", "0.1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--select ca" in err[0] and not out.exists()
