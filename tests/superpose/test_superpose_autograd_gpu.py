"""GPU gradients of pg.rmsd / pg.superpose / pg.distances / smooth pg.lddt (CUDA tensors): float64 gradcheck
(the QCP and distance kernels take float64), float32 against the float64 CPU gradients (stated tolerances),
and the same values as the CPU path."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


def _t(a, dtype=torch.float64, device="cuda"):
    return torch.tensor(np.asarray(a), dtype=dtype, device=device, requires_grad=True)


def _cloud(seed, n=8, frames=2):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(frames, n, 3)) * 3.0, rng.normal(size=(n, 3)) * 3.0


def test_gradcheck_float64_cuda(gpu):
    x, y = _cloud(0)
    gc = torch.autograd.gradcheck
    assert gc(lambda a, b: pg.rmsd(a, b), (_t(x), _t(y)))
    assert gc(lambda a, b: tuple(pg.superpose(a, b)), (_t(x), _t(y)))
    assert gc(lambda a, b: pg.distances(a, b, box=[5.0, 6.0, 7.0]), (_t(x), _t(y)))
    assert gc(lambda a: pg.lddt(a, y, smooth=True), (_t(x[0]),))


def test_float32_cuda_against_float64_cpu(gpu):
    """float32 on the GPU vs float64 on the CPU: RMSD gradients to 1e-4 (absolute, per coordinate; they
    are at most sqrt(1/N)), superposed-coordinate gradients to 1e-3 relative, distances to 1e-4 (each
    entry sums 600 unit vectors whose float32 differences x_i - x_j lose digits for near atoms: 4e-5 seen
    on the H200)."""
    x, y = _cloud(1, n=300, frames=16)
    outs = {}
    for dev, dt in (("cuda", torch.float32), ("cpu", torch.float64)):
        xt, yt = _t(x, dt, dev), _t(y, dt, dev)
        (pg.rmsd(xt, yt).sum() + pg.superpose(xt, yt).coords.pow(2).sum() * 1e-4).backward()
        outs[dev] = (xt.grad.double().cpu(), yt.grad.double().cpu())
    for a, b in zip(outs["cuda"], outs["cpu"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    xt, xc = _t(x[:2], torch.float32), _t(x[:2], torch.float64, "cpu")
    pg.distances(xt).sum().backward()
    pg.distances(xc, device="cpu").sum().backward()
    torch.testing.assert_close(xt.grad.double().cpu(), xc.grad, rtol=1e-4, atol=1e-4)


def test_values_match_the_path_without_gradients(gpu):
    x, y = _cloud(2, n=50, frames=4)
    xt, yt = _t(x, torch.float32), _t(y, torch.float32)
    r = pg.rmsd(xt, yt)
    assert r.is_cuda and r.grad_fn is not None
    torch.testing.assert_close(r.detach(), pg.rmsd(xt.detach(), yt.detach()), rtol=0, atol=0)
