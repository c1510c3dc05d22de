"""``protgpu distances INPUT... [--select ca] [--out FILE.npy|.npz]``: distance matrices per input."""

from __future__ import annotations

import os
import time

import numpy as np

from ..errors import InputError
from ._inputs import expand_inputs
from ._progress import progress


def register(sub, common) -> None:
    p = sub.add_parser("distances", parents=common, help="all-atom (or selected) distance matrices, Angstrom")
    p.add_argument("--top", "-t", help="topology file for trajectory inputs (PDB, mmCIF, ...)")
    p.add_argument("--periodic", action="store_true", help="minimum-image distances using the input's box")
    p.set_defaults(func=run)


def _key(path: str, used: set) -> str:
    base = os.path.basename(path)
    for ext in (".gz",):
        base = base.removesuffix(ext)
    stem = os.path.splitext(base)[0] or "input"
    key, i = stem, 1
    while key in used:
        i += 1
        key = f"{stem}_{i}"
    used.add(key)
    return key


def run(args) -> int:
    from .. import distances
    from .._array import dispatch
    from ..io import load, save_array

    if args.out and not args.out.endswith((".npy", ".npz")):
        raise InputError(f"--out {args.out}: use a .npy or .npz file name")
    paths = expand_inputs(args.inputs)
    device = dispatch(device=args.device).device
    results: dict[str, np.ndarray] = {}
    used: set = set()
    t0 = time.perf_counter()
    for path in progress(paths, description="distances", quiet=args.quiet):
        s = load(path, top=args.top)
        if args.select:
            s = s.select(args.select)
        if args.periodic and s.box is None:
            raise InputError(f"{path}: --periodic given but the file has no box")
        d = distances(s.coords, box=s.box if args.periodic else None, device=device)
        results[_key(path, used)] = d
        if not args.quiet and not args.out:
            print(f"{path}: {s.n_frames} frame(s) x {s.n_atoms} atoms -> {d.shape} float32 Angstrom; "
                  f"min {d[d > 0].min() if (d > 0).any() else 0:.3f}, max {d.max():.3f}")
    if args.out:
        if args.out.endswith(".npy"):
            if len(results) != 1:
                raise InputError(f"--out {args.out}: a .npy file holds one input's result; use .npz for "
                                 f"{len(results)} inputs")
            save_array(args.out, next(iter(results.values())))
        else:
            save_array(args.out, {**results, "inputs": np.array(paths)})
    if not args.quiet:
        dt = time.perf_counter() - t0
        where = f" to {args.out}" if args.out else ""
        print(f"{len(paths)} input(s) on the {device.upper()} in {dt:.2f} s{where}")
    return 0
