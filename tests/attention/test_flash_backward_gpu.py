"""GPU parity of the attention's forward with log-sum-exp and its backward
(:mod:`protgpu.attention.flash_backward`) with the NumPy twin in float64 (run on the GPU machine).

Tolerances (DESIGN convention 7): float32 and float64 inputs: the error against float64 NumPy is at most
2x that of the same-precision NumPy twin (plus a floor of a few ulps of the largest value, for entries
whose same-precision error happens to be 0). 16-bit inputs (the NumPy twin has no bfloat16), a stated
bound relative to the largest reference value ``M``: the kernels read 16-bit values and compute in
float32, but P and dS enter the tensor-core products rounded to the input dtype, and dq, dk, dv are
rounded to it on output: two roundings, within ``2 u M + 2e-4 M`` (``u`` = 2^-8 bfloat16, 2^-11 float16;
one rounding was 1.05-1.25x too tight on the H200), and dcoords, dgamma (float32 outputs) within
``2e-4 M``. Every bound has a floor for gradients that vanish (one key: dS = dP - D is 0 exactly, and
its rounding is relative to dP = dO . v, not to the result): the float32 (float64) unit times
``d max|dO| max|v| max(|q|, |k|) / sqrt(d)``, a rounding of dP carried through the scaled product; lse
from the tensor-core forward (P and its row sums in 16-bit, the bias in float16 hi + lo parts) within
``4 u`` absolute. The backward is tested on the twin's out and lse (out rounded to the input dtype, as
the forward would give it), so that its own error is measured.
"""

from __future__ import annotations

import numpy as np
import pytest

from protgpu.attention import flash_backward as fb
from protgpu.attention.reference import attention_backward_numpy, attention_lse_numpy

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

LS = [1, 7, 64, 200, 1000]
DS = [32, 64, 128]
DTYPES = ["bfloat16", "float16", "float32", "float64"]
UNIT = {"bfloat16": 2.0**-8, "float16": 2.0**-11}
# (mask, cutoff) variants
VARIANTS = [(False, None), (True, None), (False, 9.0), (True, 9.0)]


def problem(B, L, H, d, seed=0, mask=False, shared=False, masked_row=False):
    """Random q, k, v, dO; a protein-like random walk (3.8 Angstrom steps); gamma per head; a mask."""
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.normal(size=(B, L, H, d)) for _ in range(4))
    steps = rng.normal(size=(B, L, 3))
    x = np.cumsum(3.8 * steps / np.linalg.norm(steps, axis=-1, keepdims=True), axis=1).astype(np.float32)
    if shared:
        x = x[0]
    gamma = np.resize(np.array([0.0, 0.02, 0.1, 0.3]), H)
    m = None
    if mask or masked_row:
        m = rng.random((B, L)) < 0.8
        if masked_row:
            m[-1] = False  # the last batch entry has no key at all: every row of it gets zeros
    return q, k, v, do, x, gamma, m


def rounded(a, dtype):
    """``a`` rounded to ``dtype`` and back to float64 (what the kernels read)."""
    t = torch.as_tensor(a).to(getattr(torch, dtype))
    return t.double().numpy()


def to_dev(a, dtype):
    return torch.as_tensor(a).to(getattr(torch, dtype)).cuda()


def host(t):
    return t.double().cpu().numpy()


def err(a, ref):
    a = np.asarray(a, dtype=np.float64)
    both_inf = np.isinf(a) & np.isinf(ref) & (np.sign(a) == np.sign(ref))
    return float(np.max(np.where(both_inf, 0.0, np.abs(a - ref)), initial=0.0))


def scale_of(ref):
    f = np.asarray(ref)[np.isfinite(ref)]
    return float(np.max(np.abs(f), initial=0.0))


def run_gpu(dtype, q, k, v, x, gamma, cutoff, m, do, out, lse, scale=None):
    arith = "float64" if dtype == "float64" else "float32"
    xd = torch.as_tensor(x).to(getattr(torch, arith)).cuda()
    md = None if m is None else torch.as_tensor(m).cuda()
    qd, kd, vd = (to_dev(a, dtype) for a in (q, k, v))
    fwd = fb.flash_forward_lse(qd, kd, vd, xd, gamma, cutoff, md, scale)
    bwd = fb.flash_backward(qd, kd, vd, xd, gamma, cutoff, md, scale, to_dev(out, dtype),
                            torch.as_tensor(lse).to(getattr(torch, arith)).cuda(), to_dev(do, dtype))
    torch.cuda.synchronize()
    return [host(a) for a in fwd], [host(a) for a in bwd]


