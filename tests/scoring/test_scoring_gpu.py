"""GPU parity of the TM-score and lDDT kernels with their NumPy twins (run on the GPU machine).

Real structures, float32 and float64. TM-score: the kernel keeps float32 input in float32 but does its
arithmetic in float64 (QCP superpositions, distances), so both precisions must give the NumPy twin's
numbers; the TM_EVAL_STORAGE=1 knob (float32 distances) may move a pair across a cutoff.
lDDT: conserved counts, with DESIGN convention 7 for float32 (the GPU's error against a float64 run
at most twice a float32 NumPy run's, plus one pair of slack for a tie).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from protgpu.io import load
from protgpu.scoring import lddt, tm_score
from protgpu.scoring import tmscore as tm_mod
from protgpu.scoring.lddt import lddt_counts_cuda, lddt_counts_numpy, lddt_inputs, lddt_scores
from protgpu.scoring.tmscore import tm_inputs, tm_search_cuda, tm_search_numpy

# the module (protgpu.scoring.lddt the attribute is the function of that name)
lddt_mod = importlib.import_module("protgpu.scoring.lddt")

pytestmark = pytest.mark.gpu

PAIRS = ("7SGN_C", "7W1F_B", "T1118v1_LG035_1")


def _pair_paths(shared_datasets, reference_values, key):
    v = reference_values["model_native_pairs"][key]
    return shared_datasets / v["model"], shared_datasets / v["native"]


# --------------------------------------------------------------------------------------------------
# TM-score


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_aligned_rmsd_kernel_matches_twin_and_ignores_batching(gpu, dtype):
    """The scores' RMSD column: GPU kernel vs the float64 NumPy Kabsch, and bitwise the same value for a
    model whatever the batch's size, order or padded length (resumed runs must write identical rows)."""
    rng = np.random.default_rng(11)
    n_ali = np.array([3, 31, 32, 33, 64, 97, 150, 150], dtype=np.int64)
    lmax = 160
    y = rng.normal(0, 12, (len(n_ali), lmax, 3))
    x = y + rng.normal(0, 1.0, y.shape)
    rot = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    rot *= np.sign(np.linalg.det(rot))
    x = x @ rot.T + 40.0
    x[-1] = y[-1]  # identical: the near-identical branch
    x, y = x.astype(dtype), y.astype(dtype)
    for i, n in enumerate(n_ali):  # padding holds garbage, which must be ignored
        x[i, n:] = 1e6
        y[i, n:] = -1e6
    want = tm_mod._common_rmsd(x.astype(np.float64), y.astype(np.float64), n_ali, np)
    got = gpu.asnumpy(tm_mod._common_rmsd(gpu.asarray(x), gpu.asarray(y), n_ali, gpu))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    assert got[-1] < 1e-6
    # one model at a time, with its own (shorter) padded length, and the batch reversed
    for i, n in enumerate(n_ali):
        alone = tm_mod._common_rmsd(gpu.asarray(x[i:i + 1, :n]), gpu.asarray(y[i:i + 1, :n]), n_ali[i:i + 1], gpu)
        assert float(alone[0]) == got[i]
    rev = gpu.asnumpy(tm_mod._common_rmsd(gpu.asarray(x[::-1].copy()), gpu.asarray(y[::-1].copy()), n_ali[::-1], gpu))
    assert np.array_equal(rev[::-1], got)
    # one shared reference row (y_step 0)
    shared = gpu.asnumpy(tm_mod._common_rmsd(gpu.asarray(x[4:6]), gpu.asarray(y[4:5]), n_ali[4:6], gpu))
    want_shared = tm_mod._common_rmsd(x[4:6].astype(np.float64), y[4:5].astype(np.float64), n_ali[4:6], np)
    np.testing.assert_allclose(shared, want_shared, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("key", PAIRS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tm_kernel_parity_on_real_pairs(gpu, shared_datasets, reference_values, key, dtype):
    model, native = _pair_paths(shared_datasets, reference_values, key)
    batch, params = tm_inputs(model, native, dtype=dtype)
    cpu = tm_search_numpy(batch.x, batch.y, batch.n_ali, params)
    dev = tm_search_cuda(gpu.asarray(batch.x), gpu.asarray(batch.y), batch.n_ali, params)
    got = {k: gpu.asnumpy(v) for k, v in dev.items()}
    # float32 storage, float64 arithmetic (the default): the twin's numbers up to summation order
    np.testing.assert_allclose(got["score"], cpu["score"], atol=1e-10)
    np.testing.assert_array_equal(got["gdt_counts"], cpu["gdt_counts"])
    np.testing.assert_allclose(got["maxsub_sum"], cpu["maxsub_sum"], atol=1e-8)
    np.testing.assert_allclose(got["rotation"], cpu["rotation"], atol=1e-7)
    np.testing.assert_allclose(got["translation"], cpu["translation"], atol=1e-5)
    assert np.allclose(np.linalg.det(got["rotation"]), 1.0)


@pytest.mark.parametrize("key", PAIRS)
def test_tm_kernel_float32_evaluation_knob(gpu, shared_datasets, reference_values, key, monkeypatch):
    # TM_EVAL_STORAGE=1: float32 distance arithmetic; a pair may cross a cutoff, so GDT may move by
    # one pair and the TM-score by ~1e-6
    model, native = _pair_paths(shared_datasets, reference_values, key)
    batch, params = tm_inputs(model, native, dtype=np.float32)
    cpu = tm_search_numpy(batch.x, batch.y, batch.n_ali, params)
    monkeypatch.setattr(tm_mod, "_TM_EVAL_STORAGE", 1)
    dev = tm_search_cuda(gpu.asarray(batch.x), gpu.asarray(batch.y), batch.n_ali, params)
    np.testing.assert_allclose(gpu.asnumpy(dev["score"]), cpu["score"], atol=1e-5)
    assert np.abs(gpu.asnumpy(dev["gdt_counts"]) - cpu["gdt_counts"]).max() <= 1


@pytest.mark.parametrize("key", PAIRS)
def test_tm_reference_values_on_gpu(gpu, shared_datasets, reference_values, key):
    model, native = _pair_paths(shared_datasets, reference_values, key)
    prog = reference_values["model_native_pairs"][key]["TMscore_program"]
    r = tm_score(model, native, device="gpu")
    assert isinstance(r.tm, float)
    assert r.tm == pytest.approx(prog["tm_score"], abs=1e-4)
    assert r.gdt_ts == pytest.approx(prog["gdt_ts"], abs=1e-4) and r.gdt_ha == pytest.approx(prog["gdt_ha"], abs=1e-4)
    assert r.maxsub == pytest.approx(prog["maxsub"], abs=1e-4)
    assert r.rmsd == pytest.approx(prog["rmsd_common"], abs=1e-3)


def test_tm_batch_of_different_lengths_and_ensemble(gpu, shared_datasets, reference_values):
    ens = reference_values["nmr_ensemble"]
    s = load(shared_datasets / ens["file"])
    r = tm_score(s, s.frames(0), device="gpu")
    np.testing.assert_allclose(r.tm, ens["own_tmscore_vs_model0_ca_norm_by_model0"], atol=1e-9)
    model, native = _pair_paths(shared_datasets, reference_values, "7SGN_C")
    m = load(model)
    models = [m, m.select("resid 10-70"), load(native), m.select("resid 40-100")]
    cpu = tm_score(models, native, device="cpu")
    dev = tm_score(models, native, device="gpu")
    for f in ("tm", "gdt_ts", "gdt_ha", "maxsub", "rmsd"):
        np.testing.assert_allclose(getattr(dev, f), getattr(cpu, f), atol=1e-9, err_msg=f)
    np.testing.assert_array_equal(dev.n_aligned, cpu.n_aligned)


def test_tm_cupy_in_cupy_out_and_chunking(gpu, shared_datasets, reference_values, monkeypatch):
    model, native = _pair_paths(shared_datasets, reference_values, "7SGN_C")
    batch, _ = tm_inputs(model, native, dtype=np.float32)
    rng = np.random.default_rng(0)
    n = int(batch.n_ali[0])
    x = batch.x[0, :n] + rng.normal(scale=1.5, size=(40, n, 3)).astype(np.float32)
    y = batch.y[0, :n]
    whole = tm_score(gpu.asarray(x), gpu.asarray(y))
    assert isinstance(whole.tm, gpu.ndarray) and whole.tm.shape == (40,) and whole.rotation.shape == (40, 3, 3)
    cpu = tm_score(x[:6], y, device="cpu")
    np.testing.assert_allclose(gpu.asnumpy(whole.tm[:6]), cpu.tm, atol=1e-9)
    # chunks of 3 models and another warp count per block change nothing
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(3 * (2 * n * 3 * 4 + 4096)))
    monkeypatch.setattr(tm_mod, "_TM_WARPS", 8)
    again = tm_score(gpu.asarray(x), gpu.asarray(y))
    np.testing.assert_allclose(gpu.asnumpy(again.tm), gpu.asnumpy(whole.tm), atol=1e-12)
    np.testing.assert_array_equal(gpu.asnumpy(again.gdt_fractions), gpu.asnumpy(whole.gdt_fractions))


def test_tm_long_chain_without_shared_memory(gpu):
    # 1,100 residues in float64 do not fit the block's shared memory: the kernel reads global memory
    rng = np.random.default_rng(5)
    steps = rng.normal(size=(1100, 3))
    ref = np.cumsum(3.8 * steps / np.linalg.norm(steps, axis=1, keepdims=True), axis=0) * 0.5
    model = ref + rng.normal(scale=2.0, size=ref.shape)
    model[550:] += 4.0
    cpu = tm_score(model, ref, device="cpu")
    dev = tm_score(model, ref, device="gpu")
    assert dev.tm == pytest.approx(cpu.tm, abs=1e-10)
    assert dev.gdt_ts == pytest.approx(cpu.gdt_ts, abs=1e-12) and dev.maxsub == pytest.approx(cpu.maxsub, abs=1e-9)


# --------------------------------------------------------------------------------------------------
# lDDT


@pytest.fixture(scope="module")
def lddt_prepared(shared_datasets, reference_values):
    out = {}
    for key in PAIRS:
        model, native = _pair_paths(shared_datasets, reference_values, key)
        out[key] = lddt_inputs(model, native)
    return out


@pytest.mark.parametrize("key", PAIRS)
@pytest.mark.parametrize("symmetry", [True, False])
def test_lddt_kernel_parity_on_real_pairs(gpu, lddt_prepared, key, symmetry):
    ref, coords, _ = lddt_prepared[key]
    c64 = lddt_counts_numpy(coords, ref, symmetry=symmetry)
    g64 = lddt_counts_cuda(gpu.asarray(coords), ref, symmetry=symmetry)
    np.testing.assert_array_equal(gpu.asnumpy(g64), c64)
    c32 = lddt_counts_numpy(coords.astype(np.float32), ref, symmetry=symmetry)
    g32 = gpu.asnumpy(lddt_counts_cuda(gpu.asarray(coords.astype(np.float32)), ref, symmetry=symmetry))
    err_np = np.abs(c32 - c64).sum()
    err_gpu = np.abs(g32 - c64).sum()
    assert err_gpu <= 2 * err_np + 1
    np.testing.assert_array_equal(g32 < 0, c64 < 0)


@pytest.mark.parametrize("key", PAIRS)
def test_lddt_reference_values_on_gpu(gpu, shared_datasets, reference_values, key):
    model, native = _pair_paths(shared_datasets, reference_values, key)
    L = reference_values["model_native_pairs"][key]["lddt"]
    assert lddt(model, native, device="gpu") == pytest.approx(L["all_atom_ost_like_with_symmetry"], abs=1e-4)
    assert lddt(model, native, symmetry=False, device="gpu") == pytest.approx(L["all_atom_biotite"], abs=1e-4)
    assert lddt(model, native, atoms="ca", device="gpu") == pytest.approx(L["ca_ost_like"], abs=1e-4)


def test_lddt_per_residue_and_ensemble(gpu, shared_datasets, reference_values):
    model, native = _pair_paths(shared_datasets, reference_values, "7SGN_C")
    P = reference_values["model_native_pairs"]["7SGN_C"]["lddt_per_residue"]
    _, per = lddt(model, native, per_residue=True, device="gpu")
    exp = np.array([np.nan if v is None else v for v in P["all_atom_ost_like_with_symmetry"]])
    np.testing.assert_array_equal(np.isnan(per), np.isnan(exp))
    np.testing.assert_allclose(per, exp, atol=1e-4)
    ens = reference_values["nmr_ensemble"]
    s = load(shared_datasets / ens["file"])
    np.testing.assert_allclose(lddt(s, s.frames(0), symmetry=False, device="gpu"),
                               ens["biotite_lddt_vs_model0_heavy"], atol=1e-5)


def test_lddt_cupy_in_cupy_out_tiles_and_chunks(gpu, shared_datasets, reference_values, monkeypatch):
    _, native = _pair_paths(shared_datasets, reference_values, "7W1F_B")
    ref_s = load(native)
    rng = np.random.default_rng(1)
    x = ref_s.coords + rng.normal(scale=1.0, size=(12, ref_s.n_atoms, 3)).astype(np.float32)
    got = lddt(gpu.asarray(x), ref_s, per_residue=True)
    assert isinstance(got[0], gpu.ndarray) and got[0].shape == (12,) and got[1].shape == (12, 473)
    ref, coords, _ = lddt_inputs(list(x[:3]), ref_s)
    exp, _ = lddt_scores(lddt_counts_numpy(coords, ref), ref, 4)
    np.testing.assert_allclose(gpu.asnumpy(got[0][:3]), exp, atol=2e-5)
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(5 * ref_s.n_atoms * 12))
    monkeypatch.setattr(lddt_mod, "_WARPS", 4)
    again = lddt(gpu.asarray(x), ref_s, per_residue=True)
    np.testing.assert_array_equal(gpu.asnumpy(again[1]), gpu.asnumpy(got[1]))


