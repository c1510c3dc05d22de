"""Load ``kernels/*.cu``, compile them with NVRTC (cuda.core) to cubin, cache on disk, launch.

A kernel source is a ``.cu`` file with plain ``extern "C" __global__`` entry points, one per dtype.
The loader prepends compile-time knobs as ``#define`` lines and inlines every ``#include "<name>.cuh"`` of
a header in ``kernels/`` as text (recursively, each header once), so the cache key (which covers the
source text, the options with the arch, and the NVRTC version) covers the headers too. Compiled modules
are memoised per (device, file, defines); launches go on CuPy's current stream, with every argument
checked against the entry point's C signature, parsed from the source.

Compiling needs only NVRTC, not a GPU: :func:`compile_cubin` with an explicit ``arch`` works on a
machine without a driver, which is how CI checks every kernel (``protgpu kernels --check``).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from ..errors import KernelCompileError
from .plans import launch_config
from .streams import cupy_stream, current_device

COMMON_HEADER = "common.cuh"
# A quoted include of a .cuh header on a line of its own (a trailing // comment allowed). NVRTC from the
# wheels has no include path to resolve it, so build_source inlines the header's text.
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"\n]*\.cuh)"[ \t\r]*(?://[^\n]*)?$', re.MULTILINE)
_ENTRY = re.compile(r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(\w+)\s*\(([^)]*)\)')

# C parameter types the entry points may use, and the NumPy dtype each stands for.
_C_TYPES = {
    "float": np.float32,
    "double": np.float64,
    "int": np.int32,
    "int32_t": np.int32,
    "unsigned": np.uint32,
    "unsigned int": np.uint32,
    "uint32_t": np.uint32,
    "long long": np.int64,
    "int64_t": np.int64,
    "unsigned long long": np.uint64,
    "uint64_t": np.uint64,
    "unsigned char": np.uint8,
    "uint8_t": np.uint8,
    "char": np.int8,
    "signed char": np.int8,
    "int8_t": np.int8,
    "bool": np.bool_,
    "__half": np.float16,
    "half": np.float16,
    "__nv_bfloat16": None,  # no NumPy dtype: any 2-byte array is accepted
    "void": None,
}


def kernel_dir() -> Path:
    """The folder holding the ``.cu`` sources: ``protgpu/kernels`` in an installed wheel, else the
    repository's top-level ``kernels/``."""
    here = Path(__file__).resolve().parent.parent
    for cand in (here / "kernels", here.parent / "kernels"):
        if (cand / COMMON_HEADER).is_file():
            return cand
    raise KernelCompileError(f"kernel sources not found next to {here} (looked for kernels/{COMMON_HEADER})")


def kernel_files() -> list[str]:
    """Names (stems) of every kernel source, e.g. ``["distances", ...]``."""
    return sorted(p.stem for p in kernel_dir().glob("*.cu"))


@cache
def _read(path: str) -> str:
    return Path(path).read_text()


def read_source(name: str) -> str:
    """The raw text of ``kernels/<name>.cu``."""
    path = kernel_dir() / f"{name}.cu"
    if not path.is_file():
        raise KernelCompileError(f"no kernel source {path.name} in {path.parent} (have: {kernel_files()})")
    return _read(str(path))


def _inline_headers(text: str, chain: tuple[str, ...], done: set[str]) -> str:
    """``text`` with each ``#include "<name>.cuh"`` replaced by that header of ``kernel_dir()``, itself
    inlined the same way. ``chain`` is the include path down to ``text`` (the ``.cu`` first); ``done``
    holds the headers already inlined into this source: a repeated include becomes a comment (each
    header's text appears once, as ``#pragma once`` would have it)."""

    def one(m: re.Match) -> str:
        header = m.group(1)
        where = f"{' -> '.join(chain)}: #include \"{header}\""
        if "/" in header or "\\" in header:
            raise KernelCompileError(f"{where}: headers are inlined from {kernel_dir()} itself; give a bare name")
        if header in chain:
            raise KernelCompileError(f"{where}: include cycle {' -> '.join([*chain[chain.index(header):], header])}")
        if header in done:
            return f"// ---- {header} (inlined above)"
        path = kernel_dir() / header
        if not path.is_file():
            raise KernelCompileError(f"{where}: no such header in {path.parent}")
        done.add(header)
        body = _inline_headers(_read(str(path)), (*chain, header), done)
        return f"// ---- {header}\n{body}\n// ---- end of {header}"

    return _INCLUDE.sub(one, text)


