"""The one place that decides NumPy vs CuPy (vs torch through DLPack) and converts results back.

A public function calls :func:`dispatch` on its first line::

    be = dispatch(x, device=device)       # which array library came in, where the work runs
    x = be.asarray(x, np.float32)         # NumPy on the CPU path, CuPy on the GPU path
    ...
    return be.wrap(result)                # NumPy in -> NumPy out, CuPy in -> CuPy out, torch -> torch

Detection never imports CuPy or torch: an array can only be a CuPy array if ``cupy`` is already in
``sys.modules`` (the array-api-compat trick). Whether a GPU is usable is decided once per process by
:func:`gpu_available`, which checks for the driver library before touching CUDA so that a machine
without a driver answers at once instead of hanging or printing a traceback.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import GPUUnavailableError, InputError

DEVICES = ("auto", "cpu", "gpu")


def is_cupy_array(x: Any) -> bool:
    """True if ``x`` is a CuPy ndarray (without importing CuPy)."""
    cp = sys.modules.get("cupy")
    return cp is not None and isinstance(x, cp.ndarray)


def is_torch_tensor(x: Any) -> bool:
    """True if ``x`` is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def array_kind(x: Any) -> str:
    """Name the array library of ``x``: ``"numpy"``, ``"cupy"``, ``"torch-cpu"`` or ``"torch-cuda"``.

    Anything that is not a CuPy array or a torch tensor (lists, scalars, NumPy arrays) is ``"numpy"``.
    """
    if is_cupy_array(x):
        return "cupy"
    if is_torch_tensor(x):
        return "torch-cuda" if x.is_cuda else "torch-cpu"
    return "numpy"


def get_namespace(*arrays: Any):
    """The array module (``numpy`` or ``cupy``) that the given arrays live in.

    Helpers take the result as their ``xp`` argument rather than detecting again.
    """
    for a in arrays:
        if is_cupy_array(a):
            return sys.modules["cupy"]
    return np


# --------------------------------------------------------------------------------------------------
# Is a GPU usable?


_gpu_reason: str | None = None


def _driver_present() -> bool:
    # Loading libcuda by name is what every CUDA library does first; when it is missing, CuPy's and
    # cuda.core's own checks raise from deep inside their import machinery. Checking it here keeps the
    # answer quick and the message short.
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """Whether the GPU path can run: a driver, at least one device, CuPy and cuda.core importable.

    Decided once per process. ``PROTGPU_DISABLE_GPU=1`` forces ``False``. The reason a GPU is not
    usable is kept for error messages (:func:`gpu_unavailable_reason`).
    """
    global _gpu_reason
    if os.environ.get("PROTGPU_DISABLE_GPU", "") not in ("", "0"):
        _gpu_reason = "PROTGPU_DISABLE_GPU is set"
        return False
    if not _driver_present():
        _gpu_reason = "no NVIDIA driver (libcuda) found"
        return False
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except ImportError:
        _gpu_reason = "CuPy is not installed (pip install 'protgpu[cuda]')"
        return False
    except Exception as exc:  # CUDA runtime errors (no device, driver too old) vary by version
        _gpu_reason = f"CUDA runtime error: {exc}"
        return False
    if n < 1:
        _gpu_reason = "no CUDA device visible"
        return False
    if importlib.util.find_spec("cuda.core") is None:  # looked up, not imported: protgpu._cuda uses it
        _gpu_reason = "cuda-core is not installed (pip install 'protgpu[cuda]')"
        return False
    _gpu_reason = None
    return True


def gpu_unavailable_reason() -> str | None:
    """Why :func:`gpu_available` said no, or ``None`` if a GPU is usable."""
    gpu_available()
    return _gpu_reason


