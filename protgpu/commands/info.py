"""``protgpu info``: versions, the GPU, the kernel cache, and kernel compile/load times."""

from __future__ import annotations

import importlib.metadata as md
import platform

from ._cli_text import add_parser


def register(sub, common) -> None:
    p = add_parser(
        sub, "info", help="show versions, the GPU, the kernel cache and kernel compile times",
        description="Versions of protgpu and its dependencies, the GPU found (or why none is usable), the "
                    "kernel cache folder and, on a GPU, each kernel's cold and warm compile/load time.",
        example=[("protgpu info", "everything, timing the kernel compiles on a GPU"),
                 ("protgpu info --no-compile", "without the compile timings (quick)")])
    p.add_argument("--no-compile", action="store_true", help="skip timing the kernel compiles")
    p.set_defaults(func=run)


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "not installed"


def run(args) -> int:
    from .. import __version__
    from .._array import gpu_available, gpu_unavailable_reason

    print(f"protgpu        {__version__}")
    print(f"python         {platform.python_version()} ({platform.platform()})")
    for dist in ("numpy", "gemmi", "mdtraj", "biopython", "cuda-core", "cuda-bindings", "nvidia-cuda-nvrtc",
                 "nvmath-python", "cupy-cuda13x", "torch", "dask"):
        print(f"{dist:<14} {_version(dist)}")
    try:
        from .._cuda.cache import default_cache_dir

        print(f"kernel cache   {default_cache_dir()}")
    except ImportError:
        print("kernel cache   (cuda-core not installed)")
    else:
        _print_prebuilt(None)
    if not gpu_available():
        print(f"GPU            none usable: {gpu_unavailable_reason()}")
        print("device         cpu (NumPy paths)")
        return 0
    import cupy

    from .._cuda import loader

    dev = cupy.cuda.runtime.getDevice()
    props = cupy.cuda.runtime.getDeviceProperties(dev)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    free, total = cupy.cuda.runtime.memGetInfo()
    print(f"GPU            {name} ({loader.device_arch()}), {total / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
    print(f"NVRTC          {'.'.join(map(str, loader.nvrtc_version()))}")
    _print_prebuilt(loader.device_arch())
    if not args.no_compile:
        print("kernels        cold compile+load / warm (disk cache) load / prebuilt load")
        for r in loader.compile_timings():
            pre = "-" if r["prebuilt_ms"] is None else f"{r['prebuilt_ms']:.1f} ms"
            print(f"  {r['kernel']:<14} {r['cold_ms']:8.1f} ms / {r['warm_ms']:6.1f} ms / {pre}")
    return 0


def _print_prebuilt(arch: str | None) -> None:
    """The wheel's prebuilt cubins: found or why not, and with a GPU (``arch``) how many of the default
    kernel modules they serve there."""
    from .._cuda import prebuilt

    st = prebuilt.status(arch)
    if not st["found"]:
        if arch is None:
            print(f"prebuilt       none: {st['reason']}")
        return
    if arch is None:
        print(f"prebuilt       {st['cubins']} cubins for {', '.join(st['archs'])} (NVRTC {st['nvrtc']}) "
              f"in {st['folder']}")
        return
    used = "used on this GPU" if st["matching"] else "none match this GPU: kernels are compiled with NVRTC"
    print(f"prebuilt use   {st['matching']}/{st['modules']} default kernel modules for {arch}: {used}")
