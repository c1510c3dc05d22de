"""Residue contact maps on the CPU: agreement with mdtraj.compute_contacts and the reference values,
invariances (symmetry, separation, tile size), periodic boxes, sparse/frequency outputs, native
contacts, the CLI and the heatmap. The CUDA kernel's parity with the NumPy twin is in
test_contacts_gpu.py; here a line-by-line emulation of the kernel's loops checks its block, chunk and
write logic on the CPU."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import re
import sys
import types
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protgpu as pg
from protgpu import _cuda
from protgpu._array import Backend
from protgpu._pbc import half_plane_spacing_sq
from protgpu.contacts import (
    SCHEMES,
    allowed_pairs,
    contacts,
    contacts_cuda,
    interleaved_rows,
    native_contacts,
    residue_distances_numpy,
    scheme_atoms,
)
from protgpu.errors import InputError
from protgpu.structure import AtomTable, Structure

md = pytest.importorskip("mdtraj")
contacts_api = importlib.import_module("protgpu.contacts.api")  # (protgpu.contacts is also the function)
contacts_gpu = importlib.import_module("protgpu.contacts.cuda")
pytestmark = pytest.mark.filterwarnings("ignore:Unlikely unit cell vectors:UserWarning")

TOL = 1e-4  # Angstrom


# --------------------------------------------------------------------------------------------------
# helpers


def _mdtraj_with_our_elements(t, s):
    """mdtraj reads elements of files without an element column from atom names (HG2 -> mercury, CD
    -> cadmium on adk_open.pdb); give it protgpu's elements so the comparison is of the schemes and
    the arithmetic, not of element guessing."""
    for atom, el in zip(t.topology.atoms, s.atoms.element.tolist(), strict=True):
        sym = "H" if el == "D" else el
        try:
            atom.element = md.element.get_by_symbol(sym if len(sym) == 1 else sym.capitalize())
        except KeyError:
            pass
    return t


def _compare_with_mdtraj(s, t, scheme, inter_chain=False, every=1):
    """Our map at mdtraj's residue pairs (Angstrom) and mdtraj's distances (converted to Angstrom).
    ``every`` > 1 asks mdtraj for every n-th pair of its ``contacts="all"`` set only (it is slow on
    thousands of atoms); the pair set itself is checked on the smaller structures."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        which = "all"
        if every > 1:
            # mdtraj's "all" for one chain of amino acids (resolving it in mdtraj is slow Python)
            assert t.n_chains == 1 and all(any(a.name == "CA" for a in r.atoms) for r in t.topology.residues)
            which = np.stack(np.triu_indices(t.n_residues, 3), axis=1)[::every]
        dm, rp = md.compute_contacts(t, contacts=which, scheme=scheme, periodic=s.box is not None)
    cm = contacts(s, scheme=scheme, inter_chain=inter_chain, device="cpu")
    pos = -np.ones(s.n_residues, dtype=np.int64)
    pos[cm.residues.index] = np.arange(len(cm.residues))
    assert (pos[rp] >= 0).all()
    return cm, rp, pos, cm.distances[:, pos[rp[:, 0]], pos[rp[:, 1]]], 10.0 * dm


def _n_upper_finite(d):
    return int(np.triu(np.isfinite(d), 1).sum())


def _brute_force(x, atom_idx, starts, allowed):
    """Direct per-pair minimum with the twin's arithmetic order (so the results are bit-identical)."""
    f_n = x.shape[0]
    r = len(starts) - 1
    out = np.full((f_n, r, r), np.inf, dtype=x.dtype)
    for f in range(f_n):
        xs = x[f][atom_idx]
        d = xs[None, :, :] - xs[:, None, :]
        d2 = (d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1]) + d[..., 2] * d[..., 2]
        for i in range(r):
            for j in range(r):
                a = d2[starts[i]:starts[i + 1], starts[j]:starts[j + 1]]
                if a.size:
                    out[f, i, j] = np.sqrt(a.min())
    out[:, ~allowed] = np.inf
    return out


def _random_system(rng, n_res, max_atoms, n_frames=2, empty_ok=True, scale=12.0, dtype=np.float32):
    counts = rng.integers(0 if empty_ok else 1, max_atoms + 1, size=n_res)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n_atoms = int(starts[-1]) + 3
    x = (rng.normal(scale=scale, size=(n_frames, n_atoms, 3))).astype(dtype)
    # atom_idx: a permutation subset of the atoms, so that the gather is exercised
    atom_idx = rng.permutation(n_atoms)[: starts[-1]].astype(np.int64)
    return x, atom_idx, starts


# --------------------------------------------------------------------------------------------------
# The CUDA path on the CPU: protgpu.contacts' host code (GPUPlan, contacts_cuda, contacts(device="gpu"))
# runs unchanged against a NumPy stand-in for CuPy, and its kernel launches run _emulate_contact_map,
# a statement-by-statement NumPy transcription of contact_map_body (PBC none). The emulation takes the
# launch's arguments by the entry point's parameter names (parsed from kernels/contacts.cu) and its
# pointer outputs as flat buffers, so the host/kernel contract (what the host passes, what the kernel
# writes, what the host then makes of it) is checked here, not just the kernel's loops.


class _FakeDeviceArray(np.ndarray):
    """A NumPy array standing in for a CuPy one (``.get()`` copies it to a plain ndarray)."""

    def get(self):
        return np.array(self)


def _dev(a):
    return np.asarray(a).view(_FakeDeviceArray)


