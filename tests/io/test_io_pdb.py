"""Tests of the fast PDB reader (protgpu.io.pdb and its byte helpers, protgpu.io._pdbscan) through load.

The module-level paths and helpers here are imported by the other tests of tests/io."""

from __future__ import annotations

import functools
import gzip
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protgpu.errors import InputError
from protgpu.io import load

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "datasets"
ADK = DATA / "adk_open.pdb"
ADK_CLOSED = DATA / "adk_closed.pdb"
ADK_DCD = DATA / "adk_dims.dcd"
SHARED = DATA  # the parity data shipped in datasets/ (datasets/PROVENANCE.md)


def shared(rel: str) -> Path:
    """A file of the parity data shipped in datasets/ (datasets/PROVENANCE.md)."""
    return SHARED / rel


def _mdtraj(path, **kw):
    import mdtraj

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dummy CRYST1 records
        return mdtraj.load(str(path), **kw)


@functools.cache
def _mdtraj_cached(path: Path):
    # mdtraj's PDB reader is slow (tens of ms to a second); several tests compare against one file
    return _mdtraj(path)


def _gemmi_model1(path):
    import gemmi

    st = gemmi.read_structure(str(path), merge_chain_parts=False)
    flat = gemmi.FlatStructure(st)
    flat.strings_as_numbers = False
    m = np.asarray(flat.model_num)
    first = m == m[0]
    names = np.char.strip(np.asarray(flat.atom_names).astype("U"))[first]
    resnames = np.char.strip(np.asarray(flat.residue_names).astype("U"))[first]
    chains = np.char.strip(np.asarray(flat.chain_ids).astype("U"))[first]
    return np.asarray(flat.pos)[first], names, resnames, np.asarray(flat.resnums)[first], chains


def _raises(path, pattern, **kw):
    """load(path) must raise one one-line InputError (a ValueError) matching ``pattern`` and naming the file."""
    with pytest.raises(InputError, match=pattern) as err:
        load(path, **kw)
    msg = str(err.value)
    assert Path(path).name in msg and "\n" not in msg, msg
    assert isinstance(err.value, ValueError)
    return msg


# ----------------------------------------------------------------------------------------------------
# PDB
# ----------------------------------------------------------------------------------------------------


def test_adk_open_matches_mdtraj():
    s = load(ADK)
    t = _mdtraj(ADK)
    assert (s.n_frames, s.n_atoms, s.n_residues) == (1, 3341, 214)
    assert s.coords.dtype == np.float32 and s.coords.flags.c_contiguous
    np.testing.assert_allclose(s.coords, t.xyz * 10, atol=1e-3)
    assert set(s.atoms.chain) == {""} and set(s.atoms.segid) == {"4AKE"}
    # the CRYST1 cell is read as mdtraj reads it, marked as a crystal cell (issue 16)
    np.testing.assert_allclose(s.box, t.unitcell_vectors * 10, rtol=1e-6)
    assert s.box_source == "crystal" and s.time is None
    assert s.source == str(ADK)
    # no element column in this CHARMM file: elements come from the names
    assert s.atoms.element[s.select_indices("name CA")].tolist() == ["C"] * 214
    assert set(s.atoms.element) == {"C", "H", "N", "O", "S"}
    assert s.atoms.hetero.sum() == 0 and s.atoms.resname[0] == "MET"


def test_path_and_str_agree():
    a, b = load(ADK), load(str(ADK))
    assert a.atoms == b.atoms and np.array_equal(a.coords, b.coords)


