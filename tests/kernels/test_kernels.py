"""The kernel layer without a GPU: kernels compile (all of them in tests/test_wheel.py's build),
signatures parse, the disk cache survives corruption."""

from __future__ import annotations

import pytest

cuda_core = pytest.importorskip("cuda.core")

from protgpu._cuda import loader  # noqa: E402
from protgpu._cuda.cache import ChecksummedProgramCache  # noqa: E402


def test_check_all_compiles_each_source_and_its_arch_specific_target(monkeypatch):
    # Two sources only: every kernel module is compiled once in the suite, by the wheel build of
    # tests/test_wheel.py (its prebuilt cubins), and CI's `protgpu kernels --check` for sm_80 and sm_90.
    monkeypatch.setattr(loader, "kernel_files", lambda: ["lddt", "attention_flash"])
    records = loader.check_all(("sm_90",))
    assert [(r["kernel"], r["arch"]) for r in records] == [("lddt", "sm_90"), ("attention_flash", "sm_90"),
                                                          ("attention_flash", "sm_90a")]
    assert all(r["bytes"] > 0 and r["entries"] > 0 for r in records)
    assert loader.arch_specific_target("sm_90") == "sm_90a" == loader.arch_specific_target("sm_90a")


def test_entry_point_signatures_parse():
    eps = loader.entry_points("distances")
    params = eps["pair_distances_f32"]
    assert [p.name for p in params][:2] == ["x", "pairs"]
    assert params[1].pointer and params[1].dtype.__name__ == "int64"
    assert not params[-1].pointer and params[-1].ctype == "int"


def test_common_header_is_inlined_and_defines_prepended():
    src = loader.build_source("distances", {"COLS_PER_THREAD": 8})
    assert src.startswith("#define COLS_PER_THREAD 8")
    assert '#include "common.cuh"' not in src
    assert "pg_minimum_image" in src


def test_compile_error_is_reported(tmp_path, monkeypatch):
    from protgpu.errors import KernelCompileError

    (tmp_path / "common.cuh").write_text("#pragma once\n")
    (tmp_path / "broken.cu").write_text('extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }\n')
    monkeypatch.setattr(loader, "kernel_dir", lambda: tmp_path)
    with pytest.raises(KernelCompileError, match="broken.cu"):
        loader.compile_cubin("broken", "sm_90", cache=False)


def test_cache_hit_and_corrupt_entry_is_rebuilt(tmp_path):
    cache = ChecksummedProgramCache(tmp_path)  # lddt: the quickest kernel to compile (~0.5 s)
    first = loader.compile_cubin("lddt", "sm_90", cache=cache)
    assert len(cache) == 1
    again = loader.compile_cubin("lddt", "sm_90", cache=cache)
    assert bytes(again.code) == bytes(first.code)
    # Flip a byte in the middle of the stored cubin: the next read must miss and recompile.
    entry = next(tmp_path.glob("*.cubin"))
    blob = bytearray(entry.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    entry.write_bytes(bytes(blob))
    rebuilt = loader.compile_cubin("lddt", "sm_90", cache=cache)
    assert cache.corrupt_entries_dropped == 1
    assert bytes(rebuilt.code) == bytes(first.code)
    assert cache.get(loader._cache_key("lddt", "sm_90")) == bytes(first.code)
    # A truncated entry too.
    entry.write_bytes(entry.read_bytes()[:20])
    loader.compile_cubin("lddt", "sm_90", cache=cache)
    assert cache.corrupt_entries_dropped == 2


def test_cache_key_changes_with_defines_and_arch():
    k1 = loader._cache_key("distances", "sm_90")
    assert k1 != loader._cache_key("distances", "sm_80")
    assert k1 != loader._cache_key("distances", "sm_90", {"COLS_PER_THREAD": 2})
