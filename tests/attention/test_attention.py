"""Distance-biased attention on the CPU: the NumPy twin against brute force, its invariances, input
handling, the bfloat16 conversions, and a NumPy emulation of the tensor-core kernel's algorithm (tiles,
online softmax, expanded bias, 16-bit P) that pins down its numerics before any GPU runs it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protgpu
from protgpu.attention import (
    attention,
    attention_numpy,
    bf16_bits_to_float32,
    choose_method,
    flash_config,
    flash_smem_bytes,
    float32_to_bf16_bits,
    fused_kernel,
)
from protgpu.attention import fast as att_fast
from protgpu.attention import flash as att
from protgpu.errors import InputError, MemoryBudgetError

# --------------------------------------------------------------------------------------------------
# helpers


def brute_force(q, k, v, x, gamma, cutoff=None, mask=None, scale=None):
    """Dense float64 attention straight from the definition, (B, L, H, d) in, plus weights."""
    q, k, v, x = (np.asarray(a, dtype=np.float64) for a in (q, k, v, x))
    B, L, H, d = q.shape
    scale = 1 / math.sqrt(d) if scale is None else scale
    logits = scale * np.einsum("bihd,bjhd->bhij", q, k)
    d2 = ((x[:, :, None, :] - x[:, None, :, :]) ** 2).sum(-1)  # (B, L, L)
    logits = logits - np.asarray(gamma, dtype=np.float64)[None, :, None, None] * d2[:, None]
    bad = np.zeros((B, 1, L, L), dtype=bool)
    if cutoff is not None:
        bad |= (d2 > cutoff**2)[:, None]
    if mask is not None:
        bad |= ~np.asarray(mask, bool)[:, None, None, :]
    logits = np.where(bad, -np.inf, logits)
    w = np.zeros_like(logits)
    for idx in np.ndindex(B, H, L):
        row = logits[idx]
        if np.isfinite(row).any():
            e = np.exp(row - row[np.isfinite(row)].max())
            w[idx] = e / e.sum()
    return np.einsum("bhij,bjhd->bihd", w, v), w


def problem(rng, B=2, L=23, H=3, d=8, spread=8.0, dtype=np.float32):
    q, k, v = (rng.normal(size=(B, L, H, d)).astype(dtype) for _ in range(3))
    x = (rng.normal(scale=spread, size=(B, L, 3)) + 30.0).astype(np.float32)
    gamma = rng.uniform(0.0, 0.2, size=H)
    return q, k, v, x, gamma


def round16(a, precision):
    """float32 -> 16-bit -> float32, as the kernels round."""
    a = np.asarray(a, dtype=np.float32)
    if precision == "bfloat16":
        return bf16_bits_to_float32(float32_to_bf16_bits(a))
    return a.astype(np.float16).astype(np.float32)


def _ilogb(z) -> int:
    return int(np.frexp(np.float32(z))[1]) - 1


def _split16(a):
    """float32 -> (hi, lo) float16 parts as float32: hi = a rounded, lo = the rest rounded."""
    a = np.asarray(a, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        hi = a.astype(np.float16).astype(np.float32)
        lo = (a - hi).astype(np.float16).astype(np.float32)
    return hi, lo


def _tensor_core_bias(x, keep, rows, origin, gamma_h, scale):
    """The kernel's float16-channel bias of one block (q.k units, i.e. bias / scale), (rows, L), or
    None where the block takes the float32 bias (scale <= 0, or coordinates too far apart)."""
    f32 = np.float32
    if not scale > 0:
        return None
    xq = x[rows] - origin
    fin = np.isfinite(xq).all(-1)
    rq = f32((xq[fin] ** 2).sum(-1, dtype=f32).max()) if fin.any() else f32(0)
    xk = x - origin
    rk = f32((xk[keep] ** 2).sum(-1, dtype=f32).max()) if keep.any() else f32(0)
    g = f32(f32(2) * f32(gamma_h) / f32(scale))
    ag = abs(g)
    if not (np.isfinite(ag * max(rq, rk)) and ag * max(rq, rk) < 2.0**26):
        return None
    gq, rkk = ag * np.sqrt(rq), np.sqrt(rk)
    tmax = 13 - _ilogb(rkk) if rkk > 0 else 100
    tmin = _ilogb(gq) - 13 if gq > 0 else -100
    t = min(100, max(-100, (tmin + tmax) >> 1))
    wmax = f32(0.5) * ag * rk
    a = max(0, _ilogb(wmax) - 13) if wmax > 0 else 0
    u_scale = f32(np.ldexp(g, -t)) if rkk > 0 else f32(0)
    uh, ul = _split16(u_scale * xq)
    vh, vl = _split16(xk * f32(np.ldexp(1.0, t)))
    wh, wl = _split16(f32(np.ldexp(-0.5 * g, -a)) * (xk**2).sum(-1, dtype=f32))
    vh[~keep], vl[~keep], wh[~keep], wl[~keep] = 0, 0, -np.inf, 0
    d64 = np.float64
    with np.errstate(invalid="ignore"):
        acc = (uh.astype(d64) @ vh.T.astype(d64) + uh.astype(d64) @ vl.T.astype(d64)
               + ul.astype(d64) @ vh.T.astype(d64) + d64(2.0**a) * (wh.astype(d64) + wl.astype(d64)))
    return acc.astype(f32)


def flash_emulate(q, k, v, x, gamma, *, cutoff=None, mask=None, scale=None, block_n=64, block_m=128,
                  precision="bfloat16", tau=8.0, bias="mma"):
    """NumPy mirror of attention_flash.cu on 16-bit-representable float32 inputs: without a cutoff the
    bias is expanded about the first real query residue of each block of ``block_m`` rows, either as
    the kernel's float16 hi/lo channels on the tensor cores (``bias="mma"``, the default; logits in
    q.k units) or in float32 (``bias="f32"``, FA_BIAS_MMA=0, and blocks that cannot take the channels;
    logits in log2 units); key tiles of ``block_n``; per row a reference maximum that moves only when a
    tile's maximum exceeds it by more than ``tau`` log2 units (lazy rescaling), and the running sum; P
    rounded to 16 bits before P V and before it is summed; the output rounded to 16 bits."""
    f32 = np.float32
    q, k, v = (np.asarray(a, f32) for a in (q, k, v))
    B, L, H, d = q.shape
    log2e = f32(1.4426950408889634)
    sc = f32(1 / math.sqrt(d) if scale is None else scale)
    sl2 = f32(sc * log2e)
    keep = np.ones((B, L), bool) if mask is None else np.asarray(mask, bool)
    x = np.asarray(x, f32)
    c2 = f32(-1.0 if cutoff is None else cutoff**2)
    out = np.zeros_like(q)
    for b, h, r0 in np.ndindex(B, H, (L + block_m - 1) // block_m):
        rows = slice(r0 * block_m, min(L, (r0 + 1) * block_m))
        gl2 = f32(f32(gamma[h]) * log2e)
        tc = None
        if cutoff is None:
            finite = np.isfinite(x[b, rows]).all(-1)
            real = np.flatnonzero(keep[b, rows] & finite)
            real = real if len(real) else np.flatnonzero(finite)  # no real row: the first finite one
            origin = x[b, rows][real[0]] if len(real) else np.zeros(3, f32)
            xr = x[b] - origin
            a = f32(2) * gl2 * xr[rows]  # query side, pre-multiplied
            wk = np.where(keep[b], -gl2 * (xr**2).sum(-1, dtype=f32), f32(-np.inf)).astype(f32)
            if bias == "mma":
                tc = _tensor_core_bias(x[b], keep[b], rows, origin, gamma[h], sc)
        # units of the logits: log2 (float32 bias) or q.k (tensor-core bias: 2^(t sl2) is the weight)
        unit = f32(1) if tc is None else sl2
        n = rows.stop - rows.start
        m = np.full(n, -np.inf, f32)
        lsum = np.zeros(n, f32)
        acc = np.zeros((n, d), f32)
        for n0 in range(0, L, block_n):
            n1 = min(L, n0 + block_n)
            s = q[b, rows, h] @ k[b, n0:n1, h].T
            if tc is not None:
                t = tc[:, n0:n1] + s
            elif cutoff is None:
                t = s * sl2 + (a @ xr[n0:n1].T + wk[n0:n1])
            else:
                diff = x[b, rows, None, :] - x[b, None, n0:n1, :]
                d2 = (diff**2).sum(-1, dtype=f32)
                t = s * sl2 - gl2 * d2
                t = np.where((d2 > c2) | ~keep[b, None, n0:n1], f32(-np.inf), t)
            tm = t.max(1)
            up = tm > m + f32(tau) / unit  # -inf + tau = -inf: the first real logit moves the reference
            with np.errstate(invalid="ignore", over="ignore"):
                corr = np.where(up, np.exp2((m - tm) * unit), f32(1)).astype(f32)
            m = np.where(up, tm, m)
            mu = np.where(m == -np.inf, f32(0), m)
            with np.errstate(invalid="ignore"):
                p16 = round16(np.exp2(t * unit - mu[:, None] * unit), precision)  # summed as multiplied
            lsum = lsum * corr + p16.sum(1)
            acc = acc * corr[:, None] + p16 @ v[b, n0:n1, h]
        inv = np.divide(f32(1), lsum, out=np.zeros_like(lsum), where=lsum > 0)
        out[b, rows, h] = round16(acc * inv[:, None], precision)
    return out


def torch_like_bf16(q, k, v, x, gamma, precision="bfloat16"):
    """What a same-precision PyTorch SDPA with a materialised bias does (memory-efficient kernel): the
    bias tensor is stored in the 16-bit dtype, logits and softmax in float32, P and the output rounded
    to 16 bits."""
    q, k, v = (np.asarray(a, np.float32) for a in (q, k, v))
    B, L, H, d = q.shape
    d2 = ((x[:, :, None].astype(np.float64) - x[:, None]) ** 2).sum(-1)
    bias = round16(-np.asarray(gamma)[None, :, None, None] * d2[:, None], precision)
    logits = np.einsum("bihd,bjhd->bhij", q, k) / np.float32(math.sqrt(d)) + bias
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return round16(np.einsum("bhij,bjhd->bihd", round16(p, precision), v), precision)


# --------------------------------------------------------------------------------------------------
# The NumPy twin against brute force


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 3),
    L=st.integers(1, 20),
    H=st.integers(1, 3),
    d=st.integers(1, 9),
    use_cutoff=st.booleans(),
    use_mask=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_twin_matches_brute_force(B, L, H, d, use_cutoff, use_mask, seed):
    rng = np.random.default_rng(seed)
    q, k, v, x, gamma = problem(rng, B, L, H, d, dtype=np.float64)
    cutoff = float(rng.uniform(3, 15)) if use_cutoff else None
    mask = rng.random((B, L)) < 0.7 if use_mask else None
    out, w = attention_numpy(q, k, v, x, gamma=gamma, cutoff=cutoff, mask=mask, return_weights=True)
    ref_out, ref_w = brute_force(q, k, v, x, gamma, cutoff, mask)
    np.testing.assert_allclose(out, ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w, ref_w, rtol=1e-10, atol=1e-12)
    assert np.isfinite(out).all()


def test_twin_row_blocks_match_brute_force():
    # attention_numpy takes (1 << 20) // L query rows at a time: L = 1500 makes three blocks.
    rng = np.random.default_rng(3)
    q, k, v, x, gamma = problem(rng, 1, 1500, 1, 4, spread=20, dtype=np.float64)
    out = attention_numpy(q, k, v, x, gamma=gamma, cutoff=12.0)
    ref, _ = brute_force(q, k, v, x, gamma, 12.0)
    np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-12)


def test_weights_rows_sum_to_one_and_exclusions_get_zero():
    rng = np.random.default_rng(1)
    q, k, v, x, gamma = problem(rng, 2, 30, 4, 8)
    mask = np.ones((2, 30), bool)
    mask[0, 25:] = False
    _, w = attention(q, k, v, x, gamma=gamma, cutoff=10.0, mask=mask, return_weights=True, device="cpu")
    assert w.shape == (2, 4, 30, 30) and w.dtype == np.float32
    d = np.linalg.norm(x[:, :, None].astype(np.float64) - x[:, None], axis=-1)
    excluded = (d > 10.0) | ~mask[:, None, :]  # (B, L, L)
    has_key = ~excluded.all(-1)  # rows with at least one key left sum to 1, the others are all zero
    np.testing.assert_allclose(w.sum(-1), np.broadcast_to(has_key[:, None], (2, 4, 30)).astype(float), rtol=1e-6)
    assert not has_key.all()  # the case of a row with no key occurs here (a padded residue far out)
    assert np.all(w[0, :, :, 25:] == 0)
    assert np.all(w[np.broadcast_to(excluded[:, None], w.shape)] == 0)


def test_fully_masked_rows_give_zeros_not_nan():
    rng = np.random.default_rng(2)
    q, k, v, x, gamma = problem(rng, 2, 12, 2, 4)
    mask = np.ones((2, 12), bool)
    mask[1] = False  # no key at all in batch entry 1
    out, w = attention(q, k, v, x, gamma=gamma, mask=mask, return_weights=True, device="cpu")
    assert np.isfinite(out).all() and np.isfinite(w).all()
    assert np.all(out[1] == 0) and np.all(w[1] == 0)
    np.testing.assert_allclose(w[0].sum(-1), 1.0, rtol=1e-6)
    # A cutoff smaller than every distance still leaves each residue its own key (distance 0).
    out2, w2 = attention(q, k, v, x, gamma=gamma, cutoff=1e-3, return_weights=True, device="cpu")
    np.testing.assert_allclose(w2.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(out2, v, rtol=1e-6)


def test_gamma_zero_is_plain_attention():
    rng = np.random.default_rng(4)
    q, k, v, x, _ = problem(rng, 2, 17, 3, 8, dtype=np.float64)
    out = attention(q, k, v, x * 1000, gamma=0.0, device="cpu")
    logits = np.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(8)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, np.einsum("bhij,bjhd->bihd", p, v), rtol=1e-12, atol=1e-14)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), use_cutoff=st.booleans())
def test_rigid_motion_and_permutation_invariance(seed, use_cutoff):
    rng = np.random.default_rng(seed)
    q, k, v, x, gamma = problem(rng, 1, 15, 2, 6, dtype=np.float64)
    cutoff = 9.0 if use_cutoff else None
    out = attention_numpy(q, k, v, x.astype(np.float64), gamma=gamma, cutoff=cutoff)
    # Rotation + translation of the coordinates changes nothing (up to float32 rounding of coords).
    a, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    moved = (x @ a.T + rng.normal(scale=50, size=3)).astype(np.float32)
    out_moved = attention_numpy(q, k, v, moved, gamma=gamma, cutoff=cutoff)
    if not use_cutoff:  # a pair sitting on the cutoff could flip; without one the check is tight
        np.testing.assert_allclose(out_moved, out, rtol=1e-3, atol=1e-4)
    # Permuting residues permutes the output.
    perm = rng.permutation(15)
    out_perm = attention_numpy(q[:, perm], k[:, perm], v[:, perm], x[:, perm], gamma=gamma, cutoff=cutoff)
    np.testing.assert_allclose(out_perm, out[:, perm], rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------------------
# The public function on the CPU: shapes, dtypes, broadcasting, errors


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtype_and_shape_round_trip(dtype):
    rng = np.random.default_rng(5)
    q, k, v, x, gamma = problem(rng, 1, 9, 2, 8, dtype=dtype)
    out = attention(q[0], k[0], v[0], x[0], gamma=gamma, device="cpu")
    assert out.shape == (9, 2, 8) and out.dtype == dtype and isinstance(out, np.ndarray)
    ref = attention_numpy(q[0], k[0], v[0], x[0], gamma=gamma)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=2e-3 if dtype == np.float16 else 1e-6, atol=2e-3)
    out_b, w = attention(q, k, v, x, gamma=gamma, return_weights=True, device="cpu")
    assert out_b.shape == (1, 9, 2, 8) and w.shape == (1, 2, 9, 9)
    assert w.dtype == (np.float64 if dtype == np.float64 else np.float32)


def test_shared_coords_and_mask_broadcast_over_batch():
    rng = np.random.default_rng(6)
    q, k, v, x, gamma = problem(rng, 3, 11, 2, 4)
    mask = rng.random(11) < 0.8
    got = attention(q, k, v, x[0], gamma=gamma, mask=mask, device="cpu")
    ref = attention(q, k, v, np.repeat(x[:1], 3, 0), gamma=gamma, mask=np.repeat(mask[None], 3, 0), device="cpu")
    np.testing.assert_array_equal(got, ref)


def test_scale_and_scalar_gamma():
    rng = np.random.default_rng(7)
    q, k, v, x, _ = problem(rng, 1, 8, 2, 4, dtype=np.float64)
    got = attention(q, k, v, x, gamma=0.05, scale=0.3, device="cpu")
    ref, _ = brute_force(q, k, v, x, [0.05, 0.05], scale=0.3)
    np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_structure_coords_use_ca_atoms(datasets):
    s = protgpu.load(datasets / "adk_open.pdb")
    L = s.n_residues
    rng = np.random.default_rng(8)
    q = rng.normal(size=(L, 2, 8)).astype(np.float32)
    got = attention(q, q, q, s, gamma=[0.01, 0.1], cutoff=12.0, device="cpu")
    ref = attention(q, q, q, s.select("ca").coords[0], gamma=[0.01, 0.1], cutoff=12.0, device="cpu")
    np.testing.assert_array_equal(got, ref)
    assert got.shape == (L, 2, 8)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda a: {**a, "k": a["k"][:, :5]}, "shape of q"),
        (lambda a: {**a, "v": a["v"].astype(np.float64)}, "one dtype"),
        (lambda a: {**a, "q": a["q"][0, 0]}, r"\(B, L, H, d\)"),
        (lambda a: {**a, "coords": a["coords"][:, :4]}, "coords must have shape"),
        (lambda a: {**a, "gamma": [0.1, 0.2, 0.3]}, "gamma must"),
        (lambda a: {**a, "gamma": [-0.1, 0.2]}, ">= 0"),
        (lambda a: {**a, "cutoff": -1.0}, "cutoff"),
        (lambda a: {**a, "mask": np.ones((2, 10), dtype=int)}, "boolean"),
        (lambda a: {**a, "mask": np.ones(7, dtype=bool)}, "mask must have shape"),
        (lambda a: {**a, "method": "bogus"}, "method"),
        (lambda a: {**a, "q": a["q"].astype(np.int32), "k": a["k"].astype(np.int32),
                    "v": a["v"].astype(np.int32)}, "float16, bfloat16"),
    ],
)
def test_bad_input_is_one_line_input_error(change, match):
    rng = np.random.default_rng(9)
    q, k, v, x, _ = problem(rng, 2, 10, 2, 4)
    args = change({"q": q, "k": k, "v": v, "coords": x, "gamma": [0.1, 0.2], "cutoff": None, "mask": None,
                   "method": "auto"})
    with pytest.raises(InputError, match=match) as e:
        attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("coords"), device="cpu", **args)
    assert "\n" not in str(e.value)


def test_nan_coordinates_rejected_unless_padding():
    rng = np.random.default_rng(10)
    q, k, v, x, gamma = problem(rng, 2, 10, 2, 4)
    x[1, 7] = np.nan
    with pytest.raises(InputError, match="batch entry 1, residue 7"):
        attention(q, k, v, x, gamma=gamma, device="cpu")
    mask = np.ones((2, 10), bool)
    mask[1, 7] = False
    out = attention(q, k, v, x, gamma=gamma, mask=mask, device="cpu")
    assert np.isfinite(np.delete(out[1], 7, axis=0)).all()


def test_weights_refused_before_allocation_when_host_memory_is_short(monkeypatch):
    import protgpu._memory as mem

    monkeypatch.setattr(mem, "host_available_bytes", lambda: 1000)
    rng = np.random.default_rng(11)
    q, k, v, x, gamma = problem(rng, 1, 40, 2, 4)
    with pytest.raises(MemoryBudgetError, match="attention weights"):
        attention(q, k, v, x, gamma=gamma, return_weights=True, device="cpu")


def test_method_choice():
    assert choose_method("auto", "bfloat16", 64, 100, False) == "fused"
    assert choose_method("auto", "bfloat16", 64, 100_000, False) == "fused"
    assert choose_method("auto", "float32", 64, 4096, False) == "materialized"  # cuBLAS while L x L is small
    assert choose_method("auto", "float32", 64, 16384, False) == "fused"  # O(L) memory beyond
    assert choose_method("auto", "bfloat16", 40, 16384, False) == "fused"  # upcast, CUDA-core kernel
    assert choose_method("auto", "float32", 64, 16384, True) == "materialized"
    assert choose_method("materialised", "float32", 64, 10, False) == "materialized"
    assert choose_method("auto", "float64", 96, 16384, False) == "materialized"  # no float64 kernel for d > 64
    with pytest.raises(InputError, match="return_weights"):
        choose_method("fused", "float32", 64, 10, True)
    with pytest.raises(InputError, match="no fused kernel"):
        choose_method("fused", "float32", 256, 10, False)
    assert fused_kernel("bfloat16", 64) == "mma"
    assert fused_kernel("float16", 48) == "mma"
    assert fused_kernel("bfloat16", 40) == "simt32"  # not a multiple of 16: upcast, CUDA cores
    assert fused_kernel("float32", 64) == "simt32"
    assert fused_kernel("float64", 64) == "simt64"
    assert fused_kernel("float64", 65) is None


@pytest.mark.parametrize("d", [16, 32, 48, 64, 80, 96, 112, 128])
def test_flash_config_fits_static_shared_memory(d):
    cfg = flash_config(d)
    assert cfg["HEAD_DIM"] == d and cfg["FA_BLOCK_N"] % 16 == 0
    assert flash_smem_bytes(d, cfg["FA_BLOCK_N"], cfg["FA_STAGES"]) <= 48 * 1024
    assert cfg["FA_STAGES"] == 2  # every supported d gets double buffering
    # Two 16-row slices per warp up to d = 64 (the second slice of O would spill beyond).
    assert cfg["FA_MT"] == (2 if d <= 64 else 1)
    assert att.flash_block_m(cfg) == 16 * cfg["FA_MT"] * cfg["FA_WARPS"]


def test_flash_overrides(monkeypatch):
    monkeypatch.setattr(att, "FLASH_OVERRIDES", {"FA_WARPS": 8, "HEAD_DIM": 3, "FA_MT": 1})
    cfg = flash_config(64)
    assert cfg["FA_WARPS"] == 8 and cfg["HEAD_DIM"] == 64
    assert att.flash_block_m(cfg) == 128
    assert cfg["FA_WGMMA"] == 0  # 8 warps are two warpgroups: not the wgmma kernel's shape


@pytest.mark.parametrize("d", [16, 32, 48, 64, 80, 96, 112, 128])
def test_wgmma_kernel_only_for_its_tile_shape(monkeypatch, d):
    """The wgmma entry points are chosen only for d = 64 with the default tiles, without a cutoff, on a
    compute capability 9.0 device, and can be switched off (FA_WGMMA = 0); the mma.sync kernel
    otherwise."""
    monkeypatch.setattr(att, "wgmma_device", lambda: True)
    cfg = flash_config(d)
    assert cfg["FA_WGMMA"] == int(d == 64)
    for precision, suffix in (("bfloat16", "bf16"), ("float16", "f16")):
        assert att.flash_entry(precision, cfg, -1.0) == (
            (f"flash_attention_wg_{suffix}", True) if d == 64 else (f"flash_attention_{suffix}", False))
        assert att.flash_entry(precision, cfg, 100.0) == (f"flash_attention_{suffix}", False)  # cutoff
    monkeypatch.setattr(att, "wgmma_device", lambda: False)
    assert att.flash_entry("float16", cfg, -1.0) == ("flash_attention_f16", False)
    monkeypatch.setattr(att, "wgmma_device", lambda: True)
    for overrides in ({"FA_WGMMA": 0}, {"FA_BLOCK_N": 32}, {"FA_STAGES": 1}, {"FA_WARPS": 2}):
        monkeypatch.setattr(att, "FLASH_OVERRIDES", overrides)
        assert flash_config(d)["FA_WGMMA"] == 0
        assert att.flash_entry("float16", flash_config(d), -1.0) == ("flash_attention_f16", False)


def test_fast_path_declines_host_and_weight_calls():
    # The fast path takes only 16-bit device arrays; everything else goes the general way (and is
    # validated there), so these calls must not even look for CuPy.
    rng = np.random.default_rng(16)
    q, k, v, x, gamma = problem(rng, 1, 8, 2, 16)
    q16 = q.astype(np.float16)
    for kw in ({}, {"return_weights": True}, {"method": "materialized"}, {"device": "cpu"}):
        args = {"return_weights": False, "method": "auto", "device": "auto", **kw}
        assert att_fast.fast_attention(q16, q16, q16, x, gamma, None, None, None, args["return_weights"],
                                        args["method"], args["device"]) is None


# --------------------------------------------------------------------------------------------------
# bfloat16 as raw bits


def _bf16_reference(f):
    """Round-to-nearest-even of float32 values to 8 significant bits, through float64 arithmetic."""
    out = []
    for v in np.asarray(f, np.float32).ravel():
        if np.isnan(v):
            out.append(np.nan)
            continue
        if np.isinf(v) or v == 0:
            out.append(float(v))
            continue
        _, e = math.frexp(float(v))  # |v| in [2^(e-1), 2^e)
        spacing = 2.0 ** (max(e - 1, -126) - 7)  # 8 significant bits; subnormals below 2^-126
        out.append(round(float(v) / spacing) * spacing)  # exact in float64; round() is half-to-even
    return np.array(out).reshape(np.shape(f))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=50))
def test_float32_to_bf16_rounds_to_nearest_even(values):
    f = np.array(values, np.float32)
    got = bf16_bits_to_float32(float32_to_bf16_bits(f)).astype(np.float64)
    ref = _bf16_reference(f)
    finite = np.isfinite(ref) & (np.abs(ref) < 3.3895313892515355e38)
    np.testing.assert_array_equal(got[finite], ref[finite])
    # Values that round past the largest bfloat16 become infinities of their sign.
    big = ~finite
    assert np.all(np.isinf(got[big]) & (np.sign(got[big]) == np.sign(f[big])))


def test_bf16_special_values_and_exact_round_trip():
    f = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, 1.00390625, 1.005859375], np.float32)
    bits = float32_to_bf16_bits(f)
    assert bits.dtype == np.uint16
    assert list(bits[:4]) == [0x0000, 0x8000, 0x7F80, 0xFF80]
    assert np.isnan(bf16_bits_to_float32(bits[4:6])).all()
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1); 1 + 3 * 2^-9 rounds up.
    np.testing.assert_array_equal(bf16_bits_to_float32(bits[6:]), [1.0, 1.0, 1.0078125])
    all_bits = np.arange(0, 1 << 16, dtype=np.uint16)
    vals = bf16_bits_to_float32(all_bits)
    keep = ~np.isnan(vals)
    np.testing.assert_array_equal(float32_to_bf16_bits(vals)[keep], all_bits[keep])


def test_ml_dtypes_bfloat16_round_trip_on_cpu():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(12)
    q, k, v, x, gamma = problem(rng, 1, 10, 2, 8)
    qb, kb, vb = (a.astype(ml_dtypes.bfloat16) for a in (q, k, v))
    out = attention(qb, kb, vb, x, gamma=gamma, device="cpu")
    assert out.dtype == ml_dtypes.bfloat16
    ref = attention_numpy(qb.astype(np.float32), kb.astype(np.float32), vb.astype(np.float32), x, gamma=gamma)
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=1e-2, atol=1e-2)


def test_torch_cpu_bfloat16_round_trip():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    q, k, v, x, gamma = problem(rng, 2, 10, 2, 8)
    qt, kt, vt = (torch.from_numpy(a).to(torch.bfloat16) for a in (q, k, v))
    out = attention(qt, kt, vt, torch.from_numpy(x), gamma=gamma, device="cpu")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == qt.shape
    ref = attention_numpy(qt.float().numpy(), kt.float().numpy(), vt.float().numpy(), x, gamma=gamma)
    np.testing.assert_allclose(out.float().numpy(), ref, rtol=1e-2, atol=1e-2)


# --------------------------------------------------------------------------------------------------
# The tensor-core kernel's algorithm, emulated in NumPy


def _as16(a, precision):
    return round16(a, precision)


@settings(max_examples=12, deadline=None)
@given(
    L=st.integers(1, 150),
    block_n=st.sampled_from([16, 32, 64]),
    block_m=st.sampled_from([32, 64, 128]),
    use_cutoff=st.booleans(),
    use_mask=st.booleans(),
    precision=st.sampled_from(["bfloat16", "float16"]),
    tau=st.sampled_from([0.0, 8.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_flash_algorithm_matches_twin(L, block_n, block_m, use_cutoff, use_mask, precision, tau, seed):
    rng = np.random.default_rng(seed)
    q, k, v, x, gamma = problem(rng, 2, L, 2, 16, spread=15)
    q, k, v = (_as16(a, precision) for a in (q, k, v))
    cutoff = 12.0 if use_cutoff else None
    mask = rng.random((2, L)) < 0.8 if use_mask else None
    if mask is not None:
        mask[1] = False  # a batch entry with every key masked
    got = flash_emulate(q, k, v, x, gamma, cutoff=cutoff, mask=mask, block_n=block_n, block_m=block_m,
                        precision=precision, tau=tau)
    ref = attention_numpy(q, k, v, x, gamma=gamma, cutoff=cutoff, mask=mask)
    assert np.isfinite(got).all()
    if mask is not None:
        assert np.all(got[1] == 0)
    # 16-bit P and output: a few units of 2^-8 (bfloat16) relative to |v| ~ 1.
    tol = 3e-2 if precision == "bfloat16" else 4e-3
    np.testing.assert_allclose(got, ref, atol=tol)


def test_flash_tile_size_changes_only_rounding():
    rng = np.random.default_rng(14)
    q, k, v, x, gamma = problem(rng, 1, 200, 2, 32, spread=12)
    q, k, v = (_as16(a, "float16") for a in (q, k, v))
    a = flash_emulate(q, k, v, x, gamma, block_n=16, precision="float16")
    b = flash_emulate(q, k, v, x, gamma, block_n=64, precision="float16")
    assert np.max(np.abs(a - b)) < 4e-3


def test_lazy_rescaling_changes_only_rounding_when_the_maximum_keeps_growing():
    # Keys whose logits grow along the sequence (k_j ~ j q / L): every tile raises each row's maximum,
    # by far more than tau per tile, so the kernel's rescaling branch runs on every tile; and a small
    # growth (under tau) leaves the reference behind, so P exceeds 1 (up to 2^tau) in between.
    rng = np.random.default_rng(21)
    L, d = 300, 16
    u = rng.normal(size=d)
    u *= 2.0 / np.linalg.norm(u)  # logits scale * q . k_j ~ ramp_j: ~58 log2 units over the keys
    q = _as16(u + 0.3 * rng.normal(size=(1, L, 1, d)), "float16")
    ramp = np.linspace(0.0, 40.0, L)[None, :, None, None]
    k = _as16(ramp * u + 0.1 * rng.normal(size=(1, L, 1, d)), "float16")
    v = _as16(rng.normal(size=(1, L, 1, d)), "float16")
    x = (np.cumsum(rng.normal(size=(1, L, 3)), axis=1) * 2).astype(np.float32)
    ref = attention_numpy(q, k, v, x, gamma=[0.01])
    eager = flash_emulate(q, k, v, x, [0.01], block_n=16, precision="float16", tau=0.0)
    lazy = flash_emulate(q, k, v, x, [0.01], block_n=16, precision="float16", tau=8.0)
    assert np.max(np.abs(lazy - ref)) < 4e-3 and np.max(np.abs(eager - ref)) < 4e-3
    assert np.max(np.abs(lazy - eager)) < 4e-3


def test_flash_numerics_within_2x_of_torch_like_sdpa_on_a_real_structure(datasets):
    """The accuracy claim of the issue, checked on the CPU by emulation: on adenylate kinase CA
    coordinates, the tensor-core algorithm's error against float64 is within 2x that of a same-precision
    SDPA with a materialised (16-bit) bias."""
    s = protgpu.load(datasets / "adk_open.pdb").select("ca")
    x = s.coords  # (1, 214, 3)
    L = x.shape[1]
    rng = np.random.default_rng(15)
    H, d = 4, 64
    q, k, v = (_as16(rng.normal(size=(1, L, H, d)).astype(np.float32), "bfloat16") for _ in range(3))
    gamma = np.array([0.0, 0.01, 0.05, 0.2])
    ref = attention_numpy(q, k, v, x, gamma=gamma)
    for precision in ("bfloat16", "float16"):
        ours = np.max(np.abs(flash_emulate(q, k, v, x, gamma, precision=precision) - ref))
        torch_like = np.max(np.abs(torch_like_bf16(q, k, v, x, gamma, precision) - ref))
        assert ours <= 2 * torch_like, (precision, ours, torch_like)


# --------------------------------------------------------------------------------------------------
# The kernels compile for the configurations the host picks


def test_kernel_configurations_compile():
    pytest.importorskip("cuda.core")
    from protgpu._cuda import compile_cubin, entry_points

    assert set(entry_points("attention_flash")) == {"flash_attention_bf16", "flash_attention_f16",
                                                    "flash_attention_wg_bf16", "flash_attention_wg_f16",
                                                    "flash_attention_lse_bf16", "flash_attention_lse_f16",
                                                    "flash_attention_wg_lse_bf16", "flash_attention_wg_lse_f16"}
    assert {"bias_softmax_f32", "bias_softmax_f64", "flash_simt_f32", "flash_simt_f64"} <= set(
        entry_points("attention"))
    for d in (16, 48, 128):  # both branches of flash_config; 48: the uneven tile-copy loop
        assert bytes(compile_cubin("attention_flash", "sm_90", flash_config(d), cache=False).code)
    # The wgmma kernel (d = 64) for Hopper's arch-specific target: its instructions are in the binary
    # only there (elsewhere its entry points are empty).
    wg = {arch: bytes(compile_cubin("attention_flash", arch, flash_config(64), cache=False).code)
          for arch in ("sm_90a", "sm_90")}
    assert b"flash_attention_wg_bf16" in wg["sm_90a"] and b"flash_attention_wg_bf16" in wg["sm_90"]
    assert len(wg["sm_90a"]) > len(wg["sm_90"])
    # A sweep configuration of one 16-row slice per warp, one stage, 128-key tiles.
    one = {"HEAD_DIM": 64, "FA_MT": 1, "FA_WARPS": 8, "FA_STAGES": 1, "FA_BLOCK_N": 128, "FA_MIN_BLOCKS": 1}
    assert bytes(compile_cubin("attention_flash", "sm_80", one, cache=False).code)
    # The largest float32 tile of the CUDA-core kernel (the float64 entry point drops out at d > 64).
    code = bytes(compile_cubin("attention", "sm_80", {"HEAD_DIM": 128}, cache=False).code)
    assert b"flash_simt_f32" in code and b"flash_simt_f64" not in code


def test_fast_path_plan_tail_fits_the_kernel_signature():
    # The fast path launches through a prepared plan (protgpu._cuda.plans): its scalar tail must match
    # the entry point's trailing parameters (L, H, xstride, mstride, scale, cutoff2), and the rest are the
    # seven pointers it passes. Building a plan needs no GPU.
    pytest.importorskip("cuda.core")
    from protgpu._cuda import loader, plans

    for entry in loader.entry_points("attention_flash"):
        handle = loader.KernelHandle(kernel=None, name=entry, params=loader.entry_points("attention_flash")[entry])
        tail = (np.int32(4096), np.int32(8), np.int32(0), np.int32(0), np.float32(0.125), np.float32(-1.0))
        plan = plans.build_plan(handle, (32, 8, 1), (128,), tail)
        assert plan.n_pointers == (8 if "_lse_" in entry else 7) and plan.tail == tail  # (+ lse)
    with pytest.raises(TypeError):
        plans.build_plan(handle, 1, 128, (1.5,) * 6)  # L must be an integer