@pytest.mark.parametrize(
    "rel",
    [
        "openstructure/7W1F_B_target.pdb",
        "openstructure/1eud_ref.pdb",
        "openstructure/T1118v1LG035_1.pdb",
        "biopython/1A8O.pdb",
        "biopython/2BEG.pdb",
        "mdtraj/1am7_protein.pdb",
        "mdtraj/bpti.pdb",
        "usalign/PDB1.pdb",
    ],
)
def test_pdb_matches_gemmi_and_mdtraj(rel):
    path = shared(rel)
    s = load(path)
    pos, names, resnames, resids, chains = _gemmi_model1(path)
    np.testing.assert_allclose(s.coords[0], pos, atol=1e-3)
    np.testing.assert_array_equal(s.atoms.name, names)
    np.testing.assert_array_equal(s.atoms.resname, resnames)
    np.testing.assert_array_equal(s.atoms.resid, resids)
    np.testing.assert_array_equal(s.atoms.chain, chains)
    t = _mdtraj_cached(path)
    assert (s.n_atoms, s.n_residues) == (t.n_atoms, t.n_residues)
    np.testing.assert_allclose(s.coords, t.xyz * 10, atol=1e-3)
    el = np.array([a.element.symbol.upper() for a in t.topology.atoms])
    np.testing.assert_array_equal(s.atoms.element, el)


def test_1a8o_hetero_mse():
    s = load(shared("biopython/1A8O.pdb"))
    mse = s.atoms.resname == "MSE"
    assert mse.any() and s.atoms.hetero[mse].all()
    assert "SE" in set(s.atoms.element[mse])
    # MSE counts as protein: one CA per residue of the polymer
    t = _mdtraj(shared("biopython/1A8O.pdb"))
    assert s.select_indices("ca").size == t.topology.select("name CA and protein").size


@pytest.mark.parametrize(
    ("rel", "sel", "md"),
    [
        ("openstructure/7W1F_B_target.pdb", "ca", "name CA and protein"),
        ("openstructure/7W1F_B_target.pdb", "heavy", "not element H"),
        ("openstructure/7W1F_B_target.pdb", "backbone", "backbone"),
        ("mdtraj/2EQQ.pdb", "ca", "name CA and protein"),
        ("mdtraj/2EQQ.pdb", "heavy", "not element H"),
        ("mdtraj/2EQQ.pdb", "backbone", "backbone"),
        ("mdtraj/1vii.pdb", "heavy", "not element H"),
        ("openstructure/1eud_ref.pdb", "ca", "name CA and protein"),
        ("openstructure/1eud_ref.pdb", "water", "water"),
        ("openstructure/1eud_ref.pdb", "heavy", "not element H"),
    ],
)
def test_selections_match_mdtraj(rel, sel, md):
    path = shared(rel)
    s = load(path)
    np.testing.assert_array_equal(s.select_indices(sel), _mdtraj_cached(path).topology.select(md))


def test_multimodel_nmr_2eqq():
    path = shared("mdtraj/2EQQ.pdb")
    s = load(path)
    t = _mdtraj_cached(path)
    assert (s.n_frames, s.n_atoms, s.n_residues) == (20, 423, 28)
    np.testing.assert_allclose(s.coords, t.xyz * 10, atol=1e-3)
    m5 = load(path, model=5)
    assert m5.n_frames == 1
    np.testing.assert_array_equal(m5.coords[0], s.coords[4])
    np.testing.assert_array_equal(load(path, frames=slice(2, 5)).coords, s.coords[2:5])
    with pytest.raises(InputError, match=r"2EQQ\.pdb: no model 99 \(models in the file: 1, 2"):
        load(path, model=99)


def test_multimodel_frame0_matches_xtc():
    s = load(shared("mdtraj/frame0.pdb"))
    x = load(shared("mdtraj/frame0.xtc"), top=shared("mdtraj/native.pdb"))
    assert (s.n_frames, s.n_atoms) == (501, 22)
    assert s.atoms.resname.tolist() == x.atoms.resname.tolist()  # names differ (1HH3 vs H1), residues not
    np.testing.assert_allclose(s.coords, x.coords, atol=0.02)  # PDB 1e-3 A vs XTC 1e-3 nm


def test_gz(tmp_path):
    gz = tmp_path / "adk_open.pdb.gz"
    gz.write_bytes(gzip.compress(ADK.read_bytes()))
    a, b = load(gz), load(ADK)
    assert a.atoms == b.atoms and np.array_equal(a.coords, b.coords)
    cif = shared("biopython/1A8O.cif")
    gzc = tmp_path / "1A8O.cif.gz"
    gzc.write_bytes(gzip.compress(cif.read_bytes()))
    np.testing.assert_array_equal(load(gzc).coords, load(cif).coords)


