"""pg.tm_align(device="gpu") (kernels/tmalign.cu) against the CPU path and TM-align's stored numbers.

Run on the GPU machine: PROTGPU_REQUIRE_GPU=1 python3 -m pytest -q tests/align/test_tmalign_gpu.py
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

import protgpu as pg
from protgpu.align.chains import one_chain

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
REFERENCE = json.loads((REPO / "datasets" / "tmalign" / "reference.json").read_text())["pairs"]
FILES = sorted({r["mobile"] for r in REFERENCE} | {r["target"] for r in REFERENCE})


def _walk(seed: int, n: int) -> np.ndarray:
    """A chain-like CA trace: 3.8 A steps turning by random bounded angles."""
    rng = np.random.default_rng(seed)
    pts = [np.zeros(3)]
    d = np.array([1.0, 0.0, 0.0])
    for _ in range(n - 1):
        d = d + rng.normal(scale=0.6, size=3)
        d /= np.linalg.norm(d)
        pts.append(pts[-1] + 3.8 * d)
    return np.asarray(pts)


@contextlib.contextmanager
def numpy_twin_only():
    """The CPU path without its numba stages: the NumPy twin, the specification (the numba stages may
    flip a near-tie the twin does not; the kernel follows the twin)."""
    from protgpu.scoring import _fast

    saved = _fast.ENABLED
    _fast.ENABLED = False
    try:
        yield
    finally:
        _fast.ENABLED = saved


def assert_matches_cpu(gpu, call):
    """gpu equals call("cpu"); where it does not, the NumPy twin's result decides (call rerun with it)."""
    try:
        assert_same(gpu, call("cpu"))
    except AssertionError:
        with numpy_twin_only():
            assert_same(gpu, call("cpu"))


def assert_same(gpu, cpu, tol=1e-6):
    """Equal results: TM-scores and RMSD within tol, the same alignments and counts."""
    for name in ("tm_mobile", "tm_target", "tm"):
        np.testing.assert_allclose(getattr(gpu, name), getattr(cpu, name), atol=tol, err_msg=name)
    np.testing.assert_allclose(gpu.rmsd, cpu.rmsd, atol=tol)
    np.testing.assert_array_equal(gpu.n_aligned, cpu.n_aligned)
    np.testing.assert_allclose(gpu.seq_identity, cpu.seq_identity, atol=1e-12)
    np.testing.assert_allclose(gpu.rotation, cpu.rotation, atol=1e-6)
    np.testing.assert_allclose(gpu.translation, cpu.translation, atol=1e-4)
    for k in range(len(gpu.tm)):
        np.testing.assert_array_equal(gpu.aligned[k], cpu.aligned[k], err_msg=f"pair {k}")
        assert (gpu.mobile_aligned[k], gpu.match[k], gpu.target_aligned[k]) == (
            cpu.mobile_aligned[k], cpu.match[k], cpu.target_aligned[k]), f"pair {k}"


@pytest.fixture(scope="module")
def stored(datasets):
    paths = [str(datasets / f) for f in FILES]
    index = {f: k for k, f in enumerate(FILES)}
    return paths, [(index[r["mobile"]], index[r["target"]]) for r in REFERENCE]


def test_stored_pairs_match_tm_align_and_the_cpu_path(stored):
    paths, pairs = stored
    r = pg.tm_align(paths, paths, pairs=pairs, device="gpu")
    for k, ref in enumerate(REFERENCE):
        assert abs(r.tm_target[k] - ref["tm_target"]) < 1e-6 and abs(r.tm_mobile[k] - ref["tm_mobile"]) < 1e-6
        assert (r.mobile_aligned[k], r.match[k], r.target_aligned[k]) == (
            ref["mobile_aligned"], ref["match"], ref["target_aligned"]), (ref["mobile"], ref["target"])
        assert r.n_aligned[k] == ref["n_aligned"]
    assert_matches_cpu(r, lambda dev: pg.tm_align(paths, paths, pairs=pairs, device=dev))


def test_auto_uses_the_gpu_and_normalisations_agree(stored):
    paths, _ = stored
    for norm in (None, "mobile", "average", 97.5):
        gpu = pg.tm_align(paths[0], paths[1:4], normalize_by=norm, device="auto")
        assert_matches_cpu(gpu, lambda dev, norm=norm: pg.tm_align(paths[0], paths[1:4], normalize_by=norm, device=dev))