def _fake_cupy():
    m = types.ModuleType("cupy")
    m.ndarray = _FakeDeviceArray
    m.float64 = np.float64
    m.asarray = lambda a, dtype=None: _dev(np.array(a, dtype=dtype, copy=None))
    m.ascontiguousarray = lambda a: _dev(np.ascontiguousarray(a))
    m.zeros = lambda shape, dtype=float: _dev(np.zeros(shape, dtype))
    m.ones = lambda shape, dtype=float: _dev(np.ones(shape, dtype))
    m.triu = lambda a, k=0: _dev(np.triu(a, k))
    m.nonzero = lambda a: tuple(_dev(v) for v in np.nonzero(a))
    m.concatenate = lambda arrays: _dev(np.concatenate([np.asarray(a) for a in arrays]))

    def empty(shape, dtype=float):
        # device memory is not cleared: poison it so that an output the kernel never writes shows
        out = np.empty(shape, dtype)
        out.fill(np.nan if out.dtype.kind == "f" else 0xAB)
        return _dev(out)

    m.empty = empty
    return m


def _kernel_defaults():
    """The tile #defines of kernels/contacts.cu and their default values."""
    src = (_cuda.kernel_dir() / "contacts.cu").read_text()
    return {k: int(v) for k, v in re.findall(r"#ifndef (\w+)\s*\n#define \1 (\d+)", src)}


def _fake_get_kernel(name, entry, defines=None):
    assert name == "contacts"
    return types.SimpleNamespace(name=name, entry=entry, params=_cuda.entry_points(name)[entry],
                                 defines={**_kernel_defaults(), **(defines or {})})


def _fake_launch(record, handle, grid, block, *args, shared_mem=0):
    """protgpu._cuda.launch's argument checks, then the emulated kernel."""
    assert len(args) == len(handle.params)
    named = {}
    for p, a in zip(handle.params, args, strict=True):
        if p.pointer:
            assert a is None or (isinstance(a, _FakeDeviceArray) and a.dtype == p.dtype and a.flags.c_contiguous), \
                (p.name, type(a), getattr(a, "dtype", None))
            named[p.name] = None if a is None else a.reshape(-1)  # a flat view: the kernel's pointer
        else:
            v = p.dtype(a)
            assert v == a, (p.name, a)
            named[p.name] = v
    assert isinstance(grid, int) and 0 < grid < 2**31 and isinstance(block, int)
    assert 32 <= block <= 256 and block % 32 == 0
    record["launches"].append(_emulate_contact_map(named, grid, block, handle.defines))


def _emulate_contact_map(a, grid, nt, defines):
    """contact_map_body<T, PG_PBC_NONE> for every block of the grid. Writes a["dist"], a["contact"],
    a["counts"] (flat, as the kernel's pointers) in place; returns how often each dist/contact element
    (frame, i, j) of this launch was written."""
    assert a["pbc"] == 0, "the emulation covers the non-periodic kernel"
    RPT, RB, JT, COLS = (defines[k] for k in ("RPT", "RB", "JT", "COLS"))
    xyz, atom_idx, row_idx, row_res = a["xyz"], a["atom_idx"], a["row_idx"], a["row_res"]
    starts, rb_starts, chain, seq = a["starts"], a["rb_starts"], a["res_chain"], a["res_seq"]
    dist, contact, counts = a["dist"], a["contact"], a["counts"]
    n_frames, n_atoms, n_res, n_rb = (int(a[k]) for k in ("n_frames", "n_atoms", "n_res", "n_rb"))
    T = xyz.dtype.type
    cutoff = T(a["cutoff"])
    cols_t = COLS if xyz.dtype == np.float32 else COLS // 2
    RR = n_res * n_res
    written = np.zeros(n_frames * RR, dtype=np.int64)

    def allowed(i, j):  # pg_pair_allowed
        if i == j:
            return False
        if chain[i] != chain[j]:
            return a["inter_chain"] != 0
        return abs(int(seq[i]) - int(seq[j])) >= a["min_sep"]

    def atoms(idx, xf):  # the kernel's p = xf + idx * 3; p[0], p[1], p[2]
        p = xf + idx.astype(np.int64) * 3
        return np.stack([xyz[p], xyz[p + 1], xyz[p + 2]], axis=-1)

    for bid in range(grid):
        f = bid // n_rb
        if f >= n_frames:
            continue
        rb = bid - f * n_rb
        I0, I1 = int(rb_starts[rb]), int(rb_starts[rb + 1])
        nI = I1 - I0
        A0, A1 = int(starts[I0]), int(starts[I1])
        xf = f * n_atoms * 3
        j0 = I0
        while j0 < n_res:
            j1 = j0 + 1
            lim = min(j0 + JT, n_res)
            base = int(starts[j0])
            while j1 < lim and starts[j1 + 1] - base <= cols_t:
                j1 += 1
            nj = j1 - j0
            assert nI * nj <= RB * JT and nj <= JT  # s_min[RB * JT], s_cs[JT + 1]
            s_min = np.full(nI * nj, np.inf, dtype=T)
            s_cs = starts[j0:j0 + nj + 1].astype(np.int64)
            B0, B1 = int(s_cs[0]), int(s_cs[nj])
            for sb in range(B0, B1, cols_t):
                se = min(sb + cols_t, B1)
                s_col = atoms(atom_idx[sb:se], xf)
                for rbase in range(A0, A1, nt * RPT):
                    for r in range(RPT):  # thread tid's r-th row atom, all threads at once
                        at = rbase + np.arange(nt) + r * nt
                        at = at[at < A1]
                        if at.size == 0:
                            continue
                        rows = atoms(row_idx[at], xf)
                        ril = row_res[at].astype(np.int64) - I0
                        assert ((ril >= 0) & (ril < nI)).all()
                        for jl in range(nj):
                            lo, hi = max(int(s_cs[jl]), sb) - sb, min(int(s_cs[jl + 1]), se) - sb
                            if lo >= hi:
                                continue
                            d = s_col[None, lo:hi] - rows[:, None]
                            d2 = (d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1]) + d[..., 2] * d[..., 2]
                            np.minimum.at(s_min, ril * nj + jl, d2.min(axis=1))  # atomicMin
            for k in range(nI * nj):  # upper triangle
                il, jl = divmod(k, nj)
                i, j = I0 + il, j0 + jl
                if j < i:
                    continue
                ok = allowed(i, j)
                d = np.sqrt(s_min[k]) if ok else T(np.inf)
                c = ok and d < cutoff
                o = f * RR + i * n_res + j
                if dist is not None:
                    dist[o] = d
                if contact is not None:
                    contact[o] = 1 if c else 0
                if dist is not None or contact is not None:
                    written[o] += 1
                if counts is not None and c:
                    counts[i * n_res + j] += 1  # atomicAdd
            if dist is not None or contact is not None:
                for k in range(nI * nj):  # mirror
                    jl, il = divmod(k, nI)
                    i, j = I0 + il, j0 + jl
                    if j <= i:
                        continue
                    ok = allowed(i, j)
                    d = np.sqrt(s_min[il * nj + jl]) if ok else T(np.inf)
                    o = f * RR + j * n_res + i
                    if dist is not None:
                        dist[o] = d
                    if contact is not None:
                        contact[o] = 1 if (ok and d < cutoff) else 0
                    written[o] += 1
            j0 = j1
    return written.reshape(n_frames, n_res, n_res)


