"""A/B of the scores' GPU calls between two source trees (a regression check for refactors).

Run it once per tree, alternating, in one call on the GPU machine, so that both trees see the same
machine state::

    for i in 1 2 3; do
        python3 benchmarks/bench_ab_trees.py OLD_TREE datasets/openstructure/7W1F_B_target.pdb
        python3 benchmarks/bench_ab_trees.py NEW_TREE datasets/openstructure/7W1F_B_target.pdb
    done

Each run prints one line: the median seconds of ``pg.tm_score`` (CA atoms) and ``pg.lddt`` (heavy atoms)
over 10,000 perturbed models of the reference's first 300 residues, coordinates on the device.
"""

from __future__ import annotations

import sys
import time

import numpy as np


def main() -> None:
    tree, reference = sys.argv[1], sys.argv[2]
    sys.path.insert(0, tree)
    import cupy

    import protgpu as pg

    assert pg.__file__.startswith(tree), pg.__file__
    ref = pg.load(reference).select("heavy")
    ref = ref.select(np.flatnonzero(ref.atoms.residue_index < 300))
    rng = np.random.default_rng(0)
    models = (ref.coords + rng.normal(scale=1.5, size=(10000, *ref.coords.shape[1:]))).astype(np.float32)
    ca = ref.select_indices("name CA")
    xd, yd, md = cupy.asarray(models[:, ca]), cupy.asarray(ref.coords[0, ca]), cupy.asarray(models)

    def median(fn, n=5):
        fn()
        cupy.cuda.Device().synchronize()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            cupy.cuda.Device().synchronize()
            times.append(time.perf_counter() - t)
        return sorted(times)[n // 2]

    print(tree.rstrip("/").split("/")[-1], f"tm {median(lambda: pg.tm_score(xd, yd)):.4f} s  "
          f"lddt {median(lambda: pg.lddt(md, ref)):.4f} s")


if __name__ == "__main__":
    main()
