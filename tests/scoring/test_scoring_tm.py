"""TM-score, GDT and MaxSub (NumPy path): the TMscore program's values, invariances, mapping, CLI."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protgpu.errors import InputError
from protgpu.io import load
from protgpu.scoring import gdt, tm_score
from protgpu.scoring._kabsch import superpose
from protgpu.scoring.tmscore import d0_tmscore, seed_fragments, seed_lengths, tm_inputs, tm_search_numpy
from protgpu.structure import AtomTable, Structure

PAIRS = ("7SGN_C", "7W1F_B", "T1118v1_LG035_1")


@pytest.fixture(scope="module")
def pair_results(shared_datasets, reference_values):
    out = {}
    for key in PAIRS:
        v = reference_values["model_native_pairs"][key]
        out[key] = tm_score(shared_datasets / v["model"], shared_datasets / v["native"], device="cpu")
    return out


@pytest.mark.parametrize("key", PAIRS)
def test_tmscore_program_values(key, pair_results, reference_values):
    v = reference_values["model_native_pairs"][key]
    prog = v["TMscore_program"]
    r = pair_results[key]
    # the program prints 4 decimals; the float64 re-implementation beside the reference agrees to 1e-12
    assert r.tm == pytest.approx(prog["tm_score"], abs=1e-4)
    assert r.tm == pytest.approx(v["tmscore_own_norm_native"], abs=1e-9)
    assert r.tm == pytest.approx(v["tmtools_fixed_alignment_by_resnum"]["tm_norm_chain2_native"], abs=1e-6)
    assert r.gdt_ts == pytest.approx(prog["gdt_ts"], abs=1e-4)
    assert r.gdt_ha == pytest.approx(prog["gdt_ha"], abs=1e-4)
    assert r.maxsub == pytest.approx(prog["maxsub"], abs=1e-4)
    assert r.gdt_fractions[1:] == pytest.approx(prog["gdt_fractions_1_2_4_8"], abs=1e-4)
    assert r.gdt_fractions[0] == pytest.approx(prog["gdt_fraction_0.5"], abs=1e-4)
    assert r.rmsd == pytest.approx(prog["rmsd_common"], abs=1e-3)
    assert r.rmsd == pytest.approx(v["ca_rmsd_common_kabsch"], abs=1e-6)
    assert r.n_aligned == prog["n_common"] == v["n_common"]
    assert r.d0 == pytest.approx(prog["d0"], abs=5e-3)
    assert r.d0 == pytest.approx(v["tmscore_own_d0"], abs=1e-9)
    assert r.n_skipped == 0
    assert r.rotation.shape == (3, 3) and r.translation.shape == (3,)
    assert np.linalg.det(r.rotation) == pytest.approx(1.0, abs=1e-9)
    # OpenStructure-style GDT uses another search: close, not equal (SCORING.md: up to about 0.01)
    assert abs(r.gdt_ts - v["gdt_ost_like"]["gdt_ts"]) < 0.012


@pytest.mark.parametrize("key", PAIRS)
def test_superposition_reproduces_tm(key, pair_results, shared_datasets, reference_values):
    # the returned rotation/translation really give the reported TM-score
    v = reference_values["model_native_pairs"][key]
    r = pair_results[key]
    batch, params = tm_inputs(shared_datasets / v["model"], shared_datasets / v["native"])
    n = int(batch.n_ali[0])
    x = batch.x[0, :n].astype(np.float64) @ r.rotation.T + r.translation
    d2 = ((x - batch.y[0, :n]) ** 2).sum(axis=1)
    assert np.sum(1 / (1 + d2 / r.d0**2)) / batch.n_ref == pytest.approx(r.tm, abs=1e-6)


def test_lengths_follow_the_program(reference_values, shared_datasets):
    v = reference_values["model_native_pairs"]["T1118v1_LG035_1"]
    batch, params = tm_inputs(shared_datasets / v["model"], shared_datasets / v["native"])
    assert batch.n_model[0] == v["TMscore_program"]["L_model"] == 776
    assert batch.n_ref == v["TMscore_program"]["L_native"] == 677
    # stage-1 d0_search uses min(L_model, L_native) + 0.8, clamped to [4.5, 8]
    assert params[0, 0] == 8.0 and params[0, 1] == 8.0 and params[0, 2] == pytest.approx(9.0070629611, abs=1e-9)


def test_nmr_ensemble_against_model0(shared_datasets, reference_values):
    ens = reference_values["nmr_ensemble"]
    s = load(shared_datasets / ens["file"])
    r = tm_score(s, s.frames(0), device="cpu")
    assert r.tm.shape == (ens["n_models"],)
    np.testing.assert_allclose(r.tm, ens["own_tmscore_vs_model0_ca_norm_by_model0"], atol=1e-9)
    assert r.tm[0] == pytest.approx(1.0) and r.rmsd[0] == pytest.approx(0.0, abs=1e-5)


def test_seed_plan():
    assert seed_lengths(300) == [300, 150, 75, 37, 18, 4]
    assert seed_lengths(10) == [10, 5, 4]
    assert seed_lengths(3) == [3]
    assert seed_lengths(64) == [64, 32, 16, 8, 4]
    f = seed_fragments(10)
    assert len(f) == 1 + 6 + 7 and tuple(f[0]) == (10, 0) and tuple(f[-1]) == (4, 6)
    assert d0_tmscore([10, 21, 22, 108]) == pytest.approx([0.5, 0.5, 1.24 * 7 ** (1 / 3) - 1.8, 3.8180120711])


# --------------------------------------------------------------------------------------------------
# invariances (hypothesis)


def _chain(n, seed=0):
    rng = np.random.default_rng(seed)
    steps = rng.normal(size=(n, 3))
    return np.cumsum(3.8 * steps / np.linalg.norm(steps, axis=1, keepdims=True), axis=0) * 0.6


def _rotation(q):
    q = np.asarray(q, dtype=np.float64)
    q = q / np.linalg.norm(q)
    w, x, y, z = q
    return np.array([[w * w + x * x - y * y - z * z, 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), w * w - x * x + y * y - z * z, 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), w * w - x * x - y * y + z * z]])


quats = st.lists(st.floats(-1, 1, allow_nan=False), min_size=4, max_size=4).filter(
    lambda q: np.linalg.norm(q) > 0.1)
shifts = st.lists(st.floats(-80, 80, allow_nan=False), min_size=3, max_size=3)


@settings(max_examples=8, deadline=None)
@given(q=quats, t=shifts, seed=st.integers(0, 1000), noise=st.floats(0.3, 4.0))
def test_rigid_motion_does_not_change_scores(q, t, seed, noise):
    ref = _chain(45, seed)
    model = ref + np.random.default_rng(seed + 1).normal(scale=noise, size=ref.shape)
    moved = model @ _rotation(q).T + np.asarray(t)
    a = tm_score(model, ref, device="cpu")
    b = tm_score(moved, ref, device="cpu")
    assert b.tm == pytest.approx(a.tm, abs=1e-7)
    assert b.gdt_ts == pytest.approx(a.gdt_ts, abs=1e-9) and b.maxsub == pytest.approx(a.maxsub, abs=1e-7)
    assert b.rmsd == pytest.approx(a.rmsd, abs=1e-7)
    # the reported superposition maps the moved model where the first one went
    np.testing.assert_allclose(moved @ b.rotation.T + b.translation, model @ a.rotation.T + a.translation,
                               atol=1e-5)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 1000), n=st.integers(5, 70))
def test_identity_scores_one(seed, n):
    ref = _chain(n, seed)
    r = tm_score(ref, ref, device="cpu")
    assert r.tm == pytest.approx(1.0, abs=1e-12)
    assert r.gdt_ts == pytest.approx(1.0) and r.gdt_ha == pytest.approx(1.0) and r.maxsub == pytest.approx(1.0)
    assert r.rmsd == pytest.approx(0.0, abs=1e-6)
    assert gdt(ref, ref, device="cpu") == (pytest.approx(1.0), pytest.approx(1.0))


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), noise=st.floats(0.5, 8.0), hinge=st.floats(0, 60))
def test_tm_never_below_the_rmsd_superposition(seed, noise, hinge):
    ref = _chain(50, seed)
    rng = np.random.default_rng(seed)
    model = ref + rng.normal(scale=noise, size=ref.shape)
    # a hinge motion of the second half makes the plain fit clearly sub-optimal
    model[25:] = (model[25:] - model[25]) @ _rotation([np.cos(np.radians(hinge) / 2), 0, 0,
                                                        np.sin(np.radians(hinge) / 2)]).T + model[25]
    r = tm_score(model, ref, device="cpu")
    rot, tr, _ = superpose(model[None], ref[None])
    d2 = ((model @ rot[0].T + tr[0] - ref) ** 2).sum(axis=1)
    plain = np.mean(1 / (1 + d2 / d0_tmscore(50) ** 2))
    assert r.tm >= plain - 1e-12


# --------------------------------------------------------------------------------------------------
# inputs and mapping


@pytest.fixture(scope="module")
def sgn(shared_datasets):
    d = shared_datasets / "openstructure"
    return load(d / "7SGN_C_model.pdb"), load(d / "7SGN_C_target.pdb")


def _renumber(s: Structure, offset: int, chain: str | None = None) -> Structure:
    a = s.atoms
    atoms = AtomTable(name=a.name, element=a.element, resname=a.resname, resid=a.resid + offset, icode=a.icode,
                      chain=a.chain if chain is None else np.full(len(a), chain), segid=a.segid, hetero=a.hetero)
    return Structure(s.coords, atoms, source=s.source)


def test_sequence_mapping_undoes_renumbering(sgn):
    model, target = sgn
    base = tm_score(model, target, device="cpu")
    moved = _renumber(model, 1000, chain="Z")
    seq = tm_score(moved, target, mapping="sequence", device="cpu")
    assert seq.n_aligned == base.n_aligned and seq.tm == pytest.approx(base.tm, abs=1e-12)
    with pytest.raises(InputError, match="no residue in common"):
        tm_score(_renumber(model, 1000), target, device="cpu")


def test_explicit_mapping_and_list_of_models(sgn):
    model, target = sgn
    mres = np.arange(model.n_residues)
    rres = np.searchsorted(target.residues.resid, model.residues.resid)
    explicit = tm_score(model, target, mapping=np.stack([mres, rres], axis=1), device="cpu")
    base = tm_score(model, target, device="cpu")
    assert explicit.tm == pytest.approx(base.tm, abs=1e-12)
    # a list of models of different lengths; one-model lists keep the batch axis
    short = model.select("resid 20-60")
    r = tm_score([model, short, target], target, device="cpu")
    assert r.tm.shape == (3,) and list(r.n_aligned) == [102, 41, 108]
    assert r.tm[0] == pytest.approx(base.tm, abs=1e-12) and r.tm[2] == pytest.approx(1.0)
    assert tm_score([model], target, device="cpu").tm.shape == (1,)


def test_md_names_do_not_drop_residues(sgn):
    model, target = sgn
    a = model.atoms
    resname = np.where(a.resname == "HIS", "HSD", a.resname)
    name = np.where((a.resname == "ILE") & (a.name == "CD1"), "CD", a.name)
    name = np.where(name == "OXT", "OT2", name)
    charmm = Structure(model.coords, AtomTable(name=name, element=a.element, resname=resname, resid=a.resid,
                                               icode=a.icode, chain=np.full(len(a), ""), segid=np.full(len(a), "PROA"),
                                               hetero=a.hetero), source="charmm.pdb")
    assert tm_score(charmm, target, device="cpu").tm == pytest.approx(tm_score(model, target, device="cpu").tm)


def test_residues_without_ca_are_skipped_and_counted(sgn):
    model, target = sgn
    keep = ~((model.atoms.resid == 30) & (model.atoms.name == "CA"))
    r = tm_score(model.select(keep), target, device="cpu")
    assert r.n_skipped == 1 and r.n_aligned == 101


def test_normalize_by(sgn):
    model, target = sgn
    by_model = tm_score(model, target, normalize_by="model", device="cpu")
    by_len = tm_score(model, target, normalize_by=102, device="cpu")
    assert by_model.tm == pytest.approx(by_len.tm) and by_model.d0 == pytest.approx(d0_tmscore(102))
    assert by_model.tm > tm_score(model, target, device="cpu").tm
    with pytest.raises(InputError, match="normalize_by"):
        tm_score(model, target, normalize_by="average", device="cpu")
    with pytest.raises(InputError, match="positive"):
        tm_score(model, target, normalize_by=0, device="cpu")


def test_bad_inputs_name_the_file(tmp_path, sgn):
    model, target = sgn
    other = _renumber(model, 0, chain="Q")
    other_b = _renumber(model, 0, chain="R")
    two = Structure(np.concatenate([other.coords, other_b.coords], axis=1),
                    AtomTable(**{f: np.concatenate([getattr(other.atoms, f), getattr(other_b.atoms, f)])
                                 for f in ("name", "element", "resname", "resid", "icode", "chain", "segid",
                                           "hetero")}), source="two_chains.pdb")
    with pytest.raises(InputError, match="two_chains.pdb: chains cannot be matched"):
        tm_score(two, Structure(np.concatenate([target.coords] * 2, axis=1),
                                AtomTable(**{f: np.concatenate([getattr(target.atoms, f)] * 2) if f != "chain" else
                                             np.concatenate([target.atoms.chain, np.full(target.n_atoms, "D")])
                                             for f in ("name", "element", "resname", "resid", "icode", "chain",
                                                       "segid", "hetero")}), source="t.pdb"), device="cpu")
    with pytest.raises(InputError, match="mapping"):
        tm_score(model, target, mapping="structure", device="cpu")
    with pytest.raises(InputError, match="fewer than 3"):
        tm_score(np.zeros((2, 3)), np.zeros((2, 3)), device="cpu")


def test_search_numpy_matches_public_function(sgn):
    model, target = sgn
    batch, params = tm_inputs([model, model.select("resid 1-80")], target)
    raw = tm_search_numpy(batch.x, batch.y, batch.n_ali, params)
    r = tm_score([model, model.select("resid 1-80")], target, device="cpu")
    np.testing.assert_allclose(raw["score"], r.tm)
    np.testing.assert_allclose(raw["gdt_counts"] / batch.n_ref, r.gdt_fractions)


# --------------------------------------------------------------------------------------------------
# CLI


def _cli(argv):
    from protgpu.cli import _common_parsers
    from protgpu.commands import score

    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command")
    score.register(sub, _common_parsers())
    args = p.parse_args(["score", *map(str, argv)])
    return args.func(args)


def test_cli_writes_one_row_per_model(tmp_path, shared_datasets, reference_values, capsys):
    d = shared_datasets / "openstructure"
    out = tmp_path / "scores.jsonl"
    rc = _cli([d / "7SGN_C_model.pdb", d / "7SGN_C_target.pdb", "--ref", d / "7SGN_C_target.pdb",
               "--device", "cpu", "--out", out, "--metrics", "tm,gdt,rmsd,lddt"])
    assert rc == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["model"] for r in rows] == ["7SGN_C_model.pdb", "7SGN_C_target.pdb"]
    v = reference_values["model_native_pairs"]["7SGN_C"]
    assert rows[0]["tm"] == pytest.approx(v["TMscore_program"]["tm_score"], abs=1e-4)
    assert rows[0]["lddt"] == pytest.approx(v["lddt"]["all_atom_ost_like_with_symmetry"], abs=1e-6)
    assert rows[1]["tm"] == pytest.approx(1.0) and rows[1]["lddt"] == pytest.approx(1.0)
    assert "on the CPU" in capsys.readouterr().err


def test_cli_csv_per_residue_plot_and_errors(tmp_path, shared_datasets):
    pytest.importorskip("matplotlib")
    d = shared_datasets / "openstructure"
    out, png = tmp_path / "s.csv", tmp_path / "l.png"
    assert _cli([d / "7SGN_C_model.pdb", "--ref", d / "7SGN_C_target.pdb", "--device", "cpu", "--out", out,
                 "--metrics", "lddt", "--per-residue", "--plot", png, "-q"]) == 0
    header, row = out.read_text().splitlines()
    assert header.startswith("model,lddt,lddt:C:6,") and len(header.split(",")) == 2 + 108
    assert row.split(",")[2] == ""  # residue 6 is absent from the model
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(InputError, match="metrics"):
        _cli([d / "7SGN_C_model.pdb", "--ref", d / "7SGN_C_target.pdb", "--metrics", "tm,foo"])
    with pytest.raises(InputError, match=r"\.csv, \.jsonl or \.parquet"):
        _cli([d / "7SGN_C_model.pdb", "--ref", d / "7SGN_C_target.pdb", "--out", tmp_path / "x.txt"])
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(InputError, match="pyarrow"):
            _cli([d / "7SGN_C_model.pdb", "--ref", d / "7SGN_C_target.pdb", "--device", "cpu", "-q",
                  "--metrics", "tm", "--out", tmp_path / "x.parquet"])


def test_rmsd_column_of_an_empty_alignment_is_nan():
    """The RMSD column (CPU path) of a model with no aligned pair is NaN, as the GPU kernel
    aligned_rmsd_* gives it: an RMSD over no atoms is undefined (0 would read as a perfect model).
    The other models of the batch keep the values they have without it."""
    import warnings

    from protgpu.scoring import tmscore as tm_mod

    rng = np.random.default_rng(5)
    y = rng.normal(0, 10, (3, 40, 3))
    x = y + rng.normal(0, 1, y.shape)
    n_ali = np.array([40, 0, 25])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value" warnings on the way to the NaN
        got = tm_mod._common_rmsd(x, y, n_ali, np)
        alone = tm_mod._common_rmsd(x[:1, :0], y[:1, :0], np.array([0]), np)
    assert got.shape == (3,) and got.dtype == np.float64
    assert np.isnan(got[1]) and np.isnan(alone[0])
    np.testing.assert_array_equal(got[[0, 2]], tm_mod._common_rmsd(x[[0, 2]], y[[0, 2]], n_ali[[0, 2]], np))
    assert 0.5 < got[0] < 2.5 and 0.5 < got[2] < 2.5
    # shared reference row (one y for every model), as the score engine passes it
    shared = tm_mod._common_rmsd(x, y[:1], n_ali, np)
    assert np.isnan(shared[1]) and np.isfinite(shared[[0, 2]]).all()


def _widening_loop(d2, dcut, n):
    """The TMscore program's cutoff widening, step by step (the specification of ``_select``)."""
    sel = d2 < dcut * dcut
    if n <= 3:
        return sel
    inc = np.zeros(len(d2))
    need = sel.sum(axis=1) < 3
    while need.any():
        inc[need] += 1
        dd = dcut + inc[need] * 0.5
        sel[need] = d2[need] < (dd * dd)[:, None]
        need = sel.sum(axis=1) < 3
    return sel


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10**6), m=st.integers(1, 5), n=st.integers(4, 40), scale=st.sampled_from([1, 10, 1000]),
       grid=st.booleans(), dcut=st.sampled_from([0.5, 1.0, 2.3, 4.0, 5.5]))
