"""TM-align's one-call compiled pair (protgpu/align/_fast.py: align_maps and its pieces) against the NumPy
twin: the fused DP against the twin's matrices and DP bit for bit, the stages' maps equal, the search's
memo changing no bit, and whole pairs (stored and hypothesis-made) giving the twin's alignment and scores
(skipped without numba)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from test_tmalign_kernel_host import _walk  # noqa: E402

from protgpu.align import _dp, _search  # noqa: E402
from protgpu.align import _fast as afast  # noqa: E402
from protgpu.align import numpy_twin as twin  # noqa: E402
from protgpu.align.chains import one_chain  # noqa: E402
from protgpu.scoring import _fast  # noqa: E402

REFERENCE = json.loads((Path(__file__).resolve().parents[2] / "datasets" / "tmalign" / "reference.json")
                       .read_text())["pairs"]
# stored pairs of different shapes: 81 x 87, 86 x 86 (equal lengths), 105 x 109, 250 x 166
PAIRS = [REFERENCE[0], REFERENCE[16], REFERENCE[18], REFERENCE[20]]


def _twin(monkeypatch, fn):
    """fn() with the compiled paths off (the NumPy twin), then restored."""
    monkeypatch.setattr(_fast, "ENABLED", False)
    try:
        return fn()
    finally:
        monkeypatch.setattr(_fast, "ENABLED", True)


@pytest.fixture(scope="module", params=PAIRS, ids=lambda r: Path(r["mobile"]).stem)
def pair(request, datasets):
    r = request.param
    a, b = one_chain(str(datasets / r["mobile"]), "mobile"), one_chain(str(datasets / r["target"]), "target")
    return a.ca, b.ca, a.sequence, b.sequence


def _u8(sec: str) -> np.ndarray:
    return np.frombuffer(sec.encode(), np.uint8).copy()


def _fused(mode, x, y, rot, trans, d0, gap, sec_x="", sec_y=""):
    j2i = np.empty(len(y), np.int64)
    afast._compile()
    afast._nw(mode, x, y, rot, trans, d0 * d0, _u8(sec_x), _u8(sec_y), np.zeros((0, 0)), gap,
              afast._dp_work(len(x), len(y)), j2i)
    return j2i


def test_fused_dp_is_the_twins_dp_on_the_twins_matrices(monkeypatch, pair):
    x, y, _, _ = pair
    rot, trans, _ = twin.superpose(x[None, 5:45], y[None, 10:50])
    rot, trans = rot[0], trans[0]
    sx, sy = _dp.secondary_structure(x), _dp.secondary_structure(y)
    ss = _dp.ss_scores_matrix(sx, sy)

    def ref(score, gap):
        return _twin(monkeypatch, lambda: _dp.nw_align(score[None], gap)[0])

    tm = _twin(monkeypatch, lambda: _dp.tm_scores_matrix(x, y, rot[None], trans[None], 4.2)[0])
    for gap in (-0.6, 0.0):
        assert np.array_equal(_fused(afast._TM, x, y, rot, trans, 4.2, gap), ref(tm, gap))
    assert np.array_equal(_fused(afast._SS, x, y, rot, trans, 1.0, -1.0, sx, sy), ref(ss, -1.0))
    assert np.array_equal(_fused(afast._TM_SS, x, y, rot, trans, 4.2, -1.0, sx, sy), ref(tm + 0.5 * ss, -1.0))
    # the identity superposition of far-apart chains: scores near 0, long runs of ties
    far = _fused(afast._TM, x + 500.0, y, np.eye(3), np.zeros(3), 4.2, 0.0)
    tm_far = _twin(monkeypatch, lambda: _dp.tm_scores_matrix(x + 500.0, y, np.eye(3)[None], np.zeros((1, 3)), 4.2)[0])
    assert np.array_equal(far, ref(tm_far, 0.0))


@settings(max_examples=25, deadline=None)
@given(l1=st.integers(1, 40), l2=st.integers(1, 40), gap=st.sampled_from([-1.0, -0.6, 0.0]),
       levels=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_dp_from_a_matrix_keeps_the_ties(l1, l2, gap, levels, seed):
    # few distinct scores: many cells tie, and every tie rule is exercised
    s = np.random.default_rng(seed).integers(0, levels + 1, size=(2, l1, l2)) / levels
    saved = _fast.ENABLED
    _fast.ENABLED = False
    try:
        ref = _dp.nw_align(s, gap)
    finally:
        _fast.ENABLED = saved
    assert np.array_equal(afast.nw_align(s, gap), ref)


def test_seeds_and_rounds_are_the_twins():
    afast._compile()
    out = np.empty((6 * 300 + 12, 2), np.int64)
    for n in (1, 2, 3, 4, 5, 7, 8, 9, 33, 64, 65, 129, 300):
        for step in (1, 3, 40):
            c = afast._seeds(n, step, out)
            assert np.array_equal(out[:c], _search.seeds(n, step)), (n, step)
    assert afast._MAX_ROUNDS == _search.MAX_ROUNDS
    # the kernel's tie margin is the CPU path's
    src = (Path(__file__).resolve().parents[2] / "kernels" / "tmalign_team.cuh").read_text()
    assert f"#define TA_TIE {afast._TIE:g}" in src


@pytest.mark.parametrize("step", [1, 40])
def test_search_memo_changes_no_bit(pair, step):
    x, y, _, _ = pair
    n = min(len(x), len(y))
    p = twin.search_parameters(len(x), len(y))
    rng = np.random.default_rng(step)
    # a real alignment's pairs and a scrambled one (many seeds whose kept sets differ)
    for xa, ya in ((x[:n], y[:n]), (x[:n], y[rng.permutation(n)])):
        xc = np.ascontiguousarray((xa - xa.mean(axis=0)).T)
        yc = np.ascontiguousarray((ya - ya.mean(axis=0)).T)
        sd = _search.seeds(n, step)
        out = []
        for memo in (False, True):
            rt = np.zeros(12)
            score = afast._search(xc, yc, sd, p.d0, p.d0_search, float(n), p.score_d8, rt, memo)
            out.append((score, rt))
        assert out[0][0] == out[1][0]
        assert np.array_equal(out[0][1], out[1][1])


def test_stage_maps_are_the_twins(monkeypatch, pair):
    x, y, _, _ = pair
    p = twin.search_parameters(len(x), len(y))
    xc, yc = np.ascontiguousarray(x - x.mean(axis=0)), np.ascontiguousarray(y - y.mean(axis=0))
    afast._compile()
    fw, fs = afast._fast_work(len(y)), afast._fit_scratch()
    m, tmp = np.empty(len(y), np.int64), np.empty(len(y), np.int64)
    rot, trans = np.eye(3), np.zeros(3)
    assert afast._local(x, y, xc, yc, p.d0, p.d0_search, afast._dp_work(len(x), len(y)), fw, fs, rot, trans,
                        tmp, m)
    assert np.array_equal(m, _twin(monkeypatch, lambda: twin.initial_local(x, y, p)))
    afast._frag_threading(x, xc, yc, y, p.dcu0, p.d0, p.d0_search, fw, fs, tmp, m)
    assert np.array_equal(m, _twin(monkeypatch, lambda: twin.initial_fragment_threading(x, y, p)))
    for chain in (x, y, x * 1.3):  # scaled: no CA step below the cutoff, which must grow
        assert afast._max_fragment(chain, p.dcu0) == twin.max_fragment(chain, p.dcu0)


def _assert_same_pair(fast, slow):
    assert np.array_equal(fast.aligned, slow.aligned)
    assert (fast.mobile_aligned, fast.match, fast.target_aligned) == (slow.mobile_aligned, slow.match,
                                                                      slow.target_aligned)
    assert fast.n_aligned == slow.n_aligned
    for f in ("tm_mobile", "tm_target", "tm", "rmsd"):
        assert abs(getattr(fast, f) - getattr(slow, f)) < 1e-9, f
    np.testing.assert_allclose(fast.rotation, slow.rotation, atol=1e-9)
    np.testing.assert_allclose(fast.translation, slow.translation, atol=1e-7)


def test_whole_pairs_are_the_twins(monkeypatch, pair):
    x, y, sx, sy = pair
    p = twin.search_parameters(len(x), len(y))
    ssx, ssy = _dp.secondary_structure(x), _dp.secondary_structure(y)
    fast_map = afast.align_maps(x, y, ssx, ssy, p)
    assert np.array_equal(fast_map, _twin(monkeypatch, lambda: twin.align_maps(x, y, ssx, ssy, p)))
    _assert_same_pair(twin.tm_align_pair(x, y, sx, sy),
                      _twin(monkeypatch, lambda: twin.tm_align_pair(x, y, sx, sy)))


def test_self_alignment_takes_both_fragment_branches(monkeypatch, datasets):
    # equal lengths and equal fragments: the fragment threading tries both chains
    x = one_chain(str(datasets / "tmalign" / "d1cxya_.pdb"), "x").ca
    r = twin.tm_align_pair(x, x, "X" * len(x), "X" * len(x))
    assert abs(r.tm_target - 1.0) < 1e-12 and r.n_aligned == len(x)
    _assert_same_pair(r, _twin(monkeypatch, lambda: twin.tm_align_pair(x, x, "X" * len(x), "X" * len(x))))


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), start=st.integers(0, 30), length=st.integers(25, 60),
       noise=st.floats(0.0, 3.0), cut=st.integers(0, 15))
def test_perturbed_chains_give_the_twins_pair(datasets, seed, start, length, noise, cut):
    """A piece of a stored chain against a noisy, truncated, moved copy of another piece."""
    rng = np.random.default_rng(seed)
    base = one_chain(str(datasets / "tmalign" / "d1cida1.pdb"), "x").ca
    x = base[start:start + length]
    y = base[max(0, start - cut):start + length - cut // 2] + rng.normal(scale=noise, size=(1, 3))
    y = y + rng.normal(scale=noise, size=y.shape)
    rot, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    y = y @ (rot * np.sign(np.linalg.det(rot))).T + rng.normal(scale=20.0, size=3)
    seq = "X" * len(x), "X" * len(y)
    fast = twin.tm_align_pair(x, y, *seq)
    saved = _fast.ENABLED
    _fast.ENABLED = False
    try:
        slow = twin.tm_align_pair(x, y, *seq)
    finally:
        _fast.ENABLED = saved
    _assert_same_pair(fast, slow)


# Two SCOPe pairs whose refinement meets exact ties: rounds (and stages) whose alignments differ only in
# pairs beyond score_d8 score the same; TM-align keeps the first, and the compiled path once kept a later
# one whose reordered sums came out an ulp higher (issues 17, 22). TM-align's scores from tmtools 0.3.0.
# The third pair's tie went the other way in the twin before it took the same rule.
TIE_PAIRS = [("d1twia1", "d3ssaa1", 0.18158503, 0.41335726), ("d1oksa1", "d2pmra1", 0.54264875, 0.39816965),
             ("d1j5ua1", "d1j0la_", 0.27406400, 0.31764941)]


@pytest.mark.parametrize(("mobile", "target", "tm_mobile", "tm_target"), TIE_PAIRS, ids=lambda v: str(v))
def test_exact_ties_keep_tmaligns_first_alignment(monkeypatch, datasets, mobile, target, tm_mobile, tm_target):
    a = one_chain(str(datasets / "tmalign" / f"{mobile}.pdb"), "mobile")
    b = one_chain(str(datasets / "tmalign" / f"{target}.pdb"), "target")
    fast = twin.tm_align_pair(a.ca, b.ca, a.sequence, b.sequence)
    slow = _twin(monkeypatch, lambda: twin.tm_align_pair(a.ca, b.ca, a.sequence, b.sequence))
    for r in (fast, slow):
        assert abs(r.tm_mobile - tm_mobile) < 1e-6 and abs(r.tm_target - tm_target) < 1e-6
    _assert_same_pair(fast, slow)


def test_exact_tie_of_two_random_walks(monkeypatch):
    # stage 1's refined score equals its search's (alignments differing beyond score_d8): once TM 0.2174
    # here against the twin's and TM-align's 0.2081 (tmtools 0.3.0 below)
    x, y = _walk(131072, 60), _walk(131073, 62)
    seq = "X" * len(x), "X" * len(y)
    fast = twin.tm_align_pair(x, y, *seq)
    slow = _twin(monkeypatch, lambda: twin.tm_align_pair(x, y, *seq))
    for r in (fast, slow):
        assert abs(r.tm_target - 0.208059017458821) < 1e-6 and abs(r.tm_mobile - 0.21194592436403153) < 1e-6
    _assert_same_pair(fast, slow)
