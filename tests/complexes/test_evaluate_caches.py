"""protgpu evaluate's speed-ups give the numbers of the plain path: the per-atom-table caches (clean-up,
chain mapping, the atoms of the sanity and CPU scores), the vectorised residue contacts, the lDDT
reference pair lists kept between batches, and the batching keys computed in the parse workers."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protgpu as pg
from protgpu.batch.jobs.evaluate import EvaluateJob
from protgpu.complexes import scores as sc
from protgpu.complexes.sanity import SanityTopology, design_sanity, sanity_of


@pytest.fixture(scope="module")
def noisy(eud):
    """Four noisy copies of the 1eud model, one atom table, as separate one-frame Structures."""
    m = pg.load(eud[0])
    rng = np.random.default_rng(11)
    return [pg.Structure(m.coords[0] + rng.normal(scale=0.7, size=(m.n_atoms, 3)).astype(np.float32), m.atoms,
                         source=f"noisy_{k}.pdb") for k in range(4)]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([1.0, 2.0, 5.0]))
def test_contact_pairs_are_every_pair_within_the_cutoff(seed, cutoff):
    """Integer coordinates: distances that tie with the cutoff exactly are counted (<=), as DockQ's
    k-d tree query counted them; the residue pairs are those of the brute-force distance matrix."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 6, size=(60, 3)).astype(np.float64)
    res = np.sort(rng.integers(0, 20, size=60))
    a1, a2 = np.arange(0, 30), np.arange(30, 60)
    d2 = ((x[a1][:, None] - x[a2][None]) ** 2).sum(-1)
    i, j = np.nonzero(d2 <= cutoff ** 2)
    want = sorted({(int(res[a1[p]]), int(res[a2[q]])) for p, q in zip(i, j, strict=True)})
    got = sc._contact_pairs(x, a1, a2, res, cutoff)
    assert got.tolist() == [list(p) for p in want]
    assert sc._contacts(x, a1, a2, res, cutoff) == set(want)


def test_map_model_reuses_the_table_of_a_second_model(eud, noisy):
    ref = sc.ComplexReference(eud[1])
    s0, cm0, t0 = sc.map_model(noisy[0], ref, table=True)
    s1, cm1, t1 = sc.map_model(noisy[1], ref, table=True)
    assert t1 is t0 and len(ref._tables) == 1
    fresh = sc.clean(noisy[1])
    np.testing.assert_array_equal(s1.coords, fresh.coords)
    want = sc._map(fresh, ref.structure, min_identity=30.0, chain_mapping="auto", max_naive=sc.MAX_NAIVE)
    assert cm1.chains == want.chains and cm1.identity == want.identity and cm1.groups == want.groups
    assert cm1.model_source == want.model_source == "noisy_1.pdb" != cm0.model_source
    for c in want.residues:
        np.testing.assert_array_equal(cm1.residues[c], want.residues[c])
    # other options are another table
    sc.map_model(noisy[1], ref, min_identity=50.0)
    assert len(ref._tables) == 2


def test_homomer_assignment_is_decided_per_model(datasets, tmp_path):
    """Equivalent chains are assigned by each model's coordinates, not taken from the first model of
    the atom table: the second model has the two copies where the first has them exchanged."""
    from test_mapping_chains import _homodimer

    ref_path = _homodimer(datasets, tmp_path, swap=False, shift=30.0, name="ref.pdb")
    ref = sc.ComplexReference(ref_path)
    s = pg.load(ref_path)
    a = s.atoms.chain == "A"
    x = s.coords[0].copy()
    x[a], x[~a] = s.coords[0][~a], s.coords[0][a]  # (the two copies have the same atoms in the same order)
    swapped = pg.Structure(x, s.atoms, source="swapped.pdb")
    assert sc.map_model(s, ref)[1].chains == {"A": "A", "B": "B"}
    assert sc.map_model(swapped, ref)[1].chains == {"A": "B", "B": "A"}
    t = sc.score_complex([s, swapped], ref_path, metrics=("lddt", "dockq"), device="cpu")
    np.testing.assert_allclose(t["lddt"], 1.0)
    np.testing.assert_allclose(t["dockq"], 1.0)