@contextlib.contextmanager
def _emulated_gpu(max_threads=None, budget=1 << 30):
    """Within the block, protgpu.contacts' GPU path runs on the CPU: NumPy stands in for CuPy, the
    emulation for the kernel, and contacts(device="gpu") takes the GPU branch (NumPy in, NumPy out).
    Yields a record whose "launches" list gets each launch's write counts."""
    record = {"launches": []}
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "cupy", _fake_cupy())
        mp.setattr(_cuda, "get_kernel", _fake_get_kernel)
        mp.setattr(_cuda, "launch", functools.partial(_fake_launch, record))
        mp.setattr(contacts_api, "dispatch",
                   lambda *inputs, device="auto": Backend("numpy", "cpu" if device == "cpu" else "gpu"))
        mp.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(int(budget)))
        if max_threads is not None:
            mp.setattr(contacts_gpu, "MAX_THREADS", int(max_threads))
        yield record


def _emulate_kernel(x, atom_idx, starts, chain, seq, *, min_sep, inter_chain, cutoff, RB, JT, COLS, RPT,
                    max_threads=256, budget=1 << 30):
    """contacts_cuda (dense, device outputs) on the emulated GPU with the given tile #defines. Returns
    its dist, contact and counts as NumPy arrays and how often each (frame, i, j) output was written."""
    with _emulated_gpu(max_threads=max_threads, budget=budget) as rec:
        d, c, counts, _ = contacts_cuda(x, atom_idx, starts, chain, seq, None, cutoff=cutoff, min_sep=min_sep,
                                         inter_chain=inter_chain, keep="dense", dense_on_host=False,
                                         defines={"RB": RB, "JT": JT, "COLS": COLS, "RPT": RPT})
        written = np.concatenate(rec["launches"])
        return d.get(), c.get(), counts.get(), written


# --------------------------------------------------------------------------------------------------
# agreement with mdtraj and the reference values


@pytest.fixture(scope="module")
def adk(datasets):
    return pg.load(datasets / "adk_open.pdb")


def test_reference_values_1vii(shared_datasets, reference_values):
    ref = reference_values["contacts_1vii"]
    s = pg.load(shared_datasets / ref["file"])
    pairs = np.asarray(ref["residue_pairs"])
    for scheme, key in (("ca", "ca_dist_nm"), ("closest-heavy", "closest_heavy_dist_nm")):
        cm = contacts(s, scheme=scheme, device="cpu")
        assert len(cm.residues) == ref["n_residues"]
        got = cm.distances[0, pairs[:, 0], pairs[:, 1]]
        # the reference is rounded to 1e-6 nm = 1e-5 Angstrom
        np.testing.assert_allclose(got, 10.0 * np.asarray(ref[key]), atol=TOL, rtol=0)
        # every mdtraj pair and no other is in our pair set (one chain: inter_chain does not matter)
        assert _n_upper_finite(cm.distances[0]) == len(pairs)
        want = {tuple(p) for p in ref[f"{key.replace('_dist_nm', '')}_contacts_lt_0.8nm"]}
        c8 = contacts(s, scheme=scheme, cutoff=8.0, device="cpu")
        have = {tuple(p) for p in np.argwhere(np.triu(c8.contacts[0], 1)).tolist()}
        near = {tuple(p) for p in pairs[np.abs(got - 8.0) < TOL].tolist()}
        assert have ^ want <= near
        assert len(want) == ref[f"n_{key.replace('_dist_nm', '')}_contacts_lt_0.8nm"]


def test_reference_values_bpti_shipped(shared_datasets, reference_values):
    ref = reference_values["contacts_bpti_mdtraj_shipped"]
    s = pg.load(shared_datasets / ref["file"])
    pairs = np.asarray(ref["residue_pairs"])
    for scheme, key in (("ca", "cc_ca.dat"), ("closest-heavy", "cc_closest-heavy.dat")):
        cm = contacts(s, scheme=scheme, device="cpu")
        got = cm.distances[0, pairs[:, 0], pairs[:, 1]]
        np.testing.assert_allclose(got, 10.0 * np.asarray(ref[key]), atol=TOL, rtol=0)


