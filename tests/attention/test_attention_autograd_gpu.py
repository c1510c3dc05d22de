"""pg.attention's gradients and its device-gamma fast path on the GPU (run on the GPU machine): the
gradients of float32 / float16 / bfloat16 CUDA tensors against the float64 NumPy twin with stated
tolerances, torch.autograd.gradcheck in float64 on CUDA (finite differences), gamma as an
nn.Parameter on the fast path without host synchronisation (checked by capturing it in a CUDA graph),
torch.compile (inductor) and CUDA graph capture of forward + backward.

Tolerances: the error of the output and of each gradient, max |g - g64| / max |g64|, is at most 1e-4
in float32 and 3e-2 / 1e-2 in bfloat16 / float16 (float32 accumulation; the 16-bit kernels round P and
dS to 16 bits, whose epsilon is 7.8e-3 / 9.8e-4, and dgamma / dcoords sum L^2 such terms with
cancellation; the inputs are rounded to 16 bits before the reference sees them)."""

from __future__ import annotations

import numpy as np
import pytest

import protgpu as pg
from protgpu.attention import api
from protgpu.attention.reference import attention_backward_numpy, attention_lse_numpy

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def walk(B, L, seed=0):
    """(B, L, 3) CA-like random walks (3.8 Angstrom steps)."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(B, L, 3))
    return np.cumsum(3.8 * s / np.linalg.norm(s, axis=-1, keepdims=True), axis=1)


def problem(B=2, L=150, H=4, d=64, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, L, H, d, generator=gen).to("cuda", dtype) for _ in range(3))
    x = torch.from_numpy(walk(B, L, seed)).to("cuda", torch.float32)
    g = torch.tensor([0.0, 0.01, 0.05, 0.2][:H] + [0.02] * max(0, H - 4), device="cuda")
    return q, k, v, x, g


def rel_err(a, ref):
    a = a.detach().double().cpu().numpy()
    return float(np.max(np.abs(a - ref)) / max(np.max(np.abs(ref)), 1e-30))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cutoff,masked", [(None, False), (12.0, True)])
def test_gradients_against_float64_twin(gpu, dtype, cutoff, masked):
    d = 32 if dtype is torch.float32 else 64
    q, k, v, x, g = problem(d=d, dtype=dtype)
    mask = None
    if masked:
        mask = torch.ones(2, q.shape[1], dtype=torch.bool, device="cuda")
        mask[1, 120:] = False
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, x, g)]
    out = pg.attention(*leaves[:4], gamma=leaves[4], cutoff=cutoff, mask=mask)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to("cuda", dtype)
    out.backward(dout)
    h = [t.detach().double().cpu().numpy() for t in (q, k, v, x, g, dout)]
    m = None if mask is None else mask.cpu().numpy()
    o64, lse64 = attention_lse_numpy(h[0], h[1], h[2], h[3], h[4], cutoff, m, None)
    ref = attention_backward_numpy(h[0], h[1], h[2], h[3], h[4], cutoff, m, 1 / np.sqrt(d), o64, lse64, h[5])
    assert rel_err(out, o64) < TOL[dtype]
    for name, leaf, r in zip(("dq", "dk", "dv", "dcoords", "dgamma"), leaves, ref, strict=True):
        assert leaf.grad is not None and leaf.grad.dtype == leaf.dtype, name
        assert rel_err(leaf.grad, r) < TOL[dtype], (name, rel_err(leaf.grad, r))


def test_gradcheck_float64_cuda(gpu):
    """Finite differences against the analytic gradient in float64 on CUDA (the torch-math backward or
    the kernels, whichever takes float64)."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 11, 2, 8, generator=gen, dtype=torch.float64).cuda().requires_grad_()
               for _ in range(3))
    x = (torch.randn(2, 11, 3, generator=gen, dtype=torch.float64) * 3).cuda().requires_grad_()
    g = torch.tensor([0.05, 0.15], dtype=torch.float64, device="cuda", requires_grad=True)
    mask = torch.ones(2, 11, dtype=torch.bool, device="cuda")
    mask[0, 7:] = False
    fn = lambda q, k, v, x, g: pg.attention(q, k, v, x, gamma=g, cutoff=6.0, mask=mask)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v, x, g))


