"""The attention's flash-style forward with log-sum-exp and its backward on the GPU, for the autograd op
(:mod:`protgpu.attention.autograd`): torch CUDA tensors or CuPy arrays in, the same library out, every
launch on the caller's current stream, no host synchronisation.

* :func:`flash_forward_lse` -> ``(out, lse)``: float16 / bfloat16 with ``d`` a multiple of 16 run the
  tensor-core kernel ``attention_flash.cu`` (its ``*_lse_*`` entry points, ``FA_WRITE_LSE=1``); other
  inputs ``flash_bwd_fwd_*`` of ``attention_flash_bwd.cu`` on CUDA cores.
* :func:`flash_backward` -> ``(dq, dk, dv, dcoords, dgamma)``: ``flash_bwd_delta_*`` (Dlt = rowsum(dO out)),
  then the backward proper, parallel over key tiles (dQ, dcoords and dgamma by atomics): ``flash_bwd_*``
  (CUDA cores), ``flash_bwd_mma_*`` (mma.sync) or ``flash_bwd_wg_*`` (wgmma, sm_90a), as
  :func:`bwd_config`'s ``BW_MMA`` says; then, for 16-bit inputs, ``flash_bwd_dq_*`` (dQ from its float32
  accumulator).
* :func:`supports`: whether a call is one these kernels take.
* :class:`TorchCall`: both, for one signature of torch CUDA inputs, with the checks and launch plans
  settled once (the autograd op keeps one per call signature).

The formulas are those of :func:`protgpu.attention.reference.attention_backward_numpy`, the
specification; ``docs/design/flash-attention.md`` explains the kernels. Arithmetic (and ``lse``,
``dcoords``, ``dgamma``) is float32, float64 for float64 inputs.

Internal API (tests, benchmarks): the functions above, :func:`bwd_config`, :func:`bwd_variant`,
:func:`bwd_block` and ``BWD_OVERRIDES`` (knobs of the backward that override :func:`bwd_config`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._array import is_cupy_array, is_torch_tensor
from ..errors import InputError
from .cuda import _MAX_GRID_YZ, _device_gamma
from .flash import _STATIC_SMEM, flash_block_m, flash_config, flash_entry, fused_kernel, wgmma_device

MAX_HEAD_DIM = 128
# flash_bwd_mma_* keeps the K, V fragments of 16 keys and the dK, dV accumulators in registers: beyond
# d = 64 they would spill.
MMA_MAX_HEAD_DIM = 64
_MMA_TILE = 64  # BWM_BN: keys per block of flash_bwd_mma_* (and BWG_TILE of flash_bwd_wg_*)
# flash_bwd_wg_* reads 128-byte rows of Q, dO, K in the 128-byte swizzle: d = 64 only.
WG_HEAD_DIM = 64
# Dynamic shared memory of flash_bwd_wg_* with BWG_KEYS=128 (BWG_DYN_SMEM of attention_flash_bwd_wg.cuh,
# which checks that its tiles fit): above the 48 KB a launch gets without opting in.
_WG128_SMEM = 60 * 1024
# Tile knobs of attention_flash_bwd.cu (BW_BM, BW_BN) that override bwd_config.
BWD_OVERRIDES: dict = {}
_SUFFIX = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64"}
_KIND = {"bfloat16": 0, "float16": 1, "float32": 2, "float64": 3}  # BW_KIND of attention_flash_bwd.cu
_THREADS = 128  # BW_THREADS
_FWD_WARPS = 4  # BW_FWD_WARPS
_ELEMENTWISE_THREADS = 256
_ELEMENTWISE_BLOCKS = 4096  # grid-stride kernels: enough blocks to fill the device
_PLANS: dict = {}
_MAX_PLANS = 256


def bwd_smem_bytes(d: int, bm: int, bn: int, itemsize: int) -> int:
    """Static shared memory of ``flash_bwd_*``: K, V tiles (bn rows) and Q, dO tiles (bm rows) of d + 1
    values, P and dS (bm x (bn + 1)), coordinates, lse and Dlt, key flags and the block reduction."""
    values = 2 * bn * (d + 1) + 2 * bm * (d + 1) + 2 * bm * (bn + 1) + 3 * bn + 3 * bm + 2 * bm + _THREADS // 32
    return itemsize * values + bn


def bwd_config(precision: str, d: int, *, cutoff: bool = False) -> dict:
    """Compile-time knobs of ``attention_flash_bwd.cu``: ``HEAD_DIM``, ``BW_KIND``; ``BW_MMA``, which
    tensor-core backward runs the call (16-bit, ``d`` a multiple of 16 up to ``MMA_MAX_HEAD_DIM``): 2, the
    wgmma kernel ``flash_bwd_wg_*``, at ``d = WG_HEAD_DIM`` (it runs on a compute capability 9.0 device,
    the mma.sync kernel elsewhere: :func:`bwd_variant`), else 1, the mma.sync kernel ``flash_bwd_mma_*``;
    0 otherwise: the CUDA-core ``flash_bwd_*`` with square tiles ``BW_BM = BW_BN``, the largest of 32, 16,
    8 whose shared memory fits 48 KB. ``BWD_OVERRIDES`` replaces any knob: ``BW_MMA=0`` forces the
    CUDA-core kernel, ``BW_MMA=1`` the mma.sync one (``BW_MMA=2`` is lowered to 1 where the wgmma kernel
    does not apply); with the wgmma kernel ``BWG_DQ_MMA=1`` computes its dQ product on mma.sync instead
    of wgmma, ``BWG_DQ_BULK=1`` adds its dQ by bulk reductions of staged rows instead of
    ``red.global``, and ``BWG_KEYS=128`` runs blocks of 128 keys as two warpgroups sharing each query
    tile (256 threads, dQ once per 128 keys; not with ``BWG_DQ_BULK``). ``BWG_KEYS`` defaults to 128 for a
    call without cutoff (``cutoff=False``) and to 64 with one, the faster of the two for each on the H200
    (``docs/design/flash-attention.md``); 64 with ``BWG_DQ_BULK``."""
    itemsize = 8 if precision == "float64" else 4
    tile = next((t for t in (32, 16, 8) if bwd_smem_bytes(d, t, t, itemsize) <= _STATIC_SMEM), None)
    if tile is None:
        raise InputError(f"head dimension {d} is too large for the attention backward kernel")
    mma = precision in ("bfloat16", "float16") and d % 16 == 0 and d <= MMA_MAX_HEAD_DIM
    cfg = {"BW_BM": tile, "BW_BN": tile, "BW_MMA": 2 * int(mma)}  # (lowered to 1 below where wgmma does not apply)
    cfg.update(BWD_OVERRIDES)
    want = int(cfg["BW_MMA"])
    cfg["BW_MMA"] = 0 if not (mma and want) else (2 if want >= 2 and d == WG_HEAD_DIM else 1)
    if cfg["BW_MMA"] == 2 and "BWG_KEYS" not in cfg:
        cfg["BWG_KEYS"] = _MMA_TILE if cutoff or cfg.get("BWG_DQ_BULK") else 2 * _MMA_TILE
    cfg.update({"HEAD_DIM": d, "BW_KIND": _KIND[precision]})
    return cfg


def bwd_block(cfg: dict, variant: str) -> tuple[int, int, int]:
    """``(keys, threads, dynamic shared memory in bytes)`` of one block of the backward kernel that
    ``variant`` (:func:`bwd_variant`) names under ``cfg``."""
    if variant == "simt":
        return int(cfg["BW_BN"]), _THREADS, 0
    if variant == "wg" and int(cfg.get("BWG_KEYS", _MMA_TILE)) == 2 * _MMA_TILE:
        return 2 * _MMA_TILE, 2 * _THREADS, _WG128_SMEM
    return _MMA_TILE, _THREADS, 0


def bwd_variant(cfg: dict) -> str:
    """Which backward kernel runs under ``cfg`` (:func:`bwd_config`) on the current device: ``"simt"``
    (``flash_bwd_*``), ``"mma"`` (``flash_bwd_mma_*``) or ``"wg"`` (``flash_bwd_wg_*``: ``BW_MMA = 2`` on
    a compute capability 9.0 device)."""
    level = int(cfg["BW_MMA"])
    if level >= 2 and wgmma_device():
        return "wg"
    return "mma" if level else "simt"


_TORCH_PRECISION: dict = {}  # torch dtype -> precision name (made once: the op's every call asks)


def _precision(a) -> str | None:
    """The precision name of a torch tensor or CuPy array the kernels take, else None."""
    if is_torch_tensor(a):
        if not _TORCH_PRECISION:
            import torch

            _TORCH_PRECISION.update({torch.bfloat16: "bfloat16", torch.float16: "float16",
                                     torch.float32: "float32", torch.float64: "float64"})
        return _TORCH_PRECISION.get(a.dtype)
    if is_cupy_array(a):
        name = a.dtype.name
        return name if name in _SUFFIX and a.dtype.itemsize in (2, 4, 8) else None
    return None


def _device_of(a) -> tuple[str, int] | None:
    if is_torch_tensor(a):
        return ("torch", a.device.index) if a.device.type == "cuda" else None
    if is_cupy_array(a):
        return ("cupy", a.device.id)
    return None


def supports(q, k=None, v=None, coords=None, gamma=None, cutoff=None, mask=None, scale=None) -> bool:
    """Whether :func:`flash_forward_lse` / :func:`flash_backward` take this call (arguments as theirs; only
    those given are looked at): q (and k, v alike) a (B, L, H, d) torch CUDA tensor or CuPy array of
    bfloat16, float16, float32 or float64 with d <= 128 and B, H <= 65535; coords and mask, if given, of
    the same library on the same device."""
    prec = _precision(q)
    where = _device_of(q)
    if prec is None or where is None or q.ndim != 4:
        return False
    B, L, H, d = q.shape
    if min(B, L, H, d) < 1 or d > MAX_HEAD_DIM or B > _MAX_GRID_YZ or H > _MAX_GRID_YZ:
        return False
    if B * L * H * d >= 2**62:
        return False
    for a in (k, v):
        if a is not None and (_device_of(a) != where or _precision(a) != prec or tuple(a.shape) != tuple(q.shape)):
            return False
    for a in (coords, mask):
        if a is not None and _device_of(a) != where:
            return False
    return True


# --------------------------------------------------------------------------------------------------
# The caller's library: allocations on its current stream, raw pointers, the stream handle.


class _Lib:
    __slots__ = ("cupy", "dev", "stream", "torch")

    def __init__(self, q):
        if is_torch_tensor(q):
            import torch

            self.torch, self.cupy = torch, None
            self.dev = q.device
            # the raw handle, without building a torch.cuda.Stream object (as fast.py; inductor does the same)
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            self.stream = raw(q.get_device()) if raw is not None else torch.cuda.current_stream(q.device).cuda_stream
        else:
            import cupy

            self.torch, self.cupy = None, cupy
            self.dev = q.device
            self.stream = cupy.cuda.get_current_stream().ptr

    @property
    def device_id(self) -> int:
        return self.dev.index if self.torch is not None else self.dev.id

    def dtype(self, name: str, like=None):
        """The library's dtype for a precision name (bfloat16 in CuPy: the caller's own dtype)."""
        if self.torch is not None:
            return getattr(self.torch, name)
        if name == "bfloat16":
            return like.dtype
        return np.dtype(name)

    def empty(self, shape, dtype):
        if self.torch is not None:
            return self.torch.empty(shape, dtype=dtype, device=self.dev)
        return self.cupy.empty(shape, dtype=dtype)

    def zeros(self, shape, dtype):
        if self.torch is not None:
            return self.torch.zeros(shape, dtype=dtype, device=self.dev)
        return self.cupy.zeros(shape, dtype=dtype)

    def ready(self, a, dtype=None, align: int = 1):
        """``a`` on q's device, C-contiguous (in ``dtype`` if given), its base aligned to ``align`` bytes."""
        if self.torch is not None:
            if not is_torch_tensor(a):
                a = self.torch.as_tensor(np.asarray(a), device=self.dev)
            a = a.detach()  # (the kernels read the data; nothing here is recorded by autograd)
            if a.device != self.dev:  # (coordinates or a mask left on the host: copied over)
                a = a.to(self.dev)
            if dtype is not None and a.dtype is not dtype:
                a = a.to(dtype)
            if not a.is_contiguous() or a.data_ptr() % align:
                a = a.clone(memory_format=self.torch.contiguous_format)
            return a
        if not is_cupy_array(a):
            a = self.cupy.asarray(np.asarray(a))
        if dtype is not None and a.dtype != dtype:
            a = a.astype(dtype)
        a = self.cupy.ascontiguousarray(a)
        if a.data.ptr % align:
            a = a.copy()
        return a

    def mask_bytes(self, m):
        """A bool mask as contiguous bytes (0 / 1): a view."""
        if m is None:
            return None
        if self.torch is not None:
            return self.ready(m, self.torch.bool).view(self.torch.uint8)
        return self.ready(m, np.dtype(bool)).view(self.cupy.uint8)

    def ptr(self, a) -> int:
        if a is None:
            return 0
        return a.data_ptr() if self.torch is not None else a.data.ptr

    def gamma(self, gamma, H: int, dtype_name: str):
        """gamma (H,) on the device in ``dtype_name``: a device array is converted there (no host
        round trip); a host one is uploaded once per value (:func:`protgpu.attention.cuda._device_gamma`)."""
        where = _device_of(gamma)
        if where is not None:
            if where[0] != ("torch" if self.torch is not None else "cupy"):
                raise InputError("gamma on the device must be of the same library as q (torch or CuPy)")
            g = self.ready(gamma.reshape(-1) if gamma.ndim else gamma.reshape(1), self.dtype(dtype_name))
            if g.shape[0] == 1 and H != 1:
                g = g.expand(H).contiguous() if self.torch is not None else self.cupy.ascontiguousarray(
                    self.cupy.broadcast_to(g, (H,)))
            if g.shape[0] != H:
                raise InputError(f"gamma has {g.shape[0]} values for {H} heads")
            return g
        if is_torch_tensor(gamma):  # a CPU tensor (perhaps a Parameter)
            gamma = gamma.detach().numpy()
        g = np.asarray(gamma, dtype=np.float64).reshape(-1)
        if g.size == 1:
            g = np.full(H, g[0])
        if g.shape != (H,):
            raise InputError(f"gamma has {g.size} values for {H} heads")
        return _device_gamma(g, dtype_name)  # a CuPy array: its pointer serves any stream


