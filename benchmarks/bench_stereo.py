"""The per-model cost of the stereochecks (``protgpu.complexes.stereo``), issue 18's 305 + 150-residue
complexes: ``stereo_drop`` of one model on one core, compiled loops (numba) and the NumPy twin, the
atom table's topology built once (as ``protgpu evaluate``'s parse workers keep it).

Data: ``bench_complex.reference_complex()`` (1eud chain A + the 150-residue window of chain B) and 1eud's
model (``datasets/openstructure/1eud_mdl_partial-dimer.pdb``), as they are (no perturbation: the
checks' work is the same for any coordinates; a model with problems adds only their few pairs).

    python3 benchmarks/bench_stereo.py [--repeat R]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import HERE
from bench_complex import reference_complex


def per_model_ms(s, compiled: bool, repeat: int) -> float:
    """Best of 5 runs of ``repeat`` stereo checks of ``s``'s first frame: milliseconds per model."""
    from protgpu.complexes import stereo

    top = stereo.stereo_topology(s)
    x = np.asarray(s.coords[0], np.float64)
    stereo.drop_of(top, stereo.stereo_problems(s, x, top, compiled=compiled))  # compile, warm
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            stereo.drop_of(top, stereo.stereo_problems(s, x, top, compiled=compiled))
        best = min(best, (time.perf_counter() - t0) / repeat)
    return best * 1e3


def main() -> int:
    import protgpu as pg
    from protgpu.complexes._cleanup import clean

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    cases = {"305+150 residues (1eud A + B window)": reference_complex(),
             "1eud model (531 residues)": clean(pg.load(HERE.parent / "datasets" / "openstructure"
                                                        / "1eud_mdl_partial-dimer.pdb"))}
    for name, s in cases.items():
        fast = per_model_ms(s, True, args.repeat)
        twin = per_model_ms(s, False, max(args.repeat // 10, 5))
        print(f"{name}: {s.n_atoms} atoms, stereo_drop {fast:.3f} ms/model compiled, {twin:.3f} ms NumPy twin")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
