"""The attention backward's kernels without a GPU: the new entry points compile with NVRTC for sm_80 and
sm_90 (the entries whose bodies a define switches on, which the compile-every-kernel test does not see),
and the tile choice fits static shared memory."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from protgpu.attention import flash_backward as fb
from protgpu.attention.flash import _STATIC_SMEM, flash_config


def text_sizes(cubin: bytes) -> dict[str, int]:
    """Bytes of machine code per kernel of a cubin (its ``.text.<kernel>`` ELF sections)."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]

    def name(off):
        return cubin[names + off:cubin.index(b"\0", names + off)].decode()

    return {name(h[0])[6:]: h[5] for h in headers if name(h[0]).startswith(".text.")}


@pytest.mark.parametrize("precision", ["bfloat16", "float16", "float32", "float64"])
def test_backward_entries_compile_with_bodies(precision):
    pytest.importorskip("cuda.core")
    from protgpu._cuda.loader import compile_cubin

    sfx = fb._SUFFIX[precision]
    for arch, d in (("sm_80", 64), ("sm_90", 128)) if precision == "bfloat16" else (("sm_80", 64),):
        cfg = fb.bwd_config(precision, d)
        bodied = {f"flash_bwd_fwd_{sfx}", f"flash_bwd_delta_{sfx}", f"flash_bwd_{sfx}"}
        if precision in ("bfloat16", "float16"):
            bodied.add(f"flash_bwd_dq_{sfx}")
            if d <= fb.MMA_MAX_HEAD_DIM:  # the tensor-core backward (beyond: the CUDA-core one alone)
                # (d = 64 defaults to the wgmma kernel, whose body exists for sm_90a only: the mma.sync
                # kernel beside it is the one sm_80 runs)
                assert cfg["BW_MMA"] == (2 if d == fb.WG_HEAD_DIM else 1)
                bodied.add(f"flash_bwd_mma_{sfx}")
        sizes = text_sizes(bytes(compile_cubin("attention_flash_bwd", arch, cfg, cache=False).code))
        # (an empty kernel is an EXIT and padding: 256 bytes)
        assert all(sizes[e] > 512 for e in bodied), (arch, sizes)
        assert all(sizes[e] <= 256 for e in sizes if e not in bodied), (arch, sizes)


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", [16, 32, 64])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
def test_wgmma_backward_compiles_with_body_on_sm90a_only(precision, d, arch, monkeypatch):
    """BW_MMA=2: flash_bwd_wg_* has a body exactly for sm_90a at d = 64; the mma.sync kernel beside it
    in every module (the fallback off compute capability 9.0 and for d != 64)."""
    pytest.importorskip("cuda.core")
    from protgpu._cuda.loader import compile_cubin

    monkeypatch.setattr(fb, "BWD_OVERRIDES", {"BW_MMA": 2})
    cfg = fb.bwd_config(precision, d)
    assert cfg["BW_MMA"] == (2 if d == fb.WG_HEAD_DIM else 1)
    sfx = fb._SUFFIX[precision]
    sizes = text_sizes(bytes(compile_cubin("attention_flash_bwd", arch, cfg, cache=False).code))
    assert sizes[f"flash_bwd_mma_{sfx}"] > 512
    wg = sizes[f"flash_bwd_wg_{sfx}"]
    assert wg > 4096 if (arch == "sm_90a" and d == 64) else wg <= 256, (arch, d, wg)
    other = "f16" if sfx == "bf16" else "bf16"
    assert sizes[f"flash_bwd_wg_{other}"] <= 256


@pytest.mark.parametrize("knobs", [{"BWG_DQ_MMA": 1}, {"BWG_DQ_BULK": 1}, {"BWG_KEYS": 128},
                                   {"BWG_KEYS": 128, "BWG_DQ_MMA": 1}])
def test_wgmma_backward_dq_knobs_compile(knobs, monkeypatch):
    """The wgmma kernel's dQ alternatives compile for sm_90a with a body (BWG_DQ_BULK's staging keeps the
    static shared memory within 48 KB, else ptxas fails)."""
    pytest.importorskip("cuda.core")
    from protgpu._cuda.loader import compile_cubin

    monkeypatch.setattr(fb, "BWD_OVERRIDES", {"BW_MMA": 2, **knobs})
    sizes = text_sizes(bytes(compile_cubin("attention_flash_bwd", "sm_90a", fb.bwd_config("bfloat16", 64),
                                           cache=False).code))
    assert sizes["flash_bwd_wg_bf16"] > 4096


