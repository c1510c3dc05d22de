"""Prebuilt cubins on the GPU: the driver loads a prebuilt module and the loader runs it without NVRTC; a
cubin the driver refuses falls back to NVRTC (run on the GPU machine)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from protgpu._cuda import loader, prebuilt

pytestmark = pytest.mark.gpu
LDDT_DEFINES = {"LDDT_WARPS": 8}


@pytest.fixture
def fresh(tmp_path, monkeypatch, gpu):
    """A prebuilt folder of its own, and a loader that has loaded nothing yet."""
    folder = tmp_path / "_prebuilt"
    folder.mkdir(mode=0o755)
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: folder)
    monkeypatch.delenv(prebuilt.DISABLE_ENV, raising=False)
    monkeypatch.setattr(loader, "_modules", {})
    monkeypatch.setattr(loader, "_handles", {})
    prebuilt._reset()
    yield folder
    prebuilt._reset()


def test_prebuilt_module_loads_and_runs_without_nvrtc(fresh, monkeypatch, datasets):
    import protgpu as pg

    arch = loader.device_arch()
    prebuilt.build(fresh, todo=[("lddt", LDDT_DEFINES, arch)], log=lambda *a: None)
    cpu = pg.lddt(pg.load(datasets / "adk_closed.pdb"), pg.load(datasets / "adk_open.pdb"), device="cpu")

    nvrtc = loader.compile_cubin

    def no_nvrtc(name, *a, **k):
        assert name != "lddt", "NVRTC was asked for a module the prebuilt cubins have"
        return nvrtc(name, *a, **k)

    monkeypatch.setattr(loader, "compile_cubin", no_nvrtc)
    gpu = pg.lddt(pg.load(datasets / "adk_closed.pdb"), pg.load(datasets / "adk_open.pdb"), device="gpu")
    assert prebuilt.status()["hits"] >= 1
    np.testing.assert_allclose(np.asarray(gpu), np.asarray(cpu), rtol=0, atol=1e-12)


def test_a_cubin_the_driver_refuses_falls_back_to_nvrtc(fresh):
    arch = loader.device_arch()
    key = prebuilt.prebuilt_key("lddt", arch, LDDT_DEFINES)
    junk = b"\x7fELF not a cubin at all" * 8
    (fresh / arch).mkdir()
    (fresh / arch / f"{key}.cubin").write_bytes(junk)
    (fresh / prebuilt.INDEX).write_text(json.dumps({"schema": 1, "entries": {key: {
        "kernel": "lddt", "arch": arch, "sha256": hashlib.sha256(junk).hexdigest()}}}))
    handle = loader.get_kernel("lddt", "lddt_pairs_f32", LDDT_DEFINES)
    assert handle.kernel is not None
    (rejected,) = prebuilt.status()["rejected"]
    assert rejected[:2] == ("lddt", arch) and "driver cannot load it" in rejected[2]