def test_gamma_parameter_takes_the_fast_path(gpu, monkeypatch):
    """gamma as an nn.Parameter (float32), a float64 CUDA tensor or a 0-d tensor: the fast path's result,
    bit for bit that of host gamma, and never the general path (which reads gamma on the host)."""
    q, k, v, x, g = problem(B=1, L=300)
    host = pg.attention(q, k, v, x, gamma=g.cpu().numpy())
    monkeypatch.setattr(api, "_attention_general", lambda *a: pytest.fail("general path taken"))
    p = torch.nn.Parameter(g.clone())
    with torch.no_grad():
        assert torch.equal(pg.attention(q, k, v, x, gamma=p), host)
    assert torch.equal(pg.attention(q, k, v, x, gamma=g.double()), host)
    one = pg.attention(q, k, v, x, gamma=torch.tensor(0.05, device="cuda"))
    assert torch.equal(one, pg.attention(q, k, v, x, gamma=0.05))


def test_gamma_parameter_fast_path_captures_in_a_cuda_graph(gpu):
    """A host synchronisation inside stream capture is an error: a forward with a device gamma that
    captures and replays (with new values in the static inputs and in gamma) never synchronises."""
    q, k, v, x, g = problem(B=1, L=256)
    p = torch.nn.Parameter(g.clone())
    with torch.no_grad():
        pg.attention(q, k, v, x, gamma=p)  # compile and plan outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = pg.attention(q, k, v, x, gamma=p)
        q.copy_(torch.randn_like(q))
        p.mul_(2.0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, pg.attention(q, k, v, x, gamma=p.detach().cpu().numpy()))


def test_forward_backward_captures_in_a_cuda_graph(gpu):
    """Forward and backward with q, coords and a gamma Parameter requiring grad, captured once and
    replayed: the gradients of an eager run."""
    q, k, v, x, g = problem(B=1, L=256)
    q.requires_grad_()
    x.requires_grad_()
    p = torch.nn.Parameter(g.clone())

    def step():
        out = pg.attention(q, k, v, x, gamma=p, cutoff=15.0)
        out.float().square().sum().backward()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch's capture guide does
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in (q, x, p):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    got = [t.grad.clone() for t in (q, x, p)]
    for t in (q, x, p):
        t.grad = None
    step()
    for a, t in zip(got, (q, x, p), strict=True):
        torch.testing.assert_close(a, t.grad)


def test_compile_inductor_fullgraph_cuda(gpu):
    torch._dynamo.reset()

    class Block(torch.nn.Module):
        def __init__(self, c=64, H=4, d=32):
            super().__init__()
            self.H, self.d = H, d
            self.qkv = torch.nn.Linear(c, 3 * H * d)
            self.gamma = torch.nn.Parameter(torch.full((H,), 0.05))

        def forward(self, h, x):
            B, L, _ = h.shape
            q, k, v = self.qkv(h).view(B, L, 3, self.H, self.d).unbind(2)
            return pg.attention(q, k, v, x, gamma=self.gamma, cutoff=20.0).float().square().mean()

    model = Block().to("cuda", torch.bfloat16)
    model.gamma.data = model.gamma.data.float()
    h = torch.randn(2, 128, 64, device="cuda", dtype=torch.bfloat16)
    x = torch.from_numpy(walk(2, 128)).float().cuda()
    eager = model(h, x)
    eager.backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    from protgpu.attention import autograd as ag

    ag._STEPS.clear()  # (the trace must not depend on what eager calls kept)
    loss = torch.compile(model, fullgraph=True)(h, x)
    loss.backward()
    torch.testing.assert_close(loss, eager)
    for a, b in zip([p.grad for p in model.parameters()], ref, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=1e-4)