def build_source(name: str, defines: dict | None = None) -> str:
    """The text NVRTC compiles: ``#define`` lines, then the source with its ``.cuh`` headers inlined
    (recursively, each once).

    Raises
    ------
    KernelCompileError
        When the source includes a header that ``kernels/`` lacks, or the includes form a cycle.
    """
    body = _inline_headers(read_source(name), (f"{name}.cu",), set())
    lines = [f"#define {k} {v}" for k, v in sorted((defines or {}).items())]
    return "\n".join([*lines, f"// ---- {name}.cu", body])


@dataclass(frozen=True)
class Param:
    """One parameter of a kernel entry point."""

    name: str
    ctype: str
    pointer: bool
    dtype: object  # NumPy dtype class, or None for void* / types without a NumPy twin


def _parse_param(text: str) -> Param:
    t = re.sub(r"\b(const|__restrict__|restrict|volatile)\b", " ", text)
    pointer = "*" in t
    t = t.replace("*", " ")
    words = t.split()
    if len(words) < 2:
        raise KernelCompileError(f"cannot parse kernel parameter {text.strip()!r}")
    name, ctype = words[-1], " ".join(words[:-1])
    if ctype not in _C_TYPES:
        raise KernelCompileError(f"kernel parameter {text.strip()!r}: unsupported C type {ctype!r}")
    return Param(name=name, ctype=ctype, pointer=pointer, dtype=_C_TYPES[ctype])


@cache
def entry_points(name: str) -> dict[str, tuple[Param, ...]]:
    """Every ``extern "C" __global__`` entry point of ``kernels/<name>.cu`` with its parameters."""
    out = {}
    for m in _ENTRY.finditer(read_source(name)):
        params = tuple(_parse_param(p) for p in m.group(2).split(",") if p.strip())
        out[m.group(1)] = params
    if not out:
        raise KernelCompileError(f"{name}.cu declares no extern \"C\" __global__ entry point")
    return out


# The NVRTC options besides the arch: one table, read by the compiler call and by the prebuilt cubins' key.
PROGRAM_OPTIONS = {"std": "c++17", "name": "protgpu", "fma": True}


def _program_options(arch: str):
    from cuda.core import ProgramOptions

    return ProgramOptions(arch=arch, **PROGRAM_OPTIONS)


def nvrtc_version() -> tuple[int, int]:
    """The NVRTC version that compiles the kernels."""
    from cuda.bindings import nvrtc

    _err, major, minor = nvrtc.nvrtcVersion()
    return int(major), int(minor)


_cache_lock = threading.Lock()
_cache_obj = None


def program_cache():
    """The process's :class:`ChecksummedProgramCache` (created on first use)."""
    global _cache_obj
    with _cache_lock:
        if _cache_obj is None:
            from .cache import ChecksummedProgramCache

            _cache_obj = ChecksummedProgramCache()
        return _cache_obj


def compile_cubin(name: str, arch: str, defines: dict | None = None, *, cache=True):
    """Compile ``kernels/<name>.cu`` for ``arch`` (e.g. ``"sm_90"``) to a cubin :class:`ObjectCode`.

    Parameters
    ----------
    name : str
        Kernel source stem.
    arch : str
        ``"sm_XY"``. Needs no GPU.
    defines : dict, optional
        Compile-time knobs, prepended as ``#define KEY VALUE``.
    cache : bool or ProgramCacheResource
        ``True`` uses the disk cache, ``False`` compiles fresh, or a cache object to use.

    Raises
    ------
    KernelCompileError
        With NVRTC's log, when compilation fails or yields an empty binary.
    """
    from cuda.core import Program

    src = build_source(name, defines)
    prog = Program(src, code_type="c++", options=_program_options(arch))
    if cache is True:
        cache = program_cache()
    elif cache is False:
        cache = None
    try:
        # (an empty cache is falsy: it has __len__, so compare with None)
        obj = prog.compile("cubin", cache=cache) if cache is not None else prog.compile("cubin")
    except Exception as exc:  # NVRTC reports errors as a generic exception carrying the log
        raise KernelCompileError(f"NVRTC failed on {name}.cu for {arch}: {exc}") from exc
    if not bytes(obj.code):
        raise KernelCompileError(f"NVRTC produced an empty cubin for {name}.cu ({arch})")
    return obj


