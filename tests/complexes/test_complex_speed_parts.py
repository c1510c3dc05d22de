"""The faster per-model CPU parts of ``protgpu evaluate`` (issue 18) give the numbers of the plain ones:
QS-score on its contacts only against QS-score on the full distance matrices (bit for bit), the new
neighbour searches against brute force (ties at the cutoff included), and DockQ's contacts taken from
the design-sanity search against DockQ's own search."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import protgpu as pg
from protgpu.batch.jobs.evaluate import EvaluateJob
from protgpu.complexes import qs
from protgpu.complexes import sanity as sa
from protgpu.complexes import scores as sc


def _noisy(path, n: int, scale: float, seed: int) -> list:
    m = pg.load(path)
    rng = np.random.default_rng(seed)
    return [pg.Structure(m.coords[0] + rng.normal(scale=scale, size=(m.n_atoms, 3)).astype(np.float32), m.atoms,
                         source=f"noisy_{k}.pdb") for k in range(n)]


# --------------------------------------------------------------------------------------------------
# the searches against brute force


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([1.0, 2.0, 3.0, 12.0]), st.integers(0, 40), st.integers(0, 40))
def test_pairs_below_are_the_full_matrix_pairs(seed, cutoff, n1, n2):
    """Integer coordinates: many distances equal the cutoff exactly, and those are left out (<), as
    on the full matrix; the distances are the full matrix's bits, in its row-major order."""
    rng = np.random.default_rng(seed)
    hi = int(cutoff) + 3
    x1 = rng.integers(0, hi, size=(n1, 3)).astype(np.float64)
    x2 = rng.integers(0, hi, size=(n2, 3)).astype(np.float64)
    full = np.sqrt(((x1[:, None, :] - x2[None, :, :]) ** 2).sum(-1))
    want_i, want_j = np.nonzero(full < cutoff)
    i, j, d = sc._pairs_below(x1, x2, cutoff)
    np.testing.assert_array_equal(i, want_i)
    np.testing.assert_array_equal(j, want_j)
    np.testing.assert_array_equal(d, full[want_i, want_j])


def _fast_enabled() -> bool:
    from protgpu.scoring import _fast

    return _fast.enabled()


@pytest.fixture(params=["compiled", "tree"])
def search_path(request, monkeypatch):
    """The clash and contact searches with the compiled cell lists (numba; skipped without it) and with
    the k-d trees."""
    from protgpu.scoring import _fast

    if request.param == "compiled" and not _fast_enabled():
        pytest.skip("numba not importable: the k-d tree path only")
    if request.param == "tree":
        monkeypatch.setattr(_fast, "ENABLED", False)
    return request.param


# (the fixture sets the path once for all examples: nothing in it is per example)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**31 - 1), st.sampled_from([1.0, 2.0, 2.2, 3.0]), st.booleans())
def test_clash_pairs_are_the_brute_force_pairs(search_path, seed, cutoff, spread):
    """Every pair closer than the cutoff (strict, ties left out), less the excluded ones (same or
    adjacent residue of one chain, SG-SG), as brute force over all pairs finds them; by both searches
    (``spread``: two clumps far apart, a cell grid too sparse for the cell list: the k-d tree)."""
    from protgpu.scoring import _fast

    assert _fast.enabled() == (search_path == "compiled")
    rng = np.random.default_rng(seed)
    n = 80
    x = rng.integers(0, 7, size=(n, 3)).astype(np.float64)
    if seed % 2:
        x += rng.normal(scale=0.3, size=x.shape)
    if spread:
        x[n // 2:] += 1000.0
    res = np.sort(rng.integers(0, 30, size=n))
    code = (res >= 15).astype(np.int64)
    sg = rng.random(n) < 0.2
    d = np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    i, j = np.triu_indices(n, 1)
    keep = (d[i, j] < cutoff) & ~((code[i] == code[j]) & (np.abs(res[i] - res[j]) <= 1)) & ~(sg[i] & sg[j])
    want = set(zip(i[keep].tolist(), j[keep].tolist(), strict=True))
    gi, gj = sa._clash_pairs(x, res, code, sg, cutoff)
    got = list(zip(gi.tolist(), gj.tolist(), strict=True))
    assert len(got) == len(set(got)) and set(got) == want
    assert all(a < b for a, b in got)


def test_searches_of_both_kinds_are_the_same_pairs(eud):
    """The compiled cell lists and the k-d trees give the same clash candidates and interface atom
    contacts on a real complex with noise (clashes at the interface and inside chains)."""
    from protgpu.complexes._contacts import _contact_atoms, _contact_atoms_tree, clash_candidates, clash_candidates_tree

    if not _fast_enabled():
        pytest.skip("numba not importable")
    s = _noisy(eud[1], 1, 0.6, seed=4)[0]
    topo = sa.SanityTopology(s.atoms)
    x = np.asarray(s.coords[0])[topo.idx].astype(np.float64)
    for cutoff in (2.2, 3.0):
        i, j = clash_candidates(x, topo.res, topo.code, topo.sg, cutoff)
        ti, tj = clash_candidates_tree(x, topo.res, topo.code, topo.sg, cutoff)
        assert len(i) == len(ti) > 10
        assert set(zip(i.tolist(), j.tolist(), strict=True)) == set(zip(ti.tolist(), tj.tolist(), strict=True))
    a, b = topo.chain_atoms["A"], topo.chain_atoms["B"]
    for cutoff in (5.0, 8.0):
        i, j = _contact_atoms(x, a, b, cutoff)
        ti, tj = _contact_atoms_tree(x[a], x[b], cutoff)
        assert len(i) == len(ti) > 100
        assert set(zip(i.tolist(), j.tolist(), strict=True)) == set(zip(ti.tolist(), tj.tolist(), strict=True))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**31 - 1), st.sampled_from([1.0, 2.0, 5.0]), st.booleans())