def check(dtype, B, L, H, d, mask=False, cutoff=None, shared=False, masked_row=False, seed=0):
    q, k, v, do, x, gamma, m = problem(B, L, H, d, seed, mask, shared, masked_row)
    q, k, v, do = (rounded(a, dtype) for a in (q, k, v, do))
    xr = x.astype(np.float64) if dtype == "float64" else x.astype(np.float32).astype(np.float64)
    out64, lse64 = attention_lse_numpy(q, k, v, xr, gamma, cutoff, m)
    out_in = rounded(out64, dtype)  # the forward's output as the backward gets it
    ref = attention_backward_numpy(q, k, v, xr, gamma, cutoff, m, None, out_in, lse64, do)
    (out, lse), got = run_gpu(dtype, q, k, v, xr, gamma, cutoff, m, do, out_in, lse64)
    names = ("dq", "dk", "dv", "dcoords", "dgamma")
    acc = float(np.finfo(np.float64 if dtype == "float64" else np.float32).eps)
    floor = acc * np.sqrt(d) * scale_of(do) * scale_of(v) * max(scale_of(q), scale_of(k))
    if dtype in UNIT:
        u = UNIT[dtype]
        assert err(lse, lse64) <= 4 * u + 1e-5 * scale_of(lse64), ("lse", err(lse, lse64))
        assert err(out, out64) <= 4 * u * scale_of(out64) + 1e-6, ("out", err(out, out64))
        for name, g, r in zip(names, got, ref, strict=True):
            bound = (2 * u if name in ("dq", "dk", "dv") else 0.0) * scale_of(r) + 2e-4 * scale_of(r) + floor
            assert err(g, r) <= bound, (name, err(g, r), bound)
    else:
        t = np.dtype(dtype)
        out_t, lse_t = attention_lse_numpy(q, k, v, xr, gamma, cutoff, m, dtype=t)
        ref_t = attention_backward_numpy(q, k, v, xr, gamma, cutoff, m, None, out_in, lse64, do, dtype=t)
        # Floor: a few ulps of the largest value per sqrt(L) terms summed (float64: the twin's own error
        # is 0 by construction, so the floor is the bound).
        ulp = float(np.finfo(t).eps) * (64 if dtype == "float64" else 8)
        for name, g, r, rt in zip(("out", "lse", *names), (out, lse, *got), (out64, lse64, *ref),
                                  (out_t, lse_t, *ref_t), strict=True):
            bound = 2 * err(rt, r) + ulp * scale_of(r) * max(1.0, np.sqrt(L)) + floor
            assert err(g, r) <= bound, (name, err(g, r), bound)
    for a in (out, lse, *got):  # no NaN anywhere (rows without keys give -inf lse and zeros)
        assert not np.isnan(a).any()
    return got, ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", DS)
@pytest.mark.parametrize("L", LS[:4])
@pytest.mark.parametrize("mask,cutoff", VARIANTS)
def test_forward_lse_and_backward_match_numpy(gpu, dtype, d, L, mask, cutoff):
    check(dtype, 2, L, 3, d, mask=mask, cutoff=cutoff)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask,cutoff", VARIANTS)
def test_long_sequence(gpu, dtype, mask, cutoff):
    check(dtype, 1, LS[-1], 2, 64, mask=mask, cutoff=cutoff)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows_give_zeros(gpu, dtype):
    (got, ref) = check(dtype, 3, 50, 2, 32, masked_row=True)
    dq, dk, dv, dx, _ = got
    assert not dq[-1].any() and not dk[-1].any() and not dv[-1].any() and not dx[-1].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cutoff", [None, 9.0])
def test_shared_coordinates_sum_over_batch(gpu, dtype, cutoff):
    got, ref = check(dtype, 3, 70, 2, 64, cutoff=cutoff, mask=True, shared=True)
    assert got[3].shape == (70, 3) and ref[3].shape == (70, 3)


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("tiles", [{"BW_BM": 8, "BW_BN": 8}, {"BW_BM": 16, "BW_BN": 8}, {"BW_BM": 8, "BW_BN": 16},
                                   {"BW_MMA": 0}])
