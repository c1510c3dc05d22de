"""Prebuilt cubins without a GPU: the key, the lookup, what is refused, and the loader's choice between a
prebuilt cubin and NVRTC (the wheel's own cubins are checked in tests/test_wheel.py)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("cuda.core")

from protgpu._cuda import loader, prebuilt  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LDDT = ("lddt", {"LDDT_WARPS": 8})


@pytest.fixture
def pdir(tmp_path, monkeypatch):
    """A private prebuilt folder that the lookup reads instead of the package's, state reset around."""
    folder = tmp_path / "_prebuilt"
    folder.mkdir(mode=0o755)
    monkeypatch.setattr(prebuilt, "prebuilt_dir", lambda: folder)
    monkeypatch.delenv(prebuilt.DISABLE_ENV, raising=False)
    prebuilt._reset()
    yield folder
    prebuilt._reset()


def _plant(folder, name, defines, arch, code=b"\x7fELF fake cubin", **rec):
    key = prebuilt.prebuilt_key(name, arch, defines)
    (folder / arch).mkdir(exist_ok=True)
    (folder / arch / f"{key}.cubin").write_bytes(code)
    entry = {"kernel": name, "arch": arch, "sha256": hashlib.sha256(code).hexdigest()} | rec
    index_file = folder / prebuilt.INDEX
    index = json.loads(index_file.read_text()) if index_file.exists() else {"schema": 1, "entries": {}}
    index["entries"][key] = entry
    index_file.write_text(json.dumps(index))
    return key


def test_lookup_serves_a_cubin_only_for_the_exact_source_defines_and_arch(pdir):
    _plant(pdir, *LDDT, "sm_90")
    assert prebuilt.lookup(*LDDT[:1], "sm_90", LDDT[1]) == b"\x7fELF fake cubin"
    assert prebuilt.lookup("lddt", "sm_90", {"LDDT_WARPS": 4}) is None  # other defines: NVRTC
    assert prebuilt.lookup("lddt", "sm_90") is None  # no defines at all
    assert prebuilt.lookup("lddt", "sm_80", LDDT[1]) is None  # other arch
    assert prebuilt.lookup("lddt", "sm_90a", LDDT[1]) is None
    st = prebuilt.status("sm_90")
    assert st["found"] and st["hits"] == 1 and st["misses"] == 4 and st["archs"] == ["sm_90"]


