"""Wheel build hook: compile the kernels to cubins with NVRTC and ship them as ``protgpu/_prebuilt``.

Runs ``python -m protgpu._cuda.prebuilt`` from the source tree in a subprocess (compiles in parallel
processes; no GPU needed) for ``$PROTGPU_WHEEL_ARCHS``: ``all`` (the common architectures, what a
release wheel ships), a comma-separated list, ``none``, or unset/``auto``: the archs of the GPUs this
machine has, so that ``pip install .`` compiles nothing on a machine without a GPU and only its own
arch on one with a GPU. Only when there is something to compile are NVRTC and the runtime dependencies
build requirements (:meth:`CustomBuildHook.dependencies`). Without NVRTC the wheel is built without
cubins and the hook says so; a kernel that fails to compile fails the build. Editable installs get no
cubins (their kernels are the checkout's, compiled as they change).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

NO_NVRTC = 3  # protgpu._cuda.prebuilt.NO_NVRTC (the package is not importable here)
_NVRTC_DEPS = [
    "cuda-core>=1.2; sys_platform == 'linux' or sys_platform == 'win32'",
    "cuda-bindings>=13; sys_platform == 'linux' or sys_platform == 'win32'",
    "nvidia-cuda-nvrtc>=13; sys_platform == 'linux' or sys_platform == 'win32'",
]


def _wanted(root: str) -> bool:
    """Whether this build compiles any cubin (``$PROTGPU_WHEEL_ARCHS``; ``auto`` probes the GPUs with
    the standard library only: nothing is installed yet when build requirements are decided)."""
    env = os.environ.get("PROTGPU_WHEEL_ARCHS", "auto").strip().lower()
    if env in ("", "none"):
        return False
    if env != "auto":
        return True
    spec = spec_from_file_location("_protgpu_gpu_archs", Path(root) / "protgpu" / "_cuda" / "gpu_archs.py")
    mod = module_from_spec(spec)
    spec.loader.exec_module(mod)
    return bool(mod.visible_gpu_archs())


class CustomBuildHook(BuildHookInterface):
    """Adds ``protgpu/_prebuilt/`` (cubins and ``index.json``) to the wheel."""

    def dependencies(self):
        """NVRTC and the runtime dependencies (the hook imports protgpu), only when cubins are built."""
        if self.target_name != "wheel" or not _wanted(self.root):
            return []
        return [*_NVRTC_DEPS, *self.metadata.core.dependencies]

    def initialize(self, version, build_data):
        self._tmp = None
        if self.target_name != "wheel" or version == "editable":
            return
        if not _wanted(self.root):
            self.app.display_info("protgpu: the wheel ships no prebuilt cubins (PROTGPU_WHEEL_ARCHS is none, or "
                                  "unset on a machine without a GPU; PROTGPU_WHEEL_ARCHS=all builds them for the "
                                  "common GPUs)")
            return
        self._tmp = tempfile.mkdtemp(prefix="protgpu-prebuilt-")
        out = Path(self._tmp) / "_prebuilt"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([self.root, *filter(None, [env.get("PYTHONPATH")])])
        r = subprocess.run([sys.executable, "-m", "protgpu._cuda.prebuilt", str(out)], cwd=self.root, env=env)
        if r.returncode == NO_NVRTC:
            self.app.display_warning("protgpu: NVRTC is not installed: the wheel ships no prebuilt cubins "
                                     "(kernels are compiled on first use)")
            return
        if r.returncode != 0:
            raise RuntimeError(f"protgpu: compiling the prebuilt cubins failed (exit status {r.returncode})")
        build_data["force_include"][str(out)] = "protgpu/_prebuilt"

    def finalize(self, version, build_data, artifact_path):
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
