"""GPU parity of kernels/gdt_windows.cu with the NumPy twin / numba path (run on the GPU machine), and
score_complex's GPU path on the 1eud pair against OpenStructure's values."""

from __future__ import annotations

import numpy as np
import pytest

from protgpu.scoring import _fast
from protgpu.scoring import gdt_windows as gw

pytestmark = pytest.mark.gpu


def _cases(rng, lmax=77):
    """Models of different lengths (3 to lmax pairs) against one reference chain, hinge-moved."""
    y = np.cumsum(rng.normal(size=(lmax, 3)) * 2.2, axis=0)
    n_ali = np.array([3, 5, 12, 40, lmax, 64])
    x = np.zeros((len(n_ali), lmax, 3))
    for m, n in enumerate(n_ali):
        xm = y + rng.normal(size=y.shape) * (0.4 + 0.5 * m)
        h = n // 2
        a = 0.2 * (m + 1)
        r = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1.0]])
        xm[h:] = (xm[h:] - xm[h]) @ r.T + xm[h]
        x[m, :n] = xm[:n]
    return x, y[None], n_ali


def _cpu(x, y, n_ali):
    return (gw.gdt_windows_fast if _fast.enabled() else gw.gdt_windows_numpy)(x, y, n_ali)


def _check_parity(seed: int) -> None:
    import cupy

    x, y, n_ali = _cases(np.random.default_rng(seed))
    expect = gw.gdt_windows_numpy(x, y, n_ali)
    for smem in (gw._SMEM_HARD, 0):
        gw._SMEM_LIMIT = smem
        try:
            for yy in (y, np.broadcast_to(y, x.shape).copy()):  # a shared reference row, one per model
                got = cupy.asnumpy(gw.gdt_windows_cuda(cupy.asarray(x), cupy.asarray(yy), n_ali))
                assert np.array_equal(got, expect), (seed, smem, yy.shape, got, expect)
        finally:
            gw._SMEM_LIMIT = gw._SMEM_HARD


@pytest.mark.parametrize("seed", [0, 1])
def test_cuda_matches_twin(seed):
    _check_parity(seed)


def test_cuda_matches_cpu_on_complex_sized_models():
    """64 models of 455 pairs (a 305 + 150 complex), every count equal to the CPU path's."""
    import cupy

    rng = np.random.default_rng(5)
    y = np.cumsum(rng.normal(size=(455, 3)) * 2.2, axis=0)
    x = y[None] + rng.normal(size=(64, 455, 3)) * rng.uniform(0.3, 3.0, size=(64, 1, 1))
    n_ali = np.full(64, 455)
    got = cupy.asnumpy(gw.gdt_windows_cuda(cupy.asarray(x), cupy.asarray(y[None]), n_ali))
    assert np.array_equal(got, _cpu(x, y[None], n_ali))


def test_score_complex_gpu_reproduces_openstructure(datasets):
    import protgpu as pg

    d = datasets / "openstructure"
    t = pg.score_complex(d / "1eud_mdl_partial-dimer.pdb", d / "1eud_ref.pdb", metrics=("gdtts", "gdtha"),
                         device="gpu")
    assert round(float(t["gdtts"][0]), 3) == 0.616
    assert round(float(t["gdtha"][0]), 3) == 0.473


def check_gdt_windows_for_sanitizer() -> None:
    """Odd sizes, both coordinate stagings, against the twin. Run under compute-sanitizer by
    tests/sanitize_kernels.py (section gdt_windows)."""
    _check_parity(3)
    print("gdt_windows: ok")
