"""TM-align at scale: pg.tm_align throughput, database search, accuracy against TM-align (tmtools),
and fold-level search sensitivity on SCOPe, with the anchors in the same run.

Data: the shared corpus ``../shared/datasets/structures`` (``--corpus``; its PROVENANCE.md and
labels.tsv): 1,500 SCOPe 2.08 40% domains (CA only, class/fold/superfamily labels), 25 HOMSTRAD
family pairs, 11 circular-permutation pairs, 226 GTalign query chains (the long ones).

Parts (``--parts a,b,c,d``; each is run on its own, a failure in one is recorded and the others go on;
the results file keeps the parts of earlier runs, so the parts can be run in separate calls):

* **a** throughput, pairs/s, for chains of ~100 (SCOPe domains of 80-120 residues), ~300 (GTalign PDB20
  chains of 250-350) and ~1,000 residues (GTalign chains of 850 or more: 869, 978, 1,042, 1,129):
  ``pg.tm_align`` on the GPU (when usable; ``--gpu-pairs`` pairs, cycled), on the CPU in one process,
  and on a process pool of ``--jobs`` processes; anchors tmtools (TM-align's code) on one core and on a
  pool of ``--jobs`` processes. Random pairs of different chains of the bin, fixed seed. Ratios are
  protgpu pairs/s over the anchor's.
* **b** search: one 300-residue query (GTalign PDB20) against ``--entries`` database entries, end to
  end (load the .pgdb, align, sort) through ``protgpu search``'s function. The entries are synthetic:
  the corpus's chains cycled, every coordinate perturbed by Gaussian noise (0.5 A), so each is a
  distinct chain of a real fold. The database build is timed apart. Three searches: ``--top 10`` (the
  search then skips entries too short to reach the 10th best score, and the query's own noisy copies
  are among the entries), every row (every entry aligned), and ``--top 10`` for a query held out of
  the entries (a HOMSTRAD chain near 300 residues). With ``--search-bands``, the same
  query is then aligned to each band of entry lengths apart (``pg.tm_align``, as the search calls it), to
  say which entries the search's time goes to.
* **c** accuracy: ``--pairs`` SCOPe pairs (40% same superfamily, 30% same fold and another
  superfamily, 30% another fold; seed 0) plus every HOMSTRAD and circular-permutation pair; protgpu
  (GPU when usable, else a CPU pool) against tmtools (a pool): both TM-scores of each pair; the
  fraction within 1e-3 and 0.01, the largest and mean difference, the mean TM-score of each side.
* **d** fold-level sensitivity: for ``--queries`` SCOPe query domains (seed 0) every other SCOPe
  domain ranked by TM-score normalised by the query (query = Chain_1); per query, the fraction of
  same-fold domains ranked above the first domain of another fold (queries with no other domain of
  their fold are left out); the mean over queries, for protgpu and for tmtools on the same pairs.

    python3 benchmarks/bench_align.py [--parts a,b,c,d] [--jobs N] [--pairs P] [--queries Q]
        [--entries N] [--search-bands] [--gpu-pairs P] [--device auto|cpu|gpu] [--json PATH]
    python3 benchmarks/bench_align.py --merge part1.json part2.json ... [--json PATH]
    python3 benchmarks/bench_align.py --quick [--quick-scale S] [--threads T --min-blocks M] [--pieces K] [--json PATH]
    python3 benchmarks/bench_align.py --host-only [--quick-scale S] [--json PATH]
    python3 benchmarks/bench_align.py --block-sizes [--block-configs 256x2,128x4] [--quick-scale S] [--json PATH]
    ncu --launch-skip 1 --launch-count 1 ... python3 benchmarks/bench_align.py --one-launch [--gpu-pairs P]
        [--threads T --min-blocks M]

``--quick`` runs only the GPU kernel on synthetic chains of 100, 300 and 1,000 residues, with each
stage's share of the SM cycles (``quick_throughput``; under a minute and a half on an H200), and writes
``results/align-quick-<device>.json``. ``--host-only`` times the GPU path's host work per pair (pack, launch
plan, unpack) without a GPU (``host_throughput``) and writes ``results/align-host-<device>.json``.
``--block-sizes`` compares block sizes (``block_sizes``: real chains by length and the search's bands,
interleaved) and writes ``results/align-blocks-<device>.json``: what ``gpu.BUCKETS`` is set from.
``--one-launch`` writes nothing: it launches the kernel once to warm up, then once on ``--gpu-pairs``
random pairs of the GTalign chains of 250-350 residues (one launch: ``gpu.PIECES = 1``), for a profiler
to read the second launch (``ncu --launch-skip 1 --launch-count 1``; ``one_launch``).

Writes ``results/align-<device>.json`` (merging the parts already there; ``--merge`` joins the parts of
files written by separate runs, each part keeping its own machine and arguments).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import time
import traceback
from pathlib import Path

import numpy as np
from _common import HERE, RESULTS, device_tag, machine, print_table, write_results

REPO = HERE.parent
CORPUS = next((p / "shared" / "datasets" / "structures" for p in (REPO.parent, REPO.parent.parent)
               if (p / "shared" / "datasets" / "structures").is_dir()), REPO.parent / "shared")
SEED = 0

# ---------------------------------------------------------------------------------------------------
# corpus


def read_labels(corpus: Path) -> list[dict]:
    lines = (corpus / "labels.tsv").read_text().splitlines()
    head = lines[0].split("\t")
    return [dict(zip(head, ln.split("\t"), strict=False)) for ln in lines[1:] if ln.strip()]


def read_chains(paths) -> list:
    from protgpu.align.database import read_chain

    return [read_chain(p) for p in paths]


def scope_set(corpus: Path):
    rows = [r for r in read_labels(corpus) if r["set"] == "scope40_ca"]
    return rows, read_chains([corpus / r["path"] for r in rows])


def pair_sets(corpus: Path):
    """HOMSTRAD and circular-permutation pairs: the two files of each directory."""
    rows = [r for r in read_labels(corpus) if r["set"] in ("homstrad_pairs", "cirpin_cp_pairs")]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(os.path.dirname(r["path"]), []).append(r)
    groups = {k: v for k, v in groups.items() if len(v) == 2}
    paths = [corpus / r["path"] for v in groups.values() for r in v]
    kinds = [("homstrad" if "homstrad" in k else "circular_permutation") for k in groups]
    return read_chains(paths), kinds


def gtalign_chains(corpus: Path):
    return read_chains(sorted(corpus.glob("gtalign_*/*.pdb.gz")))


# ---------------------------------------------------------------------------------------------------
# process pools (spawn: the parent may hold a CUDA context)

_CHAINS: list = []


def _init(chains) -> None:
    global _CHAINS
    _CHAINS = chains


def _tmtools_chunk(pairs):
    import tmtools

    out = []
    for a, b in pairs:
        x, y = _CHAINS[a], _CHAINS[b]
        r = tmtools.tm_align(x.ca, y.ca, x.sequence, y.sequence)
        out.append((r.tm_norm_chain1, r.tm_norm_chain2, r.rmsd))
    return out


def _protgpu_chunk(pairs):
    import protgpu as pg

    r = pg.tm_align(_CHAINS, _CHAINS, pairs=np.asarray(pairs, np.int64).reshape(-1, 2), device="cpu")
    return list(zip(r.tm_mobile.tolist(), r.tm_target.tolist(), r.rmsd.tolist(), strict=True))


def _warm(_):
    import tmtools  # noqa: F401

    import protgpu as pg  # noqa: F401 - imports (and numba's cache) before the clock starts

    if len(_CHAINS) > 1:
        _protgpu_chunk([(0, 1)])
    return os.getpid()


class Pool:
    """A spawn pool of ``jobs`` processes holding ``chains``, warmed up before anything is timed."""

    def __init__(self, chains, jobs: int):
        self.jobs = jobs
        self.pool = mp.get_context("spawn").Pool(jobs, initializer=_init, initargs=(chains,))
        self.pool.map(_warm, range(jobs * 2), chunksize=1)

    def run(self, fn, pairs, chunk: int | None = None) -> tuple[np.ndarray, float]:
        pairs = [tuple(p) for p in np.asarray(pairs).tolist()]
        chunk = chunk or max(1, -(-len(pairs) // (self.jobs * 8)))
        chunks = [pairs[k:k + chunk] for k in range(0, len(pairs), chunk)]
        t0 = time.perf_counter()
        res = self.pool.map(fn, chunks, chunksize=1)
        dt = time.perf_counter() - t0
        return np.array([v for c in res for v in c], dtype=np.float64).reshape(-1, 3), dt

    def close(self):
        self.pool.terminate()
        self.pool.join()


def tmtools_serial(chains, pairs) -> tuple[np.ndarray, float]:
    _init(chains)
    t0 = time.perf_counter()
    out = _tmtools_chunk(np.asarray(pairs).tolist())
    return np.asarray(out).reshape(-1, 3), time.perf_counter() - t0


def protgpu_run(chains, pairs, device: str, chunk: int = 50_000) -> tuple[np.ndarray, float]:
    """pg.tm_align over ``pairs`` in one process (chunks of ``chunk`` pairs per call, which a GPU
    batches); (P, 3) tm_mobile, tm_target, rmsd and seconds."""
    import protgpu as pg

    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    out = []
    t0 = time.perf_counter()
    for s in range(0, len(pairs), chunk):
        r = pg.tm_align(chains, chains, pairs=pairs[s:s + chunk], device=device)
        out.append(np.stack([r.tm_mobile, r.tm_target, r.rmsd], axis=1))
    dt = time.perf_counter() - t0
    return (np.concatenate(out) if out else np.zeros((0, 3))), dt


def gpu_usable(device: str) -> bool:
    if device == "cpu":
        return False
    try:
        from protgpu._array import gpu_available

        return bool(gpu_available())
    except Exception:
        return False


def random_pairs(n: int, count: int, rng) -> np.ndarray:
    a = rng.integers(0, n, size=count)
    b = (a + rng.integers(1, n, size=count)) % n  # never a chain with itself
    return np.stack([a, b], axis=1)


# ---------------------------------------------------------------------------------------------------
# parts


def part_throughput(args, gpu: bool) -> dict:
    rng = np.random.default_rng(SEED)
    rows_scope, scope = scope_set(args.corpus)
    gt = gtalign_chains(args.corpus)
    bins = {
        100: [c for c in scope if 80 <= len(c.ca) <= 120],
        300: [c for c in gt if 250 <= len(c.ca) <= 350],
        1000: [c for c in gt if len(c.ca) >= 850],
    }
    # pairs per measurement: (serial anchors and CPU, pools) by size; the GPU gets --gpu-pairs
    counts = {100: (16, 16 * args.jobs), 300: (6, 8 * args.jobs), 1000: (2, max(args.jobs, 4))}
    rows = []
    for size, chains in bins.items():
        row = {"size": size, "chains": len(chains),
               "lengths": f"{min(len(c.ca) for c in chains)}-{max(len(c.ca) for c in chains)}"}
        n_serial, n_pool = counts[size]
        serial = random_pairs(len(chains), n_serial, rng)
        pooled = random_pairs(len(chains), n_pool, rng)
        steps = [
            ("tmtools_1core", lambda ch=chains, p=serial: (len(p), tmtools_serial(ch, p)[1])),
            ("protgpu_cpu_1proc", lambda ch=chains, p=serial: (len(p), _timed_cpu(ch, p))),
        ]
        for name, fn in steps:
            try:
                n, dt = fn()
                row[f"{name}_pairs_s"] = n / dt
            except Exception as exc:
                row[f"{name}_error"] = _err(exc)
        try:
            pool = Pool(chains, args.jobs)
            try:
                row[f"tmtools_pool{args.jobs}_pairs_s"] = len(pooled) / pool.run(_tmtools_chunk, pooled)[1]
                row[f"protgpu_cpu_pool{args.jobs}_pairs_s"] = len(pooled) / pool.run(_protgpu_chunk, pooled)[1]
            finally:
                pool.close()
        except Exception as exc:
            row["pool_error"] = _err(exc)
        if gpu:
            try:
                n_gpu = args.gpu_pairs if size < 1000 else max(1, args.gpu_pairs // 10)
                gp = random_pairs(len(chains), n_gpu, rng)
                protgpu_run(chains, gp[:min(64, len(gp))], "gpu")  # compile and warm up
                row["gpu_pairs"] = len(gp)
                row["protgpu_gpu_pairs_s"] = len(gp) / protgpu_run(chains, gp, "gpu")[1]
            except Exception as exc:
                row["protgpu_gpu_error"] = _err(exc)
        for who in ("protgpu_gpu", "protgpu_cpu_1proc", f"protgpu_cpu_pool{args.jobs}"):
            for anchor in ("tmtools_1core", f"tmtools_pool{args.jobs}"):
                a, b = row.get(f"{who}_pairs_s"), row.get(f"{anchor}_pairs_s")
                if a and b:
                    row[f"{who}_vs_{anchor}"] = a / b
        rows.append(row)
        print_table([row], list(row))
    return {"rows": rows, "jobs": args.jobs,
            "note": "pairs/s; ratios are protgpu pairs/s over the anchor's (above 1: protgpu faster)"}


def _timed_cpu(chains, pairs) -> float:
    import protgpu as pg

    t = np.linspace(0, 6 * np.pi, 40)
    helix = np.stack([2.3 * np.cos(t), 2.3 * np.sin(t), 1.5 * t], axis=1)
    pg.tm_align(helix, helix[:35], device="cpu")  # numba's compile (or cache load) before the clock
    return protgpu_run(chains, pairs, "cpu")[1]


SEARCH_BANDS = ((0, 150), (150, 300), (300, 500), (500, None))


def search_bands(query, db, device: str) -> list[dict]:
    """Seconds of ``pg.tm_align(query, entries)`` for the entries of each band of lengths
    (:data:`SEARCH_BANDS`, [lo, hi) residues), each band in one call as the search makes them; on the
    GPU also the kernel's profile of the band's pairs (``gpu.tm_align_gpu(..., profile=True)``): the
    mean SM clock cycles a pair (``mcycles``) and each stage's share of them, as ``--quick`` reports."""
    import protgpu as pg

    chains = db.chains(0, len(db))
    lengths = np.asarray(db.lengths)
    rows = []
    for lo, hi in SEARCH_BANDS:
        idx = np.flatnonzero((lengths >= lo) & (lengths < (hi if hi is not None else np.inf)))
        if not len(idx):
            continue
        band = [chains[i] for i in idx.tolist()]
        t0 = time.perf_counter()
        pg.tm_align(query, band, device=device)  # NumPy out: synchronous
        row = {"lengths": f"{lo}-{hi - 1 if hi is not None else int(lengths.max())}", "entries": len(idx),
               "seconds": time.perf_counter() - t0}
        if device == "gpu":
            from protgpu.align import gpu

            pairs = np.stack([np.zeros(len(band), dtype=np.int64), np.arange(len(band))], axis=1)
            _, prof = gpu.tm_align_gpu([query.ca], [c.ca for c in band], [query.sequence],
                                       [c.sequence for c in band], pairs, [float(len(c.ca)) for c in band],
                                       profile=True)
            row.update(profile_shares(prof))
        rows.append(row)
    return rows


