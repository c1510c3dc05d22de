"""The fast CPU paths (protgpu/scoring/_fast.py, numba) against their NumPy twins: TM-score search and
lDDT counts, equal to 1e-9 (counts exactly), whatever the thread count; the public functions give the
same numbers with the fast path on and off. Skipped without numba (the NumPy twins then run alone)."""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba")

from protgpu.io import load  # noqa: E402
from protgpu.scoring import _fast, lddt, tm_score  # noqa: E402
from protgpu.scoring.lddt import lddt_counts_numpy, lddt_inputs  # noqa: E402
from protgpu.scoring.tmscore import search_parameters, tm_inputs, tm_search_numpy  # noqa: E402


@pytest.fixture(scope="module")
def adk(datasets):
    models = load(datasets / "adk_dims.dcd", top=datasets / "adk_closed.pdb", frames=slice(0, 12))
    return models, datasets / "adk_open.pdb"


def _same_search(a, b, tol=1e-9):
    assert np.abs(a["score"] - b["score"]).max() <= tol
    assert np.abs(a["rotation"] - b["rotation"]).max() <= 1e-7
    assert np.abs(a["translation"] - b["translation"]).max() <= 1e-6
    assert np.array_equal(a["gdt_counts"], b["gdt_counts"])
    assert np.abs(a["maxsub_sum"] - b["maxsub_sum"]).max() <= tol


def test_tm_search_equals_numpy_twin_on_adk(adk):
    batch, params = tm_inputs(*adk, dtype=np.float32)
    for stage1 in (True, False):
        _same_search(tm_search_numpy(batch.x, batch.y, batch.n_ali, params, stage1=stage1),
                     _fast.tm_search(batch.x, batch.y, batch.n_ali, params, stage1=stage1))


def _random_chain(rng, n):
    return np.cumsum(rng.normal(size=(n, 3)) * 2.2, axis=0)


@pytest.mark.parametrize("n", [3, 4, 5, 9, 22, 61])
def test_tm_search_equals_numpy_twin_small_and_far(n):
    # lengths at the seed rules' edges; unrelated structures need the cutoff relaxation (< 3 pairs pass)
    rng = np.random.default_rng(n)
    ref = _random_chain(rng, n)
    models = np.stack([ref + rng.normal(scale=s, size=ref.shape) for s in (0.0, 0.5, 3.0)]
                      + [_random_chain(rng, n) * 3.0, _random_chain(rng, n) + 100.0])
    batch, params = tm_inputs(models, ref)
    _same_search(tm_search_numpy(batch.x, batch.y, batch.n_ali, params),
                 _fast.tm_search(batch.x, batch.y, batch.n_ali, params))


def test_tm_search_models_of_different_lengths_and_references():
    # per-model reference rows (y of shape (M, Lmax, 3)) and per-model aligned counts
    rng = np.random.default_rng(7)
    m, lmax = 5, 40
    x = rng.normal(size=(m, lmax, 3)) * 8.0
    y = x + rng.normal(scale=1.5, size=x.shape)
    n_ali = np.array([40, 12, 3, 25, 33])
    for k, n in enumerate(n_ali):
        x[k, n:] = 0.0
        y[k, n:] = 0.0
    params = search_parameters(n_ali, n_ali + 5, n_ali + 5)
    _same_search(tm_search_numpy(x, y, n_ali, params), _fast.tm_search(x, y, n_ali, params))


def test_fast_results_do_not_depend_on_the_thread_count(adk, monkeypatch):
    batch, params = tm_inputs(*adk, dtype=np.float32)
    ref, coords, _ = lddt_inputs(*adk)
    got = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(_fast, "cpu_threads", lambda t=threads: t)
        got.append((_fast.tm_search(batch.x, batch.y, batch.n_ali, params), _fast.lddt_counts(coords, ref)))
    for tm, counts in got[1:]:
        for k in tm:
            assert tm[k].tobytes() == got[0][0][k].tobytes()
        assert np.array_equal(counts, got[0][1])


@pytest.mark.parametrize("atoms", ["heavy", "ca"])
@pytest.mark.parametrize("symmetry", [True, False])
def test_lddt_counts_equal_numpy_twin(adk, atoms, symmetry):
    ref, coords, _ = lddt_inputs(*adk, atoms=atoms)
    coords = coords.copy()
    # missing atoms (NaN) and a residue the model lacks entirely
    rng = np.random.default_rng(0)
    coords[1, rng.choice(coords.shape[1], 40, replace=False)] = np.nan
    coords[2, ref.atom_res == 5] = np.nan
    want = lddt_counts_numpy(coords, ref, symmetry=symmetry)
    got = _fast.lddt_counts(coords, ref, symmetry=symmetry)
    assert np.array_equal(want, got)
    assert (got[2, 5] == -1) and (want[2, 5] == -1)


