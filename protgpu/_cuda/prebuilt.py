"""Prebuilt cubins: the kernels compiled when the wheel is built, so that a first run needs no NVRTC.

The wheel's build hook (``hatch_build.py``) runs :func:`build`: every kernel module the library loads
with its default settings (:func:`default_configs`) is compiled by NVRTC, in parallel processes, for the
architectures :func:`archs_from_env` names (all of :data:`DEFAULT_ARCHS` for a release wheel) into
``protgpu/_prebuilt/``:
``<arch>/<key>.cubin`` plus ``index.json``, which records each cubin's SHA-256 and the NVRTC that made it.

At run time :func:`lookup` serves a cubin only when its key, :func:`prebuilt_key`, matches: a SHA-256 over
the exact text NVRTC would compile (defines, the ``.cu`` file and its inlined headers), the NVRTC options
and the arch. Any change to a kernel, a header, a define or an option is a miss, and the loader compiles
with NVRTC as before. The compiler's own version is recorded but not keyed: a cubin is a finished binary
for its arch whichever NVRTC the user has installed, and one the driver cannot load falls back to NVRTC
(:func:`note_unloadable`).

Trust: cubins are read only from the installed package's own ``_prebuilt`` folder (no setting points
elsewhere), and only when that folder and its index are owned by the user or root and not writable by
others (the kernel cache's rule, :func:`~protgpu._cuda.cache.unsafe_folder_reason`); a cubin whose
SHA-256 differs from the index's is not used. ``PROTGPU_NO_PREBUILT=1`` turns prebuilt cubins off.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

from ..errors import KernelCompileError

DEFAULT_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_120")
# Head dimensions of the usual protein models (16 to 128 per head) that get attention modules.
HEAD_DIMS = (16, 32, 64, 128)
ARCHS_ENV = "PROTGPU_WHEEL_ARCHS"
DISABLE_ENV = "PROTGPU_NO_PREBUILT"
INDEX = "index.json"
_SCHEMA = 1
_ARCH = re.compile(r"sm_[0-9]{2,3}a?")
# Exit status of ``python -m protgpu._cuda.prebuilt`` when NVRTC is missing (the build hook then ships no
# cubins instead of failing).
NO_NVRTC = 3


def prebuilt_dir() -> Path:
    """``protgpu/_prebuilt`` of this installed package: the only place prebuilt cubins are read from."""
    return Path(__file__).resolve().parent.parent / "_prebuilt"


def valid_arch(arch: str) -> bool:
    """Whether ``arch`` is a target name such as ``sm_90`` or ``sm_90a``."""
    return bool(_ARCH.fullmatch(arch))


def _arch_order(arch: str) -> tuple:
    """Sort key of target names: by number (sm_80 before sm_100), then the plain target first."""
    return (int(arch[3:].rstrip("a")), arch.endswith("a")) if valid_arch(arch) else (1 << 30, arch)


# --------------------------------------------------------------------------------------------------
# What is prebuilt


def default_configs() -> list[tuple[str, dict, bool]]:
    """``(kernel, defines, arch_specific)`` of every kernel module the library loads with its default
    settings: the define sets come from the modules that launch the kernels, so the two cannot drift.
    ``arch_specific`` modules (Hopper's wgmma attention) are built for ``sm_90a`` only."""
    from ..align import gpu as tmalign_gpu
    from ..attention import flash, flash_backward
    from ..distances import _ROWS_PER_BLOCK
    from ..scoring.gdt_windows import _WARPS as GW_WARPS
    from ..scoring.lddt import _WARPS as LDDT_WARPS  # (the package's names lddt and tm_score are functions)
    from ..scoring.tmscore import _TM_EVAL_STORAGE, _TM_WARPS
    from ..superpose.kernels import qcp_defines

    out = [
        ("distances", {}, False),
        ("distances", {"ROWS_PER_BLOCK": _ROWS_PER_BLOCK}, False),
        ("contacts", {}, False),
        ("qcp", dict(qcp_defines()), False),
        ("qcp_backward", {}, False),  # rmsd / superpose gradients (superpose/differentiable.py)
        ("tmscore", {"TM_WARPS": _TM_WARPS, "TM_EVAL_STORAGE": _TM_EVAL_STORAGE}, False),
        ("lddt", {"LDDT_WARPS": LDDT_WARPS}, False),
        ("gdt_windows", {"GW_WARPS": GW_WARPS}, False),  # OpenStructure's GDT (score_complex)
        ("consensus", {}, False),
        ("attention", {}, False),  # bias_softmax_*
    ]
    out += [("tmalign", tmalign_gpu.defines(t, m), False) for t, m in tmalign_gpu.launch_configs()]
    out += [("attention", {"HEAD_DIM": d}, False) for d in HEAD_DIMS]  # flash_simt_*
    saved = dict(flash.FLASH_OVERRIDES)
    flash.FLASH_OVERRIDES.clear()  # the defaults, whatever a benchmark in this process set
    try:
        for d in HEAD_DIMS:
            cfg = flash.flash_config(d)
            out.append(("attention_flash", cfg, False))
            if cfg["FA_WGMMA"]:
                out.append(("attention_flash", cfg, True))
            # training in 16 bits: the forward that keeps the log-sum-exp, and the backward
            lse = dict(cfg, FA_WRITE_LSE=1)
            out.append(("attention_flash", lse, False))
            if cfg["FA_WGMMA"]:
                out.append(("attention_flash", lse, True))
            for p in ("bfloat16", "float16"):
                for cut in (False, True):  # (the wgmma backward's block size follows the cutoff)
                    bwd = flash_backward.bwd_config(p, d, cutoff=cut)
                    if cut and bwd == flash_backward.bwd_config(p, d):
                        continue
                    out.append(("attention_flash_bwd", bwd, False))
                    if bwd["BW_MMA"] == 2:  # the wgmma backward (flash_bwd_wg_*): sm_90a
                        out.append(("attention_flash_bwd", bwd, True))
    finally:
        flash.FLASH_OVERRIDES.update(saved)
    return out


def tasks(archs) -> list[tuple[str, dict, str]]:
    """``(kernel, defines, arch)`` to compile for ``archs``: the ordinary modules for each plain arch, and
    the arch-specific ones for ``sm_90a`` when ``sm_90`` or ``sm_90a`` is asked (only compute capability
    9.0 devices take them, :func:`protgpu.attention.flash.flash_entry`)."""
    out, configs = [], default_configs()
    for arch in archs:
        for name, defines, specific in configs:
            if specific and arch in ("sm_90", "sm_90a"):
                task = (name, defines, "sm_90a")
            elif not specific and not arch.endswith("a"):
                task = (name, defines, arch)
            else:
                continue
            if task not in out:
                out.append(task)
    return out


def prebuilt_key(name: str, arch: str, defines: dict | None = None) -> str:
    """The hex key of a kernel module: SHA-256 over the text NVRTC compiles (``#define`` lines, the source
    with its headers inlined), the NVRTC options and the arch."""
    from .loader import PROGRAM_OPTIONS, build_source

    h = hashlib.sha256(f"protgpu-prebuilt-{_SCHEMA}\0cubin\0{arch}\0".encode())
    h.update(json.dumps(PROGRAM_OPTIONS, sort_keys=True).encode() + b"\0")
    h.update(build_source(name, defines).encode())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------
# Run time


class _State:
    lock = threading.Lock()
    index: dict | None = None
    loaded = False
    reason: str | None = None  # why prebuilt cubins are not used at all
    hits: list = []
    misses: list = []
    rejected: list = []  # (kernel, arch, why): a tampered file, or one the driver refused


def _reset() -> None:
    """Forget the loaded index and the counts (tests; a new process starts this way)."""
    with _State.lock:
        _State.index, _State.loaded, _State.reason = None, False, None
        _State.hits, _State.misses, _State.rejected = [], [], []


def _load_index() -> dict | None:
    """The index of this package's prebuilt cubins, or None (with ``_State.reason``) when there is none,
    it is turned off, or its folder is not safe."""
    if _State.loaded:
        return _State.index
    from .cache import unsafe_folder_reason

    folder = prebuilt_dir()
    index, reason = None, None
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        reason = f"turned off by {DISABLE_ENV}"
    elif not (folder / INDEX).is_file():
        reason = "this install has none (a source checkout, or a wheel built without NVRTC)"
    else:
        why = (unsafe_folder_reason(folder, allow_root=True)
               or unsafe_folder_reason(folder / INDEX, allow_root=True, kind="file"))
        if why:
            reason = f"not using {folder}: {why}"
            print(f"protgpu: {reason}; kernels are compiled with NVRTC", file=sys.stderr)
        else:
            try:
                index = json.loads((folder / INDEX).read_text())
                if index.get("schema") != _SCHEMA or not isinstance(index.get("entries"), dict):
                    index, reason = None, f"{folder / INDEX} is of another format"
            except (OSError, ValueError) as exc:
                reason = f"{folder / INDEX} cannot be read ({exc})"
    _State.index, _State.reason, _State.loaded = index, reason, True
    return index


def lookup(name: str, arch: str, defines: dict | None = None) -> bytes | None:
    """The prebuilt cubin of ``kernels/<name>.cu`` with ``defines`` for ``arch``, or None: none matches
    the key exactly, prebuilt cubins are off or untrusted, or the file differs from its recorded SHA-256."""
    with _State.lock:
        index = _load_index()
        if index is None or not valid_arch(arch):
            return None
        key = prebuilt_key(name, arch, defines)
        rec = index["entries"].get(key)
        if not isinstance(rec, dict) or rec.get("arch") != arch or rec.get("kernel") != name:
            _State.misses.append((name, arch))
            return None
        # The path comes from the key and the checked arch, never from the index's text.
        path = prebuilt_dir() / arch / f"{key}.cubin"
        try:
            code = path.read_bytes()
        except OSError:
            code = b""
        if not code or hashlib.sha256(code).hexdigest() != rec.get("sha256"):
            _State.rejected.append((name, arch, f"{path.name} is missing or differs from the index"))
            return None
        _State.hits.append((name, arch))
        return code


def note_unloadable(name: str, arch: str, exc: BaseException) -> None:
    """Record a prebuilt cubin the driver refused (the loader then compiles it with NVRTC)."""
    with _State.lock:
        _State.rejected.append((name, arch, f"the driver cannot load it ({type(exc).__name__}: {exc})"))


def status(arch: str | None = None) -> dict:
    """What :command:`protgpu info` reports: whether prebuilt cubins were found, for which archs, how
    many of the default modules match the current sources for ``arch``, and what this process used."""
    with _State.lock:
        index = _load_index()
        out = {"folder": str(prebuilt_dir()), "found": index is not None, "reason": _State.reason,
               "hits": len(_State.hits), "misses": len(_State.misses), "rejected": list(_State.rejected)}
    if index is None:
        return out
    entries = index["entries"].values()
    out |= {"archs": sorted({str(e.get("arch")) for e in entries}, key=_arch_order), "cubins": len(index["entries"]),
            "nvrtc": index.get("nvrtc"), "built": index.get("built")}
    if arch:
        want = tasks([arch])
        out["arch"] = arch
        out["matching"] = sum(prebuilt_key(n, a, d) in index["entries"] for n, d, a in want)
        out["modules"] = len(want)
    return out


# --------------------------------------------------------------------------------------------------
# Build time


def _compile_one(task: tuple[str, dict, str]) -> tuple[str, bytes, list, float]:
    """Compile one module in a worker process; returns ``(key, cubin, entry points, seconds)``."""
    from .loader import compile_cubin, entry_points

    name, defines, arch = task
    t0 = time.perf_counter()
    code = bytes(compile_cubin(name, arch, defines, cache=False).code)
    # A define may leave an entry point out (attention.cu has no float64 kernel beyond HEAD_DIM 64), but a
    # module without any would be a broken source.
    present = [e for e in entry_points(name) if e.encode() in code]
    if not present:
        raise KernelCompileError(f"{name}.cu ({arch}, {defines}): no entry point in the cubin")
    return prebuilt_key(name, arch, defines), code, present, time.perf_counter() - t0


def cache_one(task: tuple[str, dict, str]) -> float:
    """Compile one module into the kernel cache in a worker process (``protgpu kernels --build``); returns
    the seconds it took (a module already cached is a quick hit)."""
    from .loader import compile_cubin

    name, defines, arch = task
    t0 = time.perf_counter()
    compile_cubin(name, arch, defines)
    return time.perf_counter() - t0


def run_parallel(fn, items: list, jobs: int | None = None) -> list:
    """``[fn(x) for x in items]`` in ``jobs`` worker processes (default: the CPU count); NVRTC holds the
    GIL-free part of the work but one compile uses one core, so processes, not threads."""
    from concurrent.futures import ProcessPoolExecutor

    jobs = max(1, min(jobs or os.cpu_count() or 1, len(items) or 1))
    if jobs == 1:
        return [fn(x) for x in items]
    import multiprocessing

    # spawn: the workers start clean (no inherited CUDA state or locks) whatever the parent imported.
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
        return list(ex.map(fn, items))


def build(out: Path, archs=DEFAULT_ARCHS, jobs: int | None = None, log=print, todo: list | None = None) -> dict:
    """Compile every default module for ``archs`` (or the ``(kernel, defines, arch)`` of ``todo``) into
    ``out`` (``<arch>/<key>.cubin`` and ``index.json``) and return the index.

    Raises
    ------
    KernelCompileError
        When a kernel fails to compile or lacks an entry point.
    """
    from .loader import nvrtc_version

    bad = [a for a in archs if not valid_arch(a)]
    if bad:
        raise KernelCompileError(f"{ARCHS_ENV}: {bad} are not targets of the form sm_XY or sm_XYa")
    todo = tasks(archs) if todo is None else todo
    archs = sorted({arch for _n, _d, arch in todo}, key=_arch_order)
    t0 = time.perf_counter()
    results = run_parallel(_compile_one, todo, jobs)
    entries = {}
    for (name, defines, arch), (key, code, present, seconds) in zip(todo, results, strict=True):
        (out / arch).mkdir(parents=True, exist_ok=True)
        (out / arch / f"{key}.cubin").write_bytes(code)
        entries[key] = {"kernel": name, "arch": arch, "defines": {k: str(v) for k, v in sorted(defines.items())},
                        "entries": present, "sha256": hashlib.sha256(code).hexdigest(), "bytes": len(code),
                        "seconds": round(seconds, 2)}
    index = {"schema": _SCHEMA, "nvrtc": ".".join(map(str, nvrtc_version())), "archs": list(archs),
             "built": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "entries": entries}
    (out / INDEX).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    log(f"protgpu: {len(entries)} prebuilt cubins for {', '.join(archs)} in {time.perf_counter() - t0:.0f} s "
        f"(NVRTC {index['nvrtc']})")
    return index


def archs_from_env(default=None) -> tuple[str, ...]:
    """The archs a wheel build compiles for, from ``$PROTGPU_WHEEL_ARCHS``.

    ``all``: :data:`DEFAULT_ARCHS` (what a release wheel ships); a comma-separated list: those;
    ``none`` or empty: no cubins; unset or ``auto``: the archs of the GPUs this machine has (none
    without one), so that ``pip install .`` on a laptop compiles nothing and on a GPU machine only for
    its GPU. ``default`` replaces the probe of ``auto`` (tests).
    """
    env = os.environ.get(ARCHS_ENV, "auto").strip().lower()
    if env in ("", "none"):
        return ()
    if env == "all":
        return tuple(DEFAULT_ARCHS)
    if env == "auto":
        if default is not None:
            return tuple(default)
        from .gpu_archs import visible_gpu_archs

        return visible_gpu_archs()
    return tuple(a.strip() for a in env.split(",") if a.strip())


def main(argv=None) -> int:
    """``python -m protgpu._cuda.prebuilt OUT``: what the wheel's build hook runs. Exit status
    :data:`NO_NVRTC` when NVRTC is not installed."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m protgpu._cuda.prebuilt")
    p.add_argument("out", type=Path)
    p.add_argument("--jobs", type=int, default=None)
    args = p.parse_args(argv)
    try:
        from .loader import nvrtc_version

        nvrtc_version()
    except Exception as exc:  # ImportError without cuda-core; a loader error without libnvrtc
        print(f"protgpu: NVRTC is not usable here ({type(exc).__name__}: {exc})", file=sys.stderr)
        return NO_NVRTC
    try:
        build(args.out, archs_from_env(), args.jobs)
    except KernelCompileError as exc:
        print(f"protgpu: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
