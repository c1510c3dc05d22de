"""Exceptions raised by protgpu.

Every error that reaches a user is one line that names the input (file, and line, model or frame
where known). The CLI turns :class:`ProtgpuError` into that line on stderr and exit code 2.
"""

from __future__ import annotations


class ProtgpuError(Exception):
    """Base class of every error protgpu raises on purpose."""


class InputError(ProtgpuError, ValueError):
    """Bad input: a missing, unreadable or malformed file, a wrong shape, NaN coordinates, an empty
    selection. The message names the input."""


class GPUUnavailableError(ProtgpuError, RuntimeError):
    """``device="gpu"`` was asked for but no usable GPU (driver, device, CuPy, cuda.core) is present."""


class KernelCompileError(ProtgpuError, RuntimeError):
    """NVRTC failed to compile a kernel, or produced no code."""


class MemoryBudgetError(ProtgpuError, MemoryError):
    """A result cannot fit in host memory (or the given ``out=`` is too small); raised before any
    allocation, with the size in the message."""
