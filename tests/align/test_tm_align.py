"""pg.tm_align against TM-align: the stored reference (datasets/tmalign/reference.json, written by
datasets/tmalign/make_reference.py with tmtools 0.3.0), self-alignment, rigid-motion invariance, and a
live tmtools comparison on the shared corpus (opt-in)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protgpu as pg
from protgpu.align.chains import one_chain

REPO = Path(__file__).resolve().parents[2]
REFERENCE = json.loads((REPO / "datasets" / "tmalign" / "reference.json").read_text())["pairs"]
# ../shared/datasets/structures beside the checkout (a worktree sits one level deeper)
CORPUS = next((p / "shared" / "datasets" / "structures" for p in (REPO.parent, REPO.parent.parent)
               if (p / "shared" / "datasets" / "structures").is_dir()), REPO.parent / "shared")


def _id(row):
    return f"{Path(row['mobile']).stem}-{Path(row['target']).stem}"


@pytest.fixture(scope="module")
def results(datasets):
    """pg.tm_align on every stored pair, as one call with explicit pairs (the batch path)."""
    files = sorted({r["mobile"] for r in REFERENCE} | {r["target"] for r in REFERENCE})
    index = {f: k for k, f in enumerate(files)}
    paths = [str(datasets / f) for f in files]
    pairs = [(index[r["mobile"]], index[r["target"]]) for r in REFERENCE]
    return pg.tm_align(paths, paths, pairs=pairs)


def test_reader_gives_tm_align_its_chains(datasets):
    for row in REFERENCE:
        for side, length in (("mobile", "L1"), ("target", "L2")):
            c = one_chain(str(datasets / row[side]), row[side])
            assert len(c.ca) == row[length] and c.sequence == row[f"seq_{side}"]


def test_parity_with_stored_tm_align(results):
    r = results
    tm_err = np.maximum(np.abs(r.tm_mobile - [x["tm_mobile"] for x in REFERENCE]),
                        np.abs(r.tm_target - [x["tm_target"] for x in REFERENCE]))
    # The bar: within 1e-3 on >= 99% of pairs (here: all), within 0.01 on all.
    assert tm_err.max() < 1e-3, [(_id(x), float(e)) for x, e in zip(REFERENCE, tm_err, strict=True) if e >= 1e-3]
    same = np.array([r.mobile_aligned[k] == x["mobile_aligned"] and r.target_aligned[k] == x["target_aligned"]
                     and r.match[k] == x["match"] for k, x in enumerate(REFERENCE)])
    assert same.all(), [_id(x) for x, s in zip(REFERENCE, same, strict=True) if not s]
    np.testing.assert_allclose(r.rmsd, [x["rmsd"] for x in REFERENCE], atol=1e-6)
    np.testing.assert_array_equal(r.n_aligned, [x["n_aligned"] for x in REFERENCE])
    np.testing.assert_allclose(r.seq_identity, [x["seq_identity"] for x in REFERENCE], atol=1e-12)
    np.testing.assert_allclose(r.rotation, [x["rotation"] for x in REFERENCE], atol=1e-6)
    np.testing.assert_allclose(r.translation, [x["translation"] for x in REFERENCE], atol=1e-4)
    np.testing.assert_allclose(r.tm, r.tm_target)


def test_aligned_pairs_follow_the_printed_alignment(results):
    for k in range(len(REFERENCE)):
        top, mid, bottom = results.mobile_aligned[k], results.match[k], results.target_aligned[k]
        cols = [c for c, m in enumerate(mid) if m != " "]
        i = np.cumsum([ch != "-" for ch in top]) - 1
        j = np.cumsum([ch != "-" for ch in bottom]) - 1
        np.testing.assert_array_equal(results.aligned[k], np.stack([i[cols], j[cols]], axis=1))


def test_us_align_example_pair(datasets, reference_values):
    ref = reference_values["tmalign_pair_PDB1_PDB2"]["tmtools"]
    r = pg.tm_align(datasets / "usalign" / "PDB1.pdb", datasets / "usalign" / "PDB2.pdb")
    assert abs(r.tm_mobile[0] - ref["tm_norm_chain1"]) < 1e-6
    assert abs(r.tm_target[0] - ref["tm_norm_chain2"]) < 1e-6
    assert r.n_aligned[0] == ref["n_aligned"]


def test_self_alignment_is_the_identity(datasets):
    path = datasets / "tmalign" / "d1cxya_.pdb"
    r = pg.tm_align(path, path)
    n = int(r.lengths[0, 0])
    assert r.tm_mobile[0] == pytest.approx(1.0, abs=1e-12) and r.tm_target[0] == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_array_equal(r.aligned[0], np.stack([np.arange(n)] * 2, axis=1))
    np.testing.assert_allclose(r.rotation[0], np.eye(3), atol=1e-8)
    np.testing.assert_allclose(r.translation[0], 0.0, atol=1e-6)
    assert r.rmsd[0] < 1e-6 and r.n_aligned[0] == n and r.match[0] == ":" * n


def _rotation(q):
    q = np.asarray(q, dtype=np.float64)
    q = q / np.linalg.norm(q)
    w, x, y, z = q
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


_quat = st.lists(st.floats(-1, 1), min_size=4, max_size=4).filter(lambda q: np.linalg.norm(q) > 0.1)
_shift = st.lists(st.floats(-50, 50), min_size=3, max_size=3)


@settings(max_examples=4, deadline=None)
@given(q=_quat, shift=_shift, which=st.sampled_from(["mobile", "target"]))
def test_rigid_motion_changes_nothing(datasets, q, shift, which):
    x = one_chain(str(datasets / "tmalign" / "d2a6ca1.pdb"), "x").ca
    y = one_chain(str(datasets / "tmalign" / "d1neqa_.pdb"), "y").ca
    base = pg.tm_align(x, y)
    rot, t = _rotation(q), np.asarray(shift)
    moved = pg.tm_align(x @ rot.T + t, y) if which == "mobile" else pg.tm_align(x, y @ rot.T + t)
    np.testing.assert_allclose(moved.tm_target, base.tm_target, atol=1e-9)
    np.testing.assert_allclose(moved.tm_mobile, base.tm_mobile, atol=1e-9)
    np.testing.assert_allclose(moved.rmsd, base.rmsd, atol=1e-9)
    np.testing.assert_array_equal(moved.aligned[0], base.aligned[0])
    # the superposition moves with the input: R' x' + t' = (target frame) R x + t
    xs = x @ base.rotation[0].T + base.translation[0]
    if which == "mobile":
        xm = (x @ rot.T + t) @ moved.rotation[0].T + moved.translation[0]
        np.testing.assert_allclose(xm, xs, atol=1e-6)
    else:
        xm = x @ moved.rotation[0].T + moved.translation[0]
        np.testing.assert_allclose(xm, xs @ rot.T + t, atol=1e-6)


@pytest.mark.slow
def test_live_tmtools_on_the_shared_corpus():
    """~30 pairs of the shared SCOPe corpus against tmtools itself (opt-in: PROTGPU_TMALIGN_CORPUS=1)."""
    if os.environ.get("PROTGPU_TMALIGN_CORPUS", "") in ("", "0"):
        pytest.skip("set PROTGPU_TMALIGN_CORPUS=1 to compare with tmtools on ../shared/datasets/structures")
    tmtools = pytest.importorskip("tmtools")
    files = sorted((CORPUS / "scope40_ca").glob("*.pdb"))
    if not files:
        pytest.skip(f"no corpus at {CORPUS}")
    rng = np.random.default_rng(17)
    chains = {}
    errs = []
    while len(errs) < 30:
        a, b = rng.choice(len(files), 2, replace=False)
        for k in (a, b):
            if k not in chains:
                chains[k] = one_chain(str(files[k]), files[k].name)
        x, y = chains[a], chains[b]
        if max(len(x.ca), len(y.ca)) > 200:
            continue
        ref = tmtools.tm_align(x.ca, y.ca, x.sequence, y.sequence)
        r = pg.tm_align(x.ca, y.ca)
        errs.append(max(abs(r.tm_mobile[0] - ref.tm_norm_chain1), abs(r.tm_target[0] - ref.tm_norm_chain2)))
    errs = np.asarray(errs)
    assert (errs < 1e-3).mean() >= 0.99 or (errs < 1e-3).sum() >= len(errs) - 1
    assert errs.max() < 0.01
