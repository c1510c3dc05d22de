"""MM-align's complex mode (protgpu/align/complex_mode.py, _dimer.py): its reduction to TM-align for one
chain, its invariances, the masked DP's twin against its compiled path, and OpenStructure's 1eud value."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tmalign_gpu import _walk
from test_tmalign_gpu import numpy_twin_only as _twin_only

from protgpu.align import _dimer
from protgpu.align.complex_mode import ComplexAlignment, complex_tm, greedy_assignment, mm_align
from protgpu.align.numpy_twin import tm_align_pair


def _rotation(seed: int) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(3, 3)))
    return q * np.sign(np.linalg.det(q))


def _pair_complex(seed: int, n1: int, n2: int, noise: float):
    """A target dimer (two random-walk chains 12 A apart) and a noisy model of it."""
    rng = np.random.default_rng(seed)
    a, b = _walk(seed, n1), _walk(seed + 1, n2)
    b = b - b.mean(axis=0) + a.mean(axis=0) + np.array([12.0, 0.0, 0.0])
    target = [a, b]
    model = [c + rng.normal(scale=noise, size=c.shape) for c in target]
    return model, target


@pytest.fixture(scope="module")
def eud_chains(datasets):
    import protgpu as pg
    from protgpu.align.complex_mode import protein_chain_cas
    from protgpu.complexes.scores import ComplexReference, map_model

    d = datasets / "openstructure"
    ref = ComplexReference(d / "1eud_ref.pdb", ("tm_score",))
    s, cm = map_model(pg.load(d / "1eud_mdl_partial-dimer.pdb"), ref)
    out = []
    for st_ in (s, ref.structure):
        names, cas = protein_chain_cas(st_)
        xyz = np.asarray(st_.coords[0], np.float64)
        out.append((names, [xyz[c] for c in cas]))
    return out, cm, s, ref.structure


def test_one_chain_is_tm_align():
    x, y = _walk(3, 60), _walk(4, 70)
    r = mm_align([x], [y])
    t = tm_align_pair(x, y, "X" * 60, "X" * 70)
    assert isinstance(r, ComplexAlignment)
    assert r.tm == t.tm_target and r.assignment == {0: 0}
    np.testing.assert_array_equal(r.aligned, t.aligned)
    np.testing.assert_array_equal(r.rotation, t.rotation)


def test_1eud_is_openstructure(eud_chains):
    """OpenStructure's Scorer (WrappedMMAlign): tm_score 0.711 to 3 decimals; protgpu 0.71138, with the
    chain mapping given (oum) or found."""
    ((mn, mx), (rn, rx)), cm, s, ref_s = eud_chains
    fixed = {mn.index(m): rn.index(r) for r, m in cm.chains.items()}
    auto = mm_align(mx, rx)
    oum = mm_align(mx, rx, mapping=fixed)
    assert round(auto.tm, 3) == 0.711 and round(oum.tm, 3) == 0.711
    assert auto.tm == pytest.approx(0.711376, abs=2e-6)
    assert auto.assignment == fixed
    assert oum.tm == auto.tm
    np.testing.assert_array_equal(complex_tm(s.coords, s, ref_s, cm.chains), [oum.tm])


def test_1eud_model_chain_order_does_not_matter(eud_chains):
    ((_, mx), (_, rx)), _, _, _ = eud_chains
    a = mm_align(mx, rx)
    b = mm_align(mx[::-1], rx)
    assert b.tm == pytest.approx(a.tm, abs=1e-9)
    assert {1 - i: j for i, j in b.assignment.items()} == a.assignment


def test_swapped_model_chains_give_the_same_score():
    model, target = _pair_complex(11, 45, 38, 1.0)
    a = mm_align(model, target)
    b = mm_align(model[::-1], target)
    assert a.assignment == {0: 0, 1: 1} and b.assignment == {0: 1, 1: 0}
    assert b.tm == pytest.approx(a.tm, abs=1e-9)
    assert 0.5 < a.tm < 1.0


def test_identical_complex_scores_one():
    _, target = _pair_complex(5, 40, 35, 0.0)
    r = mm_align(target, target)
    assert r.tm == pytest.approx(1.0, abs=1e-12)
    assert len(r.aligned) == 75


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), n1=st.integers(20, 45), n2=st.integers(20, 45))
def test_rigid_motion_changes_nothing(seed, n1, n2):
    model, target = _pair_complex(seed, n1, n2, 1.5)
    rot, shift = _rotation(seed), np.array([30.0, -12.0, 7.5])
    moved = [c @ rot.T + shift for c in model]
    a, b = mm_align(model, target), mm_align(moved, target)
    assert b.tm == pytest.approx(a.tm, abs=1e-6)
    assert b.assignment == a.assignment


def test_greedy_assignment_takes_the_best_pairs_then_swaps():
    w = np.array([[5.0, 4.0], [4.9, 0.5]])
    total, a = greedy_assignment(w)
    # greedy takes (0, 0) = 5 then (1, 1) = 0.5; the swap (0, 1) + (1, 0) = 8.9 is better
    assert a.tolist() == [1, 0] and total == pytest.approx(8.9)
    total, a = greedy_assignment(np.array([[-1.0, 2.0], [-1.0, -1.0]]))
    assert a.tolist() == [1, -1] and total == 2.0


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16), l1=st.integers(1, 30), l2=st.integers(1, 30),
       gap=st.sampled_from([0.0, -0.6, -1.0]))
def test_masked_dp_compiled_is_the_twin(seed, l1, l2, gap):
    pytest.importorskip("numba")
    rng = np.random.default_rng(seed)
    score = rng.random((l1, l2))
    mask = rng.random((l1, l2)) < 0.7
    with _twin_only():
        twin = _dimer.nw_masked(score, mask, gap)
    np.testing.assert_array_equal(_dimer.nw_masked(score, mask, gap), twin)


def test_masked_dp_aligns_only_inside_the_mask():
    score = np.ones((6, 6))
    mask = np.zeros((6, 6), dtype=bool)
    mask[:3, :3] = mask[3:, 3:] = True
    mask[0, 5] = True  # a cell off the blocks that the best path does not need
    with _twin_only():
        y2x = _dimer.nw_masked(score, mask, -0.6)
    assert y2x.tolist() == [0, 1, 2, 3, 4, 5]
    # without the mask cell (2, 2) the diagonal breaks there; the block's other cells stay aligned
    mask[2, 2] = False
    with _twin_only():
        y2x = _dimer.nw_masked(score, mask, 0.0)
    assert all(mask[i, j] for j, i in enumerate(y2x.tolist()) if i >= 0)


def test_compiled_path_is_the_twin():
    pytest.importorskip("numba")
    model, target = _pair_complex(21, 36, 30, 1.2)
    with _twin_only():
        twin = mm_align(model, target)
    fast = mm_align(model, target)
    assert fast.tm == pytest.approx(twin.tm, abs=1e-9)
    np.testing.assert_array_equal(fast.aligned, twin.aligned)


def test_score_complex_tm_modes(datasets):
    import protgpu as pg

    d = datasets / "openstructure"
    model, ref = d / "1eud_mdl_partial-dimer.pdb", d / "1eud_ref.pdb"
    t = {m: float(pg.score_complex(model, ref, metrics=("tm_score",), tm_mode=m)["tm_score"][0])
         for m in ("usalign", "usalign-auto", "mapped")}
    assert round(t["usalign"], 3) == round(t["usalign-auto"], 3) == 0.711
    # the old number: TMscore's search on the sequence-mapped residues
    pairs = pg.score_complex(model, ref, metrics=("rmsd",))["chain_mapping"][0].residue_pairs()
    assert t["mapped"] == pytest.approx(float(pg.tm_score(model, ref, mapping=pairs, device="cpu").tm), abs=1e-12)
    assert round(t["mapped"], 3) == 0.712
    with pytest.raises(pg.InputError, match=r"^tm_mode: unknown 'tm'; choose from"):
        pg.score_complex(model, ref, tm_mode="tm")
