"""CPU tests of protgpu.scoring.consensus: the NumPy twin against a brute-force float64 reference; the
issue's properties with hypothesis (identical models tie at the top, an outlier is last, a very large
temperature gives the mean similarity, weight rows sum to 1); invariances; the tiled online-softmax
algorithm of the CUDA path, run in NumPy and, as kernels/consensus.cu itself, compiled as host C++ with
one std::thread per CUDA thread; inputs, errors and the ranking table of the CLI."""

from __future__ import annotations

import ctypes
import importlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protgpu.errors import InputError
from protgpu.scoring.tmscore import d0_tmscore
from protgpu.superpose import pairwise_cpu, pairwise_rmsd, qcp

cs = importlib.import_module("protgpu.scoring.consensus")

SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]}


# --------------------------------------------------------------------------------------------------
# References and data


def kabsch_rmsd(x, y):
    a = x - x.mean(axis=0)
    b = y - y.mean(axis=0)
    u, s, vt = np.linalg.svd(a.T @ b)
    d = np.sign(np.linalg.det(u @ vt)) or 1.0
    r = (u @ np.diag([1, 1, d]) @ vt).T
    return float(np.sqrt(((a @ r.T - b) ** 2).sum() / len(x)))


def brute_force(x, temperature, d0=None):
    """The definition, in float64 with Kabsch RMSDs and plain loops: (scores, weights)."""
    x = np.asarray(x, dtype=np.float64)
    m = len(x)
    d0 = float(d0_tmscore(x.shape[1])) if d0 is None else d0
    r = np.array([[kabsch_rmsd(a, b) for b in x] for a in x])
    w = np.zeros((m, m))
    score = np.zeros(m)
    for i in range(m):
        others = [j for j in range(m) if j != i]
        logit = np.array([-r[i, j] ** 2 / temperature for j in others])
        e = np.exp(logit - logit.max())
        w[i, others] = e / e.sum()
        score[i] = sum(w[i, j] / (1 + (r[i, j] / d0) ** 2) for j in others)
    return score, w


def random_rotation(rng):
    q = rng.normal(size=4)
    return qcp.quaternion_to_rotation((q / np.linalg.norm(q))[None])[0]


def moved(rng, x):
    return x @ random_rotation(rng).T + rng.normal(scale=15, size=3)


@pytest.fixture(scope="module")
def adk(datasets):
    from protgpu.io import load

    return load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb")


@pytest.fixture(scope="module")
def base(adk):
    """CA coordinates of the first AdK frame, (214, 3) float64."""
    return adk.coords[0, adk.select_indices("ca")].astype(np.float64)


# --------------------------------------------------------------------------------------------------
# The NumPy twin: the definition


@settings(max_examples=15, **SETTINGS)
@given(st.integers(0, 2**31), st.integers(2, 9), st.integers(3, 40),
       st.sampled_from([0.5, 1.0, 4.0, 25.0, np.inf]))
def test_twin_matches_brute_force(seed, m, n, temperature):
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=3, size=(m, n, 3)) + rng.normal(scale=10, size=(m, 1, 3))
    score, w = cs.consensus_numpy(x, temperature, return_weights=True)
    ref, ref_w = brute_force(x, temperature)
    assert score.dtype == np.float64 and score.shape == (m,)
    # RMSDs come back from pairwise_rmsd as float32: ~6e-8 relative
    np.testing.assert_allclose(score, ref, rtol=0, atol=2e-6)
    # The weights are w_ij = softmax_j(z_ij), z = -r^2 / T: float32 RMSDs (relative error <= 2^-24)
    # move each z by at most dz = 2 r^2 2^-24 / T, and w_ij by at most w_ij 2 max|dz| <= r^2 2^-22 / T,
    # which grows with the spread of the models.
    r2_max = float((pairwise_cpu.pairwise_numpy(x, out_dtype=np.float64) ** 2).max())
    r2_over_t = 0.0 if np.isinf(temperature) else r2_max / temperature
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=2e-6 + r2_over_t * 2.0**-22)


