"""``protgpu contacts INPUT... [--scheme] [--cutoff] [--frequency] [--out maps.npz] [--plot map.png]``:
residue contact maps per input, with a short summary and an optional heatmap."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from ..errors import InputError
from ._inputs import expand_inputs
from ._progress import progress


def register(sub, common) -> None:
    from ..contacts import SCHEMES

    p = sub.add_parser(
        "contacts", parents=common,
        help="residue contact maps and contact frequencies (mdtraj's schemes; Angstrom)",
        description="Residue-pair distances under a scheme, contacts below a cutoff and, over frames, "
                    "the fraction of frames in contact. --select picks the residues of the map (those "
                    "with a selected atom); by default every residue with a CA atom.",
    )
    p.add_argument("--top", "-t", help="topology file for trajectory inputs (PDB, mmCIF, ...)")
    p.add_argument("--scheme", choices=SCHEMES, default="closest-heavy",
                   help="residue distance: CA-CA, or closest (heavy / side-chain) atom pair (default: closest-heavy)")
    p.add_argument("--cutoff", type=float, default=4.5, help="contact when the distance is below this, A (default 4.5)")
    p.add_argument("--min-separation", type=int, default=3,
                   help="skip same-chain pairs closer than this in sequence (default 3, as mdtraj)")
    p.add_argument("--no-inter-chain", action="store_true", help="leave out pairs of different chains (as mdtraj)")
    p.add_argument("--no-periodic", action="store_true", help="ignore a trajectory's periodic box")
    p.add_argument("--frequency", action="store_true",
                   help="keep only the fraction of frames in contact (memory independent of frame count)")
    p.add_argument("--pairs", action="store_true", help="store contacts as sparse (frame, i, j, distance) records")
    p.add_argument("--plot", metavar="PNG",
                   help="write a heatmap (frequency map over frames, distance map for one frame)")
    p.set_defaults(func=run)


def _plot(cm, path: str) -> None:
    from ..plotting import heatmap

    res = cm.residues
    several_chains = len(set(zip(res.chain.tolist(), res.segid.tolist(), strict=True))) > 1
    ticks = res.labels() if several_chains else [f"{n}{ic}" for n, ic in zip(res.number.tolist(), res.icode.tolist(),
                                                                              strict=True)]
    name = os.path.basename(cm.source or "structure")
    if cm.distances is None or cm.n_frames > 1:
        title = f"{name}: contact frequency ({cm.scheme}, < {cm.cutoff:g} Å, {cm.n_frames} frames)"
        heatmap(cm.frequency, path, xlabels=ticks, title=title, xlabel="residue", ylabel="residue",
                cbar_label="fraction of frames in contact", vmin=0.0, vmax=1.0, cmap="viridis")
    else:
        d = np.asarray(cm.distances[0], dtype=np.float64)
        heatmap(d, path, xlabels=ticks, title=f"{name}: residue distances ({cm.scheme})", xlabel="residue",
                ylabel="residue", cbar_label="distance (Å)", vmin=0.0, vmax=4 * cm.cutoff, cmap="viridis_r")


def run(args) -> int:
    from .._array import dispatch
    from ..contacts import contacts
    from ..io import load, save_array

    if args.out and not args.out.endswith(".npz"):
        raise InputError(f"--out {args.out}: contact maps are several arrays; use a .npz file name")
    if args.plot and not args.plot.lower().endswith(".png"):
        raise InputError(f"--plot {args.plot}: use a .png file name")
    if args.cutoff <= 0:
        raise InputError(f"--cutoff {args.cutoff}: must be positive")
    if args.min_separation < 0:
        raise InputError(f"--min-separation {args.min_separation}: must be >= 0")
    paths = expand_inputs(args.inputs)
    device = dispatch(device=args.device).device
    results: dict[str, np.ndarray] = {}
    from ..batch import stem_keys

    stems = dict(zip(paths, stem_keys(paths, reserved=()), strict=True))  # unique .npz prefixes
    t_all = time.perf_counter()
    for path in progress(paths, description="contacts", quiet=args.quiet):
        s = load(path, top=args.top)
        t0 = time.perf_counter()
        cm = contacts(s, scheme=args.scheme, cutoff=args.cutoff, min_separation=args.min_separation,
                      residues=args.select, frequency=args.frequency, output="pairs" if args.pairs else "dense",
                      inter_chain=not args.no_inter_chain, periodic=not args.no_periodic, device=device)
        dt = time.perf_counter() - t0
        stem = stems[path]
        arrays = cm.to_dict()
        if len(paths) == 1:
            results.update(arrays)
        else:
            results.update({f"{stem}/{k}": v for k, v in arrays.items()})
        if args.plot:
            target = args.plot
            if len(paths) > 1:
                p = Path(args.plot)
                target = str(p.with_name(f"{p.stem}_{stem}{p.suffix}"))
            _plot(cm, target)
        if not args.quiet:
            print(f"{path}: {cm.summary()}; {cm.device.upper()}, {dt:.3f} s")
    if args.out:
        results["inputs"] = np.array(paths)
        save_array(args.out, results)
    if not args.quiet:
        dt = time.perf_counter() - t_all
        where = [f"maps to {args.out}"] if args.out else []
        if args.plot:
            plots = args.plot if len(paths) == 1 else str(Path(args.plot).with_name(Path(args.plot).stem + "_*.png"))
            where.append(f"plot{'s' if len(paths) > 1 else ''} to {plots}")
        tail = f"; {', '.join(where)}" if where else ""
        print(f"{len(paths)} input(s) on the {device.upper()} in {dt:.2f} s{tail}")
    return 0