def test_tile_shape_changes_only_rounding(gpu, dtype, tiles, monkeypatch):
    q, k, v, do, x, gamma, m = problem(2, 77, 2, 32, 3, mask=True)
    out64, lse64 = attention_lse_numpy(q, k, v, x, gamma, 9.0, m)
    args = (dtype, q, k, v, x, gamma, 9.0, m, do, out64, lse64)
    simt = {"BW_MMA": 0} if "BW_BM" in tiles else {}  # (tiles are the CUDA-core kernel's)
    monkeypatch.setattr(fb, "BWD_OVERRIDES", simt)
    _, base = run_gpu(*args)
    monkeypatch.setattr(fb, "BWD_OVERRIDES", {**simt, **tiles})
    _, other = run_gpu(*args)
    # 16-bit dq, dk, dv: another summation order may round to the neighbouring 16-bit value, and the
    # tensor-core kernel (BW_MMA, the default for 16-bit) rounds P and dS to 16-bit in its products where
    # the CUDA-core one (BW_MMA=0) does not.
    tol = 1e-12 if dtype == "float64" else 2.0**-6
    for a, b in zip(base, other, strict=True):
        assert err(a, b) <= tol * max(1.0, scale_of(b))


# The tensor-core backward kernels (bwd_config's BW_MMA): mma.sync and wgmma (sm_90a, d = 64, the default there,
# in blocks of 128 keys without cutoff and 64 with one; elsewhere BW_MMA=2 runs the mma.sync kernel, so the "wg"
# cases below test that fallback there). "wg": blocks of 64 keys (BWG_KEYS=64).
# "wg-dqmma": the wgmma kernel with dQ on mma.sync (BWG_DQ_MMA=1, the fallback for its one product whose A
# operand is a transposed shared-memory tile); "wg-bulk": dQ added by bulk reductions (BWG_DQ_BULK=1);
# "wg128", "wg128-dqmma": blocks of 128 keys as two warpgroups (BWG_KEYS=128), dQ split by columns.
WG128 = {"BW_MMA": 2, "BWG_KEYS": 128}
WG64 = {"BW_MMA": 2, "BWG_KEYS": 64}
KERNELS = [pytest.param({"BW_MMA": 1}, id="mma"), pytest.param(WG64, id="wg"),
           pytest.param({**WG64, "BWG_DQ_MMA": 1}, id="wg-dqmma"),
           pytest.param({"BW_MMA": 2, "BWG_DQ_BULK": 1}, id="wg-bulk"),
           pytest.param(WG128, id="wg128"), pytest.param({**WG128, "BWG_DQ_MMA": 1}, id="wg128-dqmma")]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", [16, 32, 64])
@pytest.mark.parametrize("L", [77, 1000])
@pytest.mark.parametrize("mask,cutoff", VARIANTS)
def test_tensor_core_kernels_match_numpy(gpu, monkeypatch, kernel, dtype, d, L, mask, cutoff):
    if len(kernel) > 1 and kernel != WG64 and d != fb.WG_HEAD_DIM:
        pytest.skip("the wgmma kernel's dQ knobs: d = 64 only (elsewhere the mma case again)")
    monkeypatch.setattr(fb, "BWD_OVERRIDES", kernel)
    check(dtype, 2, L, 3, d, mask=mask, cutoff=cutoff, seed=L + d)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_tensor_core_kernels_shared_coordinates_and_empty_rows(gpu, monkeypatch, kernel, dtype):
    monkeypatch.setattr(fb, "BWD_OVERRIDES", kernel)
    got, ref = check(dtype, 3, 70, 2, 64, mask=True, shared=True, cutoff=9.0, seed=4)
    assert got[3].shape == (70, 3)
    got, ref = check(dtype, 3, 130, 2, 64, masked_row=True, seed=5)
    dq, dk, dv, dx, _ = got
    assert not dq[-1].any() and not dk[-1].any() and not dv[-1].any() and not dx[-1].any()


