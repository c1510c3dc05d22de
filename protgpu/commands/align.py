"""``protgpu align A.pdb B.pdb``: TM-align's report for one pair; ``--out`` a table for many.

Two inputs without ``--out`` print TM-align's report: chain names and lengths, aligned length, RMSD,
Seq_ID, the two TM-scores, the rotation matrix and the three alignment lines. More inputs align every
pair i < j (the earlier input as Chain_1), or every input onto ``--target``; one row per pair goes to
``--out`` (``.csv``, ``.jsonl``, ``.parquet``) or, without it, to stdout as a tab-separated table.
Every chain is read before anything is aligned: a bad input is one line, exit 2, no output.
"""

from __future__ import annotations

import sys

import numpy as np

from ..errors import InputError
from ._batch_options import check_table_out
from ._cli_text import add_out, add_parser

COLUMNS = ("mobile", "target", "tm_mobile", "tm_target", "rmsd", "n_aligned", "seq_identity",
           "len_mobile", "len_target")
CHAIN_HELP = ("chain to align in every input (default: the first protein chain with a CA atom, as "
              "TM-align; other chains are ignored; the first model of a multi-model file)")


def register(sub, common) -> None:
    p = add_parser(
        sub, "align", help="TM-align: sequence-independent structural alignment of protein chains",
        description="Structural alignment and TM-scores as TM-align computes them. Two inputs: TM-align's "
                    "report (the first input is Chain_1, superposed onto Chain_2). More inputs: every pair "
                    "(or every input against --target), one table row per pair. Multi-chain inputs: one "
                    "chain each, the first protein chain (or --chain), as TM-align; the first model.",
        example=[("protgpu align model.pdb native.pdb", "TM-align's report for one pair"),
                 ("protgpu align models/*.pdb --target native.pdb -o tm.csv", "every model against the native"),
                 ("protgpu align a.pdb b.pdb c.pdb --out all.parquet", "every pair of the three")])
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="structure files (globs, directories, @list.txt)")
    p.add_argument("--target", metavar="FILE", help="align every input onto this one (Chain_2)")
    p.add_argument("--chain", "-c", default=None, help=CHAIN_HELP)
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto", help="where to compute (default: auto)")
    add_out(p, ".csv, .jsonl or .parquet (one row per pair: " + ", ".join(COLUMNS) + ")")
    p.set_defaults(func=run)


def d0_of(length: int) -> float:
    """TM-score's d0 for a normalisation length (TM-align's final d0, at least 0.5), Angstrom."""
    return max(0.5, 1.24 * (length - 15) ** (1 / 3) - 1.8) if length > 21 else 0.5


def report(r, k: int, name1: str, name2: str) -> str:
    """TM-align's text report of pair ``k`` of a :class:`~protgpu.align.TMAlignResult`."""
    l1, l2 = (int(v) for v in r.lengths[k])
    n = int(r.n_aligned[k])
    u, t = r.rotation[k], r.translation[k]
    lines = [
        f"Name of Chain_1: {name1} (to be superimposed onto Chain_2)",
        f"Name of Chain_2: {name2}",
        f"Length of Chain_1: {l1} residues",
        f"Length of Chain_2: {l2} residues",
        "",
        f"Aligned length= {n:4d}, RMSD= {r.rmsd[k]:6.2f}, Seq_ID=n_identical/n_aligned= {r.seq_identity[k]:4.3f}",
        f"TM-score= {r.tm_target[k]:6.5f} (if normalized by length of Chain_2, i.e., LN={l2}, d0={d0_of(l2):.2f})",
        f"TM-score= {r.tm_mobile[k]:6.5f} (if normalized by length of Chain_1, i.e., LN={l1}, d0={d0_of(l1):.2f})",
        "(You should use TM-score normalized by length of the reference structure)",
        "",
        "------ The rotation matrix to rotate Chain_1 to Chain_2 ------",
        "m               t[m]        u[m][0]        u[m][1]        u[m][2]",
        *(f"{m:d}{t[m]:18.10f} {u[m, 0]:14.10f} {u[m, 1]:14.10f} {u[m, 2]:14.10f}" for m in range(3)),
        "",
        "Code for rotating Structure A from (x,y,z) to (X,Y,Z):",
        "for(i=0; i<L; i++)",
        "{",
        "   X[i] = t[0] + u[0][0]*x[i] + u[0][1]*y[i] + u[0][2]*z[i];",
        "   Y[i] = t[1] + u[1][0]*x[i] + u[1][1]*y[i] + u[1][2]*z[i];",
        "   Z[i] = t[2] + u[2][0]*x[i] + u[2][1]*y[i] + u[2][2]*z[i];",
        "}",
        "",
        '(":" denotes residue pairs of d <  5.0 Angstrom, "." denotes other aligned residues)',
        r.mobile_aligned[k], r.match[k], r.target_aligned[k], "",
    ]
    return "\n".join(lines)


def rows_of(r, names_mobile, names_target, pairs) -> list[dict]:
    """One table row per pair of a :class:`~protgpu.align.TMAlignResult`."""
    return [{"mobile": names_mobile[a], "target": names_target[b], "tm_mobile": float(r.tm_mobile[k]),
             "tm_target": float(r.tm_target[k]), "rmsd": float(r.rmsd[k]), "n_aligned": int(r.n_aligned[k]),
             "seq_identity": float(r.seq_identity[k]), "len_mobile": int(r.lengths[k, 0]),
             "len_target": int(r.lengths[k, 1])} for k, (a, b) in enumerate(pairs)]


def print_tsv(rows: list[dict], columns) -> None:
    print("\t".join(columns))
    for row in rows:
        print("\t".join(f"{row[c]:.5f}" if isinstance(row[c], float) else str(row[c]) for c in columns))


def run(args) -> int:
    from ..align import tm_align
    from ..align.database import read_chain
    from ..batch.inputs import expand_inputs
    from ..batch.writers import write_table

    check_table_out(args.out)
    paths = list(expand_inputs(args.inputs))
    chains = [read_chain(p, args.chain) for p in paths]
    if args.target:
        target = [read_chain(args.target, args.chain)]
        pairs = np.stack([np.arange(len(chains)), np.zeros(len(chains), np.int64)], axis=1)
    else:
        if len(chains) < 2:
            raise InputError(f"{paths[0]}: give two inputs (or --target) to align")
        target = chains
        pairs = np.array([(i, j) for i in range(len(chains)) for j in range(i + 1, len(chains))], np.int64)
    r = tm_align(chains, target, pairs=pairs, device=args.device)
    names_m, names_t = [c.name for c in chains], [c.name for c in target]
    if len(pairs) == 1 and not args.out:
        sys.stdout.write(report(r, 0, names_m[pairs[0, 0]], names_t[pairs[0, 1]]))
        return 0
    rows = rows_of(r, names_m, names_t, pairs.tolist())
    if args.out:
        write_table(args.out, rows, list(COLUMNS))
        print(f"{len(rows)} pair(s) to {args.out}", file=sys.stderr)
    else:
        print_tsv(rows, COLUMNS)
    return 0
