"""Wheel build hook: compile the kernels to cubins with NVRTC and ship them as ``protgpu/_prebuilt``.

Runs ``python -m protgpu._cuda.prebuilt`` from the source tree in a subprocess (compiles in parallel
processes; no GPU needed) for ``$PROTGPU_WHEEL_ARCHS`` (comma-separated; default: the common
architectures, :data:`protgpu._cuda.prebuilt.DEFAULT_ARCHS`; ``none`` for no cubins). Without NVRTC the
wheel is built without cubins and the hook says so; a kernel that fails to compile fails the build.
Editable installs get no cubins (their kernels are the checkout's, compiled as they change).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

NO_NVRTC = 3  # protgpu._cuda.prebuilt.NO_NVRTC (the package is not importable here)


class CustomBuildHook(BuildHookInterface):
    """Adds ``protgpu/_prebuilt/`` (cubins and ``index.json``) to the wheel."""

    def initialize(self, version, build_data):
        self._tmp = None
        if self.target_name != "wheel" or version == "editable":
            return
        if os.environ.get("PROTGPU_WHEEL_ARCHS", "x").strip().lower() in ("", "none"):
            self.app.display_info("protgpu: PROTGPU_WHEEL_ARCHS is empty: the wheel ships no prebuilt cubins")
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
