"""protgpu evaluate (one row per design through the batch engine) and score_complex's batching: models of
one atom table scored together give the numbers of one-by-one scoring."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest

import protgpu as pg
from protgpu.complexes.evaluate import confidence_file
from protgpu.errors import InputError


def _cli(argv):
    import argparse

    from protgpu.cli import _common_parsers
    from protgpu.commands import evaluate as cmd

    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers(dest="command"), _common_parsers())
    args = parser.parse_args(["evaluate", *map(str, argv)])
    return args.func(args)


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def perturbed(eud):
    """Three noisy copies of the 1eud model (one atom table): (M, N, 3) coordinates and the Structure."""
    m = pg.load(eud[0])
    rng = np.random.default_rng(7)
    xs = m.coords[0][None] + rng.normal(scale=0.6, size=(3, m.n_atoms, 3)).astype(np.float32)
    return pg.Structure(xs, m.atoms, source="noisy")


def test_batched_equals_one_by_one(eud, perturbed):
    """One batched call per metric over the stacked models == scoring each model alone (CPU)."""
    whole = pg.score_complex(perturbed, eud[1], device="cpu")
    for k in range(perturbed.n_frames):
        one = pg.score_complex(perturbed.frames(k), eud[1], device="cpu")
        for col in (*pg.complexes.METRICS, "fnat", "irmsd", "lrmsd", "fnonnat", "nmdl"):
            np.testing.assert_allclose(whole[col][k], one[col][0], rtol=0, atol=1e-12, err_msg=col)
    # and the noise did move the scores: the batch is not three copies of one result (0.6 A noise
    # breaks every residue's stereochemistry: lddt is 0, bb_lddt is not stereochecked; the stereochecked
    # lddt of a batch: test_stereo.py)
    assert np.ptp(whole["lrmsd"][:, 0]) > 0 and np.ptp(whole["bb_lddt"]) > 0


def test_evaluate_with_reference(tmp_path, eud):
    out = tmp_path / "designs.csv"
    assert _cli([eud[0], eud[1], "--ref", eud[1], "--out", out, "-q", "--jobs", "1"]) == 0
    rows = _rows(out)
    assert [r["model"] for r in rows] == ["1eud_mdl_partial-dimer.pdb", "1eud_ref.pdb"]
    want = pg.score_complex(eud[0], eud[1], device="cpu")
    r = rows[0]
    assert float(r["dockq"]) == pytest.approx(want["dockq"][0], abs=1e-12)
    assert round(float(r["dockq:AB"]), 3) == 0.559 and round(float(r["lrmsd:AB"]), 3) == 5.533
    assert round(float(r["irmsd:AB"]), 3) == 0.988 and int(float(r["nnat:AB"])) == 140
    assert r["chain_mapping"] == "A:A,B:B"
    assert int(r["n_chains"]) == 2 and int(r["clashes"]) == 0 and r["chain_residues"] == "B:241,A:290"
    assert float(rows[1]["lddt"]) == 1.0 and float(rows[1]["irmsd:AB"]) < 1e-6  # the reference itself


def test_evaluate_tm_mode_and_stereochecks(tmp_path, eud):
    """--tm-mode usalign gives OpenStructure's complex TM-score (0.711 on 1eud, the mapped search 0.712);
    --no-stereochecks gives lDDT without them (0.538, with them 0.539)."""
    runs = {}
    for name, extra in (("default", []), ("usalign", ["--tm-mode", "usalign", "--no-stereochecks"])):
        out = tmp_path / f"{name}.csv"
        assert _cli([eud[0], "--ref", eud[1], "--out", out, "-q", "--jobs", "1", *extra]) == 0
        runs[name] = _rows(out)[0]
    assert round(float(runs["default"]["tm_score"]), 3) == 0.712
    assert round(float(runs["default"]["lddt"]), 3) == 0.539
    assert round(float(runs["usalign"]["tm_score"]), 3) == 0.711
    assert round(float(runs["usalign"]["lddt"]), 3) == 0.538
    # the other columns do not depend on the options
    assert runs["usalign"]["dockq"] == runs["default"]["dockq"] and runs["usalign"]["gdtts"] == runs["default"]["gdtts"]


def test_evaluate_without_reference_reads_colabfold_confidence(tmp_path, eud):
    """No --ref: confidence and sanity only; --confidence auto finds the ColabFold scores JSON next to
    the model (pLDDT, PAE, pTM, ipTM) and derives ipSAE, pDockQ, pDockQ2 and LIS from it."""
    model = tmp_path / "bind_unrelaxed_rank_001_model_1.pdb"
    shutil.copy(eud[0], model)
    n = pg.load(model).n_residues
    rng = np.random.default_rng(0)
    pae = rng.uniform(2, 25, size=(n, n)).round(2)
    (tmp_path / "bind_scores_rank_001_model_1.json").write_text(json.dumps(
        {"plddt": [80.0] * n, "pae": pae.tolist(), "ptm": 0.71, "iptm": 0.64}))
    assert confidence_file(model) == tmp_path / "bind_scores_rank_001_model_1.json"
    out = tmp_path / "c.jsonl"
    assert _cli([model, "--out", out, "-q"]) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert "lddt" not in row and "dockq" not in row
    assert row["confidence_format"] == "colabfold" and row["ptm"] == 0.71 and row["iptm"] == 0.64
    assert row["plddt_mean"] == pytest.approx(80.0)
    for c in ("ipsae", "pdockq", "pdockq2", "lis"):
        assert np.isfinite(row[c]) and 0 <= row[c] <= 1, c
    assert row["n_chains"] == 2 and row["radius_of_gyration"] > 10
    # none: the confidence columns stay empty
    assert _cli([model, "--out", tmp_path / "n.jsonl", "-q", "--confidence", "none"]) == 0
    assert json.loads((tmp_path / "n.jsonl").read_text())["ptm"] is None


def test_confidence_file_names(tmp_path):
    for struct, conf in (("fold_x_model_0.cif", "fold_x_summary_confidences_0.json"),
                         ("b_model_2.cif", "confidence_b_model_2.json"),
                         ("pred.model_idx_3.cif", "scores.model_idx_3.npz")):
        (tmp_path / conf).write_text("{}")
        assert confidence_file(tmp_path / struct) == tmp_path / conf
    assert confidence_file(tmp_path / "design_7.pdb") is None


def test_evaluate_unmappable_design(tmp_path, eud, datasets, capsys):
    """A design whose chains map to no reference chain: one line naming the file and the chains; exit 2
    and no output; with --keep-going the other designs are written and the failure recorded."""
    bad = datasets / "adk_open.pdb"
    out = tmp_path / "d.csv"
    with pytest.raises(InputError) as exc:
        _cli([eud[0], bad, "--ref", eud[1], "--out", out, "-q", "--jobs", "1"])
    msg = str(exc.value)
    assert "adk_open.pdb" in msg and "'4AKE'" in msg and "['A', 'B']" in msg and "\n" not in msg
    assert not out.exists()
    out2 = tmp_path / "k.csv"
    assert _cli([eud[0], bad, "--ref", eud[1], "--out", out2, "-q", "-k", "--jobs", "1"]) == 1
    assert [r["model"] for r in _rows(out2)] == ["openstructure/1eud_mdl_partial-dimer.pdb"]
    errors = (tmp_path / "k.csv.errors.tsv").read_text()
    assert "adk_open.pdb" in errors and "no model chain maps" in errors


def test_evaluate_shards_and_resume(tmp_path, eud):
    """Shards split the designs; a resumed run with the journal present gives the same table."""
    out = tmp_path / "s.csv"
    for i in range(2):
        assert _cli([eud[0], eud[1], "--ref", eud[1], "--out", out, "-q", "--shard", f"{i}/2", "--jobs", "1"]) == 0
    parts = [_rows(tmp_path / f"s.shard-{i}-of-2.csv") for i in range(2)]
    assert sorted(r["model"] for p in parts for r in p) == ["1eud_mdl_partial-dimer.pdb", "1eud_ref.pdb"]
    assert _cli([eud[0], "--ref", eud[1], "--out", out, "-q", "--resume", "--jobs", "1"]) == 0
    assert round(float(_rows(out)[0]["dockq"]), 3) == 0.559


def test_evaluate_bad_options(tmp_path, eud):
    with pytest.raises(InputError, match="--out"):
        _cli([eud[0], "--out", tmp_path / "x.txt"])
    with pytest.raises(InputError, match="--min-identity"):
        _cli([eud[0], "--ref", eud[1], "--min-identity", "120"])


def test_evaluate_confidence_that_does_not_match(tmp_path, eud):
    """A predictor's file next to the design with another residue count: one line naming both files,
    exit 2 and no output."""
    model = tmp_path / "x_unrelaxed_rank_001_m.pdb"
    shutil.copy(eud[0], model)
    (tmp_path / "x_scores_rank_001_m.json").write_text(json.dumps({"plddt": [90.0] * 12, "ptm": 0.5}))
    out = tmp_path / "x.csv"
    with pytest.raises(InputError) as exc:
        _cli([model, "--out", out, "-q"])
    msg = str(exc.value)
    assert "x_scores_rank_001_m.json" in msg and "x_unrelaxed_rank_001_m.pdb" in msg and "\n" not in msg
    assert not out.exists()
