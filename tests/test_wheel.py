"""The built wheel carries the kernels, and ``protgpu`` runs from the installed wheel, not the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
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
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    exe = env_dir / "bin" / "protgpu"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PROTGPU_DISABLE_GPU": "1"}
    code = "import protgpu, protgpu._cuda.loader as l; print(protgpu.__file__); print(l.kernel_dir())"
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    pkg_file, kdir = r.stdout.split()
    assert str(REPO) not in pkg_file and kdir.startswith(str(env_dir))
    r = subprocess.run([str(exe), "distances", str(REPO / "datasets" / "adk_open.pdb"), "-s", "ca"],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "(1, 214, 214)" in r.stdout
    try:
        import cuda.core  # noqa: F401
    except ImportError:
        return
    r = subprocess.run([str(exe), "kernels", "--check", "--arch", "sm_90"], capture_output=True, text=True,
                       cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert str(env_dir) in r.stdout  # the kernels came from the installed package
