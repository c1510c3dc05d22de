"""Tests of protgpu.io.write: the atomic writer, stale-temporary cleanup, save_array and pg.save."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest
from test_io_pdb import ADK, ADK_DCD

import protgpu as pg
from protgpu.errors import InputError
from protgpu.io import atomic_path, load, remove_stale_temps, save_array, write_atomic
from protgpu.structure import Structure


def test_save_array_npy_and_npz(tmp_path):
    a = np.arange(12.0).reshape(3, 4)
    out = save_array(tmp_path / "a.npy", a)
    np.testing.assert_array_equal(np.load(out), a)
    save_array(tmp_path / "b.npz", {"x": a, "y": np.arange(3)})
    with np.load(tmp_path / "b.npz") as z:
        assert sorted(z.files) == ["x", "y"]
        np.testing.assert_array_equal(z["x"], a)
    save_array(tmp_path / "c.npz", a)
    with np.load(tmp_path / "c.npz") as z:
        np.testing.assert_array_equal(z["arr_0"], a)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "b.npz", "c.npz"]  # no temp files
    mode = stat.S_IMODE(os.stat(tmp_path / "a.npy").st_mode)
    assert mode & 0o044 or os.umask(os.umask(0)) & 0o044  # readable like a plain open() would make it
    with pytest.raises(InputError, match="needs a .npz"):
        save_array(tmp_path / "d.npy", {"x": a})
    with pytest.raises(InputError, match="unsupported output suffix '.txt'"):
        save_array(tmp_path / "e.txt", a)


def test_write_atomic_keeps_old_file_on_error(tmp_path):
    dest = tmp_path / "out.npy"
    save_array(dest, np.zeros(3))

    def boom(tmp):
        Path(tmp).write_bytes(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomic(dest, boom)
    np.testing.assert_array_equal(np.load(dest), np.zeros(3))
    assert [p.name for p in tmp_path.iterdir()] == ["out.npy"]


def test_write_atomic_missing_directory(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        write_atomic(tmp_path / "no" / "x.npy", lambda tmp: None)


# ----------------------------------------------------------------------------------------------------
# atomic_path: files and folders; remove_stale_temps
# ----------------------------------------------------------------------------------------------------


def test_atomic_path_file_success_and_failure(tmp_path):
    dest = tmp_path / "out.csv"
    with atomic_path(dest) as tmp:
        assert Path(tmp).parent == tmp_path and tmp.endswith(".csv") and not dest.exists()
        Path(tmp).write_text("a\n")
    assert dest.read_text() == "a\n"
    with pytest.raises(RuntimeError, match="boom"), atomic_path(dest) as tmp:
        Path(tmp).write_text("half")
        raise RuntimeError("boom")
    assert dest.read_text() == "a\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]
    with pytest.raises(InputError, match="does not exist"), atomic_path(tmp_path / "no" / "x.csv"):
        pass


def test_atomic_path_directory_new_replace_and_failure(tmp_path):
    dest = tmp_path / "out.zarr"
    for k in range(2):  # a new folder, then one that replaces the first
        with atomic_path(str(dest) + "/", directory=True) as tmp:
            assert not os.path.exists(tmp) and Path(tmp).parent == tmp_path
            os.makedirs(os.path.join(tmp, "sub"))
            Path(tmp, "sub", "data").write_text(str(k))
        assert (dest / "sub" / "data").read_text() == str(k)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out.zarr"]
    with pytest.raises(KeyboardInterrupt), atomic_path(dest, directory=True) as tmp:
        os.makedirs(tmp)
        Path(tmp, "partial").write_text("x")
        raise KeyboardInterrupt
    assert (dest / "sub" / "data").read_text() == "1"  # the old store is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.zarr"]  # and no temporary is left


def test_remove_stale_temps_matches_the_name_literally(tmp_path):
    # an output named '*.csv' (glob characters): only its own temporaries go
    mine = [".*.csv.ab12cd34.tmp.csv", ".*.csv.1234abcd.tmp", ".*.csv.1234abcd.old.tmp"]
    others = [".a.csv.ab12cd34.tmp.csv", "a.csv", "*.csv", ".*.csv.notes", ".b.csv.1234abcd.tmp"]
    for name in mine[:2] + others:
        Path(tmp_path, name).write_text("x")
    os.makedirs(tmp_path / mine[2] / "inner")  # a store's leftover folder
    removed = remove_stale_temps(tmp_path / "*.csv")
    assert sorted(os.path.basename(p) for p in removed) == sorted(mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
    assert remove_stale_temps(tmp_path / "missing" / "x.csv") == []


# ----------------------------------------------------------------------------------------------------
# pg.save round trips
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def adk():
    return load(ADK)


@pytest.mark.parametrize("name", ["a.pdb", "a.ent", "a.cif", "a.mmcif", "a.pdb.gz", "a.cif.gz"])
def test_save_structure_text_formats(tmp_path, adk, name):
    out = pg.save(adk, tmp_path / name)
    assert out == tmp_path / name and sorted(p.name for p in tmp_path.iterdir()) == [name]
    back = load(out)
    np.testing.assert_allclose(back.coords, adk.coords, atol=1e-3)
    for field in ("name", "element", "resname", "resid", "icode", "chain", "hetero", "residue_index"):
        np.testing.assert_array_equal(getattr(back.atoms, field), getattr(adk.atoms, field), err_msg=field)
    if ".pdb" in name or ".ent" in name:
        assert back.atoms == adk.atoms  # PDB keeps segment ids too


@pytest.mark.parametrize("suffix", [".pdb", ".cif"])
def test_save_frames_as_models(tmp_path, suffix):
    traj = load(ADK_DCD, top=ADK).frames(slice(0, 4))
    back = load(pg.save(traj, tmp_path / f"m{suffix}"))
    assert back.n_frames == 4 and back.atoms.name.tolist() == traj.atoms.name.tolist()
    np.testing.assert_allclose(back.coords, traj.coords, atol=1e-3)


@pytest.mark.parametrize("suffix, atol", [(".dcd", 1e-5), (".xtc", 6e-3)])  # xtc: a 0.001 nm grid
def test_save_trajectory_formats(tmp_path, adk, suffix, atol):
    traj = load(ADK_DCD, top=ADK).frames(slice(0, 6))
    box = np.diag([80.0, 90.0, 100.0]).astype(np.float32)
    with_box = Structure(traj.coords, traj.atoms, source="t", box=box, time=np.arange(6) * 2.0)
    back = load(pg.save(with_box, tmp_path / f"t{suffix}"), top=ADK)
    assert back.n_frames == 6 and back.atoms == adk.atoms
    np.testing.assert_allclose(back.coords, traj.coords, atol=atol)  # Angstrom in, Angstrom back
    np.testing.assert_allclose(back.box, np.broadcast_to(box, (6, 3, 3)), atol=atol)
    if suffix == ".xtc":
        np.testing.assert_allclose(back.time, with_box.time)


def test_save_errors(tmp_path, adk):
    with pytest.raises(InputError, match=r"cannot write '\.txt'.*supported: \.pdb"):
        pg.save(adk, tmp_path / "a.txt")
    with pytest.raises(InputError, match=r"cannot write '\.xtc\.gz'"):
        pg.save(adk, tmp_path / "a.xtc.gz")
    with pytest.raises(InputError, match="no atom names or residues; pass a Structure"):  # the front door's words
        pg.save(adk.coords, tmp_path / "a.pdb")
    with pytest.raises(InputError, match="does not exist"):
        pg.save(adk, tmp_path / "no" / "a.pdb")
    assert list(tmp_path.iterdir()) == []