def resolve_device(device: str, kind: str = "numpy") -> str:
    """Turn ``device="auto"|"cpu"|"gpu"`` and an input kind into ``"cpu"`` or ``"gpu"``.

    ``"auto"`` follows the data: CuPy and CUDA tensors run on the GPU; NumPy and CPU tensors run on
    the GPU when one is usable, else on the CPU. ``"gpu"`` without a usable GPU is an error.
    """
    if device not in DEVICES:
        raise InputError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
    if device == "cpu":
        return "cpu"
    if device == "gpu":
        if not gpu_available():
            raise GPUUnavailableError(f"device='gpu' asked for, but no GPU is usable: {_gpu_reason}")
        return "gpu"
    if kind in ("cupy", "torch-cuda"):
        return "gpu"
    return "gpu" if gpu_available() else "cpu"


# --------------------------------------------------------------------------------------------------
# Conversion in and out


@dataclass(frozen=True)
class Backend:
    """Where a call's work runs and what array type its results go back as.

    Attributes
    ----------
    kind : str
        Input array library: ``"numpy"``, ``"cupy"``, ``"torch-cpu"`` or ``"torch-cuda"``.
    device : str
        ``"cpu"`` (work in NumPy) or ``"gpu"`` (work in CuPy and the CUDA kernels).
    """

    kind: str
    device: str

    @property
    def xp(self):
        """The array module the work runs in: ``numpy`` or ``cupy``."""
        if self.device == "gpu":
            import cupy

            return cupy
        return np

    @property
    def on_gpu(self) -> bool:
        return self.device == "gpu"

    def asarray(self, x: Any, dtype: Any = None):
        """Convert ``x`` (NumPy, CuPy, torch, or a nested list) to the work device's array type.

        Torch tensors cross through DLPack without a copy where the device already matches.
        """
        if is_torch_tensor(x):
            x = x.detach()
            if x.is_cuda:
                import cupy

                x = cupy.from_dlpack(x)
            else:
                x = np.from_dlpack(x.contiguous())
        if self.device == "gpu":
            import cupy

            return cupy.asarray(x, dtype=dtype)
        if is_cupy_array(x):
            x = x.get()
        return np.asarray(x, dtype=dtype)

    def wrap(self, result: Any):
        """Convert a result (or a tuple/list/dict of results) back to the input's array type.

        NumPy in gives NumPy out even when the work ran on the GPU.
        """
        if isinstance(result, tuple) and hasattr(result, "_fields"):  # named tuples keep their type
            return type(result)(*(self.wrap(r) for r in result))
        if isinstance(result, (tuple, list)):
            return type(result)(self.wrap(r) for r in result)
        if isinstance(result, dict):
            return {k: self.wrap(v) for k, v in result.items()}
        if not (isinstance(result, np.ndarray) or is_cupy_array(result)):
            return result
        if self.kind == "numpy":
            return to_numpy(result)
        if self.kind == "cupy":
            import cupy

            return cupy.asarray(result)
        import torch

        if self.kind == "torch-cuda":
            import cupy

            return torch.from_dlpack(cupy.ascontiguousarray(cupy.asarray(result)))
        return torch.from_numpy(np.ascontiguousarray(to_numpy(result)))


def to_numpy(x: Any) -> np.ndarray:
    """Copy ``x`` to the host as a NumPy array (no copy if it already is one)."""
    if is_cupy_array(x):
        return x.get()
    if is_torch_tensor(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def dispatch(*inputs: Any, device: str = "auto") -> Backend:
    """Decide, from the inputs and ``device``, where the work runs and how results go back.

    The first input that is a CuPy array or torch tensor sets the output kind; otherwise it is NumPy.

    Parameters
    ----------
    *inputs
        The call's array arguments (``None`` is ignored).
    device : {"auto", "cpu", "gpu"}
        Where to run; see :func:`resolve_device`.

    Returns
    -------
    Backend
    """
    kind = "numpy"
    for x in inputs:
        if x is None:
            continue
        k = array_kind(x)
        if k != "numpy":
            kind = k
            break
    return Backend(kind=kind, device=resolve_device(device, kind))