def test_crlf_and_no_final_newline(tmp_path):
    text = ADK.read_bytes().rstrip(b"\n")
    p = tmp_path / "crlf.pdb"
    p.write_bytes(text.replace(b"\n", b"\r\n"))
    a, b = load(p), load(ADK)
    assert a.atoms == b.atoms and np.array_equal(a.coords, b.coords)


def _same(a, b):
    assert a.atoms == b.atoms
    np.testing.assert_array_equal(a.coords.view(np.uint32), b.coords.view(np.uint32))


@pytest.mark.parametrize("layout", ["padded", "ter", "anisou", "remarks", "ragged", "few_short"])
def test_line_layouts_give_the_same_structure(tmp_path, layout):
    # The reader copies atom lines into a fixed-width matrix in different ways depending on how
    # they sit in the file (one run of equal lines, runs between TER records, a constant stride
    # with ANISOU lines between, lines of different lengths, many blocks): all must agree.
    lines = ADK.read_text().splitlines()
    out = []
    for k, ln in enumerate(lines):
        is_atom = ln.startswith(("ATOM", "HETATM"))
        if layout == "padded":
            ln = ln.ljust(80)
        elif layout == "ter" and is_atom and k % 200 == 0:
            out.append("TER")
        elif layout == "remarks" and is_atom and k % 20 == 0:
            out.append("REMARK " + "x" * (k % 37))
        elif layout == "ragged" and is_atom:
            ln = ln.ljust(76 + k % 7)
        elif layout == "few_short" and is_atom and k % 300:
            ln = ln.ljust(80)
        out.append(ln)
        if layout == "anisou" and is_atom:
            out.append("ANISOU" + ln[6:])
    p = tmp_path / f"{layout}.pdb"
    p.write_text("\n".join(out) + "\n")
    _same(load(p), load(ADK))


def test_blocked_scans_and_coordinate_passes(tmp_path, monkeypatch):
    import protgpu.io._pdbscan as pscan

    reference = load(ADK)
    # tiny newline-scan blocks and coordinate passes exercise the block loops on a small file
    monkeypatch.setattr(pscan, "SCAN_BLOCK", 1000)
    monkeypatch.setattr(pscan, "COORD_CHUNK", 7)
    _same(load(ADK), reference)
    lines = ADK.read_text().splitlines()
    lines[3000] = lines[3000][:38] + "  12.x45" + lines[3000][46:]
    p = tmp_path / "late.pdb"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"late\.pdb: line 3001: bad coordinate '12.x45'"):
        load(p)


def test_negative_zero_and_extreme_coordinates(tmp_path):
    lines = [
        "ATOM      1  CA  ALA A   1    9999.999-999.999  -0.000  1.00 10.00           C",
        "ATOM      2  CA  ALA A   2       0.000   0.001  -0.001  1.00 10.00           C",
    ]
    p = tmp_path / "edge.pdb"
    p.write_text("\n".join(lines) + "\n")
    expected = np.array([[9999.999, -999.999, -0.0], [0.0, 0.001, -0.001]], dtype=np.float32)
    np.testing.assert_array_equal(load(p).coords[0].view(np.uint32), expected.view(np.uint32))


def _load_general(monkeypatch, path, **kw):
    """load() with the one-run fast layout (_atom_block) turned off: every file takes the general reader."""
    import protgpu.io.pdb as ppdb

    with monkeypatch.context() as m:
        m.setattr(ppdb, "atom_block", lambda data: None)
        return load(path, **kw)


def _outcome(fn):
    try:
        s = fn()
    except InputError as exc:
        return str(exc)
    return s.atoms, s.coords.view(np.uint32).tobytes(), s.coords.shape