def profile_shares(prof: np.ndarray) -> dict:
    """The kernel's profile counters (``gpu.PROFILE_SLOTS``, SM cycles a pair) as ``--quick`` reports
    them: mean megacycles a pair; the six stages' shares of their sum; the DP's, the TM-score searches'
    and the quick scores' shares of the whole pair."""
    from protgpu.align import gpu

    cyc = prof.sum(axis=0).astype(np.float64)
    stages = cyc[:6].sum()
    row = {"mcycles": cyc[9] / len(prof) / 1e6}
    for k, name in enumerate(gpu.PROFILE_SLOTS[:6]):
        row[name] = cyc[k] / stages if stages else float("nan")
    for k, name in enumerate(gpu.PROFILE_SLOTS[6:9], start=6):
        row[name] = cyc[k] / cyc[9] if cyc[9] else float("nan")
    return row


def timed_search(query, db, device: str, top) -> dict:
    """``database.search`` end to end (with the database already loaded): seconds, entries aligned
    (counted at its ``tm_align`` calls) and the top hit."""
    from protgpu.align import api
    from protgpu.align.database import search

    real, aligned = api.tm_align, [0]

    def counting(query, entries, **kwargs):
        aligned[0] += len(entries)
        return real(query, entries, **kwargs)

    api.tm_align = counting
    try:
        t0 = time.perf_counter()
        hits = search(query, db, top=top, device=device)
        seconds = time.perf_counter() - t0
    finally:
        api.tm_align = real
    return {"seconds": seconds, "aligned": aligned[0], "top_hit": hits[0]["target"] if hits else None,
            "top_tm_query": hits[0]["tm_query"] if hits else None, "rows": len(hits)}