def test_key_covers_source_headers_defines_options_and_arch(tmp_path, monkeypatch):
    k = prebuilt.prebuilt_key("lddt", "sm_90", LDDT[1])
    assert k == prebuilt.prebuilt_key("lddt", "sm_90", dict(LDDT[1]))
    assert len({k, prebuilt.prebuilt_key("lddt", "sm_80", LDDT[1]), prebuilt.prebuilt_key("lddt", "sm_90"),
                prebuilt.prebuilt_key("qcp", "sm_90", LDDT[1])}) == 4
    monkeypatch.setitem(loader.PROGRAM_OPTIONS, "fma", False)
    assert prebuilt.prebuilt_key("lddt", "sm_90", LDDT[1]) != k
    monkeypatch.undo()
    # an edited header (inlined into the source) is another key
    kdir = tmp_path / "kernels"
    kdir.mkdir()
    for f in loader.kernel_dir().iterdir():
        (kdir / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(loader, "kernel_dir", lambda: kdir)
    loader._read.cache_clear()
    try:
        assert prebuilt.prebuilt_key("lddt", "sm_90", LDDT[1]) == k
        (kdir / "common.cuh").write_text((kdir / "common.cuh").read_text() + "\n// edited\n")
        loader._read.cache_clear()
        assert prebuilt.prebuilt_key("lddt", "sm_90", LDDT[1]) != k
    finally:
        loader._read.cache_clear()


def test_tampered_or_mismatched_cubin_is_not_used(pdir):
    key = _plant(pdir, *LDDT, "sm_90")
    f = pdir / "sm_90" / f"{key}.cubin"
    f.write_bytes(b"\x7fELF planted cubin")  # same key, other bytes than the index records
    assert prebuilt.lookup("lddt", "sm_90", LDDT[1]) is None
    f.unlink()
    assert prebuilt.lookup("lddt", "sm_90", LDDT[1]) is None
    assert [r[:2] for r in prebuilt.status()["rejected"]] == [("lddt", "sm_90")] * 2
    # an index whose record names another kernel or arch for the key is not believed either
    _plant(pdir, *LDDT, "sm_80", kernel="qcp")
    assert prebuilt.lookup("lddt", "sm_80", LDDT[1]) is None


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX owner and mode bits")
def test_folder_writable_by_others_is_not_trusted(pdir, capsys):
    _plant(pdir, *LDDT, "sm_90")
    os.chmod(pdir, 0o777)
    assert prebuilt.lookup("lddt", "sm_90", LDDT[1]) is None
    assert "writable by other users" in prebuilt.status()["reason"]
    assert "writable by other users" in capsys.readouterr().err
    prebuilt._reset()
    os.chmod(pdir, 0o755)
    os.chmod(pdir / prebuilt.INDEX, 0o666)
    assert prebuilt.lookup("lddt", "sm_90", LDDT[1]) is None


def test_turned_off_by_the_environment(pdir, monkeypatch):
    _plant(pdir, *LDDT, "sm_90")
    monkeypatch.setenv(prebuilt.DISABLE_ENV, "1")
    assert prebuilt.lookup("lddt", "sm_90", LDDT[1]) is None
    assert prebuilt.DISABLE_ENV in prebuilt.status()["reason"]


def test_a_checkout_has_none():
    prebuilt._reset()
    st = prebuilt.status("sm_90")
    prebuilt._reset()
    assert not st["found"] and "this install has none" in st["reason"]


def test_build_writes_cubins_whose_keys_the_lookup_finds(pdir):
    # A real NVRTC compile of the quickest kernel: the build's key and the run time's agree.
    index = prebuilt.build(pdir, todo=[("lddt", LDDT[1], "sm_90")], log=lambda *a: None)
    assert index["archs"] == ["sm_90"] and len(index["entries"]) == 1
    code = prebuilt.lookup("lddt", "sm_90", LDDT[1])
    assert code and code == bytes(loader.compile_cubin("lddt", "sm_90", LDDT[1], cache=False).code)


# --------------------------------------------------------------------------------------------------
# What is prebuilt


def test_default_configs_cover_every_kernel_and_the_defines_the_library_uses():
    from protgpu.align import gpu as tmalign_gpu
    from protgpu.attention.flash import flash_config
    from protgpu.superpose.kernels import qcp_defines

    configs = prebuilt.default_configs()
    assert {n for n, _d, _s in configs} == set(loader.kernel_files())
    assert ("contacts", {}, False) in configs  # the README's main job
    assert ("qcp", qcp_defines(), False) in configs
    # every block size a TM-align launch may take (its default and each length bucket's), each once
    tmalign = [d for n, d, _s in configs if n == "tmalign"]
    assert tmalign_gpu.defines() in tmalign and len(tmalign) == len({tuple(sorted(d.items())) for d in tmalign})
    assert all(tmalign_gpu.defines(t, m) in tmalign for _length, t, m in tmalign_gpu.BUCKETS)
    for d in prebuilt.HEAD_DIMS:
        assert ("attention_flash", flash_config(d), False) in configs
        assert ("attention", {"HEAD_DIM": d}, False) in configs
    # the wgmma modules (forward, and the d = 64 backward) only for sm_90a, asked by sm_90 or sm_90a;
    # sm_90a alone builds nothing else
    assert {(n, a) for n, _d, a in prebuilt.tasks(["sm_90"]) if a.endswith("a")} == {
        ("attention_flash", "sm_90a"), ("attention_flash_bwd", "sm_90a")}
    assert {a for _n, _d, a in prebuilt.tasks(["sm_90a"])} == {"sm_90a"}
    assert not any(a.endswith("a") for _n, _d, a in prebuilt.tasks(["sm_80", "sm_120"]))
    assert len(prebuilt.tasks(["sm_90", "sm_90a"])) == len(prebuilt.tasks(["sm_90"]))


def test_archs_from_the_environment(monkeypatch):
    # unset or auto: the GPUs present (none here, as on a laptop: a source install compiles nothing)
    monkeypatch.delenv(prebuilt.ARCHS_ENV, raising=False)
    from protgpu._cuda.gpu_archs import visible_gpu_archs

    assert prebuilt.archs_from_env() == visible_gpu_archs()
    assert prebuilt.archs_from_env(default=("sm_89",)) == ("sm_89",)
    monkeypatch.setenv(prebuilt.ARCHS_ENV, "all")
    assert prebuilt.archs_from_env() == prebuilt.DEFAULT_ARCHS
    monkeypatch.setenv(prebuilt.ARCHS_ENV, " sm_90, sm_120 ")
    assert prebuilt.archs_from_env() == ("sm_90", "sm_120")
    monkeypatch.setenv(prebuilt.ARCHS_ENV, "none")
    assert prebuilt.archs_from_env() == ()


# --------------------------------------------------------------------------------------------------
# The loader's choice (cuda.core's module loading faked: no driver here)


class _FakeObj:
    def __init__(self, code, fail=False):
        self.code, self.fail = code, fail

    def get_kernel(self, entry):
        if self.fail:
            raise RuntimeError("CUDA_ERROR_NO_BINARY_FOR_GPU")
        return ("kernel", entry, self.code)


@pytest.fixture
def fake_load(monkeypatch):
    import cuda.core

    compiled = []
    refuse = {"load": False}
    monkeypatch.setattr(cuda.core, "ObjectCode",
                        type("OC", (), {"from_cubin": staticmethod(lambda c, name="": _FakeObj(c, refuse["load"]))}))
    monkeypatch.setattr(loader, "compile_cubin",
                        lambda n, a, d=None: compiled.append((n, a, d)) or _FakeObj(b"nvrtc"))
    return compiled, refuse


def test_loader_takes_the_prebuilt_cubin_when_the_key_matches(pdir, fake_load):
    compiled, _ = fake_load
    _plant(pdir, *LDDT, "sm_90")
    obj, kernel = loader._load_module("lddt", "lddt_pairs_f32", "sm_90", LDDT[1])
    assert kernel == ("kernel", "lddt_pairs_f32", b"\x7fELF fake cubin") and compiled == []


def test_loader_falls_back_to_nvrtc_when_the_defines_differ(pdir, fake_load):
    compiled, _ = fake_load
    _plant(pdir, *LDDT, "sm_90")
    obj, kernel = loader._load_module("lddt", "lddt_pairs_f32", "sm_90", {"LDDT_WARPS": 4})
    assert kernel[2] == b"nvrtc" and compiled == [("lddt", "sm_90", {"LDDT_WARPS": 4})]


def test_loader_falls_back_to_nvrtc_when_the_driver_refuses_the_cubin(pdir, fake_load):
    compiled, refuse = fake_load
    _plant(pdir, *LDDT, "sm_90")
    refuse["load"] = True
    obj, kernel = loader._load_module("lddt", "lddt_pairs_f32", "sm_90", LDDT[1])
    assert kernel[2] == b"nvrtc"
    assert compiled == [("lddt", "sm_90", LDDT[1])]
    assert "driver cannot load it" in prebuilt.status()["rejected"][0][2]


# --------------------------------------------------------------------------------------------------
# Building: the hook without NVRTC, `protgpu kernels --build`


def test_build_module_says_when_nvrtc_is_missing(monkeypatch, tmp_path, capsys):
    def missing():
        raise ImportError("no libnvrtc")

    monkeypatch.setattr(loader, "nvrtc_version", missing)
    assert prebuilt.main([str(tmp_path / "out")]) == prebuilt.NO_NVRTC
    assert "NVRTC is not usable" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _hook(tmp_path):
    sys.path.insert(0, str(REPO))
    try:
        import hatch_build
    finally:
        sys.path.remove(str(REPO))

    class App:
        said: list = []

        def display_warning(self, m):
            self.said.append(m)

        display_info = display_warning

    from hatchling.metadata.core import ProjectMetadata

    return hatch_build, hatch_build.CustomBuildHook(str(REPO), {}, None, ProjectMetadata(str(REPO), None),
                                                    str(tmp_path), "wheel", App())


def test_wheel_hook_ships_no_cubins_without_nvrtc_and_fails_on_a_compile_error(monkeypatch, tmp_path):
    pytest.importorskip("hatchling")
    hatch_build, hook = _hook(tmp_path)
    rc = {"value": hatch_build.NO_NVRTC}
    monkeypatch.setattr(hatch_build.subprocess, "run", lambda *a, **k: type("R", (), {"returncode": rc["value"]}))
    monkeypatch.setenv(prebuilt.ARCHS_ENV, "all")
    build_data = {"force_include": {}}
    hook.initialize("standard", build_data)
    assert build_data["force_include"] == {} and "ships no prebuilt cubins" in hook.app.said[-1]
    hook.finalize("standard", build_data, "")
    rc["value"] = 1
    with pytest.raises(RuntimeError, match="compiling the prebuilt cubins failed"):
        hook.initialize("standard", build_data)
    hook.finalize("standard", build_data, "")
    rc["value"] = 0
    hook.initialize("standard", build_data)
    assert list(build_data["force_include"].values()) == ["protgpu/_prebuilt"]
    hook.finalize("standard", build_data, "")
    assert hatch_build.NO_NVRTC == prebuilt.NO_NVRTC


def test_a_source_build_without_a_gpu_compiles_nothing_and_needs_no_nvrtc(monkeypatch, tmp_path):
    # pip install . on a laptop: PROTGPU_WHEEL_ARCHS unset, no GPU -> no compile, no NVRTC to download;
    # a release build (all) asks for NVRTC and the runtime dependencies the hook's import needs
    pytest.importorskip("hatchling")
    hatch_build, hook = _hook(tmp_path)
    monkeypatch.setattr(hatch_build.subprocess, "run", lambda *a, **k: pytest.fail("compiled without a GPU"))
    monkeypatch.delenv(prebuilt.ARCHS_ENV, raising=False)
    monkeypatch.setattr(hatch_build, "_wanted", lambda root: False)  # what the probe says on a GPU-less host
    build_data = {"force_include": {}}
    hook.initialize("standard", build_data)
    assert build_data["force_include"] == {} and hook.dependencies() == []
    monkeypatch.undo()
    monkeypatch.setenv(prebuilt.ARCHS_ENV, "all")
    deps = hook.dependencies()
    assert any(d.startswith("nvidia-cuda-nvrtc") for d in deps) and any(d.startswith("numpy") for d in deps)
    monkeypatch.setenv(prebuilt.ARCHS_ENV, "none")
    assert hook.dependencies() == []


def test_kernels_build_fills_the_cache_for_the_archs_given(monkeypatch, tmp_path, capsys):
    from protgpu.cli import main

    monkeypatch.setenv("PROTGPU_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(loader, "_cache_obj", None)
    monkeypatch.setattr(prebuilt, "tasks", lambda archs: [("lddt", LDDT[1], a) for a in archs])
    assert main(["kernels", "--build", "--arch", "sm_90"]) == 0
    out, err = capsys.readouterr()
    assert "ok  lddt.cu  sm_90" in out and "1 kernel modules in the cache for sm_90" in err
    assert len(list((tmp_path / "cache").glob("*.cubin"))) == 1
    assert loader.program_cache().get(loader._cache_key("lddt", "sm_90", LDDT[1]))


def test_kernels_build_without_a_gpu_needs_an_arch(monkeypatch, capsys):
    from protgpu.cli import main

    monkeypatch.setenv("PROTGPU_DISABLE_GPU", "1")
    assert main(["kernels", "--build"]) == 2
    err = capsys.readouterr().err.strip()
    assert "give --arch sm_XY" in err and len(err.splitlines()) == 1