@pytest.mark.parametrize("name", ["mdtraj/1vii.pdb", "mdtraj/bpti.pdb", "mdtraj/2EQQ.pdb", "mdtraj/1bpi.pdb"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_equals_mdtraj_on_shared_structures(shared_datasets, name, scheme):
    s = pg.load(shared_datasets / name)
    t = _mdtraj_with_our_elements(md.load(str(shared_datasets / name)), s)
    if name == "mdtraj/1bpi.pdb" and scheme.startswith("sidechain"):
        # No hydrogens: glycines have no side-chain atom. mdtraj raises; we give +inf for them.
        cm = contacts(s, scheme=scheme, device="cpu")
        gly = np.asarray(cm.residues.name) == "GLY"
        assert gly.any() and np.isinf(cm.distances[0][gly]).all()
        assert np.isfinite(cm.distances[0][~gly][:, ~gly][np.triu(allowed_pairs(
            np.zeros((~gly).sum(), int), cm.residues.index[~gly]), 1)]).all()
        return
    cm, rp, pos, got, want = _compare_with_mdtraj(s, t, scheme)
    assert np.max(np.abs(got - want)) < TOL
    # the pair set is mdtraj's: every other upper-triangle entry is +inf
    assert _n_upper_finite(cm.distances[0]) == len(rp)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_equals_mdtraj_on_repo_structure_and_trajectory(datasets, adk, scheme):
    t = _mdtraj_with_our_elements(md.load(str(datasets / "adk_open.pdb")), adk)
    t.unitcell_vectors = None  # protgpu does not read a PDB's CRYST1 as a periodic box
    _, _, _, got, want = _compare_with_mdtraj(adk, t, scheme, every=9)
    assert np.max(np.abs(got - want)) < TOL
    traj = pg.load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb").frames(slice(0, 98, 60))
    tt = _mdtraj_with_our_elements(md.load(str(datasets / "adk_dims.dcd"), top=str(datasets / "adk_open.pdb"))[::60],
                                   traj)
    _, _, _, got, want = _compare_with_mdtraj(traj, tt, scheme, every=11)
    assert got.shape[0] == 2 and np.max(np.abs(got - want)) < TOL


@pytest.mark.parametrize("scheme", ["ca", "closest-heavy", "sidechain"])
def test_equals_mdtraj_on_periodic_trajectory(shared_datasets, scheme):
    top = shared_datasets / "mdtraj" / "1am7_protein.pdb"
    xtc = shared_datasets / "mdtraj" / "1am7_corrected.xtc"
    s = pg.load(xtc, top=top).frames(slice(0, 51, 17))
    assert s.box is not None
    t = _mdtraj_with_our_elements(md.load(str(xtc), top=str(top))[::17], s)
    cm, _, _, got, want = _compare_with_mdtraj(s, t, scheme)
    assert np.max(np.abs(got - want)) < TOL
    # the box matters here: without it some far pairs are longer
    plain = contacts(s, scheme=scheme, periodic=False, device="cpu").distances
    assert (plain > cm.distances + 1.0).any()


def test_triclinic_box_equals_mdtraj(datasets, adk):
    t = _mdtraj_with_our_elements(md.load(str(datasets / "adk_open.pdb")), adk)
    assert t.unitcell_vectors is not None  # CRYST1 80 80 80 60 60 90
    s = Structure(adk.coords, adk.atoms, source="adk_triclinic", box=t.unitcell_vectors * 10.0)
    for scheme in ("ca", "closest-heavy"):
        cm, _, _, got, want = _compare_with_mdtraj(s, t, scheme, every=1 if scheme == "ca" else 4)
        assert np.max(np.abs(got - want)) < TOL
        plain = contacts(adk, scheme=scheme, device="cpu").distances
        finite = np.isfinite(plain)
        assert (plain[finite] - cm.distances[finite] > 1.0).any()


def test_inter_chain_pairs(shared_datasets):
    s = pg.load(shared_datasets / "biopython" / "2BEG.pdb")
    t = _mdtraj_with_our_elements(md.load(str(shared_datasets / "biopython" / "2BEG.pdb")), s)
    cm, rp, pos, got, want = _compare_with_mdtraj(s, t, "closest-heavy", inter_chain=False)
    assert np.max(np.abs(got - want)) < TOL
    assert _n_upper_finite(cm.distances[0]) == len(rp)
    full = contacts(s, device="cpu")  # inter_chain=True: pairs across the fibril's chains too
    chains = full.residues.chain
    across = chains[:, None] != chains[None, :]
    assert np.isfinite(full.distances[0][across]).all()
    assert full.contacts[0][across].any()
    # spot-check cross-chain pairs against mdtraj with explicit residue pairs
    ij = np.argwhere(np.triu(across, 1))[::97]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm, _ = md.compute_contacts(t, contacts=full.residues.index[ij], scheme="closest-heavy", periodic=False)
    assert np.max(np.abs(full.distances[0, ij[:, 0], ij[:, 1]] - 10.0 * dm[0])) < TOL


# --------------------------------------------------------------------------------------------------
# schemes and residues


def test_scheme_atoms_definitions(adk):
    names = adk.atoms.name
    res, idx, starts = scheme_atoms(adk, "ca")
    assert (names[idx] == "CA").all() and len(idx) == len(res) == 214
    _, idx, _ = scheme_atoms(adk, "closest-heavy")
    assert not np.isin(adk.atoms.element[idx], ("H", "D")).any()
    assert len(idx) == int((~np.isin(adk.atoms.element, ("H", "D"))).sum())
    _, idx, starts = scheme_atoms(adk, "sidechain")
    assert not np.isin(names[idx], ("N", "CA", "C", "O", "HA", "HN")).any()
    _, idx, starts = scheme_atoms(adk, "sidechain-heavy")
    gly = np.flatnonzero(adk.residues.resname == "GLY")
    for r in gly:  # glycine falls back to its side-chain hydrogens (HA1/HA2 here, CHARMM names)
        got = set(names[idx[starts[r]:starts[r + 1]]].tolist()) - {"OT2"}  # C-terminal OT2 = OXT: side chain
        assert got == {"HA1", "HA2"}
    non_gly = np.setdiff1d(np.arange(214), gly)
    for r in non_gly[:20]:
        assert not np.isin(adk.atoms.element[idx[starts[r]:starts[r + 1]]], ("H", "D")).any()


def test_residue_selection_forms(adk):
    cm = contacts(adk, residues="resid 10-40", device="cpu")
    assert cm.residues.number.tolist() == list(range(10, 41))
    full = contacts(adk, device="cpu")
    np.testing.assert_array_equal(cm.distances[0], full.distances[0][9:40, 9:40])
    idx = np.arange(5, 60, 3)
    cm2 = contacts(adk, residues=idx, device="cpu")
    np.testing.assert_array_equal(cm2.distances[0], full.distances[0][np.ix_(idx, idx)])
    mask = np.zeros(214, bool)
    mask[idx] = True
    np.testing.assert_array_equal(contacts(adk, residues=mask, device="cpu").distances, cm2.distances)
    assert contacts(adk, residues="all", device="cpu").distances.shape == (1, 214, 214)
    assert cm.residues.labels()[0] == "4AKE:GLY10"


def test_calcium_ion_is_not_a_residue_with_ca():
    atoms = AtomTable.build(["N", "CA", "C", "CA"], ["ALA", "ALA", "ALA", "CA"], [1, 1, 1, 2], ["A"] * 4,
                            element=["N", "C", "C", "CA"], hetero=[False, False, False, True])
    s = Structure(np.arange(12, dtype=np.float32).reshape(4, 3), atoms, source="ion")
    res, _, _ = scheme_atoms(s, "ca")
    assert res.tolist() == [0]
    res, idx, starts = scheme_atoms(s, "closest", residues="all")
    assert res.tolist() == [0, 1] and starts.tolist() == [0, 3, 4]


def test_two_ca_atoms_in_a_residue_is_an_error():
    atoms = AtomTable.build(["CA", "CA"], ["ALA", "ALA"], [1, 1], ["A", "A"], element=["C", "C"])
    s = Structure(np.zeros((2, 3), np.float32), atoms, source="twoca")
    with pytest.raises(InputError, match="2 CA atoms"):
        contacts(s, scheme="ca", device="cpu")


@pytest.mark.parametrize("kwargs,match", [
    ({"scheme": "cb"}, "scheme"),
    ({"output": "sparse"}, "output"),
    ({"cutoff": -1.0}, "cutoff"),
    ({"min_separation": -2}, "min_separation"),
    ({"residues": "resname XYZ"}, "matches no|selects no"),
    ({"residues": [999]}, "out of range"),
    ({"coords": np.zeros((2, 5, 3), np.float32)}, "coords"),
])
def test_bad_arguments(adk, kwargs, match):
    with pytest.raises(InputError, match=match):
        contacts(adk, device="cpu", **kwargs)


def test_bare_array_is_refused():
    with pytest.raises(InputError, match="Structure"):
        contacts(np.zeros((10, 3)), device="cpu")


# --------------------------------------------------------------------------------------------------
# invariances


def test_map_is_symmetric_with_inf_diagonal_and_separation(adk):
    for sep in (0, 1, 3, 7):
        cm = contacts(adk, min_separation=sep, device="cpu")
        d = cm.distances[0]
        np.testing.assert_array_equal(d, d.T)
        np.testing.assert_array_equal(cm.contacts[0], cm.contacts[0].T)
        assert np.isinf(np.diagonal(d)).all() and not np.diagonal(cm.contacts[0]).any()
        i, j = np.indices(d.shape)
        near = (np.abs(i - j) < sep) | (i == j)
        assert np.isinf(d[near]).all() and np.isfinite(d[~near]).all()
        assert (cm.contacts[0] == (d < 4.5)).all()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), tile=st.integers(1, 70), chunk=st.integers(1, 4),
       threads=st.integers(1, 3), sep=st.integers(0, 4), n_res=st.integers(1, 14))
