"""pg.tm_align's inputs: forms, pairs, normalize_by, device, bad input (one-line errors), chain choice,
and select("ca") keeping UNK residues."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import protgpu as pg
from protgpu.align.chains import one_chain
from protgpu.errors import GPUUnavailableError, InputError
from protgpu.structure import AtomTable, Structure

REPO = Path(__file__).resolve().parents[2]
REF = {(r["mobile"], r["target"]): r
       for r in json.loads((REPO / "datasets" / "tmalign" / "reference.json").read_text())["pairs"]}
A, B = "tmalign/d2a6ca1.pdb", "tmalign/d1neqa_.pdb"


@pytest.fixture(scope="module")
def ab(datasets):
    return str(datasets / A), str(datasets / B)


def test_select_ca_keeps_unk_residues(datasets):
    s = pg.load(datasets / "tmalign" / "d1t3ba2.pdb")
    assert set(s.atoms.resname.tolist()) == {"UNK"}
    assert s.select("ca").n_atoms == s.n_atoms == 59
    t = AtomTable.build(["CA", "CA", "CA"], ["UNK", "GLY", "CA"], [1, 2, 3], ["A", "A", "A"],
                        element=["C", "C", "CA"], hetero=[False, False, True])
    np.testing.assert_array_equal(Structure(np.zeros((3, 3)), t).select_indices("ca"), [0, 1])


def test_forms_give_the_same_numbers(ab):
    ref = REF[(A, B)]
    x, y = one_chain(ab[0], "x"), one_chain(ab[1], "y")
    for mobile, target in ((ab[0], ab[1]), (Path(ab[0]), pg.load(ab[1])), (x.ca, y.ca), (x.ca.tolist(), y.ca)):
        r = pg.tm_align(mobile, target)
        assert r.tm_target.shape == (1,) and r.rotation.shape == (1, 3, 3)
        assert r.tm_target[0] == pytest.approx(ref["tm_target"], abs=1e-9)
        assert r.tm_mobile[0] == pytest.approx(ref["tm_mobile"], abs=1e-9)


def test_frames_are_models_as_everywhere(ab):
    # a multi-frame Structure (multi-model file, trajectory) is one mobile per frame, as a list or an
    # (N, L, 3) array is; a torch CA trace gives the same numbers
    one = pg.load(ab[0])
    two = Structure(np.stack([one.coords[0], one.coords[0] @ np.diag([1.0, -1.0, -1.0]).astype(np.float32)]),
                    one.atoms, source="two.pdb")
    r = pg.tm_align(two, ab[1])
    ref = REF[(A, B)]["tm_target"]
    assert r.tm_target.shape == (2,) and np.allclose(r.tm_target, ref, atol=1e-9)
    assert r.lengths.tolist() == [list(r.lengths[0])] * 2
    torch = pytest.importorskip("torch")
    x = one_chain(ab[0], "x").ca
    assert pg.tm_align(torch.from_numpy(x), ab[1]).tm_target[0] == pytest.approx(ref, abs=1e-9)


def test_one_against_many_one_to_one_and_pairs(ab):
    one = pg.tm_align(ab[0], [ab[1], ab[0]])
    assert one.tm_target.shape == (2,) and one.tm_target[1] == pytest.approx(1.0)
    assert one.tm_target[0] == pytest.approx(REF[(A, B)]["tm_target"], abs=1e-9)
    many = pg.tm_align([ab[1], ab[0]], ab[0])
    assert many.tm_mobile[0] == pytest.approx(one.tm_target[0], abs=1e-3)  # the other direction
    pairs = pg.tm_align([ab[0], ab[1]], [ab[0], ab[1]], pairs=[(0, 1), (1, 1)])
    assert pairs.tm_target[0] == pytest.approx(one.tm_target[0], abs=1e-12) and pairs.tm_target[1] == 1.0
    x = one_chain(ab[0], "x").ca
    stacked = pg.tm_align(np.stack([x, x + 1.0]), x)  # an (N, L, 3) array is N traces
    assert stacked.tm_target.shape == (2,) and np.allclose(stacked.tm_target, 1.0)
    with pytest.raises(InputError, match="equal length"):
        pg.tm_align([ab[0], ab[1]], [ab[0], ab[1], ab[0]])
    with pytest.raises(InputError, match=r"pairs\[0\]"):
        pg.tm_align([ab[0]], [ab[1]], pairs=[(0, 3)])


def test_normalize_by(ab):
    base = pg.tm_align(ab[0], ab[1])
    l1, l2 = base.lengths[0]
    assert pg.tm_align(ab[0], ab[1], normalize_by="mobile").tm[0] == base.tm_mobile[0]
    assert pg.tm_align(ab[0], ab[1], normalize_by="shorter").tm[0] == (base.tm_mobile if l1 < l2 else base.tm_target)[0]
    avg = pg.tm_align(ab[0], ab[1], normalize_by="average")
    fixed = pg.tm_align(ab[0], ab[1], normalize_by=(l1 + l2) / 2)
    assert avg.tm[0] == fixed.tm[0]
    assert min(base.tm_mobile[0], base.tm_target[0]) <= avg.tm[0] + 1e-3
    for bad in ("both", -3, True):
        with pytest.raises(InputError, match="normalize_by"):
            pg.tm_align(ab[0], ab[1], normalize_by=bad)


def test_device_gpu_without_a_gpu_is_one_line(ab):
    from protgpu._array import gpu_available

    if not gpu_available():  # (with a GPU, tests/align/test_tmalign_gpu.py runs it)
        with pytest.raises(GPUUnavailableError, match="device='gpu'") as err:
            pg.tm_align(ab[0], ab[1], device="gpu")
        assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="device"):
        pg.tm_align(ab[0], ab[1], device="tpu")


def _pdb(path: Path, chains) -> Path:
    """Write a PDB with the given chains: each (chain id, resname, [(atom name, xyz)] per residue)."""
    lines, serial = [], 1
    for cid, resname, residues in chains:
        for k, atoms in enumerate(residues, start=1):
            for name, xyz in atoms:
                rec = "HETATM" if resname == "HOH" else "ATOM  "
                el = name[0]
                lines.append(f"{rec}{serial:5d} {name:<4s} {resname:>3s} {cid}{k:4d}    "
                             f"{xyz[0]:8.3f}{xyz[1]:8.3f}{xyz[2]:8.3f}  1.00  0.00          {el:>2s}")
                serial += 1
    path.write_text("\n".join(lines) + "\nEND\n")
    return path


def _helix(n, shift=0.0):
    t = np.arange(n) * 100 / 180 * np.pi
    return np.stack([2.3 * np.cos(t), 2.3 * np.sin(t), 1.5 * np.arange(n) + shift], axis=1)


def test_too_short_is_one_line_naming_the_input(tmp_path, ab):
    short = _pdb(tmp_path / "short.pdb", [("A", "ALA", [[("CA", p)] for p in _helix(4)])])
    with pytest.raises(InputError, match=r"short\.pdb: 4 residues with a CA atom") as err:
        pg.tm_align(short, ab[1])
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match=r"target: 3 residues"):
        pg.tm_align(ab[0], _helix(3))
    with pytest.raises(InputError, match=r"mobile\[1\]: 2 residues"):
        pg.tm_align([_helix(10), _helix(2)], ab[1])
    with pytest.raises(InputError, match=r"NaN"):
        pg.tm_align(np.full((10, 3), np.nan), ab[1])


def test_non_protein_chain_skipped_and_missing_ca_counted(tmp_path):
    xyz = _helix(12)
    water = ("W", "HOH", [[("O", (30.0, 0.0, k))] for k in range(3)])
    residues = [[("N", p + 0.5), ("CA", p)] for p in xyz]
    residues[4] = [("N", xyz[4] + 0.5), ("C", xyz[4] + 0.3)]  # no CA: skipped, counted
    path = _pdb(tmp_path / "mixed.pdb", [water, ("A", "GLY", residues)])
    with pytest.warns(UserWarning, match=r"mixed\.pdb: chain 'W' skipped: no protein residue with a CA atom"):
        r = pg.tm_align(path, np.delete(xyz, 4, axis=0))
    assert r.n_skipped.tolist() == [[1, 0]] and r.lengths.tolist() == [[11, 11]]
    assert r.tm_target[0] == pytest.approx(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pg.tm_align(path, path, chain="A").tm_target[0] == pytest.approx(1.0)
    with pytest.raises(InputError, match=r"mixed\.pdb: no chain 'Z'"):
        pg.tm_align(path, path, chain="Z")
    with pytest.raises(InputError, match=r"chain 'W' has no protein residue"):
        pg.tm_align(path, path, chain="W")