def test_host_scores_with_the_memo_equal_the_plain_ones(eud, noisy):
    ref = sc.ComplexReference(eud[1])
    for s in noisy:
        cs, cm, table = sc.map_model(s, ref, table=True)
        plain, memo = sc.host_scores(cs, cm, ref), sc.host_scores(cs, cm, ref, table)
        assert plain.keys() == memo.keys()
        for k in plain:
            np.testing.assert_array_equal(plain[k], memo[k], err_msg=k)
    assert "qs_chains" in table.memo_of(cm) and ("dockq", "A", "B") in table.memo_of(cm)


def test_score_mapped_with_worker_keys_and_kept_references(eud, noisy):
    """Keys from the workers, and the reference's lDDT pair lists reused by a second batch: the same
    table as scoring without them; lDDT and backbone lDDT are pg.lddt's values."""
    ref = sc.ComplexReference(eud[1])
    mapped = [sc.map_model(s, ref, table=True) for s in noisy]
    structs, maps = [m[0] for m in mapped], [m[1] for m in mapped]
    keys = [sc.group_key(s, cm, t) for s, cm, t in mapped]
    assert len(set(keys)) == 1
    first = sc.score_mapped(structs, maps, ref, "cpu", keys=keys)
    assert set(ref._lddt) == {"heavy", "ca", "inter"}
    again = sc.score_mapped(structs, maps, ref, "cpu")
    fresh = sc.score_mapped(structs, maps, sc.ComplexReference(eud[1]), "cpu")
    for col in (*sc.METRICS, "fnat", "irmsd", "lrmsd"):
        np.testing.assert_array_equal(first[col], again[col], err_msg=col)
        np.testing.assert_array_equal(first[col], fresh[col], err_msg=col)
    rp = maps[0].residue_pairs()
    stack = pg.Structure(np.stack([s.coords[0] for s in structs]), structs[0].atoms)
    np.testing.assert_array_equal(first["lddt"], pg.lddt(stack, ref.structure, mapping=rp, device="cpu"))
    np.testing.assert_array_equal(first["bb_lddt"], pg.lddt(stack, ref.structure, atoms="ca", mapping=rp,
                                                            device="cpu"))


def test_sanity_of_a_kept_topology_equals_design_sanity(eud, noisy):
    topo = SanityTopology(noisy[0].atoms)
    for s in noisy[:2]:
        assert sanity_of(topo, s.coords[0]) == design_sanity(s)
    ref = pg.load(eud[1])  # three chains, water, modified residues
    assert sanity_of(SanityTopology(ref.atoms), ref.coords[0]) == design_sanity(ref)


def test_loaded_design_reports_its_steps_and_ships_without_caches(tmp_path, eud, noisy):
    """The item a parse worker returns carries the seconds of each load step (the engine adds them up)
    through pickling; the job pickled for the workers leaves its caches behind."""
    for s in noisy[:2]:
        pg.save(s, tmp_path / s.source)
    job = EvaluateJob(str(eud[1]), confidence="none", device="cpu")
    items = [job.load(str(tmp_path / s.source)) for s in noisy[:2]]
    back = pickle.loads(pickle.dumps(items[1]))
    assert set(back.timings) == {"read_s", "confidence_s", "sanity_s", "map_s", "host_scores_s"}
    assert all(v >= 0 for v in back.timings.values())
    assert back["keys"] == items[0]["keys"]
    assert job._sanity and job.reference._tables
    clone = pickle.loads(pickle.dumps(job))
    assert clone._sanity == {} and clone.reference._tables == {} and clone.reference._lddt == {}
    rows = [r for res in job.compute(items) for r in res.rows]
    # (evaluate's tm_score is the mapped one: ComplexReference's default tm_mode)
    one = pg.score_complex(pg.load(tmp_path / noisy[1].source), eud[1], device="cpu", tm_mode="mapped")
    # (a batch of two against one model alone: the batched superposition agrees to rounding, as in
    # test_evaluate's test_batched_equals_one_by_one)
    for col in ("lddt", "ilddt", "tm_score", "qs_global", "dockq"):
        np.testing.assert_allclose(rows[1][col], one[col][0], rtol=0, atol=1e-12, err_msg=col)