def test_lddt_symmetry_swaps_counted(datasets):
    # a model with every symmetric pair named the other way round: the swap must restore lDDT 1
    from protgpu.scoring import _mapping as mp

    ref_path = datasets / "adk_open.pdb"
    ref, coords, _ = lddt_inputs(ref_path, ref_path)
    x = coords.copy()
    x[:, ref.tuples[:, 0]], x[:, ref.tuples[:, 1]] = coords[:, ref.tuples[:, 1]], coords[:, ref.tuples[:, 0]]
    assert len(ref.tuples) > 0 and mp.SYMMETRIC_ATOMS
    assert np.array_equal(_fast.lddt_counts(x, ref), lddt_counts_numpy(x, ref))
    assert np.array_equal(_fast.lddt_counts(x, ref), _fast.lddt_counts(coords, ref))


def test_public_functions_same_with_fast_path_on_and_off(adk, monkeypatch):
    models, ref = adk
    on_tm = tm_score(models, ref, device="cpu")
    on_l = lddt(models, ref, device="cpu", per_residue=True)
    monkeypatch.setattr(_fast, "ENABLED", False)
    off_tm = tm_score(models, ref, device="cpu")
    off_l = lddt(models, ref, device="cpu", per_residue=True)
    for a, b in zip(on_tm, off_tm, strict=True):
        np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(on_l[0], off_l[0])
    np.testing.assert_array_equal(on_l[1], off_l[1])


def test_environment_switch_turns_the_fast_path_off():
    code = "from protgpu.scoring import _fast; print(_fast.enabled())"
    env = dict(os.environ, PROTGPU_NUMBA="0", PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("all_pairs_max", [0, 10**9])
@pytest.mark.parametrize("radius", [4.0, 15.0])
def test_reference_pairs_equal_kd_tree(datasets, monkeypatch, all_pairs_max, radius):
    # both compiled searches (cell list; every pair) give the k-d tree's pairs, in its order
    ld = importlib.import_module("protgpu.scoring.lddt")
    monkeypatch.setattr(_fast, "_ALL_PAIRS_MAX", all_pairs_max)
    rng = np.random.default_rng(3)
    for y in (load(datasets / "adk_closed.pdb").coords[0].astype(np.float64), rng.normal(size=(700, 3)) * 9.0,
              rng.normal(size=(2, 3))):
        got = _fast.pairs_within(y, radius)
        monkeypatch.setattr(_fast, "ENABLED", False)
        want = ld._pairs_within(y, radius)
        monkeypatch.setattr(_fast, "ENABLED", True)
        assert got is not None and np.array_equal(got, want)
    far = _fast.pairs_within(np.array([[0.0, 0, 0], [1e6, 0, 0]]), radius)
    if all_pairs_max == 0:
        assert far is None  # a grid too sparse for the cell list: the k-d tree
    else:
        assert far.shape == (0, 2)


@pytest.mark.parametrize("atoms", ["heavy", "ca"])
def test_lddt_reference_same_with_fast_path_on_and_off(datasets, monkeypatch, atoms):
    ld = importlib.import_module("protgpu.scoring.lddt")
    s = load(datasets / "adk_open.pdb")
    on = ld._structure_reference(s, atoms, 15.0)[0]
    monkeypatch.setattr(_fast, "ENABLED", False)
    off = ld._structure_reference(s, atoms, 15.0)[0]
    for f in dataclasses.fields(on):
        a, b = getattr(on, f.name), getattr(off, f.name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), f.name
        elif f.name != "_device":
            assert a == b, f.name


def test_fit_from_sums_equals_kabsch_including_repeated_eigenvalues():
    # the scalar QCP against protgpu.scoring._kabsch.superpose_from_sums; diag(1, 1, -1) has a triple top
    # eigenvalue of K (the Jacobi fallback), zero sums an empty subset
    from protgpu.scoring._kabsch import superpose_from_sums

    _fast._compile()
    rng = np.random.default_rng(5)
    mats = [rng.normal(size=(3, 3)) * 50 for _ in range(20)] + [np.diag([1.0, 1.0, -1.0]) * 7, np.zeros((3, 3)),
                                                                 np.eye(3) * 4]
    rows, kbuf, q = np.empty((4, 4)), np.empty(10), np.empty(4)
    for k, m in enumerate(mats):
        n = 0.0 if k == len(mats) - 2 else 10.0
        sx, sy = rng.normal(size=3), rng.normal(size=3)
        sxy = m + n * np.outer(sx / max(n, 1.0), sy / max(n, 1.0))
        rot, trans = np.empty((3, 3)), np.empty(3)
        _fast._fit_from_sums(n, sx, sy, sxy.reshape(9), rot, trans, kbuf, q, rows)
        want_r, want_t = superpose_from_sums(np.array([n]), sx[None], sy[None], sxy[None])
        np.testing.assert_allclose(rot, want_r[0], atol=1e-12)
        np.testing.assert_allclose(trans, want_t[0], atol=1e-10)