def test_contact_atoms_are_every_atom_pair_within_the_cutoff(search_path, seed, cutoff, spread):
    """Positions in the two lists of every pair within the cutoff (<=, ties counted: with integer
    coordinates many squared distances equal the squared cutoff); swapping the lists swaps the pairs.
    ``spread``: some atoms of the second list far away (a sparse grid: the k-d tree)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 6, size=(70, 3)).astype(np.float64)
    if spread:
        x[60:] += 1000.0
    a1, a2 = np.sort(rng.choice(70, 30, replace=False)), np.arange(40, 70)
    a1 = a1[a1 < 40]
    d2 = ((x[a1][:, None] - x[a2][None]) ** 2).sum(-1)
    want = set(zip(*np.nonzero(d2 <= cutoff ** 2), strict=True))
    i, j = sc._contact_atoms(x, a1, a2, cutoff)
    assert len(i) == len(want) and set(zip(i.tolist(), j.tolist(), strict=True)) == want
    j2, i2 = sc._contact_atoms(x, a2, a1, cutoff)
    assert set(zip(i2.tolist(), j2.tolist(), strict=True)) == want


# --------------------------------------------------------------------------------------------------
# QS-score on the contacts against QS-score on the full matrices


def _full_dist(q: qs._QSChains, a, b) -> np.ndarray:
    pa, pb = q.pos[a], q.pos[b]
    return np.sqrt(((pa[:, None, :] - pb[None, :, :]) ** 2).sum(-1))


def _qs_interface_full(ref, mdl, r_int, m_int, mapping):
    """QS-score's interface sums as they were computed on the full distance matrices."""
    d1, d2 = _full_dist(ref, *r_int), _full_dist(mdl, *m_int)
    idx = qs._qs_pairs(ref, mdl, r_int, m_int, mapping)
    (a1, a2), (b1, b2) = idx[0].T, idx[1].T
    c1, c2 = d1 < qs.QS_CONTACT, d2 < qs.QS_CONTACT
    shared1, shared2 = np.zeros(d1.shape, bool), np.zeros(d2.shape, bool)
    mapped1, mapped2 = np.zeros(d1.shape, bool), np.zeros(d2.shape, bool)
    s1 = s2 = np.zeros(0)
    if len(a1) and len(b1):
        g1, g2 = np.ix_(a1, b1), np.ix_(a2, b2)
        shared = c1[g1] & c2[g2]
        shared1[g1], shared2[g2] = shared, shared
        mapped1[g1] = c1[g1] & ~shared
        mapped2[g2] = c2[g2] & ~shared
        s1, s2 = d1[g1][shared], d2[g2][shared]
    w = qs._w(np.minimum(s1, s2))
    return (float((w * (1.0 - np.abs(s1 - s2) / 12.0)).sum()), float(w.sum()),
            float(qs._w(d1[mapped1]).sum() + qs._w(d2[mapped2]).sum()),
            float(qs._w(d1[c1 & ~shared1]).sum() + qs._w(d2[c2 & ~shared2]).sum()))


@pytest.mark.parametrize("scale", [0.0, 0.7, 3.0])
def test_qs_interface_on_contacts_equals_the_full_matrices(eud, scale):
    ref = sc.ComplexReference(eud[1])
    for s in _noisy(eud[0], 3, scale, seed=int(10 * scale)):
        cs, cm = sc.map_model(s, ref)
        info = sc.mp.residue_info(cs)
        mdl = qs._QSChains(cs, info, sc.protein_chains(info))
        names = list(sc.protein_chains(info))
        assert len(names) == 2
        assert mdl.interfaces == [tuple(names)] == [
            (a, b) for i, a in enumerate(names) for b in names[i + 1:] if (_full_dist(mdl, a, b) < qs.QS_CONTACT).any()]
        code, d = mdl.contacts(*names)
        full = _full_dist(mdl, *names)
        np.testing.assert_array_equal(code, np.flatnonzero(full < qs.QS_CONTACT))
        np.testing.assert_array_equal(d, full[full < qs.QS_CONTACT])
        for r_int in ref.qs.interfaces:
            if r_int[0] in cm.chains and r_int[1] in cm.chains:
                m_int = (cm.chains[r_int[0]], cm.chains[r_int[1]])
                assert qs._qs_interface(ref.qs, mdl, r_int, m_int, cm) == _qs_interface_full(ref.qs, mdl, r_int,
                                                                                              m_int, cm)


