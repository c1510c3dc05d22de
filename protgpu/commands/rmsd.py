"""``protgpu rmsd`` and ``protgpu pairwise-rmsd``: RMSD after optimal superposition (QCP).

``protgpu rmsd INPUT... --ref REF [--select SEL] [--fit SEL] [--out FILE] [--superpose-out FILE] [--plot FIG]``
    RMSD of every frame of every input to one reference frame, Angstrom. ``--fit`` picks the atoms
    superposed on (default: ``--select``, else all), ``--select`` the atoms measured. ``--plot`` draws
    RMSD against frame, one line per input (against input, for many single-frame inputs).
``protgpu pairwise-rmsd INPUT... [--select SEL] [--out .npy|.npz|.zarr] [--plot map.png]``
    All-vs-all RMSD of the frames of all inputs (trajectories, multi-model files, or many
    single-structure files with the same atoms after selection), stacked in input order.

``--plot`` writes ``.png``, ``.svg`` or ``.pdf``.
``rmsd`` runs through the batch engine (:class:`protgpu.batch.RmsdJob`): a table ``--out`` (``.csv``,
``.jsonl``, ``.parquet``; columns input, frame, rmsd_angstrom) is journaled input by input, so
``--resume``, ``--shard`` and the Dask options apply. ``.npy`` (the RMSD vector) and ``.npz``
(rmsd, input, frame) are one piece over all frames: written after the last input, with a manifest but
no journal, so they take ``--shard`` (one file per shard) and ``--keep-going`` but not ``--resume``.
``--superpose-out`` keeps every aligned frame in this process until the end: it is refused with
``--resume``, ``--shard`` and the Dask options. ``pairwise-rmsd`` is one matrix over the frames of all
inputs: the engine parses the inputs (``-j``, ``--keep-going``: a failing input is left out of the
matrix), the matrix is written atomically (``.zarr``: into a temporary store that is then renamed),
then ``OUT.manifest.jsonl`` records each input's sha256, status and first row in the matrix.

Both plots are drawn by :mod:`protgpu.plotting`.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path

import numpy as np

from ..batch.inputs import expand_inputs
from ..batch.writers import OutputError
from ..errors import InputError, ProtgpuError
from ._batch_options import add_batch_options, check_table_out, job_device, late_device, report_failures, run_job
from ._cli_text import add_out, add_parser, cli_words, translate_failures

_RMSD_OUT = (".npy", ".npz", ".csv", ".jsonl", ".parquet")
_PAIR_OUT = (".npy", ".npz", ".zarr")


def register(sub, common) -> None:
    p = add_parser(
        sub, "rmsd", parents=common,
        help="RMSD of every frame to a reference after optimal superposition, Angstrom",
        description="RMSD of every frame of every input to one reference frame after optimal superposition "
                    "(QCP), Angstrom. --fit picks the atoms superposed on (default: --select, else all), "
                    "--select the atoms measured. Without --out, stdout is a table (input, frame, "
                    "rmsd_angstrom) and the summary goes to stderr.",
        example=[("protgpu rmsd traj.dcd --top top.pdb --ref ref.pdb --select ca > rmsd.tsv",
                  "CA RMSD of every frame, as a tab-separated table"),
                 ("protgpu rmsd models/*.pdb --ref native.pdb --fit ca --select heavy -o rmsd.csv",
                  "superpose on CA atoms, measure heavy atoms; a resumable table"),
                 ("protgpu rmsd traj.xtc -t top.pdb -r top.pdb --superpose-out aligned.xtc --plot rmsd.svg",
                  "keep the aligned frames and draw RMSD against frame")])
    add_out(p, ".csv, .jsonl or .parquet (rows input, frame, rmsd_angstrom; journaled, resumable), "
               ".npy (the RMSD vector) or .npz (rmsd, input, frame), written in one piece at the end")
    p.add_argument("--ref", "-r", required=True, help="reference structure (PDB/mmCIF, or a trajectory with --top)")
    p.add_argument("--ref-frame", type=int, default=0, help="frame (model) of the reference to use (default 0)")
    p.add_argument("--fit", "-f", default=None,
                   help="atoms to superpose on (default: --select, else all); --select then picks the atoms "
                        "measured, e.g. --fit ca --select heavy")
    p.add_argument("--top", "-t", help="topology file for trajectory inputs (PDB, mmCIF, ...)")
    p.add_argument("--superpose-out", metavar="FILE",
                   help="write every input frame moved onto the reference (.pdb, .xtc, .dcd, ...)")
    p.add_argument("--plot", metavar="FIGURE",
                   help="draw RMSD against frame as a line plot (.png, .svg or .pdf; needs matplotlib)")
    add_batch_options(p)
    p.set_defaults(func=run_rmsd)

    q = add_parser(
        sub, "pairwise-rmsd", parents=common,
        help="all-vs-all RMSD matrix of the frames of all inputs, Angstrom",
        description="All-vs-all RMSD after optimal superposition of the frames of all inputs (trajectories, "
                    "multi-model files, or many single-structure files with the same atoms after --select), "
                    "stacked in input order, Angstrom. Prints one summary line.",
        example=[("protgpu pairwise-rmsd traj.dcd --top top.pdb --select ca --out matrix.npy",
                  "the (frames, frames) matrix, streamed to disk tile by tile"),
                 ("protgpu pairwise-rmsd models/*.pdb -s ca --condensed -o rmsd.npz",
                  "pairs i < j of a set of models, with each row's input and frame"),
                 ("protgpu pairwise-rmsd a.dcd b.dcd -t top.pdb -s ca --plot rmsd.pdf",
                  "heat map of two trajectories, with lines between their frame blocks")])
    add_out(q, ".npy (streamed to disk tile by tile), .npz (rmsd, input, frame) or .zarr (streamed into a "
               "Zarr v3 store, needs zarr); OUT.manifest.jsonl records every input's sha256")
    q.add_argument("--top", "-t", help="topology file for trajectory inputs (PDB, mmCIF, ...)")
    q.add_argument("--precision", choices=("float64", "float32"), default="float64",
                   help="dtype of the GEMM of 3x3 blocks (default float64, exact to ~1e-6 Angstrom)")
    q.add_argument("--condensed", action="store_true",
                   help="store the condensed vector of pairs i < j (SciPy's squareform layout)")
    q.add_argument("--plot", metavar="FIGURE",
                   help="draw the matrix as a heat map (.png, .svg or .pdf; needs matplotlib)")
    g = q.add_argument_group("batch options")
    g.add_argument("--keep-going", "-k", action="store_true",
                   help="leave inputs that cannot be read (or have other atoms) out of the matrix, list them in "
                        "OUT.errors.tsv, exit 1")
    g.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="parse workers: processes for 32 inputs or more, threads for fewer (default: the CPUs "
                        "this process may use, at most 32)")
    g.add_argument("--gpus", metavar="all|N",
                   help="spread the matrix's tiles over the first N GPUs of this host (or all), one host thread "
                        "per GPU; needs a host result (--out .npy/.zarr/.npz, or none)")
    q.set_defaults(func=run_pairwise)


# --------------------------------------------------------------------------------------------------
# Shared


def _check_suffix(path: str | None, allowed: tuple[str, ...], option: str) -> None:
    if path and not path.lower().rstrip("/").endswith(allowed):
        raise InputError(f"{option} {path}: use a file name ending in {', '.join(allowed)}")


def load_coords(args, paths, command: str = "pairwise-rmsd"):
    """Every input's coordinates after ``--select``, parsed by the batch engine (worker processes,
    ``--keep-going``). An input whose atom count differs from the first readable input's fails like an
    unreadable one. Returns the coordinate arrays of the inputs kept, in input order, and one manifest
    entry per input (:func:`protgpu.batch.journal.write_run_record`). ``command`` names the subcommand
    in its notes (pairwise-rmsd and cluster share this loader)."""
    from .. import batch
    from ..batch import CoordinatesJob

    if args.jobs is not None and args.jobs < 1:
        raise InputError(f"--jobs {args.jobs}: need at least 1")
    got: dict = {}

    def note(msg: str) -> None:
        print(f"protgpu {command}: {msg}", file=sys.stderr)

    batch.run(paths, CoordinatesJob(select=args.select, top=args.top), keep_going=args.keep_going, jobs=args.jobs,
              progress=not args.quiet, quiet=args.quiet, description="loading", log=None if args.quiet else note,
              on_result=lambda r: got.__setitem__(r.index, r))
    coords, entries, first, row = [], [], None, 0
    for i in sorted(got):
        r = got[i]
        entry = {"input": r.input, "sha256": r.sha256}
        x = r.arrays.get("") if r.ok else None
        if x is not None and first is not None and x.shape[1] != first[1]:
            sel = f" after --select {args.select!r}" if args.select else ""
            why = f"{x.shape[1]} atoms{sel}, but {first[0]} has {first[1]}; inputs must have the same atoms"
            if not args.keep_going:
                raise InputError(f"{r.input}: {why}")
            x, r.error = None, why
        if x is None:
            entries.append({**entry, "status": "failed", "error": r.error})
            continue
        if first is None:
            first = (r.input, x.shape[1])
        entries.append({**entry, "status": "ok", "rows": [{"frames": int(x.shape[0]), "first_row": row}]})
        coords.append(x)
        row += x.shape[0]
    return coords, entries


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
        except (OSError, ValueError, KeyError) as exc:  # mdtraj names the temporary file: name the destination
            why = cli_words(str(exc).replace(tmp, path), "rmsd")
            raise InputError(f"--superpose-out {path}: mdtraj cannot write this format ({why})") from None


# --------------------------------------------------------------------------------------------------
# rmsd


def _without_out(args):
    """``args`` with no ``--out``: the engine then journals nothing and hands every row back."""
    import argparse

    return argparse.Namespace(**{**vars(args), "out": None})


def run_rmsd(args) -> int:
    from dataclasses import replace
    from pathlib import Path

    from ..batch import TABLE_SUFFIXES, RmsdJob, parse_shard, shard_path
    from ..batch.journal import write_run_record
    from ..io import load, save_array

    _check_suffix(args.out, _RMSD_OUT, "--out")
    if args.plot:
        from ..plotting import require_figure

        require_figure(args.plot)
    table = bool(args.out) and args.out.lower().endswith(TABLE_SUFFIXES)
    if args.resume and not table:
        what = f"; {args.out} is written in one piece at the end" if args.out else ""
        raise InputError(f"--resume needs a table --out (.csv, .jsonl or .parquet){what}")
    on_dask = any(getattr(args, k, None) is not None for k in ("scheduler", "workers", "gpus"))
    if args.superpose_out and (args.resume or args.shard or on_dask):
        raise InputError(f"--superpose-out {args.superpose_out}: needs every frame in this process; leave out "
                         "--resume, --shard and --scheduler/--workers/--gpus")
    if table:
        check_table_out(args.out)
    paths = expand_inputs(args.inputs)
    device = late_device(args)  # auto: decided by the job's warm-up, after the parse workers started
    ref = load(args.ref, top=args.top)
    if not -ref.n_frames <= args.ref_frame < ref.n_frames:
        raise InputError(f"--ref-frame {args.ref_frame}: {args.ref} has {ref.n_frames} frame(s)")
    ref = ref.frames(args.ref_frame)
    fit = args.fit or args.select
    measure = args.select if args.fit else None
    job = RmsdJob(ref, reference_name=args.ref, fit=fit, atoms=measure, top=args.top, ref_frame=args.ref_frame,
                  keep_aligned=bool(args.superpose_out), device=device)
    outcomes: dict = {}  # index -> InputResult, for the record of a one-piece output
    summary = run_job(args if table else _without_out(args), job, paths, description="rmsd",
                      on_result=lambda r: outcomes.__setitem__(r.index, r))
    runs_on = job_device(args)[1]
    rows = summary.rows
    by_input: dict[str, list] = {}
    for row in rows:
        v = row["rmsd_angstrom"]
        by_input.setdefault(row["input"], []).append(np.nan if v is None else v)
    ok_paths = list(by_input)
    values = [np.array(v, dtype=np.float64) for v in by_input.values()]
    r = np.concatenate(values) if values else np.empty(0)
    if args.superpose_out:
        kept = [job.aligned[p] for p in ok_paths if p in job.aligned]
        if kept:
            _write_structures(args.superpose_out, [s for s, _ in kept], [c for _, c in kept])
    if args.out and not table:
        dest = str(shard_path(args.out, *parse_shard(args.shard))) if args.shard else args.out
        if dest.lower().endswith(".npy"):
            save_array(dest, r)
        else:
            save_array(dest, {"rmsd": r, "input": np.array([row["input"] for row in rows], dtype=str),
                              "frame": np.array([row["frame"] for row in rows], dtype=np.int64)})
        entries = [{"input": x.input, "sha256": x.sha256, "status": x.status, "error": x.error, "rows": x.rows}
                   for _, x in sorted(outcomes.items())]
        manifest, errors = write_run_record(dest, job.name, job.options(), entries)
        summary = replace(summary, out=Path(dest), manifest=manifest, errors=errors)
    elif not args.out and not args.quiet:
        print("input\tframe\trmsd_angstrom")
        for row, v in zip(rows, r.tolist(), strict=True):
            print(f"{row['input']}\t{row['frame']}\t{v:.4f}")
    if args.plot and values:
        _plot_rmsd(args, ok_paths, values)
    if not args.quiet:
        where = f" to {summary.out}" if summary.out else ""
        where += f", plot {args.plot}" if args.plot and values else ""
        resumed = f" ({summary.n_resumed} resumed)" if summary.n_resumed else ""
        stats = f": mean RMSD {np.nanmean(r):.3f} A, max {np.nanmax(r):.3f} A," if r.size else ""
        print(f"{len(r)} frame(s) of {summary.n_ok} input(s){resumed} vs {args.ref} frame {args.ref_frame}{stats} "
              f"on the {runs_on} in {summary.elapsed_s:.2f} s{where}", file=sys.stderr)
    report_failures(translate_failures(summary, "rmsd"), "rmsd")
    return summary.exit_code


def _plot_rmsd(args, paths, values) -> None:
    """RMSD to the reference against frame: one line per input, or one line across the inputs when
    each holds a single frame (a folder of models)."""
    from ..plotting import line_plot

    names = [os.path.basename(p) for p in paths]
    ref = f"{os.path.basename(args.ref)} frame {args.ref_frame}"
    fit, measure = args.fit or args.select, args.select if args.fit else None
    atoms = (f"; fit {fit}" if fit else "") + (f", measured {measure}" if measure else "")
    ylabel = "RMSD (Å)"
    if len(values) > 1 and all(len(v) == 1 for v in values):
        r = np.concatenate(values)
        line_plot(r, args.plot, xticklabels=names, lines=False, xlabel="input", ylabel=ylabel,
                  title=f"RMSD of {len(r)} inputs to {ref}{atoms}")
        return
    longest = max(len(v) for v in values)
    series = np.full((len(values), longest), np.nan)  # NaN-padded: inputs may have different lengths
    for i, v in enumerate(values):
        series[i, : len(v)] = v
    title = f"RMSD of {names[0]} to {ref}{atoms}" if len(values) == 1 else f"RMSD to {ref}{atoms}"
    line_plot(series, args.plot, names=names, xlabel="frame index", ylabel=ylabel, title=title)


# --------------------------------------------------------------------------------------------------
# pairwise-rmsd


def _plot_pairwise(path: str, matrix, labels_note: str, inputs: list[tuple[str, int]] = ()) -> None:
    """Heat map of the RMSD matrix (rows and columns: frames in input order); with several
    ``inputs`` ((name, frames) each, in order) lines part their blocks of frames and name them."""
    from ..plotting import heatmap

    m = np.asarray(matrix)
    # Every step-th frame past 2000 per side: a figure has no more pixels than that, and the ticks
    # keep the true frame indices.
    step = max(1, int(np.ceil(m.shape[0] / 2000)))
    index = np.arange(0, m.shape[0], step)
    blocks = None
    if len(inputs) > 1:
        starts = np.cumsum([0] + [n for _, n in inputs])
        # a block's first drawn row: the first multiple of step at or after its first frame
        drawn = -(-starts // step)
        blocks = [(os.path.basename(name), int(a), int(b)) for (name, _), a, b in zip(inputs, drawn[:-1], drawn[1:],
                                                                                        strict=True)]
    heatmap(m[::step, ::step], path, xlabels=index, ylabels=index, title=f"pairwise RMSD ({labels_note})",
            xlabel="frame index", ylabel="frame index", cbar_label="RMSD (Å)", vmin=0.0, max_ticks=12,
            blocks=blocks)


def _gpus(args):
    """``--gpus`` as pairwise_rmsd's ``devices=``: None (the current GPU), "all", or a count."""
    value = getattr(args, "gpus", None)
    if value is None or value == "all":
        return value
    try:
        n = int(value)
    except ValueError:
        raise InputError(f"--gpus {value!r}: use all or a number") from None
    if n < 1:
        raise InputError(f"--gpus {value}: use all or a number >= 1")
    return n


