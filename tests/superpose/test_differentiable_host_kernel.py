"""kernels/qcp_backward.cu on the host (compiled as C++20 with one std::thread per CUDA thread, as
superpose_helpers builds qcp.cu) run through ``differentiable.backward_cuda`` itself on CPU tensors, and
held equal to the torch-ops twin ``backward_torch``: every combination of upstream gradients, weights,
fitted-atom selections, float32 and float64, and the degenerate inputs (identical, planar, collinear)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
from superpose_helpers import _PRELUDE, DEGENERATE_CASES, degenerate_pair, random_rotation

from protgpu.superpose import differentiable as D
from protgpu.superpose import to_reference

torch = pytest.importorskip("torch")

_EXTRA = r"""
using std::hypot;
static inline void __syncwarp(unsigned = 0xffffffffu) { g_warp_bar[pg_tid() >> 5]->arrive_and_wait(); }
"""
BLOCK = 64  # host threads per block (the GPU's blocks are larger; the kernels take any multiple of 32)


class _HostPlan:
    def __init__(self, fn, grid, block, tail):
        self.fn, self.tail = fn, tail
        self.dims = (*tuple(grid) + (1,) * (2 - len(grid)), *tuple(block) + (1,) * (2 - len(block)))

    def launch(self, stream, device_id, *pointers):
        self.fn(*self.dims, *(ctypes.c_void_p(p or None) for p in pointers), *self.tail)


@pytest.fixture(scope="module")
def host_backward(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the host emulation of qcp_backward.cu")
    from protgpu._cuda import loader

    src = loader.read_source("qcp_backward")
    wrappers = []
    for m in loader._ENTRY.finditer(src):
        names = [loader._parse_param(q).name for q in m.group(2).split(",")]
        wrappers.append(f'extern "C" void host_{m.group(1)}(int g_x_, int g_y_, int b_x_, int b_y_, {m.group(2)}) '
                        f'{{ run_grid(g_x_, g_y_, b_x_, b_y_, [=] {{ {m.group(1)}({", ".join(names)}); }}); }}')
    d = tmp_path_factory.mktemp("qcp_backward_host")
    (d / "k.cpp").write_text(_PRELUDE + _EXTRA + loader.build_source("qcp_backward").replace("#pragma once", "")
                             + "\n" + "\n".join(wrappers))
    proc = subprocess.run([cxx, "-O1", "-std=c++20", "-pthread", "-shared", "-fPIC", str(d / "k.cpp"), "-o",
                           str(d / "k.so")], capture_output=True, text=True)
    if proc.returncode != 0:
        if "barrier" in proc.stderr:
            pytest.skip(f"{cxx} lacks C++20 <barrier>")
        raise AssertionError(proc.stderr[-3000:])
    so = ctypes.CDLL(str(d / "k.so"))
    params = loader.entry_points("qcp_backward")
    ctype = {np.float64: ctypes.c_double, np.int32: ctypes.c_int, np.int64: ctypes.c_longlong}
    fns = {}
    for entry, prm in params.items():
        fn = getattr(so, f"host_{entry}")
        fn.argtypes = [ctypes.c_int] * 4 + [ctypes.c_void_p if p.pointer else ctype[p.dtype] for p in prm]
        fns[entry] = fn

    def plan(key, entry, grid, block, tail):
        return _HostPlan(fns[entry], grid, block, tuple(float(v) if isinstance(v, float) else int(v) for v in tail))

    return plan


@pytest.fixture
def on_host(host_backward, monkeypatch):
    """backward_cuda with the host kernels (CPU tensors' pointers) and no CUDA stream."""
    monkeypatch.setattr(D, "_plan", host_backward)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: type("S", (), {"cuda_stream": 0})())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    from protgpu.superpose import kernels

    monkeypatch.setattr(kernels, "WARP_THREADS", BLOCK)


def _setup(x, y, w=None, fit=None):
    """The forward's results and an _Info with host-side 'device' operands (torch CPU tensors)."""
    fit_t = None if fit is None else torch.as_tensor(fit)
    yf = y if fit is None else y[fit]
    info = D._Info(yf, w, fit, fit_t)
    r, rot, t, _ = to_reference.rmsd_numpy(x.astype(np.float64), (yf, None), fit, None, w, None)
    yc, cy, gb, inv_w = to_reference.centre_reference(yf, w)
    ref, wyc = to_reference.reference_operands(yc, w)
    info.dev_ops = ((cy, gb, inv_w), wyc, torch.from_numpy(ref),
                    None if fit is None else torch.as_tensor(np.asarray(fit, np.int32)))
    return info, torch.from_numpy(r), torch.from_numpy(rot), torch.from_numpy(t)


