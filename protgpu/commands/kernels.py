"""``protgpu kernels --check``: compile every kernel entry point with NVRTC (no GPU needed)."""

from __future__ import annotations

import importlib.util
import sys

from ..errors import KernelCompileError
from ._cli_text import add_parser


def register(sub, common) -> None:
    p = add_parser(
        sub, "kernels", help="list the CUDA kernels, or compile them all (--check)",
        description="Without --check, a table of every kernel entry point and its parameters. With --check, "
                    "compile every kernel with NVRTC for each --arch (no GPU needed) and fail on any error.",
        example=[("protgpu kernels", "the entry points of every kernel file"),
                 ("protgpu kernels --check", "compile everything for sm_80 and sm_90"),
                 ("protgpu kernels --check --arch sm_90", "one target only")])
    p.add_argument("--check", action="store_true", help="compile every kernel for each --arch; fail on any error")
    p.add_argument("--arch", default="sm_80,sm_90", help="comma-separated targets for --check (default: sm_80,sm_90)")
    p.set_defaults(func=run)


def run(args) -> int:
    from .._cuda import loader

    if importlib.util.find_spec("cuda.core") is None:
        raise KernelCompileError("cuda-core is not installed: pip install 'protgpu[cuda]'")
    if not args.check:
        print("kernel\tentry_point")
        for name in loader.kernel_files():
            for entry, params in loader.entry_points(name).items():
                sig = ", ".join(f"{p.ctype}{'*' if p.pointer else ''} {p.name}" for p in params)
                print(f"{name}.cu\t{entry}({sig})")
        return 0
    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    for a in archs:
        if not (a.startswith("sm_") and a[3:].isdigit()):
            raise KernelCompileError(f"--arch: {a!r} is not of the form sm_XY")
    major, minor = loader.nvrtc_version()
    print(f"NVRTC {major}.{minor}; kernels in {loader.kernel_dir()}")
    records = loader.check_all(tuple(archs))
    for r in records:
        print(f"  ok  {r['kernel']}.cu  {r['arch']}  {r['entries']} entry points  {r['bytes']} bytes  "
              f"{r['seconds'] * 1e3:.0f} ms")
    print(f"{len(records)} compilations, all entry points present", file=sys.stderr)
    return 0
