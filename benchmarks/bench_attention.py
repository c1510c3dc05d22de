"""Distance-biased attention: protgpu's fused and materialised paths against PyTorch SDPA.

Same data, same run. Default problem (the issue's): B=1, L=4096, H=8, d=64, bfloat16, one gamma per
head, no cutoff. GPU times are CUDA-event medians with the inputs already on the device. "kernel" rows
time the launch alone (inputs prepared once); "call" rows time the whole ``pg.attention`` call on torch
tensors (DLPack in and out, Python overhead included). TFLOP/s counts 4 B H L^2 d (QK^T and PV) and is
also given as a fraction of the bf16 GEMM ceiling measured on the H200 (~790 TFLOP/s).

    python3 benchmarks/bench_attention.py [--quick] [--long] [--sweep] [--json PATH]

``--long`` adds L = 16,384 (fused, with its device memory, against SDPA with a 4 GiB bias);
``--sweep`` times tile configurations of the tensor-core kernel (FA_BLOCK_N, FA_WARPS, FA_MIN_BLOCKS,
FA_STAGES) and reports the best, to be written into ``protgpu.scoring.attention.flash_config``;
``--quick`` runs small CPU-only sizes (for machines without a GPU).
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from _common import print_table, time_cpu, time_gpu, write_results

BF16_GEMM_CEILING = 790e12  # FLOP/s, measured bf16 GEMM on the H200 (issue 6)
SDPA_NO_BIAS_MS = 0.093  # measured for the default problem (issue 6)
SDPA_BIAS_MS = 0.46


def protein_walk(L: int, B: int, rng) -> np.ndarray:
    """(B, L, 3) float32: random walks of 3.8 Angstrom steps (CA-like spacing)."""
    steps = rng.normal(size=(B, L, 3))
    return np.cumsum(3.8 * steps / np.linalg.norm(steps, axis=-1, keepdims=True), axis=1).astype(np.float32)


def flops(B, L, H, d) -> float:
    return 4.0 * B * H * L * L * d


def gpu_rows(B, L, H, d, args, rows, extra):
    import cupy

    from protgpu.scoring import attention as att
    from protgpu.scoring.attention import attention

    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        torch = None
        print("torch not installed: SDPA anchors skipped")
    rng = np.random.default_rng(0)
    x = protein_walk(L, B, rng)
    gamma = np.array([0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5][:H] + [0.05] * max(0, H - 8))
    fl = flops(B, L, H, d)
    scale = 1.0 / math.sqrt(d)

    def add(impl, t, note=""):
        ms = t["median_s"] * 1e3
        rows.append({"impl": impl, "L": L, "ms": ms, "tflops": fl / t["median_s"] / 1e12,
                     "of_ceiling": fl / t["median_s"] / BF16_GEMM_CEILING, "note": note})
        return ms

    q16 = rng.normal(size=(B, L, H, d)).astype(np.float32)
    k16 = rng.normal(size=(B, L, H, d)).astype(np.float32)
    v16 = rng.normal(size=(B, L, H, d)).astype(np.float32)
    res = {}
    if torch is not None:
        qt, kt, vt = (torch.from_numpy(a).to("cuda", torch.bfloat16) for a in (q16, k16, v16))
        xt = torch.from_numpy(x).cuda()
        qh, kh, vh = (a.transpose(1, 2) for a in (qt, kt, vt))  # SDPA wants (B, H, L, d)
        t = time_gpu(lambda: F.scaled_dot_product_attention(qh, kh, vh), repeat=50)
        res["sdpa"] = add("torch SDPA bf16, no bias", t, f"issue measured {SDPA_NO_BIAS_MS} ms")
        bias_bytes = B * H * L * L * 2
        if bias_bytes < 0.25 * torch.cuda.get_device_properties(0).total_memory:
            d2 = torch.cdist(xt, xt) ** 2
            g = torch.as_tensor(gamma, device="cuda", dtype=torch.float32)
            hold = {"bias": (-g[None, :, None, None] * d2[:, None]).to(torch.bfloat16)}
            t = time_gpu(lambda: F.scaled_dot_product_attention(qh, kh, vh, attn_mask=hold["bias"]), repeat=20)
            res["sdpa_bias"] = add("torch SDPA bf16, materialised bias", t,
                                   f"bias precomputed ({bias_bytes / 2**30:.2f} GiB); issue measured {SDPA_BIAS_MS} ms")
            sdpa_bias_out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=hold["bias"]).transpose(1, 2)
            hold.clear()
        # protgpu, whole call on torch tensors
        def call():
            res["out"] = attention(qt, kt, vt, xt, gamma=gamma, method="fused")

        t = time_gpu(call, repeat=50)
        add("protgpu fused bf16 (call, torch in/out)", t)
        if "sdpa_bias" in res:
            diff = float((res["out"].float() - sdpa_bias_out.float()).abs().max())
            rows[-1]["note"] = f"max |ours - SDPA+bias| = {diff:.3g}"
        # kernel only
        qd, kd, vd = (cupy.from_dlpack(a.view(torch.int16)).view(cupy.uint16) for a in (qt, kt, vt))
    else:
        bits = [att.float32_to_bf16_bits(a) for a in (q16, k16, v16)]
        qd, kd, vd = (cupy.asarray(b) for b in bits)
    xd = cupy.asarray(x)
    gd = cupy.asarray(gamma.astype(np.float32))
    cfg = att.flash_config(d)
    t = time_gpu(lambda: att._launch_flash_mma(qd, kd, vd, xd, gd, None, "bfloat16", scale, -1.0, cfg), repeat=50)
    ms = add("protgpu fused bf16 (kernel)", t, f"config {cfg}")
    extra["flash_config"] = cfg
    if "sdpa" in res:
        extra["fused_over_sdpa_no_bias"] = ms / res["sdpa"]
        extra["sdpa_bias_over_fused"] = res.get("sdpa_bias", float("nan")) / ms
        print(f"\nfused kernel / SDPA without bias: {ms / res['sdpa']:.2f}x (target <= 1.5x); "
              f"SDPA with bias / fused kernel: {extra['sdpa_bias_over_fused']:.2f}x (target >= 3x)")
    t = time_gpu(lambda: att._launch_flash_mma(qd, kd, vd, xd, gd, None, "bfloat16", scale, 100.0, cfg), repeat=20)
    add("protgpu fused bf16 (kernel, cutoff 10 A)", t)

    # materialised path and the float32 kernels, on CuPy arrays
    if B * H * L * L * 4 * 2 < 0.3 * cupy.cuda.runtime.memGetInfo()[0]:
        q32, k32, v32 = (cupy.asarray(a) for a in (q16, k16, v16))
        t = time_gpu(lambda: attention(q32, k32, v32, xd, gamma=gamma, method="materialized"), repeat=10)
        add("protgpu materialised f32 (call)", t, "cuBLAS f32 GEMMs + fused bias/softmax kernel")
        t = time_gpu(lambda: attention(q32, k32, v32, xd, gamma=gamma, method="fused"), repeat=5)
        add("protgpu fused f32, CUDA cores (call)", t)
        if torch is not None:
            qf, kf, vf = (a.float() for a in (qh, kh, vh))
            d2 = torch.cdist(xt, xt) ** 2
            g32 = torch.as_tensor(gamma, device="cuda", dtype=torch.float32)
            hold = {"bias": -g32[None, :, None, None] * d2[:, None]}
            t = time_gpu(lambda: F.scaled_dot_product_attention(qf, kf, vf, attn_mask=hold["bias"]), repeat=10)
            add("torch SDPA f32, materialised bias", t)
            hold.clear()
    cupy.get_default_memory_pool().free_all_blocks()

    if args.sweep:
        sweep(qd, kd, vd, xd, gd, scale, d, L, B, H, extra)


def sweep(qd, kd, vd, xd, gd, scale, d, L, B, H, extra):
    from protgpu.scoring import attention as att

    found = []
    for block_n in (32, 64, 128):
        for stages in (2, 1):
            if att.flash_smem_bytes(d, block_n, stages) > 48 * 1024:
                continue
            for warps in (4, 8):
                for min_blocks in (1, 2, 3, 4):
                    if warps * 32 * min_blocks * 64 > 65536:  # fewer than 64 registers per thread: spills
                        continue
                    cfg = {"HEAD_DIM": d, "FA_BLOCK_N": block_n, "FA_STAGES": stages, "FA_WARPS": warps,
                           "FA_MIN_BLOCKS": min_blocks}
                    try:
                        t = time_gpu(lambda cfg=cfg: att._launch_flash_mma(qd, kd, vd, xd, gd, None, "bfloat16",
                                                                           scale, -1.0, cfg), repeat=30)
                    except Exception as exc:  # a configuration that fails to compile or launch is reported
                        print(f"config {cfg}: {exc}")
                        continue
                    found.append({"impl": "sweep", **cfg, "ms": t["median_s"] * 1e3,
                                  "tflops": flops(B, L, H, d) / t["median_s"] / 1e12})
    found.sort(key=lambda r: r["ms"])
    print("\ntensor-core kernel configurations (fastest first)")
    print_table(found, ["FA_BLOCK_N", "FA_STAGES", "FA_WARPS", "FA_MIN_BLOCKS", "ms", "tflops"])
    extra["sweep"] = found


def long_rows(rows, extra):
    """L = 16,384: the fused path in O(L) memory; SDPA needs the (B, H, L, L) bias."""
    import cupy

    from protgpu.scoring.attention import attention

    B, L, H, d = 1, 16384, 8, 64
    rng = np.random.default_rng(1)
    x = protein_walk(L, B, rng)
    gamma = np.full(H, 0.05)
    a = {n: cupy.asarray(rng.normal(size=(B, L, H, d)).astype(np.float16)) for n in "qkv"}
    a["x"] = cupy.asarray(x)
    in_bytes = 3 * a["q"].nbytes
    pool = cupy.get_default_memory_pool()
    cupy.cuda.Device().synchronize()
    pool.free_all_blocks()
    before = pool.total_bytes()
    t = time_gpu(lambda: attention(a["q"], a["k"], a["v"], a["x"], gamma=gamma, method="fused"), repeat=10)
    grown = pool.total_bytes() - before
    fl = flops(B, L, H, d)
    mat_bytes = B * H * L * L * 4
    rows.append({"impl": "protgpu fused f16 (call)", "L": L, "ms": t["median_s"] * 1e3,
                 "tflops": fl / t["median_s"] / 1e12, "of_ceiling": fl / t["median_s"] / BF16_GEMM_CEILING,
                 "note": f"device memory beyond inputs: {grown / 2**20:.1f} MiB (inputs {in_bytes / 2**20:.0f} "
                         f"MiB); materialised f32 scores would need {mat_bytes / 2**30:.1f} GiB"})
    extra["long_fused_extra_bytes"] = grown
    a.clear()
    pool.free_all_blocks()
    try:
        import torch
        import torch.nn.functional as F

        qt, kt, vt = (torch.randn(B, H, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        t = time_gpu(lambda: F.scaled_dot_product_attention(qt, kt, vt), repeat=10)
        rows.append({"impl": "torch SDPA bf16, no bias", "L": L, "ms": t["median_s"] * 1e3,
                     "tflops": fl / t["median_s"] / 1e12})
        xt = torch.from_numpy(x).cuda()
        torch.cuda.reset_peak_memory_stats()
        hold = {"bias": (-0.05 * torch.cdist(xt, xt) ** 2)[:, None].expand(B, H, L, L).to(torch.bfloat16).contiguous()}
        t = time_gpu(lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=hold["bias"]), repeat=5)
        rows.append({"impl": "torch SDPA bf16, materialised bias", "L": L, "ms": t["median_s"] * 1e3,
                     "tflops": fl / t["median_s"] / 1e12,
                     "note": f"torch peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"})
        hold.clear()
        torch.cuda.empty_cache()
    except ImportError:
        print("torch not installed: L = 16,384 SDPA anchors skipped")
    except RuntimeError as exc:  # out of memory is a result here
        rows.append({"impl": "torch SDPA bf16, materialised bias", "L": L, "note": f"failed: {exc}"[:200]})


def cpu_rows(args, rows):
    from protgpu.scoring.attention import attention

    B, L, H, d = (1, 256, 4, 32) if args.quick else (1, 1024, 8, 64)
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(B, L, H, d)).astype(np.float32) for _ in range(3))
    x = protein_walk(L, B, rng)
    gamma = np.linspace(0.0, 0.2, H)
    fl = flops(B, L, H, d)
    t = time_cpu(lambda: attention(q, k, v, x, gamma=gamma, device="cpu"), repeat=3)
    rows.append({"impl": "protgpu CPU (NumPy twin, float64 inside)", "L": L, "ms": t["median_s"] * 1e3,
                 "tflops": fl / t["median_s"] / 1e12})
    try:
        import torch
        import torch.nn.functional as F

        qt, kt, vt = (torch.from_numpy(a).transpose(1, 2) for a in (q, k, v))
        xt = torch.from_numpy(x)
        bias = -torch.as_tensor(gamma, dtype=torch.float32)[None, :, None, None] * (torch.cdist(xt, xt) ** 2)[:, None]
        t = time_cpu(lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias), repeat=3)
        rows.append({"impl": "torch SDPA CPU f32, materialised bias", "L": L, "ms": t["median_s"] * 1e3,
                     "tflops": fl / t["median_s"] / 1e12})
    except ImportError:
        print("torch not installed: CPU SDPA anchor skipped")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--L", type=int, default=4096)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="small CPU-only sizes (machines without a GPU)")
    ap.add_argument("--long", action="store_true", help="also L = 16,384")
    ap.add_argument("--sweep", action="store_true", help="time tile configurations of the tensor-core kernel")
    ap.add_argument("--json", help="results file (default: benchmarks/results/attention-<device>.json)")
    args = ap.parse_args()

    from protgpu._array import gpu_available

    rows: list[dict] = []
    extra: dict = {"problem": {"B": args.B, "L": args.L, "H": args.H, "d": args.d, "dtype": "bfloat16"},
                   "bf16_gemm_ceiling_flops": BF16_GEMM_CEILING}
    if gpu_available() and not args.quick:
        gpu_rows(args.B, args.L, args.H, args.d, args, rows, extra)
        if args.long:
            long_rows(rows, extra)
    else:
        print("no usable GPU (or --quick): GPU rows skipped")
    cpu_rows(args, rows)
    print()
    print_table(rows, ["impl", "L", "ms", "tflops", "of_ceiling", "note"])
    path = write_results("attention", rows, extra, args.json)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
