"""Residue contact maps: protgpu's fused kernel and NumPy twin against mdtraj.compute_contacts.

Same data, same run:

1. adenylate kinase (datasets/adk_open.pdb topology, adk_dims.dcd frames tiled to ``--frames``; 214
   residues, 3,341 atoms), scheme closest-heavy. GPU rows are CUDA-event times with the frames already
   on the device: the kernel alone (dense maps written, or counts only) and the public
   ``pg.contacts(..., coords=<CuPy>)`` call end to end (wall clock). Targets: >= 100,000 frames/s and
   >= 1,000x mdtraj.
2. a synthetic 5,000-residue system (adk's residues copied on a grid, one chain), closest-heavy:
   ms/frame on the GPU (target <= 5 ms) and device memory, beside mdtraj's memory (measured per atom
   pair on adk, scaled; mdtraj builds every atom pair's indices and distances).
3. the CPU path (NumPy twin) against mdtraj per frame on adk (target: at least mdtraj's speed).

mdtraj reads adk_open.pdb's elements from atom names (HG2 -> mercury), which would give it ~270 more
"heavy" atoms; its topology gets protgpu's elements so that both compute the same thing.

    python3 benchmarks/bench_contacts.py [--quick] [--frames F] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
from _common import print_table, time_cpu, time_gpu, write_results

DATA = Path(__file__).resolve().parents[1] / "datasets"


def _mdtraj_traj(s, xyz_angstrom):
    """An mdtraj Trajectory of ``s``'s topology (protgpu's elements) with the given frames."""
    import mdtraj as md

    t = md.load(str(DATA / "adk_open.pdb"))
    for atom, el in zip(t.topology.atoms, s.atoms.element.tolist(), strict=True):
        atom.element = md.element.get_by_symbol(el if len(el) == 1 else el.capitalize())
    return md.Trajectory(xyz_angstrom / 10.0, t.topology)


def _synthetic(adk, n_res: int, n_frames: int, rng):
    """``n_res`` residues: copies of adk's residues on a 3-D grid 70 Angstrom apart, one chain."""
    from protgpu.structure import AtomTable, Structure

    heavy = adk.select("heavy")
    per_copy = heavy.n_residues
    copies = -(-n_res // per_copy)
    side = int(np.ceil(copies ** (1 / 3)))
    offsets = np.array([(i, j, k) for i in range(side) for j in range(side) for k in range(side)][:copies]) * 70.0
    ri = heavy.atoms.residue_index
    keep_last = n_res - (copies - 1) * per_copy
    xyz, names, resn, resid = [], [], [], []
    for c, off in enumerate(offsets):
        m = np.ones(heavy.n_atoms, bool) if c < copies - 1 else ri < keep_last
        xyz.append(heavy.coords[0, m] + off)
        names.append(heavy.atoms.name[m])
        resn.append(heavy.atoms.resname[m])
        resid.append(ri[m] + 1 + c * per_copy)
    base = np.concatenate(xyz).astype(np.float32)
    frames = base[None] + rng.normal(scale=0.3, size=(n_frames, *base.shape)).astype(np.float32)
    atoms = AtomTable.build(np.concatenate(names), np.concatenate(resn), np.concatenate(resid),
                            np.full(len(base), "A"), element=None)
    return Structure(frames, atoms, source=f"synthetic-{n_res}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=20000, help="adk frames on the device (tiled from the DCD)")
    ap.add_argument("--big-residues", type=int, default=5000)
    ap.add_argument("--quick", action="store_true", help="small sizes (CPU-only machines)")
    ap.add_argument("--json", help="results file (default: benchmarks/results/contacts-<device>.json)")
    args = ap.parse_args()
    if args.quick:
        args.frames, args.big_residues = 200, 600

    import protgpu as pg
    from protgpu.contacts import GPUPlan, contacts, residue_keys, scheme_atoms

    rng = np.random.default_rng(0)
    traj = pg.load(DATA / "adk_dims.dcd", top=DATA / "adk_open.pdb")
    adk = pg.load(DATA / "adk_open.pdb")
    reps = -(-args.frames // traj.n_frames)
    x_all = np.ascontiguousarray(np.tile(traj.coords, (reps, 1, 1))[: args.frames])
    n_frames = len(x_all)
    rows: list[dict] = []
    extra: dict = {"adk_frames": n_frames, "adk_residues": 214, "adk_atoms": adk.n_atoms, "scheme": "closest-heavy"}

    def add(problem, impl, seconds, frames, note=""):
        rows.append({"problem": problem, "impl": impl, "frames_per_s": frames / seconds,
                     "ms_per_frame": 1e3 * seconds / frames, "note": note})

    # ---- anchors first: mdtraj on adk (CPU), same frames as protgpu's CPU path ----
    mdtraj_fps = None
    mdtraj_bytes_per_pair = None
    adk_atom_pairs = 1
    k_md = 5 if args.quick else 20
    try:
        import mdtraj as md

        t = _mdtraj_traj(adk, x_all[:k_md])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tm = time_cpu(lambda: md.compute_contacts(t, scheme="closest-heavy", periodic=False), repeat=2)
            tracemalloc.start()
            md.compute_contacts(t[:1], scheme="closest-heavy", periodic=False)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        mdtraj_fps = k_md / tm["median_s"]
        res, idx, starts = scheme_atoms(adk)
        n_i = np.diff(starts).astype(np.int64)
        iu = np.triu_indices(len(n_i), 3)
        adk_atom_pairs = int(np.sum(n_i[iu[0]] * n_i[iu[1]]))
        mdtraj_bytes_per_pair = peak / adk_atom_pairs
        add("adk 214 res", f"mdtraj.compute_contacts ({os.cpu_count()} cores)", tm["median_s"], k_md,
            f"peak host memory {peak / 1e6:.0f} MB for 1 frame ({adk_atom_pairs} atom pairs)")
    except ImportError:
        print("mdtraj not installed: mdtraj anchor skipped")

    # ---- protgpu CPU path on adk ----
    k_cpu = 10 if args.quick else 98
    s_cpu = traj.frames(slice(0, k_cpu)) if k_cpu <= traj.n_frames else traj
    tc = time_cpu(lambda: contacts(s_cpu, device="cpu"), repeat=3)
    add("adk 214 res", "protgpu CPU (NumPy twin)", tc["median_s"], s_cpu.n_frames)
    cpu_fps = s_cpu.n_frames / tc["median_s"]

    gpu = pg.gpu_available()
    if gpu:
        import cupy

        pool = cupy.get_default_memory_pool()
        xd = cupy.asarray(x_all)
        res, idx, starts = scheme_atoms(adk)
        chain, _ = residue_keys(adk, res)
        r = len(res)
        plan = GPUPlan(idx, starts, chain, res, None, n_frames, np.float32)
        dist = cupy.empty((n_frames, r, r), np.float32)
        cont = cupy.empty((n_frames, r, r), np.uint8)
        counts = cupy.zeros((r, r), np.uint32)
        tg = time_gpu(lambda: plan.launch(xd, 0, n_frames, dist, cont, counts, 3, True, 4.5), repeat=10)
        add("adk 214 res", "protgpu GPU kernel, dense maps", tg["median_s"], n_frames,
            f"{plan.n_rb} row blocks x {plan.threads} threads; "
            f"writes {n_frames * r * r * 5 / tg['median_s'] / 1e9:.0f} GB/s")
        gpu_fps = n_frames / tg["median_s"]
        tf = time_gpu(lambda: plan.launch(xd, 0, n_frames, None, None, counts, 3, True, 4.5), repeat=10)
        add("adk 214 res", "protgpu GPU kernel, frequency only", tf["median_s"], n_frames)
        del dist, cont
        pool.free_all_blocks()

        s_dev = traj.frames(slice(0, 1))

        def end_to_end():
            cm = contacts(s_dev, coords=xd)
            cupy.cuda.get_current_stream().synchronize()
            return cm

        te = time_cpu(end_to_end, repeat=3)
        add("adk 214 res", "pg.contacts(coords=CuPy) end to end", te["median_s"], n_frames, "wall clock, dense output")
        # accuracy of this run against the CPU twin on a few frames
        got = end_to_end().distances[:5].get()
        ref = contacts(traj.frames(slice(0, 5)), coords=x_all[:5], device="cpu").distances
        fin = np.isfinite(ref)
        extra["gpu_max_abs_diff_vs_twin_A"] = float(np.max(np.abs(got[fin] - ref[fin])))
        pool.free_all_blocks()
        extra["adk_gpu_frames_per_s"] = gpu_fps
        if mdtraj_fps:
            extra["adk_gpu_speedup_vs_mdtraj"] = gpu_fps / mdtraj_fps
    else:
        print("no usable GPU: GPU rows skipped")

    # ---- big synthetic system ----
    n_big_frames = 4 if args.quick else 20
    big = _synthetic(adk, args.big_residues, n_big_frames, rng)
    res, idx, starts = scheme_atoms(big)
    n_i = np.diff(starts).astype(np.int64)
    r = len(res)
    atom_pairs = int((n_i.sum() ** 2 - (n_i ** 2).sum()) // 2)
    extra.update({"big_residues": r, "big_heavy_atoms": int(n_i.sum()), "big_atom_pairs": atom_pairs})
    note_md = ""
    if mdtraj_bytes_per_pair:
        est = mdtraj_bytes_per_pair * atom_pairs
        extra["big_mdtraj_memory_bytes_estimated"] = est
        note_md = f"mdtraj would need ~{est / 1e9:.0f} GB (estimated from adk's bytes per atom pair)"
        if mdtraj_fps:
            # mdtraj's time grows with the number of atom pairs it builds and measures
            add(f"synthetic {r} res", "mdtraj.compute_contacts (estimated)",
                (atom_pairs / adk_atom_pairs) / mdtraj_fps, 1, note_md)
    if gpu:
        chain, _ = residue_keys(big, res)
        xb = cupy.asarray(big.coords)
        pool.free_all_blocks()
        before = pool.used_bytes()
        plan = GPUPlan(idx, starts, chain, res, None, n_big_frames, np.float32)
        dist = cupy.empty((n_big_frames, r, r), np.float32)
        cont = cupy.empty((n_big_frames, r, r), np.uint8)
        counts = cupy.zeros((r, r), np.uint32)
        used = pool.used_bytes() - before + xb.nbytes
        tb = time_gpu(lambda: plan.launch(xb, 0, n_big_frames, dist, cont, counts, 3, True, 4.5), repeat=5)
        add(f"synthetic {r} res", "protgpu GPU kernel, dense maps", tb["median_s"], n_big_frames,
            f"device memory {used / 1e9:.2f} GB for {n_big_frames} frames ({r * r * 5 / 1e6:.0f} MB/frame of maps)")
        extra["big_gpu_ms_per_frame"] = 1e3 * tb["median_s"] / n_big_frames
        extra["big_gpu_device_bytes"] = used
        # one frame checked against the twin
        from protgpu.contacts import allowed_pairs, residue_distances_numpy

        if r <= 2000:
            ref = residue_distances_numpy(big.coords[:1], idx, starts, allowed_pairs(chain, res, 3))
            got = dist[:1].get()
            fin = np.isfinite(ref)
            extra["big_gpu_max_abs_diff_vs_twin_A"] = float(np.max(np.abs(got[fin] - ref[fin])))
        del dist, cont
        pool.free_all_blocks()
    else:
        t0 = time.perf_counter()
        contacts(big.frames(0), device="cpu")
        add(f"synthetic {r} res", "protgpu CPU (NumPy twin)", time.perf_counter() - t0, 1)

    if mdtraj_fps:
        for row in rows:
            if row["problem"].startswith("adk"):
                row["x_mdtraj"] = row["frames_per_s"] / mdtraj_fps
        extra["cpu_speedup_vs_mdtraj"] = cpu_fps / mdtraj_fps
    print(f"\nresidue contact maps, closest-heavy, cutoff 4.5 A, |i-j| >= 3; adk frames on device: {n_frames}\n")
    print_table(rows, ["problem", "impl", "frames_per_s", "ms_per_frame", "x_mdtraj", "note"])
    path = write_results("contacts", rows, extra, args.json)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