def check_all(archs=("sm_80", "sm_90")) -> list[dict]:
    """Compile every kernel source for every arch (no cache, no GPU needed) and check that each entry
    point is in the binary; sources with code for an arch-specific target (``__CUDA_ARCH_FEAT_SM90_ALL``)
    are compiled for ``sm_90a`` as well. Returns one record per (file, arch); raises on the first
    failure."""
    records = []
    for name in kernel_files():
        entries = entry_points(name)
        extra = ("sm_90a",) if "__CUDA_ARCH_FEAT_SM90_ALL" in build_source(name) else ()  # headers too
        for arch in (*archs, *extra):
            t0 = time.perf_counter()
            obj = compile_cubin(name, arch, cache=False)
            code = bytes(obj.code)
            missing = [e for e in entries if e.encode() not in code]
            if missing:
                raise KernelCompileError(f"{name}.cu ({arch}): entry points missing from the cubin: {missing}")
            records.append(
                {"kernel": name, "arch": arch, "entries": len(entries), "bytes": len(code),
                 "seconds": time.perf_counter() - t0}
            )
    return records


# --------------------------------------------------------------------------------------------------
# On the GPU


def device_arch(dev=None) -> str:
    """``"sm_XY"`` of the current device."""
    dev = dev or current_device()
    cc = dev.compute_capability
    return f"sm_{cc.major}{cc.minor}"


@dataclass(frozen=True)
class KernelHandle:
    """A loaded entry point plus its parsed signature."""

    kernel: object
    name: str
    params: tuple[Param, ...]


_modules: dict = {}
_modules_lock = threading.Lock()


_handles: dict = {}


def arch_specific_target(arch: str) -> str:
    """The arch-specific target of ``arch`` (``"sm_90"`` -> ``"sm_90a"``): its binaries may use the
    instructions of exactly that architecture (Hopper's wgmma) and run only on it."""
    return arch if arch.endswith("a") else arch + "a"


def get_kernel(name: str, entry: str, defines: dict | None = None, *, arch_specific: bool = False) -> KernelHandle:
    """The entry point ``entry`` of ``kernels/<name>.cu``, compiled for the current device (memoised);
    ``arch_specific=True`` compiles for its arch-specific target (:func:`arch_specific_target`)."""
    import cupy

    # Fast path: a handle already loaded for this device (no Device object, no context call, no
    # ObjectCode lookup), since callers ask for their kernels on every call.
    hkey = (cupy.cuda.runtime.getDevice(), name, entry, tuple(sorted((defines or {}).items())), arch_specific)
    handle = _handles.get(hkey)
    if handle is not None:
        return handle
    params = entry_points(name).get(entry)
    if params is None:
        raise KernelCompileError(f"{name}.cu has no entry point {entry!r} (has {sorted(entry_points(name))})")
    dev = current_device()
    arch = arch_specific_target(device_arch(dev)) if arch_specific else device_arch(dev)
    key = (dev.device_id, name, tuple(sorted((defines or {}).items())), arch)
    with _modules_lock:
        kernel = None
        obj = _modules.get(key)
        if obj is None:
            obj, kernel = _load_module(name, entry, arch, defines)
            _modules[key] = obj
    handle = KernelHandle(kernel=kernel or obj.get_kernel(entry), name=f"{name}.{entry}", params=params)
    _handles[hkey] = handle
    return handle


def _load_module(name: str, entry: str, arch: str, defines: dict | None):
    """``(ObjectCode, kernel of entry)``: the wheel's prebuilt cubin when one matches the source, defines
    and arch exactly (:mod:`.prebuilt`), else NVRTC's (through the disk cache). A prebuilt cubin that the
    driver cannot load (one too new for it) is set aside for NVRTC's."""
    from cuda.core import ObjectCode

    from . import prebuilt

    code = prebuilt.lookup(name, arch, defines)
    if code is not None:
        obj = ObjectCode.from_cubin(code)
        try:
            return obj, obj.get_kernel(entry)  # loads the module now, so that a failure falls back here
        except Exception as exc:  # the driver's refusal comes as a generic CUDA error
            prebuilt.note_unloadable(name, arch, exc)
    obj = compile_cubin(name, arch, defines)
    return obj, obj.get_kernel(entry)


@cache
def _dtype_info(dtype_class) -> tuple:
    """``(np.dtype, min, max)`` of a parameter's C type (bounds None for floats), built once: launches
    convert every argument, and ``np.iinfo`` is not free."""
    dt = np.dtype(dtype_class)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return dt, int(info.min), int(info.max)
    return dt, None, None