def test_one_step_widening_equals_the_loop(seed, m, n, scale, grid, dcut):
    from protgpu.scoring.tmscore import _select

    d = np.random.default_rng(seed).random((m, n)) * scale
    if grid:  # distances on the 0.5 A grid: ties with the widened cutoffs
        d = np.round(d * 2) / 2
    d2 = d * d
    np.testing.assert_array_equal(_select(d2.copy(), dcut, n), _widening_loop(d2, dcut, n))


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e30])
@pytest.mark.parametrize("fn", ["tm_score", "gdt", "lddt"])
def test_scores_reject_bad_coordinates(fn, bad):
    import protgpu as pg

    y = np.random.default_rng(0).normal(size=(10, 3)) * 10
    x = y.copy()
    x[3, 1] = bad
    msg = r"model: (NaN or infinite coordinates|coordinates beyond ±1e\+06 Angstrom) in frame 0 \(atom 3\)"
    with pytest.raises(InputError, match=msg):
        getattr(pg, fn)(x, y, device="cpu") if fn != "lddt" else pg.lddt(x, y)
    with pytest.raises(InputError, match=r"reference: .*frame 0 \(atom 3\)"):
        getattr(pg, fn)(y, x, device="cpu") if fn != "lddt" else pg.lddt(y, x)


