"""``protgpu contacts INPUT... [--scheme] [--cutoff] [--frequency] [--out maps.npz] [--plot map.png|.svg|.pdf]``:
residue contact maps per input, with a short summary and an optional heatmap.

Inputs run through the batch engine (:mod:`protgpu.batch`, job :class:`protgpu.batch.ContactsJob`):
parsed in worker processes, journaled beside ``--out`` (``OUT.manifest.jsonl``) so that ``--resume``
picks up a killed run, with ``--keep-going``, ``--shard`` and the Dask options. The ``.npz`` holds
``<stem>/<name>`` arrays per input (stems made unique) plus ``inputs``; a run of one input (no
``--shard``) keeps the plain names (``distances``, ``frequency``, ...). ``--plot`` draws one heatmap
per input where the map is computed (on the Dask workers with ``--scheduler``), and not again for
inputs that ``--resume`` skips.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import numpy as np

from ..batch.inputs import expand_inputs
from ..errors import InputError
from ._batch_options import add_batch_options, job_device, late_device, report_failures, run_job
from ._cli_text import add_out, add_parser, cli_words, translate_failures


def register(sub, common) -> None:
    from ..contacts import SCHEMES

    p = add_parser(
        sub, "contacts", parents=common,
        help="residue contact maps and contact frequencies (mdtraj's schemes; Angstrom)",
        description="Residue-pair distances under a scheme, contacts below a cutoff and, over frames, "
                    "the fraction of frames in contact. --select picks the residues of the map (those "
                    "with a selected atom); by default every residue with a CA atom. Prints a table of "
                    "one summary row per input.",
        example=[("protgpu contacts datasets/adk_open.pdb --out adk_contacts.npz --plot map.png",
                  "contact map of one structure, and its distance map as a figure"),
                 ("protgpu contacts traj.dcd --top top.pdb --frequency --cutoff 8 --scheme ca -o freq.npz",
                  "fraction of frames with each CA pair closer than 8 A"),
                 ("protgpu contacts models/ -s 'chain A' --plot maps.svg",
                  "one map per model of chain A's residues, maps_<stem>.svg each")])
    add_out(p, ".npz (per input: distances, contacts, frequency, residue labels; plain names for one input)")
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
    p.add_argument("--plot", metavar="FIGURE",
                   help="write a heatmap, .png, .svg or .pdf (frequency map over frames, distance map for one "
                        "frame); several inputs: one figure each, FIGURE_<stem>.<suffix>")
    add_batch_options(p)
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
        # Colours span 0..4 x cutoff, where contacts are told apart; the colour bar's arrow says that
        # longer distances are drawn in the last colour, and a line on it marks the cutoff.
        d = np.asarray(cm.distances[0], dtype=np.float64)
        heatmap(d, path, xlabels=ticks, title=f"{name}: residue distances ({cm.scheme})", xlabel="residue",
                ylabel="residue", cbar_label="distance (Å)", vmin=0.0, vmax=4 * cm.cutoff, cmap="viridis_r",
                cbar_marks={cm.cutoff: f"cutoff {cm.cutoff:g} Å"})


def _draw(targets: dict, path: str, cm) -> None:
    """ContactsJob's ``on_map``: the heatmap of one input, to its figure (module level: picklable)."""
    target = targets.get(path)
    if target:
        _plot(cm, target)


def _bare_single_input(out: str) -> None:
    """Rewrite the engine's ``<stem>/<name>`` .npz of one input with the plain names (the layout a
    one-input run has always had), atomically, in the engine's deterministic .npz format."""
    from ..batch.writers import write_npz, write_output

    with np.load(out) as z:
        arrays = {k: z[k] for k in z.files}
    stems = {k.split("/", 1)[0] for k in arrays if "/" in k}
    if len(stems) != 1:
        return
    prefix = f"{stems.pop()}/"
    items = [(k[len(prefix):] if k.startswith(prefix) else k, a) for k, a in arrays.items()]
    write_output(out, lambda tmp: write_npz(tmp, items))


def run(args) -> int:
    from ..batch import ContactsJob
    from ..batch.writers import stem_keys

    if args.out and not args.out.endswith(".npz"):
        raise InputError(f"--out {args.out}: contact maps are several arrays; use a .npz file name")
    if args.plot:
        from ..plotting import require_figure

        require_figure(args.plot)
    paths = expand_inputs(args.inputs)
    device = late_device(args)  # auto: decided by the job's warm-up, after the parse workers started
    targets: dict[str, str] = {}
    if args.plot:
        # one figure per input, named by the same unique stems as the .npz entries
        p = Path(args.plot)
        targets = ({paths[0]: args.plot} if len(paths) == 1 else
                   {path: str(p.with_name(f"{p.stem}_{stem}{p.suffix}"))
                    for path, stem in zip(paths, stem_keys(paths), strict=True)})
    try:
        job = ContactsJob(scheme=args.scheme, cutoff=args.cutoff, min_separation=args.min_separation,
                          residues=args.select, frequency=args.frequency, output="pairs" if args.pairs else "dense",
                          inter_chain=not args.no_inter_chain, periodic=not args.no_periodic, top=args.top,
                          device=device, on_map=functools.partial(_draw, targets) if targets else None)
    except InputError as exc:  # protgpu.contacts checked the parameters: say it with the option names
        raise InputError(cli_words(str(exc), "contacts")) from None
    if not args.quiet:
        print("input\tsummary\tdevice\tseconds", flush=True)

    def show(r) -> None:
        if not args.quiet and r.ok and r.rows:
            row = r.rows[0]
            how = "resumed\t" if r.resumed else f"{row['device'].upper()}\t{row['seconds']:.3f}"
            print(f"{r.input}\t{row['summary']}\t{how}", flush=True)

    summary = run_job(args, job, paths, description="contacts", on_result=show)
    where = job_device(args)[1]
    if args.out and len(paths) == 1 and not args.shard and summary.n_ok == 1:
        _bare_single_input(str(summary.out))
    if not args.quiet:
        dest = [f"maps to {summary.out}"] if summary.out else []
        if args.plot:
            p = Path(args.plot)
            plots = args.plot if len(paths) == 1 else str(p.with_name(f"{p.stem}_*{p.suffix}"))
            dest.append(f"plot{'s' if len(paths) > 1 else ''} to {plots}")
        tail = f"; {', '.join(dest)}" if dest else ""
        resumed = f" ({summary.n_resumed} resumed)" if summary.n_resumed else ""
        print(f"{summary.n_ok} input(s){resumed} on the {where} in {summary.elapsed_s:.2f} s{tail}", file=sys.stderr)
    report_failures(translate_failures(summary, "contacts"), "contacts")
    return summary.exit_code
