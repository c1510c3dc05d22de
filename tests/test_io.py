"""Tests of protgpu.io: loading PDB/mmCIF/trajectories/objects, bad inputs, atomic writes."""

from __future__ import annotations

import functools
import gzip
import os
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protgpu.errors import InputError
from protgpu.io import load, save_array, write_atomic
from protgpu.structure import Structure

REPO = Path(__file__).resolve().parents[1]
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
    assert s.box is None and s.time is None
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
    import protgpu.io as pio

    reference = load(ADK)
    # tiny newline-scan blocks and coordinate passes exercise the block loops on a small file
    monkeypatch.setattr(pio, "_SCAN_BLOCK", 1000)
    monkeypatch.setattr(pio, "_COORD_CHUNK", 7)
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
    import protgpu.io as pio

    with monkeypatch.context() as m:
        m.setattr(pio, "_atom_block", lambda data: None)
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
    import protgpu.io as pio

    reference = load(ADK)
    renamed = tmp_path / "renamed.pdb"
    renamed.write_text(ADK.read_text().replace("CA   MET", "QQ   XYZ").replace("MET     1", "MET  A000"))
    other = load(renamed)
    assert other.atoms.name[4] == "QQ" and other.atoms.resname[4] == "XYZ" and other.atoms.resid[0] == 10000
    for memo in (pio._KeyMemo, lambda *d: pio._KeyMemo(*d, limit=0)):
        monkeypatch.setattr(pio, "_ATOM_MEMO", memo(np.uint64, "<U4", "<U4"))
        monkeypatch.setattr(pio, "_GUESS_MEMO", memo(np.uint64, "<U2"))
        monkeypatch.setattr(pio, "_RESID_MEMO", memo(np.uint32, np.int32))
        for _ in range(2):
            assert load(ADK).atoms == reference.atoms
            assert load(renamed).atoms == other.atoms
    assert pio._ATOM_MEMO.state[0].size == 0  # limit=0: nothing kept
    monkeypatch.undo()
    load(ADK)
    pio._clear_memos()
    assert pio._RESID_MEMO.state[0].size == 0 and load(ADK).atoms == reference.atoms


def test_key_memo():
    from protgpu.io import _KeyMemo

    memo = _KeyMemo(np.uint32, np.int32)
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
    from protgpu.io import _parse_coord_fields

    m = len(fields) // 3
    text = np.frombuffer("".join(fields).encode(), dtype="V24")
    out = np.empty((m, 3), dtype=np.float32)
    try:
        expected = np.array([float(f) for f in fields], dtype=np.float64).astype(np.float32)
    except ValueError:
        with pytest.raises(InputError, match="bad coordinate"):
            _parse_coord_fields(text, out, 0, lambda i: i + 1, "x.pdb")
        return
    _parse_coord_fields(text, out, 0, lambda i: i + 1, "x.pdb")
    np.testing.assert_array_equal(out.ravel().view(np.uint32), expected.view(np.uint32))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), max_size=40))
def test_all_any_match_numpy(values):
    from protgpu.io import _all, _any

    mask = np.array(values, dtype=bool)
    for m in (mask, mask[::2], mask[::-1]):
        assert _all(m) == bool(m.all()) and _any(m) == bool(m.any())


def test_read_bytes_in_pieces(tmp_path, monkeypatch):
    # One os.read of the size fstat gives is the usual read; a short read (a huge file, some file
    # systems), a file that grew meanwhile or one whose size is not known reads on to the end.
    import protgpu.io as pio

    whole = ADK.read_bytes()
    expected = _outcome(lambda: load(ADK))
    real_read, real_fstat = os.read, os.fstat
    for cap, size_delta in ((1000, 0), (1 << 30, -len(whole)), (1 << 30, -10), (777, -len(whole))):
        with monkeypatch.context() as m:
            m.setattr(pio.os, "read", lambda fd, n, cap=cap: real_read(fd, min(n, cap)))
            m.setattr(pio.os, "fstat", lambda fd, d=size_delta: os.stat_result(
                tuple(real_fstat(fd))[:6] + (real_fstat(fd).st_size + d,) + tuple(real_fstat(fd))[7:]
            ))
            assert pio._read_bytes(str(ADK), False) == whole
            assert _outcome(lambda: load(ADK)) == expected


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_load_from_named_pipe(tmp_path):
    import threading

    fifo = tmp_path / "pipe.pdb"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(ADK.read_bytes()))
    writer.start()
    try:
        s = load(str(fifo))
    finally:
        writer.join()
    assert _outcome(lambda: s) == _outcome(lambda: load(ADK))


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="ab./gzpdbGZ", min_size=1, max_size=14))
def test_path_helpers_match_pathlib(text):
    from protgpu.io import _path_name, _split_ext

    assert _path_name(text) == str(Path(text))
    suffixes = [s.lower() for s in Path(text).suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    if gz:
        suffixes = suffixes[:-1]
    assert _split_ext(Path(text)) == _split_ext(str(Path(text))) == ((suffixes[-1] if suffixes else ""), gz)


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


@settings(max_examples=200, deadline=None)
@given(
    width=st.sampled_from([1, 2, 4]),
    rows=st.lists(st.text(alphabet=" \x00ABCxyz019'-*", min_size=4, max_size=4), min_size=1, max_size=20),
)
def test_vectorised_column_decoding_equals_str_strip(width, rows):
    from protgpu.io import _UINT, _strip_keys, _widen

    rows = [r[:width] for r in rows]
    keys = np.frombuffer("".join(rows).encode("latin-1"), dtype=_UINT[width])
    assert _strip_keys(keys, width).tolist() == [r.strip(" \x00") for r in rows]
    # as written; a '<U' string drops trailing NULs
    assert _widen(keys, width).tolist() == [r.rstrip("\x00") for r in rows]


def test_element_column_table():
    from protgpu.io import _element_table

    table, valid = _element_table()

    def look(text):
        key = int.from_bytes(text.encode("latin-1"), "little")
        return str(table[key]) if valid[key] else None

    assert [look(t) for t in (" C", "C ", "FE", "Fe", "se", " n", "  ", "1H", "C1", "\x00O")] == [
        "C", "C", "FE", "FE", "SE", "N", None, None, None, "O"
    ]


# ----------------------------------------------------------------------------------------------------
# Bad input: one-line InputError naming the file
# ----------------------------------------------------------------------------------------------------


def _raises(path, pattern, **kw):
    with pytest.raises(InputError, match=pattern) as err:
        load(path, **kw)
    msg = str(err.value)
    assert Path(path).name in msg and "\n" not in msg, msg
    assert isinstance(err.value, ValueError)
    return msg


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
    _raises(z, "not a valid gzip")


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
    _raises(p, r"nan\.pdb: non-finite coordinate .* frame 0, atom 3")


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


def test_import_is_light():
    import subprocess
    import sys

    code = "import protgpu.io, protgpu.structure, sys; print(any(m in sys.modules for m in ('mdtraj', 'Bio', 'gemmi')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


def test_load_returns_structure_type():
    assert isinstance(load(ADK), Structure)
