"""The loader's header inlining (``#include "<name>.cuh"`` -> the header's text, recursively, each header
once), on the real kernels and on small sources in a temporary kernels folder. No GPU; NVRTC only where
a test compiles, and those skip without cuda.core."""

from __future__ import annotations

import re

import pytest

from protgpu._cuda import loader
from protgpu.errors import KernelCompileError

_LEFT_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"[^"\n]*\.cuh"', re.MULTILINE)


@pytest.fixture
def kdir(tmp_path, monkeypatch):
    """An empty kernels folder the loader reads instead of kernels/ (file reads are memoised per path:
    cleared around the test, so a rewritten header is read again)."""
    monkeypatch.setattr(loader, "kernel_dir", lambda: tmp_path)
    loader._read.cache_clear()
    loader.entry_points.cache_clear()
    yield tmp_path
    loader._read.cache_clear()
    loader.entry_points.cache_clear()


def _write(d, files: dict) -> None:
    for name, text in files.items():
        (d / name).write_text(text)


# --------------------------------------------------------------------------------------------------
# The real kernels


@pytest.mark.parametrize("name", ["qcp", "tmscore"])
def test_qcp_header_is_inlined_once_in_both_users(name):
    header = (loader.kernel_dir() / "qcp.cuh").read_text()
    common = (loader.kernel_dir() / "common.cuh").read_text()
    src = loader.build_source(name)
    assert src.count(header) == 1
    assert src.count(common) == 1
    assert not _LEFT_INCLUDE.search(src)
    # the shared solver is defined once, in the header, and the copies it replaced are gone
    assert src.count("__device__ __forceinline__ double qcp_largest(") == 1
    assert src.count("struct QcpKey {") == 1
    assert "tm_minor" not in src and "tm_det3" not in src


def test_every_header_is_used_and_no_source_keeps_an_include():
    headers = {p.name for p in loader.kernel_dir().glob("*.cuh")}
    assert {"common.cuh", "qcp.cuh"} <= headers
    seen = set()
    for name in loader.kernel_files():
        src = loader.build_source(name)
        assert not _LEFT_INCLUDE.search(src), name
        seen |= {h for h in headers if f"// ---- {h}\n" in src}
    assert seen == headers  # no orphan header in kernels/


# --------------------------------------------------------------------------------------------------
# A temporary kernels folder


def test_nested_and_repeated_includes_inline_each_header_once(kdir):
    _write(kdir, {
        "common.cuh": "#pragma once\n#define COMMON_TEXT 1\n",
        "a.cuh": '#pragma once\n#include "common.cuh"\n#include "b.cuh"  // b first\n#define A_TEXT 1\n',
        "b.cuh": '#pragma once\n#include "common.cuh"\n#define B_TEXT 1\n',
        "c.cuh": '#pragma once\n#include "b.cuh"\n#define C_TEXT 1\n',
        "main.cu": ('#include "common.cuh"\n#include "a.cuh"\n#include "c.cuh"\n#include "b.cuh"\n'
                    '#include <cstdint>\n// #include "a.cuh" in a comment stays\n#define MAIN_TEXT 1\n'),
    })
    src = loader.build_source("main", {"KNOB": 3})
    assert src.startswith("#define KNOB 3\n// ---- main.cu\n")
    for macro in ("COMMON_TEXT", "A_TEXT", "B_TEXT", "C_TEXT", "MAIN_TEXT"):
        assert src.count(f"#define {macro} 1") == 1, macro
    assert not _LEFT_INCLUDE.search(src.replace('// #include "a.cuh"', ""))
    assert '// #include "a.cuh" in a comment stays' in src
    assert "#include <cstdint>" in src  # system headers are NVRTC's business
    # each header's text lands where it is first included: b inside a (before A_TEXT), c after a
    order = [src.index(f"#define {m} 1") for m in ("COMMON_TEXT", "B_TEXT", "A_TEXT", "C_TEXT", "MAIN_TEXT")]
    assert order == sorted(order)
    assert src.count("// ---- b.cuh (inlined above)") == 2  # from c.cuh and from main.cu


def test_missing_header_names_the_include_chain(kdir):
    _write(kdir, {"common.cuh": "", "a.cuh": '#include "nothere.cuh"\n', "main.cu": '#include "a.cuh"\n'})
    with pytest.raises(KernelCompileError, match=r'main\.cu -> a\.cuh: #include "nothere\.cuh": no such header'):
        loader.build_source("main")


@pytest.mark.parametrize("files, cycle", [
    ({"a.cuh": '#include "b.cuh"\n', "b.cuh": '#include "a.cuh"\n'}, "a.cuh -> b.cuh -> a.cuh"),
    ({"a.cuh": '#pragma once\n#include "a.cuh"\n', "b.cuh": ""}, "a.cuh -> a.cuh"),
])
def test_include_cycle_is_an_error(kdir, files, cycle):
    _write(kdir, {"common.cuh": "", **files, "main.cu": '#include "a.cuh"\n'})
    with pytest.raises(KernelCompileError, match="include cycle " + re.escape(cycle)):
        loader.build_source("main")


def test_header_outside_the_kernels_folder_is_refused(kdir):
    _write(kdir, {"common.cuh": "", "main.cu": '#include "../elsewhere/x.cuh"\n'})
    with pytest.raises(KernelCompileError, match="bare name"):
        loader.build_source("main")


def test_source_changes_when_a_nested_header_changes(kdir):
    _write(kdir, {"common.cuh": "", "a.cuh": '#include "b.cuh"\n', "b.cuh": "#define B_VALUE 1\n",
                  "main.cu": '#include "a.cuh"\n'})
    before = loader.build_source("main")
    (kdir / "b.cuh").write_text("#define B_VALUE 2\n")
    loader._read.cache_clear()  # (a new process reads the files afresh)
    after = loader.build_source("main")
    assert "#define B_VALUE 1" in before and "#define B_VALUE 2" in after


def test_cache_key_changes_when_a_nested_header_changes(kdir):
    pytest.importorskip("cuda.core")
    _write(kdir, {"common.cuh": "", "a.cuh": '#include "b.cuh"\n', "b.cuh": "#define B_VALUE 1\n",
                  "main.cu": '#include "a.cuh"\n'})
    k1 = loader._cache_key("main", "sm_90")
    assert k1 == loader._cache_key("main", "sm_90")
    (kdir / "b.cuh").write_text("#define B_VALUE 2\n")
    loader._read.cache_clear()
    assert loader._cache_key("main", "sm_90") != k1


def test_nested_headers_compile_with_nvrtc(kdir):
    pytest.importorskip("cuda.core")
    _write(kdir, {
        "common.cuh": "#pragma once\ntypedef long long i64;\n",
        "twice.cuh": '#pragma once\n#include "common.cuh"\n__device__ __forceinline__ double twice(double v) '
                     "{ return 2.0 * v; }\n",
        "main.cu": '#include "common.cuh"\n#include "twice.cuh"\n#include "common.cuh"\n'
                   'extern "C" __global__ void double_it(double* x, long long n) {\n'
                   "    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;\n"
                   "    if (i < n) x[i] = twice(x[i]);\n}\n",
    })
    obj = loader.compile_cubin("main", "sm_90", cache=False)
    assert b"double_it" in bytes(obj.code)