def _gptr(lib: _Lib, g) -> int:
    return g.data.ptr if is_cupy_array(g) else lib.ptr(g)


def _coords_stride(shape: tuple, B: int, L: int) -> int:
    """The batch stride of coordinates of this shape (0: one set shared by the batch)."""
    if shape in ((L, 3), (1, L, 3)):
        return 0
    if shape == (B, L, 3):
        return 3 * L
    raise InputError(f"coords have shape {shape}; expected ({B}, {L}, 3) or ({L}, 3)")


def _mask_stride(shape: tuple, B: int, L: int) -> int:
    """The batch stride of a mask of this shape (0: one mask shared by the batch)."""
    if shape in ((L,), (1, L)):
        return 0
    if shape == (B, L):
        return L
    raise InputError(f"mask has shape {shape}; expected ({B}, {L}) or ({L},)")


def _coords(lib: _Lib, coords, B: int, L: int, dtype_name: str):
    """Coordinates as contiguous (., L, 3) in the arithmetic type and their batch stride (0: shared)."""
    xstride = _coords_stride(tuple(coords.shape), B, L)
    return lib.ready(coords, lib.dtype(dtype_name)), xstride


def _mask(lib: _Lib, mask, B: int, L: int):
    if mask is None:
        return None, 0
    mstride = _mask_stride(tuple(mask.shape), B, L)
    return lib.mask_bytes(mask), mstride


