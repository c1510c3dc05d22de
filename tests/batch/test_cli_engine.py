"""``protgpu contacts``, ``protgpu rmsd`` and ``protgpu pairwise-rmsd`` through the batch engine: every
input form (directory, glob, @list, stdin, gzip), --keep-going with an errors file, --resume after an
interrupted run writing the same bytes as an uninterrupted one, --shard outputs whose union is the
full run, and the atomic .zarr / .npy outputs of the pairwise matrix."""

from __future__ import annotations

import csv
import gzip
import importlib
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import protgpu as pg
from protgpu import batch
from protgpu.batch.inputs import expand_inputs
from protgpu.batch.jobs import ContactsJob, RmsdJob
from protgpu.batch.writers import write_zarr
from protgpu.cli import main
from protgpu.errors import InputError
from protgpu.io import atomic_path

try:  # the test extra installs zarr (3.x, Python >= 3.11); only the .zarr tests need it
    import zarr
except ImportError:
    zarr = None
needs_zarr = pytest.mark.skipif(zarr is None, reason="zarr is not installed (pip install zarr)")


@pytest.fixture
def folder(tmp_path, datasets):
    """models/ with a.pdb (open AdK), b.pdb (closed), d.pdb (open) and sub/c.pdb.gz (closed, gzipped)."""
    d = tmp_path / "models"
    (d / "sub").mkdir(parents=True)
    shutil.copy(datasets / "adk_open.pdb", d / "a.pdb")
    shutil.copy(datasets / "adk_closed.pdb", d / "b.pdb")
    shutil.copy(datasets / "adk_open.pdb", d / "d.pdb")
    with open(datasets / "adk_closed.pdb", "rb") as fh, gzip.open(d / "sub" / "c.pdb.gz", "wb") as gz:
        gz.write(fh.read())
    return d


def cli(*args) -> int:
    return main([str(a) for a in args])


def input_forms(folder, tmp_path, monkeypatch):
    """The same four inputs as a directory, a recursive glob, an @list file and a list on stdin."""
    paths = expand_inputs([str(folder)])
    assert [os.path.basename(p) for p in paths] == ["a.pdb", "b.pdb", "d.pdb", "c.pdb.gz"]
    lst = tmp_path / "list.txt"
    lst.write_text("# the four models\n" + "\n".join(paths) + "\n")
    yield "dir", [folder]
    yield "glob", [str(folder / "**" / "*.pdb*")]
    yield "list", [f"@{lst}"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(paths) + "\n"))
    yield "stdin", ["-"]