_ONE_RUN_VARIANTS = {
    # name: (text of adk_open.pdb's lines -> lines, load keyword sets to try)
    "as_is": lambda ls: ls,
    "atoms_only_no_trailer": lambda ls: [x for x in ls if x.startswith("ATOM")],
    "cut_73_no_trailer": lambda ls: [x[:73] for x in ls if x.startswith("ATOM")],  # field views read past the end
    "model_in_header": lambda ls: ["MODEL        7"] + ls + ["ENDMDL"],
    "model_after_atoms": lambda ls: ls + ["MODEL        3"],
    "endmdl_in_header": lambda ls: ["ENDMDL"] + ls,
    "hetatm_first": lambda ls: _retag(ls, ls.index(_first_atom(ls)), "HETATM"),
    "hetatm_in_header": lambda ls: ls[:3] + [_first_atom(ls).replace("ATOM  ", "HETATM", 1)] + ls[3:],
    "hetatm_after_end": lambda ls: ls + [_first_atom(ls).replace("ATOM  ", "HETATM", 1)],
    "words_in_header": lambda ls: ["REMARK  xMODEL xENDMDL xHETATM", "REMARK 210 MODELS"] + ls,
    "one_atom": lambda ls: [_first_atom(ls)],
    "record_like_line_inside": lambda ls: ls[:10] + ["ATOMS"] + ls[10:],
    "short_line_inside": lambda ls: ls[:10] + [ls[10][:60]] + ls[11:],
    "two_lines_in_one_row": lambda ls: ls[:10] + [ls[10][:71], ls[11][:4]] + ls[12:],
    # several runs: copied next to each other, unless a MODEL/ENDMDL or too many records lie between
    "ter_between_chains": lambda ls: ls[:900] + ["TER    1000      GLY   899"] + ls[900:2000] + ["TER"] + ls[2000:],
    "ter_padded_to_the_line_length": lambda ls: ls[:900] + ["TER".ljust(76)] + ls[900:],
    "remark_between_runs": lambda ls: ls[:900] + ["REMARK  between"] + ls[900:],
    "model_between_runs": lambda ls: ls[:900] + ["MODEL        2"] + ls[900:],
    "endmdl_between_runs": lambda ls: ls[:900] + ["ENDMDL"] + ls[900:],
    "ter_then_other_length": lambda ls: ls[:900] + ["TER"] + [x[:70] for x in ls[900:]],
    "many_ters": lambda ls: [y for k, x in enumerate(ls) for y in ([x, "TER"] if k % 40 == 39 else [x])],
    # the header's end is found by one search for the first ATOM/HETA/MODE/ENDM line
    "endmdl_after_header_lines": lambda ls: ls[:3] + ["ENDMDL"] + ls[3:],
    "model_after_header_lines": lambda ls: ls[:3] + ["MODEL        4"] + ls[3:] + ["ENDMDL"],
    "record_words_mid_line": lambda ls: ["HEADER    ATOM HETATM MODEL ENDMDL"] + ls,
    # blank columns are recognised by one bytes comparison; anything else is decoded
    "segid_one_for_all": lambda ls: [x[:72] + "PROT" + x[76:] if x.startswith("ATOM") else x for x in ls],
    "segid_on_some": lambda ls: [x[:72] + "S" + str(k % 3) + x[74:] if x.startswith("ATOM") else x
                                 for k, x in enumerate(ls)],
    "altloc_on_one": lambda ls: ls[:30] + [ls[30][:16] + "A" + ls[30][17:]] + ls[31:],
    "icode_on_one": lambda ls: ls[:30] + [ls[30][:26] + "B" + ls[30][27:]] + ls[31:],
}


def _first_atom(lines):
    return next(x for x in lines if x.startswith("ATOM"))


def _retag(lines, k, record):
    lines = list(lines)
    lines[k] = record + lines[k][6:]
    return lines


@pytest.mark.parametrize("variant", sorted(_ONE_RUN_VARIANTS))
def test_one_run_layout_equals_general_reader(tmp_path, monkeypatch, variant):
    # The usual file (one run of equal-length atom lines, no MODEL before them) is read in place
    # after a few byte searches; any doubt sends it to the general reader. Both must agree exactly,
    # errors and model numbers included.
    lines = _ONE_RUN_VARIANTS[variant](ADK.read_text().splitlines())
    p = tmp_path / f"{variant}.pdb"
    p.write_text("\n".join(lines) + "\n")
    for kw in ({}, {"model": 1}, {"model": 3}, {"model": 7}, {"altloc": "occupancy"}):
        assert _outcome(lambda kw=kw: load(p, **kw)) == _outcome(lambda kw=kw: _load_general(monkeypatch, p, **kw))