def _grads(rng, f, n_atoms, which, dt):
    g = [torch.tensor(rng.normal(size=(f,))), torch.tensor(rng.normal(size=(f, 3, 3))),
         torch.tensor(rng.normal(size=(f, 3))), torch.tensor(rng.normal(size=(f, n_atoms, 3)), dtype=dt)]
    return tuple(g[i] if i in which else None for i in range(4))


def _both(x, info, r, rot, t, grads, need_y=True):
    xt = torch.from_numpy(x)
    got = D.backward_cuda(xt, r, rot, t, info, grads, True, need_y)
    # the twin in float64 on the same (upcast) coordinates: the kernel computes in float64 throughout
    g64 = tuple(None if g is None else g.double() for g in grads)
    want = D.backward_torch(xt.double(), r, rot, t, info, g64, True, need_y)
    return got, want


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("which", [(0,), (1,), (2,), (3,), (0, 1, 2, 3)])
@pytest.mark.parametrize("sel", ["all", "fit", "weights"])
def test_kernel_against_the_torch_twin(on_host, dtype, which, sel):
    """float64: the same numbers to 1e-10 relative (only the order of sums and the solve differ);
    float32 input: the kernel reads it and computes in float64, so it matches the float64 twin on the
    upcast coordinates to float32's rounding of the result (1e-6 relative to the largest entry)."""
    rng = np.random.default_rng(hash((dtype().itemsize, which, sel)) % 2**32)
    f, n_atoms = 37, 150  # more fitted atoms than a block of qcp_bwd_reference_* has threads
    y = rng.normal(size=(n_atoms, 3)) * 6
    x = (y @ random_rotation(rng).T + rng.normal(size=(f, n_atoms, 3)) + 30.0).astype(dtype)
    fit = w = None
    if sel == "fit":
        fit = rng.permutation(n_atoms)[:23]
    if sel == "weights":
        fit = np.arange(3, 40)
        w = rng.uniform(0.5, 2.0, len(fit))
    info, r, rot, t = _setup(x, y, w, fit)
    grads = _grads(rng, f, n_atoms, which, torch.float32 if dtype == np.float32 else torch.float64)
    (gx, gy), (ex, ey) = _both(x, info, r, rot, t, grads)
    assert gx.dtype == torch.from_numpy(x).dtype and gy.dtype == torch.float64
    tol = 1e-10 if dtype == np.float64 else 1e-6
    for a, b in ((gx, ex), (gy, ey)):
        scale = float(b.abs().max())
        assert scale > 0
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol * scale)
    # without the reference's gradient: the same mobile gradient
    gx2, gy2 = D.backward_cuda(torch.from_numpy(x), r, rot, t, info, grads, True, False)
    assert gy2 is None and torch.equal(gx2, gx)


def test_reference_chunks_sum_to_the_same(on_host, monkeypatch):
    """Many frame chunks (the partial sums over frames) give the reference's gradient of one chunk."""
    rng = np.random.default_rng(3)
    y = rng.normal(size=(20, 3)) * 5
    x = y + rng.normal(size=(50, 20, 3))
    info, r, rot, t = _setup(x, y)
    grads = _grads(rng, 50, 20, (0, 1), torch.float64)
    one = D.backward_cuda(torch.from_numpy(x), r, rot, t, info, grads, False, True)[1]
    monkeypatch.setattr(D, "REFERENCE_THREADS", 1)
    many = D.backward_cuda(torch.from_numpy(x), r, rot, t, info, grads, False, True)[1]
    torch.testing.assert_close(many, one, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", DEGENERATE_CASES)
def test_degenerate_inputs_are_finite(on_host, case):
    rng = np.random.default_rng(4)
    x, y = degenerate_pair(case, rng)
    info, r, rot, t = _setup(x, y)
    grads = _grads(rng, 2, 12, (0, 1, 2, 3), torch.float64)
    (gx, gy), (ex, ey) = _both(x, info, r, rot, t, grads)
    assert torch.isfinite(gx).all() and torch.isfinite(gy).all()
    if case in ("identical", "planar"):  # a unique rotation: the kernel is the twin
        torch.testing.assert_close(gx, ex, rtol=1e-7, atol=1e-7 * float(ex.abs().max()))
        torch.testing.assert_close(gy, ey, rtol=1e-7, atol=1e-7 * float(ey.abs().max()))
    if case == "identical":  # the RMSD's gradient alone is 0 at RMSD 0 (the cone's minimal subgradient)
        g0 = (grads[0], None, None, None)
        assert torch.count_nonzero(D.backward_cuda(torch.from_numpy(x), r, rot, t, info, g0, True, False)[0]) == 0
