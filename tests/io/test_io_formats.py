"""Tests of protgpu.io's other readers and the load dispatch: mmCIF, trajectories, mdtraj and Biopython
objects, lists, the extension table, and bad inputs."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from test_io_pdb import ADK, ADK_CLOSED, ADK_DCD, REPO, _mdtraj, _raises, shared

from protgpu.errors import InputError
from protgpu.io import load
from protgpu.structure import Structure


def test_mmcif_8ddg():
    path = shared("mdtraj/8ddg.cif")
    s = load(path)
    t = _mdtraj(path)
    assert (s.n_atoms, s.n_residues, s.n_frames) == (64, 3, 1)
    np.testing.assert_allclose(s.coords, t.xyz * 10, atol=1e-3)


def test_mmcif_equals_pdb_1a8o():
    c = load(shared("biopython/1A8O.cif"))
    p = load(shared("biopython/1A8O.pdb"))
    assert (c.n_atoms, c.n_residues) == (644, p.n_residues)
    np.testing.assert_allclose(c.coords, p.coords, atol=1e-3)
    # (hetero differs: the mmCIF writes the MSE atoms as ATOM, the PDB as HETATM)
    for field in ("name", "element", "resname", "resid", "chain", "residue_index"):
        np.testing.assert_array_equal(getattr(c.atoms, field), getattr(p.atoms, field), err_msg=field)


def test_mmcif_multimodel_and_mismatch(tmp_path):
    import gemmi

    st = gemmi.read_structure(str(shared("mdtraj/2EQQ.pdb")))
    cif = tmp_path / "2eqq.cif"
    st.make_mmcif_document().write_file(str(cif))
    s, p = load(cif), load(shared("mdtraj/2EQQ.pdb"))
    assert (s.n_frames, s.n_atoms) == (20, 423)
    np.testing.assert_allclose(s.coords, p.coords, atol=1e-3)
    np.testing.assert_array_equal(load(cif, model=3).coords[0], s.coords[2])
    # drop one atom from model 2
    st[1][0][0].remove_atom("CA", "\0")
    bad = tmp_path / "bad_models.cif"
    st.make_mmcif_document().write_file(str(bad))
    _raises(bad, r"bad_models\.cif: model 2 has 422 atoms but model 1 has 423")


# ----------------------------------------------------------------------------------------------------
# Trajectories and objects
# ----------------------------------------------------------------------------------------------------


def test_dcd_with_pdb_top():
    s = load(ADK_DCD, top=ADK)
    t = _mdtraj(ADK_DCD, top=str(ADK))
    assert (s.n_frames, s.n_atoms, s.n_residues) == (98, 3341, 214)
    np.testing.assert_allclose(s.coords, t.xyz * 10, atol=1e-3)
    assert s.atoms == load(ADK).atoms
    np.testing.assert_array_equal(load(ADK_DCD, top=ADK, frames=7).coords[0], s.coords[7])
    np.testing.assert_array_equal(load(ADK_DCD, top=load(ADK), frames=[1, 3]).coords, s.coords[[1, 3]])


def test_xtc_units_box_time():
    top = shared("mdtraj/native.pdb")
    xtc = shared("mdtraj/frame0.xtc")
    s = load(xtc, top=top)
    t = _mdtraj(xtc, top=str(top))
    assert (s.n_frames, s.n_atoms) == (501, 22)
    np.testing.assert_allclose(s.coords, t.xyz * 10, atol=1e-3)
    np.testing.assert_allclose(s.box, t.unitcell_vectors * 10, atol=1e-3)
    np.testing.assert_allclose(s.time, t.time)
    assert s.box.shape == (501, 3, 3) and s.box.dtype == np.float32
    last = load(xtc, top=load(top), frames=-1)
    np.testing.assert_array_equal(last.coords[0], s.coords[-1])


def test_xtc_1am7():
    s = load(shared("mdtraj/1am7_corrected.xtc"), top=shared("mdtraj/1am7_protein.pdb"))
    t = _mdtraj(shared("mdtraj/1am7_corrected.xtc"), top=str(shared("mdtraj/1am7_protein.pdb")))
    assert (s.n_frames, s.n_atoms) == (t.n_frames, 2504)
    np.testing.assert_allclose(s.coords, t.xyz * 10, atol=1e-3)


def test_self_contained_gro(tmp_path):
    t = _mdtraj(shared("mdtraj/frame0.xtc"), top=str(shared("mdtraj/native.pdb")))[:3]
    gro = tmp_path / "three.gro"
    t.save_gro(str(gro))
    s = load(gro)
    assert (s.n_frames, s.n_atoms) == (3, 22)
    np.testing.assert_allclose(s.coords, t.xyz * 10, atol=0.01)  # .gro keeps 1e-3 nm
    assert s.box is not None


def test_top_as_mdtraj_topology():
    top = _mdtraj(shared("mdtraj/native.pdb")).topology
    s = load(shared("mdtraj/frame0.xtc"), top=top)
    assert (s.n_frames, s.n_atoms, s.n_residues) == (501, 22, 3)


def test_mdtraj_object():
    t = _mdtraj(ADK_DCD, top=str(ADK))[:5]
    s = load(t)
    assert (s.n_frames, s.n_atoms, s.n_residues) == (5, 3341, 214)
    np.testing.assert_allclose(s.coords, t.xyz * 10, atol=1e-4)
    # mdtraj has no chain ids for a blank chain: letters by chain index; segids survive
    assert set(s.atoms.chain) == {"A"} and set(s.atoms.segid) == {"4AKE"}
    assert s.select_indices("ca").size == 214


def test_biopython_objects():
    from Bio.PDB import PDBParser

    path = shared("mdtraj/2EQQ.pdb")
    bio = PDBParser(QUIET=True).get_structure("2eqq", str(path))
    ref = load(path)
    s = load(bio)
    assert (s.n_frames, s.n_atoms) == (20, 423)
    np.testing.assert_allclose(s.coords, ref.coords, atol=1e-4)
    for field in ("name", "element", "resname", "resid", "chain", "residue_index"):
        np.testing.assert_array_equal(getattr(s.atoms, field), getattr(ref.atoms, field), err_msg=field)
    m = load(bio[3])
    np.testing.assert_allclose(m.coords[0], ref.coords[3], atol=1e-4)
    c = load(bio[0]["A"])
    assert c.n_atoms == 423
    bio[3]["A"].child_list[0].detach_child("CA")
    with pytest.raises(InputError, match="model 4 has 422 atoms but model 1 has 423"):
        load(bio)
    with pytest.raises(InputError, match="level"):
        load(bio[0]["A"].child_list[0])


def test_structure_passthrough_and_array():
    s = load(ADK)
    assert load(s) is s
    assert load(s, frames=0).n_frames == 1
    a = load(np.zeros((2, 5, 3)))
    assert (a.n_frames, a.n_atoms) == (2, 5)


def test_list_of_paths_stacks(tmp_path):
    s = load([ADK, ADK_CLOSED])
    assert (s.n_frames, s.n_atoms) == (2, 3341)
    np.testing.assert_array_equal(s.coords[1], load(ADK_CLOSED).coords[0])
    other = tmp_path / "short.pdb"
    other.write_text("\n".join(ADK.read_text().splitlines()[:50]) + "\n")
    with pytest.raises(InputError, match="short.pdb: atoms differ from"):
        load([ADK, other])
    with pytest.raises(InputError, match="empty list"):
        load([])



def test_missing_file(tmp_path):
    _raises(tmp_path / "nope.pdb", "no such file")


def test_directory(tmp_path):
    d = tmp_path / "dir.pdb"
    d.mkdir()
    _raises(d, "is a directory")


def test_empty_file(tmp_path):
    p = tmp_path / "empty.pdb"
    p.write_bytes(b"")
    _raises(p, "file is empty")
    g = tmp_path / "empty.pdb.gz"
    g.write_bytes(gzip.compress(b""))
    _raises(g, "empty")


def test_garbage_text_and_binary(tmp_path):
    p = tmp_path / "garbage.pdb"
    p.write_text("hello\nthis is not a structure\n")
    _raises(p, "no ATOM/HETATM records")
    b = tmp_path / "binary.pdb"
    b.write_bytes(bytes(range(256)) * 10)
    _raises(b, "no ATOM/HETATM records")
    c = tmp_path / "garbage.cif"
    c.write_text("this is not cif\n")
    _raises(c, "garbage.cif: cannot read mmCIF")
    z = tmp_path / "bad.pdb.gz"
    z.write_bytes(b"not gzip at all")
    _raises(z, "bad.pdb.gz: no ATOM/HETATM records")  # (a .gz of plain text is read as plain text)
    z.write_bytes(b"\x1f\x8b" + b"not gzip at all")
    _raises(z, "bad.pdb.gz: corrupt or truncated gzip")


def test_truncated_pdb_reports_line(tmp_path):
    lines = ADK.read_text().splitlines()
    p = tmp_path / "trunc.pdb"
    # the file stops in the middle of line 40 (the 36th ATOM record)
    p.write_text("\n".join(lines[:39]) + "\n" + lines[39][:40])
    _raises(p, r"trunc\.pdb: line 40: truncated ATOM/HETATM record")


def test_bad_coordinate_reports_line(tmp_path):
    lines = ADK.read_text().splitlines()
    lines[10] = lines[10][:30] + "  12.xyz" + lines[10][38:]
    p = tmp_path / "badnum.pdb"
    p.write_text("\n".join(lines) + "\n")
    _raises(p, r"line 11: bad coordinate '12.xyz'")


def test_nan_coordinates(tmp_path):
    lines = ADK.read_text().splitlines()
    idx = next(i for i, ln in enumerate(lines) if ln.startswith("ATOM")) + 3  # the 4th atom
    lines[idx] = lines[idx][:38] + "     nan" + lines[idx][46:]
    p = tmp_path / "nan.pdb"
    p.write_text("\n".join(lines) + "\n")
    _raises(p, r"nan\.pdb: line \d+: bad coordinate 'nan' .*plain decimal numbers")


def test_model_atom_count_mismatch(tmp_path):
    atoms = [ln for ln in ADK.read_text().splitlines() if ln.startswith("ATOM")]
    text = "MODEL        1\n" + "\n".join(atoms[:30]) + "\nENDMDL\nMODEL        2\n" + "\n".join(atoms[:29])
    p = tmp_path / "models.pdb"
    p.write_text(text + "\nENDMDL\nEND\n")
    _raises(p, r"models\.pdb: model 2 has 29 atoms but model 1 has 30")
    swapped = atoms[:28] + [atoms[29], atoms[28]]
    text = "MODEL        1\n" + "\n".join(atoms[:30]) + "\nENDMDL\nMODEL        2\n" + "\n".join(swapped)
    q = tmp_path / "order.pdb"
    q.write_text(text + "\nENDMDL\nEND\n")
    _raises(q, r"order\.pdb: model 2 atom 28 is")


def test_unknown_extension_lists_supported(tmp_path):
    p = tmp_path / "thing.xyzzy"
    p.write_text("ATOM\n")
    msg = _raises(p, "unknown file extension '.xyzzy'; supported: .pdb")
    assert ".cif" in msg and ".xtc" in msg and ".dcd" in msg


def test_trajectory_without_top():
    _raises(ADK_DCD, r"adk_dims\.dcd: a \.dcd trajectory holds no topology; pass top=")


def test_trajectory_with_wrong_top():
    _raises(ADK_DCD, r"adk_dims\.dcd: cannot read trajectory.*topology has 22 atoms", top=shared("mdtraj/native.pdb"))


def test_trajectory_frame_out_of_range():
    with pytest.raises(InputError, match="adk_dims.dcd"):
        load(ADK_DCD, top=ADK, frames=500)


def test_garbage_trajectory(tmp_path):
    p = tmp_path / "junk.xtc"
    p.write_bytes(b"\x00\x01garbage" * 100)
    _raises(p, r"junk\.xtc: cannot read trajectory", top=ADK)


def test_bad_source_type():
    with pytest.raises(InputError, match="cannot load an object of type dict"):
        load({"a": 1})


# ----------------------------------------------------------------------------------------------------
# Atomic writes
# ----------------------------------------------------------------------------------------------------


def test_import_is_light():
    import subprocess
    import sys

    code = "import protgpu.io, protgpu.structure, sys; print(any(m in sys.modules for m in ('mdtraj', 'Bio', 'gemmi')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


def test_load_returns_structure_type():
    assert isinstance(load(ADK), Structure)


# ----------------------------------------------------------------------------------------------------
# The one extension table: load and the CLI's directory expansion read the same suffixes
# ----------------------------------------------------------------------------------------------------


def test_load_dispatches_every_readable_suffix(tmp_path):
    from protgpu.io.formats import is_structure_path, readable_suffixes, supported_text

    for suffix in readable_suffixes() + tuple(s.upper() for s in readable_suffixes()):
        p = tmp_path / f"x{suffix}"
        p.write_bytes(b"")
        assert is_structure_path(p)
        with pytest.raises(InputError, match="file is empty"):  # known: the file is opened, not refused
            load(p)
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(InputError, match="unknown file extension") as err:
        load(tmp_path / "x.txt")
    assert str(err.value).endswith("supported: " + supported_text())
    assert all(sfx.split(".")[1] in supported_text() for sfx in readable_suffixes())
    # every format may be compressed (issue 16): x.xtc.gz is read, decompressed to a temporary file
    assert not is_structure_path("x.txt") and is_structure_path("x.xtc.gz") and is_structure_path("x.gro.bz2")


def test_directory_expansion_uses_the_extension_table(tmp_path):
    from protgpu.batch.inputs import expand_inputs

    ref = load(ADK)
    folder = tmp_path / "in"
    folder.mkdir()
    # a .gro (a self-contained mdtraj format) and a .pdb.gz are inputs; a .txt is not
    _mdtraj(ADK).save_gro(str(folder / "a.gro"))
    (folder / "b.pdb.gz").write_bytes(gzip.compress(ADK.read_bytes()))
    (folder / "notes.txt").write_text("not a structure")
    found = expand_inputs([str(folder)])
    assert [Path(p).name for p in found] == ["a.gro", "b.pdb.gz"]
    gro = load(found[0])
    assert gro.n_atoms == ref.n_atoms
    np.testing.assert_allclose(gro.coords, ref.coords, atol=0.01)  # .gro keeps 0.001 nm
    np.testing.assert_array_equal(load(found[1]).coords, ref.coords)
