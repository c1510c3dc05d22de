"""``protgpu rmsd`` and ``protgpu pairwise-rmsd``: RMSD after optimal superposition (QCP).

``protgpu rmsd INPUT... --ref REF [--select SEL] [--fit SEL] [--out FILE] [--superpose-out FILE]``
    RMSD of every frame of every input to one reference frame, Angstrom. ``--fit`` picks the atoms
    superposed on (default: ``--select``, else all), ``--select`` the atoms measured.
``protgpu pairwise-rmsd INPUT... [--select SEL] [--out .npy|.npz|.zarr] [--plot heatmap.png]``
    All-vs-all RMSD of the frames of all inputs (trajectories, multi-model files, or many
    single-structure files with the same atoms after selection), stacked in input order.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import numpy as np

from ..errors import InputError
from ._inputs import expand_inputs
from ._progress import progress

_RMSD_OUT = (".npy", ".npz", ".csv")
_PAIR_OUT = (".npy", ".npz", ".zarr")


def register(sub, common) -> None:
    p = sub.add_parser("rmsd", parents=common,
                       help="RMSD of every frame to a reference after optimal superposition, Angstrom")
    p.add_argument("--ref", "-r", required=True, help="reference structure (PDB/mmCIF, or a trajectory with --top)")
    p.add_argument("--ref-frame", type=int, default=0, help="frame (model) of the reference to use (default 0)")
    p.add_argument("--fit", "-f", default=None,
                   help="atoms to superpose on (default: --select, else all); --select then picks the atoms "
                        "measured, e.g. --fit ca --select heavy")
    p.add_argument("--top", "-t", help="topology file for trajectory inputs (PDB, mmCIF, ...)")
    p.add_argument("--superpose-out", metavar="FILE",
                   help="write every input frame moved onto the reference (.pdb, .xtc, .dcd, ...)")
    p.epilog = "--out: .npy (the RMSD vector), .npz (rmsd, input, frame) or .csv"
    p.set_defaults(func=run_rmsd)

    q = sub.add_parser("pairwise-rmsd", parents=common,
                       help="all-vs-all RMSD matrix of the frames of all inputs, Angstrom")
    q.add_argument("--top", "-t", help="topology file for trajectory inputs (PDB, mmCIF, ...)")
    q.add_argument("--precision", choices=("float64", "float32"), default="float64",
                   help="dtype of the GEMM of 3x3 blocks (default float64, exact to ~1e-6 Angstrom)")
    q.add_argument("--condensed", action="store_true",
                   help="store the condensed vector of pairs i < j (SciPy's squareform layout)")
    q.add_argument("--plot", metavar="PNG", help="draw the matrix as a heat map (needs matplotlib)")
    q.epilog = ("--out: .npy (streamed to disk tile by tile), .npz (matrix + frame labels) or .zarr "
                "(needs zarr)")
    q.set_defaults(func=run_pairwise)


# --------------------------------------------------------------------------------------------------
# Shared


def _check_suffix(path: str | None, allowed: tuple[str, ...], option: str) -> None:
    if path and not path.lower().rstrip("/").endswith(allowed):
        raise InputError(f"{option} {path}: use a file name ending in {', '.join(allowed)}")


def _load_all(paths, top, select, quiet, what):
    """Load every input, apply ``select`` to each, and check that all have the same atom count.
    Returns the Structures and per-frame labels (input path, frame)."""
    from ..io import load

    structures, labels_in, labels_fr = [], [], []
    n_atoms = None
    first = None
    for path in progress(paths, description=what, quiet=quiet):
        s = load(path, top=top)
        if select:
            s = s.select(select)
        if n_atoms is None:
            n_atoms, first = s.n_atoms, path
        elif s.n_atoms != n_atoms:
            sel = f" after --select {select!r}" if select else ""
            raise InputError(f"{path}: {s.n_atoms} atoms{sel}, but {first} has {n_atoms}; inputs must have "
                             "the same atoms")
        structures.append(s)
        labels_in.extend([path] * s.n_frames)
        labels_fr.extend(range(s.n_frames))
    return structures, np.array(labels_in), np.array(labels_fr, dtype=np.int64)


def _mdtraj_topology(atoms):
    """An mdtraj Topology for an AtomTable (to write PDB/XTC/DCD through mdtraj)."""
    import mdtraj as md

    top = md.Topology()
    chains: dict = {}
    residue = None
    last_key = None
    for i in range(len(atoms)):
        ch = str(atoms.chain[i])
        if ch not in chains:
            chains[ch] = top.add_chain(chain_id=ch or None)
        key = (ch, int(atoms.residue_index[i]))
        if key != last_key:
            residue = top.add_residue(str(atoms.resname[i]), chains[ch], resSeq=int(atoms.resid[i]),
                                      segment_id=str(atoms.segid[i]))
            last_key = key
        try:
            el = md.element.get_by_symbol(str(atoms.element[i]).capitalize())
        except KeyError:
            el = md.element.virtual
        top.add_atom(str(atoms.name[i]), el, residue)
    return top


def _write_structures(path: str, structures, coords_list) -> None:
    """Write aligned frames (Angstrom) of Structures with equal atoms to one file, atomically."""
    import mdtraj as md

    from ..io import atomic_path

    atoms = structures[0].atoms
    if any(s.n_atoms != structures[0].n_atoms for s in structures):
        raise InputError(f"--superpose-out {path}: the inputs have different atom counts; write one input "
                         "at a time")
    xyz = np.concatenate([np.asarray(c, dtype=np.float32) for c in coords_list]) / np.float32(10.0)
    traj = md.Trajectory(xyz, _mdtraj_topology(atoms))
    with atomic_path(path) as tmp:
        try:
            traj.save(tmp)
        except (OSError, ValueError, KeyError) as exc:
            raise InputError(f"--superpose-out {path}: mdtraj cannot write this format ({exc})") from None


# --------------------------------------------------------------------------------------------------
# rmsd


def run_rmsd(args) -> int:
    from .._array import dispatch
    from ..io import load, save_array
    from ..superpose import rmsd, superpose

    _check_suffix(args.out, _RMSD_OUT, "--out")
    paths = expand_inputs(args.inputs)
    device = dispatch(device=args.device).device
    ref = load(args.ref, top=args.top)
    if not -ref.n_frames <= args.ref_frame < ref.n_frames:
        raise InputError(f"--ref-frame {args.ref_frame}: {args.ref} has {ref.n_frames} frame(s)")
    ref = ref.frames(args.ref_frame)
    fit = args.fit or args.select
    measure = args.select if args.fit else None
    t0 = time.perf_counter()
    values, labels_in, labels_fr, structures, aligned = [], [], [], [], []
    for path in progress(paths, description="rmsd", quiet=args.quiet):
        s = load(path, top=args.top)
        if args.superpose_out:
            res = superpose(s, ref, fit=fit, atoms=measure, device=device)
            r = res.rmsd
            structures.append(s)
            aligned.append(res.coords)
        else:
            r = rmsd(s, ref, fit=fit, atoms=measure, device=device)
        values.append(np.asarray(r))
        labels_in.extend([path] * s.n_frames)
        labels_fr.extend(range(s.n_frames))
    r = np.concatenate(values)
    frames = np.array(labels_fr, dtype=np.int64)
    if args.superpose_out:
        _write_structures(args.superpose_out, structures, aligned)
    if args.out:
        low = args.out.lower()
        if low.endswith(".npy"):
            save_array(args.out, r)
        elif low.endswith(".npz"):
            save_array(args.out, {"rmsd": r, "input": np.array(labels_in), "frame": frames})
        else:
            from ..io import write_atomic

            def write_csv(tmp):
                with open(tmp, "w") as fh:
                    fh.write("input,frame,rmsd_angstrom\n")
                    for p, f, v in zip(labels_in, frames, r, strict=True):
                        fh.write(f"{p},{f},{v:.6f}\n")

            write_atomic(args.out, write_csv)
    elif not args.quiet:
        for p, f, v in zip(labels_in, frames, r, strict=True):
            print(f"{p}\t{f}\t{v:.4f}")
    if not args.quiet:
        dt = time.perf_counter() - t0
        where = f" to {args.out}" if args.out else ""
        print(f"{len(r)} frame(s) of {len(paths)} input(s) vs {args.ref} frame {args.ref_frame}: mean RMSD "
              f"{r.mean():.3f} A, max {r.max():.3f} A, on the {device.upper()} in {dt:.2f} s{where}",
              file=sys.stderr)
    return 0


# --------------------------------------------------------------------------------------------------
# pairwise-rmsd


def _plot(path: str, matrix, labels_note: str) -> None:
    """Heat map of the RMSD matrix (rows/columns = frames), Agg backend, atomically written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io import atomic_path

    m = np.asarray(matrix)
    step = max(1, int(np.ceil(m.shape[0] / 2000)))  # a screen has no more pixels than this
    shown = m[::step, ::step]
    fig, ax = plt.subplots(figsize=(6.4, 5.4), dpi=150)
    im = ax.imshow(shown, cmap="viridis", interpolation="nearest", origin="upper",
                   extent=(-0.5, m.shape[1] - 0.5, m.shape[0] - 0.5, -0.5))
    ax.set_xlabel("frame")
    ax.set_ylabel("frame")
    ax.set_title(f"pairwise RMSD ({labels_note})", fontsize=9)
    cb = fig.colorbar(im, ax=ax)
    cb.set_label("RMSD (Å)")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def _require_zarr(dest: str):
    try:
        import zarr
    except ImportError:
        raise InputError(f"--out {dest}: writing .zarr needs the zarr package (pip install zarr)") from None
    return zarr


