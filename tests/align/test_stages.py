"""The stages of the NumPy twin against plain references: the batched anti-diagonal DP against the
reference code's cell-by-cell loop (ties included), the secondary structure of ideal helices and strands,
the TM-score search against the TMscore program's search where they coincide."""

from __future__ import annotations

import numpy as np
import pytest

from protgpu.align import _dp
from protgpu.align._dp import nw_align, secondary_structure
from protgpu.align._search import seeds, tm_search
from protgpu.scoring.tmscore import search_parameters, tm_search_numpy


def _nw_loop(score, gap):
    """TM-align's DP written cell by cell, as the reference code runs it."""
    l1, l2 = score.shape
    val = np.zeros((l1 + 1, l2 + 1))
    path = np.zeros((l1 + 1, l2 + 1), dtype=bool)
    for i in range(1, l1 + 1):
        for j in range(1, l2 + 1):
            d = val[i - 1, j - 1] + score[i - 1, j - 1]
            h = val[i - 1, j] + (gap if path[i - 1, j] else 0.0)
            v = val[i, j - 1] + (gap if path[i, j - 1] else 0.0)
            if d >= h and d >= v:
                path[i, j], val[i, j] = True, d
            else:
                val[i, j] = v if v >= h else h
    j2i = np.full(l2, -1)
    i, j = l1, l2
    while i > 0 and j > 0:
        if path[i, j]:
            j2i[j - 1] = i - 1
            i, j = i - 1, j - 1
        else:
            h = val[i - 1, j] + (gap if path[i - 1, j] else 0.0)
            v = val[i, j - 1] + (gap if path[i, j - 1] else 0.0)
            if v >= h:
                j -= 1
            else:
                i -= 1
    return j2i


@pytest.mark.parametrize("skew", [True, False])
@pytest.mark.parametrize("gap", [-0.6, 0.0, -1.0])
def test_dp_equals_the_cell_loop(monkeypatch, skew, gap):
    if not skew:
        monkeypatch.setattr(_dp, "_SKEW_ELEMENTS", 0)
    rng = np.random.default_rng(3)
    for l1, l2 in ((1, 1), (7, 3), (3, 9), (12, 12), (20, 15)):
        # integer-valued scores make ties common; real-valued ones test the ordinary case
        scores = np.stack([rng.integers(0, 3, (l1, l2)).astype(float), rng.random((l1, l2))])
        got = nw_align(scores, gap)
        for b in range(2):
            np.testing.assert_array_equal(got[b], _nw_loop(scores[b], gap))


def test_dp_batch_rows_are_independent():
    rng = np.random.default_rng(5)
    scores = rng.random((4, 11, 8))
    gaps = np.array([-0.6, 0.0, -1.0, -0.6])
    got = nw_align(scores, gaps)
    for b in range(4):
        np.testing.assert_array_equal(got[b], nw_align(scores[b:b + 1], gaps[b])[0])


def test_secondary_structure_of_ideal_helix_and_strand():
    n = 12
    t = np.arange(n) * np.deg2rad(100.0)
    helix = np.stack([2.3 * np.cos(t), 2.3 * np.sin(t), 1.5 * np.arange(n)], axis=1)
    assert secondary_structure(helix) == "CC" + "H" * (n - 4) + "CC"
    k = np.arange(n)
    strand = np.stack([3.3 * k, 0.9 * (-1.0) ** k, np.zeros(n)], axis=1)
    assert secondary_structure(strand) == "CC" + "E" * (n - 4) + "CC"
    assert secondary_structure(helix[:4]) == "CCCC"


def test_seed_order():
    rows = seeds(100, 40).tolist()
    assert rows[:4] == [[100, 0], [50, 0], [50, 40], [50, 50]]
    assert [r for r in rows if r[0] == 4][-1] == [4, 96]
    assert len(seeds(10, 1)) == sum(10 - length + 1 for length in (10, 5, 4))


def test_search_equals_the_tmscore_program_search_where_they_coincide(datasets):
    """With every seed (step 1) and no score_d8 cut, TM-align's search is the TMscore program's final
    search; the two implementations must agree."""
    from protgpu.align.chains import one_chain

    x = one_chain(str(datasets / "tmalign" / "1e79h.pdb"), "x").ca
    y = one_chain(str(datasets / "tmalign" / "1fs0e.pdb"), "y").ca
    rng = np.random.default_rng(0)
    y = y + rng.normal(scale=1.5, size=y.shape)  # residue-matched pairs with noise
    n = len(x)
    params = search_parameters([n], [n], [n])
    ref = tm_search_numpy(x[None], y[None], [n], params, stage1=False)
    d0s, d0 = params[0, 1], params[0, 2]
    score, rot, trans = tm_search(x, y, d0=d0, d0_search=d0s, norm=n, step=1)
    assert score == pytest.approx(ref["score"][0], abs=1e-12)
    np.testing.assert_allclose(rot, ref["rotation"][0], atol=1e-9)
    np.testing.assert_allclose(trans, ref["translation"][0], atol=1e-7)


def test_align_maps_skip_leaves_stages_out(monkeypatch):
    """numpy_twin.align_maps' experiment knob (benchmarks/bench_align_shortcuts.py): a skipped stage is not
    run, and without skip the NumPy stages give the compiled path's alignment."""
    from protgpu.align import numpy_twin
    from protgpu.scoring import _fast as scoring_fast

    rng = np.random.default_rng(3)
    x = np.cumsum(rng.normal(scale=2.2, size=(45, 3)), axis=0)
    y = x[3:40] @ np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]) + rng.normal(scale=0.3, size=(37, 3))
    p = numpy_twin.search_parameters(len(x), len(y))
    sx, sy = secondary_structure(x), secondary_structure(y)
    full = numpy_twin.align_maps(x, y, sx, sy, p)
    monkeypatch.setattr(scoring_fast, "ENABLED", False)
    assert np.array_equal(numpy_twin.align_maps(x, y, sx, sy, p), full)

    def refuse(*_a, **_k):
        raise AssertionError("a skipped stage ran")

    monkeypatch.setattr(numpy_twin, "initial_local", refuse)
    monkeypatch.setattr(numpy_twin, "initial_ss", refuse)
    y2x = numpy_twin.align_maps(x, y, sx, sy, p, skip=(2, 3))
    assert y2x.shape == (len(y),) and (y2x >= 0).sum() >= 5
    with pytest.raises(AssertionError, match="skipped stage ran"):
        numpy_twin.align_maps(x, y, sx, sy, p, skip=(2,))
