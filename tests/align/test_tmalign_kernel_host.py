"""kernels/tmalign.cu compiled on the host as plain C++ (TMALIGN_HOST: a block of one thread) and run
through protgpu.align.gpu's pack/unpack: the GPU kernel's algorithm checked without a GPU, against
TM-align's stored numbers (datasets/tmalign/reference.json) and the CPU path. Skips without g++."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import protgpu as pg
from protgpu.align import gpu
from protgpu.align.chains import one_chain
from protgpu.scoring import _fast

REPO = Path(__file__).resolve().parents[2]
REFERENCE = json.loads((REPO / "datasets" / "tmalign" / "reference.json").read_text())["pairs"]


def _build(tmp_path_factory, *flags):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed")
    out = tmp_path_factory.mktemp("tmalign_host") / "tmalign_host.so"
    # -ffp-contract=off: no fused multiply-add, as the CPU path (and the kernel's DP cells) compute
    subprocess.run([gxx, "-std=c++17", "-O2", "-ffp-contract=off", "-Wall", "-Wno-unknown-pragmas", "-shared",
                    "-fPIC", "-x", "c++", "-DTMALIGN_HOST", *flags, "-I", str(REPO / "kernels"),
                    str(REPO / "kernels" / "tmalign.cu"), "-o", str(out)], check=True, capture_output=True)
    so = ctypes.CDLL(str(out))
    so.tmalign_host.restype = ctypes.c_int
    so.tmalign_workspace_bytes.restype = ctypes.c_longlong
    so.tmalign_workspace_bytes.argtypes = [ctypes.c_int] * 3
    return so


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """The kernel as a block of one thread."""
    return _build(tmp_path_factory)


def _build_threads(tmp_path_factory, n, w, rows=None):
    flags = [f"-DTMALIGN_HOST_THREADS={n}", f"-DTMALIGN_HOST_WARP={w}", "-pthread"]
    return _build(tmp_path_factory, *flags, *([f"-DTA_DP_ROWS={rows}"] if rows else []))


@pytest.fixture(scope="module")
def lib_one_warp(tmp_path_factory):
    """A block of one "warp" of 4 concurrent threads (TA_THREADS = 32 on the GPU: the block's DP runs
    its strips one after another), 2 DP rows a lane."""
    return _build_threads(tmp_path_factory, 4, 4, 2)


@pytest.fixture(scope="module", params=[(12, 4, None), (8, 4, 1)], ids=["3warps", "2warps-R1"])
def lib_threads(tmp_path_factory, request):
    """The kernel as a block of concurrent threads in "warps" of 4: strided loops, team reductions,
    barriers and the DP's shuffles and progress flags as on the GPU (a missing barrier changes results
    here). Three warps (the block's DP pipelines its strips over them; rows a lane as the kernel picks
    them), two warps with 1 row a lane."""
    return _build_threads(tmp_path_factory, *request.param)


def host_align(so, mobile, target, pairs=None, l_norms=None):
    """What tm_align_gpu does, with the host build of the kernel: chains (CA, sequence) in, rows out."""
    pairs = np.asarray(pairs if pairs is not None else [(0, 0)], dtype=np.int64)
    if l_norms is None:
        l_norms = [float(len(target[b][0])) for _a, b in pairs.tolist()]
    pk = gpu.pack([m[0] for m in mobile], [t[0] for t in target], pairs, l_norms)
    n = len(pk.pair_chain)
    val = np.zeros((n, 4))
    n_ali = np.zeros(n, np.int32)
    rt = np.zeros((n, 12))
    maps = np.zeros(max(pk.map_total, 1), np.int32)

    def ptr(a):
        assert a.flags.c_contiguous
        return a.ctypes.data_as(ctypes.c_void_p)

    rc = so.tmalign_host(ptr(pk.coords), ptr(pk.chain_off), ptr(pk.chain_len), ptr(pk.pair_chain), ptr(pk.params),
                         ptr(pk.map_off), ctypes.c_int(n), ptr(val), ptr(n_ali), ptr(rt), ptr(maps), None)
    assert rc == 0
    return gpu.unpack(pk, val, n_ali, rt, maps, [m[1] for m in mobile], [t[1] for t in target])


def _chain(datasets, name):
    c = one_chain(str(datasets / name), name)
    return c.ca, c.sequence


def test_workspace_size_is_the_kernels(lib):
    for l1, l2, nw in ((5, 5, 1), (81, 87, 8), (1000, 37, 4), (250, 166, 8), (3, 700, 16)):
        assert lib.tmalign_workspace_bytes(l1, l2, nw) == gpu.workspace_bytes(l1, l2, nw)


def test_stored_pairs_match_tm_align(lib, datasets):
    """All 21 stored pairs in one call: TM-scores, RMSD, aligned length, superposition and the printed
    alignment equal TM-align's (as the CPU path's parity test asks)."""
    files = sorted({r["mobile"] for r in REFERENCE} | {r["target"] for r in REFERENCE})
    index = {f: k for k, f in enumerate(files)}
    chains = [_chain(datasets, f) for f in files]
    rows = host_align(lib, chains, chains, [(index[r["mobile"]], index[r["target"]]) for r in REFERENCE])
    for row, ref in zip(rows, REFERENCE, strict=True):
        what = (ref["mobile"], ref["target"])
        assert abs(row.tm_target - ref["tm_target"]) < 1e-9 and abs(row.tm_mobile - ref["tm_mobile"]) < 1e-9, what
        assert (row.mobile_aligned, row.match, row.target_aligned) == (
            ref["mobile_aligned"], ref["match"], ref["target_aligned"]), what
        assert row.n_aligned == ref["n_aligned"], what
        assert abs(row.rmsd - ref["rmsd"]) < 1e-6, what
        assert abs(row.seq_identity - ref["seq_identity"]) < 1e-12, what
        np.testing.assert_allclose(row.rotation, ref["rotation"], atol=1e-6)
        np.testing.assert_allclose(row.translation, ref["translation"], atol=1e-4)
        assert row.tm == row.tm_target


def test_concurrent_block_gives_the_same_results(lib, lib_threads, lib_one_warp, datasets):
    """A block of several warps equals TM-align's numbers, the one-thread build to 1e-12 (another sum
    order), and a block of one warp of the same width bit for bit (the block size changes how the work
    is spread, not a result: what makes every TA_THREADS on the GPU give the same results)."""
    rows = [r for r in REFERENCE if max(r["L1"], r["L2"]) < 80][:3]
    chains = {f: _chain(datasets, f) for r in rows for f in (r["mobile"], r["target"])}
    for ref in rows:
        pair = [chains[ref["mobile"]]], [chains[ref["target"]]]
        one = host_align(lib, *pair)[0]
        many = host_align(lib_threads, *pair)[0]
        warp = host_align(lib_one_warp, *pair)[0]
        assert abs(many.tm_target - ref["tm_target"]) < 1e-9 and abs(many.tm_mobile - ref["tm_mobile"]) < 1e-9
        assert (many.mobile_aligned, many.match, many.target_aligned) == (
            ref["mobile_aligned"], ref["match"], ref["target_aligned"])
        for name in ("tm_target", "tm_mobile", "rmsd"):
            assert abs(getattr(many, name) - getattr(one, name)) < 1e-12, name
            assert getattr(many, name) == getattr(warp, name), name
        np.testing.assert_array_equal(many.rotation, warp.rotation)
        np.testing.assert_array_equal(many.translation, warp.translation)
        np.testing.assert_array_equal(many.aligned, warp.aligned)


@pytest.mark.parametrize("normalize_by", ["mobile", "average", 123.5])
def test_normalisations_and_fields_equal_the_cpu_path(lib, datasets, normalize_by):
    a, b = "tmalign/d1cida1.pdb", "tmalign/d1dcea2.pdb"
    cpu = pg.tm_align(datasets / a, datasets / b, normalize_by=normalize_by, device="cpu")
    x, y = _chain(datasets, a), _chain(datasets, b)
    row = host_align(lib, [x], [y], l_norms=[{"mobile": float(len(x[0])), "average": (len(x[0]) + len(y[0])) / 2}
                                             .get(normalize_by, normalize_by)])[0]
    for name in ("tm_mobile", "tm_target", "tm", "rmsd", "seq_identity"):
        assert abs(getattr(row, name) - getattr(cpu, name)[0]) < 1e-9, name
    assert row.n_aligned == cpu.n_aligned[0]
    np.testing.assert_array_equal(row.aligned, cpu.aligned[0])
    np.testing.assert_allclose(row.rotation, cpu.rotation[0], atol=1e-9)
    np.testing.assert_allclose(row.translation, cpu.translation[0], atol=1e-7)
    assert (row.mobile_aligned, row.match, row.target_aligned) == (cpu.mobile_aligned[0], cpu.match[0],
                                                                   cpu.target_aligned[0])


def _walk(seed: int, n: int) -> np.ndarray:
    """A chain-like CA trace: 3.8 A steps, turning by random bounded angles (helix- and strand-like runs)."""
    rng = np.random.default_rng(seed)
    pts = [np.zeros(3)]
    d = np.array([1.0, 0.0, 0.0])
    for _ in range(n - 1):
        d = d + rng.normal(scale=0.6, size=3)
        d /= np.linalg.norm(d)
        pts.append(pts[-1] + 3.8 * d)
    return np.asarray(pts)


@settings(max_examples=6, deadline=None)
@example(seed=131072, n1=60, n2=62)
@given(seed=st.integers(0, 10**6), n1=st.integers(5, 70), n2=st.integers(5, 70))
def test_random_chains_equal_the_cpu_path(lib, seed, n1, n2):
    x, y = _walk(seed, n1), _walk(seed + 1, n2)
    row = host_align(lib, [(x, "X" * n1)], [(y, "X" * n2)])[0]
    # against the NumPy twin, the specification (seed 131072, 60 and 62 residues: an exact tie that all three
    # paths now keep as TM-align does, the first alignment: TM 0.2081)
    saved = _fast.ENABLED
    _fast.ENABLED = False
    try:
        cpu = pg.tm_align(x, y, device="cpu")
    finally:
        _fast.ENABLED = saved
    assert abs(row.tm_target - cpu.tm_target[0]) < 1e-9 and abs(row.tm_mobile - cpu.tm_mobile[0]) < 1e-9
    np.testing.assert_array_equal(row.aligned, cpu.aligned[0])


def _rotation(q):
    q = np.asarray(q, dtype=np.float64)
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


_quat = st.lists(st.floats(-1, 1), min_size=4, max_size=4).filter(lambda q: np.linalg.norm(q) > 0.1)
_shift = st.lists(st.floats(-50, 50), min_size=3, max_size=3)


@settings(max_examples=8, deadline=None)
@given(name=st.sampled_from(["tmalign/d1cxya_.pdb", "tmalign/d2nwta1.pdb", "tmalign/1e79h.pdb"]), q=_quat,
       shift=_shift)
def test_self_alignment_is_the_identity(lib, datasets, name, q, shift):
    ca, seq = _chain(datasets, name)
    moved = ca @ _rotation(q).T + np.asarray(shift)
    row = host_align(lib, [(moved, seq)], [(ca, seq)])[0]
    n = len(ca)
    assert abs(row.tm_target - 1.0) < 1e-9 and abs(row.tm_mobile - 1.0) < 1e-9
    np.testing.assert_array_equal(row.aligned, np.stack([np.arange(n)] * 2, axis=1))
    assert row.n_aligned == n and row.rmsd < 1e-6 and row.match == ":" * n
    np.testing.assert_allclose(moved @ row.rotation.T + row.translation, ca, atol=1e-6)


@settings(max_examples=6, deadline=None)
@given(q=_quat, shift=_shift, which=st.sampled_from(["mobile", "target"]))
def test_rigid_motion_changes_nothing(lib, datasets, q, shift, which):
    x = _chain(datasets, "tmalign/d2a6ca1.pdb")
    y = _chain(datasets, "tmalign/d1neqa_.pdb")
    base = host_align(lib, [x], [y])[0]
    rot, t = _rotation(q), np.asarray(shift)
    if which == "mobile":
        x = (x[0] @ rot.T + t, x[1])
    else:
        y = (y[0] @ rot.T + t, y[1])
    moved = host_align(lib, [x], [y])[0]
    for name in ("tm_target", "tm_mobile", "rmsd"):
        assert abs(getattr(moved, name) - getattr(base, name)) < 1e-9, name
    np.testing.assert_array_equal(moved.aligned, base.aligned)
    assert moved.mobile_aligned == base.mobile_aligned and moved.target_aligned == base.target_aligned
