"""``protgpu search QUERY... --db db.pgdb [--top K] [--min-tm 0.5] --out hits.parquet``.

Each query chain is aligned (TM-align) onto every entry of a database built by ``protgpu db build``:
the query is Chain_1 (mobile), the entry Chain_2. Rows (query, target, tm_query, tm_target, rmsd,
n_aligned, seq_identity) are grouped by query in input order, each group sorted by ``tm_query`` (the
TM-score normalised by the query's length: how much of the query the hit covers, comparable across
hits) from the highest, ties by ``tm_target`` then by database order. ``--min-tm`` keeps rows with
``tm_query`` at least that; ``--top`` then keeps the first K of each query
(:func:`protgpu.align.database.search`). With either, entries too short to make the list are not
aligned (same rows, less time).
"""

from __future__ import annotations

import sys
import time

from ._batch_options import check_table_out
from ._cli_text import add_out, add_parser
from .align import CHAIN_HELP, print_tsv

COLUMNS = ("query", "target", "tm_query", "tm_target", "rmsd", "n_aligned", "seq_identity")
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
    p.add_argument("--top", type=int, default=None, metavar="K",
                   help="keep the K best hits per query (entries too short to reach the K-th best TM-score are "
                        "then not aligned; same rows)")
    p.add_argument("--min-tm", type=float, default=0.0, metavar="T", help="keep hits with tm_query >= T (default 0)")
    p.add_argument("--chain", "-c", default=None, help=CHAIN_HELP)
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto", help="where to compute (default: auto)")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors and the table")
    add_out(p, ".csv, .jsonl or .parquet (one row per hit: " + ", ".join(COLUMNS) + ")")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..align.database import load, read_chain, search
    from ..batch.inputs import expand_inputs
    from ..batch.writers import write_table

    check_table_out(args.out)
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
