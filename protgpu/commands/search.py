"""``protgpu search QUERY... --db db.pgdb [--top K] [--min-tm 0.5] --out hits.parquet``.

Each query chain is aligned (TM-align) onto every entry of a database built by ``protgpu db build``:
the query is Chain_1 (mobile), the entry Chain_2. Rows (query, target, tm_query, tm_target, rmsd,
n_aligned, seq_identity) are grouped by query in input order, each group sorted by ``tm_query`` (the
TM-score normalised by the query's length: how much of the query the hit covers, comparable across
hits) from the highest, ties by ``tm_target`` then by database order. ``--min-tm`` keeps rows with
``tm_query`` at least that; ``--top`` then keeps the first K of each query. The entries go to
:func:`protgpu.align.tm_align` in chunks of :data:`CHUNK` (one call per chunk, batched on the GPU),
so memory does not grow with the database.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ..errors import InputError
from ._cli_text import add_out, add_parser
from .align import CHAIN_HELP, check_table_out, print_tsv

COLUMNS = ("query", "target", "tm_query", "tm_target", "rmsd", "n_aligned", "seq_identity")
#: Database entries per tm_align call: a GPU batch large enough to fill the device, and a bounded
#: host footprint (float64 chains and alignments of one chunk, ~0.3 GB for 300-residue entries).
CHUNK = 32768


def register(sub, common) -> None:
    p = add_parser(
        sub, "search", help="TM-align search of query structures against a structure database",
        description="Align each query chain (Chain_1) onto every database entry (Chain_2) with TM-align; "
                    "rows per query sorted by tm_query (TM-score normalised by the query length), highest "
                    "first. Multi-chain queries: the first protein chain (or --chain), as TM-align; the "
                    "first model.",
        example=[("protgpu search model.pdb --db scope40.pgdb --top 10", "the 10 best hits, printed"),
                 ("protgpu search designs/ --db pdb.pgdb --min-tm 0.5 -o hits.parquet",
                  "every hit with TM-score >= 0.5 of each design")])
    p.add_argument("inputs", nargs="+", metavar="QUERY", help="query structure files (globs, directories, @list.txt)")
    p.add_argument("--db", required=True, metavar="DB", help="database built by protgpu db build (.pgdb)")
    p.add_argument("--top", type=int, default=None, metavar="K", help="keep the K best hits per query")
    p.add_argument("--min-tm", type=float, default=0.0, metavar="T", help="keep hits with tm_query >= T (default 0)")
    p.add_argument("--chain", "-c", default=None, help=CHAIN_HELP)
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto", help="where to compute (default: auto)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors and the table")
    add_out(p, ".csv, .jsonl or .parquet (one row per hit: " + ", ".join(COLUMNS) + ")")
    p.set_defaults(func=run)


def search(query, db, *, top=None, min_tm=0.0, device="auto", chunk=CHUNK) -> list[dict]:
    """The hits of one query :class:`~protgpu.align.chains.Chain` in a
    :class:`~protgpu.align.database.StructureDB`, as rows sorted as the command writes them."""
    from ..align import tm_align

    names = db.names
    cols = {k: [] for k in ("tm_query", "tm_target", "rmsd", "n_aligned", "seq_identity")}
    for s in range(0, len(db), chunk):
        r = tm_align(query, db.chains(s, min(len(db), s + chunk)), device=device)
        for k, field in (("tm_query", "tm_mobile"), ("tm_target", "tm_target"), ("rmsd", "rmsd"),
                         ("n_aligned", "n_aligned"), ("seq_identity", "seq_identity")):
            cols[k].append(getattr(r, field))
    c = {k: np.concatenate(v) for k, v in cols.items()}
    order = np.lexsort((np.arange(len(db)), -c["tm_target"], -c["tm_query"]))
    order = order[c["tm_query"][order] >= min_tm]
    if top is not None:
        order = order[:top]
    return [{"query": query.name, "target": names[t], "tm_query": float(c["tm_query"][t]),
             "tm_target": float(c["tm_target"][t]), "rmsd": float(c["rmsd"][t]),
             "n_aligned": int(c["n_aligned"][t]), "seq_identity": float(c["seq_identity"][t])}
            for t in order.tolist()]


def run(args) -> int:
    from ..align.database import load, read_chain
    from ..batch.inputs import expand_inputs
    from ..batch.writers import write_table

    check_table_out(args.out)
    if args.top is not None and args.top < 1:
        raise InputError(f"--top must be at least 1, not {args.top}")
    if not 0.0 <= args.min_tm <= 1.0:
        raise InputError(f"--min-tm must be between 0 and 1, not {args.min_tm}")
    db = load(args.db)
    queries = [read_chain(p, args.chain) for p in expand_inputs(args.inputs)]
    t0 = time.perf_counter()
    rows = []
    for q in queries:
        rows += search(q, db, top=args.top, min_tm=args.min_tm, device=args.device)
    if args.out:
        write_table(args.out, rows, list(COLUMNS))
    else:
        print_tsv(rows, COLUMNS)
    if not args.quiet:
        dest = f" to {args.out}" if args.out else ""
        print(f"{len(queries)} quer{'y' if len(queries) == 1 else 'ies'} x {len(db)} entries: {len(rows)} hit(s)"
              f" in {time.perf_counter() - t0:.2f} s{dest}", file=sys.stderr)
    return 0
