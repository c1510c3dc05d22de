"""pg.score_complex and protgpu evaluate on the GPU against the CPU: the batched lDDT, TM-score and
superposition calls give the CPU's numbers (lDDT and interface lDDT to 1e-4: the GPU counts in float32
for float32 Structures; TM-score and the RMSDs to 1e-5/1e-4, GDT to one residue; contacts, QS and fnat
are the CPU's own code either way)."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg

pytestmark = pytest.mark.gpu

# GDT counts residues under distance cutoffs: one residue on the other side of a cutoff is 1/(4 L)
TOL = {"lddt": 1e-4, "bb_lddt": 1e-4, "ilddt": 1e-4, "tm_score": 1e-5, "gdtts": 2e-3, "gdtha": 2e-3,
       "rmsd": 1e-4, "qs_global": 1e-12, "qs_best": 1e-12, "dockq": 1e-5, "fnat": 1e-12, "fnonnat": 1e-12,
       "irmsd": 1e-4, "lrmsd": 1e-4, "nnat": 0, "nmdl": 0}


@pytest.fixture(scope="module")
def models(datasets):
    d = datasets / "openstructure"
    m = pg.load(d / "1eud_mdl_partial-dimer.pdb")
    rng = np.random.default_rng(11)
    xs = m.coords[0][None] + rng.normal(scale=0.8, size=(16, m.n_atoms, 3)).astype(np.float32)
    return pg.Structure(np.concatenate([m.coords, xs]), m.atoms, source="noisy"), d / "1eud_ref.pdb"


def test_score_complex_gpu_matches_cpu(gpu, models):
    s, ref = models
    cpu = pg.score_complex(s, ref, device="cpu")
    dev = pg.score_complex(s, ref, device="gpu")
    for col, tol in TOL.items():
        np.testing.assert_allclose(dev[col], cpu[col], rtol=0, atol=tol, err_msg=col)
    assert round(float(dev["dockq"][0]), 3) == 0.559 and round(float(dev["lrmsd"][0, 0]), 3) == 5.533


def test_score_complex_gpu_mixed_topologies(gpu, datasets, models):
    """Models of two atom tables in one call: two groups, each one batch, rows in input order."""
    s, ref = models
    d = datasets / "openstructure"
    items = [s.frames(1), d / "1eud_ref.pdb", s.frames(2)]
    cpu = pg.score_complex(items, ref, device="cpu")
    dev = pg.score_complex(items, ref, device="gpu")
    np.testing.assert_allclose(dev["lddt"], cpu["lddt"], atol=1e-4)
    np.testing.assert_allclose(dev["lrmsd"], cpu["lrmsd"], atol=1e-4)
    assert dev["lddt"][1] == pytest.approx(1.0)


def test_evaluate_cli_on_gpu(gpu, tmp_path, datasets):
    import csv
    import subprocess
    import sys

    d = datasets / "openstructure"
    out = tmp_path / "e.csv"
    r = subprocess.run([sys.executable, "-m", "protgpu.cli", "evaluate", str(d / "1eud_mdl_partial-dimer.pdb"),
                        "--ref", str(d / "1eud_ref.pdb"), "--device", "gpu", "--out", str(out), "-q"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (row,) = list(csv.DictReader(out.open()))
    assert round(float(row["dockq"]), 3) == 0.559 and round(float(row["bb_lddt"]), 3) == 0.622


def test_kept_lddt_references_serve_later_batches_on_the_gpu(gpu, models):
    """evaluate's compute: the reference's lDDT pair lists (and their device copies) built by the job's
    warm-up serve every batch; batches of worker-keyed models give the CPU's numbers."""
    from protgpu.batch.jobs.evaluate import EvaluateJob
    from protgpu.complexes import scores as sc

    s, ref_path = models
    job = EvaluateJob(str(ref_path), confidence="none", device="gpu")
    job.warm_up()
    ref = job.reference
    assert set(ref._lddt) == {"heavy", "ca", "inter"}
    mapped = [sc.map_model(s.frames(k), ref, table=True) for k in range(s.n_frames)]
    structs, maps = [m[0] for m in mapped], [m[1] for m in mapped]
    keys = [sc.group_key(*m) for m in mapped]
    parts = [sc.score_mapped(structs[a:b], maps[a:b], ref, "gpu", keys=keys[a:b]) for a, b in ((0, 8), (8, 17))]
    cpu = sc.score_mapped(structs, maps, sc.ComplexReference(ref_path), "cpu")
    for col, tol in TOL.items():
        got = np.concatenate([p[col] for p in parts])
        np.testing.assert_allclose(got, cpu[col], rtol=0, atol=tol, err_msg=col)


def check_complex_for_sanitizer() -> None:
    """score_complex of three models on the GPU (the GDT windows on their own stream while lDDT,
    TM-score and the DockQ superpositions run) against the CPU. Run under compute-sanitizer by
    tests/sanitize_kernels.py (section complex)."""
    from pathlib import Path

    d = Path(__file__).resolve().parents[2] / "datasets" / "openstructure"
    m = pg.load(d / "1eud_mdl_partial-dimer.pdb")
    xs = m.coords[0][None] + np.random.default_rng(3).normal(scale=0.5, size=(2, m.n_atoms, 3)).astype(np.float32)
    s = pg.Structure(np.concatenate([m.coords, xs]), m.atoms, source="noisy")
    cpu = pg.score_complex(s, d / "1eud_ref.pdb", device="cpu", tm_mode="mapped")
    dev = pg.score_complex(s, d / "1eud_ref.pdb", device="gpu", tm_mode="mapped")
    for col, tol in TOL.items():
        np.testing.assert_allclose(dev[col], cpu[col], rtol=0, atol=tol, err_msg=col)
    print("complex: ok")
