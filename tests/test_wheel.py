"""The built wheel carries the kernels, and ``protgpu`` runs from the installed wheel, not the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    pytest.importorskip("build")
    dist = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(REPO)],
                       capture_output=True, text=True)
    if r.returncode != 0 and "hatchling" in (r.stdout + r.stderr):
        pytest.skip("hatchling is not installed for --no-isolation builds")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (whl,) = dist.glob("protgpu-*.whl")
    return whl


def test_wheel_contains_every_kernel(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    kernels = sorted(p.name for p in (REPO / "kernels").iterdir() if p.suffix in (".cu", ".cuh"))
    for k in kernels:
        assert f"protgpu/kernels/{k}" in names, k
    assert any(n.endswith("entry_points.txt") for n in names)


def test_installed_wheel_runs_outside_the_checkout(wheel, tmp_path):
    # The wheel goes into a folder of its own, put first on the path of the interpreter running the tests:
    # its dependencies are those of this environment, whether a venv or the system's (a new venv would see
    # only the base interpreter's packages, and cuda.pathfinder looks for NVRTC in site-packages only).
    target = tmp_path / "installed"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    str(wheel)], check=True)
    py, exe = sys.executable, target / "bin" / "protgpu"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PYTHONPATH": str(target), "PROTGPU_DISABLE_GPU": "1"}
    code = "import protgpu, protgpu._cuda.loader as l; print(protgpu.__file__); print(l.kernel_dir())"
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    pkg_file, kdir = r.stdout.split()
    assert pkg_file.startswith(str(target)) and kdir.startswith(str(target))
    r = subprocess.run([str(exe), "distances", str(REPO / "datasets" / "adk_open.pdb"), "-s", "ca"],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "(1, 214, 214)" in r.stdout
    try:
        import cuda.core  # noqa: F401
    except ImportError:
        return
    # A kernel of the installed package compiles with its header (one kernel, the quickest: every kernel is
    # compiled once in the suite, by tests/test_kernels.py; the wheel carries the same files, checked above).
    code = ("from protgpu._cuda import loader; obj = loader.compile_cubin('lddt', 'sm_90', cache=False); "
            "print(loader.kernel_dir()); print(len(bytes(obj.code)))")
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    kdir, nbytes = r.stdout.split()
    assert kdir.startswith(str(target)) and int(nbytes) > 0
