"""``protgpu db build INPUT... --out db.pgdb``: pack chains into a structure database for ``protgpu
search``; ``protgpu db info db.pgdb``: what one holds.

Each input gives one chain (the first protein chain with a CA atom, or ``--chain``; the first
model), named ``file:chain``; its CA coordinates, sequence, TM-align secondary structure and length go
into one file (:mod:`protgpu.align.database`), written atomically. Every input is read before the file
is written: a bad input is one line, exit 2, and no file.
"""

from __future__ import annotations

import sys
import time

from ..errors import InputError
from ._cli_text import add_parser
from .align import CHAIN_HELP


def register(sub, common) -> None:
    p = sub.add_parser("db", help="structure databases for protgpu search (build, info)",
                       description="Structure databases (.pgdb) for protgpu search.")
    dsub = p.add_subparsers(dest="db_command", metavar="ACTION")
    dsub.required = True
    b = add_parser(
        dsub, "build", help="pack the chains of structure files into one .pgdb file",
        description="One chain per input (the first protein chain, or --chain, as TM-align; the first "
                    "model): CA coordinates, sequence, secondary structure and length, in one file that "
                    "loads with one read (memory-mapped).",
        example=[("protgpu db build scope40/ --out scope40.pgdb", "every structure file under a directory"),
                 ("protgpu db build @list.txt --chain A -o db.pgdb", "chain A of each listed file")])
    b.add_argument("inputs", nargs="+", metavar="INPUT", help="structure files (globs, directories, @list.txt)")
    b.add_argument("--out", "-o", required=True, metavar="FILE", help="the database file (.pgdb); written atomically")
    b.add_argument("--chain", "-c", default=None, help=CHAIN_HELP)
    b.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    b.set_defaults(func=run_build)
    i = add_parser(dsub, "info", help="chains, residues and lengths of a .pgdb file",
                   description="What a structure database holds; --list prints each chain's name and length.",
                   example=[("protgpu db info db.pgdb", "counts and length range")])
    i.add_argument("database", metavar="DB", help="a .pgdb file")
    i.add_argument("--list", action="store_true", help="one line per chain: name, length")
    i.set_defaults(func=run_info)


def run_build(args) -> int:
    from ..align.database import read_chain, write
    from ..batch.inputs import expand_inputs

    if not args.out.lower().endswith(".pgdb"):
        raise InputError(f"--out {args.out}: use a .pgdb file name")
    t0 = time.perf_counter()
    chains = [read_chain(p, args.chain) for p in expand_inputs(args.inputs)]
    write(args.out, chains)
    if not args.quiet:
        n_res = sum(len(c.ca) for c in chains)
        print(f"{len(chains)} chain(s), {n_res} residues to {args.out} in {time.perf_counter() - t0:.2f} s",
              file=sys.stderr)
    return 0


def run_info(args) -> int:
    from ..align.database import load

    db = load(args.database)
    lens = db.lengths
    print(f"{db.path}: {len(db)} chains, {int(lens.sum())} residues, lengths {int(lens.min())}-{int(lens.max())}")
    if args.list:
        for name, n in zip(db.names, lens.tolist(), strict=True):
            print(f"{name}\t{n}")
    return 0