# --------------------------------------------------------------------------------------------------
# compute-sanitizer section (tests/sanitize_kernels.py: "scoring")


def check_scoring_for_sanitizer() -> None:
    """Every scoring entry point on small odd-sized inputs, with and without shared-memory staging,
    checked against the NumPy twins. Run under compute-sanitizer by tests/sanitize_kernels.py."""
    import cupy

    rng = np.random.default_rng(7)
    steps = rng.normal(size=(37, 3))
    ref = np.cumsum(3.8 * steps / np.linalg.norm(steps, axis=1, keepdims=True), axis=0) * 0.6
    models = [ref[:n] + rng.normal(scale=s, size=(n, 3)) for n, s in ((5, 0.5), (37, 2.0), (33, 4.0))]
    for dtype in (np.float32, np.float64):
        for smem in (48 * 1024, 0):
            tm_mod._SMEM_LIMIT = smem
            try:
                batch, params = tm_inputs([m.astype(dtype) for m in models], ref.astype(dtype), dtype=dtype)
                cpu = tm_search_numpy(batch.x, batch.y, batch.n_ali, params)
                dev = tm_search_cuda(cupy.asarray(batch.x), cupy.asarray(batch.y), batch.n_ali, params)
                assert np.allclose(cupy.asnumpy(dev["score"]), cpu["score"], atol=1e-9), ("tm", dtype, smem)
                assert (cupy.asnumpy(dev["gdt_counts"]) == cpu["gdt_counts"]).all(), ("gdt", dtype, smem)
            finally:
                tm_mod._SMEM_LIMIT = 48 * 1024
    s = load(__import__("pathlib").Path(__file__).resolve().parents[2] / "datasets" / "adk_open.pdb")
    s = s.select("resid 1-23")
    x = s.coords + rng.normal(scale=0.8, size=(3, s.n_atoms, 3)).astype(np.float32)
    ref_l, coords, _ = lddt_inputs([s.select("not resid 4"), *x], s)
    for dtype in (np.float32, np.float64):
        for smem in (48 * 1024, 0):
            lddt_mod._SMEM_LIMIT = smem
            try:
                for sym in (True, False):
                    c = coords.astype(dtype)
                    got = cupy.asnumpy(lddt_counts_cuda(cupy.asarray(c), ref_l, symmetry=sym))
                    exp = lddt_counts_numpy(c, ref_l, symmetry=sym)
                    assert np.abs(got - exp).sum() <= 2, ("lddt", dtype, smem, sym)
            finally:
                lddt_mod._SMEM_LIMIT = 48 * 1024
    print("scoring: ok")


@pytest.mark.gpu
@pytest.mark.parametrize("n_finite", [0, 2, 5, 40])
def test_device_input_with_nan_coordinates_ends(gpu, n_finite):
    """Device input is not scanned (that would synchronise the caller's stream), so the kernel's cutoff
    widening must end by itself when fewer than three distances can ever pass: NaN in, NaN or a number
    out, never a hang."""
    import protgpu as pg

    y = np.random.default_rng(1).normal(size=(40, 3)) * 10
    x = y + 0.5
    x[n_finite:] = np.nan
    r = pg.tm_score(gpu.asarray(x), gpu.asarray(y))
    tm = float(gpu.asnumpy(r.tm))
    assert np.isnan(tm) or 0.0 <= tm <= 1.0