def synthetic_entries(pool, n: int, rng) -> list:
    """Part b's database entries: the chains of ``pool`` cycled to ``n``, every coordinate perturbed by
    N(0, 0.5 A) noise (stored as float32, as a .pgdb keeps them), named ``<chain>#<k>``."""
    entries = []
    for k in range(n):
        c = pool[k % len(pool)]
        ca = (c.ca + rng.normal(scale=0.5, size=c.ca.shape)).astype(np.float32).astype(np.float64)
        entries.append(c._replace(ca=ca, name=f"{c.name}#{k}"))
    return entries


def part_search(args, gpu: bool) -> dict:
    import tempfile

    from protgpu.align import database

    rng = np.random.default_rng(SEED)
    gt = gtalign_chains(args.corpus)
    query = next(c for c in gt if 290 <= len(c.ca) <= 310)
    # A query whose chain and family are not among the entries (a HOMSTRAD chain near 300 residues):
    # its best hits score as a real search's do, so the search's bound skips fewer entries.
    held_out = min(pair_sets(args.corpus)[0], key=lambda c: abs(len(c.ca) - 300))
    _, scope = scope_set(args.corpus)
    pool = scope + gt
    n = args.entries or (100_000 if gpu else 200)
    t0 = time.perf_counter()
    entries = synthetic_entries(pool, n, rng)
    t_make = time.perf_counter() - t0
    device = "gpu" if gpu else "cpu"
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.pgdb"
        t0 = time.perf_counter()
        database.write(path, entries)
        t_build = time.perf_counter() - t0
        size = path.stat().st_size
        del entries
        if gpu:  # compile the kernels outside the clock
            import protgpu as pg

            pg.tm_align(query, database.load(path).chains(0, 64), device=device)
        t0 = time.perf_counter()
        db = database.load(path)
        t_load = time.perf_counter() - t0
        top10 = timed_search(query, db, device, 10)
        every = timed_search(query, db, device, None)
        other = timed_search(held_out, db, device, 10)
        bands = search_bands(query, db, device) if args.search_bands else None
    t_total = t_load + top10["seconds"]
    row = {"entries": n, "query": query.name, "query_length": len(query.ca), "device": device,
           "residues": int(db.lengths.sum()), "db_bytes": size, "synthetic_s": t_make, "build_s": t_build,
           "load_s": t_load, "search_end_to_end_s": t_total, "pairs_s": n / t_total,
           "aligned": top10["aligned"], "top_hit": top10["top_hit"], "top_tm_query": top10["top_tm_query"],
           "every_row_s": t_load + every["seconds"], "every_row_pairs_s": n / (t_load + every["seconds"]),
           "held_out_query": held_out.name, "held_out_length": len(held_out.ca),
           "held_out_s": t_load + other["seconds"], "held_out_aligned": other["aligned"],
           "held_out_top_hit": other["top_hit"], "held_out_top_tm_query": other["top_tm_query"]}
    if bands is not None:
        row["bands"] = bands
    print_table([{k: v for k, v in row.items() if k != "bands"}], [k for k in row if k != "bands"])
    if bands:
        print_table(bands, list(bands[0]))
    return {"rows": [row], "note": "entries are synthetic: the corpus's SCOPe and GTalign chains cycled, "
                                   "coordinates perturbed by N(0, 0.5 A) noise; end to end = load + align + sort; "
                                   "search_end_to_end_s is --top 10 (entries whose bound min(Lq, Lt) / Lq is below "
                                   "the 10th best tm_query are not aligned; the query's own noisy copies are among "
                                   "the entries); every_row_s lists every entry (all aligned); held_out_s is --top 10 "
                                   "for a query whose chain and family are not among the entries"}


