"""The built wheel carries the kernels, and ``protgpu`` runs from the installed wheel, not the checkout."""

from __future__ import annotations

import os
import site
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


def _venv_seeing_this_environment(env_dir: Path) -> Path:
    """A new venv at ``env_dir`` that sees the packages of the interpreter running the tests, whether that
    is the system one or a venv: ``system_site_packages`` reaches only the base interpreter's packages, so
    from a venv its site-packages are listed in a ``.pth`` file instead. Returns the new venv's python."""
    in_venv = sys.prefix != sys.base_prefix
    venv.create(env_dir, system_site_packages=not in_venv, with_pip=False)
    py = env_dir / "bin" / "python"
    if in_venv:
        inner = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip()
        (Path(inner) / "outer_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return py


def test_installed_wheel_runs_outside_the_checkout(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    py = _venv_seeing_this_environment(env_dir)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True)
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
    # A kernel of the installed package compiles with its header (one kernel, the quickest: every kernel is
    # compiled once in the suite, by tests/test_kernels.py; the wheel carries the same files, checked above).
    code = ("from protgpu._cuda import loader; obj = loader.compile_cubin('lddt', 'sm_90', cache=False); "
            "print(loader.kernel_dir()); print(len(bytes(obj.code)))")
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    kdir, nbytes = r.stdout.split()
    assert kdir.startswith(str(env_dir)) and int(nbytes) > 0