def test_twin_equals_brute_force_for_any_tiling(seed, tile, chunk, threads, sep, n_res):
    rng = np.random.default_rng(seed)
    x, atom_idx, starts = _random_system(rng, n_res, max_atoms=9, n_frames=3)
    chain = rng.integers(0, 2, size=n_res)
    allowed = allowed_pairs(chain, np.arange(n_res), sep, inter_chain=bool(seed % 2))
    got = residue_distances_numpy(x, atom_idx, starts, allowed, tile=tile, frame_chunk=chunk, threads=threads)
    np.testing.assert_array_equal(got, _brute_force(x, atom_idx, starts, allowed))
    np.testing.assert_array_equal(got, got.transpose(0, 2, 1))


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rb=st.sampled_from([1, 2, 3, 32]), jt=st.sampled_from([1, 2, 5, 64]),
       cols=st.sampled_from([2, 6, 16, 1024]), rpt=st.sampled_from([1, 2]),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_kernel_loop_emulation_equals_twin(seed, rb, jt, cols, rpt, dtype):
    """Blocks, column chunks, staging passes (a residue larger than COLS) and row passes (a residue
    larger than blockDim * RPT) as the kernel runs them, launched by the host code; every output is
    written exactly once and every pair counted once per frame in contact."""
    rng = np.random.default_rng(seed)
    n_res = int(rng.integers(1, 12))
    x, atom_idx, starts = _random_system(rng, n_res, max_atoms=7, n_frames=2, dtype=dtype)
    chain = rng.integers(0, 2, size=n_res).astype(np.int32)
    seq = np.cumsum(rng.integers(1, 3, size=n_res)).astype(np.int32)
    sep, inter = int(rng.integers(0, 4)), bool(rng.integers(0, 2))
    dist, contact, counts, written = _emulate_kernel(x, atom_idx, starts, chain, seq, min_sep=sep, inter_chain=inter,
                                                     cutoff=9.0, RB=rb, JT=jt, COLS=cols, RPT=rpt, max_threads=32)
    assert (written == 1).all()
    allowed = allowed_pairs(chain, seq, sep, inter)
    want = residue_distances_numpy(x, atom_idx, starts, allowed)
    np.testing.assert_array_equal(dist, want)
    np.testing.assert_array_equal(contact, want < 9.0)
    # the counts contacts_cuda returns are already symmetric: the frames each pair is in contact
    np.testing.assert_array_equal(counts, (want < 9.0).sum(axis=0))


