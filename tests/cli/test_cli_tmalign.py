"""protgpu align / db build / db info / search: outputs, sorting, filters, exit codes, and bad inputs
(one line, exit 2, no output file)."""

from __future__ import annotations

import csv

import numpy as np
import pytest

import protgpu as pg
from protgpu.cli import main

SMALL = ("d1t3ba2.pdb", "d2nwta1.pdb", "d2a6ca1.pdb", "d1neqa_.pdb")


@pytest.fixture(scope="module")
def files(datasets):
    return [str(datasets / "tmalign" / f) for f in SMALL]


@pytest.fixture(scope="module")
def db(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("db") / "small.pgdb"
    assert main(["db", "build", *files, "--out", str(out), "--quiet"]) == 0
    return out


def _read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_align_prints_tm_aligns_report(files, capsys):
    assert main(["align", files[0], files[1], "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    r = pg.tm_align(files[0], files[1], device="cpu")
    assert f"Length of Chain_1: {r.lengths[0, 0]} residues" in out
    assert f"Aligned length= {r.n_aligned[0]:4d}, RMSD= {r.rmsd[0]:6.2f}" in out
    assert f"TM-score= {r.tm_target[0]:6.5f} (if normalized by length of Chain_2" in out
    assert f"TM-score= {r.tm_mobile[0]:6.5f} (if normalized by length of Chain_1" in out
    lines = out.splitlines()
    k = lines.index("m               t[m]        u[m][0]        u[m][1]        u[m][2]")
    rot = np.array([[float(v) for v in lines[k + 1 + m].split()[2:]] for m in range(3)])
    np.testing.assert_allclose(rot, r.rotation[0], atol=1e-9)
    assert lines[-3:] == [r.mobile_aligned[0], r.match[0], r.target_aligned[0]]


def test_align_table_for_many_pairs(files, tmp_path, capsys):
    out = tmp_path / "all.csv"
    assert main(["align", *files[:3], "--out", str(out), "--device", "cpu"]) == 0
    rows = _read_csv(out)
    assert [(r["mobile"].split(":")[0], r["target"].split(":")[0]) for r in rows] == [
        (SMALL[0], SMALL[1]), (SMALL[0], SMALL[2]), (SMALL[1], SMALL[2])]
    r = pg.tm_align(files[1], files[2], device="cpu")
    assert float(rows[2]["tm_target"]) == pytest.approx(float(r.tm_target[0]), abs=1e-12)
    out2 = tmp_path / "t.csv"
    assert main(["align", *files[:2], "--target", files[3], "-o", str(out2), "--device", "cpu"]) == 0
    assert [r["target"].split(":")[0] for r in _read_csv(out2)] == [SMALL[3]] * 2


def test_db_info(db, capsys):
    assert main(["db", "info", str(db), "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{db}: 4 chains, ") and len(out) == 5
    assert out[1].startswith(SMALL[0] + ":")


def test_search_sorted_filtered_top(files, db, tmp_path):
    out = tmp_path / "hits.csv"
    assert main(["search", files[0], "--db", str(db), "--out", str(out), "--device", "cpu", "-q"]) == 0
    rows = _read_csv(out)
    assert list(rows[0]) == ["query", "target", "tm_query", "tm_target", "rmsd", "n_aligned", "seq_identity"]
    tmq = [float(r["tm_query"]) for r in rows]
    assert len(rows) == 4 and tmq == sorted(tmq, reverse=True)
    assert rows[0]["target"] == rows[0]["query"] and tmq[0] == pytest.approx(1.0)
    ref = pg.tm_align(files[0], files, device="cpu")
    by_target = {r["target"].split(":")[0]: r for r in rows}
    for k, f in enumerate(SMALL):
        assert float(by_target[f]["tm_query"]) == pytest.approx(float(ref.tm_mobile[k]), abs=1e-12)
        assert float(by_target[f]["tm_target"]) == pytest.approx(float(ref.tm_target[k]), abs=1e-12)
    out2 = tmp_path / "top.csv"
    assert main(["search", files[0], files[1], "--db", str(db), "--top", "2", "--min-tm", "0.3",
                 "-o", str(out2), "--device", "cpu", "-q"]) == 0
    rows2 = _read_csv(out2)
    assert all(float(r["tm_query"]) >= 0.3 for r in rows2)
    queries = [r["query"].split(":")[0] for r in rows2]
    assert queries.count(SMALL[0]) <= 2 and queries.count(SMALL[1]) <= 2
    assert rows2[0]["tm_query"] == rows[0]["tm_query"]


def test_search_parquet(files, db, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "hits.parquet"
    assert main(["search", files[2], "--db", str(db), "--top", "1", "-o", str(out), "--device", "cpu", "-q"]) == 0
    t = pq.read_table(out).to_pylist()
    assert len(t) == 1 and t[0]["target"] == t[0]["query"]


@pytest.mark.parametrize("argv, words", [
    (["align", "{nope}", "{f0}"], "nope.pdb"),
    (["align", "{f0}"], "give two inputs"),
    (["align", "{f0}", "{f1}", "--out", "{tmp}/x.txt"], "use a .csv"),
    (["align", "{f0}", "{bad}"], "bad.pdb"),
    (["search", "{f0}", "--db", "{f0}", "--out", "{tmp}/h.csv"], "not a valid protgpu structure database"),
    (["search", "{f0}", "--db", "{db}", "--top", "0", "--out", "{tmp}/h.csv"], "top must be a positive integer"),
    (["search", "{bad}", "--db", "{db}", "--out", "{tmp}/h.csv"], "bad.pdb"),
    (["db", "build", "{f0}", "{bad}", "--out", "{tmp}/d.pgdb"], "bad.pdb"),
    (["db", "build", "{f0}", "--out", "{tmp}/d.npz"], "use a .pgdb"),
    (["db", "info", "{tmp}/none.pgdb"], "no such database file"),
])
def test_bad_inputs_one_line_exit_2_no_output(argv, words, files, db, tmp_path, capsys):
    bad = tmp_path / "bad.pdb"
    bad.write_text("ATOM      1  CA  ALA A   1       0.000   0.000   0.000  1.00  0.00           C\nEND\n")
    subs = {"f0": files[0], "f1": files[1], "db": str(db), "tmp": str(tmp_path), "bad": str(bad),
            "nope": str(tmp_path / "nope.pdb")}
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main([a.format(**subs) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no partial output


def test_help_says_first_protein_chain(capsys):
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    assert "first protein chain" in capsys.readouterr().out