def test_qs_interface_of_a_partial_mapping_equals_the_full_matrices(eud):
    """Mapped residues missing on either side (half of chain B's pairs dropped), and none mapped."""
    from dataclasses import replace

    ref = sc.ComplexReference(eud[1])
    cs, cm = sc.map_model(_noisy(eud[0], 1, 1.0, seed=3)[0], ref)
    info = sc.mp.residue_info(cs)
    mdl = qs._QSChains(cs, info, sc.protein_chains(info))
    for keep in (slice(None, None, 2), slice(0, 0)):
        part = replace(cm, residues={**cm.residues, "B": cm.residues["B"][keep]})
        assert qs._qs_interface(ref.qs, mdl, ("A", "B"), ("A", "B"), part) == _qs_interface_full(
            ref.qs, mdl, ("A", "B"), ("A", "B"), part)


# --------------------------------------------------------------------------------------------------
# DockQ's contacts from the design-sanity search


def test_dockq_contacts_from_the_sanity_search_equal_their_own(eud):
    """The 1eud reference as a model (water, a third chain, modified residues: the clean-up drops
    atoms: DockQ's atoms are not the sanity search's, which is not used) and noisy 1eud models (whose
    contacts are the sanity search's)."""
    ref = sc.ComplexReference(eud[1])
    models = [pg.load(eud[1]), *_noisy(eud[0], 3, 0.8, seed=5)]
    for k, s in enumerate(models):
        cs, cm, table = sc.map_model(s, ref, table=True)
        found: dict = {}
        sa.sanity_of(sa.SanityTopology(s.atoms), s.coords[0], found=found)
        assert found["cutoff"] == sc.DOCKQ_CONTACT and found["pairs"]
        a, b = ref.interfaces[0]
        ma1, ma2, _, _ = sc._dockq_model_side(cs, ref.native[a, b], cm, a, b)
        used = sc._shared_contacts(found, table.keep, cm.chains[a], cm.chains[b], ma1, ma2) is not None
        assert used == (k > 0) == (table.keep is None)
        plain, shared = sc.host_scores(cs, cm, ref, table), sc.host_scores(cs, cm, ref, table, found)
        assert plain.keys() == shared.keys()
        for k in plain:
            np.testing.assert_array_equal(plain[k], shared[k], err_msg=k)
    assert np.isfinite(plain["fnat"]).all() and plain["nmdl"][0] > 0


def test_sanity_search_at_another_cutoff_is_not_used_by_dockq(eud):
    ref = sc.ComplexReference(eud[1])
    s = _noisy(eud[0], 1, 0.5, seed=8)[0]
    cs, cm, table = sc.map_model(s, ref, table=True)
    found: dict = {}
    sa.sanity_of(sa.SanityTopology(s.atoms), s.coords[0], interface_cutoff=8.0, found=found)
    a, b = ref.interfaces[0]
    ma1, ma2, _, _ = sc._dockq_model_side(cs, ref.native[a, b], cm, a, b)
    assert sc._shared_contacts(found, table.keep, cm.chains[a], cm.chains[b], ma1, ma2) is None
    # other atoms than DockQ's (one atom less in chain A): not used either
    other = {**found, "cutoff": sc.DOCKQ_CONTACT, "atoms": {**found["atoms"], "A": found["atoms"]["A"][1:]}}
    assert sc._shared_contacts(other, table.keep, cm.chains[a], cm.chains[b], ma1, ma2) is None
    plain, shared = sc.host_scores(cs, cm, ref, table), sc.host_scores(cs, cm, ref, table, found)
    for k in plain:
        np.testing.assert_array_equal(plain[k], shared[k], err_msg=k)


def test_evaluate_load_equals_the_separate_parts(tmp_path, eud):
    """The job's load (sanity search shared with DockQ) gives the sanity columns and CPU scores that
    design_sanity and host_scores without sharing give."""
    from protgpu.complexes.evaluate import sanity_columns

    models = _noisy(eud[0], 2, 0.6, seed=9)
    for s in models:
        pg.save(s, tmp_path / s.source)
    job = EvaluateJob(str(eud[1]), confidence="none", device="cpu")
    ref = sc.ComplexReference(eud[1])
    for s in models:
        item = job.load(str(tmp_path / s.source))
        back = pg.load(tmp_path / s.source)
        want = sanity_columns(back)
        assert {k: item["rows"][0][k] for k in want} == want
        cs, cm = sc.map_model(back, ref)
        plain = sc.host_scores(cs, cm, ref)
        for k in plain:
            np.testing.assert_array_equal(item["host"][0][k], plain[k], err_msg=k)