def _zarr_array(path: str, shape, dtype):
    import zarr
    chunks = (min(shape[0], 4096),) if len(shape) == 1 else (min(shape[0], 1024), min(shape[1], 1024))
    return zarr.open(path, mode="w", shape=shape, chunks=chunks, dtype=dtype)


def run_pairwise(args) -> int:
    from .._array import dispatch
    from ..io import save_array
    from ..superpose import pairwise_rmsd

    _check_suffix(args.out, _PAIR_OUT, "--out")
    low_out = (args.out or "").lower().rstrip("/")
    if args.plot:
        if not args.plot.lower().endswith(".png"):
            raise InputError(f"--plot {args.plot}: use a .png file name")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise InputError("--plot needs matplotlib: pip install matplotlib") from None
    if low_out.endswith(".zarr"):
        _require_zarr(args.out)
    paths = expand_inputs(args.inputs)
    device = dispatch(device=args.device).device
    structures, labels_in, frames = _load_all(paths, args.top, args.select, args.quiet, "loading")
    coords = np.concatenate([s.coords for s in structures]) if len(structures) > 1 else structures[0].coords
    n = coords.shape[0]
    shape = (n * (n - 1) // 2,) if args.condensed else (n, n)
    t0 = time.perf_counter()
    low = low_out
    result = None
    if low.endswith(".npy"):
        # Stream tile by tile into a memory-mapped .npy beside the destination, then rename it.
        dest = args.out
        directory = os.path.dirname(os.path.abspath(dest))
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(dest)}.", suffix=".tmp.npy")
        os.close(fd)
        try:
            mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
            pairwise_rmsd(coords, out=mm, precision=args.precision, condensed=args.condensed, device=device)
            mm.flush()
            result = mm
            os.replace(tmp, dest)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    elif low.endswith(".zarr"):
        dest = args.out.rstrip("/")
        tmp = f"{dest}.tmp{os.getpid()}"
        z = _zarr_array(tmp, shape, np.float32)
        try:
            pairwise_rmsd(coords, out=z, precision=args.precision, condensed=args.condensed, device=device)
            if os.path.isdir(dest):
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        result = z
    else:
        result = pairwise_rmsd(coords, precision=args.precision, condensed=args.condensed, device=device)
        if low.endswith(".npz"):
            save_array(args.out, {"rmsd": result, "input": labels_in, "frame": frames})
    dt = time.perf_counter() - t0
    if args.plot:
        mat = np.asarray(result[:])
        if args.condensed:
            from scipy.spatial.distance import squareform

            mat = squareform(mat, checks=False)
        sel = f"{args.select}, " if args.select else ""
        _plot(args.plot, mat, f"{sel}{n} frames")
    if not args.quiet:
        sample = np.asarray(result[: min(len(result), 2048)])
        vals = sample if args.condensed else sample[np.triu_indices(sample.shape[0], 1, sample.shape[1])]
        summary = (f"; off-diagonal RMSD (first rows) {vals.min():.3f}..{vals.max():.3f} A, mean {vals.mean():.3f}"
                   if vals.size else "")
        where = f" to {args.out}" if args.out else ""
        print(f"{n} frames x {coords.shape[1]} atoms -> {'condensed ' if args.condensed else ''}{shape} float32 "
              f"on the {device.upper()} in {dt:.2f} s{where}{summary}")
    return 0