def _convert_arg(handle: KernelHandle, p: Param, value):
    if p.pointer:
        if value is None:
            return 0
        import cupy

        if not isinstance(value, cupy.ndarray):
            raise TypeError(f"{handle.name}: argument {p.name} ({p.ctype}*) needs a CuPy array, "
                            f"got {type(value).__name__}")
        if p.dtype is not None and value.dtype != _dtype_info(p.dtype)[0]:
            raise TypeError(f"{handle.name}: argument {p.name} is {p.ctype}*, array dtype is {value.dtype}")
        if p.dtype is None and p.ctype != "void" and value.dtype.itemsize != 2:
            raise TypeError(f"{handle.name}: argument {p.name} ({p.ctype}*) needs a 2-byte dtype")
        if not value.flags.c_contiguous:
            raise TypeError(f"{handle.name}: argument {p.name} must be C-contiguous")
        return value.data.ptr
    if p.dtype is None:
        raise TypeError(f"{handle.name}: cannot pass a scalar of C type {p.ctype}")
    dt, lo, hi = _dtype_info(p.dtype)
    if isinstance(value, np.generic) and value.dtype == dt:
        return value
    # Python scalars are checked for range and kind, then cast: a bare Python int would be taken by
    # the launcher as a pointer.
    if lo is not None:
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise TypeError(f"{handle.name}: argument {p.name} ({p.ctype}) needs an integer, got {value!r}")
        if not lo <= int(value) <= hi:
            raise OverflowError(f"{handle.name}: argument {p.name}={value} does not fit in {p.ctype}")
    elif dt.kind == "f" and not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{handle.name}: argument {p.name} ({p.ctype}) needs a number, got {value!r}")
    return dt.type(value)


def launch(handle: KernelHandle, grid, block, *args, shared_mem: int = 0, stream=None) -> None:
    """Launch ``handle`` on ``stream`` (default: CuPy's current stream) with type-checked arguments.

    Pointer parameters take C-contiguous CuPy arrays of the matching dtype (or ``None`` for NULL);
    scalar parameters take NumPy scalars of the C type or Python numbers that fit it.
    """
    import cupy
    from cuda.core import launch as core_launch

    if len(args) != len(handle.params):
        raise TypeError(f"{handle.name} takes {len(handle.params)} arguments, got {len(args)}")
    converted = [_convert_arg(handle, p, a) for p, a in zip(handle.params, args, strict=True)]
    s = stream if stream is not None else cupy.cuda.get_current_stream()
    cfg = launch_config(grid, block, shared_mem)
    core_launch(cupy_stream(s), cfg, handle.kernel, *converted)


def compile_timings() -> list[dict]:
    """Cold (NVRTC, no cache) and warm (from the disk cache) compile-and-load times of every kernel
    source on the current device, with its default defines, in milliseconds; ``prebuilt_ms`` is the load
    of the wheel's prebuilt cubin (None when there is none for this device)."""
    from cuda.core import ObjectCode

    from . import prebuilt

    arch = device_arch()
    defaults: dict = {}
    for name, defines, specific in prebuilt.default_configs():
        if not specific:
            defaults.setdefault(name, defines)
    out = []
    for name in kernel_files():
        defines = defaults.get(name)
        t0 = time.perf_counter()
        cold = compile_cubin(name, arch, defines, cache=False)
        entry = next(e for e in entry_points(name) if e.encode() in bytes(cold.code))
        ObjectCode.from_cubin(bytes(cold.code)).get_kernel(entry)
        t1 = time.perf_counter()
        program_cache()[_cache_key(name, arch, defines)] = cold  # so that the warm load below is a hit
        t2 = time.perf_counter()
        warm = compile_cubin(name, arch, defines)
        ObjectCode.from_cubin(bytes(warm.code)).get_kernel(entry)
        t3 = time.perf_counter()
        code = prebuilt.lookup(name, arch, defines)
        if code is not None:
            ObjectCode.from_cubin(code).get_kernel(entry)
        t4 = time.perf_counter()
        out.append({"kernel": name, "cold_ms": (t1 - t0) * 1e3, "warm_ms": (t3 - t2) * 1e3,
                    "prebuilt_ms": None if code is None else (t4 - t3) * 1e3})
    return out


def _cache_key(name: str, arch: str, defines: dict | None = None) -> bytes:
    from cuda.core.utils import make_program_cache_key

    return make_program_cache_key(
        code=build_source(name, defines), code_type="c++", options=_program_options(arch), target_type="cubin"
    )
