"""GPU parity of both attention paths (materialised cuBLAS + fused softmax; flash-style fused kernels)
with the NumPy twin and with PyTorch's SDPA, on adenylate kinase CA coordinates (run on the GPU machine).

Accuracy rule (DESIGN convention 7, and the issue): against a float64 NumPy reference, the error of a
GPU path is at most 2x that of a same-precision run: the NumPy twin in float32/float64, PyTorch's
``scaled_dot_product_attention`` with the materialised bias for float16/bfloat16.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_attention import flash_emulate, round16

import protgpu as pg
from protgpu.attention import attention, attention_numpy
from protgpu.attention import flash as att

pytestmark = pytest.mark.gpu

METHODS = ["materialized", "fused"]
GAMMA = np.array([0.0, 0.01, 0.05, 0.2])


def real_problem(datasets, B=2, H=4, d=64, dtype=np.float32, seed=0):
    """CA coordinates of B frames of the ADK trajectory (214 residues) and random q, k, v."""
    t = pg.load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb").select("ca")
    x = np.ascontiguousarray(t.coords[: 40 * B : 40])
    L = x.shape[1]
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(B, L, H, d)).astype(dtype) for _ in range(3))
    return q, k, v, x, np.resize(GAMMA, H)


def err(a, ref):
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - ref)))


def torch_sdpa_reference(torch, q, k, v, x, gamma, cutoff=None, mask=None):
    """Same-precision PyTorch: SDPA with the distance bias materialised (B, H, L, L) in q's dtype."""
    import torch.nn.functional as F

    xd = x.double()
    d2 = ((xd[:, :, None, :] - xd[:, None, :, :]) ** 2).sum(-1)
    bias = -torch.as_tensor(gamma, dtype=torch.float64, device=q.device)[None, :, None, None] * d2[:, None]
    if cutoff is not None:
        bias = bias.masked_fill((d2 > cutoff**2)[:, None], float("-inf"))
    if mask is not None:
        bias = bias.masked_fill(~mask[:, None, None, :], float("-inf"))
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=bias.to(q.dtype))
    return out.transpose(1, 2)


# --------------------------------------------------------------------------------------------------
# float32 / float64 against the NumPy twin


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cutoff, masked", [(None, False), (10.0, True)])
def test_parity_with_numpy_twin(gpu, datasets, method, dtype, cutoff, masked):
    q, k, v, x, gamma = real_problem(datasets, dtype=dtype)
    mask = None
    if masked:
        mask = np.ones(q.shape[:2], bool)
        mask[1, 150:] = False  # padding at the end of the second entry
    got = attention(q, k, v, x, gamma=gamma, cutoff=cutoff, mask=mask, method=method, device="gpu")
    assert isinstance(got, np.ndarray) and got.dtype == dtype and got.shape == q.shape
    kw = dict(gamma=gamma, cutoff=cutoff, mask=mask)
    ref = attention_numpy(q, k, v, x, **kw)
    same = attention_numpy(q, k, v, x, dtype=dtype, **kw)
    floor = 1e-6 if dtype == np.float32 else 1e-13
    assert err(got, ref) <= max(2 * err(same, ref), floor), (err(got, ref), err(same, ref))


@pytest.mark.parametrize("method", METHODS)
def test_cupy_in_cupy_out_with_weights_rows_summing_to_one(gpu, datasets, method):
    q, k, v, x, gamma = real_problem(datasets)
    mask = np.ones(q.shape[:2], bool)
    mask[0] = False  # batch entry 0: every key is padding
    qd, kd, vd, xd, md = (gpu.asarray(a) for a in (q, k, v, x, mask))
    if method == "materialized":
        out, w = attention(qd, kd, vd, xd, gamma=gamma, mask=md, return_weights=True)
        assert isinstance(w, gpu.ndarray) and w.shape == (2, 4, 214, 214) and w.dtype == np.float32
        wh = w.get()
        assert np.isfinite(wh).all() and np.all(wh[0] == 0)
        np.testing.assert_allclose(wh[1].sum(-1), 1.0, rtol=1e-5)
        np.testing.assert_allclose(wh, attention_numpy(q, k, v, x, gamma=gamma, mask=mask, return_weights=True)[1],
                                   atol=1e-6)
    else:
        out = attention(qd, kd, vd, xd, gamma=gamma, mask=md, method="fused")
    assert isinstance(out, gpu.ndarray)
    oh = out.get()
    assert np.isfinite(oh).all() and np.all(oh[0] == 0)  # fully masked rows: zeros, not NaN


