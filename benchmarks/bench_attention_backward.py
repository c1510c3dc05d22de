"""Attention forward + backward on the GPU: protgpu's kernels (forward with log-sum-exp, then the backward
with gradients to q, k, v, coords and gamma) against PyTorch SDPA forward + backward without a bias and
with the distance bias built from coordinates (cdist, autograd to coords and gamma).

    python3 benchmarks/bench_attention_backward.py [--B 1 --L 4096 --H 8 --d 64] [--json PATH]

GPU times from CUDA events, median over rounds (each round runs the call ``inner`` times back to back).
Writes ``benchmarks/results/attention_backward-<gpu>.json``. The issue's targets (issue 20): forward +
backward within 2x of SDPA's without bias, and at least 3x faster than SDPA's with the bias from cdist.
"""

from __future__ import annotations

import argparse

import numpy as np
from _common import print_table, time_gpu, write_results


def protein_walk(L: int, B: int, rng) -> np.ndarray:
    """(B, L, 3) float32: random walks of 3.8 Angstrom steps (CA-like spacing)."""
    steps = rng.normal(size=(B, L, 3))
    return np.cumsum(3.8 * steps / np.linalg.norm(steps, axis=-1, keepdims=True), axis=1).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--L", type=int, default=4096)
    ap.add_argument("--H", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--json", help="results file (default: benchmarks/results/attention_backward-<gpu>.json)")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    from protgpu.attention import flash_backward as fb

    B, L, H, d = args.B, args.L, args.H, args.d
    rng = np.random.default_rng(0)
    dev = torch.device("cuda")
    q, k, v, do = (torch.as_tensor(rng.normal(size=(B, L, H, d)), dtype=torch.bfloat16, device=dev)
                   for _ in range(4))
    x = torch.as_tensor(protein_walk(L, B, rng), device=dev)
    gamma = torch.as_tensor(np.resize([0.0, 0.01, 0.05, 0.2], H), dtype=torch.float32, device=dev)
    timing = {"inner": args.inner, "repeat": args.repeat, "warmup": 2}
    rows: list[dict] = []

    def add(impl, t, note=""):
        rows.append({"impl": impl, "L": L, "ms": t["median_s"] * 1e3, "note": note})
        return t["median_s"] * 1e3

    # protgpu: forward with lse, then the backward (gamma on the device, as a model holds it)
    hold: dict = {}

    def ours_fwd():
        hold["out"], hold["lse"] = fb.flash_forward_lse(q, k, v, x, gamma, None, None, None)

    def ours_bwd():
        hold["grads"] = fb.flash_backward(q, k, v, x, gamma, None, None, None, hold["out"], hold["lse"], do)

    def ours_both():
        ours_fwd()
        ours_bwd()

    ours_both()
    cfg = fb.bwd_config("bfloat16", d)
    t_f = add("protgpu forward with lse (bf16)", time_gpu(ours_fwd, **timing))
    t_b = add("protgpu backward (bf16; dq, dk, dv, dcoords, dgamma)", time_gpu(ours_bwd, **timing), f"tiles {cfg}")
    t_ours = add("protgpu forward + backward", time_gpu(ours_both, **timing), f"sum of parts {t_f + t_b:.3f} ms")

    # SDPA without bias, forward + backward
    qh, kh, vh = (a.transpose(1, 2).detach().clone().requires_grad_() for a in (q, k, v))
    doh = do.transpose(1, 2)

    def sdpa_plain():
        qh.grad = kh.grad = vh.grad = None
        F.scaled_dot_product_attention(qh, kh, vh).backward(doh)

    t_sdpa = add("torch SDPA bf16 fwd + bwd, no bias", time_gpu(sdpa_plain, **timing), "best backend torch picks")

    # SDPA with the bias built from coordinates (autograd through cdist to coords and gamma)
    xg = x.detach().clone().requires_grad_()
    gg = gamma.detach().clone().requires_grad_()

    def sdpa_bias():
        for t in (qh, kh, vh, xg, gg):
            t.grad = None
        bias = (-gg[None, :, None, None] * (torch.cdist(xg, xg) ** 2)[:, None]).to(torch.bfloat16)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias)
        out.backward(doh)
        return out

    t_bias = add("torch SDPA bf16 fwd + bwd, bias from cdist (grads to coords, gamma)",
                 time_gpu(sdpa_bias, **timing), "bias (B, H, L, L) bf16 built every call")

    # Agreement with the SDPA-with-bias gradients (a sanity check; both 16-bit)
    sdpa_bias()
    ours_both()
    torch.cuda.synchronize()
    dq, dk, dv, dx, dg = hold["grads"]
    ref = (qh.grad.transpose(1, 2), kh.grad.transpose(1, 2), vh.grad.transpose(1, 2), xg.grad, gg.grad)
    diffs = {n: float((a.float() - r.float()).abs().max() / max(float(r.float().abs().max()), 1e-30))
             for n, a, r in zip(("dq", "dk", "dv", "dcoords", "dgamma"), (dq, dk, dv, dx, dg), ref, strict=True)}
    extra = {
        "problem": {"B": B, "L": L, "H": H, "d": d, "dtype": "bfloat16"},
        "bwd_config": cfg,
        "ratio_vs_sdpa_no_bias": t_ours / t_sdpa,
        "speedup_vs_sdpa_cdist_bias": t_bias / t_ours,
        "targets": {"ratio_vs_sdpa_no_bias_at_most": 2.0, "speedup_vs_sdpa_cdist_bias_at_least": 3.0},
        "max_rel_diff_vs_sdpa_bias_grads": diffs,
    }
    print_table(rows, ["impl", "L", "ms", "note"])
    print(f"\nforward + backward: {extra['ratio_vs_sdpa_no_bias']:.2f}x SDPA without bias (target <= 2), "
          f"{extra['speedup_vs_sdpa_cdist_bias']:.2f}x faster than SDPA with the cdist bias (target >= 3)")
    print("max |ours - SDPA+bias| / max |SDPA+bias| per gradient:", {n: f"{v:.3g}" for n, v in diffs.items()})
    path = write_results("attention_backward", rows, extra, args.json)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