def test_interleaved_rows_keep_each_block_and_mix_residues():
    starts = np.array([0, 3, 3, 8, 9, 15, 17])
    atom_idx = np.arange(100, 117)
    bounds = np.array([0, 3, 6])
    row_idx, row_res = interleaved_rows(atom_idx, starts, bounds)
    assert row_idx[:8].tolist() == [100, 103, 101, 104, 102, 105, 106, 107]
    assert row_res[:8].tolist() == [0, 2, 0, 2, 0, 2, 2, 2]
    for b0, b1 in ((0, 8), (8, 17)):  # same atoms per block, each with its residue
        assert sorted(row_idx[b0:b1].tolist()) == atom_idx[b0:b1].tolist()
    res_of = np.repeat(np.arange(6), np.diff(starts))
    np.testing.assert_array_equal(row_res, res_of[row_idx - 100])


def test_kernel_emulation_with_a_residue_larger_than_a_block():
    rng = np.random.default_rng(5)
    counts = np.array([3, 80, 2, 0, 5])  # 80 atoms > COLS (16) and > 32 threads * RPT (1)
    starts = np.concatenate([[0], np.cumsum(counts)])
    x = rng.normal(scale=6, size=(1, starts[-1], 3)).astype(np.float32)
    atom_idx = np.arange(starts[-1])
    chain = np.zeros(5, np.int32)
    seq = np.arange(5, dtype=np.int32)
    dist, _, _, written = _emulate_kernel(x, atom_idx, starts, chain, seq, min_sep=1, inter_chain=True, cutoff=4.5,
                                          RB=2, JT=3, COLS=16, RPT=1, max_threads=32)
    assert (written == 1).all()
    np.testing.assert_array_equal(dist, residue_distances_numpy(x, atom_idx, starts, allowed_pairs(chain, seq, 1)))


@pytest.mark.parametrize("scheme", ["ca", "closest-heavy"])
def test_emulated_gpu_counts_each_pair_once_per_frame(datasets, scheme):
    """test_contacts_gpu's adk parity test on the emulated GPU path (default tiles: several row blocks
    and column chunks): distances equal the twin, counts are the frames in contact, per pair."""
    t = pg.load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb").frames(slice(0, 98, 40))
    res, idx, starts = scheme_atoms(t, scheme, None)
    chain, seq = np.zeros(len(res), np.int32), res.astype(np.int64)
    with _emulated_gpu() as rec:
        d, c, counts, _ = contacts_cuda(t.coords, idx, starts, chain, seq, None, cutoff=4.5, min_sep=3,
                                         inter_chain=True, keep="dense", dense_on_host=False)
        d, c, counts = d.get(), c.get(), counts.get()
    assert len(rec["launches"]) == 1 and (rec["launches"][0] == 1).all()
    np.testing.assert_array_equal(d, residue_distances_numpy(t.coords, idx, starts, allowed_pairs(chain, seq, 3)))
    assert counts.dtype == np.uint32 and c.dtype == bool and c.any()
    np.testing.assert_array_equal(counts, c.sum(axis=0))
    assert (np.diag(counts) == 0).all()


