"""The built wheel carries the kernels and their prebuilt cubins, and ``protgpu`` runs from the installed
wheel, not the checkout. The wheel is built for sm_90 only (and so sm_90a): this build is the one place
in the suite that compiles every kernel module (CI's ``protgpu kernels --check`` adds sm_80)."""

from __future__ import annotations

import hashlib
import json
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
    env = os.environ | {"PROTGPU_WHEEL_ARCHS": "sm_90"}
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(REPO)],
                       capture_output=True, text=True, env=env)
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


def test_wheel_ships_a_prebuilt_cubin_of_every_default_module(wheel):
    pytest.importorskip("cuda.core")  # without NVRTC the hook builds the wheel without cubins
    from protgpu._cuda import loader, prebuilt

    zf = zipfile.ZipFile(wheel)
    index = json.loads(zf.read("protgpu/_prebuilt/index.json"))
    assert index["archs"] == ["sm_90", "sm_90a"]
    entries = index["entries"]
    want = {prebuilt.prebuilt_key(n, a, d): (n, a) for n, d, a in prebuilt.tasks(["sm_90"])}
    assert {k: (e["kernel"], e["arch"]) for k, e in entries.items()} == want
    assert {n for n, _a in want.values()} == set(loader.kernel_files())
    # the wgmma forward and its log-sum-exp variant (training) are the only arch-specific modules
    assert [e["arch"] for e in entries.values() if e["kernel"] == "attention_flash"].count("sm_90a") == 2
    for key, e in entries.items():
        code = zf.read(f"protgpu/_prebuilt/{e['arch']}/{key}.cubin")
        assert hashlib.sha256(code).hexdigest() == e["sha256"]
        assert e["entries"] and all(name.encode() in code for name in e["entries"])
    cubins = [n for n in zf.namelist() if n.endswith(".cubin")]
    assert len(cubins) == len(entries)


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
    # The installed package finds its own prebuilt cubin for the README's main job (its sources and headers,
    # inlined into the key, are the ones the cubins were built from), and only for the exact defines.
    code = ("import sys; from protgpu._cuda import prebuilt as p; c = p.lookup('contacts', 'sm_90'); "
            "print(p.prebuilt_dir()); print(len(c or b'')); "
            "print(p.lookup('contacts', 'sm_90', {'RPT': 3}) is None, p.lookup('contacts', 'sm_80') is None)")
    r = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    pdir, nbytes, other_defines, other_arch = r.stdout.split()
    assert pdir.startswith(str(target)) and int(nbytes) > 0
    assert other_defines == other_arch == "True"
    r = subprocess.run([str(exe), "info", "--no-compile"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "cubins for sm_90, sm_90a (NVRTC" in r.stdout and str(target) in r.stdout, r.stdout