@pytest.mark.parametrize(("bad_line", "columns", "text", "message"), [
    (5, (30, 38), "  12.xyz", "bad coordinate '12.xyz'"),
    (1500, (30, 38), "  12.xyz", "bad coordinate '12.xyz'"),
    (2800, (22, 26), " 1x ", "bad residue number ' 1x '"),
])
def test_error_line_numbers_across_runs(tmp_path, bad_line, columns, text, message):
    # rows copied from several runs (between TER records) still report their own file line
    lines = ADK.read_text().splitlines()
    lines = lines[:900] + ["TER"] + lines[900:2000] + ["TER    1000      GLY   899"] + lines[2000:]
    a, b = columns
    lines[bad_line - 1] = lines[bad_line - 1][:a] + text + lines[bad_line - 1][b:]
    p = tmp_path / "runs.pdb"
    p.write_text("\n".join(lines) + "\n")
    _raises(p, rf"runs\.pdb: line {bad_line}: {message}")


def test_memo_of_decoded_fields(tmp_path, monkeypatch):
    # Names, residue names, guessed elements and residue numbers come from what earlier loads
    # decoded; a cold memo, a full one (no room to add) and a warm one give the same tables.
    import protgpu.io._pdbscan as pscan

    reference = load(ADK)
    renamed = tmp_path / "renamed.pdb"
    renamed.write_text(ADK.read_text().replace("CA   MET", "QQ   XYZ").replace("MET     1", "MET  A000"))
    other = load(renamed)
    assert other.atoms.name[4] == "QQ" and other.atoms.resname[4] == "XYZ" and other.atoms.resid[0] == 10000
    for memo in (pscan.KeyMemo, lambda *d: pscan.KeyMemo(*d, limit=0)):
        monkeypatch.setattr(pscan, "ATOM_MEMO", memo(np.uint64, "<U4", "<U4"))
        monkeypatch.setattr(pscan, "GUESS_MEMO", memo(np.uint64, "<U2"))
        monkeypatch.setattr(pscan, "RESID_MEMO", memo(np.uint32, np.int32))
        for _ in range(2):
            assert load(ADK).atoms == reference.atoms
            assert load(renamed).atoms == other.atoms
    assert pscan.ATOM_MEMO.state[0].size == 0  # limit=0: nothing kept
    monkeypatch.undo()
    load(ADK)
    pscan.clear_memos()
    assert pscan.RESID_MEMO.state[0].size == 0 and load(ADK).atoms == reference.atoms


def test_key_memo():
    from protgpu.io._pdbscan import KeyMemo

    memo = KeyMemo(np.uint32, np.int32)
    assert memo.find(np.array([5], np.uint32)) is None
    memo.add(np.array([7, 5, 7], np.uint32), np.array([70, 50, 71], np.int32))  # repeats: first value kept
    at, (known, values) = memo.find(np.array([5, 7, 7], np.uint32))
    assert values[at].tolist() == [50, 70, 70]
    memo.add(np.array([5, 9], np.uint32), np.array([-1, 90], np.int32))  # known keys keep their value
    at, (known, values) = memo.find(np.array([9, 5], np.uint32))
    assert values[at].tolist() == [90, 50]
    assert memo.find(np.array([6], np.uint32)) is None and memo.find(np.array([10], np.uint32)) is None
    memo.clear()
    assert memo.find(np.array([5], np.uint32)) is None and memo.state[1].dtype == np.int32
    memo.add(np.array([2, 4], np.uint32), np.array([20, 40], np.int64), unique=True)  # np.unique output
    at, (known, values) = memo.find(np.array([4, 2], np.uint32))
    assert values[at].tolist() == [40, 20] and values.dtype == np.int32


@pytest.mark.parametrize(
    ("field", "value"),
    [("   1.177", 1.177), ("    .123", 0.123), ("  +1.125", 1.125), ("  1.2500", 1.25), ("-100.500", -100.5)],
)
def test_coordinate_fields_off_the_standard_form(tmp_path, field, value):
    # not "%8.3f" (or with a sign): NumPy's string-to-float conversion decodes them
    p = tmp_path / "form.pdb"
    p.write_text(f"ATOM      1  CA  ALA A   1    {field}   2.000   3.000  1.00 10.00           C\n")
    np.testing.assert_array_equal(load(p).coords[0, 0], np.array([value, 2.0, 3.0], np.float32))


