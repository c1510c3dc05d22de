"""GPU parity of the fused contact-map kernel with the NumPy twin (run on the GPU machine with
PROTGPU_REQUIRE_GPU=1)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protgpu as pg
from protgpu.contacts import (
    SCHEMES,
    allowed_pairs,
    contacts,
    contacts_cuda,
    native_contacts,
    residue_distances_numpy,
    residue_keys,
    scheme_atoms,
)
from protgpu.structure import AtomTable, Structure

pytestmark = pytest.mark.gpu

TOL = 1e-4
# Tile shapes (kernel #defines) that must not change a single bit of the result: min is exact.
DEFINES = [
    None,
    {"RPT": 1, "RB": 4, "JT": 8, "COLS": 64},
    {"RPT": 2, "RB": 1, "JT": 1, "COLS": 16},
    {"RPT": 1, "RB": 32, "JT": 128, "COLS": 256},
]


def _setup(s, scheme="closest-heavy", residues=None, min_sep=3, inter_chain=True):
    res, idx, starts = scheme_atoms(s, scheme, residues)
    chain, _ = residue_keys(s, res)
    seq = res.astype(np.int64)
    return idx, starts, chain, seq, allowed_pairs(chain, seq, min_sep, inter_chain)


def _gpu_dense(gpu, x, idx, starts, chain, seq, box=None, defines=None, cutoff=4.5, min_sep=3, inter_chain=True):
    d, c, counts, _ = contacts_cuda(gpu.asarray(x), idx, starts, chain, seq, box, cutoff=cutoff, min_sep=min_sep,
                                     inter_chain=inter_chain, keep="dense", dense_on_host=False, defines=defines)
    return d.get(), c.get(), counts.get()


def _assert_parity(got, x, idx, starts, allowed, box=None):
    """GPU error against a float64 twin at most 2x the same-precision twin's error (DESIGN 7); the
    +inf pattern (exclusions, empty residues) identical."""
    ref64 = residue_distances_numpy(x.astype(np.float64), idx, starts, allowed, box=box)
    cpu = residue_distances_numpy(x, idx, starts, allowed, box=box)
    fin = np.isfinite(ref64)
    np.testing.assert_array_equal(np.isfinite(got), fin)
    err_gpu = np.max(np.abs(got[fin] - ref64[fin]), initial=0.0)
    err_cpu = np.max(np.abs(cpu[fin] - ref64[fin]), initial=0.0)
    floor = 1e-5 if x.dtype == np.float32 else 1e-11
    assert err_gpu <= max(2 * err_cpu, floor), (err_gpu, err_cpu)
    np.testing.assert_array_equal(got, got.transpose(0, 2, 1))
    return ref64


@pytest.fixture(scope="module")
def adk_traj(datasets):
    return pg.load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb").frames(slice(0, 98, 12))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_parity_on_adk_trajectory(gpu, adk_traj, scheme, dtype):
    x = adk_traj.coords.astype(dtype)
    idx, starts, chain, seq, allowed = _setup(adk_traj, scheme)
    d, c, counts = _gpu_dense(gpu, x, idx, starts, chain, seq)
    assert d.dtype == dtype and d.shape == (len(x), 214, 214)
    ref64 = _assert_parity(d, x, idx, starts, allowed)
    near = np.abs(ref64 - 4.5) < TOL
    np.testing.assert_array_equal(c.view(bool)[~near], (ref64 < 4.5)[~near])
    # contacts_cuda already mirrors the kernel's upper-triangle counts: per pair, the frames in contact
    np.testing.assert_array_equal(counts, c.sum(axis=0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,top,frames", [
    ("mdtraj/2EQQ.pdb", None, slice(None)),
    ("mdtraj/1am7_corrected.xtc", "mdtraj/1am7_protein.pdb", slice(0, 51, 10)),  # orthorhombic box
    ("biopython/2BEG.pdb", None, slice(None)),  # five chains
    ("mdtraj/1vii.pdb", None, slice(None)),
])
def test_parity_on_shared_structures(gpu, shared_datasets, name, top, frames, dtype):
    s = pg.load(shared_datasets / name, top=None if top is None else shared_datasets / top).frames(frames)
    for scheme in ("ca", "closest", "sidechain-heavy"):
        idx, starts, chain, seq, allowed = _setup(s, scheme)
        x = s.coords.astype(dtype)
        d, _, _ = _gpu_dense(gpu, x, idx, starts, chain, seq, box=s.box)
        _assert_parity(d, x, idx, starts, allowed, box=s.box)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_parity_triclinic_box(gpu, datasets, dtype):
    import mdtraj as md

    adk = pg.load(datasets / "adk_open.pdb")
    box = md.load(str(datasets / "adk_open.pdb")).unitcell_vectors[0] * 10.0  # 80 80 80, 60 60 90
    rng = np.random.default_rng(0)
    # three frames: the structure, and two copies partly wrapped out of the cell
    x = np.stack([adk.coords[0], adk.coords[0] + box[2] * 0.7, adk.coords[0] - box[0] * 0.45]).astype(dtype)
    x[1:, rng.integers(0, adk.n_atoms, 300)] += box[1]
    idx, starts, chain, seq, allowed = _setup(adk, "closest-heavy")
    d, _, _ = _gpu_dense(gpu, x, idx, starts, chain, seq, box=box)
    _assert_parity(d, x, idx, starts, allowed, box=box)
    # periodic images do not depend on which image an atom was written in
    np.testing.assert_allclose(d[1], d[0], atol=TOL)
    np.testing.assert_allclose(d[2], d[0], atol=TOL)


@pytest.mark.parametrize("defines", DEFINES[1:])
def test_tile_defines_do_not_change_results(gpu, adk_traj, defines):
    for dtype in (np.float32, np.float64):
        x = adk_traj.coords[:3].astype(dtype)
        for scheme in ("closest-heavy", "ca"):
            idx, starts, chain, seq, _ = _setup(adk_traj, scheme)
            base = _gpu_dense(gpu, x, idx, starts, chain, seq)
            other = _gpu_dense(gpu, x, idx, starts, chain, seq, defines=defines)
            for a, b in zip(base, other, strict=True):
                np.testing.assert_array_equal(a, b)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), which=st.sampled_from(range(len(DEFINES))),
       sep=st.integers(0, 4), inter=st.booleans())
def test_random_systems_any_tiling_equal_twin(gpu, seed, which, sep, inter):
    rng = np.random.default_rng(seed)
    n_res = int(rng.integers(1, 60))
    counts = rng.integers(0, 12, size=n_res)
    counts[rng.integers(0, n_res)] = int(rng.integers(0, 90))  # sometimes a residue larger than COLS
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    n_atoms = int(starts[-1]) + 5
    x = rng.normal(scale=15.0, size=(3, n_atoms, 3)).astype(np.float32)
    idx = rng.permutation(n_atoms)[: starts[-1]].astype(np.int32)
    chain = rng.integers(0, 3, size=n_res).astype(np.int32)
    seq = np.cumsum(rng.integers(1, 3, size=n_res))
    d, c, _ = _gpu_dense(gpu, x, idx, starts, chain, seq, defines=DEFINES[which], cutoff=6.0, min_sep=sep,
                         inter_chain=inter)
    want = residue_distances_numpy(x, idx, starts, allowed_pairs(chain, seq, sep, inter))
    fin = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(d), fin)
    assert np.max(np.abs(d[fin] - want[fin]), initial=0.0) < 1e-4


def test_residue_larger_than_a_block(gpu):
    """One 700-atom residue: more row atoms than 256 threads x RPT (row passes) and, with COLS=64,
    more column atoms than one staging pass."""
    rng = np.random.default_rng(7)
    sizes = [5, 700, 3, 9, 1, 40]
    names, resn, resid = [], [], []
    for k, n in enumerate(sizes):
        names += [f"C{i}" for i in range(n)]
        resn += ["LIG"] * n
        resid += [k + 1] * n
    atoms = AtomTable.build(names, resn, resid, ["A"] * len(names), element=["C"] * len(names))
    s = Structure(rng.normal(scale=20, size=(2, len(names), 3)).astype(np.float32), atoms, source="big")
    idx, starts, chain, seq, allowed = _setup(s, "closest", residues="all", min_sep=1)
    for defines in (None, {"COLS": 64, "RPT": 1}):
        d, _, _ = _gpu_dense(gpu, s.coords, idx, starts, chain, seq, defines=defines, min_sep=1)
        _assert_parity(d, s.coords, idx, starts, allowed)


def test_public_outputs_match_cpu(gpu, adk_traj):
    ref = contacts(adk_traj, device="cpu")
    got = contacts(adk_traj, device="gpu")
    assert got.device == "gpu" and isinstance(got.distances, np.ndarray)
    fin = np.isfinite(ref.distances)  # compare finite entries only (inf - inf is NaN, with a warning)
    np.testing.assert_array_equal(np.isfinite(got.distances), fin)
    assert np.max(np.abs(got.distances[fin] - ref.distances[fin])) < TOL
    near = np.abs(ref.distances - 4.5) < TOL
    np.testing.assert_array_equal(got.contacts[~near], ref.contacts[~near])
    # frequency = counts / frames exactly, whatever the near-cutoff pairs did; the frequency-only
    # launch (no dense outputs) counts the same contacts
    np.testing.assert_array_equal(got.frequency, got.contacts.sum(axis=0) / adk_traj.n_frames)
    freq = contacts(adk_traj, frequency=True, device="gpu")
    assert freq.distances is None
    np.testing.assert_array_equal(freq.frequency, got.frequency)
    if not near.any():
        np.testing.assert_array_equal(got.frequency, ref.frequency)
        sp = contacts(adk_traj, output="pairs", device="gpu")
        spc = contacts(adk_traj, output="pairs", device="cpu")
        for a, b in zip(sp.pairs[:3], spc.pairs[:3], strict=True):
            np.testing.assert_array_equal(a, b)
        assert np.max(np.abs(sp.pairs.distance - spc.pairs.distance)) < TOL


def test_cupy_in_cupy_out(gpu, adk_traj):
    xd = gpu.asarray(adk_traj.coords)
    cm = contacts(adk_traj, coords=xd)
    assert cm.device == "gpu"
    assert isinstance(cm.distances, gpu.ndarray) and isinstance(cm.contacts, gpu.ndarray)
    assert cm.contacts.dtype == bool and isinstance(cm.frequency, gpu.ndarray)
    ref = contacts(adk_traj, device="cpu")
    fin = np.isfinite(ref.distances)
    np.testing.assert_array_equal(gpu.isfinite(cm.distances).get(), fin)
    assert float(gpu.max(gpu.abs(cm.distances[gpu.asarray(fin)] - gpu.asarray(ref.distances[fin])))) < TOL
    sp = contacts(adk_traj, coords=xd, output="pairs")
    assert isinstance(sp.pairs.distance, gpu.ndarray)


def test_frame_chunks_under_a_small_budget(gpu, adk_traj, monkeypatch):
    whole = contacts(adk_traj, device="gpu")
    monkeypatch.setenv("PROTGPU_GPU_MEMORY_BUDGET", str(2 * 214 * 214 * 5))  # two frames per chunk
    chunked = contacts(adk_traj, device="gpu")
    np.testing.assert_array_equal(chunked.distances, whole.distances)
    np.testing.assert_array_equal(chunked.frequency, whole.frequency)
    sp = contacts(adk_traj, output="pairs", device="gpu")
    assert sp.pairs.frame.max() == adk_traj.n_frames - 1


def test_native_contacts_gpu_parity(gpu, shared_datasets):
    s = pg.load(shared_datasets / "mdtraj" / "2EQQ.pdb")
    cpu = native_contacts(s, s.frames(0), device="cpu")
    got = native_contacts(s, s.frames(0), device="gpu")
    np.testing.assert_array_equal(got.pairs, cpu.pairs)
    np.testing.assert_allclose(got.q_soft, cpu.q_soft, atol=1e-9)
    assert got.q_hard[0] == 1.0
    np.testing.assert_allclose(got.q_radius, cpu.q_radius, atol=1e-9)
