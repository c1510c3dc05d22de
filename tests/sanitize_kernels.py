"""Exercise every kernel entry point on small inputs, for compute-sanitizer on the GPU machine:

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 tests/sanitize_kernels.py [module ...]

Odd sizes (not multiples of any block or tile) on purpose, so that edge guards are exercised. Each
section also checks its result against the NumPy twin, so a kernel that reads garbage also fails here.
"""

from __future__ import annotations

import sys

import numpy as np


def check_distances() -> None:
    import protgpu as pg
    from protgpu.distances import distances_numpy

    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        x = rng.uniform(0, 40, size=(3, 37, 3)).astype(dtype)
        y = rng.uniform(0, 40, size=(1, 29, 3)).astype(dtype)
        for box in (None, np.array([41.0, 43.0, 47.0]), np.array([[40.0, 0, 0], [13, 37, 0], [-13, 18, 32.0]])):
            for kw in ({}, {"y": y}, {"pairs": rng.integers(0, 37, size=(53, 2))}):
                got = pg.distances(x, box=box, device="gpu", **kw)
                ref = distances_numpy(x, kw.get("y"), pairs=kw.get("pairs"), box=box)
                assert np.allclose(got, ref, atol=1e-4), ("distances", dtype, kw.keys(), box)
    print("distances: ok")


def check_contacts() -> None:
    from pathlib import Path

    import protgpu as pg

    here = Path(__file__).resolve().parents[1] / "datasets"
    s = pg.load(here / "adk_dims.dcd", top=here / "adk_open.pdb").frames(slice(0, 3))
    for dtype in (np.float32, np.float64):
        coords = s.coords.astype(dtype)
        for scheme in ("closest-heavy", "ca", "sidechain", "closest"):
            gpu = pg.contacts(s, coords=coords, scheme=scheme, device="gpu")
            cpu = pg.contacts(s, coords=coords, scheme=scheme, device="cpu")
            finite = np.isfinite(cpu.distances)
            assert np.array_equal(finite, np.isfinite(gpu.distances)), ("contacts", scheme)
            assert np.allclose(gpu.distances[finite], cpu.distances[finite], atol=1e-4), ("contacts", scheme, dtype)
    print("contacts: ok")


def _from_test_module(module: str, function: str, folder: str = ""):
    """A sanitizer section that lives beside its GPU tests (tests/<folder>/<module>.py)."""
    def run() -> None:
        import importlib
        import os

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), folder))
        getattr(importlib.import_module(module), function)()
    return run


SECTIONS = {
    "distances": check_distances,
    "contacts": check_contacts,
    "attention": _from_test_module("test_attention_gpu", "check_attention_for_sanitizer", "attention"),
    "scoring": _from_test_module("test_scoring_gpu", "check_scoring_for_sanitizer", "scoring"),
    "superpose": _from_test_module("superpose.test_superpose_gpu", "check_superpose_for_sanitizer"),
    "consensus": _from_test_module("test_consensus_gpu", "check_consensus_for_sanitizer", "scoring"),
    "attention_bwd": _from_test_module("test_flash_backward_gpu", "check_flash_backward_for_sanitizer", "attention"),
    "attention_bwd_wg": _from_test_module("test_flash_backward_gpu", "check_flash_backward_wg_for_sanitizer",
                                          "attention"),
    "attention_bwd_wg128": _from_test_module("test_flash_backward_gpu", "check_flash_backward_wg128_for_sanitizer",
                                             "attention"),
    "tmalign": _from_test_module("test_tmalign_gpu", "check_tmalign_for_sanitizer", "align"),
    "qcp_backward": _from_test_module("test_qcp_backward_gpu", "check_qcp_backward_for_sanitizer", "superpose"),
    "gdt_windows": _from_test_module("test_gdt_windows_gpu", "check_gdt_windows_for_sanitizer", "scoring"),
    "complex": _from_test_module("test_complex_gpu", "check_complex_for_sanitizer", "complexes"),
}


def main(argv: list[str]) -> int:
    from protgpu._array import gpu_available, gpu_unavailable_reason

    if not gpu_available():
        print(f"no usable GPU: {gpu_unavailable_reason()}", file=sys.stderr)
        return 1
    for name in argv or list(SECTIONS):
        SECTIONS[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