def npz(path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def rows_of(path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def errors_of(out) -> list[str]:
    lines = (out.parent / (out.name + ".errors.tsv")).read_text().splitlines()
    assert lines[0] == "input\tsha256\terror"
    return [ln.split("\t")[0] for ln in lines[1:]]


def manifest_of(out) -> list[dict]:
    return [json.loads(x) for x in (out.parent / (out.name + ".manifest.jsonl")).read_text().splitlines()]


# --------------------------------------------------------------------------------------------------
# contacts


def test_contacts_quick_start_keeps_plain_names(tmp_path, datasets, capsys):
    """The README's command: one input, .npz with the map's own names, the summary line printed."""
    out = tmp_path / "adk_contacts.npz"
    assert cli("contacts", datasets / "adk_open.pdb", "--out", out, "--device", "cpu") == 0
    text = "".join(capsys.readouterr())  # the table on stdout, the closing note on stderr
    assert "214 residues" in text and "550 contacts" in text and "1 input(s) on the CPU" in text
    z = npz(out)
    assert z["distances"].shape == (1, 214, 214) and z["frequency"].shape == (214, 214)
    assert list(z["inputs"]) == [str(datasets / "adk_open.pdb")]
    assert not any("/" in k for k in z)
    expect = pg.contacts(pg.load(datasets / "adk_open.pdb"), device="cpu")
    np.testing.assert_array_equal(z["distances"], expect.distances)
    np.testing.assert_array_equal(z["contacts"], expect.contacts)


def test_contacts_every_input_form_gives_the_same_maps(folder, tmp_path, monkeypatch):
    outputs = {}
    for form, inputs in input_forms(folder, tmp_path, monkeypatch):
        out = tmp_path / f"{form}.npz"
        assert cli("contacts", *inputs, "--scheme", "ca", "--cutoff", "8", "-o", out, "-q", "--device", "cpu") == 0
        outputs[form] = out.read_bytes()
    assert len(set(outputs.values())) == 1, "the four input forms wrote different files"
    z = npz(tmp_path / "dir.npz")
    assert [os.path.basename(p) for p in z["inputs"]] == ["a.pdb", "b.pdb", "d.pdb", "c.pdb.gz"]
    np.testing.assert_array_equal(z["sub/c/frequency"], z["b/frequency"])  # the gzipped copy of b (sub/c.pdb.gz)
    np.testing.assert_array_equal(z["a/distances"], z["d/distances"])
    assert not np.array_equal(z["a/frequency"], z["b/frequency"])


def test_contacts_keep_going_records_the_bad_file(folder, tmp_path, capsys):
    (folder / "bad.pdb").write_text("this is not a structure\n" * 3)
    out = tmp_path / "m.npz"
    assert cli("contacts", folder, "-k", "-o", out, "--device", "cpu") == 1
    err = capsys.readouterr().err
    assert "1 input(s) failed; see" in err and "Traceback" not in err
    assert errors_of(out) == [str(folder / "bad.pdb")]
    z = npz(out)
    # keys are paths relative to the inputs' folder: sub/c.pdb.gz is sub/c
    assert sorted(k.split("/")[0] for k in z if "/" in k) == ["a"] * 12 + ["b"] * 12 + ["d"] * 12 + ["sub"] * 12
    status = {os.path.basename(e["input"]): e["status"] for e in manifest_of(out)[1:]}
    assert status == {"a.pdb": "ok", "b.pdb": "ok", "bad.pdb": "failed", "d.pdb": "ok", "c.pdb.gz": "ok"}
    # without --keep-going: one line naming the file, exit 2
    assert cli("contacts", folder, "-o", tmp_path / "n.npz", "-q", "--device", "cpu") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.pdb" in err[0]


def _stop_at_bad_then_resume(args, folder, out, capsys):
    """Run with c.pdb broken (the run stops there after journaling a.pdb and b.pdb), repair it, resume."""
    good = (folder / "sub" / "c.pdb.gz").read_bytes()
    (folder / "sub" / "c.pdb.gz").write_bytes(gzip.compress(b"ATOM  garbage\n"))
    assert cli(*args, "-o", out, "--batch-size", "1", "-j", "1") == 2
    assert "c.pdb.gz" in capsys.readouterr().err
    journaled = [e for e in manifest_of(out)[1:] if e["status"] == "ok"]
    assert not out.exists() and len(journaled) >= 1
    (folder / "sub" / "c.pdb.gz").write_bytes(good)
    assert cli(*args, "-o", out, "--resume") == 0
    return len(journaled)


def test_contacts_resume_after_an_interrupted_run_writes_the_same_bytes(folder, tmp_path, capsys):
    args = ("contacts", folder, "--scheme", "ca", "--cutoff", "8", "--device", "cpu")
    full = tmp_path / "full.npz"
    assert cli(*args, "-o", full, "-q") == 0
    out = tmp_path / "m.npz"
    n = _stop_at_bad_then_resume(args, folder, out, capsys)
    assert f"({n} resumed)" in capsys.readouterr().err  # the closing note is on stderr
    assert out.read_bytes() == full.read_bytes()


def test_contacts_shards_union_equals_the_full_run(folder, tmp_path):
    args = ("contacts", folder, "--frequency", "--device", "cpu", "-q")
    assert cli(*args, "-o", tmp_path / "full.npz") == 0
    full = npz(tmp_path / "full.npz")
    union, inputs = {}, []
    for i in range(3):
        assert cli(*args, "-o", tmp_path / "m.npz", "--shard", f"{i}/3") == 0
        part = npz(tmp_path / f"m.shard-{i}-of-3.npz")
        inputs += list(part.pop("inputs"))
        assert not set(part) & set(union)
        union.update(part)
    assert sorted(inputs) == sorted(full.pop("inputs"))
    assert union.keys() == full.keys()
    for k in full:
        np.testing.assert_array_equal(union[k], full[k])


def test_contacts_job_from_python_equals_contacts(datasets):
    job = ContactsJob(scheme="closest-heavy", cutoff=4.5, output="pairs", device="cpu")
    s = batch.run([datasets / "adk_open.pdb", datasets / "adk_closed.pdb"], job, pool="inline")
    assert s.n_ok == 2 and [r["residues"] for r in s.rows] == [214, 214]
    with pytest.raises(InputError, match="scheme"):
        ContactsJob(scheme="cb")


@pytest.mark.parametrize("keep_going", [[], ["--keep-going"]])
@pytest.mark.parametrize("option, value", [("--cutoff", "-1"), ("--cutoff", "nan"), ("--min-separation", "-2")])
def test_contacts_bad_parameter_is_one_line_in_cli_words(folder, tmp_path, capsys, option, value, keep_going):
    """protgpu.contacts checks its parameters (once, before any input is read); the command names the
    option, exits 2, writes nothing - with --keep-going too (a parameter is no input's failure)."""
    out = tmp_path / "m.npz"
    assert cli("contacts", folder, option, value, "--device", "cpu", "-o", out, *keep_going) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{option} must be" in err and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "m.npz.errors.tsv").exists()


def test_contacts_cutoff_in_nanometres_warns(datasets):
    from protgpu.contacts import contacts

    with pytest.warns(UserWarning, match=r"cutoff=0.45 Angstrom: .* in Angstrom \(1 nm = 10 A\)"):
        contacts(datasets / "adk_open.pdb", cutoff=0.45, device="cpu")


# --------------------------------------------------------------------------------------------------
# rmsd


@pytest.mark.parametrize("fit, atoms", [(None, None), ("ca", None), ("ca", "heavy"), ("backbone", "ca")])
def test_rmsd_job_equals_rmsd_bit_for_bit(datasets, fit, atoms):
    top = str(datasets / "adk_open.pdb")
    ref = pg.load(datasets / "adk_closed.pdb")
    inputs = [datasets / "adk_open.pdb", datasets / "adk_dims.dcd"]
    s = batch.run(inputs, RmsdJob(ref, fit=fit, atoms=atoms, top=top, device="cpu"), pool="inline")
    got = np.array([r["rmsd_angstrom"] for r in s.rows])
    expect = np.concatenate([pg.rmsd(pg.load(p, top=top), ref, fit=fit, atoms=atoms, device="cpu") for p in inputs])
    np.testing.assert_array_equal(got, expect)
    assert [r["frame"] for r in s.rows] == [0, *range(98)]


def test_rmsd_every_input_form_and_table_formats(folder, tmp_path, monkeypatch):
    ref = folder / "a.pdb"
    texts = set()
    for form, inputs in input_forms(folder, tmp_path, monkeypatch):
        out = tmp_path / f"{form}.csv"
        assert cli("rmsd", *inputs, "--ref", ref, "-s", "ca", "-o", out, "-q", "--device", "cpu") == 0
        texts.add(out.read_text())
    assert len(texts) == 1
    rows = rows_of(tmp_path / "dir.csv")
    assert [os.path.basename(r["input"]) for r in rows] == ["a.pdb", "b.pdb", "d.pdb", "c.pdb.gz"]
    v = [float(r["rmsd_angstrom"]) for r in rows]
    assert v[0] < 1e-6 and v[2] < 1e-6 and v[1] == v[3] > 5
    assert cli("rmsd", folder, "--ref", ref, "-s", "ca", "-o", tmp_path / "r.jsonl", "-q", "--device", "cpu") == 0
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [x["rmsd_angstrom"] for x in lines] == v and list(lines[0]) == ["input", "frame", "rmsd_angstrom"]
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    assert cli("rmsd", folder, "--ref", ref, "-s", "ca", "-o", tmp_path / "r.parquet", "-q", "--device", "cpu") == 0
    assert pq.read_table(tmp_path / "r.parquet").column("rmsd_angstrom").to_pylist() == v


def test_rmsd_keep_going_tables_and_one_piece_outputs(folder, tmp_path, datasets, capsys):
    (folder / "bad.pdb").write_text("")
    traj = ("--top", datasets / "adk_open.pdb")
    for name in ("r.csv", "r.npz"):
        out = tmp_path / name
        assert cli("rmsd", folder, datasets / "adk_dims.dcd", *traj, "--ref", folder / "b.pdb", "-s", "ca", "-k",
                   "-o", out, "-q", "--device", "cpu") == 1
        assert errors_of(out) == [str(folder / "bad.pdb")]
        assert "see" in capsys.readouterr().err
    rows = rows_of(tmp_path / "r.csv")
    z = npz(tmp_path / "r.npz")
    assert len(rows) == 4 + 98 == len(z["rmsd"])
    np.testing.assert_array_equal(z["rmsd"], [float(r["rmsd_angstrom"]) for r in rows])
    assert list(z["input"]) == [r["input"] for r in rows] and z["frame"][-1] == 97
    man = manifest_of(tmp_path / "r.npz")
    assert man[0]["job"] == "rmsd" and [e["status"] for e in man[1:]].count("failed") == 1
    assert all(e["sha256"] == batch.file_sha256(e["input"]) for e in man[1:])


def test_rmsd_resume_after_an_interrupted_run_writes_the_same_bytes(folder, tmp_path, capsys):
    args = ("rmsd", folder, "--ref", folder / "b.pdb", "--fit", "ca", "-s", "heavy", "--device", "cpu", "-q")
    assert cli(*args, "-o", tmp_path / "full.csv") == 0
    out = tmp_path / "r.csv"
    _stop_at_bad_then_resume(args, folder, out, capsys)
    assert out.read_bytes() == (tmp_path / "full.csv").read_bytes()


def test_rmsd_shards_union_equals_the_full_run(folder, tmp_path, datasets):
    args = ("rmsd", folder, datasets / "adk_dims.dcd", "--top", datasets / "adk_open.pdb", "--ref", folder / "a.pdb",
            "-s", "ca", "--device", "cpu", "-q")
    assert cli(*args, "-o", tmp_path / "full.csv") == 0
    parts = []
    for i in range(2):
        assert cli(*args, "-o", tmp_path / "r.csv", "--shard", f"{i}/2") == 0
        parts.append(rows_of(tmp_path / f"r.shard-{i}-of-2.csv"))
    assert all(parts)
    def key(r):
        return r["input"], int(r["frame"])

    assert sorted(parts[0] + parts[1], key=key) == sorted(rows_of(tmp_path / "full.csv"), key=key)
    # a one-piece output per shard
    assert cli(*args, "-o", tmp_path / "v.npy", "--shard", "1/2") == 0
    np.testing.assert_array_equal(np.load(tmp_path / "v.shard-1-of-2.npy"), [float(r["rmsd_angstrom"])
                                                                            for r in parts[1]])


def test_rmsd_option_conflicts_are_one_line_errors(folder, tmp_path, capsys):
    base = ("rmsd", folder, "--ref", folder / "a.pdb", "-q")
    assert cli(*base, "-o", tmp_path / "r.npy", "--resume") == 2
    assert "--resume needs a table --out" in capsys.readouterr().err
    for extra in (("--shard", "0/2"), ("--workers", "2"), ("-o", tmp_path / "r.csv", "--resume")):
        assert cli(*base, "--superpose-out", tmp_path / "x.pdb", *extra) == 2
        assert "--superpose-out" in capsys.readouterr().err
    assert not list(tmp_path.glob("r.*")) and not (tmp_path / "x.pdb").exists()


def test_rmsd_superpose_out_with_keep_going(folder, tmp_path):
    (folder / "bad.pdb").write_text("nothing\n")
    aligned = tmp_path / "aligned.pdb"
    assert cli("rmsd", folder, "--ref", folder / "b.pdb", "--fit", "ca", "-k", "--superpose-out", aligned,
               "-o", tmp_path / "r.csv", "-q", "--device", "cpu") == 1
    moved = pg.load(aligned)
    assert moved.n_frames == 4  # a, b, d, c: the bad file left out
    ca = moved.select_indices("ca")
    ref = pg.load(folder / "b.pdb").coords[0, ca]
    rms = np.sqrt(((moved.coords[:, ca] - ref) ** 2).sum(-1).mean(-1))
    np.testing.assert_allclose(rms, [float(r["rmsd_angstrom"]) for r in rows_of(tmp_path / "r.csv")], atol=2e-3)


# --------------------------------------------------------------------------------------------------
# pairwise-rmsd


def test_pairwise_every_input_form_gives_the_same_matrix(folder, tmp_path, monkeypatch):
    mats = []
    for form, inputs in input_forms(folder, tmp_path, monkeypatch):
        out = tmp_path / f"{form}.npy"
        assert cli("pairwise-rmsd", *inputs, "-s", "ca", "-o", out, "-q", "--device", "cpu") == 0
        mats.append(np.load(out))
        man = manifest_of(out)
        assert man[0]["job"] == "pairwise-rmsd" and [e["rows"][0]["first_row"] for e in man[1:]] == [0, 1, 2, 3]
    for m in mats[1:]:
        np.testing.assert_array_equal(m, mats[0])
    m = mats[0]
    assert m.shape == (4, 4) and m[0, 2] < 1e-3 and m[1, 3] < 1e-3 and m[0, 1] > 5


def test_pairwise_keep_going_leaves_bad_and_mismatched_inputs_out(folder, tmp_path, datasets, capsys):
    (folder / "bad.pdb").write_text("junk\n")
    lines = (datasets / "adk_open.pdb").read_text().splitlines(keepends=True)
    (folder / "short.pdb").write_text("".join([ln for ln in lines if ln.startswith("ATOM")][:800]))
    out = tmp_path / "m.npz"
    assert cli("pairwise-rmsd", folder, "-s", "ca", "-k", "-o", out, "--device", "cpu") == 1
    assert "2 input(s) left out" in capsys.readouterr().err
    assert errors_of(out) == [str(folder / "bad.pdb"), str(folder / "short.pdb")]
    assert "same atoms" in (tmp_path / "m.npz.errors.tsv").read_text()
    z = npz(out)
    assert z["rmsd"].shape == (4, 4) and [os.path.basename(p) for p in z["input"]] == ["a.pdb", "b.pdb", "d.pdb",
                                                                                        "c.pdb.gz"]
    # without --keep-going the mismatch is an error naming the file, and nothing is written
    assert cli("pairwise-rmsd", folder / "a.pdb", folder / "short.pdb", "-s", "ca", "-o", tmp_path / "x.npy") == 2
    assert "short.pdb" in capsys.readouterr().err and not (tmp_path / "x.npy").exists()


def test_pairwise_gpus_option_is_checked(folder, tmp_path, capsys):
    for bad in ("0", "two"):
        assert cli("pairwise-rmsd", folder / "a.pdb", "-s", "ca", "--gpus", bad, "-o", tmp_path / "m.npy") == 2
        assert "--gpus" in capsys.readouterr().err and not (tmp_path / "m.npy").exists()
    # on the CPU there are no GPUs to spread over: a clear error, nothing written
    assert cli("pairwise-rmsd", folder / "a.pdb", "-s", "ca", "--gpus", "2", "--device", "cpu",
               "-o", tmp_path / "m.npy") == 2
    assert "GPU" in capsys.readouterr().err and not (tmp_path / "m.npy").exists()


@needs_zarr
@pytest.mark.parametrize("condensed", [False, True])
def test_pairwise_zarr_equals_npy(tmp_path, datasets, condensed):
    args = ("pairwise-rmsd", datasets / "adk_dims.dcd", datasets / "adk_open.pdb", "--top", datasets / "adk_open.pdb",
            "-s", "ca", "-q", "--device", "cpu", *(["--condensed"] if condensed else []))
    assert cli(*args, "-o", tmp_path / "m.npy") == 0
    assert cli(*args, "-o", tmp_path / "m.zarr") == 0
    z = zarr.open_array(str(tmp_path / "m.zarr"), mode="r")
    np.testing.assert_array_equal(z[:], np.load(tmp_path / "m.npy"))
    assert z.shape == ((99 * 98 // 2,) if condensed else (99, 99)) and z.attrs["frames"] == [98, 1]
    # written again over the old store: replaced whole, no temporary folder left behind
    assert cli(*args, "-o", tmp_path / "m.zarr") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npy", "m.npy.manifest.jsonl", "m.zarr",
                                                          "m.zarr.manifest.jsonl"]


@needs_zarr
def test_pairwise_zarr_failure_leaves_the_old_store(tmp_path, datasets, monkeypatch, capsys):
    args = ("pairwise-rmsd", datasets / "adk_open.pdb", datasets / "adk_closed.pdb", "-s", "ca", "-q", "--device",
            "cpu", "-o", tmp_path / "m.zarr")
    assert cli(*args) == 0
    before = zarr.open_array(str(tmp_path / "m.zarr"), mode="r")[:]
    superpose = importlib.import_module("protgpu.superpose")  # the module: pg.superpose is the function

    def broken(x, *a, out=None, **k):
        out[0:1] = 99.0  # a first tile lands in the temporary store, then the run dies
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(superpose, "pairwise_rmsd", broken)
    capsys.readouterr()
    assert main([str(a) for a in args]) != 0
    err = capsys.readouterr().err.strip().splitlines()  # one line (OutputError), no traceback
    assert len(err) == 1 and "cannot write (No space left on device)" in err[0]
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "m.zarr"), mode="r")[:], before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.zarr", "m.zarr.manifest.jsonl"]


@needs_zarr
def test_write_zarr_per_input_arrays_and_atomic_store(tmp_path):
    """The writer an engine .zarr output would use: one array per input stem, strings included."""
    items = [("a/distances", np.arange(8, dtype=np.float32).reshape(2, 2, 2)), ("a/scheme", np.array("ca")),
             ("b/distances", np.ones((1, 2, 2), np.float32)), ("inputs", np.array(["x/a.pdb", "x/b.pdb"]))]
    dest = write_zarr(tmp_path / "d.zarr", iter(items), attrs={"job": "distances"})
    g = zarr.open_group(str(dest), mode="r")
    for k, a in items:
        got = g[k][...]
        if a.dtype.kind == "U":
            assert np.asarray(got).tolist() == a.tolist()  # read back as NumPy's variable-width strings
        else:
            np.testing.assert_array_equal(got, a)
    assert g.attrs["job"] == "distances"
    with pytest.raises(RuntimeError), atomic_path(dest, directory=True) as tmp:
        os.makedirs(tmp)
        raise RuntimeError("killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.zarr"]
    with pytest.raises(InputError, match="does not exist"), atomic_path(tmp_path / "no" / "d.zarr", directory=True):
        pass


def test_console_script_quick_start(tmp_path, datasets):
    """``protgpu contacts datasets/adk_open.pdb --out adk_contacts.npz`` from a fresh process."""
    r = subprocess.run([sys.executable, "-m", "protgpu.cli", "contacts", str(datasets / "adk_open.pdb"), "--out",
                        "adk_contacts.npz"], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PROTGPU_DISABLE_GPU": "1",
                            "PYTHONPATH": os.pathsep.join([str(datasets.parent), os.environ.get("PYTHONPATH", "")])})
    assert r.returncode == 0, r.stderr
    assert "550 contacts" in r.stdout and "maps to adk_contacts.npz" in r.stderr
    assert "distances" in npz(tmp_path / "adk_contacts.npz")
