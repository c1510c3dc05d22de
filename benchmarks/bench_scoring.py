"""Structure scores: protgpu's TM-score and lDDT against tmtools (TM-align) and biotite.structure.lddt.

Same data, same run. Default problem (the issue's): 10,000 models x 300 residues against one
reference, coordinates already on the device; then end to end from 10,000 PDB files (written to a
temporary folder), with the time split into parsing, residue matching + batching, and scoring.

* TM-score: protgpu's full TMscore-program search on the GPU (every model, every seed fragment, both
  searches) vs tmtools.tm_align in a process pool over all cores (TM-align: a different, alignment-
  searching algorithm, but the usual CPU tool for the job) and vs protgpu's own NumPy path.
* lDDT: all-atom lDDT with symmetry resolution on the GPU vs biotite.structure.lddt (no symmetry).

The models are the reference (first L residues of 7W1F chain B from the shared datasets, else the
repository's adk_open.pdb) under a random rigid motion, per-residue noise of 0.3-3 A and, in a third
of them, a hinge motion. ``--quick`` shrinks everything so that the script runs on a laptop (CPU
only). Anchors that are not installed are skipped (and say so).

    python3 benchmarks/bench_scoring.py [--quick] [--models M] [--residues L] [--files F] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from _common import HERE, print_table, time_cpu, time_gpu, write_results

DATA = HERE.parent / "datasets"  # the parity data shipped with the repository


# --------------------------------------------------------------------------------------------------
# data


def reference_structure(n_res: int):
    """The reference: the first ``n_res`` residues of 7W1F chain B (or of adk_open.pdb), heavy atoms."""
    import protgpu as pg

    path = DATA / "openstructure" / "7W1F_B_target.pdb"
    if not path.is_file():
        path = HERE.parent / "datasets" / "adk_open.pdb"
    s = pg.load(path).select("heavy")
    keep = np.flatnonzero(s.atoms.residue_index < n_res)
    return s.select(keep), path.name


def _rotations(rng, m):
    q = rng.normal(size=(m, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    w, x, y, z = q.T
    return np.stack([w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y),
                     2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x),
                     2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z], axis=1).reshape(m, 3, 3)


def perturbed_models(ref, m: int, seed: int = 0, chunk: int = 500) -> np.ndarray:
    """(m, atoms, 3) float32 models: rigid motion + residue-correlated noise (+ a hinge for a third)."""
    rng = np.random.default_rng(seed)
    x0 = ref.coords[0].astype(np.float64)
    res = ref.atoms.residue_index
    n_res = int(res.max()) + 1
    centre = x0.mean(axis=0)
    out = np.empty((m, len(x0), 3), dtype=np.float32)
    for m0 in range(0, m, chunk):
        k = min(chunk, m - m0)
        sigma = rng.uniform(0.3, 3.0, size=(k, 1, 1))
        per_res = rng.normal(size=(k, n_res, 3)) * sigma
        x = x0[None] + per_res[:, res] + rng.normal(scale=0.3, size=(k, len(x0), 3))
        hinge = rng.random(k) < 1 / 3
        if hinge.any():
            # the second half turns by 10-40 degrees about its first residue: one superposition no
            # longer fits everything, which is what the seed search is for
            cut = n_res // 2
            pivot = x0[res == cut].mean(axis=0)
            h = int(hinge.sum())
            ang = np.radians(rng.uniform(10, 40, size=h))
            rot = np.tile(np.eye(3), (h, 1, 1))
            rot[:, 0, 0] = rot[:, 1, 1] = np.cos(ang)
            rot[:, 0, 1], rot[:, 1, 0] = -np.sin(ang), np.sin(ang)
            tail = res >= cut
            xs = x[hinge]
            xs[:, tail] = np.einsum("mij,mnj->mni", rot, xs[:, tail] - pivot) + pivot
            x[hinge] = xs
        r = _rotations(rng, k)
        t = rng.normal(scale=30.0, size=(k, 1, 3))
        out[m0:m0 + k] = np.einsum("mij,mnj->mni", r, x - centre) + centre + t
    return out


def write_pdbs(ref, coords: np.ndarray, folder: Path) -> list[str]:
    """Write each model as a PDB file, fast: a fixed byte template per atom, coordinates filled in
    with integer arithmetic (PDB columns 31-54, %8.3f)."""
    a = ref.atoms
    n = ref.n_atoms
    lines = []
    for i in range(n):
        name = a.name[i]
        name = f" {name:<3s}" if len(name) < 4 else name[:4]
        lines.append(f"ATOM  {i + 1:5d} {name}{'':1s}{a.resname[i]:>3s} {a.chain[i] or 'A':1s}{a.resid[i]:4d}"
                     f"{a.icode[i] or ' ':1s}   {0.0:8.3f}{0.0:8.3f}{0.0:8.3f}{1.0:6.2f}{0.0:6.2f}"
                     f"          {a.element[i]:>2s}  \n")
    template = np.frombuffer("".join(lines).encode(), dtype=np.uint8).reshape(n, 81).copy()
    paths = []
    digits = np.frombuffer(b"0123456789", dtype=np.uint8)
    for m, xyz in enumerate(coords):
        buf = template.copy()
        for c in range(3):
            v = np.round(xyz[:, c].astype(np.float64) * 1000).astype(np.int64)
            neg = v < 0
            v = np.abs(v)
            field = np.full((n, 8), ord(" "), dtype=np.uint8)
            field[:, 7] = digits[v % 10]
            field[:, 6] = digits[(v // 10) % 10]
            field[:, 5] = digits[(v // 100) % 10]
            field[:, 4] = ord(".")
            ip = v // 1000
            field[:, 3] = digits[ip % 10]
            sign_pos = np.full(n, 2)
            for pos, div in ((2, 10), (1, 100), (0, 1000)):
                has = ip >= div
                field[has, pos] = digits[(ip[has] // div) % 10]
                sign_pos[has] = pos - 1
            rows = np.flatnonzero(neg)
            field[rows, np.maximum(sign_pos[rows], 0)] = ord("-")
            buf[:, 30 + 8 * c:38 + 8 * c] = field
        p = folder / f"model_{m:05d}.pdb"
        p.write_bytes(buf.tobytes() + b"END\n")
        paths.append(str(p))
    return paths


# --------------------------------------------------------------------------------------------------
# anchors


def _tmalign_one(args):
    import tmtools

    x, y, seq = args
    return tmtools.tm_align(x, y, seq, seq).tm_norm_chain2


def time_tmtools(models_ca, ref_ca, seq, n_procs):
    jobs = [(np.ascontiguousarray(x, dtype=np.float64), np.ascontiguousarray(ref_ca, dtype=np.float64), seq)
            for x in models_ca]
    with Pool(n_procs) as pool:
        pool.map(_tmalign_one, jobs[:n_procs])  # start-up
        t0 = time.perf_counter()
        pool.map(_tmalign_one, jobs, chunksize=max(1, len(jobs) // (4 * n_procs)))
        return time.perf_counter() - t0


def biotite_reference(ref, folder: Path):
    import biotite.structure.io.pdb as bpdb

    p = write_pdbs(ref, ref.coords, folder)[0]
    return bpdb.PDBFile.read(p).get_structure(model=1)


# --------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=10_000)
    ap.add_argument("--residues", type=int, default=300)
    ap.add_argument("--files", type=int, default=10_000, help="PDB files for the end-to-end run (0: skip)")
    ap.add_argument("--anchor-models", type=int, default=2000, help="models the CPU anchors score (rates scale)")
    ap.add_argument("--quick", action="store_true", help="small sizes (CPU-only machines)")
    ap.add_argument("--json", help="results file (default: benchmarks/results/scoring-<device>.json)")
    args = ap.parse_args()
    if args.quick:
        args.models, args.residues, args.files, args.anchor_models = 16, 80, 8, 8

    import protgpu as pg
    from protgpu.scoring import lddt, tm_score
    from protgpu.scoring.lddt import lddt_inputs
    from protgpu.scoring.tmscore import tm_inputs

    ref, ref_name = reference_structure(args.residues)
    n_res = ref.n_residues
    ca_idx = ref.select_indices("name CA")
    seq = "".join({"ALA": "A", "ARG": "R", "ASN": "N", "ASP": "D", "CYS": "C", "GLN": "Q", "GLU": "E", "GLY": "G",
                   "HIS": "H", "ILE": "I", "LEU": "L", "LYS": "K", "MET": "M", "PHE": "F", "PRO": "P", "SER": "S",
                   "THR": "T", "TRP": "W", "TYR": "Y", "VAL": "V"}.get(r, "X") for r in ref.residues.resname)
    t0 = time.perf_counter()
    models = perturbed_models(ref, args.models)
    print(f"reference: {ref_name}, {n_res} residues, {ref.n_atoms} heavy atoms; {args.models} models made in "
          f"{time.perf_counter() - t0:.1f} s")
    models_ca = models[:, ca_idx]
    ref_ca = ref.coords[0, ca_idx]
    rows: list[dict] = []
    cores = os.cpu_count() or 1
    gpu = pg.gpu_available()

    def add(task, impl, n, t, note=""):
        rows.append({"task": task, "impl": impl, "models": n, "seconds": t, "models_per_s": n / t, "note": note})

    # ---- TM-score ----------------------------------------------------------------------------------
    if gpu:
        import cupy

        from protgpu.scoring import tmscore as tm_mod

        xd, yd = cupy.asarray(models_ca), cupy.asarray(ref_ca)
        t = time_gpu(lambda: tm_score(xd, yd), repeat=3, warmup=1)
        add("tm_score", "protgpu GPU (float32 in, float64 arithmetic)", args.models, t["median_s"],
            "full TMscore search, both stages, GDT/MaxSub/RMSD included; coordinates on device")
        tm_mod._TM_EVAL_STORAGE = 1
        try:
            t = time_gpu(lambda: tm_score(xd, yd), repeat=3, warmup=1)
            add("tm_score", "protgpu GPU (TM_EVAL_STORAGE=1, float32 distances)", args.models, t["median_s"],
                "knob: float32 distance arithmetic")
        finally:
            tm_mod._TM_EVAL_STORAGE = 0
        del xd, yd
    n_cpu = min(args.models, 4 if not args.quick else 2)
    t = time_cpu(lambda: tm_score(models_ca[:n_cpu], ref_ca, device="cpu"), repeat=1, warmup=1)
    add("tm_score", "protgpu CPU (NumPy twin)", n_cpu, t["median_s"], "same search, float64")
    try:
        import tmtools  # noqa: F401

        n_anchor = min(args.models, args.anchor_models)
        secs = time_tmtools(models_ca[:n_anchor], ref_ca, seq, cores)
        add("tm_score", f"tmtools.tm_align, pool of {cores} processes", n_anchor, secs,
            "TM-align (searches the alignment too); rate extrapolates")
    except ImportError:
        print("tmtools not installed: TM-score anchor skipped")

    # ---- lDDT --------------------------------------------------------------------------------------
    if gpu:
        import cupy

        xd = cupy.asarray(models)
        t = time_gpu(lambda: lddt(xd, ref), repeat=3, warmup=1)
        add("lddt", "protgpu GPU all-atom, symmetry (float32)", args.models, t["median_s"], "coordinates on device")
        t = time_gpu(lambda: lddt(xd, ref, symmetry=False), repeat=3, warmup=1)
        add("lddt", "protgpu GPU all-atom, no symmetry (float32)", args.models, t["median_s"], "biotite's definition")
        del xd
    n_cpu = min(args.models, 8)
    t = time_cpu(lambda: lddt(models[:n_cpu], ref, device="cpu"), repeat=1, warmup=1)
    add("lddt", "protgpu CPU (NumPy twin), symmetry", n_cpu, t["median_s"], "float64")
    tmp = Path(tempfile.mkdtemp(prefix="protgpu_bench_"))
    try:
        try:
            import biotite.structure as bs

            ref_bt = biotite_reference(ref, tmp)
            n_anchor = min(args.models, 50 if not args.quick else 4)
            sub = models[:n_anchor]
            t = time_cpu(lambda: bs.lddt(ref_bt, sub), repeat=1, warmup=1)
            add("lddt", "biotite.structure.lddt (one process)", n_anchor, t["median_s"], "no symmetry resolution")
        except ImportError:
            print("biotite not installed: lDDT anchor skipped")

        # ---- end to end from files ----------------------------------------------------------------
        if args.files:
            n_files = min(args.files, args.models)
            t0 = time.perf_counter()
            paths = write_pdbs(ref, models[:n_files], tmp)
            t_write = time.perf_counter() - t0
            size = sum(os.path.getsize(p) for p in paths[:10]) / min(10, len(paths))
            t0 = time.perf_counter()
            with ThreadPoolExecutor(min(16, cores)) as ex:
                structs = list(ex.map(pg.load, paths))
            t_load = time.perf_counter() - t0
            t0 = time.perf_counter()
            tm_inputs(structs, ref, dtype=np.float32)
            t_match_tm = time.perf_counter() - t0
            t0 = time.perf_counter()
            lddt_inputs(structs, ref, dtype=np.float32)
            t_match_lddt = time.perf_counter() - t0
            device = "gpu" if gpu else "cpu"
            subset = structs if gpu else structs[:4]
            t0 = time.perf_counter()
            tm_score(subset, ref, device=device)
            t_tm = time.perf_counter() - t0
            t0 = time.perf_counter()
            lddt(subset, ref, device=device)
            t_ld = time.perf_counter() - t0
            n_scored = len(subset)
            note = (f"{n_files} files of {size / 1024:.0f} KiB; written in {t_write:.1f} s (not counted); "
                    f"parse {t_load:.2f} s ({min(16, cores)} threads); residue matching + batching "
                    f"{t_match_tm:.2f} s (TM) + {t_match_lddt:.2f} s (lDDT) for all files; "
                    f"tm_score {t_tm:.2f} s and lddt {t_ld:.2f} s for {n_scored} models on the {device.upper()} "
                    "(each includes its matching)")
            print("end to end:", note)
            total = t_load + (t_tm + t_ld) * (n_files / n_scored)
            add("end_to_end", f"protgpu load + tm_score + lddt ({device})", n_files, total, note)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    # ratios against the anchors
    def rate(task, prefix):
        for r in rows:
            if r["task"] == task and r["impl"].startswith(prefix):
                return r["models_per_s"]
        return None

    for r in rows:
        base = rate(r["task"], "tmtools") if r["task"] == "tm_score" else rate(r["task"], "biotite")
        r["x_anchor"] = r["models_per_s"] / base if base else None
    print_table(rows, ["task", "impl", "models", "seconds", "models_per_s", "x_anchor", "note"])
    out = write_results("scoring", rows, {"residues": n_res, "atoms": ref.n_atoms, "models": args.models,
                                          "reference": ref_name, "quick": args.quick}, path=args.json)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
