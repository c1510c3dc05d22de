"""cuBLAS matrix products through nvmath-python, with plans reused for repeated shapes.

``matmul(a, b)`` multiplies CuPy arrays (2-D, or batched 3-D with equal batch sizes) in float32 or
float64 on the caller's current CuPy stream. Planning a cuBLASLt matmul (heuristics, workspace) costs
far more than running a small one, so a stateful :class:`nvmath.linalg.advanced.Matmul` is kept per
(shapes, strides, dtype, stream) and only its operands are swapped on later calls. Each device has its own
cache and lock: the threads that drive several GPUs at once (one per device) neither evict each
other's plans nor wait on each other while planning or enqueueing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

_MAX_PLANS = 32  # per device: more than the GEMM shapes of one streamed all-vs-all run (about 20)
_caches: dict[int, tuple[OrderedDict, threading.Lock]] = {}
_caches_lock = threading.Lock()
SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _key(a, b, stream) -> tuple:
    return (a.shape, a.strides, b.shape, b.strides, a.dtype.str, stream.ptr)


def _device_cache(device_id: int) -> tuple[OrderedDict, threading.Lock]:
    """The plan cache (least recently used first) of one device, and the lock that guards it."""
    with _caches_lock:
        entry = _caches.get(device_id)
        if entry is None:
            entry = _caches[device_id] = (OrderedDict(), threading.Lock())
        return entry


def matmul(a, b):
    """``a @ b`` by cuBLAS on CuPy's current stream.

    Parameters
    ----------
    a : cupy.ndarray, shape (M, K) or (B, M, K)
    b : cupy.ndarray, shape (K, N) or (B, K, N)
        Same dtype as ``a``: float32 or float64. Transposed views are fine (no copy is made).

    Returns
    -------
    cupy.ndarray, shape (M, N) or (B, M, N), dtype of the inputs.
    """
    import cupy
    from nvmath.linalg.advanced import Matmul

    if a.dtype != b.dtype or a.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"matmul needs two float32 or two float64 arrays, got {a.dtype} and {b.dtype}")
    if a.ndim != b.ndim or a.ndim not in (2, 3) or a.shape[-1] != b.shape[-2] or a.shape[:-2] != b.shape[:-2]:
        raise ValueError(f"matmul shapes do not agree: {a.shape} @ {b.shape}")
    stream = cupy.cuda.get_current_stream()
    key = _key(a, b, stream)
    plans, lock = _device_cache(a.device.id)
    with lock:
        mm = plans.pop(key, None)
        if mm is None:
            mm = Matmul(a, b, stream=stream)
            mm.plan(stream=stream)
        else:
            mm.reset_operands(a=a, b=b, stream=stream)
        plans[key] = mm
        while len(plans) > _MAX_PLANS:
            plans.popitem(last=False)[1].free()
        out = mm.execute(stream=stream)
        # Drop the references to the operands so that their memory can be freed by the caller.
        mm.release_operands()
    return out


def clear_plans() -> None:
    """Free every cached plan (and its workspace), on every device."""
    with _caches_lock:
        caches = list(_caches.values())
    for plans, lock in caches:
        with lock:
            while plans:
                plans.popitem()[1].free()