def test_twin_real_models_and_explicit_d0(adk):
    x = adk.coords[::7][:, adk.select_indices("ca")]
    ref, _ = brute_force(x, 2.0, d0=3.0)
    np.testing.assert_allclose(cs.consensus_numpy(x, 2.0, 3.0), ref, rtol=0, atol=1e-6)
    ref, _ = brute_force(x, cs.DEFAULT_TEMPERATURE)
    np.testing.assert_allclose(cs.consensus_score(x, device="cpu"), ref, rtol=0, atol=1e-6)


def test_twin_blocks_and_row_block_path(adk, monkeypatch):
    x = adk.coords[:40, adk.select_indices("ca")]
    full = cs.consensus_numpy(x, 4.0)
    for block in (1, 3, 17, 40):
        np.testing.assert_allclose(cs.consensus_numpy(x, 4.0, block=block), full, rtol=1e-13, atol=0)
    # past the full-matrix size the twin computes blocks of rows against all models
    monkeypatch.setattr(cs, "_CPU_MATRIX_BYTES", 0)
    np.testing.assert_allclose(cs.consensus_numpy(x, 4.0, block=7), full, rtol=0, atol=1e-7)


# --------------------------------------------------------------------------------------------------
# The properties


@settings(max_examples=25, **SETTINGS)
@given(st.integers(0, 2**31), st.integers(2, 4), st.integers(1, 12), st.sampled_from([0.5, 1.0, 4.0, 16.0, 100.0]),
       st.sampled_from([30, 80, 214]))
def test_identical_models_get_equal_highest_scores(base, seed, k, n_decoys, temperature, n_atoms):
    rng = np.random.default_rng(seed)
    x0 = base[:n_atoms]
    copies = [moved(rng, x0) for _ in range(k)]  # identical up to a rigid motion
    # decoys: the same model with independent noise, RMSD ~0.5 to 7 Angstrom from it
    decoys = [moved(rng, x0 + rng.normal(scale=rng.uniform(0.3, 4.0), size=x0.shape)) for _ in range(n_decoys)]
    order = rng.permutation(k + n_decoys)
    x = np.stack(copies + decoys)[order]
    score = cs.consensus_score(x, temperature=temperature, device="cpu")
    is_copy = order < k
    top = score[is_copy]
    np.testing.assert_allclose(top, top[0], rtol=1e-6, atol=0)
    assert top.min() > score[~is_copy].max()


@settings(max_examples=25, **SETTINGS)
@given(st.integers(0, 2**31), st.integers(2, 12), st.sampled_from([0.5, 4.0, 16.0, np.inf]),
       st.sampled_from(["noise", "closed", "scrambled"]))
def test_outlier_scores_lowest(adk, base, seed, n_models, temperature, kind):
    rng = np.random.default_rng(seed)
    ca = adk.select_indices("ca")
    frames = adk.coords[:, ca].astype(np.float64)
    # an ensemble of open-state conformations (the first AdK frames, RMSD < ~1.5 A apart, plus noise)
    members = [moved(rng, frames[rng.integers(0, 10)] + rng.normal(scale=0.3, size=base.shape))
               for _ in range(n_models)]
    if kind == "noise":
        out = base + rng.normal(scale=6.0, size=base.shape)
    elif kind == "closed":
        out = frames[-1]  # the other end of the transition, ~7 Angstrom away
    else:
        out = base[rng.permutation(len(base))]
    x = np.stack([*members, moved(rng, out)])
    pos = int(rng.integers(0, len(x)))
    x[[pos, -1]] = x[[-1, pos]]
    score = cs.consensus_score(x, temperature=temperature, device="cpu")
    assert int(np.argmin(score)) == pos
    assert score[pos] < np.delete(score, pos).min()