@pytest.mark.parametrize("field", ["1 10.862", "8-1.009", "--.044 ", "  1.2.3 ", "  12,345"])
def test_coordinate_garbage_is_an_error(tmp_path, field):
    # digits, blanks and minus signs in the wrong places are not a number (float() says so)
    p = tmp_path / "garbage.pdb"
    p.write_text(
        "ATOM      1  N   ALA A   1       1.000   2.000   3.000  1.00 10.00           N\n"
        f"ATOM      2  CA  ALA A   1    {field}   2.000   3.000  1.00 10.00           C\n"
    )
    _raises(p, rf"garbage\.pdb: line 2: bad coordinate '{field.strip()}'")


def test_float32_division_rounds_like_float64():
    # The coordinate reader divides the value in thousandths by 1000 in float32; that equals
    # float(text) rounded to float32 (float64 division, then rounding) for every value a "%8.3f"
    # field can hold (0..9999999 thousandths; negatives are the same with the sign bit set).
    for start in range(0, 10_000_000, 2_000_000):
        v = np.arange(start, start + 2_000_000, dtype=np.int32)
        a = v.astype(np.float32) / np.float32(1000.0)
        b = (v / 1000.0).astype(np.float32)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(-999_999, 9_999_999).map(lambda t: f"{t / 1000:8.3f}"),
            st.text(alphabet=" -.+0123456789e", min_size=8, max_size=8),
        ),
        min_size=3,
        max_size=30,
    ).filter(lambda f: len(f) % 3 == 0)
)
def test_coordinate_fields_equal_float(fields):
    from protgpu.io._pdbscan import parse_coord_fields

    m = len(fields) // 3
    text = np.frombuffer("".join(fields).encode(), dtype="V24")
    out = np.empty((m, 3), dtype=np.float32)
    # plain decimal numbers below 1e5 A (issue 21: "1e30", "1_000", "99999999" are refused)
    try:
        values = np.array([float(f) for f in fields], dtype=np.float64)
        ok = all(set(f) <= set("0123456789.-+ ") for f in fields) and bool((np.abs(values) < 1e5).all())
    except ValueError:
        ok = False
    if not ok:
        with pytest.raises(InputError, match="coordinate"):
            parse_coord_fields(text, out, 0, lambda i: i + 1, "x.pdb")
        return
    expected = values.astype(np.float32)
    parse_coord_fields(text, out, 0, lambda i: i + 1, "x.pdb")
    np.testing.assert_array_equal(out.ravel().view(np.uint32), expected.view(np.uint32))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), max_size=40))
def test_all_any_match_numpy(values):
    from protgpu.io._pdbscan import all_true, any_true

    mask = np.array(values, dtype=bool)
    for m in (mask, mask[::2], mask[::-1]):
        assert all_true(m) == bool(m.all()) and any_true(m) == bool(m.any())