# all frames in one launch; two per launch (40^2 maps of 5 bytes + 3341 atoms copied, per frame)
@pytest.mark.parametrize("budget", [1 << 30, 2 * (40 * 40 * 5 + 3341 * 12)])
def test_emulated_gpu_public_outputs_equal_cpu(datasets, budget):
    """contacts(device="gpu") through the host code and the emulated kernel (frame chunks under a
    small budget; counts accumulate over launches) equals device="cpu" bit for bit: distances, maps,
    frequency = counts / frames exactly, and the sparse records."""
    t = pg.load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb").frames(slice(0, 98, 20))
    kw = {"residues": np.arange(60, 100), "scheme": "closest", "cutoff": 6.0}
    ref = contacts(t, device="cpu", **kw)
    with _emulated_gpu(budget=budget) as rec:
        got = contacts(t, device="gpu", **kw)
        freq = contacts(t, device="gpu", frequency=True, **kw)
        sp = contacts(t, device="gpu", output="pairs", **kw)
    assert got.device == "gpu" and isinstance(got.frequency, np.ndarray)
    assert len(rec["launches"]) == 3 * (1 if budget > 1e6 else 3)
    np.testing.assert_array_equal(got.distances, ref.distances)
    np.testing.assert_array_equal(got.contacts, ref.contacts)
    np.testing.assert_array_equal(got.frequency, got.contacts.sum(axis=0) / t.n_frames)
    np.testing.assert_array_equal(got.frequency, ref.frequency)
    np.testing.assert_array_equal(freq.frequency, ref.frequency)
    assert freq.distances is None and ref.frequency.max() == 1.0 and 0 < ref.frequency[ref.frequency > 0].min() < 1
    spc = contacts(t, device="cpu", output="pairs", **kw)
    for a, b in zip(sp.pairs, spc.pairs, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(sp.frequency, ref.frequency)


# --------------------------------------------------------------------------------------------------
# periodic boxes


def _true_min_image_d2(d, vec):
    """Exhaustive minimum image over lattice shifts in -2..2 (float64)."""
    shifts = np.array([[i, j, k] for i in range(-2, 3) for j in range(-2, 3) for k in range(-2, 3)], float) @ vec
    return np.min(np.sum((d[..., None, :] + shifts) ** 2, axis=-1), axis=-1)


@pytest.mark.parametrize("box", [np.diag([31.0, 27.0, 35.0]),
                                 np.array([[30.0, 0, 0], [10.0, 28.3, 0], [-10.0, 14.1, 24.5]]),
                                 np.array([[40.0, 0, 0], [0, 40.0, 0], [20.0, 20.0, 28.28]])])
def test_periodic_twin_against_exhaustive_minimum_image(box):
    rng = np.random.default_rng(3)
    # three frames on purpose: a (3, 3) box must still read as one box's vectors, not 3 frames' lengths
    x, atom_idx, starts = _random_system(rng, 12, max_atoms=6, n_frames=3, empty_ok=False, scale=1.0)
    x = (rng.uniform(-0.2, 1.2, size=x.shape) @ box).astype(np.float32)  # some atoms outside the cell
    allowed = allowed_pairs(np.zeros(12), np.arange(12), 1)
    got = residue_distances_numpy(x, atom_idx, starts, allowed, box=box, tile=7)
    xs = x[:, atom_idx].astype(np.float64)
    for f in range(3):
        d2 = _true_min_image_d2(xs[f][None] - xs[f][:, None], box)
        for i in range(12):
            for j in range(12):
                if allowed[i, j]:
                    want = np.sqrt(d2[starts[i]:starts[i + 1], starts[j]:starts[j + 1]].min())
                    assert abs(got[f, i, j] - want) < TOL
    # one box for all frames == the same box given per frame
    per_frame = residue_distances_numpy(x, atom_idx, starts, allowed, box=np.stack([box, box, box]), tile=3)
    np.testing.assert_array_equal(per_frame, got)


def test_half_plane_spacing_bound():
    box = np.array([[80.0, 0, 0], [0, 80.0, 0], [40.0, 40.0, 56.57]])
    near = np.sqrt(half_plane_spacing_sq(box))
    assert near == pytest.approx(56.57 / 2, rel=1e-3)  # the c-axis layer height
    rng = np.random.default_rng(0)
    n = rng.integers(-3, 4, size=(500, 3))
    n = n[np.any(n != 0, axis=1)]
    assert np.min(np.linalg.norm(n @ box, axis=1)) >= 2 * near - 1e-9
    assert half_plane_spacing_sq(np.stack([box, 2 * box])).shape == (2,)


# --------------------------------------------------------------------------------------------------
# outputs


def test_frequency_pairs_and_dense_agree(datasets):
    s = pg.load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb").frames(slice(0, 12))
    dense = contacts(s, device="cpu")
    assert dense.distances.shape == (12, 214, 214) and dense.contacts.dtype == bool
    freq = contacts(s, frequency=True, device="cpu")
    assert freq.distances is None and freq.contacts is None
    np.testing.assert_allclose(freq.frequency, dense.contacts.mean(axis=0))
    np.testing.assert_array_equal(freq.frequency, dense.frequency)
    sp = contacts(s, output="pairs", device="cpu")
    f, i, j = np.nonzero(np.triu(np.ones((214, 214), bool), 1)[None] & dense.contacts)
    np.testing.assert_array_equal(sp.pairs.frame, f)
    np.testing.assert_array_equal(sp.pairs.i, i)
    np.testing.assert_array_equal(sp.pairs.j, j)
    np.testing.assert_array_equal(sp.pairs.distance, dense.distances[f, i, j])
    np.testing.assert_array_equal(sp.frequency, dense.frequency)
    np.testing.assert_array_equal(sp.n_contacts(), dense.n_contacts())
    assert freq.n_contacts() is None
    assert "214 residues, 12 frames" in dense.summary()
    d = dense.to_dict()
    assert d["distances"].shape == (12, 214, 214) and d["residue_label"].shape == (214,)


def test_float64_coords_and_coords_override(adk):
    x64 = adk.coords.astype(np.float64)
    cm = contacts(adk, coords=x64, device="cpu")
    assert cm.distances.dtype == np.float64
    cm32 = contacts(adk, device="cpu")
    assert np.max(np.abs(cm.distances[np.isfinite(cm.distances)] - cm32.distances[np.isfinite(cm32.distances)])) < TOL
    shifted = contacts(adk, coords=adk.coords + np.float32(7.5), device="cpu")
    np.testing.assert_allclose(shifted.distances, cm32.distances, atol=TOL)
    with pytest.raises(InputError, match="NaN"):
        contacts(adk, coords=np.full_like(adk.coords, np.nan), device="cpu")


def test_torch_tensor_out(adk):
    torch = pytest.importorskip("torch")
    cm = contacts(adk, coords=torch.from_numpy(adk.coords), device="cpu")
    assert isinstance(cm.distances, torch.Tensor)


def test_accepts_paths_and_mdtraj_trajectories(datasets):
    cm = contacts(str(datasets / "adk_open.pdb"), scheme="ca", device="cpu")
    t = md.load(str(datasets / "adk_open.pdb"))
    t.unitcell_vectors = None  # else the CRYST1 cell comes along as a periodic box
    cm2 = contacts(t, scheme="ca", device="cpu")
    np.testing.assert_allclose(cm2.distances, cm.distances, atol=TOL)


# --------------------------------------------------------------------------------------------------
# native contacts


def _q_reference(x, x0, pairs, beta=5.0, lam=1.8, cutoff=4.5):
    """MDAnalysis' formulas, in float64, written out independently."""
    r0 = np.linalg.norm(x0[pairs[:, 1]] - x0[pairs[:, 0]], axis=1)
    r = np.linalg.norm(x[:, pairs[:, 1]] - x[:, pairs[:, 0]], axis=2)
    return (np.mean(1.0 / (1.0 + np.exp(beta * (r - lam * r0))), axis=1), np.mean(r <= r0, axis=1),
            np.mean(r <= cutoff, axis=1))


def test_native_contacts_nmr_ensemble(shared_datasets):
    s = pg.load(shared_datasets / "mdtraj" / "2EQQ.pdb")
    ref = s.frames(0)
    nc = native_contacts(s, ref, device="cpu")
    assert nc.q_soft.shape == (20,) and nc.pairs.shape[1] == 2
    heavy = s.select_indices("heavy")
    assert np.isin(nc.pairs, heavy).all() and (nc.pairs[:, 0] < nc.pairs[:, 1]).all()
    ri = s.atoms.residue_index
    assert (np.abs(ri[nc.pairs[:, 0]] - ri[nc.pairs[:, 1]]) >= 4).all()
    assert (nc.r0 <= 4.5).all()
    # the native pair set is complete: every heavy pair within 4.5 A and >= 4 residues apart
    x0 = s.coords[0].astype(np.float64)
    hp = np.array([(a, b) for ia, a in enumerate(heavy) for b in heavy[ia + 1:]
                   if abs(ri[a] - ri[b]) >= 4 and np.linalg.norm(x0[a] - x0[b]) <= 4.5])
    np.testing.assert_array_equal(nc.pairs, hp)
    q_soft, q_hard, q_radius = _q_reference(s.coords.astype(np.float64), x0, nc.pairs)
    np.testing.assert_allclose(nc.q_soft, q_soft, atol=1e-6)
    np.testing.assert_allclose(nc.q_hard, q_hard, atol=1e-12)
    np.testing.assert_allclose(nc.q_radius, q_radius, atol=1e-12)
    assert nc.q_hard[0] == 1.0 and nc.q_radius[0] == 1.0
    assert nc.q_soft[0] > 0.99 and nc.q_soft[1:].max() < 1.0


def test_native_contacts_errors(shared_datasets, adk):
    s = pg.load(shared_datasets / "mdtraj" / "2EQQ.pdb")
    with pytest.raises(InputError):
        native_contacts(s, adk, device="cpu")
    with pytest.raises(InputError, match="no native contacts"):
        native_contacts(s, s.frames(0), cutoff=0.5, device="cpu")


# --------------------------------------------------------------------------------------------------
# CLI and heatmap


def _cli(argv):
    from protgpu.cli import _common_parsers
    from protgpu.commands import contacts as cmd

    parser = argparse.ArgumentParser(prog="protgpu")
    sub = parser.add_subparsers(dest="command")
    cmd.register(sub, _common_parsers())
    args = parser.parse_args(["contacts", *argv])
    return args.func(args)


def test_cli_main_job(datasets, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "contacts.npz", tmp_path / "map.png"
    assert _cli([str(datasets / "adk_open.pdb"), "--out", str(out), "--plot", str(png), "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "214 residues" in text and "CPU" in text and "contacts" in text
    z = np.load(out)
    assert z["distances"].shape == (1, 214, 214) and z["frequency"].shape == (214, 214)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_frequency_over_trajectory_and_errors(datasets, tmp_path, capsys):
    out = tmp_path / "f.npz"
    assert _cli([str(datasets / "adk_dims.dcd"), "--top", str(datasets / "adk_open.pdb"), "--frequency",
                 "--scheme", "ca", "--cutoff", "8", "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    z = np.load(out)
    assert "distances" not in z.files and 0 < z["frequency"].max() <= 1
    with pytest.raises(InputError, match="npz"):
        _cli([str(datasets / "adk_open.pdb"), "--out", str(tmp_path / "x.npy")])


def test_heatmap_writes_png_and_checks_labels(tmp_path):
    pytest.importorskip("matplotlib")
    from protgpu.plotting import heatmap

    m = np.random.default_rng(0).uniform(size=(30, 30))
    m[3, 4] = np.inf
    p = heatmap(m, tmp_path / "h.png", xlabels=np.arange(1, 31), title="t", cbar_label="x", vmin=0, vmax=1)
    assert p.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(InputError, match="labels"):
        heatmap(m, tmp_path / "g.png", xlabels=[1, 2])
    with pytest.raises(InputError, match="png"):
        heatmap(m, tmp_path / "g.jpg")  # .png, .svg and .pdf are written (issue 16)
    with pytest.raises(InputError, match="2-D"):
        heatmap(np.zeros(3), tmp_path / "g.png")