def accuracy_pairs(rows, n: int, rng) -> tuple[np.ndarray, list[str]]:
    """SCOPe pairs: 40% same superfamily, 30% same fold and another superfamily, 30% another fold (the
    related pairs the corpus lacks are made up by the kinds after them)."""
    fold = np.array([r["fold"] for r in rows])
    sf = np.array([r["superfamily"] for r in rows])
    want = {"same_superfamily": int(round(0.4 * n)), "same_fold": int(round(0.3 * n))}
    want["different_fold"] = n - sum(want.values())
    got: dict[str, set] = {k: set() for k in want}
    m = len(rows)

    def draw(tries: int) -> None:
        for _ in range(tries):
            if all(len(got[k]) >= want[k] for k in want):
                return
            p = random_pairs(m, 20 * n, rng)
            same_sf = sf[p[:, 0]] == sf[p[:, 1]]
            same_fold = fold[p[:, 0]] == fold[p[:, 1]]
            for kind, mask in (("same_superfamily", same_sf), ("same_fold", same_fold & ~same_sf),
                               ("different_fold", ~same_fold)):
                for a, b in p[mask].tolist():
                    if len(got[kind]) >= want[kind]:
                        break
                    got[kind].add((a, b))

    draw(200)
    # The SCOPe 40% set has fewer related pairs than 10,000 asks for (~2,700 of one superfamily, ~3,500 of
    # one fold in another superfamily): what a kind lacks goes to the kinds after it, so the table holds n.
    kinds = list(want)
    for i, kind in enumerate(kinds[:-1]):
        short = want[kind] - len(got[kind])
        if short > 0:
            want[kind] -= short
            later = kinds[i + 1:]
            for j, other in enumerate(later):
                want[other] += short // len(later) + (1 if j < short % len(later) else 0)
            draw(200)
    pairs, kinds = [], []
    for kind in want:
        for ab in sorted(got[kind]):
            pairs.append(ab)
            kinds.append(kind)
    return np.array(pairs, np.int64).reshape(-1, 2), kinds


def _compare(ours: np.ndarray, ref: np.ndarray, kinds: list[str]) -> tuple[dict, list[dict]]:
    diff = np.maximum(np.abs(ours[:, 0] - ref[:, 0]), np.abs(ours[:, 1] - ref[:, 1]))

    def stats(mask):
        d = diff[mask]
        return {"pairs": int(mask.sum()), "within_1e-3": float((d <= 1e-3).mean()),
                "within_0.01": float((d <= 0.01).mean()), "max_diff": float(d.max()), "mean_diff": float(d.mean()),
                "mean_tm_protgpu": float(ours[mask, 1].mean()), "mean_tm_tmalign": float(ref[mask, 1].mean()),
                "mean_tm_protgpu_chain1": float(ours[mask, 0].mean()),
                "mean_tm_tmalign_chain1": float(ref[mask, 0].mean())}

    kinds_a = np.array(kinds)
    table = [{"kind": "all", **stats(np.ones(len(diff), bool))}]
    table += [{"kind": k, **stats(kinds_a == k)} for k in dict.fromkeys(kinds)]
    return table, diff


def _both_sides(args, chains, pairs, gpu: bool) -> dict:
    """(P, 3) results of protgpu (GPU when usable, else or if the GPU run fails a CPU pool) and of
    tmtools (a pool), with their times."""
    out = {}
    if gpu:
        try:
            protgpu_run(chains, pairs[:64], "gpu")  # compile and warm up
            out["protgpu"], out["protgpu_s"] = protgpu_run(chains, pairs, "gpu")
            out["protgpu_device"] = "gpu"
        except Exception as exc:  # recorded; the CPU pool gives protgpu's numbers instead
            traceback.print_exc()
            out["protgpu_gpu_error"] = _err(exc)
    pool = Pool(chains, args.jobs)
    try:
        out["tmtools"], out["tmtools_s"] = pool.run(_tmtools_chunk, pairs)
        if "protgpu" not in out:
            out["protgpu"], out["protgpu_s"] = pool.run(_protgpu_chunk, pairs)
            out["protgpu_device"] = f"cpu pool of {args.jobs}"
    finally:
        pool.close()
    return out


