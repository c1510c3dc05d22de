"""The kernel layer: NVRTC-compiled CUDA C++ (``kernels/*.cu``) through cuda.core, cuBLAS matmul
through nvmath-python, and the device memory budget. Nothing here is imported by ``import protgpu``;
the GPU paths of the domain modules import it when they run."""

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

__all__ = [
    "KernelHandle",
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