def test_cupy_with_a_torch_gamma_requiring_grad_is_an_error(gpu):
    from protgpu.errors import InputError

    q = gpu.zeros((8, 2, 16), dtype=gpu.float16)
    with pytest.raises(InputError, match="gives no gradients"):
        pg.attention(q, q, q, gpu.zeros((8, 3), dtype=gpu.float32),
                     gamma=torch.nn.Parameter(torch.zeros(2, device="cuda")))


def test_fast_path_declines_an_unhashable_cutoff(gpu):
    """A 0-d array cutoff cannot key a plan: the general path takes the call (same kernel, same numbers)
    instead of a TypeError."""
    q, k, v, x, g = problem(B=1, L=200)
    got = pg.attention(q, k, v, x, gamma=g, cutoff=np.array(10.0))
    assert torch.equal(got, pg.attention(q, k, v, x, gamma=g, cutoff=10.0))


@pytest.mark.parametrize("layout", ["contiguous", "strided q", "offset k", "shared coords", "shared mask",
                                    "expanded dout", "scalar gamma", "host gamma"])
def test_prepared_call_and_its_fallbacks_agree(gpu, layout):
    """A signature's second call runs the prepared launches (flash_backward.TorchCall) when the operands
    are contiguous and aligned, the general functions (which copy) otherwise: the same gradients as a
    call with fresh contiguous copies either way, on the first call and on repeated ones (to the rounding
    of the gradients' atomic additions, whose order varies)."""
    from protgpu.attention import autograd as ag

    B, L, H, d = 2, 96, 4, 64
    q, k, v, x, g = problem(B=B, L=L, H=H, d=d)
    mask = torch.ones(B, L, dtype=torch.bool, device="cuda")
    mask[1, 80:] = False
    gamma = torch.nn.Parameter(g.clone())
    if layout == "strided q":  # (B, L, H, d) view of a (B, H, L, d) tensor
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "offset k":  # 2-byte offset: contiguous, not 16-byte aligned
        k = torch.cat([k.new_zeros(1), k.reshape(-1)])[1:].view(B, L, H, d)
    if layout == "shared coords":
        x = x[0]
    if layout == "shared mask":
        mask = mask[1]
    if layout == "scalar gamma":
        gamma = torch.nn.Parameter(torch.tensor(0.03, device="cuda"))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, x)]
    if layout == "strided q":
        leaves[0] = q.detach().clone().requires_grad_()  # (clone keeps the strides)
        assert not leaves[0].is_contiguous()
    if layout == "offset k":
        leaves[1] = k.detach().requires_grad_()
        assert leaves[1].data_ptr() % 16
    gam = 0.03 if layout == "host gamma" else gamma

    def run(ins, gm):
        out = pg.attention(*ins, gamma=gm, mask=mask, cutoff=14.0)
        dout = torch.ones_like(out).expand(out.shape) if layout == "expanded dout" else \
            torch.linspace(-1, 1, out.numel(), device="cuda").view(out.shape).to(out.dtype)
        wrt = [*ins] + ([gm] if isinstance(gm, torch.Tensor) else [])
        return [out, *torch.autograd.grad(out, wrt, dout)]

    ag._STEPS.clear()
    ref_ins = [t.detach().contiguous().clone().requires_grad_() for t in leaves]
    ref_g = gam if not isinstance(gam, torch.Tensor) else torch.nn.Parameter(gam.detach().clone())
    ref = run(ref_ins, ref_g)
    for _ in range(3):  # the first call prepares the signature, the next ones reuse it
        got = run(leaves, gam)
        torch.testing.assert_close(got[0], ref[0], rtol=0, atol=0)  # (the forward has no atomics)
        for a, b in zip(got[1:], ref[1:], strict=True):  # (atomics: the order of float additions varies)
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3 * float(b.abs().max()))
    assert ag._STEPS, "the signature was not kept"
