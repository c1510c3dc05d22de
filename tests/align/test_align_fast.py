"""TM-align's compiled CPU path (protgpu/align/_fast.py) against its NumPy twins: the DP and the DP score
matrices bit for bit, the searches to ~1e-12, and the stored TM-align references with the fast path on
and off (skipped without numba)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from protgpu.align import _dp, _search  # noqa: E402
from protgpu.align import _fast as afast  # noqa: E402
from protgpu.align.chains import one_chain  # noqa: E402
from protgpu.align.numpy_twin import search_parameters, threading_maps, tm_align_pair  # noqa: E402
from protgpu.scoring import _fast  # noqa: E402

REFERENCE = json.loads((Path(__file__).resolve().parents[2] / "datasets" / "tmalign" / "reference.json")
                       .read_text())["pairs"]

# three stored pairs of different sizes (81 x 87, 105 x 109, 250 x 166)
PAIRS = [REFERENCE[0], REFERENCE[18], REFERENCE[20]]


def _both(monkeypatch, fn):
    """fn() with the fast path off, then on."""
    monkeypatch.setattr(_fast, "ENABLED", False)
    slow = fn()
    monkeypatch.setattr(_fast, "ENABLED", True)
    assert afast.enabled()
    return slow, fn()


@pytest.fixture(scope="module", params=PAIRS, ids=lambda r: r["mobile"].split("/")[-1][:-4])
def pair(request, datasets):
    r = request.param
    return one_chain(str(datasets / r["mobile"]), "mobile"), one_chain(str(datasets / r["target"]), "target"), r


def test_dp_and_score_matrix_are_equal_bits(monkeypatch, pair):
    a, b, _ = pair
    rng = np.random.default_rng(1)
    rot = np.stack([np.eye(3), np.linalg.qr(rng.normal(size=(3, 3)))[0]])
    trans = rng.normal(size=(2, 3))
    m0, m1 = _both(monkeypatch, lambda: _dp.tm_scores_matrix(a.ca, b.ca, rot, trans, 3.5))
    assert np.array_equal(m0, m1)
    ss = _dp.ss_scores_matrix(_dp.secondary_structure(a.ca), _dp.secondary_structure(b.ca))[None]
    for score, gap in ((m0, -0.6), (m0, 0.0), (ss, -1.0), (np.round(m0, 1), -0.6)):  # rounded: many ties
        s, f = _both(monkeypatch, lambda score=score, gap=gap: _dp.nw_align(score, gap))
        assert np.array_equal(s, f)


@pytest.mark.parametrize("step, d8", [(40, True), (1, False), (1, True)])
def test_tm_search_matches_the_twin(monkeypatch, pair, step, d8):
    a, b, _ = pair
    n = min(len(a.ca), len(b.ca))
    p = search_parameters(len(a.ca), len(b.ca))
    kw = dict(d0=p.d0, d0_search=p.d0_search, norm=n, step=step, score_d8=p.score_d8 if d8 else None)
    s, f = _both(monkeypatch, lambda: _search.tm_search(a.ca[:n], b.ca[:n], **kw))
    assert abs(s[0] - f[0]) < 1e-12
    np.testing.assert_allclose(f[1], s[1], atol=1e-12)
    np.testing.assert_allclose(f[2], s[2], atol=1e-10)


def test_fast_scores_match_the_twin(monkeypatch, pair):
    a, b, _ = pair
    p = search_parameters(len(a.ca), len(b.ca))
    maps = threading_maps(len(a.ca), len(b.ca), min_ali=5)
    s, f = _both(monkeypatch, lambda: _search.fast_scores(a.ca, b.ca, maps, d0=p.d0, d0_search=p.d0_search))
    np.testing.assert_allclose(f, s, rtol=1e-13, atol=0)


def test_stored_references_with_the_fast_path_on_and_off(monkeypatch, pair):
    a, b, ref = pair
    s, f = _both(monkeypatch, lambda: tm_align_pair(a.ca, b.ca, a.sequence, b.sequence))
    for r in (s, f):
        assert abs(r.tm_target - ref["tm_target"]) < 1e-12 and abs(r.tm_mobile - ref["tm_mobile"]) < 1e-12
        assert (r.mobile_aligned, r.match, r.target_aligned) == (ref["mobile_aligned"], ref["match"],
                                                                ref["target_aligned"])
        assert r.n_aligned == ref["n_aligned"]
    assert abs(s.tm_target - f.tm_target) < 1e-12 and abs(s.tm_mobile - f.tm_mobile) < 1e-12
    assert np.array_equal(s.aligned, f.aligned)
    np.testing.assert_allclose(f.rotation, s.rotation, atol=1e-12)
