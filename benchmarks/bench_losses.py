"""RMSD / superpose forward vs backward on CUDA (issue 20: backward <= 2x forward), with torch-only anchors in
the same run: a Kabsch by SVD with autograd through it.

Per case and dtype (medians over ``--repeat`` runs, each synchronised):
``forward_ms`` the forward without gradients (``torch.no_grad()``: what a caller without gradients pays);
``forward_grad_ms`` the forward that records the graph (inputs require grad); ``backward_ms`` the
``.backward()`` call alone (its forward run untimed before it); ``forward_backward_ms`` both in one;
``backward_over_forward = backward_ms / forward_ms`` (the issue's target: <= 2) and
``step_over_forward = forward_backward_ms / forward_ms``.

Usage: ``python benchmarks/bench_losses.py [--frames 10000] [--atoms 300] [--repeat 20]``; writes
``benchmarks/results/losses-<gpu>.json`` (``_common.write_results``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _common import write_results

import protgpu as pg


def _time(fn, repeat, setup=None):
    """Median seconds of ``fn(setup())`` (``setup`` untimed), synchronised before and after."""
    fn(setup() if setup else None)
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeat):
        arg = setup() if setup else None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(arg)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def kabsch_torch(x, y):
    """RMSD and superposed coordinates by SVD in torch (autograd through torch.linalg.svd)."""
    xc, yc = x - x.mean(-2, keepdim=True), y - y.mean(-2, keepdim=True)
    u, _, vt = torch.linalg.svd(yc.transpose(-1, -2) @ xc)
    d = torch.sign(torch.linalg.det(u @ vt))
    s = torch.ones_like(u[..., 0])
    s = torch.cat([s[..., :2], d[..., None]], -1)
    rot = u @ (s[..., :, None] * vt)
    aligned = xc @ rot.transpose(-1, -2) + y.mean(-2, keepdim=True)
    return ((aligned - y) ** 2).sum((-1, -2)).div(x.shape[-2]).sqrt(), aligned


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=10000)
    ap.add_argument("--atoms", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    y = torch.tensor(rng.normal(size=(a.atoms, 3)) * 10, device="cuda")
    x0 = y + torch.tensor(rng.normal(size=(a.frames, a.atoms, 3)), device="cuda")
    rows = []
    for dt in (torch.float32, torch.float64):
        x = x0.to(dt).requires_grad_()
        yy = y.to(dt)
        cases = {
            "pg.rmsd": lambda x, yy: pg.rmsd(x, yy).sum(),
            "pg.rmsd, reference grad too": lambda x, yy: pg.rmsd(x, yy).sum(),
            "pg.superpose coords": lambda x, yy: pg.superpose(x, yy).coords.sum(),
            "torch Kabsch (SVD) rmsd": lambda x, yy: kabsch_torch(x, yy)[0].sum(),
            "torch Kabsch (SVD) coords": lambda x, yy: kabsch_torch(x, yy)[1].sum(),
        }
        for name, f in cases.items():
            yy.requires_grad_("reference grad" in name)

            def clear(x=x, yy=yy):
                x.grad = yy.grad = None

            with torch.no_grad():  # the forward alone: what a caller without gradients pays
                fwd = _time(lambda _, f=f, x=x, yy=yy: f(x, yy), a.repeat)
            fwd_grad = _time(lambda _, f=f, x=x, yy=yy: f(x, yy), a.repeat)
            bwd = _time(lambda loss: loss.backward(), a.repeat, setup=lambda f=f, x=x, yy=yy: (clear(), f(x, yy))[1])
            both = _time(lambda _, f=f, x=x, yy=yy: (clear(), f(x, yy).backward()), a.repeat)
            rows.append({"case": name, "dtype": str(dt).replace("torch.", ""), "forward_ms": 1e3 * fwd,
                         "forward_grad_ms": 1e3 * fwd_grad, "backward_ms": 1e3 * bwd,
                         "forward_backward_ms": 1e3 * both, "backward_over_forward": bwd / fwd,
                         "step_over_forward": both / fwd})
            print(f"{name:30s} {rows[-1]['dtype']:8s} fwd {1e3 * fwd:7.3f} ms  fwd(graph) {1e3 * fwd_grad:7.3f} ms  "
                  f"bwd {1e3 * bwd:7.3f} ms  fwd+bwd {1e3 * both:7.3f} ms  bwd/fwd {bwd / fwd:5.2f}  "
                  f"(fwd+bwd)/fwd {both / fwd:5.2f}")
    out = write_results("losses", rows, {"frames": a.frames, "atoms": a.atoms, "torch": torch.__version__,
                                         "target": "backward_over_forward = backward_ms / forward_ms <= 2 (issue 20)"})
    print("wrote", out)


if __name__ == "__main__":
    main()