@settings(max_examples=15, **SETTINGS)
@given(st.integers(0, 2**31), st.integers(2, 10), st.floats(0.0, 5.0))
def test_large_temperature_gives_mean_similarity(base, seed, m, spread):
    rng = np.random.default_rng(seed)
    x = np.stack([moved(rng, base + rng.normal(scale=spread + 0.1, size=base.shape)) for _ in range(m)])
    r = pairwise_cpu.pairwise_numpy(x, out_dtype=np.float64)
    sim = 1.0 / (1.0 + (r / d0_tmscore(len(base))) ** 2)
    mean = (sim.sum(axis=1) - 1.0) / (m - 1)  # the diagonal's similarity is 1
    for t in (1e12, np.inf):
        score, w = cs.consensus_score(x, temperature=t, return_weights=True, device="cpu")
        np.testing.assert_allclose(score, mean, rtol=0, atol=1e-6)
        np.testing.assert_allclose(w[~np.eye(m, dtype=bool)], 1.0 / (m - 1), rtol=1e-9)


def test_small_temperature_gives_nearest_neighbour_similarity(base):
    rng = np.random.default_rng(3)
    x = np.stack([moved(rng, base + rng.normal(scale=s, size=base.shape)) for s in (0.2, 0.5, 0.9, 1.4, 2.0)])
    r = pairwise_cpu.pairwise_numpy(x, out_dtype=np.float64)
    np.fill_diagonal(r, np.inf)
    nearest = 1.0 / (1.0 + (r.min(axis=1) / d0_tmscore(len(base))) ** 2)
    np.testing.assert_allclose(cs.consensus_score(x, temperature=1e-4, device="cpu"), nearest, atol=1e-6)


@settings(max_examples=20, **SETTINGS)
@given(st.integers(0, 2**31), st.integers(2, 12), st.sampled_from([0.25, 1.0, 4.0, 50.0, np.inf]))
def test_weights_rows_sum_to_one_and_give_the_score(base, seed, m, temperature):
    rng = np.random.default_rng(seed)
    x = np.stack([moved(rng, base[:60] + rng.normal(scale=rng.uniform(0.1, 5), size=(60, 3))) for _ in range(m)])
    res = cs.consensus_score(x, temperature=temperature, return_weights=True, device="cpu")
    assert isinstance(res, cs.ConsensusResult)
    score, w = res
    assert w.shape == (m, m) and w.dtype == np.float64
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert (np.diag(w) == 0).all() and (w >= 0).all()
    r = pairwise_rmsd(x, device="cpu").astype(np.float64)
    sim = 1.0 / (1.0 + (r / d0_tmscore(60)) ** 2)
    np.testing.assert_allclose((w * sim).sum(axis=1), score, rtol=1e-12)
    np.testing.assert_allclose(cs.consensus_score(x, temperature=temperature, device="cpu"), score, rtol=1e-12)
    assert ((score > 0) & (score <= 1)).all()


@settings(max_examples=15, **SETTINGS)
@given(st.integers(0, 2**31), st.integers(2, 10))
def test_invariant_under_rigid_motion_and_permutation(base, seed, m):
    rng = np.random.default_rng(seed)
    x = np.stack([base[:50] + rng.normal(scale=rng.uniform(0.2, 3), size=(50, 3)) for _ in range(m)])
    score = cs.consensus_score(x, device="cpu")
    y = np.stack([moved(rng, f) for f in x])
    np.testing.assert_allclose(cs.consensus_score(y, device="cpu"), score, rtol=0, atol=1e-6)
    p = rng.permutation(m)
    np.testing.assert_allclose(cs.consensus_score(x[p], device="cpu"), score[p], rtol=0, atol=1e-6)


def test_two_models_score_their_similarity(base):
    rng = np.random.default_rng(0)
    x = np.stack([base, moved(rng, base + rng.normal(size=base.shape))])
    r = kabsch_rmsd(x[0], x[1])
    sim = 1 / (1 + (r / d0_tmscore(214)) ** 2)
    np.testing.assert_allclose(cs.consensus_score(x, device="cpu"), [sim, sim], atol=1e-6)


# --------------------------------------------------------------------------------------------------
# The CUDA path's algorithm: tiles folded into online-softmax states


def _straight(r, inv_t, inv_d0sq):
    """Score from a given symmetric RMSD matrix, the direct way (float64)."""
    r2 = np.asarray(r, np.float64) ** 2
    logit = -r2 * inv_t
    np.fill_diagonal(logit, -np.inf)
    e = np.exp(logit - logit.max(axis=1, keepdims=True))
    return (e / (1 + r2 * inv_d0sq)).sum(axis=1) / e.sum(axis=1)