def test_fifty_corpus_like_pairs(datasets):
    """The stored chains, noisy copies of them (near-homologs) and chain-like random walks, 50 random
    pairs in one call."""
    rng = np.random.default_rng(17)
    chains = [one_chain(str(datasets / f), f).ca for f in FILES]
    chains += [c + rng.normal(scale=1.0, size=c.shape) for c in chains[:6]]
    chains += [_walk(s, n) for s, n in ((1, 40), (2, 133), (3, 257), (4, 9))]
    pairs = rng.integers(0, len(chains), size=(50, 2))
    gpu = pg.tm_align(chains, chains, pairs=pairs, device="gpu")
    assert_matches_cpu(gpu, lambda dev: pg.tm_align(chains, chains, pairs=pairs, device=dev))


def test_one_against_many_and_chunks(datasets, monkeypatch):
    """One structure against many; then the same with a memory budget of one pair per launch."""
    target = str(datasets / "usalign" / "PDB1.pdb")
    mobiles = [str(datasets / f) for f in FILES[:7]]
    whole = pg.tm_align(mobiles, target, device="gpu")
    assert_matches_cpu(whole, lambda dev: pg.tm_align(mobiles, target, device=dev))
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", "1")
    chunked = pg.tm_align(mobiles, target, device="gpu")
    assert_same(chunked, whole, tol=0.0)


def test_workspace_cap_bounds_memory_and_changes_nothing(monkeypatch):
    """A search-sized call holds at most WORKSPACE_BYTES of workspace (or WORKSPACE_PAIRS pairs' worth),
    whatever the device budget: 40 pairs in chunks of 3 give the single chunk's results."""
    from protgpu._memory import DevicePeak
    from protgpu.align import gpu

    query = _walk(11, 120)
    entries = [_walk(100 + k, 60 + 7 * k) for k in range(40)]
    whole = pg.tm_align(query, entries, device="gpu")
    monkeypatch.setattr(gpu, "WORKSPACE_BYTES", 1)
    monkeypatch.setattr(gpu, "WORKSPACE_PAIRS", 3)
    stride = max(int(gpu.workspace_bytes([120], [60 + 7 * 39], w)[0]) for w in (1, 2, 4, 8))
    with DevicePeak() as peak:
        capped = pg.tm_align(query, entries, device="gpu")
    assert_same(capped, whole, tol=0.0)
    # the workspace of 3 pairs, plus inputs and outputs (~100 KB here)
    assert peak.live <= 3 * stride + (1 << 20), (peak.live, stride)


def test_a_thousand_residue_chain():
    long = _walk(5, 1000)
    short = _walk(6, 150)
    assert_matches_cpu(pg.tm_align(long, short, device="gpu"), lambda dev: pg.tm_align(long, short, device=dev))
    rot = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    r = pg.tm_align(long @ rot.T + 7.0, long, device="gpu")
    assert abs(r.tm_target[0] - 1.0) < 1e-9 and r.n_aligned[0] == 1000
    np.testing.assert_array_equal(r.aligned[0], np.stack([np.arange(1000)] * 2, axis=1))


@pytest.mark.parametrize(("threads", "min_blocks"), [(32, 8), (64, 4), (128, 2), (256, 2)])
def test_block_sizes_give_the_same_alignments(stored, monkeypatch, threads, min_blocks):
    """Every TA_THREADS a sweep may pick (gpu.THREADS for every pair, no length buckets; a block of one
    warp runs the block's DP on that warp alone): the stored pairs still equal TM-align's numbers, and
    random chains (odd lengths, one past a multiple of the warp, 300 residues) give the default launch's
    results (its length buckets' block sizes) bit for bit (every reduction runs on a team of fixed size
    whatever the block size)."""
    from protgpu.align import gpu

    paths, pairs = stored
    walks = [_walk(s, n) for s, n in ((31, 33), (32, 64), (33, 65), (34, 130), (35, 300), (36, 290))]
    wp = [(0, 1), (1, 2), (2, 3), (3, 2), (4, 5), (5, 4), (3, 4)]
    base = pg.tm_align(walks, walks, pairs=wp, device="gpu")
    monkeypatch.setattr(gpu, "BUCKETS", ())
    monkeypatch.setattr(gpu, "THREADS", threads)
    monkeypatch.setattr(gpu, "MIN_BLOCKS", min_blocks)
    assert_same(pg.tm_align(walks, walks, pairs=wp, device="gpu"), base, tol=0.0)
    r = pg.tm_align(paths, paths, pairs=pairs, device="gpu")
    for k, ref in enumerate(REFERENCE):
        assert abs(r.tm_target[k] - ref["tm_target"]) < 1e-9 and abs(r.tm_mobile[k] - ref["tm_mobile"]) < 1e-9
        assert (r.mobile_aligned[k], r.match[k], r.target_aligned[k]) == (
            ref["mobile_aligned"], ref["match"], ref["target_aligned"]), (ref["mobile"], ref["target"])


