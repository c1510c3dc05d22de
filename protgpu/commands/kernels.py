"""``protgpu kernels``: list the kernel entry points, compile them all with NVRTC (``--check``, no GPU
needed), or fill the kernel cache ahead of time (``--build``)."""

from __future__ import annotations

import importlib.util
import re
import sys

from ..errors import KernelCompileError
from ._cli_text import add_parser

_ARCH = re.compile(r"sm_[0-9]+a?")


def register(sub, common) -> None:
    p = add_parser(
        sub, "kernels", help="list the CUDA kernels, compile them all (--check), or fill the cache (--build)",
        description="Without options, a table of every kernel entry point and its parameters. With --check, "
                    "compile every kernel with NVRTC for each --arch (no GPU needed) and fail on any error. With "
                    "--build, compile the kernel modules protgpu loads by default into the kernel cache for this "
                    "GPU (or each --arch), so that a first run compiles nothing; modules the installed wheel "
                    "ships prebuilt for that arch are skipped.",
        example=[("protgpu kernels --check", "compile everything for sm_80 and sm_90"),
                 ("protgpu kernels --build", "fill the kernel cache for this GPU"),
                 ("protgpu kernels --build --arch sm_89,sm_120", "fill it for other GPUs (no GPU needed)")])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compile every kernel for each --arch; fail on any error")
    mode.add_argument("--build", action="store_true",
                      help="compile the default kernel modules into the kernel cache for this GPU or each --arch")
    p.add_argument("--arch", default=None,
                   help="comma-separated targets (sm_XY or sm_XYa); --check's default: sm_80,sm_90; "
                        "--build's: this GPU's")
    p.set_defaults(func=run)


def _archs(text: str) -> list[str]:
    archs = [a.strip() for a in text.split(",") if a.strip()]
    for a in archs:
        if not _ARCH.fullmatch(a):
            raise KernelCompileError(f"--arch: {a!r} is not of the form sm_XY")
    return archs


def run(args) -> int:
    from .._cuda import loader

    if importlib.util.find_spec("cuda.core") is None:
        raise KernelCompileError("cuda-core is not installed: pip install 'protgpu[cuda]'")
    if args.build:
        return _build(args, loader)
    if not args.check:
        print("kernel\tentry_point")
        for name in loader.kernel_files():
            for entry, params in loader.entry_points(name).items():
                sig = ", ".join(f"{p.ctype}{'*' if p.pointer else ''} {p.name}" for p in params)
                print(f"{name}.cu\t{entry}({sig})")
        return 0
    archs = _archs(args.arch or "sm_80,sm_90")
    major, minor = loader.nvrtc_version()
    print(f"NVRTC {major}.{minor}; kernels in {loader.kernel_dir()}")
    records = loader.check_all(tuple(archs))
    for r in records:
        print(f"  ok  {r['kernel']}.cu  {r['arch']}  {r['entries']} entry points  {r['bytes']} bytes  "
              f"{r['seconds'] * 1e3:.0f} ms")
    print(f"{len(records)} compilations, all entry points present", file=sys.stderr)
    return 0


def _build(args, loader) -> int:
    from .._cuda import prebuilt

    if args.arch:
        archs = _archs(args.arch)
    else:
        from .._array import gpu_available, gpu_unavailable_reason

        if not gpu_available():
            raise KernelCompileError(f"--build: no usable GPU ({gpu_unavailable_reason()}); give --arch sm_XY")
        archs = [loader.device_arch()]
    cache = loader.program_cache()
    if cache.refused:
        raise KernelCompileError(f"--build: the kernel cache {cache.path} is not used: {cache.refused}")
    todo, served = [], 0
    for name, defines, arch in prebuilt.tasks(archs):
        if prebuilt.lookup(name, arch, defines) is not None:
            served += 1
        else:
            todo.append((name, defines, arch))
    major, minor = loader.nvrtc_version()
    print(f"NVRTC {major}.{minor}; kernel cache {cache.path}; {served} modules served by the prebuilt cubins",
          file=sys.stderr)
    for (name, defines, arch), seconds in zip(todo, prebuilt.run_parallel(prebuilt.cache_one, todo), strict=True):
        knobs = " ".join(f"{k}={v}" for k, v in sorted(defines.items()))
        print(f"  ok  {name}.cu  {arch}  {seconds * 1e3:.0f} ms  {knobs}")
    print(f"{len(todo)} kernel modules in the cache for {', '.join(archs)}", file=sys.stderr)
    return 0