def test_read_bytes_in_pieces(tmp_path, monkeypatch):
    # One os.read of the size fstat gives is the usual read; a short read (a huge file, some file
    # systems), a file that grew meanwhile or one whose size is not known reads on to the end.
    import importlib

    pload = importlib.import_module("protgpu.io.load")  # (protgpu.io.load, the attribute, is the function)

    whole = ADK.read_bytes()
    expected = _outcome(lambda: load(ADK))
    real_read, real_fstat = os.read, os.fstat
    for cap, size_delta in ((1000, 0), (1 << 30, -len(whole)), (1 << 30, -10), (777, -len(whole))):
        with monkeypatch.context() as m:
            m.setattr(pload.os, "read", lambda fd, n, cap=cap: real_read(fd, min(n, cap)))
            m.setattr(pload.os, "fstat", lambda fd, d=size_delta: os.stat_result(
                tuple(real_fstat(fd))[:6] + (real_fstat(fd).st_size + d,) + tuple(real_fstat(fd))[7:]
            ))
            assert pload.read_bytes(str(ADK), False) == whole
            assert _outcome(lambda: load(ADK)) == expected


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_load_from_named_pipe_refused(tmp_path):
    # (issue 21: a pipe with no writer blocked the load forever; only regular files are read)
    fifo = tmp_path / "pipe.pdb"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="pipe.pdb: not a regular file"):
        load(str(fifo))


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="ab./gzpdbGZ", min_size=1, max_size=14))
def test_path_helpers_match_pathlib(text):
    from protgpu.io.formats import split_ext
    from protgpu.io.load import path_name

    assert path_name(text) == str(Path(text))
    suffixes = [s.lower() for s in Path(text).suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    if gz:
        suffixes = suffixes[:-1]
    assert split_ext(Path(text)) == split_ext(str(Path(text))) == ((suffixes[-1] if suffixes else ""), gz)


def _atom_line(serial, name, resname, chain, resid, xyz, element="", altloc=" ", occ=1.0, icode=" ", het=False):
    rec = "HETATM" if het else "ATOM  "
    padded = f" {name:<3s}" if len(name) < 4 and len(element) < 2 else f"{name:<4s}"
    return (
        f"{rec}{serial:5d} {padded}{altloc}{resname:>3s} {chain}{resid:>4}{icode}   "
        f"{xyz[0]:8.3f}{xyz[1]:8.3f}{xyz[2]:8.3f}{occ:6.2f}{10.0:6.2f}          {element:>2s}  "
    )


def test_element_guess_and_hetero_without_element_column(tmp_path):
    lines = [
        _atom_line(1, "N", "GLY", "A", 1, (0, 0, 0)),
        _atom_line(2, "CA", "GLY", "A", 1, (1, 0, 0)),
        "ATOM      3  HA2 GLY A   1       2.000   0.000   0.000  1.00 10.00",
        "HETATM    4 ZN    ZN A 101       3.000   0.000   0.000  1.00 10.00",
        "HETATM    5 CA    CA A 102       4.000   0.000   0.000  1.00 10.00",
        "HETATM    6  O   HOH A 201       5.000   0.000   0.000  1.00 10.00",
    ]
    p = tmp_path / "ions.pdb"
    p.write_text("\n".join(lines) + "\nEND\n")
    s = load(p)
    assert s.atoms.element.tolist() == ["N", "C", "H", "ZN", "CA", "O"]
    assert s.atoms.hetero.tolist() == [False, False, False, True, True, True]
    assert s.select_indices("ca").tolist() == [1]
    assert s.select_indices("water").tolist() == [5]
    assert s.n_residues == 4


def test_hybrid36_and_insertion_codes(tmp_path):
    lines = [
        _atom_line(1, "CA", "ALA", "A", 9999, (0, 0, 0), "C"),
        _atom_line(2, "CA", "ALA", "A", "A000", (1, 0, 0), "C"),
        _atom_line(3, "CA", "GLY", "A", "A000", (2, 0, 0), "C", icode="B"),
        _atom_line(4, "CA", "GLY", "B", -3, (3, 0, 0), "C"),
    ]
    p = tmp_path / "h36.pdb"
    p.write_text("\n".join(lines) + "\n")
    s = load(p)
    assert s.atoms.resid.tolist() == [9999, 10000, 10000, -3]
    assert s.atoms.icode.tolist() == ["", "", "B", ""]
    assert s.atoms.chain.tolist() == ["A", "A", "A", "B"]
    assert s.residues.labels() == ["A:ALA9999", "A:ALA10000", "A:GLY10000B", "B:GLY-3"]


def _altloc_file(tmp_path) -> tuple[Path, np.ndarray, np.ndarray]:
    """7-atom file where residue 2 has altlocs A (occ 0.4) and B (occ 0.6, shifted 1 A in x)."""
    lines, a_xyz, b_xyz = [], [], []
    serial = 1
    for resid, resname in ((1, "GLY"), (2, "SER"), (3, "GLY")):
        for k, name in enumerate(("N", "CA", "C")):
            base = (resid * 3.0, k * 1.5, 0.5)
            el = name[0]
            if resid == 2 and name != "N":
                lines.append(_atom_line(serial, name, resname, "A", resid, base, el, altloc="A", occ=0.4))
                shifted = (base[0] + 1.0, base[1], base[2])
                lines.append(_atom_line(serial + 1, name, resname, "A", resid, shifted, el, altloc="B", occ=0.6))
                a_xyz.append(base)
                b_xyz.append(shifted)
                serial += 2
            else:
                lines.append(_atom_line(serial, name, resname, "A", resid, base, el))
                a_xyz.append(base)
                b_xyz.append(base)
                serial += 1
    p = tmp_path / "alt.pdb"
    p.write_text("\n".join(lines) + "\nEND\n")
    return p, np.array(a_xyz, np.float32), np.array(b_xyz, np.float32)


def test_altloc_first_and_occupancy(tmp_path):
    p, a_xyz, b_xyz = _altloc_file(tmp_path)
    first = load(p)
    assert first.n_atoms == 9 and first.n_residues == 3
    np.testing.assert_allclose(first.coords[0], a_xyz)
    best = load(p, altloc="occupancy")
    np.testing.assert_allclose(best.coords[0], b_xyz)
    assert best.atoms == first.atoms
    # anchors: gemmi keeps the first conformer, Biopython the most occupied
    import gemmi
    from Bio.PDB import PDBParser

    st = gemmi.read_structure(str(p))
    st.remove_alternative_conformations()
    np.testing.assert_allclose(first.coords[0], np.array([cra.atom.pos.tolist() for cra in st[0].all()]), atol=1e-3)
    bio = PDBParser(QUIET=True).get_structure("x", str(p))
    np.testing.assert_allclose(best.coords[0], np.array([a.coord for a in bio.get_atoms()]), atol=1e-3)
    with pytest.raises(InputError, match="altloc"):
        load(p, altloc="last")


def test_nonstandard_coordinate_format_falls_back(tmp_path):
    # four decimals instead of three: not the fast fixed-point form
    lines = [
        "ATOM      1  CA  ALA A   1      1.2345 -2.5000  3.0000  1.00 10.00           C",
        "ATOM      2  CA  ALA A   2     -1.5000  2.2500 -3.1250  1.00 10.00           C",
    ]
    p = tmp_path / "fmt.pdb"
    p.write_text("\n".join(lines) + "\n")
    np.testing.assert_allclose(load(p).coords[0], [[1.2345, -2.5, 3.0], [-1.5, 2.25, -3.125]], atol=1e-6)


def test_pdb_with_mmcif_content(tmp_path):
    p = tmp_path / "actually_cif.pdb"
    p.write_bytes(shared("mdtraj/8ddg.cif").read_bytes())
    assert load(p).n_atoms == 64


# ----------------------------------------------------------------------------------------------------
# mmCIF
# ----------------------------------------------------------------------------------------------------



@settings(max_examples=200, deadline=None)
@given(
    width=st.sampled_from([1, 2, 4]),
    rows=st.lists(st.text(alphabet=" \x00ABCxyz019'-*", min_size=4, max_size=4), min_size=1, max_size=20),
)
def test_vectorised_column_decoding_equals_str_strip(width, rows):
    from protgpu.io._pdbscan import UINT, strip_keys, widen

    rows = [r[:width] for r in rows]
    keys = np.frombuffer("".join(rows).encode("latin-1"), dtype=UINT[width])
    assert strip_keys(keys, width).tolist() == [r.strip(" \x00") for r in rows]
    # as written; a '<U' string drops trailing NULs
    assert widen(keys, width).tolist() == [r.rstrip("\x00") for r in rows]


def test_element_column_table():
    from protgpu.io._pdbscan import element_table

    table, valid = element_table()

    def look(text):
        key = int.from_bytes(text.encode("latin-1"), "little")
        return str(table[key]) if valid[key] else None

    assert [look(t) for t in (" C", "C ", "FE", "Fe", "se", " n", "  ", "1H", "C1", "\x00O")] == [
        "C", "C", "FE", "FE", "SE", "N", None, None, None, "O"
    ]


# ----------------------------------------------------------------------------------------------------
# Bad input: one-line InputError naming the file
# ----------------------------------------------------------------------------------------------------
