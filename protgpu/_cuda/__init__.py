"""The kernel layer, the only place that talks to cuda.core: NVRTC-compiled CUDA C++ (``kernels/*.cu``)
and its disk cache (``loader``, ``cache``), launches on the caller's stream (``loader.launch``), streams
and contexts (``streams``), prepared launch plans (``plans``) and cuBLAS matmul through nvmath-python
(``blas``). Nothing here is imported by ``import protgpu``; the GPU paths of the domain modules import
it when they run."""

from .loader import (
    KernelHandle,
    build_source,
    check_all,
    compile_cubin,
    entry_points,
    get_kernel,
    kernel_dir,
    kernel_files,
    launch,
    nvrtc_version,
)
from .plans import LaunchPlan, build_plan

__all__ = [
    "KernelHandle",
    "LaunchPlan",
    "build_plan",
    "build_source",
    "check_all",
    "compile_cubin",
    "entry_points",
    "get_kernel",
    "kernel_dir",
    "kernel_files",
    "launch",
    "nvrtc_version",
]