def part_accuracy(args, gpu: bool) -> dict:
    rng = np.random.default_rng(SEED)
    rows, scope = scope_set(args.corpus)
    pairs, kinds = accuracy_pairs(rows, args.pairs, rng)
    extra, extra_kinds = pair_sets(args.corpus)
    chains = scope + extra
    off = len(scope)
    pairs = np.concatenate([pairs, np.arange(off, off + len(extra)).reshape(-1, 2)])
    kinds = kinds + extra_kinds
    res = _both_sides(args, chains, pairs, gpu)
    table, diff = _compare(res["protgpu"], res["tmtools"], kinds)
    worst = [{"mobile": chains[a].name, "target": chains[b].name, "kind": kinds[k], "diff": float(diff[k]),
              "protgpu": res["protgpu"][k, :2].tolist(), "tmalign": res["tmtools"][k, :2].tolist()}
             for k in np.argsort(-diff)[:10].tolist() for a, b in [pairs[k].tolist()]]
    print_table(table, list(table[0]))
    return {"rows": table, "worst": worst, "seed": SEED, "protgpu_device": res["protgpu_device"],
            "protgpu_gpu_error": res.get("protgpu_gpu_error"),
            "protgpu_s": res["protgpu_s"], "tmtools_s": res["tmtools_s"], "jobs": args.jobs,
            "note": "diff = the larger of the two normalisations' |protgpu - tmtools| per pair; mean_tm: "
                    "normalised by Chain_2 (and _chain1 by Chain_1)"}


def sensitivity(scores: np.ndarray, queries: np.ndarray, fold: np.ndarray) -> tuple[float, int]:
    """Mean over queries of the fraction of same-fold domains scored above the first other-fold one
    (a tie with it counts as below); ``scores`` (Q, M) with the query's own column -inf."""
    vals = []
    for qi, q in enumerate(queries.tolist()):
        s = scores[qi]
        same = fold == fold[q]
        same[q] = False
        if not same.any():
            continue
        other = fold != fold[q]
        first_fp = s[other].max() if other.any() else -np.inf
        vals.append(float((s[same] > first_fp).sum() / same.sum()))
    return (float(np.mean(vals)) if vals else float("nan")), len(vals)


def part_sensitivity(args, gpu: bool) -> dict:
    rng = np.random.default_rng(SEED)
    rows, scope = scope_set(args.corpus)
    fold = np.array([r["fold"] for r in rows])
    m = len(scope)
    queries = np.sort(rng.choice(m, size=min(args.queries, m), replace=False))
    pairs = np.array([(q, t) for q in queries.tolist() for t in range(m) if t != q], np.int64)
    res = _both_sides(args, scope, pairs, gpu)
    out = {"queries": len(queries), "domains": m, "pairs": len(pairs), "protgpu_device": res["protgpu_device"],
           "protgpu_gpu_error": res.get("protgpu_gpu_error"),
           "protgpu_s": res["protgpu_s"], "tmtools_s": res["tmtools_s"], "seed": SEED}
    for who in ("protgpu", "tmtools"):
        s = np.full((len(queries), m), -np.inf)
        s[np.searchsorted(queries, pairs[:, 0]), pairs[:, 1]] = res[who][:, 0]  # normalised by the query
        out[f"sensitivity_{who}"], out["queries_scored"] = sensitivity(s, queries, fold)
    print_table([out], list(out))
    return {"rows": [out], "note": "fold-level: same-fold domains ranked above the first other-fold domain, "
                                   "TM-score normalised by the query (Chain_1), mean over queries"}


def quick_walk(rng, n: int) -> np.ndarray:
    """(n, 3) CA-like trace: 3.8 A steps turning by random bounded angles (as the GPU tests' chains)."""
    turns = rng.normal(scale=0.6, size=(n, 3))
    d = np.array([1.0, 0.0, 0.0])
    pts = np.zeros((n, 3))
    for k in range(1, n):
        d = d + turns[k]
        d /= np.linalg.norm(d)
        pts[k] = pts[k - 1] + 3.8 * d
    return pts


QUICK_SIZES = ((100, 4000), (300, 1000), (1000, 100))


def kernel_outputs(pk, res) -> tuple:
    """What the kernel would return for the packed pairs ``pk`` whose results are ``res`` (a
    ``gpu.AlignmentBatch`` or ``TMAlignResult``, pair k of ``pk`` taking row k): values (P, 4),
    n_aligned (P,), rotation and translation (P, 12), the flat maps (map_total,)."""
    n = len(pk.pair_chain)
    values = np.stack([res.tm_mobile, res.tm_target, res.tm, res.rmsd], axis=1)
    rt = np.concatenate([np.asarray(res.rotation).reshape(n, 9), np.asarray(res.translation).reshape(n, 3)], axis=1)
    maps = np.full(max(pk.map_total, 1), -1, np.int32)
    for k in range(n):
        a = res.aligned[k]
        maps[pk.map_off[k] + a[:, 1]] = a[:, 0]
    return values, np.asarray(res.n_aligned), rt, maps


def host_seconds(gpu, chains, pairs, norms, seqs, res, repeats: int = 1) -> dict:
    """Seconds of the GPU path's host work for these pairs (the fastest of ``repeats``): ``pack`` (chains
    and per-pair parameters), ``plan`` (block sizes, workspace, order) and ``unpack`` of the results
    ``res`` (the aligned pairs, match line, gapped sequences and identity from the kernel's outputs)."""
    best = {"pack": np.inf, "plan": np.inf, "unpack": np.inf}
    outputs = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        pk = gpu.pack(chains, chains, pairs, norms)
        t1 = time.perf_counter()
        lens = pk.chain_len
        l1, l2 = lens[pk.pair_chain[:, 0]], lens[pk.pair_chain[:, 1]]
        warps = gpu.block_configs(l1, l2)[:, 0] // 32
        np.argsort(-np.asarray(gpu.workspace_bytes(l1, l2, warps)), kind="stable")
        t2 = time.perf_counter()
        if outputs is None:
            outputs = kernel_outputs(pk, res)
        t3 = time.perf_counter()
        gpu.unpack(pk, *outputs, seqs, seqs)
        t4 = time.perf_counter()
        for key, t in (("pack", t1 - t0), ("plan", t2 - t1), ("unpack", t4 - t3)):
            best[key] = min(best[key], t)
    return best