@pytest.mark.parametrize("knobs", [{"BWG_KEYS": 64}, {"BWG_KEYS": 64, "BWG_DQ_MMA": 1}, {"BWG_DQ_BULK": 1},
                                   {"BWG_KEYS": 128}, {"BWG_KEYS": 128, "BWG_DQ_MMA": 1}],
                         ids=["wg", "dqmma", "bulk", "wg128", "wg128-dqmma"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_wgmma_kernel_agrees_with_mma_kernel(gpu, monkeypatch, dtype, knobs):
    from protgpu.attention.flash import wgmma_device

    if not wgmma_device():
        pytest.skip("the wgmma backward needs a compute capability 9.0 device")
    monkeypatch.setattr(fb, "BWD_OVERRIDES", {"BW_MMA": 2, **knobs})
    assert fb.bwd_variant(fb.bwd_config(dtype, 64)) == "wg"
    q, k, v, do, x, gamma, m = problem(2, 333, 4, 64, 8, mask=True)
    q, k, v, do = (rounded(a, dtype) for a in (q, k, v, do))
    out64, lse64 = attention_lse_numpy(q, k, v, x, gamma, None, m)
    args = (dtype, q, k, v, x, gamma, None, m, do, rounded(out64, dtype), lse64)
    _, wg = run_gpu(*args)
    monkeypatch.setattr(fb, "BWD_OVERRIDES", {"BW_MMA": 1})
    _, mma = run_gpu(*args)
    # The same roundings (P, dS to 16-bit in the products) in another summation order: dq, dk, dv may
    # differ by a 16-bit rounding step, dcoords and dgamma by float32 summation order.
    for name, a, b in zip(("dq", "dk", "dv", "dcoords", "dgamma"), wg, mma, strict=True):
        tol = 2.0**-6 if name in ("dq", "dk", "dv") else 1e-4
        assert err(a, b) <= tol * max(1.0, scale_of(b)), (name, err(a, b))


@pytest.mark.parametrize("knobs", [{}, {"BWG_DQ_MMA": 1}], ids=["wg128", "wg128-dqmma"])
@pytest.mark.parametrize("L", [77, 200, 1000])
def test_wgmma_128_keys_agree_with_64(gpu, monkeypatch, L, knobs):
    # Tile independence: each warpgroup of a 128-key block does exactly what a 64-key block does for its
    # keys (the same products on the same query tiles), so dK and dV (plain stores) agree bit for bit;
    # dQ (a K = 128 product), dcoords and dgamma (atomics, 8 warps' partials) only to float32 order.
    from protgpu.attention.flash import wgmma_device

    if not wgmma_device():
        pytest.skip("the wgmma backward needs a compute capability 9.0 device")
    q, k, v, do, x, gamma, m = problem(2, L, 4, 64, 9, mask=True)
    q, k, v, do = (rounded(a, "bfloat16") for a in (q, k, v, do))
    out64, lse64 = attention_lse_numpy(q, k, v, x, gamma, 9.0, m)
    args = ("bfloat16", q, k, v, x, gamma, 9.0, m, do, rounded(out64, "bfloat16"), lse64)
    monkeypatch.setattr(fb, "BWD_OVERRIDES", {**WG128, **knobs})
    assert fb.bwd_block(fb.bwd_config("bfloat16", 64), "wg")[0] == 128
    _, wide = run_gpu(*args)
    monkeypatch.setattr(fb, "BWD_OVERRIDES", {**WG64, **knobs})
    _, base = run_gpu(*args)
    for name, a, b in zip(("dq", "dk", "dv", "dcoords", "dgamma"), wide, base, strict=True):
        if name in ("dk", "dv"):
            assert np.array_equal(a, b), (name, err(a, b))
        else:
            tol = 2.0**-7 if name == "dq" else 1e-4
            assert err(a, b) <= tol * max(1.0, scale_of(b)), (name, err(a, b))


def test_device_gamma_same_result_and_no_host_sync(gpu):
    q, k, v, do, x, gamma, m = problem(2, 130, 4, 64, 5, mask=True)
    qd, kd, vd, dod = (to_dev(a, "bfloat16") for a in (q, k, v, do))
    xd, md = torch.as_tensor(x).cuda(), torch.as_tensor(m).cuda()
    gd = torch.nn.Parameter(torch.as_tensor(gamma, dtype=torch.float32).cuda())

    def both(g):
        out, lse = fb.flash_forward_lse(qd, kd, vd, xd, g, None, md, None)
        return (out, lse, *fb.flash_backward(qd, kd, vd, xd, g, None, md, None, out, lse, dod))

    ref = both(gamma)
    both(gd)  # (first call: compiles, plans)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call in the device-gamma path raises
    try:
        got = both(gd)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    # out, lse, dk, dv are deterministic; dq, dcoords, dgamma are sums by atomics in any order.
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        if i in (0, 1, 3, 4):
            assert torch.equal(a, b)
        else:
            assert torch.allclose(a.float(), b.float(), rtol=1e-2 if i == 2 else 1e-5, atol=1e-5)


def test_cupy_inputs_and_current_stream(gpu):
    cupy = pytest.importorskip("cupy")
    q, k, v, do, x, gamma, m = problem(2, 45, 2, 48, 6, mask=True)
    q, k, v, do = (a.astype(np.float32) for a in (q, k, v, do))
    out64, lse64 = attention_lse_numpy(q, k, v, x, gamma, 9.0, m)
    ref = attention_backward_numpy(q, k, v, x, gamma, 9.0, m, None, out64, lse64, do)
    with cupy.cuda.Stream(non_blocking=True):
        qd, kd, vd, dod = (cupy.asarray(a) for a in (q, k, v, do))
        out, lse = fb.flash_forward_lse(qd, kd, vd, cupy.asarray(x), cupy.asarray(gamma, dtype=cupy.float32), 9.0,
                                        cupy.asarray(m), None)
        got = fb.flash_backward(qd, kd, vd, cupy.asarray(x), gamma, 9.0, cupy.asarray(m), None, out, lse, dod)
        got = [a.get() for a in got]
    assert err(out.get(), out64) < 1e-5 and err(lse.get(), lse64) < 1e-4
    for g, r in zip(got, ref, strict=True):
        assert err(g, r) <= 1e-4 * max(1.0, scale_of(r))


def test_supports():
    cupy = pytest.importorskip("cupy")
    q = torch.zeros((1, 4, 2, 64), dtype=torch.bfloat16, device="cuda")
    assert fb.supports(q) and fb.supports(q, q, q)
    assert not fb.supports(q.cpu())
    assert not fb.supports(torch.zeros((1, 4, 2, 160), device="cuda"))
    assert not fb.supports(q[0])
    assert not fb.supports(q, q.float())
    assert fb.supports(cupy.zeros((1, 3, 1, 16), dtype=cupy.float64))
    assert not fb.supports(np.zeros((1, 3, 1, 16)))


def check_flash_backward_for_sanitizer() -> None:
    """Every entry point of attention_flash_bwd.cu and the *_lse_* ones of attention_flash.cu on small,
    odd sizes (compute-sanitizer section "attention_bwd")."""
    for dtype in DTYPES:
        for L, d, mask, cutoff in ((37, 64, True, None), (5, 48, False, 9.0), (70, 32, True, 9.0),
                                   (19, 128, False, None)):
            check(dtype, 2, L, 3, d, mask=mask, cutoff=cutoff, seed=L)
        check(dtype, 3, 29, 2, 16, shared=True, masked_row=False, mask=True, seed=1)
        check(dtype, 3, 21, 2, 32, masked_row=True, seed=2)
    check_flash_backward_wg_for_sanitizer()
    print("attention_bwd: ok")


def check_flash_backward_wg_for_sanitizer() -> None:
    """The wgmma backward flash_bwd_wg_* in blocks of 64 keys (BW_MMA=2, BWG_KEYS=64; on a device other
    than compute capability 9.0 the mma.sync kernel again) at B = 2, L = 100 (two query tiles, one
    partial; two key blocks), H = 2, d = 64, with mask, with and without a cutoff: small enough for
    racecheck (compute-sanitizer section "attention_bwd_wg")."""
    saved = dict(fb.BWD_OVERRIDES)
    try:
        for knobs, dtype in (({"BWG_KEYS": 64}, "bfloat16"), ({"BWG_KEYS": 64}, "float16"),
                             ({"BWG_KEYS": 64, "BWG_DQ_MMA": 1}, "bfloat16"), ({"BWG_DQ_BULK": 1}, "bfloat16")):
            fb.BWD_OVERRIDES.clear()
            fb.BWD_OVERRIDES.update(saved, BW_MMA=2, **knobs)
            for cutoff in (9.0, None):  # flash_bwd_wg_cut_* and flash_bwd_wg_*
                check(dtype, 2, 100, 2, 64, mask=True, cutoff=cutoff, seed=3)
    finally:
        fb.BWD_OVERRIDES.clear()
        fb.BWD_OVERRIDES.update(saved)
    print("attention_bwd_wg: ok")


def check_flash_backward_wg128_for_sanitizer() -> None:
    """The wgmma backward with BWG_KEYS=128 (two warpgroups a block, dynamic shared memory) at B = 2,
    L = 150 (two key blocks, the second partial; three query tiles, the last partial), H = 2, d = 64, with
    mask, with and without a cutoff, dQ on wgmma and on mma.sync (compute-sanitizer section
    "attention_bwd_wg128")."""
    saved = dict(fb.BWD_OVERRIDES)
    try:
        for knobs, dtype in (({}, "bfloat16"), ({}, "float16"), ({"BWG_DQ_MMA": 1}, "bfloat16")):
            fb.BWD_OVERRIDES.clear()
            fb.BWD_OVERRIDES.update(saved, **WG128, **knobs)
            for cutoff in (9.0, None):
                check(dtype, 2, 150, 2, 64, mask=True, cutoff=cutoff, seed=3)
    finally:
        fb.BWD_OVERRIDES.clear()
        fb.BWD_OVERRIDES.update(saved)
    print("attention_bwd_wg128: ok")