def test_weights_to_numpy_equal_the_twin(gpu, datasets):
    q, k, v, x, gamma = real_problem(datasets, B=1, dtype=np.float64)
    out, w = attention(q, k, v, x, gamma=gamma, cutoff=12.0, return_weights=True, device="gpu")
    assert isinstance(w, np.ndarray) and w.dtype == np.float64
    ref_out, ref_w = attention_numpy(q, k, v, x, gamma=gamma, cutoff=12.0, return_weights=True)
    np.testing.assert_allclose(w, ref_w, atol=1e-13)
    np.testing.assert_allclose(out, ref_out, atol=1e-12)


def test_materialized_chunks_equal_one_shot(gpu, datasets, monkeypatch):
    q, k, v, x, gamma = real_problem(datasets)
    one = attention(q, k, v, x, gamma=gamma, method="materialized", device="gpu")
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(3 * 214 * 214 * 4))  # one (batch, head) per chunk
    chunked, w = attention(q, k, v, x, gamma=gamma, return_weights=True, device="gpu")
    np.testing.assert_allclose(chunked, one, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("L", [1, 17, 64, 65, 300])
@pytest.mark.parametrize("d", [8, 40, 64, 128])
def test_fused_float32_lengths_and_head_dims(gpu, L, d):
    rng = np.random.default_rng(L * 1000 + d)
    q, k, v = (rng.normal(size=(2, L, 3, d)).astype(np.float32) for _ in range(3))
    x = rng.normal(scale=10, size=(2, L, 3)).astype(np.float32)
    gamma = np.array([0.0, 0.02, 0.1])
    got = attention(q, k, v, x, gamma=gamma, cutoff=15.0, method="fused", device="gpu")
    ref = attention_numpy(q, k, v, x, gamma=gamma, cutoff=15.0)
    same = attention_numpy(q, k, v, x, gamma=gamma, cutoff=15.0, dtype=np.float32)
    assert err(got, ref) <= max(2 * err(same, ref), 1e-6)


def test_gamma_zero_is_plain_attention_float32(gpu, datasets):
    q, k, v, x, _ = real_problem(datasets)
    for method in METHODS:
        got = attention(q, k, v, x * 100, gamma=0.0, method=method, device="gpu")
        ref = attention_numpy(q, k, v, np.zeros_like(x), gamma=0.0)
        same = attention_numpy(q, k, v, np.zeros_like(x), gamma=0.0, dtype=np.float32)
        assert err(got, ref) <= max(2 * err(same, ref), 1e-6)


# --------------------------------------------------------------------------------------------------
# float16 / bfloat16


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("tdtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("cutoff, masked", [(None, False), (10.0, False), (None, True)])
def test_16bit_within_2x_of_torch_sdpa(gpu, datasets, method, tdtype, cutoff, masked):
    torch = pytest.importorskip("torch")
    q, k, v, x, gamma = real_problem(datasets)
    dt = getattr(torch, tdtype)
    qt, kt, vt = (torch.from_numpy(a).to("cuda", dt) for a in (q, k, v))
    xt = torch.from_numpy(x).cuda()
    mask = None
    if masked:
        mask = torch.ones(q.shape[:2], dtype=torch.bool, device="cuda")
        mask[1, 150:] = False
    got = attention(qt, kt, vt, xt, gamma=gamma, cutoff=cutoff, mask=mask, method=method)
    assert isinstance(got, torch.Tensor) and got.is_cuda and got.dtype == dt and got.shape == qt.shape
    q64, k64, v64 = (a.double().cpu().numpy() for a in (qt, kt, vt))
    mh = None if mask is None else mask.cpu().numpy()
    ref = attention_numpy(q64, k64, v64, x, gamma=gamma, cutoff=cutoff, mask=mh)
    theirs = torch_sdpa_reference(torch, qt, kt, vt, xt, gamma, cutoff, mask)
    e_ours, e_torch = err(got.double().cpu().numpy(), ref), err(theirs.double().cpu().numpy(), ref)
    assert e_ours <= 2 * e_torch, (e_ours, e_torch)
    # Tighter: the tensor-core kernel follows its NumPy emulation to about one 16-bit rounding.
    if method == "fused" and not masked:
        cfg = att.flash_config(64)
        emu = flash_emulate(q64.astype(np.float32), k64.astype(np.float32), v64.astype(np.float32), x, gamma,
                            cutoff=cutoff, block_n=cfg["FA_BLOCK_N"], block_m=att.flash_block_m(cfg),
                            precision=tdtype)
        assert err(got.double().cpu().numpy(), emu.astype(np.float64)) <= (1.6e-2 if tdtype == "bfloat16" else 2e-3)


def test_gamma_zero_16bit_is_plain_sdpa(gpu, datasets):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    q, k, v, x, _ = real_problem(datasets)
    qt, kt, vt = (torch.from_numpy(a).to("cuda", torch.bfloat16) for a in (q, k, v))
    ref = attention_numpy(*(a.double().cpu().numpy() for a in (qt, kt, vt)), x, gamma=0.0)
    plain = F.scaled_dot_product_attention(qt.transpose(1, 2), kt.transpose(1, 2), vt.transpose(1, 2)).transpose(1, 2)
    for method in METHODS:
        got = attention(qt, kt, vt, torch.from_numpy(x * 100).cuda(), gamma=0.0, method=method)
        assert err(got.double().cpu().numpy(), ref) <= 2 * err(plain.double().cpu().numpy(), ref)


@pytest.mark.parametrize("L", [1, 15, 16, 64, 65, 129, 300])
@pytest.mark.parametrize("d", [16, 32, 48, 64, 128, 40])
def test_fused_float16_lengths_and_head_dims(gpu, L, d):
    # CuPy float16 in, CuPy float16 out; d = 40 is not a multiple of 16 and takes the CUDA-core kernel.
    rng = np.random.default_rng(L * 1000 + d)
    q, k, v = (round16(rng.normal(size=(2, L, 3, d)), "float16") for _ in range(3))
    x = rng.normal(scale=10, size=(2, L, 3)).astype(np.float32)
    mask = rng.random((2, L)) < 0.85
    gamma = np.array([0.0, 0.02, 0.1])
    qd, kd, vd = (gpu.asarray(a.astype(np.float16)) for a in (q, k, v))
    for cutoff in (None, 12.0):
        got = attention(qd, kd, vd, gpu.asarray(x), gamma=gamma, cutoff=cutoff, mask=gpu.asarray(mask),
                        method="fused")
        assert got.dtype == np.float16 and got.shape == qd.shape
        ref = attention_numpy(q, k, v, x, gamma=gamma, cutoff=cutoff, mask=mask)
        assert err(got.get(), ref) < 4e-3, (cutoff, err(got.get(), ref))


@pytest.mark.parametrize(
    "overrides",
    [{"FA_BLOCK_N": 16}, {"FA_BLOCK_N": 32}, {"FA_WARPS": 2}, {"FA_WARPS": 8, "FA_MIN_BLOCKS": 1},
     {"FA_STAGES": 1}, {"FA_MIN_BLOCKS": 1}, {"FA_BLOCK_N": 128, "FA_STAGES": 1},
     {"FA_MT": 1}, {"FA_MT": 1, "FA_WARPS": 8, "FA_MIN_BLOCKS": 2}, {"FA_TAU": "0.0f"},
     {"FA_BIAS_MMA": 0}, {"FA_BIAS_MMA": 0, "FA_MT": 1}, {"FA_WGMMA": 0}, {"FA_MT": 1, "FA_MIN_BLOCKS": 3}],
)
def test_tile_configuration_changes_only_rounding(gpu, datasets, monkeypatch, overrides):
    q, k, v, x, gamma = real_problem(datasets)
    qd, kd, vd = (gpu.asarray(a.astype(np.float16)) for a in (q, k, v))
    xd = gpu.asarray(x)
    base = attention(qd, kd, vd, xd, gamma=gamma, method="fused").get().astype(np.float64)
    monkeypatch.setattr(att, "FLASH_OVERRIDES", overrides)
    got = attention(qd, kd, vd, xd, gamma=gamma, method="fused").get().astype(np.float64)
    assert np.max(np.abs(got - base)) <= 2e-3  # one or two float16 roundings of |out| <~ 2


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", ["plain", "masked", "ragged", "negative scale", "zero gamma", "far"])
def test_wgmma_kernel_matches_the_mma_sync_kernel(gpu, monkeypatch, dtype, case):
    """On compute capability 9.0 the d = 64 kernel without a cutoff runs on wgmma (sm_90a): it must be
    the one chosen there, and agree with the mma.sync kernel (FA_WGMMA = 0) to 16-bit rounding and with
    the float64 reference, across masks, lengths that leave partial tiles and blocks, batches, the
    float32-bias fallback (scale < 0) and gamma = 0 (the bias mma skipped)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(len(case))
    d = 64
    B, L, H = (2, 333, 4) if case == "ragged" else (3, 512, 8)  # 333: partial key tiles and query blocks
    q, k, v = (rng.normal(size=(B, L, H, d)).astype(np.float32) for _ in range(3))
    x = (np.cumsum(rng.normal(size=(B, L, 3)), axis=1) * 2.5).astype(np.float32)
    gamma = np.resize([0.0, 0.02, 0.1, 0.5], H)
    scale = None
    mask = None
    if case in ("masked", "ragged"):
        mask = rng.random((B, L)) < 0.8
        mask[0, : L // 2] = False  # whole query and key blocks of padding
    if case == "negative scale":
        scale = -0.05
    if case == "zero gamma":
        gamma = np.zeros(H)
    if case == "far":
        x = x + np.float32(500.0)
    dt = getattr(torch, dtype)
    qt, kt, vt = (torch.from_numpy(a).to("cuda", dt) for a in (q, k, v))
    xt = torch.from_numpy(x).cuda()
    mt = None if mask is None else torch.from_numpy(mask).cuda()
    if gpu.cuda.Device().compute_capability == "90":
        suffix = "bf16" if dtype == "bfloat16" else "f16"
        assert att.flash_entry(dtype, att.flash_config(d), -1.0) == (f"flash_attention_wg_{suffix}", True)
    wg = attention(qt, kt, vt, xt, gamma=gamma, mask=mt, scale=scale, method="fused").double().cpu().numpy()
    monkeypatch.setattr(att, "FLASH_OVERRIDES", {"FA_WGMMA": 0})
    mma = attention(qt, kt, vt, xt, gamma=gamma, mask=mt, scale=scale, method="fused").double().cpu().numpy()
    q64, k64, v64 = (a.double().cpu().numpy() for a in (qt, kt, vt))
    ref = attention_numpy(q64, k64, v64, x, gamma=gamma, mask=mask, scale=scale)
    one = 2.0**-8 if dtype == "bfloat16" else 2.0**-11
    assert np.isfinite(wg).all()
    assert err(wg, ref) <= 1.25 * err(mma, ref) + one, (err(wg, ref), err(mma, ref))
    assert err(wg, mma) <= 4 * one


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_bias_on_tensor_cores_matches_the_float32_bias(gpu, datasets, monkeypatch, dtype):
    """The distance bias as float16 hi/lo channels of one more mma (the default without a cutoff) and
    the float32 bias (3 FMAs a logit, FA_BIAS_MMA=0) give the same output to 16-bit rounding, both
    within the accuracy of the float32 path against a float64 reference, masked keys included."""
    torch = pytest.importorskip("torch")
    q, k, v, x, gamma = real_problem(datasets, H=8)
    gamma = np.array([0.0, 0.005, 0.02, 0.1, 0.3, 1.0, 3.0, 10.0])  # up to a bias of ~1e4 nats
    x = x + np.float32(300.0)  # far from the frame origin: the expansion is about each block's origin
    mask = np.ones(q.shape[:2], bool)
    mask[1, 120:] = False
    dt = getattr(torch, dtype)
    qt, kt, vt = (torch.from_numpy(a).to("cuda", dt) for a in (q, k, v))
    xt, mt = torch.from_numpy(x).cuda(), torch.from_numpy(mask).cuda()
    mma = attention(qt, kt, vt, xt, gamma=gamma, mask=mt, method="fused").double().cpu().numpy()
    monkeypatch.setattr(att, "FLASH_OVERRIDES", {"FA_BIAS_MMA": 0})
    f32 = attention(qt, kt, vt, xt, gamma=gamma, mask=mt, method="fused").double().cpu().numpy()
    q64, k64, v64 = (a.double().cpu().numpy() for a in (qt, kt, vt))
    ref = attention_numpy(q64, k64, v64, x, gamma=gamma, mask=mask)
    one = 2.0**-8 if dtype == "bfloat16" else 2.0**-11  # one 16-bit rounding of |out| <~ 2
    assert err(mma, ref) <= 1.25 * err(f32, ref) + one, (err(mma, ref), err(f32, ref))
    assert err(mma, f32) <= 4 * one


@pytest.mark.parametrize("case", ["negative scale", "kilometre coordinates", "zero gamma"])
def test_bias_fallback_and_degenerate_blocks(gpu, datasets, case):
    """Blocks that cannot take the tensor-core bias (scale <= 0; coordinates spanning so far that a
    float16 channel would overflow) take the float32 path; gamma = 0 on the tensor-core path is plain
    attention. Each against the float64 reference."""
    q, k, v, x, gamma = real_problem(datasets)
    scale = None
    if case == "negative scale":
        scale = -0.1
    elif case == "kilometre coordinates":
        x = x * np.float32(1e4)  # |x_i - x_j| up to ~5e5 A: bias / scale far beyond 2^26
        gamma = gamma * 1e-8
    else:
        gamma = np.zeros_like(gamma)
    qd, kd, vd = (gpu.asarray(a.astype(np.float16)) for a in (q, k, v))
    got = attention(qd, kd, vd, gpu.asarray(x), gamma=gamma, scale=scale, method="fused").get()
    ref = attention_numpy(*(a.astype(np.float16) for a in (q, k, v)), x, gamma=gamma, scale=scale)
    assert np.isfinite(got).all()
    assert err(got, ref) < 4e-3, err(got, ref)


@pytest.mark.parametrize("masked", [False, True])
def test_zero_gamma_whole_tiles_skip_the_bias_mma(gpu, masked):
    """gamma = 0 heads with whole key tiles and no mask skip the bias mma (nothing to add); with a mask
    the mma still carries the masked keys' -inf. Mixed heads (some gamma = 0) in one launch."""
    rng = np.random.default_rng(31)
    L, H, d = 256, 4, 64
    q, k, v = (rng.normal(size=(2, L, H, d)).astype(np.float16) for _ in range(3))
    x = (np.cumsum(rng.normal(size=(2, L, 3)), axis=1) * 2).astype(np.float32)
    gamma = np.array([0.0, 0.0, 0.05, 0.0])
    mask = None
    if masked:
        mask = rng.random((2, L)) < 0.7
    got = attention(*(gpu.asarray(a) for a in (q, k, v)), gpu.asarray(x), gamma=gamma,
                    mask=None if mask is None else gpu.asarray(mask), method="fused").get()
    ref = attention_numpy(q, k, v, x, gamma=gamma, mask=mask)
    assert err(got, ref) < 4e-3, err(got, ref)


# --------------------------------------------------------------------------------------------------
# The fast path (16-bit device arrays straight into the kernel) against the general path


def test_fast_path_equals_general_path_torch(gpu, datasets):
    """Device coordinates (shared (L, 3)) and mask ((L,)) take the fast path with batch stride 0; host
    coordinates and a host (B, L) mask take the general path (DLPack, broadcast copies). Same kernel,
    same configuration: the results must be identical, bit for bit."""
    torch = pytest.importorskip("torch")
    q, k, v, x, gamma = real_problem(datasets, B=3)
    qt, kt, vt = (torch.from_numpy(a).to("cuda", torch.bfloat16) for a in (q, k, v))
    L = q.shape[1]
    mask = np.ones(L, bool)
    mask[200:] = False
    for cutoff in (None, 10.0):
        fast = attention(qt, kt, vt, torch.from_numpy(x[0]).cuda(), gamma=gamma, cutoff=cutoff,
                         mask=torch.from_numpy(mask).cuda())
        general = attention(qt, kt, vt, np.repeat(x[:1], 3, axis=0), gamma=gamma, cutoff=cutoff,
                            mask=np.repeat(mask[None], 3, axis=0))
        assert fast.dtype == torch.bfloat16 and fast.shape == qt.shape
        assert torch.equal(fast, general), cutoff
        # unbatched input: (L, H, d) out
        one = attention(qt[0], kt[0], vt[0], torch.from_numpy(x[0]).cuda(), gamma=gamma, cutoff=cutoff,
                        mask=torch.from_numpy(mask).cuda())
        assert one.shape == qt.shape[1:] and torch.equal(one, fast[0])


def test_fast_path_gamma_and_scale_are_not_mixed_up_between_calls(gpu, datasets):
    torch = pytest.importorskip("torch")
    q, k, v, x, _ = real_problem(datasets, B=1)
    qt, kt, vt = (torch.from_numpy(a).to("cuda", torch.float16) for a in (q, k, v))
    xt = torch.from_numpy(x).cuda()
    q64, k64, v64 = (a.double().cpu().numpy() for a in (qt, kt, vt))
    for gamma, scale in (([0.0, 0.0, 0.0, 0.0], None), ([0.2, 0.1, 0.05, 0.0], None), (0.3, 0.05),
                         ([0.0, 0.0, 0.0, 0.0], None)):
        got = attention(qt, kt, vt, xt, gamma=gamma, scale=scale).double().cpu().numpy()
        ref = attention_numpy(q64, k64, v64, x, gamma=gamma, scale=scale)
        assert err(got, ref) < 4e-3, (gamma, scale)


def test_fast_path_signature_cache_rechecks_what_varies_per_call(gpu, datasets):
    """The fast path keeps its decisions per signature (dtypes, shapes, devices, cutoff, scale); what may
    change between calls of one signature is looked at every call: strides and alignment (a strided or
    misaligned q of the same shape is copied), host gamma values, a device gamma's dtype or rank. Every
    variant equals the general path's result (host coordinates: no fast path)."""
    torch = pytest.importorskip("torch")
    q, k, v, x, _ = real_problem(datasets, B=2)
    qt, kt, vt = (torch.from_numpy(a).to("cuda", torch.bfloat16) for a in (q, k, v))
    xt = torch.from_numpy(x).cuda()
    H = q.shape[2]
    base = torch.empty(qt.numel() + 8, dtype=torch.bfloat16, device="cuda")
    shifted = base[1:1 + qt.numel()].view(qt.shape)  # 2-byte offset: not 16-byte aligned
    shifted.copy_(qt)
    strided = torch.empty((*qt.shape[:-1], 2 * qt.shape[-1]), dtype=torch.bfloat16, device="cuda")[..., ::2]
    strided.copy_(qt)
    g_host = [0.02, 0.05, 0.1, 0.0][:H]
    for gamma in (np.array(g_host), np.array(g_host[::-1]), 0.03, torch.tensor(g_host, device="cuda"),
                  torch.tensor(0.03, device="cuda", dtype=torch.float64),
                  torch.nn.Parameter(torch.tensor(g_host, device="cuda"))):
        g_np = gamma.detach().cpu().numpy() if isinstance(gamma, torch.Tensor) else gamma
        want = attention(qt, kt, vt, x, gamma=g_np)  # host coordinates: the general path
        with torch.no_grad():
            for qq in (qt, shifted, strided, qt):
                got = attention(qq, kt, vt, xt, gamma=gamma)
                assert torch.equal(got, want), (type(gamma), qq.is_contiguous(), qq.data_ptr() % 16)


def test_fast_path_runs_on_torch_current_stream(gpu, datasets):
    torch = pytest.importorskip("torch")
    q, k, v, x, gamma = real_problem(datasets)
    qt, kt, vt = (torch.from_numpy(a).to("cuda", torch.bfloat16) for a in (q, k, v))
    xt = torch.from_numpy(x).cuda()
    base = attention(qt, kt, vt, xt, gamma=gamma)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Inputs made on the side stream just before the call: the kernel must run after them.
        q2, k2, v2 = (a.clone() for a in (qt, kt, vt))
        got = attention(q2, k2, v2, xt, gamma=gamma)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(got, base)


def test_fast_path_cupy_float16_shared_mask_unbatched(gpu, datasets):
    q, k, v, x, gamma = real_problem(datasets, B=1)
    q, k, v = (round16(a[0], "float16") for a in (q, k, v))  # (L, H, d)
    L = q.shape[0]
    mask = np.arange(L) % 7 != 3
    qd, kd, vd = (gpu.asarray(a.astype(np.float16)) for a in (q, k, v))
    for cutoff in (None, 9.0):
        got = attention(qd, kd, vd, gpu.asarray(x[0]), gamma=gamma, cutoff=cutoff, mask=gpu.asarray(mask))
        assert isinstance(got, gpu.ndarray) and got.dtype == np.float16 and got.shape == (L, 4, 64)
        ref = attention_numpy(q, k, v, x[0], gamma=gamma, cutoff=cutoff, mask=mask)
        assert err(got.get(), ref) < 4e-3, cutoff


def test_cutoff_tile_skipping_on_a_long_chain(gpu):
    """A 1500-residue random walk with an 8 Angstrom cutoff: most key tiles lie beyond the cutoff of a
    warp's rows and are skipped whole; the result must still be the definition's."""
    rng = np.random.default_rng(3)
    B, L, H, d = 2, 1500, 2, 32
    steps = rng.normal(size=(B, L, 3))
    x = np.cumsum(3.8 * steps / np.linalg.norm(steps, axis=-1, keepdims=True), axis=1).astype(np.float32)
    q, k, v = (round16(rng.normal(size=(B, L, H, d)), "float16") for _ in range(3))
    mask = rng.random((B, L)) < 0.9
    gamma = np.array([0.02, 0.2])
    qd, kd, vd = (gpu.asarray(a.astype(np.float16)) for a in (q, k, v))
    got = attention(qd, kd, vd, gpu.asarray(x), gamma=gamma, cutoff=8.0, mask=gpu.asarray(mask)).get()
    ref = attention_numpy(q, k, v, x, gamma=gamma, cutoff=8.0, mask=mask)
    assert err(got, ref) < 4e-3
    cfg = att.flash_config(d)
    emu = flash_emulate(q, k, v, x, gamma, cutoff=8.0, mask=mask, block_n=cfg["FA_BLOCK_N"],
                        block_m=att.flash_block_m(cfg), precision="float16")
    assert err(got, emu.astype(np.float64)) < 2e-3


def test_growing_maxima_rescale_many_times(gpu):
    """Logits that grow along the keys by ~58 log2 units: the kernel's rescaling branch runs on many
    tiles, and between them P exceeds 1 (up to 2^FA_TAU)."""
    rng = np.random.default_rng(21)
    L, d = 700, 64
    u = rng.normal(size=d)
    u *= 4.0 / np.linalg.norm(u)  # |u|^2 = 16, scale 1/8: the logit of key j is ~ ramp_j nats
    q = round16(u + 0.3 * rng.normal(size=(1, L, 1, d)), "bfloat16")
    ramp = np.linspace(0.0, 40.0, L)[None, :, None, None]
    k = round16(ramp * u / 2 + 0.1 * rng.normal(size=(1, L, 1, d)), "bfloat16")
    v = round16(rng.normal(size=(1, L, 1, d)), "bfloat16")
    x = (np.cumsum(rng.normal(size=(1, L, 3)), axis=1) * 2).astype(np.float32)
    torch = pytest.importorskip("torch")
    qt, kt, vt = (torch.from_numpy(a).to("cuda", torch.bfloat16) for a in (q, k, v))
    got = attention(qt, kt, vt, torch.from_numpy(x).cuda(), gamma=[0.01]).double().cpu().numpy()
    ref = attention_numpy(q, k, v, x, gamma=[0.01])
    assert err(got, ref) < 3e-2


def test_ml_dtypes_bfloat16_numpy_through_gpu(gpu, datasets):
    # With ml_dtypes, NumPy bfloat16 arrays go through the GPU path and come back as bfloat16.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v, x, gamma = real_problem(datasets, B=1)
    qb, kb, vb = (a.astype(ml_dtypes.bfloat16) for a in (q, k, v))
    got = attention(qb, kb, vb, x, gamma=gamma, device="gpu")
    assert got.dtype == ml_dtypes.bfloat16
    ref = attention_numpy(qb.astype(np.float64), kb.astype(np.float64), vb.astype(np.float64), x, gamma=gamma)
    assert err(got.astype(np.float64), ref) < 2e-2


def test_torch_zero_copy_and_inputs_untouched(gpu):
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 100, 2, 64, device="cuda", dtype=torch.bfloat16)
    keep = q.clone()
    x = torch.randn(1, 100, 3, device="cuda") * 10
    out = attention(q, q, q, x, gamma=torch.tensor([0.0, 0.1]))
    assert out.dtype == torch.bfloat16 and out.device == q.device
    assert torch.equal(q, keep)
    # A view 2 bytes into its storage (not 16-byte aligned, as cp.async needs) is copied, not misread.
    flat = torch.randn(1 + 100 * 2 * 64, device="cuda", dtype=torch.bfloat16)
    view = flat[1:].view(1, 100, 2, 64)
    a = attention(view, view, view, x, gamma=[0.0, 0.1])
    b = attention(view.contiguous(), view.contiguous(), view.contiguous(), x, gamma=[0.0, 0.1])
    assert torch.equal(a, b)


def test_fused_memory_is_linear_in_length_at_16k(gpu):
    """L = 16,384, 8 heads: the materialised path would need 1 GiB per head in float32; the fused path
    allocates little beyond its output."""
    L, H, d = 16384, 8, 64
    rng = np.random.default_rng(0)
    q, k, v = (gpu.asarray(rng.normal(size=(1, L, H, d)).astype(np.float16)) for _ in range(3))
    steps = rng.normal(size=(L, 3))
    x = np.cumsum(3.8 * steps / np.linalg.norm(steps, axis=1, keepdims=True), axis=0).astype(np.float32)[None]
    xd = gpu.asarray(x)
    pool = gpu.get_default_memory_pool()
    gpu.cuda.Device().synchronize()
    pool.free_all_blocks()
    before = pool.total_bytes()
    out = attention(q, k, v, xd, gamma=np.full(H, 0.05), method="fused")
    gpu.cuda.Device().synchronize()
    grown = pool.total_bytes() - before
    assert grown <= 2 * q.nbytes, grown  # the output plus small temporaries (centred coordinates)
    # Spot-check rows against the definition.
    oh = out.get().astype(np.float64)
    q64, k64, v64 = (a.get().astype(np.float64) for a in (q, k, v))
    x64 = x[0].astype(np.float64)
    for i in (0, 5000, L - 1):
        d2 = ((x64 - x64[i]) ** 2).sum(-1)
        for h in range(H):
            t = k64[0, :, h] @ q64[0, i, h] / 8.0 - 0.05 * d2
            p = np.exp(t - t.max())
            row = (p / p.sum()) @ v64[0, :, h]
            assert np.max(np.abs(oh[0, i, h] - row)) < 4e-3


# --------------------------------------------------------------------------------------------------
# For compute-sanitizer (tests/sanitize_kernels.py can call this): every entry point, odd sizes.


def check_attention_for_sanitizer() -> None:
    import cupy

    rng = np.random.default_rng(0)
    for L, d in ((37, 64), (5, 48), (70, 40)):
        q, k, v = (rng.normal(size=(2, L, 3, d)) for _ in range(3))
        x = rng.normal(scale=8, size=(2, L, 3)).astype(np.float32)
        mask = rng.random((2, L)) < 0.8
        gamma = np.array([0.0, 0.05, 0.2])
        for cutoff in (None, 9.0):
            ref = attention_numpy(q, k, v, x, gamma=gamma, cutoff=cutoff, mask=mask)
            for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-4), (np.float16, 5e-3)):
                qd, kd, vd = (cupy.asarray(a.astype(dtype)) for a in (q, k, v))
                ref16 = attention_numpy(*(a.astype(dtype) for a in (q, k, v)), x, gamma=gamma, cutoff=cutoff,
                                        mask=mask) if dtype == np.float16 else ref
                for method in METHODS:
                    if method == "fused" and att.fused_kernel(np.dtype(dtype).name, d) is None:
                        continue
                    got = attention(qd, kd, vd, cupy.asarray(x), gamma=gamma, cutoff=cutoff,
                                    mask=cupy.asarray(mask), method=method)
                    assert err(got.get(), ref16) < tol, ("attention", L, d, dtype, method, cutoff)
                    if dtype == np.float16 and method == "fused":
                        # Host input: the general path (broadcast copies, per-call launch checks) and, for
                        # d % 16 == 0, the tensor-core kernel with its full-batch strides; one shared
                        # (L,) mask on the fast path (batch stride 0).
                        host = attention(*(a.astype(dtype) for a in (q, k, v)), x, gamma=gamma, cutoff=cutoff,
                                         mask=mask, method=method, device="gpu")
                        assert err(host, ref16) < tol, ("attention host", L, d, cutoff)
                        shared = attention(qd, kd, vd, cupy.asarray(x[0]), gamma=gamma, cutoff=cutoff,
                                           mask=cupy.asarray(mask[0]), method=method).get()
                        ref0 = attention_numpy(*(a.astype(dtype) for a in (q, k, v)), x[0], gamma=gamma,
                                               cutoff=cutoff, mask=mask[0])
                        assert err(shared, ref0) < tol, ("attention shared", L, d, cutoff)
    # The tensor-core kernel's float32-bias path (scale <= 0, or coordinates too far apart for the
    # float16 bias channels) on odd sizes.
    for L in (37, 70):
        q, k, v = (rng.normal(size=(2, L, 3, 64)).astype(np.float16) for _ in range(3))
        x = rng.normal(scale=8, size=(2, L, 3)).astype(np.float32)
        mask = rng.random((2, L)) < 0.8
        for xs, scale in ((x, -0.125), (x * np.float32(1e5), 0.125)):
            g = np.array([0.0, 0.05, 0.2]) * (1e-10 if scale > 0 else 1.0)
            got = attention(*(cupy.asarray(a) for a in (q, k, v)), cupy.asarray(xs), gamma=g, scale=scale,
                            mask=cupy.asarray(mask), method="fused")
            ref = attention_numpy(q, k, v, xs, gamma=g, scale=scale, mask=mask)
            assert err(got.get(), ref) < 5e-3, ("attention float32 bias", L, scale)
    # d = 64 without a cutoff runs on wgmma on compute capability 9.0: several query blocks and key
    # tiles (L = 300), and the mma.sync kernel it replaces there (FA_WGMMA = 0), both masked.
    q, k, v = (rng.normal(size=(2, 300, 3, 64)).astype(np.float16) for _ in range(3))
    x = (np.cumsum(rng.normal(size=(2, 300, 3)), axis=1) * 2).astype(np.float32)
    mask = rng.random((2, 300)) < 0.8
    ref = attention_numpy(q, k, v, x, gamma=[0.0, 0.05, 0.2], mask=mask)
    for overrides in ({}, {"FA_WGMMA": 0}):
        saved, att.FLASH_OVERRIDES = att.FLASH_OVERRIDES, overrides
        try:
            got = attention(*(cupy.asarray(a) for a in (q, k, v)), cupy.asarray(x), gamma=[0.0, 0.05, 0.2],
                            mask=cupy.asarray(mask), method="fused")
        finally:
            att.FLASH_OVERRIDES = saved
        assert err(got.get(), ref) < 5e-3, ("attention d = 64", overrides)
    print("attention: ok")


def test_sanitizer_section_runs(gpu):
    check_attention_for_sanitizer()
