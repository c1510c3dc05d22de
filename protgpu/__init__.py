"""protgpu: GPU toolkit for protein structures and MD trajectories.

Distance matrices, contact maps, RMSD and superposition, structure scores, computed with CUDA kernels
compiled at run time by NVRTC (cuda.core) and cuBLAS (nvmath-python) when a GPU is usable, and with
NumPy otherwise. Functions return the array type they were given. Importing this package imports no
GPU library.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._array import gpu_available
from .distances import distances
from .errors import GPUUnavailableError, InputError, KernelCompileError, MemoryBudgetError, ProtgpuError
from .io import load
from .structure import Structure

__all__ = [
    "GPUUnavailableError",
    "InputError",
    "KernelCompileError",
    "MemoryBudgetError",
    "ProtgpuError",
    "Structure",
    "__version__",
    "distances",
    "gpu_available",
    "load",
]
