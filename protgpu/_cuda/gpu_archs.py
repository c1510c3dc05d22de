"""The compute capabilities of the GPUs this machine has, from the driver alone (ctypes, no CUDA package).

Self-contained on purpose: the wheel's build hook (``hatch_build.py``) loads this file by path to decide,
before any build dependency is installed, whether a source build compiles cubins (only for the GPUs
present), so it imports nothing but the standard library.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_MAJOR, _MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR


def visible_gpu_archs() -> tuple[str, ...]:
    """Target names (``sm_90``, ...) of the visible NVIDIA GPUs, each once, in device order; empty
    without a driver or a GPU (never raises)."""
    for name in ("libcuda.so.1", ctypes.util.find_library("cuda"), "nvcuda.dll"):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            return _archs(lib)
        except (AttributeError, OSError):
            return ()
    return ()


def _archs(lib) -> tuple[str, ...]:
    if lib.cuInit(0) != 0:
        return ()
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return ()
    found: list[str] = []
    for ordinal in range(count.value):
        dev, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
        if (lib.cuDeviceGet(ctypes.byref(dev), ordinal) != 0
                or lib.cuDeviceGetAttribute(ctypes.byref(major), _MAJOR, dev) != 0
                or lib.cuDeviceGetAttribute(ctypes.byref(minor), _MINOR, dev) != 0):
            continue
        arch = f"sm_{major.value}{minor.value}"
        if arch not in found:
            found.append(arch)
    return tuple(found)
