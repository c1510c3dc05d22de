"""``protgpu cluster``: cluster the frames of all inputs by RMSD after superposition.

``protgpu cluster INPUT... --method gromos --cutoff 2.0 [--select ca] [--metric rmsd|tm]
--out clusters.csv [--representatives reps.pdb] [--plot fig.png]``

One clustering over the frames of all inputs, stacked in input order (as ``protgpu pairwise-rmsd``: the
engine parses the inputs, ``-j`` and ``--keep-going`` apply). ``--out`` is a table (``.csv``, ``.jsonl``,
``.parquet``) with one row per frame: input, frame, cluster (0-based), representative. ``--representatives``
writes each cluster's representative frame as one model (frame) per cluster, in cluster order.
``--plot`` draws the cluster of every frame against the frame index with the cluster sizes (GROMOS and
k-medoids), or the dendrogram (hierarchical). The work is :class:`protgpu.batch.jobs.cluster.ClusterRun`.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ..batch.inputs import expand_inputs
from ..errors import InputError
from ._cli_text import add_out, add_parser, cli_words

_TABLE_OUT = (".csv", ".jsonl", ".parquet")


def register(sub, common) -> None:
    p = add_parser(
        sub, "cluster", parents=common,
        help="cluster the frames of all inputs by RMSD (GROMOS, k-medoids, hierarchical)",
        description="Cluster the frames of all inputs (stacked in input order) by RMSD after optimal "
                    "superposition, without holding the frames x frames matrix for GROMOS and k-medoids. "
                    "Prints one summary line.",
        example=[("protgpu cluster traj.dcd -t top.pdb -s ca --method gromos --cutoff 2.0 -o clusters.csv",
                  "GROMOS clusters at 2 Angstrom, one row per frame"),
                 ("protgpu cluster models/*.pdb -s ca --method kmedoids --k 10 --representatives reps.pdb",
                  "ten k-medoids clusters of a set of models and their medoids as a multi-model PDB"),
                 ("protgpu cluster traj.xtc -t top.pdb -s ca --method hierarchical --linkage average --k 5 "
                  "--plot tree.png", "average-linkage clusters and their dendrogram")])
    add_out(p, ".csv, .jsonl or .parquet (rows input, frame, cluster, representative)")
    p.add_argument("--top", "-t", help="topology file for trajectory inputs (PDB, mmCIF, ...)")
    p.add_argument("--method", "-m", choices=("gromos", "kmedoids", "hierarchical"), default="gromos",
                   help="GROMOS (Daura et al. 1999, needs --cutoff), k-medoids (FasterPAM, needs --k) or "
                        "hierarchical (--linkage, cut at --cutoff or into --k clusters); default gromos")
    p.add_argument("--metric", choices=("rmsd", "tm"), default="rmsd",
                   help="distance between frames: RMSD after superposition (default), or 1 - TM-score of frames "
                        "with the same residues (needs --select ca; O(frames^2) TM-score searches)")
    p.add_argument("--cutoff", "-c", type=float,
                   help="GROMOS neighbours: distance < cutoff (Angstrom for RMSD; 1 - TM-score for --metric tm)")
    p.add_argument("--k", type=int, help="number of clusters (k-medoids, hierarchical)")
    p.add_argument("--linkage", choices=("single", "complete", "average"), default="average",
                   help="hierarchical linkage (default average)")
    p.add_argument("--seed", type=int, default=0, help="k-medoids seeding (default 0)")
    p.add_argument("--precision", choices=("float64", "float32"), default="float64",
                   help="dtype of the RMSD's GEMM (default float64)")
    p.add_argument("--representatives", metavar="FILE",
                   help="write each cluster's representative frame (.pdb, .cif, .xtc, .dcd, ...)")
    p.add_argument("--plot", metavar="FIGURE",
                   help="cluster of each frame and cluster sizes, or the dendrogram for --method hierarchical "
                        "(.png, .svg or .pdf; needs matplotlib)")
    g = p.add_argument_group("batch options")
    g.add_argument("--keep-going", "-k", action="store_true",
                   help="leave inputs that cannot be read (or have other atoms) out, list them, exit 1")
    g.add_argument("--jobs", "-j", type=int, metavar="N", help="parse workers (default: the CPUs, at most 32)")
    p.set_defaults(func=run)


def run(args) -> int:
    from .._array import dispatch
    from ..batch.jobs.cluster import ClusterRun
    from ..batch.writers import write_table
    from .rmsd import load_coords

    if args.out and not args.out.lower().endswith(_TABLE_OUT):
        raise InputError(f"--out {args.out}: use a file name ending in {', '.join(_TABLE_OUT)}")
    if args.representatives:
        from ..io.formats import WRITABLE_EXTENSIONS, split_ext

        if split_ext(args.representatives)[0] not in WRITABLE_EXTENSIONS:  # refused before any work
            raise InputError(f"--representatives {args.representatives}: use a file name ending in "
                             f"{', '.join(WRITABLE_EXTENSIONS)}")
    if args.plot:
        from ..plotting import require_figure

        require_figure(args.plot)
    if args.metric == "tm" and (args.select or "").strip().lower() != "ca":
        raise InputError("--metric tm: add --select ca (the TM-score takes one CA atom per residue)")
    job = ClusterRun(method=args.method, metric=args.metric, cutoff=args.cutoff, k=args.k, linkage=args.linkage,
                     seed=args.seed, precision=args.precision, device=args.device)
    job.check()
    if args.device != "auto":
        dispatch(device=args.device)
    paths = expand_inputs(args.inputs)
    parts, entries = load_coords(args, paths, "cluster")
    if not parts:
        raise InputError(f"none of the {len(entries)} input(s) could be used")
    job.device = dispatch(device=args.device).device
    coords = np.concatenate(parts) if len(parts) > 1 else parts[0]
    del parts
    t0 = time.perf_counter()
    res = job.run(coords)
    dt = time.perf_counter() - t0
    names, frames = job.frame_index(entries)
    labels, medoids, sizes = (np.asarray(getattr(res, f)) for f in ("labels", "medoids", "sizes"))
    rows = job.rows(names, frames, labels, medoids)
    if args.out:
        write_table(args.out, rows, ["input", "frame", "cluster", "representative"])
    if args.representatives:
        from ..io import save

        save(job.representatives(names, frames, medoids, select=args.select, top=args.top), args.representatives)
    if args.plot:
        _plot(args, labels, sizes, res.linkage, coords.shape[0])
    if not args.out and not args.quiet:
        print("input\tframe\tcluster\trepresentative")
        for r in rows:
            print(f"{r['input']}\t{r['frame']}\t{r['cluster']}\t{int(r['representative'])}")
    if not args.quiet:
        where = f" to {args.out}" if args.out else ""
        print(f"{coords.shape[0]} frames x {coords.shape[1]} atoms -> {len(sizes)} clusters ({args.method}; "
              f"largest {int(sizes.max())} frames) on the {job.device.upper()} in {dt:.2f} s{where}",
              file=sys.stderr if not args.out else sys.stdout)
    failed = [e for e in entries if e["status"] != "ok"]
    for e in failed:
        print(f"protgpu cluster: {e['input']}: {cli_words(str(e['error']), 'cluster')} (left out)", file=sys.stderr)
    return 1 if failed else 0


def _plot(args, labels, sizes, linkage, n: int) -> None:
    from ..plotting import cluster_sizes_plot, dendrogram_plot

    what = f"{args.select + ', ' if args.select else ''}{n} frames"
    if linkage is not None:
        dendrogram_plot(linkage, args.plot, title=f"{args.linkage} linkage ({what})")
    else:
        cluster_sizes_plot(labels, sizes, args.plot, title=f"{args.method} clusters ({what})")