def test_device_path_cleans_bad_models_without_scanning_on_the_host():
    """tm_score's GPU path zeroes models whose coordinates are NaN, infinite or beyond the bound (on the
    device: here with NumPy standing in for CuPy) and marks them; a shared reference keeps its shape."""
    from protgpu.scoring.tmscore import _nan_where, _without_bad_models

    x = np.ones((4, 6, 3), np.float32)
    x[1, 2, 0], x[3, 0, 1] = np.nan, 2e6
    y = np.full((1, 6, 3), 2.0, np.float32)
    xc, yc, bad = _without_bad_models(x, y, np)
    assert bad.tolist() == [False, True, False, True]
    assert xc.dtype == np.float32 and np.isfinite(xc).all() and (xc[[0, 2]] == 1).all() and (xc[[1, 3]] == 0).all()
    assert yc.shape == (1, 6, 3) and (yc == 2).all()
    y_bad = y.copy()
    y_bad[0, 0, 0] = np.inf
    assert _without_bad_models(x, y_bad, np)[2].all()  # a bad shared reference makes every model bad
    v = _nan_where(np.arange(4.0), bad, np)
    assert np.isnan(v[[1, 3]]).all() and v[[0, 2]].tolist() == [0.0, 2.0]


def test_cpu_scores_do_not_depend_on_the_blas_thread_count(datasets):
    """The same bytes with BLAS on 1 or 2 threads (a journal resumed under another setting must not
    change a row: 5 of these 98 frames differed in the last digits when the search's products ran
    on the caller's BLAS threads)."""
    from protgpu._threads import blas_threads

    traj = load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb")
    ref = load(datasets / "adk_open.pdb")
    with blas_threads(1):
        one = tm_score(traj, ref, device="cpu")
    with blas_threads(2):
        two = tm_score(traj, ref, device="cpu")
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(a, b)