def test_block_sizes_by_length(monkeypatch):
    """gpu.BUCKETS: pairs up to 100 residues on one-warp blocks, the others on the default; one call
    with both gives the alignments of the default alone, in the pairs' order."""
    from protgpu.align import gpu

    walks = [_walk(s, n) for s, n in ((41, 60), (42, 95), (43, 101), (44, 180))]
    pairs = [(0, 1), (2, 3), (1, 0), (3, 0), (1, 2)]
    base = pg.tm_align(walks, walks, pairs=pairs, device="gpu")
    monkeypatch.setattr(gpu, "BUCKETS", ((100, 32, 8),))
    assert [gpu.block_config(len(walks[a]), len(walks[b])) for a, b in pairs][:3] == [
        (32, 8), (gpu.THREADS, gpu.MIN_BLOCKS), (32, 8)]
    assert_same(pg.tm_align(walks, walks, pairs=pairs, device="gpu"), base, tol=0.0)


def check_tmalign_for_sanitizer() -> None:
    """tests/sanitize_kernels.py section "tmalign": odd sizes (5 residues, not multiples of a warp),
    one launch per pair (tiny budget) and one for all, each checked against the CPU path; every block
    size a launch may take (gpu.launch_configs: the default launch runs these short pairs on their length
    bucket's block size, and each of the others runs them with the buckets off)."""
    import os

    from protgpu.align import gpu

    walks = [_walk(s, n) for s, n in ((11, 5), (12, 37), (13, 70), (14, 129))]
    pairs = [(0, 1), (1, 0), (2, 3), (3, 2), (1, 3)]
    with numpy_twin_only():
        cpu = pg.tm_align(walks, walks, pairs=pairs, device="cpu")
    assert_same(pg.tm_align(walks, walks, pairs=pairs, device="gpu"), cpu)
    taken = {gpu.block_config(len(walks[a]), len(walks[b])) for a, b in pairs}
    saved = gpu.BUCKETS, gpu.THREADS, gpu.MIN_BLOCKS
    try:
        for threads, min_blocks in [c for c in gpu.launch_configs() if c not in taken]:
            gpu.BUCKETS, gpu.THREADS, gpu.MIN_BLOCKS = (), threads, min_blocks
            assert_same(pg.tm_align(walks, walks, pairs=pairs, device="gpu"), cpu)
    finally:
        gpu.BUCKETS, gpu.THREADS, gpu.MIN_BLOCKS = saved
    os.environ["PROTGPU_GPU_MEMORY_BUDGET"] = "1"
    try:
        assert_same(pg.tm_align(walks, walks, pairs=pairs, device="gpu"), cpu)
    finally:
        del os.environ["PROTGPU_GPU_MEMORY_BUDGET"]
    print("tmalign: ok")


def test_profile_counters_add_up(datasets):
    from protgpu.align.gpu import PROFILE_SLOTS, tm_align_gpu

    x, y = (one_chain(str(datasets / f), f) for f in FILES[:2])
    rows, prof = tm_align_gpu([x.ca], [y.ca], [x.sequence], [y.sequence], [(0, 0)], [float(len(y.ca))], profile=True)
    assert prof.shape == (1, len(PROFILE_SLOTS)) and rows[0].n_aligned > 0
    total = prof[0, PROFILE_SLOTS.index("total")]
    assert total > 0 and prof[0, :6].sum() <= total and (prof[0] >= 0).all()
    assert prof[0, PROFILE_SLOTS.index("dp")] > 0 and prof[0, PROFILE_SLOTS.index("tm_search")] > 0