def force_block_size(gpu, args) -> None:
    """``--threads`` / ``--min-blocks``: that block size (``gpu.THREADS``, ``gpu.MIN_BLOCKS``) for every pair,
    without the length buckets; neither given: the defaults, buckets and all."""
    if args.threads or args.min_blocks:
        gpu.BUCKETS = ()
    if args.threads:
        gpu.THREADS = args.threads
    if args.min_blocks:
        gpu.MIN_BLOCKS = args.min_blocks


def quick_throughput(args) -> dict:
    """``--quick``: the GPU kernel alone on synthetic random-walk chains of exactly 100, 300 and 1,000
    residues (48 chains per size, random pairs, seed 0; ``--quick-scale`` multiplies the pair counts):
    pairs/s end to end (``tm_align_gpu``: pack, kernel, unpack; with each chunk launched whole,
    ``gpu.PIECES = 1``, in ``one_piece_pairs_s``; and ``pg.tm_align``, the API, in ``api_pairs_s``) and of
    the kernel (end to end less the host's pack, plan and unpack, timed apart:
    ``host_s``; the host unpacks a chunk's first pieces while the later ones run, so this is an
    upper bound of what the host adds), then one ``profile=True`` run: each stage's share of the SM
    cycles (the five initial alignments with their refinement and the final scores), and across stages
    the shares of the DP, the TM-score searches and the quick scores."""
    import cupy as cp

    import protgpu as pg
    from protgpu.align import gpu

    force_block_size(gpu, args)
    if args.pieces:
        gpu.PIECES = args.pieces
    rng = np.random.default_rng(SEED)
    rows = []
    for size, count in QUICK_SIZES:
        n = max(1, int(count * args.quick_scale))
        chains = [quick_walk(rng, size) for _ in range(48)]
        seqs = ["A" * size] * len(chains)
        pairs = random_pairs(len(chains), n, rng)
        norms = [float(size)] * n

        def run(p, profile=False, chains=chains, seqs=seqs, norms=norms):
            out = gpu.tm_align_gpu(chains, chains, seqs, seqs, p, norms[:len(p)], profile=profile)
            cp.cuda.Device().synchronize()
            return out

        if size == QUICK_SIZES[0][0]:
            run(pairs[:8])  # compile (or load) and warm up: one kernel for every size
        t0 = time.perf_counter()
        res = run(pairs)
        total = time.perf_counter() - t0
        t0 = time.perf_counter()
        pg.tm_align(chains, chains, pairs=pairs, device="gpu")
        cp.cuda.Device().synchronize()
        api = time.perf_counter() - t0
        host = sum(host_seconds(gpu, chains, pairs, norms, seqs, res).values())
        pieces, gpu.PIECES = gpu.PIECES, 1  # the same pairs launched whole, unpacked after (no overlap)
        try:
            t0 = time.perf_counter()
            run(pairs)
            whole = time.perf_counter() - t0
        finally:
            gpu.PIECES = pieces
        _, prof = run(pairs, profile=True)
        threads, min_blocks = gpu.block_config(size, size)
        row = {"size": size, "pairs": n, "threads": threads, "min_blocks": min_blocks, "pieces": gpu.PIECES,
               "pairs_s": n / total, "one_piece_pairs_s": n / whole, "api_pairs_s": n / api,
               "kernel_pairs_s": n / max(total - host, 1e-9),
               "host_s": host}
        row.update(profile_shares(prof))
        rows.append(row)
        print_table([row], list(row))
    return {"rows": rows, "note": "pairs/s of tm_align_gpu on random-walk chains; stage columns: shares of the SM "
                                  "cycles of the stages; dp, tm_search, quick_scores: shares of the whole pair's"}