def test_wgmma_backward_128_keys_fits_one_block_an_sm(monkeypatch):
    """BWG_KEYS=128: 256 threads at most 255 registers with no spills (ptxas's report through NVRTC), and
    the mma.sync kernel beside it still compiles for sm_80 (the fallback off compute capability 9.0)."""
    pytest.importorskip("cuda.core")
    import io
    import re

    from cuda.core import Program, ProgramOptions

    from protgpu._cuda.loader import PROGRAM_OPTIONS, build_source, compile_cubin

    monkeypatch.setattr(fb, "BWD_OVERRIDES", {"BW_MMA": 2, "BWG_KEYS": 128})
    cfg = fb.bwd_config("bfloat16", 64)
    log = io.StringIO()
    opts = ProgramOptions(arch="sm_90a", ptxas_options=["-v"], **PROGRAM_OPTIONS)
    Program(build_source("attention_flash_bwd", cfg), code_type="c++", options=opts).compile("cubin", logs=log)
    report = log.getvalue().split("Function properties for flash_bwd_wg_bf16", 1)[1].splitlines()[1:3]
    assert "0 bytes spill stores, 0 bytes spill loads" in report[0], report
    assert int(re.search(r"Used (\d+) registers", report[1]).group(1)) <= 255, report
    sizes = text_sizes(bytes(compile_cubin("attention_flash_bwd", "sm_80", cfg, cache=False).code))
    assert sizes["flash_bwd_mma_bf16"] > 512 and sizes["flash_bwd_wg_bf16"] <= 256


def test_bw_mma_knob(monkeypatch):
    # the defaults: wgmma at d = 64 in 16 bits, mma.sync for the other tensor-core sizes, none in 32 bits
    assert [fb.bwd_config(p, d)["BW_MMA"] for p, d in (("bfloat16", 64), ("float16", 64), ("bfloat16", 32),
                                                        ("float16", 16), ("float32", 64))] == [2, 2, 1, 1, 0]
    for want, d, prec, got in ((1, 64, "bfloat16", 1), (2, 64, "bfloat16", 2), (2, 64, "float16", 2),
                               (2, 32, "bfloat16", 1), (2, 48, "float16", 1), (2, 64, "float32", 0),
                               (0, 64, "bfloat16", 0), (1, 128, "bfloat16", 0)):
        monkeypatch.setattr(fb, "BWD_OVERRIDES", {"BW_MMA": want})
        assert fb.bwd_config(prec, d)["BW_MMA"] == got, (want, d, prec)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_forward_lse_entries_compile_with_bodies(arch):
    pytest.importorskip("cuda.core")
    from protgpu._cuda.loader import compile_cubin

    cfg = dict(flash_config(64), FA_WRITE_LSE=1)
    sizes = text_sizes(bytes(compile_cubin("attention_flash", arch, cfg, cache=False).code))
    lse = ["flash_attention_lse_bf16", "flash_attention_lse_f16"]
    if arch == "sm_90a":
        lse += ["flash_attention_wg_lse_bf16", "flash_attention_wg_lse_f16"]
    assert all(sizes[e] > 1024 for e in lse), sizes
    # With FA_WRITE_LSE the plain entries are empty (the module compiles one kind).
    assert sizes["flash_attention_bf16"] <= 256


@pytest.mark.parametrize("precision", ["bfloat16", "float32", "float64"])
@pytest.mark.parametrize("d", [8, 32, 48, 64, 100, 128])
def test_tiles_fit_static_shared_memory(precision, d):
    cfg = fb.bwd_config(precision, d)
    itemsize = 8 if precision == "float64" else 4
    assert fb.bwd_smem_bytes(d, cfg["BW_BM"], cfg["BW_BN"], itemsize) <= _STATIC_SMEM
    assert cfg["BW_BM"] in (8, 16, 32) and cfg["HEAD_DIM"] == d


def test_supports_host_arrays_is_false():
    assert not fb.supports(np.zeros((1, 4, 2, 64), dtype=np.float32))
