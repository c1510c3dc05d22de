"""``import protgpu`` and a NumPy call load no GPU library (DESIGN convention 10)."""

from __future__ import annotations

import subprocess
import sys

GPU_MODULES = ("cupy", "cuda", "cuda.core", "cuda.bindings", "nvmath", "torch")


def test_import_and_numpy_call_load_no_gpu_library():
    code = (
        "import sys, numpy as np, protgpu as pg\n"
        "d = pg.distances(np.zeros((4, 3), np.float32), device='cpu')\n"
        "assert d.shape == (4, 4)\n"
        f"print([m for m in {GPU_MODULES!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_import_is_light():
    code = "import sys, protgpu; print(sorted(m for m in ('mdtraj', 'Bio', 'matplotlib', 'scipy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