def _reserve_disk(path: str) -> None:
    """Claim a memory-mapped output's disk blocks before writing through the map: on a full disk a
    write into a sparse file's hole kills the process with SIGBUS, while allocating fails with ENOSPC."""
    if not hasattr(os, "posix_fallocate"):
        return
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a filesystem without fallocate: go on
            raise
    finally:
        os.close(fd)


def run_pairwise(args) -> int:
    from .._array import dispatch
    from ..batch.journal import OutputLock, write_run_record
    from ..batch.writers import require_zarr
    from ..io import atomic_path, remove_stale_temps, save_array
    from ..superpose import pairwise_rmsd

    _check_suffix(args.out, _PAIR_OUT, "--out")
    low_out = (args.out or "").lower().rstrip("/")
    if args.plot:
        from ..plotting import require_figure

        require_figure(args.plot)
    zarr = require_zarr(args.out) if low_out.endswith(".zarr") else None
    if args.device != "auto":
        dispatch(device=args.device)  # a forced device is checked before any input is read
    paths = expand_inputs(args.inputs)
    parts, entries = load_coords(args, paths)
    # auto is decided once the inputs are loaded: deciding it first would import CuPy, and a process
    # that has loaded CuPy starts its loading workers from a forkserver instead of forking them.
    device = dispatch(device=args.device).device
    failed = sum(e["status"] != "ok" for e in entries)
    if not parts:  # --keep-going and nothing readable: say why in the errors file, make no matrix
        if args.out:
            write_run_record(args.out, "pairwise-rmsd", _pairwise_options(args), entries)
        raise InputError(f"none of the {len(entries)} input(s) could be used" +
                         (f"; see {args.out}.errors.tsv" if args.out else ""))
    labels_in = np.array([e["input"] for e in entries if e["status"] == "ok" for _ in range(e["rows"][0]["frames"])],
                         dtype=str)
    frames = np.concatenate([np.arange(x.shape[0], dtype=np.int64) for x in parts])
    coords = np.concatenate(parts) if len(parts) > 1 else parts[0]
    del parts
    n = coords.shape[0]
    shape = (n * (n - 1) // 2,) if args.condensed else (n, n)
    t0 = time.perf_counter()
    low = low_out
    result = None
    # a second run on the same --out stops here, before it touches anything of the first one's
    lock = OutputLock(Path(args.out.rstrip("/"))) if args.out else None
    if lock is not None:
        lock.acquire()
    try:
        remove_stale_temps(args.out)  # what a killed earlier run left beside the output (a full-size .npy, say)
        try:
            if low.endswith(".npy"):
                # Stream tile by tile into a memory-mapped .npy beside the destination, then rename it.
                with atomic_path(args.out) as tmp:
                    mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
                    _reserve_disk(tmp)
                    pairwise_rmsd(coords, out=mm, precision=args.precision, condensed=args.condensed, device=device,
                                  devices=_gpus(args))
                    mm.flush()
                    del mm
                result = np.load(args.out, mmap_mode="r")
            elif low.endswith(".zarr"):
                # Streamed tile by tile into a store in a temporary folder, which then takes the name.
                dest = args.out.rstrip("/")
                rows = min(shape[0], max(1, (1 << 22) // (4 * (shape[1] if len(shape) > 1 else 1))))  # ~4 MiB chunks
                with atomic_path(dest, directory=True) as tmp:
                    z = zarr.open_array(tmp, mode="w", shape=shape, chunks=(rows, *shape[1:]), dtype=np.float32)
                    z.attrs.update({"units": "angstrom", "condensed": bool(args.condensed),
                                    "inputs": [e["input"] for e in entries if e["status"] == "ok"],
                                    "frames": [e["rows"][0]["frames"] for e in entries if e["status"] == "ok"]})
                    pairwise_rmsd(coords, out=z, precision=args.precision, condensed=args.condensed, device=device,
                                  devices=_gpus(args))
                result = zarr.open_array(dest, mode="r")
            else:
                result = pairwise_rmsd(coords, precision=args.precision, condensed=args.condensed, device=device,
                                       devices=_gpus(args))
                if low.endswith(".npz"):
                    save_array(args.out, {"rmsd": result, "input": labels_in, "frame": frames})
        except OSError as exc:
            if isinstance(exc, ProtgpuError):
                raise
            # a full disk, a permission: one line; atomic_path has removed the temporary
            raise OutputError(f"--out {args.out}: cannot write ({exc.strerror or exc}); "
                              "no output was written") from None
        dt = time.perf_counter() - t0
        errors = (write_run_record(args.out, "pairwise-rmsd", _pairwise_options(args), entries)[1]
                  if args.out else None)
    finally:
        if lock is not None:
            lock.release()
    if args.plot:
        mat = np.asarray(result[:])
        if args.condensed:
            from scipy.spatial.distance import squareform

            mat = squareform(mat, checks=False)
        sel = f"{args.select}, " if args.select else ""
        _plot_pairwise(args.plot, mat, f"{sel}{n} frames",
                       [(e["input"], e["rows"][0]["frames"]) for e in entries if e["status"] == "ok"])
    if not args.quiet:
        sample = np.asarray(result[: min(result.shape[0], 2048)])  # a zarr array has no len()
        vals = sample if args.condensed else sample[np.triu_indices(sample.shape[0], 1, sample.shape[1])]
        summary = (f"; off-diagonal RMSD (first rows) {vals.min():.3f}..{vals.max():.3f} A, mean {vals.mean():.3f}"
                   if vals.size else "")
        where = f" to {args.out}" if args.out else ""
        print(f"{n} frames x {coords.shape[1]} atoms -> {'condensed ' if args.condensed else ''}{shape} float32 "
              f"on the {device.upper()} in {dt:.2f} s{where}{summary}")
    if failed:
        if errors is not None:
            print(f"protgpu pairwise-rmsd: {failed} input(s) left out; see {errors}", file=sys.stderr)
        else:
            for e in entries:
                if e["status"] != "ok":
                    why = cli_words(str(e["error"]), "pairwise-rmsd")
                    print(f"protgpu pairwise-rmsd: {e['input']}: {why} (left out)", file=sys.stderr)
        return 1
    return 0


def _pairwise_options(args) -> dict:
    return {"select": args.select, "top": args.top, "precision": args.precision, "condensed": bool(args.condensed)}