def _scalars(d: int, cutoff, scale) -> tuple[float, float]:
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    cutoff2 = -1.0 if cutoff is None else float(cutoff) ** 2
    return scale, cutoff2


def _plan(key, build):
    """A launch plan per key (kernel, grid, scalar tail), built once."""
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()  # plans hold no device memory
        plan = _PLANS[key] = build()
    return plan


def _elementwise_grid(n: int) -> int:
    return max(1, min(_ELEMENTWISE_BLOCKS, (n + _ELEMENTWISE_THREADS - 1) // _ELEMENTWISE_THREADS))


def _arith(prec: str) -> str:
    return "float64" if prec == "float64" else "float32"


def _check(q, k, v) -> tuple[str, tuple]:
    if not supports(q, k, v):
        raise InputError("flash attention kernels take (B, L, H, d) torch CUDA tensors or CuPy arrays of "
                         f"bfloat16, float16, float32 or float64 with d <= {MAX_HEAD_DIM}, all alike")
    return _precision(q), tuple(q.shape)


def _forward_plan(prec: str, dev: int, B: int, L: int, H: int, d: int, xstride: int, mstride: int, scale_f: float,
                  cutoff2: float):
    """The forward's launch plan (kernel, grid, scalar tail) for one shape, built once: the tensor-core
    ``attention_flash.cu`` with ``FA_WRITE_LSE=1`` where :func:`~protgpu.attention.flash.fused_kernel` takes
    it, else ``flash_bwd_fwd_*``. Its pointers: q, k, v, coords, gamma, mask, out, lse."""
    mma = fused_kernel(prec, d) == "mma"
    key = ("fwd", dev, prec, B, L, H, d, xstride, mstride, scale_f, cutoff2, mma,
           tuple(sorted(BWD_OVERRIDES.items())))

    def build():
        from .. import _cuda

        st = np.float64 if prec == "float64" else np.float32
        tail = (np.int32(L), np.int32(H), np.int32(xstride), np.int32(mstride), st(scale_f), st(cutoff2))
        if mma:
            cfg = dict(flash_config(d), FA_WRITE_LSE=1)
            entry, arch_specific = flash_entry(prec, cfg, cutoff2, lse=True)
            h = _cuda.get_kernel("attention_flash", entry, cfg, arch_specific=arch_specific)
            rows = flash_block_m(cfg)
            return _cuda.build_plan(h, ((L + rows - 1) // rows, H, B), (32 * int(cfg["FA_WARPS"]),), tail)
        h = _cuda.get_kernel("attention_flash_bwd", f"flash_bwd_fwd_{_SUFFIX[prec]}", bwd_config(prec, d))
        return _cuda.build_plan(h, ((L + _FWD_WARPS - 1) // _FWD_WARPS, H, B), (32 * _FWD_WARPS,), tail)

    return _plan(key, build)


def _backward_plans(prec: str, dev: int, B: int, L: int, H: int, d: int, xstride: int, mstride: int, scale_f: float,
                    cutoff2: float, ndc: int) -> list:
    """The backward's launch plans for one shape, built once: ``flash_bwd_delta_*`` (pointers out, dout,
    delta, dq_acc, dcoords, dgamma), the backward proper of :func:`bwd_variant` (q, k, v, coords, gamma,
    mask, dout, lse, delta, dq_acc, dk, dv, dcoords, dgamma) and, for 16-bit inputs, ``flash_bwd_dq_*``
    (dq_acc, dq). ``ndc``: the number of coordinate values (dcoords' size)."""
    cfg = bwd_config(prec, d, cutoff=cutoff2 >= 0)
    key = ("bwd", dev, prec, B, L, H, d, xstride, mstride, scale_f, cutoff2, tuple(sorted(cfg.items())))

    def build():
        from .. import _cuda

        sfx = _SUFFIX[prec]
        rows, n = B * L * H, B * L * H * d
        st = np.float64 if prec == "float64" else np.float32
        hd = _cuda.get_kernel("attention_flash_bwd", f"flash_bwd_delta_{sfx}", cfg)
        variant = bwd_variant(cfg)
        prefix = {"simt": "", "mma": "mma_", "wg": "wg_"}[variant]
        if variant == "wg" and cutoff2 >= 0:
            prefix = "wg_cut_"  # (the wgmma kernel with the cutoff's test: a kernel of its own, for registers)
        hb = _cuda.get_kernel("attention_flash_bwd", f"flash_bwd_{prefix}{sfx}", cfg, arch_specific=variant == "wg")
        bn, threads, smem = bwd_block(cfg, variant)  # (build_plan opts in to smem above 48 KB)
        plans = [
            _cuda.build_plan(hd, (_elementwise_grid(32 * rows),), (_ELEMENTWISE_THREADS,),  # (a warp a row)
                             (np.int64(ndc), np.int32(L), np.int32(H), np.int64(rows))),
            _cuda.build_plan(hb, ((L + bn - 1) // bn, H, B), (threads,),
                             (np.int32(L), np.int32(H), np.int32(xstride), np.int32(mstride), st(scale_f),
                              st(cutoff2)), shared_mem=smem),
        ]
        if prec in ("bfloat16", "float16"):
            hq = _cuda.get_kernel("attention_flash_bwd", f"flash_bwd_dq_{sfx}", cfg)
            plans.append(_cuda.build_plan(hq, (_elementwise_grid(n),), (_ELEMENTWISE_THREADS,), (np.int64(n),)))
        return plans

    return _plan(key, build)


def flash_forward_lse(q, k, v, coords, gamma, cutoff, mask, scale) -> tuple[Any, Any]:
    """The attention's output and log-sum-exp on the GPU.

    Parameters
    ----------
    q, k, v : torch CUDA tensor or CuPy array, shape (B, L, H, d)
        bfloat16, float16, float32 or float64, all alike (:func:`supports`).
    coords : same library, shape (B, L, 3) or (L, 3)
        Angstrom; used in float32 (float64 for float64 inputs).
    gamma : float, sequence, or array of shape (H,) on the host or the device
    cutoff : float or None
    mask : bool array of shape (B, L) or (L,), or None
        False marks padding keys.
    scale : float or None
        None: 1 / sqrt(d).

    Returns
    -------
    out : same library and dtype as q, shape (B, L, H, d)
    lse : shape (B, H, L), float32 (float64 for float64 inputs)
        ``log(sum_j exp(logit_ij))``, -inf for a row with no key.
    """
    prec, (B, L, H, d) = _check(q, k, v)
    lib = _Lib(q)
    ar = _arith(prec)
    scale_f, cutoff2 = _scalars(d, cutoff, scale)
    x, xstride = _coords(lib, coords, B, L, ar)
    m, mstride = _mask(lib, mask, B, L)
    g = lib.gamma(gamma, H, ar)
    ops = [lib.ready(a, align=16) for a in (q, k, v)]  # cp.async reads 16-byte chunks
    out = lib.empty((B, L, H, d), ops[0].dtype)
    lse = lib.empty((B, H, L), lib.dtype(ar))
    dev = lib.device_id
    plan = _forward_plan(prec, dev, B, L, H, d, xstride, mstride, scale_f, cutoff2)
    plan.launch(lib.stream, dev, *(lib.ptr(a) for a in ops), lib.ptr(x), _gptr(lib, g), lib.ptr(m), lib.ptr(out),
                lib.ptr(lse))
    return out, lse


def flash_backward(q, k, v, coords, gamma, cutoff, mask, scale, out, lse, dout) -> tuple:
    """Gradients of the attention with respect to q, k, v, coords and gamma on the GPU.

    Parameters
    ----------
    q, k, v, coords, gamma, cutoff, mask, scale
        As :func:`flash_forward_lse`.
    out, lse
        :func:`flash_forward_lse`'s results for these inputs.
    dout : same library and shape as q
        The gradient of the loss with respect to ``out`` (any strides; converted to q's dtype).

    Returns
    -------
    dq, dk, dv : same library and dtype as q, shape (B, L, H, d)
    dcoords : float32 (float64 for float64 inputs), the shape of ``coords``
        For shared (L, 3) coordinates, the sum over the batch.
    dgamma : float32 (float64 for float64 inputs), shape (H,)
    """
    prec, (B, L, H, d) = _check(q, k, v)
    lib = _Lib(q)
    ar = _arith(prec)
    adt = lib.dtype(ar)
    scale_f, cutoff2 = _scalars(d, cutoff, scale)
    x, xstride = _coords(lib, coords, B, L, ar)
    m, mstride = _mask(lib, mask, B, L)
    g = lib.gamma(gamma, H, ar)
    qc, kc, vc = (lib.ready(a, align=16) for a in (q, k, v))  # (cp.async reads 16-byte chunks)
    oc, doc = lib.ready(out, qc.dtype), lib.ready(dout, qc.dtype, align=16)
    lc = lib.ready(lse, adt)
    plans = _backward_plans(prec, lib.device_id, B, L, H, d, xstride, mstride, scale_f, cutoff2, int(np.prod(x.shape)))
    return _launch_backward(lib, plans, qc, kc, vc, x, _gptr(lib, g), m, oc, doc, lc, adt)


def _launch_backward(lib: _Lib, plans: list, q, k, v, x, gptr: int, m, out, dout, lse, adt) -> tuple:
    """Allocate the gradients and launch :func:`_backward_plans`' kernels on ready operands (contiguous, of
    the plans' dtypes, q, k, v and dout 16-byte aligned); ``gptr``: gamma's device address."""
    shape = tuple(q.shape)
    B, L, H, _ = shape
    dq_acc = lib.empty(shape, adt)  # float32 / float64: the result itself (zeroed by the delta kernel)
    dk, dv = lib.empty(shape, q.dtype), lib.empty(shape, q.dtype)
    dcoords = lib.empty(tuple(x.shape), adt)  # (zeroed by the delta kernel, as dgamma)
    dgamma = lib.empty((H,), adt)
    delta = lib.empty((B, H, L), adt)
    s, dev, ptr = lib.stream, lib.device_id, lib.ptr
    plans[0].launch(s, dev, ptr(out), ptr(dout), ptr(delta), ptr(dq_acc), ptr(dcoords), ptr(dgamma))
    plans[1].launch(s, dev, ptr(q), ptr(k), ptr(v), ptr(x), gptr, ptr(m), ptr(dout), ptr(lse), ptr(delta), ptr(dq_acc),
                    ptr(dk), ptr(dv), ptr(dcoords), ptr(dgamma))
    if len(plans) > 2:  # 16-bit: dQ from its float32 accumulator
        dq = lib.empty(shape, q.dtype)
        plans[2].launch(s, dev, ptr(dq_acc), ptr(dq))
    else:
        dq = dq_acc
    return dq, dk, dv, dcoords, dgamma


class TorchCall:
    """:func:`flash_forward_lse` and :func:`flash_backward` for one signature of torch CUDA inputs (shapes,
    dtypes and device of q, k, v, coords, gamma and mask; cutoff, scale, ``BWD_OVERRIDES``), with what
    follows from the signature settled once, at construction: the checks of :func:`supports`, the batch
    strides of coords and mask, the launch plans. The autograd op keeps one per signature
    (:mod:`protgpu.attention.autograd`), so that a training step's host work is its allocations and
    launches.

    A call checks only what may differ within a signature: that q, k, v (and dout) are contiguous and
    16-byte aligned, coords, gamma and mask contiguous; operands that are not go to the general functions
    (which copy them). Coordinates and gamma must be in the arithmetic dtype (float32; float64 for
    float64 q), the mask boolean, all on q's device: the caller's signature guarantees it.

    Parameters
    ----------
    q : torch CUDA tensor, shape (B, L, H, d)
        An example of the signature's q (:func:`supports` must take it).
    coords : shape (B, L, 3) or (L, 3)
    mask : bool, shape (B, L) or (L,), or None
    cutoff, scale : as :func:`flash_forward_lse`
    """

    __slots__ = ("adt", "bwd", "cutoff", "fwd", "lse_shape", "scale")

    def __init__(self, q, coords, mask, cutoff, scale):
        prec, (B, L, H, d) = _check(q, q, q)
        self.cutoff, self.scale = cutoff, scale
        self.adt = _Lib(q).dtype(_arith(prec))
        self.lse_shape = (B, H, L)
        scale_f, cutoff2 = _scalars(d, cutoff, scale)
        xstride = _coords_stride(tuple(coords.shape), B, L)
        mstride = 0 if mask is None else _mask_stride(tuple(mask.shape), B, L)
        dev = q.device.index
        self.fwd = _forward_plan(prec, dev, B, L, H, d, xstride, mstride, scale_f, cutoff2)
        ndc = int(np.prod(coords.shape))
        self.bwd = _backward_plans(prec, dev, B, L, H, d, xstride, mstride, scale_f, cutoff2, ndc)

    @staticmethod
    def _ready(q, k, v, x, g, m) -> bool:
        return (q.is_contiguous() and k.is_contiguous() and v.is_contiguous() and x.is_contiguous()
                and g.is_contiguous() and (m is None or m.is_contiguous())
                and not (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15)

    def forward(self, q, k, v, x, g, m) -> tuple:
        """As :func:`flash_forward_lse` (gamma a device tensor)."""
        if not self._ready(q, k, v, x, g, m):
            return flash_forward_lse(q, k, v, x, g, self.cutoff, m, self.scale)
        lib = _Lib(q)
        out = lib.empty(tuple(q.shape), q.dtype)
        lse = lib.empty(self.lse_shape, self.adt)
        self.fwd.launch(lib.stream, lib.device_id, q.data_ptr(), k.data_ptr(), v.data_ptr(), x.data_ptr(), g.data_ptr(),
                        0 if m is None else m.data_ptr(), out.data_ptr(), lse.data_ptr())
        return out, lse

    def backward(self, q, k, v, x, g, m, out, lse, dout) -> tuple:
        """As :func:`flash_backward` (out and lse this object's forward's)."""
        if not (self._ready(q, k, v, x, g, m) and dout.dtype is q.dtype and dout.is_contiguous()
                and not dout.data_ptr() & 15):
            return flash_backward(q, k, v, x, g, self.cutoff, m, self.scale, out, lse, dout)
        return _launch_backward(_Lib(q), self.bwd, q, k, v, x, g.data_ptr(), m, out, dout, lse, self.adt)