def _tiled_from_matrix(r, tile, inv_t, inv_d0sq, update=cs.tile_update_numpy):
    m = len(r)
    state = (np.full(m, -np.inf), np.zeros(m), np.zeros(m))
    for i0, i1, j0, j1 in cs._schedule(m, tile):
        update(np.ascontiguousarray(r[i0:i1, j0:j1]), i0, j0, state, inv_t, inv_d0sq, cs._modes(i0, j0))
    with np.errstate(invalid="ignore"):
        return state[2] / state[1], state


def _random_rmsd_matrix(rng, m, scale):
    a = np.abs(rng.normal(scale=scale, size=(m, m)))
    r = np.triu(a, 1)
    return r + r.T


@settings(max_examples=40, **SETTINGS)
@given(st.integers(0, 2**31), st.integers(1, 40), st.integers(1, 45), st.sampled_from([0.01, 1.0, 4.0, 0.0]),
       st.sampled_from([0.5, 3.0, 40.0]))
def test_tiled_state_algebra_equals_direct(seed, m, tile, inv_t, scale):
    rng = np.random.default_rng(seed)
    r = _random_rmsd_matrix(rng, m, scale)
    inv_d0sq = 1 / 16.0
    got, state = _tiled_from_matrix(r, tile, inv_t, inv_d0sq)
    if m == 1:  # no other model: the state stays empty
        assert state[1][0] == 0 and np.isneginf(state[0][0])
        return
    np.testing.assert_allclose(got, _straight(r, inv_t, inv_d0sq), rtol=1e-12, atol=0)


def test_tiled_survives_underflow_and_propagates_nan():
    rng = np.random.default_rng(1)
    r = _random_rmsd_matrix(rng, 12, 30.0) + 40.0  # logits below -745: exp underflows without the shift
    np.fill_diagonal(r, 0)
    got, _ = _tiled_from_matrix(r, 5, 1.0, 1 / 16.0)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, _straight(r, 1.0, 1 / 16.0), rtol=1e-12)
    r[3, 8] = r[8, 3] = np.nan
    got, _ = _tiled_from_matrix(r, 5, 1.0, 1 / 16.0)
    assert np.isnan(got[[3, 8]]).all() and np.isfinite(np.delete(got, [3, 8])).all()


@pytest.mark.parametrize("tile", [1, 2, 5, 16, 40])
def test_tiled_numpy_equals_twin(adk, tile):
    x = adk.coords[::3, adk.select_indices("ca")]  # 33 real conformations
    np.testing.assert_allclose(cs.consensus_tiled_numpy(x, 4.0, tile=tile), cs.consensus_numpy(x, 4.0),
                               rtol=0, atol=1e-7)


# --------------------------------------------------------------------------------------------------
# kernels/consensus.cu itself on the host: C++ with one std::thread per CUDA thread (warp shuffles and
# __syncthreads through barriers), blocks one after the other.

_PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
using std::exp; using std::fmax; using std::isnan; using std::sqrt;
struct pg_dim3 { unsigned x, y, z; };
static thread_local pg_dim3 threadIdx = {0, 0, 0};
static pg_dim3 blockIdx = {0, 0, 0}, blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
static std::barrier<>* g_block_bar = nullptr;
static std::vector<std::barrier<>*> g_warp_bar;
static double g_xchg[64][32];
static inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
static inline double __shfl_xor_sync(unsigned, double v, int off) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    g_xchg[w][lane] = v;
    g_warp_bar[w]->arrive_and_wait();
    const double r = g_xchg[w][lane ^ off];
    g_warp_bar[w]->arrive_and_wait();
    return r;
}
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
"""

_DRIVER = r"""
template <typename F>
static void run_grid(int grid, int block, F body) {
    blockDim = {(unsigned)block, 1, 1};
    gridDim = {(unsigned)grid, 1, 1};
    for (int b = 0; b < grid; ++b) {
        blockIdx.x = b;
        std::barrier<> bb(block);
        g_block_bar = &bb;
        g_warp_bar.clear();
        std::vector<std::unique_ptr<std::barrier<>>> own;
        for (int w = 0; w < block / 32; ++w) {
            own.emplace_back(new std::barrier<>(32));
            g_warp_bar.push_back(own.back().get());
        }
        std::vector<std::thread> th;
        for (int t = 0; t < block; ++t) th.emplace_back([=] { threadIdx.x = t; body(); });
        for (auto& x : th) x.join();
    }
}
extern "C" void host_tile(int f64, const void* r, long long ld, int ti, int tj, long long row0, long long col0,
                          double* m, double* s, double* t, double inv_t, double inv_d0sq, int mode, int n_row_blocks,
                          int grid, int block) {
    run_grid(grid, block, [=] {
        if (f64)
            consensus_tile_f64((const double*)r, ld, ti, tj, row0, col0, m, s, t, inv_t, inv_d0sq, mode, n_row_blocks);
        else
            consensus_tile_f32((const float*)r, ld, ti, tj, row0, col0, m, s, t, inv_t, inv_d0sq, mode, n_row_blocks);
    });
}
extern "C" void host_weights(int f64, const void* r, double* w, const double* m, const double* s, long long n,
                             double inv_t) {
    run_grid(1, 1, [=] {
        if (f64) consensus_weights_f64((const double*)r, w, m, s, n, inv_t);
        else consensus_weights_f32((const float*)r, w, m, s, n, inv_t);
    });
}
"""

_HOST_THREADS = 64  # CS_THREADS of the host build: 2 warps per block, few std::threads


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the host emulation of consensus.cu")
    from protgpu._cuda.loader import build_source

    d = tmp_path_factory.mktemp("consensus_host")
    src = (_PRELUDE + "#include <memory>\n" + build_source("consensus", {"CS_THREADS": _HOST_THREADS})
           .replace("#pragma once", "") + _DRIVER)
    (d / "consensus.cpp").write_text(src)
    lib = d / "consensus.so"
    proc = subprocess.run([cxx, "-O1", "-std=c++20", "-pthread", "-shared", "-fPIC", str(d / "consensus.cpp"),
                           "-o", str(lib)], capture_output=True, text=True)
    if proc.returncode != 0:
        if "barrier" in proc.stderr:
            pytest.skip(f"{cxx} lacks C++20 <barrier>")
        raise AssertionError(proc.stderr[-3000:])
    so = ctypes.CDLL(str(lib))
    p, i, ll, dd = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_double
    so.host_tile.argtypes = [i, p, ll, i, i, ll, ll, p, p, p, dd, dd, i, i, i, i]
    so.host_weights.argtypes = [i, p, p, p, p, ll, dd]
    return so


def _host_update(so):
    warps = _HOST_THREADS // 32

    def update(r, row0, col0, state, inv_t, inv_d0sq, mode):
        ti, tj = r.shape
        nrb = -(-ti // warps) if mode & cs.ROWS else 0
        ncb = -(-tj // 32) if mode & cs.COLS else 0
        m, s, t = state
        so.host_tile(int(r.dtype == np.float64), r.ctypes.data, tj, ti, tj, row0, col0, m.ctypes.data,
                     s.ctypes.data, t.ctypes.data, inv_t, inv_d0sq, mode, nrb, nrb + ncb, _HOST_THREADS)

    return update


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,tile", [(1, 1), (7, 3), (40, 40), (70, 33), (90, 64)])
def test_host_kernel_equals_numpy_twin(host_kernel, dtype, m, tile):
    rng = np.random.default_rng(m + tile)
    r = _random_rmsd_matrix(rng, m, 4.0).astype(dtype)
    upd = _host_update(host_kernel)
    for inv_t, inv_d0sq in ((0.25, 1 / 16.0), (0.0, 1 / 9.0), (3.0, 1.0)):
        got, st_k = _tiled_from_matrix(r, tile, inv_t, inv_d0sq, update=upd)
        want, st_n = _tiled_from_matrix(r, tile, inv_t, inv_d0sq)
        if m == 1:
            assert st_k[1][0] == 0
            continue
        np.testing.assert_allclose(got, want, rtol=1e-13)
        np.testing.assert_allclose(got, _straight(r, inv_t, inv_d0sq), rtol=1e-12)


def test_host_kernel_rows_cols_separately_and_nan(host_kernel):
    rng = np.random.default_rng(5)
    r = rng.uniform(0.5, 9, size=(37, 70))
    r[4, 11] = np.nan
    upd = _host_update(host_kernel)
    first = rng.uniform(0, 3, size=(1, 120))
    for mode in (cs.ROWS, cs.COLS, cs.ROWS | cs.COLS):
        # an off-diagonal tile (rows 3..39, columns 45..114) on top of a non-empty state
        states = []
        for fn in (upd, cs.tile_update_numpy):
            st_ = (np.full(120, -np.inf), np.zeros(120), np.zeros(120))
            fn(first, 0, 0, st_, 0.5, 0.1, cs.COLS)  # row 0 against all: every state non-empty but model 0's
            fn(r, 3, 45, st_, 0.5, 0.1, mode)
            states.append(st_)
        for a, b in zip(states[0], states[1], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-13, equal_nan=True)
        if mode & cs.ROWS:
            assert np.isnan(states[0][1][3 + 4])
        if mode & cs.COLS:
            assert np.isnan(states[0][1][45 + 11])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_host_weights_kernel(host_kernel, dtype):
    rng = np.random.default_rng(2)
    r = _random_rmsd_matrix(rng, 23, 3.0).astype(dtype)
    _, state = _tiled_from_matrix(r, 23, 0.25, 0.1)
    w = np.empty((23, 23))
    host_kernel.host_weights(int(dtype == np.float64), r.ctypes.data, w.ctypes.data, state[0].ctypes.data,
                             state[1].ctypes.data, 23, 0.25)
    logit = -(r.astype(np.float64) ** 2) * 0.25
    np.fill_diagonal(logit, -np.inf)
    e = np.exp(logit - logit.max(axis=1, keepdims=True))
    np.testing.assert_allclose(w, e / e.sum(axis=1, keepdims=True), rtol=1e-13, atol=1e-300)


# --------------------------------------------------------------------------------------------------
# Inputs and errors


def test_structures_use_ca_atoms(adk, datasets):
    from protgpu.io import load

    ca = adk.select_indices("ca")
    sub = adk.frames(np.arange(0, 98, 10))
    want = cs.consensus_score(sub.coords[:, ca], device="cpu")
    np.testing.assert_allclose(cs.consensus_score(sub, device="cpu"), want, rtol=1e-12)
    assert abs(float(d0_tmscore(214)) - cs._d0(None, 214)) == 0
    # a list of Structures: every frame of each
    op, cl = load(datasets / "adk_open.pdb"), load(datasets / "adk_closed.pdb")
    got = cs.consensus_score([op, sub, cl], device="cpu")
    assert got.shape == (12,)
    x = np.concatenate([op.coords[:, op.select_indices("ca")], sub.coords[:, ca],
                        cl.coords[:, cl.select_indices("ca")]])
    np.testing.assert_allclose(got, cs.consensus_score(x, device="cpu"), rtol=1e-12)


def test_list_of_arrays_and_integer_coordinates(base):
    rng = np.random.default_rng(0)
    x = [moved(rng, base + rng.normal(size=base.shape)) for _ in range(4)]
    np.testing.assert_allclose(cs.consensus_score(x, device="cpu"), cs.consensus_score(np.stack(x), device="cpu"))
    xi = np.rint(np.stack(x) * 10).astype(np.int32)
    assert cs.consensus_score(xi, device="cpu").dtype == np.float64


def test_errors(adk, datasets, base):
    from protgpu.io import load
    from protgpu.structure import Structure

    x = np.stack([base, base + 1])
    with pytest.raises(InputError, match="at least 2 models"):
        cs.consensus_score(base[None], device="cpu")
    with pytest.raises(InputError, match="shape"):
        cs.consensus_score(base, device="cpu")
    with pytest.raises(InputError, match="no atoms"):
        cs.consensus_score(np.zeros((3, 0, 3)), device="cpu")
    for t in (0, -1.0, np.nan, "warm"):
        with pytest.raises(InputError, match="temperature"):
            cs.consensus_score(x, temperature=t, device="cpu")
    for d0 in (0, -2, np.inf, "x"):
        with pytest.raises(InputError, match="d0"):
            cs.consensus_score(x, d0=d0, device="cpu")
    bad = x.copy()
    bad[1, 5, 2] = np.nan
    with pytest.raises(InputError, match=r"models: NaN or infinite coordinates in frame 1 \(atom 5\)"):
        cs.consensus_score(bad, device="cpu")
    op = load(datasets / "adk_open.pdb")
    with pytest.raises(InputError, match="CA atom count.*adk_open.pdb has 214.*has 50"):
        cs.consensus_score([op, op.select("resid 1-50")], device="cpu")
    with pytest.raises(InputError, match="no CA atoms"):
        cs.consensus_score(Structure.from_coords(np.zeros((2, 5, 3)), source="blob"), device="cpu")
    with pytest.raises(InputError, match="only Structures .* or only"):
        cs.consensus_score([op, base], device="cpu")
    with pytest.raises(InputError, match="different shapes"):
        cs.consensus_score([base, base[:10]], device="cpu")
    with pytest.raises(InputError, match="empty"):
        cs.consensus_score([], device="cpu")
    with pytest.raises(InputError, match="numeric"):
        cs.consensus_score(np.array([[["a", "b", "c"]]] * 2), device="cpu")


# --------------------------------------------------------------------------------------------------
# The ranking table (`protgpu score MODELS... --consensus`)


def test_ranking_table_paths_and_structures(datasets, adk):
    op, cl, dcd = (str(datasets / n) for n in ("adk_open.pdb", "adk_closed.pdb", "adk_dims.dcd"))
    rows = cs.consensus_ranking_table([op, cl, dcd], top=op, device="cpu")
    assert len(rows) == 100
    assert [r["rank"] for r in rows] == list(range(1, 101))
    scores = [r["consensus"] for r in rows]
    assert scores == sorted(scores, reverse=True)
    names = {r["model"] for r in rows}
    assert {"adk_open.pdb", "adk_closed.pdb", "adk_dims.dcd[0]", "adk_dims.dcd[97]"} <= names
    unsorted = cs.consensus_ranking_table([op, cl, dcd], top=op, device="cpu", sort=False)
    assert [r["model"] for r in unsorted[:3]] == ["adk_open.pdb", "adk_closed.pdb", "adk_dims.dcd[0]"]
    by_name = {r["model"]: r for r in rows}
    assert all(by_name[r["model"]] == r for r in unsorted)
    # Structures, a selection, names
    sub = adk.frames(np.arange(5))
    rows = cs.consensus_ranking_table([sub], select="resid 10-100", names=list("abcde"), temperature=1.0,
                                      device="cpu")
    assert sorted(r["model"] for r in rows) == list("abcde")
    ca = sub.select("resid 10-100").select_indices("ca")
    want = cs.consensus_score(sub.select("resid 10-100").coords[:, ca], temperature=1.0, device="cpu")
    assert [r["consensus"] for r in rows] == sorted(want.tolist(), reverse=True)
    with pytest.raises(InputError, match="names"):
        cs.consensus_ranking_table(sub, names=["a"], device="cpu")


def test_ranking_ties_keep_input_order(adk):
    rows = cs.consensus_ranking_table(adk.frames(np.array([0, 0, 60])), device="cpu", sort=False)
    assert [r["rank"] for r in rows] == [1, 2, 3]
    assert rows[0]["consensus"] == pytest.approx(rows[1]["consensus"], rel=1e-9)


def test_import_loads_no_gpu_library():
    code = ("import sys, numpy as np\nimport protgpu.scoring.consensus as c\n"
            "c.consensus_score(np.random.default_rng(0).normal(size=(3, 8, 3)), device='cpu')\n"
            "print([m for m in ('cupy', 'cuda.core', 'nvmath', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
