"""Shared helpers of the protgpu.superpose tests: float64 Kabsch references, test inputs, the host
build of kernels/qcp.cu (compiled as C++20 with one std::thread per CUDA thread) and a fake CuPy device
running it. Imported by the test modules of this folder (pytest puts the folder on sys.path)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import threading
import types

import numpy as np
import pytest

from protgpu.superpose import (
    kernels,
    qcp,
)


def kabsch(x, y, w=None):
    """float64 weighted Kabsch: (rmsd, R, t) with y ~ x @ R.T + t."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.ones(len(x)) if w is None else np.asarray(w, dtype=np.float64)
    cx = w @ x / w.sum()
    cy = w @ y / w.sum()
    a, b = x - cx, y - cy
    u, s, vt = np.linalg.svd((a * w[:, None]).T @ b)
    d = np.sign(np.linalg.det(u @ vt)) or 1.0
    r = (u @ np.diag([1, 1, d]) @ vt).T
    diff = a @ r.T - b
    return float(np.sqrt((w * (diff**2).sum(1)).sum() / w.sum())), r, cy - r @ cx


def random_rotation(rng):
    q = rng.normal(size=4)
    return qcp.quaternion_to_rotation((q / np.linalg.norm(q))[None])[0]


#: Degenerate superposition inputs whose gradients must stay finite (issue 20).
DEGENERATE_CASES = ("identical", "planar", "collinear", "both collinear")


def degenerate_pair(case: str, rng):
    """(x (2, 12, 3), y (12, 3)) for one of :data:`DEGENERATE_CASES`: x identical to y up to a rigid
    motion, planar, collinear, or both x and y on one line."""
    y = rng.normal(size=(12, 3)) * 4
    line = np.arange(12.0)[:, None] * np.array([1.0, 2.0, 0.5]) + 0.1
    if case == "identical":
        x = np.stack([y, y @ random_rotation(rng).T + 3.0])
    elif case == "planar":
        y[:, 2] = 0.0
        x = np.stack([y + rng.normal(size=y.shape) * 0.3 * [1, 1, 0]] * 2)
    elif case == "collinear":
        x = np.stack([line, line + 1.0])
    else:
        y = line.copy()
        x = np.stack([line @ random_rotation(rng).T, line + 2.0])
    return x, y

def kabsch_rmsd_matrix(x, y):
    return np.array([[kabsch(a, b)[0] for b in y] for a in x])


def load_nmr(shared_datasets):
    from protgpu.io import load

    return load(shared_datasets / "mdtraj" / "2EQQ.pdb")


def load_adk(datasets):
    from protgpu.io import load

    return load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb")


def threads_input():
    rng = np.random.default_rng(21)
    base = rng.normal(size=(24, 3)) * 6
    x = base + rng.normal(size=(45, 24, 3)) * rng.uniform(0.01, 2, size=(45, 1, 1))
    x[7] = x[3] @ random_rotation(rng).T + 5  # a duplicate: its pair sits at a near-repeated root
    line = np.outer(np.arange(24.0), [1, 2, 0.5])
    x[20], x[21] = line, line[::-1] * 1.01  # collinear: the refine (Jacobi) path inside a worker
    return x


# --------------------------------------------------------------------------------------------------
# qcp.cu itself on the host: compiled as C++20 with one std::thread per CUDA thread (warp shuffles and
# __syncthreads through barriers), blocks one after the other. Each entry point gets a generated
# wrapper host_<entry>(gx, gy, bx, by, <its parameters>) that runs it over a grid.


_PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
using std::sqrt; using std::fabs; using std::fmin; using std::fmax; using std::copysign; using std::isnan;
using std::fma; using std::isfinite;
struct pg_dim3 { unsigned x, y, z; };
static thread_local pg_dim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0};
static pg_dim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
static std::barrier<>* g_block_bar = nullptr;
static std::vector<std::barrier<>*> g_warp_bar;
static double g_xchg[64][32];
static inline int pg_tid() { return (int)(threadIdx.y * blockDim.x + threadIdx.x); }
static inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
static inline double __shfl_xor_sync(unsigned, double v, int off) {
    const int t = pg_tid(), lane = t & 31, w = t >> 5;
    g_xchg[w][lane] = v;
    g_warp_bar[w]->arrive_and_wait();
    const double r = g_xchg[w][lane ^ off];
    g_warp_bar[w]->arrive_and_wait();
    return r;
}
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
static inline double2 make_double2(double x, double y) { return {x, y}; }
// One std::thread per thread of a block, each walking all the blocks in order; a barrier closes each
// block (its __shared__ arrays are statics, reused by the next block).
static void run_grid(int gx, int gy, int bx, int by, const std::function<void()>& body) {
    const int nt = bx * by;
    blockDim = {(unsigned)bx, (unsigned)by, 1};
    gridDim = {(unsigned)gx, (unsigned)gy, 1};
    std::barrier<> bb(nt);
    g_block_bar = &bb;
    std::vector<std::unique_ptr<std::barrier<>>> own;
    g_warp_bar.clear();
    for (int w = 0; w < (nt + 31) / 32; ++w) {
        own.emplace_back(new std::barrier<>(nt - 32 * w < 32 ? nt - 32 * w : 32));
        g_warp_bar.push_back(own.back().get());
    }
    std::vector<std::thread> th;
    for (int t = 0; t < nt; ++t)
        th.emplace_back([&, t] {
            threadIdx = {(unsigned)(t % bx), (unsigned)(t / bx), 0};
            for (int yb = 0; yb < gy; ++yb)
                for (int xb = 0; xb < gx; ++xb) {
                    blockIdx = {(unsigned)xb, (unsigned)yb, 0};
                    body();
                    bb.arrive_and_wait();
                }
        });
    for (auto& x : th) x.join();
}
"""


def _host_wrappers():
    """``extern "C" host_<entry>(int gx, int gy, int bx, int by, <params>)`` for every entry point."""
    import re

    from protgpu._cuda import loader

    src = loader.read_source("qcp")
    out = []
    for m in loader._ENTRY.finditer(src):
        name, params = m.group(1), m.group(2)
        names = [loader._parse_param(q).name for q in params.split(",") if q.strip()]
        out.append(f'extern "C" void host_{name}(int gx, int gy, int bx, int by, {params}) '
                   f'{{ run_grid(gx, gy, bx, by, [=] {{ {name}({", ".join(names)}); }}); }}')
    assert out and not re.search(r"\bhost_\w+\(int gx, int gy, int bx, int by, \)", "\n".join(out))
    return "\n".join(out)


class _HostKernels:
    """The host build: ``kernels.<entry>(grid, block, *args)`` runs an entry point (arguments: NumPy
    arrays or None for pointers, Python numbers for scalars, as protgpu._cuda.launch takes them)."""

    def __init__(self, so):
        from protgpu._cuda import loader

        self.so, self.params = so, loader.entry_points("qcp")
        for entry, params in self.params.items():
            fn = getattr(so, f"host_{entry}")
            types = [ctypes.c_int] * 4
            for prm in params:
                if prm.pointer:
                    types.append(ctypes.c_void_p)
                else:
                    types.append({np.float64: ctypes.c_double, np.float32: ctypes.c_float, np.int32: ctypes.c_int,
                                  np.int64: ctypes.c_longlong}[prm.dtype])
            fn.argtypes = types

    def run(self, entry, grid, block, *args):
        grid, block = tuple(grid) + (1,) * (2 - len(grid)), tuple(block) + (1,) * (2 - len(block))
        conv = []
        for prm, v in zip(self.params[entry], args, strict=True):
            if prm.pointer:
                if v is not None:
                    assert isinstance(v, np.ndarray) and v.dtype == np.dtype(prm.dtype) and v.flags.c_contiguous, \
                        (entry, prm.name)
                conv.append(None if v is None else v.ctypes.data)
            else:
                conv.append(v)
        getattr(self.so, f"host_{entry}")(grid[0], grid[1], block[0], block[1], *conv)


HOST_PAIR_BLOCK = (32, 2)  # the host build's pair blocks: 64 threads (the GPU's are 32 x 8)


_BUILT: list = []  # the host build, made once per test session


def build_host_kernels(tmp_path_factory):
    """The host build of qcp.cu (made once; skips without a C++20 compiler)."""
    if _BUILT:
        return _BUILT[0]
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the host emulation of qcp.cu")
    from protgpu._cuda.loader import build_source

    d = tmp_path_factory.mktemp("qcp_host")
    defines = {**kernels.qcp_defines(), "PAIR_BY": HOST_PAIR_BLOCK[1]}
    src = _PRELUDE + build_source("qcp", defines).replace("#pragma once", "") + "\n" + _host_wrappers()
    (d / "qcp.cpp").write_text(src)
    lib = d / "qcp.so"
    proc = subprocess.run([cxx, "-O1", "-std=c++20", "-pthread", "-shared", "-fPIC", str(d / "qcp.cpp"), "-o",
                           str(lib)], capture_output=True, text=True)
    if proc.returncode != 0:
        if "barrier" in proc.stderr:
            pytest.skip(f"{cxx} lacks C++20 <barrier>")
        raise AssertionError(proc.stderr[-3000:])
    _BUILT.append(_HostKernels(ctypes.CDLL(str(lib))))
    return _BUILT[0]


class FakeDeviceArray(np.ndarray):
    def get(self, stream=None, out=None, blocking=True):
        if out is None:
            return np.array(self)
        out[...] = self
        return out


def fake_cupy():

    def dev(a):
        return np.asarray(a).view(FakeDeviceArray)

    class Event:
        def synchronize(self):
            pass

    class Stream:
        def __init__(self, non_blocking=False):
            pass

        def record(self):
            return Event()

        def wait_event(self, ev):
            pass

        def synchronize(self):
            pass

    cp = types.ModuleType("cupy")
    cp.ndarray = FakeDeviceArray
    cp.float64, cp.float32, cp.int32 = np.float64, np.float32, np.int32
    cp.asarray = lambda a, dtype=None: dev(np.asarray(a, dtype=dtype))
    cp.ascontiguousarray = lambda a, dtype=None: dev(np.ascontiguousarray(a, dtype=dtype))

    def empty(shape, dtype=np.float64):
        # device memory is not cleared: poison it, so that an element a kernel should write but does not shows
        out = np.empty(shape, dtype=dtype)
        out.fill(np.nan if out.dtype.kind == "f" else 0x5A)
        return dev(out)

    cp.empty = empty
    cp.arange = lambda *a: dev(np.arange(*a))
    cp.einsum = lambda *a, **k: dev(np.einsum(*a, **k))
    cp.matmul = lambda *a, **k: dev(np.matmul(*a, **k))
    cp.sqrt = lambda *a, **k: dev(np.sqrt(*a, **k))
    cp.flatnonzero = lambda a: dev(np.flatnonzero(a))

    def asnumpy(a, stream=None, out=None, blocking=True):
        out[...] = a
        return out

    cp.asnumpy = asnumpy
    cp.isfinite = lambda a: dev(np.isfinite(np.asarray(a)))
    cp.argmax = lambda a: np.argmax(np.asarray(a))

    class Device:  # one fake GPU, ordinal 0
        def __init__(self, i=0):
            assert i == 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1, getDevice=lambda: 0)
    cp.cuda = types.SimpleNamespace(Stream=Stream, get_current_stream=lambda: Stream(), Device=Device, runtime=runtime)
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda shape, dtype=np.float64: np.empty(shape, dtype=dtype)
    return cp, cupyx


def install_fake_device(host_kernels, monkeypatch):
    """The fake device: CuPy, cupyx, the kernel loader and cuBLAS replaced for the test (through
    ``monkeypatch``); returns the list of launches ``(kernel name, last argument of pair kernels)``."""
    import protgpu._cuda as pc
    import protgpu._cuda.blas as blas
    from protgpu._cuda import loader

    cp, cupyx = fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(64 << 20))
    monkeypatch.setattr(kernels, "WARP_THREADS", 64)  # fewer host threads per block; kernels use blockDim
    monkeypatch.setattr(kernels, "PAIR_BLOCK", HOST_PAIR_BLOCK)  # as the host build (PAIR_BY in the defines)
    launches = []
    # The host emulation keeps its grid state in globals: one launch at a time (the multi-GPU path
    # launches from several host threads).
    emulator_lock = threading.Lock()

    def get_kernel(name, entry, defines=None):
        assert name == "qcp" and defines == kernels.qcp_defines()
        params = loader.entry_points(name)[entry]
        return loader.KernelHandle(kernel=entry, name=f"{name}.{entry}", params=params)

    def launch(h, grid, block, *args, shared_mem=0, stream=None):
        assert len(args) == len(h.params), h.name
        assert all(isinstance(v, int) and v > 0 for v in (*grid, *block)), (h.name, grid, block)
        conv = []
        for p, a in zip(h.params, args, strict=True):
            if p.pointer:
                assert a is None or isinstance(a, FakeDeviceArray), (h.name, p.name, type(a))
                conv.append(None if a is None else np.asarray(a))
            else:
                conv.append(loader._convert_arg(h, p, a).item())
        with emulator_lock:
            launches.append((h.name, args[-1] if "pairs" in h.name or "refine" in h.name else None))
            host_kernels.run(h.kernel, grid, block, *conv)

    flip = [False]

    def matmul(a, b):  # row-major as cuBLAS through nvmath gives it; now and then column-major (copied)
        flip[0] = not flip[0]
        r = np.asarray(a) @ np.asarray(b)
        return (np.asfortranarray(r) if flip[0] and r.shape[0] > 1 and r.shape[1] > 1 else r).view(FakeDeviceArray)

    monkeypatch.setattr(pc, "get_kernel", get_kernel)
    monkeypatch.setattr(pc, "launch", launch)
    monkeypatch.setattr(blas, "matmul", matmul)
    return launches
