"""pg.score_complex against OpenStructure's Scorer on the 1eud pair (datasets/PROVENANCE.md), and the
properties every complex score must have."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg
from protgpu.complexes import METRICS

# OpenStructure's Scorer (modules/mol/alg/tests/test_scoring.py), model 1eud_mdl_partial-dimer.pdb vs
# target 1eud_ref.pdb, 3 decimals.
OST = {"lddt": 0.539, "bb_lddt": 0.622, "ilddt": 0.282, "gdtts": 0.616, "gdtha": 0.473, "rmsd": 2.944,
       "tm_score": 0.711, "qs_global": 0.321, "qs_best": 0.932, "dockq": 0.559, "fnat": 0.279,
       "irmsd": 0.988, "lrmsd": 5.533}

@pytest.fixture(scope="module")
def eud_table(datasets):
    d = datasets / "openstructure"
    return pg.score_complex(d / "1eud_mdl_partial-dimer.pdb", d / "1eud_ref.pdb")


def _value(table, name):
    v = table[name]
    return float(v[0, 0] if v.ndim == 2 else v[0])


@pytest.mark.parametrize("name", list(OST))
def test_1eud_reproduces_openstructure(eud_table, name):
    assert round(_value(eud_table, name), 3) == pytest.approx(OST[name], abs=1e-9)


def test_1eud_interface_counts(eud_table):
    assert eud_table["interfaces"] == [("A", "B")]
    assert eud_table["nnat"][0, 0] == 140 and eud_table["nmdl"][0, 0] == 48
    assert round(float(eud_table["fnonnat"][0, 0]), 2) == 0.19  # OpenStructure: 0.188 to 2 decimals


def test_dockq_is_its_formula(eud_table):
    f, i, lr = (float(eud_table[k][0, 0]) for k in ("fnat", "irmsd", "lrmsd"))
    expect = (f + 1 / (1 + (i / 1.5) ** 2) + 1 / (1 + (lr / 8.5) ** 2)) / 3
    assert float(eud_table["dockq_per_interface"][0, 0]) == pytest.approx(expect, rel=1e-12)
    assert float(eud_table["dockq"][0]) == pytest.approx(expect, rel=1e-12)  # one interface: the mean


def test_reference_against_itself_is_perfect(datasets):
    ref = datasets / "openstructure" / "1eud_ref.pdb"
    t = pg.score_complex(ref, ref)
    for name in ("lddt", "bb_lddt", "ilddt", "tm_score", "gdtts", "gdtha", "qs_global", "qs_best", "dockq"):
        assert float(t[name][0]) == pytest.approx(1.0), name
    assert float(t["rmsd"][0]) == pytest.approx(0.0, abs=1e-3)
    assert float(t["irmsd"][0, 0]) == pytest.approx(0.0, abs=1e-3)
    assert float(t["fnat"][0, 0]) == 1.0


def test_bb_lddt_is_pg_lddt_on_the_mapping(datasets):
    d = datasets / "openstructure"
    model, ref = d / "1eud_mdl_partial-dimer.pdb", d / "1eud_ref.pdb"
    t = pg.score_complex(model, ref, metrics=("bb_lddt",))
    pairs = t["chain_mapping"][0].residue_pairs()
    assert float(t["bb_lddt"][0]) == float(pg.lddt(model, ref, atoms="ca", mapping=pairs, device="cpu"))
    assert set(t) == {"model", "bb_lddt", "chain_mapping"}


def test_homodimer_with_swapped_chain_names_scores_perfectly(datasets, tmp_path):
    from test_mapping_chains import _homodimer

    ref = _homodimer(datasets, tmp_path, swap=False, shift=30.0, name="ref.pdb")
    model = _homodimer(datasets, tmp_path, swap=True, shift=30.0, name="model.pdb")
    t = pg.score_complex([model, ref], ref, metrics=("lddt", "qs_global", "dockq"))
    assert list(t["model"]) == ["model.pdb", "ref.pdb"]
    np.testing.assert_allclose(t["lddt"], 1.0)
    np.testing.assert_allclose(t["qs_global"], 1.0)
    np.testing.assert_allclose(t["dockq"], 1.0)
    assert t["chain_mapping"][0].chains == {"A": "B", "B": "A"}


def test_missing_chain_counts_zero_in_the_dockq_aggregate(datasets):
    d = datasets / "openstructure"
    t = pg.score_complex(d / "1eud_mdl_partial-dimer.pdb", d / "1eud_ref.pdb", metrics=("dockq", "qs_global"),
                         chain_mapping={"A": "A"})
    assert float(t["dockq"][0]) == 0.0 and np.isnan(t["fnat"][0, 0])
    assert float(t["qs_global"][0]) == 0.0


def test_frames_of_an_array_are_models(datasets):
    ref = pg.load(datasets / "openstructure" / "1eud_ref.pdb")
    x = np.stack([ref.coords[0], ref.coords[0] + 0.3])
    t = pg.score_complex(x, ref, metrics=("bb_lddt", "rmsd"))
    assert t["bb_lddt"].shape == (2,)
    np.testing.assert_allclose(t["rmsd"], 0.0, atol=1e-3)


def test_bad_metric_is_one_line():
    with pytest.raises(pg.InputError, match=r"^metrics: unknown \['dockq2'\]; choose from"):
        pg.score_complex("a.pdb", "b.pdb", metrics=("dockq2",))


def test_metric_names():
    assert METRICS == ("lddt", "bb_lddt", "ilddt", "tm_score", "gdtts", "gdtha", "rmsd", "qs_global", "qs_best",
                       "dockq")