def block_sizes(args) -> dict:
    """``--block-sizes``: pairs/s of ``pg.tm_align`` on the GPU with every pair on one block size
    (``--block-configs``, TA_THREADS x TA_MIN_BLOCKS; ``gpu.BUCKETS`` off), interleaved: each config once,
    then again in reverse order. Pairs: random pairs of real chains of a band of lengths (all-vs-all, as
    part a draws them), and part b's 300-residue query against synthetic entries of each band of
    :data:`SEARCH_BANDS` (the search's calls). Every config's TM-scores must equal the first's bit for bit
    (``same``); the summary gives each config's best pairs/s and its ratio to the first config's."""
    import protgpu as pg
    from protgpu.align import gpu

    configs = [tuple(int(v) for v in c.split("x")) for c in args.block_configs.split(",")]
    rng = np.random.default_rng(SEED)
    _, scope = scope_set(args.corpus)
    gt = gtalign_chains(args.corpus)
    every = scope + gt
    cases = []  # (kind, lengths, mobile chains, target chains)
    for lo, hi, count in ((80, 120, 20_000), (150, 250, 8_000), (250, 350, 6_000), (351, 450, 3_000),
                          (451, 600, 1_500), (601, 849, 600), (850, None, 300)):
        chains = [c for c in every if lo <= len(c.ca) and (hi is None or len(c.ca) <= hi)]
        if len(chains) < 2:
            continue
        count = max(1, int(count * args.quick_scale))
        pairs = random_pairs(len(chains), count, rng)
        cases.append(("all_vs_all", f"{lo}-{hi if hi is not None else max(len(c.ca) for c in chains)}",
                      [chains[i] for i in pairs[:, 0].tolist()], [chains[i] for i in pairs[:, 1].tolist()]))
    query = next(c for c in gt if 290 <= len(c.ca) <= 310)
    entries = synthetic_entries(scope + gt, max(1, int(12_000 * args.quick_scale)), rng)
    for lo, hi in SEARCH_BANDS:
        band = [e for e in entries if lo <= len(e.ca) and (hi is None or len(e.ca) < hi)]
        if band:
            cases.append(("search", f"{lo}-{hi - 1 if hi is not None else max(len(e.ca) for e in band)}",
                          query, band))  # one against many, as the search calls it
    saved = gpu.BUCKETS, gpu.THREADS, gpu.MIN_BLOCKS
    rows, first = [], {}
    try:
        for threads, min_blocks in configs:  # compile (or load) outside the clock
            gpu.BUCKETS, gpu.THREADS, gpu.MIN_BLOCKS = (), threads, min_blocks
            pg.tm_align(gt[:4], gt[4:8], device="gpu")
        for rnd, order in enumerate((configs, configs[::-1])):
            for threads, min_blocks in order:
                gpu.BUCKETS, gpu.THREADS, gpu.MIN_BLOCKS = (), threads, min_blocks
                for kind, lengths, mob, tgt in cases:
                    t0 = time.perf_counter()
                    r = pg.tm_align(mob, tgt, device="gpu")  # NumPy out: synchronous
                    seconds = time.perf_counter() - t0
                    tm = np.stack([np.asarray(r.tm_mobile), np.asarray(r.tm_target)])
                    ref = first.setdefault((kind, lengths), tm)
                    row = {"kind": kind, "lengths": lengths, "pairs": len(tgt), "threads": threads,
                           "min_blocks": min_blocks, "round": rnd, "seconds": seconds,
                           "pairs_s": len(tgt) / seconds, "same": bool(np.array_equal(ref, tm))}
                    print(row, flush=True)
                    rows.append(row)
    finally:
        gpu.BUCKETS, gpu.THREADS, gpu.MIN_BLOCKS = saved
    summary = []
    for kind, lengths, _mob, tgt in cases:
        mine = [r for r in rows if (r["kind"], r["lengths"]) == (kind, lengths)]
        best = {c: max(r["pairs_s"] for r in mine if (r["threads"], r["min_blocks"]) == c) for c in configs}
        row = {"kind": kind, "lengths": lengths, "pairs": len(tgt), "same": all(r["same"] for r in mine)}
        for c in configs:
            row[f"{c[0]}x{c[1]}_pairs_s"] = best[c]
            row[f"{c[0]}x{c[1]}_vs_{configs[0][0]}x{configs[0][1]}"] = best[c] / best[configs[0]]
        summary.append(row)
    print_table(summary, list(summary[0]))
    return {"rows": summary, "runs": rows, "query_length": len(query.ca),
            "buckets": [list(b) for b in gpu.BUCKETS],
            "note": "pairs/s of pg.tm_align on the GPU with every pair on one block size (threads x blocks an "
                    "SM), best of two interleaved rounds; all_vs_all: random pairs of real chains of the "
                    "band; search: part b's query against synthetic entries of the band; same: TM-scores "
                    "equal to the first config's bit for bit"}


def one_launch(args) -> None:
    """``--one-launch``: a warm-up launch of 8 pairs, then one launch (``gpu.PIECES = 1``) of
    ``--gpu-pairs`` random pairs (at most what one chunk's workspace holds, so that they are one launch) of the
    corpus's GTalign chains of 250-350 residues (part a's ~300), on the default block size or
    ``--threads`` x ``--min-blocks`` for every pair; prints the second launch's seconds. Run it under a
    profiler that skips the first launch. Also prints a digest of the TM-scores' bits (A/B runs of two
    kernels: the same alignments give the same digest)."""
    import cupy as cp

    from protgpu.align import gpu

    force_block_size(gpu, args)
    gpu.PIECES = 1
    rng = np.random.default_rng(SEED)
    chains = [c for c in gtalign_chains(args.corpus) if 250 <= len(c.ca) <= 350]
    config = gpu.block_config(350, 350)
    # at most the pairs one chunk's workspace holds (WORKSPACE_BYTES), so that they are one launch
    fit = gpu.WORKSPACE_BYTES // int(gpu.workspace_bytes(350, 350, config[0] // 32))
    pairs = random_pairs(len(chains), min(args.gpu_pairs, fit), rng)
    l2 = np.array([len(chains[j].ca) for j in pairs[:, 1].tolist()], dtype=np.float64)
    ca, seqs = [c.ca for c in chains], [c.sequence for c in chains]
    gpu.tm_align_gpu(ca, ca, seqs, seqs, pairs[:8], l2[:8])
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    res = gpu.tm_align_gpu(ca, ca, seqs, seqs, pairs, l2)
    cp.cuda.Device().synchronize()
    seconds = time.perf_counter() - t0
    # a digest of every TM-score's bits: two kernels that give the same alignments print the same one
    digest = hashlib.sha1(np.stack([res.tm_mobile, res.tm_target]).tobytes()).hexdigest()[:12]
    print(f"one launch: {len(pairs)} pairs of {len(chains)} chains of 250-350 residues, "
          f"{config} threads x blocks an SM, {seconds:.3f} s, TM-scores {digest}")


HOST_SIZES = ((100, 4000), (300, 1000))


