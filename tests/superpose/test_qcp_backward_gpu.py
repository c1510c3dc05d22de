"""kernels/qcp_backward.cu on the GPU: the fused backward of pg.rmsd / pg.superpose against its torch-ops
twin (``differentiable.backward_torch``) on the same CUDA tensors - float64 to 1e-10 relative, float32
input to 1e-6 of the largest entry (the kernel computes in float64; the twin is run on the upcast
coordinates) - every upstream gradient, weights and fitted-atom selections; degenerate inputs (identical,
planar, collinear) finite; float64 gradcheck of the public calls on CUDA; ``check_qcp_backward_for_sanitizer``
is the ``qcp_backward`` section of tests/sanitize_kernels.py."""

from __future__ import annotations

import numpy as np
import pytest
from superpose_helpers import DEGENERATE_CASES, degenerate_pair, random_rotation

import protgpu as pg

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


def _case(rng, f, n_atoms, dtype, sel):
    y = rng.normal(size=(n_atoms, 3)) * 6
    x = y @ random_rotation(rng).T + rng.normal(size=(f, n_atoms, 3)) + 30.0
    fit = w = None
    if sel in ("fit", "weights"):
        fit = np.sort(rng.permutation(n_atoms)[: n_atoms // 2 + 3])
    if sel == "weights":
        w = rng.uniform(0.5, 2.0, n_atoms)
    return torch.tensor(x, dtype=dtype, device="cuda"), torch.tensor(y, dtype=torch.float64, device="cuda"), fit, w


def _forward_backward(x, y, fit, w, which, seed=0):
    """pg.superpose's Function run once; then backward_cuda and backward_torch on its saved results."""
    from protgpu.superpose import differentiable as D

    xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
    res = pg.superpose(xg, yg, fit=fit, weights=w)
    node = res.rmsd.grad_fn
    info = node.info
    xs, _, r, rot, t = node.saved_tensors
    g = torch.Generator(device="cuda").manual_seed(seed)
    f, n_atoms = x.shape[:2]
    full = (torch.randn(f, generator=g, device="cuda", dtype=torch.float64),
            torch.randn(f, 3, 3, generator=g, device="cuda", dtype=torch.float64),
            torch.randn(f, 3, generator=g, device="cuda", dtype=torch.float64),
            torch.randn(f, n_atoms, 3, generator=g, device="cuda", dtype=torch.float64).to(x.dtype))
    grads = tuple(a if i in which else None for i, a in enumerate(full))
    g64 = tuple(None if a is None else a.double() for a in grads)
    with torch.no_grad():  # as inside autograd's backward
        got = D.backward_cuda(xs, r, rot, t, info, grads, True, True)
        want = D.backward_torch(xs.double(), r, rot, t, info, g64, True, True)
    return got, want


def _close(got, want, tol):
    for a, b in zip(got, want, strict=True):
        scale = float(b.abs().max())
        assert scale > 0 and torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("which", [(0,), (1,), (2,), (3,), (0, 1, 2, 3)])
@pytest.mark.parametrize("sel", ["all", "fit", "weights"])
def test_cuda_backward_against_the_torch_twin(gpu, dtype, which, sel):
    rng = np.random.default_rng(len(which) * 7 + len(sel))
    x, y, fit, w = _case(rng, 333, 301, dtype, sel)  # odd sizes: partial warps and blocks
    got, want = _forward_backward(x, y, fit, w, which)
    assert got[0].dtype == dtype and got[1].dtype == torch.float64
    _close(got, want, 1e-10 if dtype == torch.float64 else 1e-6)


def test_many_frames_cut_into_reference_chunks(gpu):
    """10,000 frames: the reference's gradient sums many chunks of frames (deterministic)."""
    rng = np.random.default_rng(1)
    x, y, _, _ = _case(rng, 10000, 64, torch.float64, "all")
    got, want = _forward_backward(x, y, None, None, (0, 1, 2, 3))
    _close(got, want, 1e-10)
    again, _ = _forward_backward(x, y, None, None, (0, 1, 2, 3))
    assert torch.equal(got[0], again[0]) and torch.equal(got[1], again[1])


@pytest.mark.parametrize("case", DEGENERATE_CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_degenerate_inputs_are_finite(gpu, case, dtype):
    rng = np.random.default_rng(4)
    x, y = degenerate_pair(case, rng)
    xt = torch.tensor(x, dtype=dtype, device="cuda", requires_grad=True)
    yt = torch.tensor(y, dtype=dtype, device="cuda", requires_grad=True)
    res = pg.superpose(xt, yt)
    (res.coords.sum() + res.rotation.sum() + res.translation.sum() + res.rmsd.sum()).backward()
    assert torch.isfinite(xt.grad).all() and torch.isfinite(yt.grad).all()
    if case == "identical":
        xr = torch.tensor(x, dtype=dtype, device="cuda", requires_grad=True)
        pg.rmsd(xr, yt.detach()).sum().backward()
        assert torch.count_nonzero(xr.grad) == 0  # the cone's minimal subgradient


def test_gradcheck_float64_cuda_through_the_kernel(gpu):
    rng = np.random.default_rng(5)
    x = torch.tensor(rng.normal(size=(3, 9, 3)) * 3, device="cuda", requires_grad=True)
    y = torch.tensor(rng.normal(size=(9, 3)) * 3, device="cuda", requires_grad=True)
    w = np.arange(1.0, 10.0)
    gc = torch.autograd.gradcheck
    assert gc(lambda a, b: pg.rmsd(a, b), (x, y))
    assert gc(lambda a, b: tuple(pg.superpose(a, b)), (x, y))
    assert gc(lambda a, b: tuple(pg.superpose(a, b, weights=w, fit=[0, 1, 2, 4, 5, 8])), (x, y))
    assert gc(lambda a, b: tuple(pg.superpose(a, b, fit=[0, 2, 4, 6], atoms=[1, 3, 5])), (x, y))


def test_the_public_call_matches_the_cpu(gpu):
    """pg.superpose / pg.rmsd gradients on CUDA float64 equal the CPU path's (the twin's) to 1e-10."""
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(40, 57, 3)) * 5, rng.normal(size=(57, 3)) * 5
    out = {}
    for dev in ("cuda", "cpu"):
        xt = torch.tensor(x, device=dev, requires_grad=True)
        yt = torch.tensor(y, device=dev, requires_grad=True)
        res = pg.superpose(xt, yt, fit=np.arange(0, 57, 2), device="gpu" if dev == "cuda" else "cpu")
        (res.rmsd.sum() + (res.coords ** 2).sum() * 1e-3 + res.translation.sum()).backward()
        out[dev] = (xt.grad.cpu(), yt.grad.cpu())
    _close(out["cuda"], out["cpu"], 1e-10)


def check_qcp_backward_for_sanitizer() -> None:
    """The ``qcp_backward`` section of tests/sanitize_kernels.py: both kernels, both dtypes, with and
    without selections and weights, every upstream gradient, odd sizes; checked against the twin."""
    rng = np.random.default_rng(0)
    for dtype in (torch.float32, torch.float64):
        for sel in ("all", "fit", "weights"):
            x, y, fit, w = _case(rng, 37, 29, dtype, sel)
            for which in ((0,), (0, 1, 2, 3)):
                got, want = _forward_backward(x, y, fit, w, which)
                _close(got, want, 1e-10 if dtype == torch.float64 else 1e-6)
    print("qcp_backward: ok")
