"""Loading: crystal boxes, compression, one atom naming (PSF), virtual sites, odd files and values
(issue 16 section 4, issue 21)."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import subprocess
import sys

import numpy as np
import pytest

import protgpu as pg
from protgpu.errors import InputError

ATOM = "ATOM      1  CA  ALA A   1    {}   0.000   0.000  1.00  0.00           C\n"


def _write(path, text):
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_cryst1_is_a_crystal_box_not_applied_by_default(datasets):
    s = pg.load(datasets / "adk_open.pdb")
    assert s.box_source == "crystal" and s.box.shape == (1, 3, 3)
    np.testing.assert_allclose(s.box[0, 2], [40.0085, 40.0085, 56.580566], rtol=1e-6)
    assert s.periodic_box() is None and s.periodic_box(True) is s.box
    assert s.select("ca").box_source == "crystal"


@pytest.mark.parametrize("cell", ["    1.000    1.000    1.000  90.00  90.00  90.00", "    0.000    0.000    0.000"])
def test_placeholder_cell_is_no_box(tmp_path, cell):
    p = _write(tmp_path / "x.pdb", f"CRYST1{cell}\n" + ATOM.format("   1.000"))
    assert pg.load(p).box is None


def test_negative_cell_refused(tmp_path):
    p = _write(tmp_path / "x.pdb", "CRYST1   -1.000   10.000   10.000  90.00  90.00  90.00\n" + ATOM.format("   1.000"))
    with pytest.raises(InputError, match="x.pdb: bad unit cell"):
        pg.load(p)


def test_cryst1_per_model(tmp_path):
    text = ""
    for k, a in ((1, 10.0), (2, 20.0)):
        cryst = f"CRYST1{a:9.3f}{a:9.3f}{a:9.3f}  90.00  90.00  90.00\n"
        text += f"MODEL     {k:4d}\n" + cryst + ATOM.format("   1.000") + "ENDMDL\n"
    s = pg.load(_write(tmp_path / "m.pdb", text))
    assert s.box[:, 0, 0].tolist() == [10.0, 20.0]
    assert pg.load(tmp_path / "m.pdb", model=2).box[0, 0, 0] == 20.0


def test_distances_cli_periodic_on_cryst1(tmp_path, datasets):
    out = tmp_path / "d.npy"
    r = subprocess.run([sys.executable, "-m", "protgpu.cli", "distances", str(datasets / "adk_open.pdb"),
                        "--select", "resid 1-3", "--periodic", "--device", "cpu", "-o", str(out)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("suffix,pack", [(".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress)])
@pytest.mark.parametrize("fmt", ["pdb", "gro"])
def test_compressed_every_format(tmp_path, datasets, fmt, suffix, pack):
    ref = pg.load(datasets / "adk_open.pdb")
    plain = tmp_path / f"a.{fmt}"
    if fmt == "gro":
        import mdtraj

        mdtraj.load(str(datasets / "adk_open.pdb")).save_gro(str(plain))
    else:
        plain.write_bytes((datasets / "adk_open.pdb").read_bytes())
    packed = _write(tmp_path / f"b.{fmt}{suffix}", pack(plain.read_bytes()))
    a, b = pg.load(plain), pg.load(packed)
    assert a.n_atoms == b.n_atoms == ref.n_atoms and np.array_equal(a.coords, b.coords)
    assert not list(tmp_path.glob("protgpu-*"))


def test_plain_text_named_gz_and_corrupt_gzip(tmp_path, datasets):
    data = (datasets / "adk_open.pdb").read_bytes()
    assert pg.load(_write(tmp_path / "p.pdb.gz", data)).n_atoms == 3341
    bad = bytearray(gzip.compress(data))
    bad[len(bad) // 2 : len(bad) // 2 + 40] = b"\0" * 40
    with pytest.raises(InputError, match=r"c\.pdb\.gz: corrupt or truncated gzip") as e:
        pg.load(_write(tmp_path / "c.pdb.gz", bytes(bad)))
    assert "\n" not in str(e.value)


def test_decompression_cap(tmp_path, monkeypatch):
    monkeypatch.setenv("PROTGPU_MAX_INPUT_BYTES", str(8 << 20))
    bomb = _write(tmp_path / "bomb.pdb.gz", gzip.compress(b" " * (64 << 20), 1))
    with pytest.raises(InputError, match=r"bomb\.pdb\.gz: gzip stream unpacks to more than 8388608 bytes"):
        pg.load(bomb)


def test_psf_names_match_charmm_pdb(tmp_path, datasets):
    ref = pg.load(datasets / "adk_open.pdb")
    a = ref.atoms
    lines = ["PSF", "", "       1 !NTITLE", " REMARKS test", "", f"{len(a):8d} !NATOM"]
    mass = {"H": 1.008, "C": 12.011, "N": 14.007, "O": 15.999, "S": 32.06}
    for i in range(len(a)):
        lines.append(f"{i + 1:8d} {a.segid[i]:<4s} {a.resid[i]:<4d} {a.resname[i]:<4s} {a.name[i]:<4s} X  0.0  "
                     f"{mass[a.element[i]]:.4f}  0")
    psf = _write(tmp_path / "adk.psf", "\n".join(lines) + "\n\n       0 !NBOND\n")
    traj = pg.load(datasets / "adk_dims.dcd", top=psf)
    assert traj.atoms.name.tolist() == ref.atoms.name.tolist()
    assert traj.atoms.element.tolist() == ref.atoms.element.tolist()
    q = pg.native_contacts(traj, datasets / "adk_closed.pdb")
    assert q is not None


def test_virtual_sites_are_not_heavy(tmp_path):
    text = ("ATOM      1  OW  SOL     1       0.000   0.000   0.000  1.00  0.00\n"
            "ATOM      2  HW1 SOL     1       0.957   0.000   0.000  1.00  0.00\n"
            "ATOM      3  MW  SOL     1       0.100   0.100   0.000  1.00  0.00\n"
            "ATOM      4  EPW HOH     2       5.100   0.100   0.000  1.00  0.00           M\n")
    s = pg.load(_write(tmp_path / "w.pdb", text))
    assert s.atoms.element.tolist() == ["O", "H", "", ""]
    assert s.select("heavy").atoms.name.tolist() == ["OW"]


def test_trj_alias(tmp_path, datasets):
    import mdtraj

    t = mdtraj.load(str(datasets / "adk_open.pdb"))
    t.unitcell_vectors = None
    t.save_mdcrd(str(tmp_path / "a.mdcrd"))
    os.rename(tmp_path / "a.mdcrd", tmp_path / "a.trj")
    s = pg.load(tmp_path / "a.trj", top=datasets / "adk_open.pdb")
    assert s.n_atoms == 3341


def test_fifo_and_devices_refused(tmp_path):
    fifo = tmp_path / "x.pdb"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="x.pdb: not a regular file"):
        pg.load(fifo)
    link = tmp_path / "z.pdb"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputError, match="z.pdb: not a regular file"):
        pg.load(link)


def test_bom_keeps_first_atom(tmp_path, datasets):
    lines = (datasets / "adk_open.pdb").read_bytes().split(b"\n")
    atoms = b"\n".join(ln for ln in lines if ln.startswith(b"ATOM"))
    s = pg.load(_write(tmp_path / "b.pdb", b"\xef\xbb\xbf" + atoms + b"\n"))
    assert s.n_atoms == 3341


@pytest.mark.parametrize("value", ["1e30    ", "99999999", "  1_000 ", "     inf"])
def test_odd_coordinates_refused(tmp_path, value):
    with pytest.raises(InputError, match=r"c\.pdb: line 1: .*coordinate"):
        pg.load(_write(tmp_path / "c.pdb", ATOM.format(value)))


def test_long_coordinate_line_refused(tmp_path):
    line = "ATOM      1  CA  ALA A   1      " + "9" * 100000 + "\n"
    with pytest.raises(InputError, match="out of range"):
        pg.load(_write(tmp_path / "c.pdb", line))


def test_empty_inputs_refused(tmp_path):
    with pytest.raises(InputError, match="no atoms"):
        pg.load(np.zeros((0, 3)))
    with pytest.raises(InputError, match="e.gro"):
        pg.load(_write(tmp_path / "e.gro", "t\n    0\n   1.0   1.0   1.0\n"))


def test_negative_box_refused():
    t = pg.load(np.zeros((2, 3))).atoms
    with pytest.raises(InputError, match="positive"):
        pg.Structure(np.zeros((2, 3)), t, box=[-1.0, 10.0, 10.0])


def test_messages(tmp_path, datasets):
    with pytest.raises(InputError, match="model must be an int"):
        pg.load(datasets / "adk_open.pdb", model="1")
    with pytest.raises(InputError, match=r"frame 1000 out of range \(the trajectory has 98 frames\)"):
        pg.load(datasets / "adk_dims.dcd", top=datasets / "adk_open.pdb", frames=1000)
    cut = _write(tmp_path / "cut.dcd", (datasets / "adk_dims.dcd").read_bytes()[:2000])
    with pytest.raises(InputError, match="cut.dcd: cannot read trajectory: truncated or corrupt"):
        pg.load(cut, top=datasets / "adk_open.pdb")


def test_dcd_plugin_prints_nothing_on_stdout(datasets):
    code = ("import protgpu as pg; pg.load('datasets/adk_dims.dcd', top='datasets/adk_open.pdb'); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=datasets.parent, env={**os.environ, "PYTHONPATH": str(datasets.parent)})
    assert r.stdout == "ok\n", r.stdout
    assert r.stderr == ""


def test_contacts_apply_a_crystal_cell_only_when_asked(datasets):
    s = pg.load(datasets / "adk_open.pdb").select("resid 1-40")
    assert s.box_source == "crystal"
    default = pg.contacts(s, device="cpu")
    plain = pg.contacts(pg.Structure(s.coords, s.atoms, source="nobox"), device="cpu")
    np.testing.assert_array_equal(np.asarray(default.distances), np.asarray(plain.distances))
    # periodic=True applies it (same numbers here: the cell is far larger than 40 residues)
    asked = pg.contacts(s, periodic=True, device="cpu")
    assert np.asarray(asked.distances).shape == np.asarray(default.distances).shape


def test_reader_warnings_stay_off_stderr(tmp_path, datasets):
    bad = _write(tmp_path / "g.nc", b"CDF\x01garbage")
    code = (f"import protgpu as pg\ntry:\n    pg.load({str(bad)!r}, top='datasets/adk_open.pdb')\n"
            "except Exception as e:\n    print(e)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=datasets.parent, env={**os.environ, "PYTHONPATH": str(datasets.parent)})
    assert r.stderr == "" and r.stdout.count("\n") == 1 and "g.nc: cannot read trajectory" in r.stdout