def host_throughput(args) -> dict:
    """``--host-only``: the GPU path's host work per pair, no GPU needed (:func:`host_seconds`, the
    fastest of 5 runs), on ``--quick``'s kind of pairs (48 random-walk chains of 100 and 300 residues,
    random pairs, seed 0; ``--quick-scale`` multiplies the counts): the kernel's outputs are the CPU
    path's alignments of 12 of the pairs, each repeated (pair k takes pair k mod 12's chains)."""
    import protgpu as pg
    from protgpu.align import gpu

    rng = np.random.default_rng(SEED)
    rows = []
    for size, count in HOST_SIZES:
        n = max(12, int(count * args.quick_scale))
        chains = [quick_walk(rng, size) for _ in range(48)]
        seqs = ["".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWY"), size)) for _ in chains]
        pairs = random_pairs(len(chains), n, rng)
        pairs = pairs[np.arange(n) % 12]
        res = pg.tm_align([chains[a] for a in pairs[:12, 0]], [chains[b] for b in pairs[:12, 1]], device="cpu")
        rep = np.arange(n) % 12
        res = res._replace(**{f: getattr(res, f)[rep] for f in res._fields})
        t = host_seconds(gpu, chains, pairs, [float(size)] * n, seqs, res, repeats=5)
        row = {"size": size, "pairs": n, "mean_aligned": float(np.mean(res.n_aligned)),
               **{f"{k}_us": 1e6 * v / n for k, v in t.items()}, "host_us": 1e6 * sum(t.values()) / n}
        rows.append(row)
        print_table([row], list(row))
    return {"rows": rows, "note": "host work of the GPU path per pair, microseconds (pack, launch plan, unpack); "
                                  "no GPU"}


PARTS = {"a": ("throughput", part_throughput), "b": ("search", part_search),
         "c": ("accuracy", part_accuracy), "d": ("sensitivity", part_sensitivity)}


TABLES = {"throughput": "rows", "search": "search", "accuracy": "accuracy", "sensitivity": "sensitivity"}


def to_payload(parts: dict) -> dict:
    """The results file's content: one table per part (``rows`` = throughput, ``search``,
    ``accuracy`` and ``accuracy_worst``, ``sensitivity``) and ``runs``, one row per part run (its
    time, devices, note, arguments, error)."""
    out: dict = {}
    runs = []
    for name, part in parts.items():
        out[TABLES[name]] = part.get("rows", [])
        if part.get("worst"):
            out[f"{name}_worst"] = part["worst"]
        runs.append({"part": name, **{k: v for k, v in part.items() if k not in ("rows", "worst", "machine")}})
    out["runs"] = runs
    return out


def from_payload(data: dict) -> dict:
    """The parts of a results file written by :func:`to_payload`."""
    parts = {}
    for run in data.get("runs", []):
        name = run["part"]
        part = {k: v for k, v in run.items() if k != "part"}
        part["rows"] = data.get(TABLES.get(name, name), [])
        if data.get(f"{name}_worst"):
            part["worst"] = data[f"{name}_worst"]
        parts[name] = part
    return parts


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _write(path: Path, parts: dict, info: dict | None) -> None:
    # ``machine`` given explicitly: merged files keep the machine of the runs, not this one's; no
    # ``gpu: null`` on a CPU-only machine (readers of the results format the value as text)
    info = {k: v for k, v in info.items() if not (k == "gpu" and v is None)} if info else None
    write_results("align", [], {**to_payload(parts), **({"machine": info} if info else {})}, path=str(path))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="a,b,c,d", help="comma-separated parts to run: a,b,c,d")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes of the CPU pools")
    ap.add_argument("--pairs", type=int, default=10_000, help="SCOPe pairs of the accuracy table (part c)")
    ap.add_argument("--queries", type=int, default=200, help="SCOPe query domains of part d")
    ap.add_argument("--entries", type=int, default=None,
                    help="database entries of part b (default 100,000 on the GPU, 200 on the CPU)")
    ap.add_argument("--search-bands", action="store_true",
                    help="part b: also time the query against each band of entry lengths apart")
    ap.add_argument("--gpu-pairs", type=int, default=10_000,
                    help="pairs per size on the GPU (part a; a tenth of them at 1,000 residues)")
    ap.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--json", default=None, help="results file (default results/align-<device>.json)")
    ap.add_argument("--merge", nargs="+", metavar="FILE", default=None,
                    help="run nothing: merge the parts of these results files (later files win) into --json")
    ap.add_argument("--quick", action="store_true",
                    help="only the GPU kernel on synthetic 100/300/1,000-residue chains with its per-stage split")
    ap.add_argument("--quick-scale", type=float, default=1.0, help="--quick: multiply its pair counts")
    ap.add_argument("--threads", type=int, default=None, help="--quick: the kernel's TA_THREADS (gpu.THREADS)")
    ap.add_argument("--min-blocks", type=int, default=None, help="--quick: its TA_MIN_BLOCKS (gpu.MIN_BLOCKS)")
    ap.add_argument("--pieces", type=int, default=None, help="--quick: kernels a chunk is launched as (gpu.PIECES)")
    ap.add_argument("--block-sizes", action="store_true",
                    help="only pg.tm_align's pairs/s by block size on real chains and part b's search bands")
    ap.add_argument("--block-configs", default="256x2,128x4",
                    help="--block-sizes: THREADSxMIN_BLOCKS to compare, the first is the ratios' base")
    ap.add_argument("--host-only", action="store_true",
                    help="only the GPU path's host work per pair (pack, plan, unpack) at 100 and 300 residues; no GPU")
    ap.add_argument("--one-launch", action="store_true",
                    help="only two kernel launches (a warm-up, then --gpu-pairs ~300-residue pairs), for a profiler")
    args = ap.parse_args(argv)
    if args.one_launch:
        one_launch(args)
        return 0
    if args.host_only or args.quick or args.block_sizes:  # one table each, in its own results file
        name, run = (("align-host", host_throughput) if args.host_only else
                     ("align-blocks", block_sizes) if args.block_sizes else ("align-quick", quick_throughput))
        result = run(args)
        out = Path(args.json) if args.json else RESULTS / f"{name}-{device_tag(machine())}.json"
        write_results(name, result.pop("rows"), result, path=str(out))
        print(f"wrote {out}")
        return 0
    if args.merge:
        merged, info = {}, None
        for f in args.merge:
            data = json.loads(Path(f).read_text())
            merged.update(from_payload(data))
            info = data.get("machine", info)
        out = Path(args.json) if args.json else RESULTS / f"align-{device_tag(info or machine())}.json"
        _write(out, merged, info)
        print(f"wrote {out}: parts {', '.join(merged)}")
        return 0
    gpu = gpu_usable(args.device)
    info = machine()
    path = Path(args.json) if args.json else RESULTS / f"align-{device_tag(info)}.json"
    parts = {}
    if path.exists():  # keep the parts of earlier runs
        try:
            parts = from_payload(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError):
            parts = {}
    failed = False
    for key in [p.strip() for p in args.parts.split(",") if p.strip()]:
        if key not in PARTS:
            print(f"unknown part {key!r}; parts are {', '.join(PARTS)}")
            failed = True
            continue
        name, fn = PARTS[key]
        print(f"\n## part {key}: {name}")
        t0 = time.perf_counter()
        try:
            result = fn(args, gpu)
        except Exception as exc:  # one part's failure is reported, not the end of the run
            traceback.print_exc()
            result = {"error": _err(exc)}
            failed = True
        result["wall_s"] = time.perf_counter() - t0
        result["args"] = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                  if v is not None and k not in ("merge", "json"))
        parts[name] = result
        _write(path, parts, info)
        print(f"wrote {path} ({result['wall_s']:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
