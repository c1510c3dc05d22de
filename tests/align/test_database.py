"""The .pgdb structure database: round trip (coordinates, sequences, secondary structure, names,
lengths), one memory map, atomic writing, and one-line errors naming the file for bad files."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protgpu.align import database
from protgpu.align._dp import secondary_structure
from protgpu.align.chains import Chain
from protgpu.errors import InputError

FILES = ("d1t3ba2.pdb", "d2nwta1.pdb", "1e79h.pdb")


@pytest.fixture(scope="module")
def chains(datasets):
    return [database.read_chain(datasets / "tmalign" / f) for f in FILES]


@pytest.fixture
def db_path(tmp_path, chains):
    return database.write(tmp_path / "db.pgdb", chains)


def test_round_trip(db_path, chains):
    db = database.load(db_path)
    assert len(db) == len(chains)
    assert db.names == [f"{f}:{c.name.rsplit(':', 1)[1]}" for f, c in zip(FILES, chains, strict=True)]
    np.testing.assert_array_equal(db.lengths, [len(c.ca) for c in chains])
    for k, c in enumerate(db.chains()):
        # protgpu reads coordinates as float32: the float32 store is exact
        np.testing.assert_array_equal(c.ca, chains[k].ca)
        assert c.ca.dtype == np.float64 and c.sequence == chains[k].sequence and c.n_skipped == chains[k].n_skipped
        a, b = db.offsets[k], db.offsets[k + 1]
        assert bytes(db.secondary[a:b]).decode() == secondary_structure(chains[k].ca)
    assert [c.name for c in db.chains(1, 3)] == db.names[1:3]
    assert isinstance(db.coords.base, np.memmap) or isinstance(db.coords, np.memmap)
    assert db.coords.dtype == np.float32 and not db.coords.flags.writeable


def test_arrays_are_aligned_and_header_is_json(db_path):
    raw = db_path.read_bytes()
    assert raw[:8] == database.MAGIC
    (h,) = struct.unpack("<Q", raw[8:16])
    head = json.loads(raw[16:16 + h])
    assert head["version"] == 1 and head["n_chains"] == len(FILES)
    assert all(spec["offset"] % 64 == 0 and spec["offset"] >= 16 + h for spec in head["arrays"].values())


def test_read_chain_names_file_and_chain(datasets):
    c = database.read_chain(datasets / "tmalign" / "1e79h.pdb")
    assert c.name.startswith("1e79h.pdb:") and len(c.name.split(":")[1]) == 1


def _corrupt(path, raw):
    path.write_bytes(raw)
    return path


@pytest.mark.parametrize("mangle, words", [
    (lambda raw: b"", "wrong magic"),
    (lambda raw: b"PK\x03\x04" + raw[4:], "wrong magic"),
    (lambda raw: b"PGTMDB2\n" + raw[8:], "format version 2"),
    (lambda raw: raw[:len(raw) // 2], "truncated"),
    (lambda raw: raw[:20], "truncated header"),
    (lambda raw: raw[:16] + b"x" + raw[17:], "unreadable header"),
])
def test_bad_files_are_one_line_naming_the_file(tmp_path, db_path, mangle, words):
    bad = _corrupt(tmp_path / "bad.pgdb", mangle(db_path.read_bytes()))
    with pytest.raises(InputError) as e:
        database.load(bad)
    msg = str(e.value)
    assert str(bad) in msg and words in msg and "\n" not in msg


def test_inconsistent_offsets_are_caught(tmp_path, db_path):
    raw = bytearray(db_path.read_bytes())
    (h,) = struct.unpack("<Q", raw[8:16])
    off = json.loads(raw[16:16 + h])["arrays"]["offsets"]["offset"]
    raw[off + 8:off + 16] = struct.pack("<q", 10**6)  # chain 0 ends past the residues
    with pytest.raises(InputError, match="offsets are inconsistent"):
        database.load(_corrupt(tmp_path / "bad.pgdb", bytes(raw)))


def test_missing_file_and_empty_database(tmp_path):
    with pytest.raises(InputError, match="no such database file"):
        database.load(tmp_path / "nope.pgdb")
    with pytest.raises(InputError, match="at least one chain"):
        database.write(tmp_path / "e.pgdb", [])
    assert not (tmp_path / "e.pgdb").exists()


def test_write_is_atomic(tmp_path, db_path, chains, monkeypatch):
    before = db_path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(database, "_write_file", boom)
    with pytest.raises(Exception):  # noqa: B017 - whatever the writer wraps it in
        database.write(db_path, chains[:1])
    assert db_path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.pgdb"]


def test_array_traces_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    cs = [Chain(np.round(rng.normal(size=(n, 3)) * 10, 3).astype(np.float32).astype(np.float64), "A" * n,
                f"c{n}", 0) for n in (5, 9)]
    db = database.load(database.write(tmp_path / "a.pgdb", cs))
    assert db.names == ["c5", "c9"] and [len(c.ca) for c in db.chains()] == [5, 9]
    np.testing.assert_array_equal(db.chains()[1].ca, cs[1].ca)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(5, 40), min_size=1, max_size=6),
       names=st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=12), min_size=6, max_size=6),
       seed=st.integers(0, 2**16))
def test_round_trip_any_chains(tmp_path, lengths, names, seed):
    rng = np.random.default_rng(seed)
    cs = [Chain((rng.normal(size=(n, 3)) * 50).astype(np.float32).astype(np.float64),
                "".join(rng.choice(list("ACDEFGHIKLMNPQRSTVWYX"), size=n)), names[k], int(rng.integers(0, 3)))
          for k, n in enumerate(lengths)]
    db = database.load(database.write(tmp_path / "h.pgdb", cs))
    assert db.names == [c.name for c in cs]
    for a, b in zip(db.chains(), cs, strict=True):
        np.testing.assert_array_equal(a.ca, b.ca)
        assert (a.sequence, a.n_skipped) == (b.sequence, b.n_skipped)


def test_search_refuses_bad_top_and_min_tm(tmp_path, chains):
    db = database.load(database.write(tmp_path / "s.pgdb", chains[:2]))
    for kwargs, words in (({"top": 0}, "top must be a positive integer"), ({"min_tm": 1.5}, "min_tm must be")):
        with pytest.raises(InputError, match=words):
            database.search(chains[0], db, device="cpu", **kwargs)


def test_read_chain_skips_a_ligand_chain_with_a_warning(tmp_path):
    t = np.linspace(0, 4 * np.pi, 12)
    lines = ["HETATM    1  C1  LIG X   1       0.000   0.000   0.000  1.00  0.00           C"]
    lines += [f"ATOM  {i + 2:5d}  CA  ALA B{i + 1:4d}    {2.3 * np.cos(t[i]):8.3f}{2.3 * np.sin(t[i]):8.3f}"
              f"{1.5 * t[i]:8.3f}  1.00  0.00           C" for i in range(12)]
    path = tmp_path / "lig.pdb"
    path.write_text("\n".join(lines) + "\nEND\n")
    with pytest.warns(UserWarning, match="chain 'X' skipped"):
        c = database.read_chain(path)
    assert c.name == "lig.pdb:B" and len(c.ca) == 12


SEARCH_FILES = ("d1t3ba2.pdb", "d2nwta1.pdb", "d2a6ca1.pdb", "d1neqa_.pdb", "d1cxya_.pdb", "d3lf5a_.pdb",
                "d1twia1.pdb", "d4oana1.pdb")


def _aligned_entries(monkeypatch):
    """Record the entries each tm_align call of the search gets (names), calling the real one."""
    from protgpu.align import api

    calls, real = [], api.tm_align

    def counting(query, entries, **kwargs):
        calls.append([e.name for e in entries])
        return real(query, entries, **kwargs)

    monkeypatch.setattr(api, "tm_align", counting)
    return calls


def test_search_bounds_skip_entries_and_keep_the_rows(tmp_path, datasets, monkeypatch):
    cs = [database.read_chain(datasets / "tmalign" / f) for f in SEARCH_FILES]
    db = database.load(database.write(tmp_path / "b.pgdb", cs))
    query = max(cs, key=lambda c: len(c.ca))
    every = database.search(query, db, device="cpu")
    assert len(every) == len(cs) and every[0]["target"] == query.name and every[0]["tm_query"] == 1.0
    bound = database.tm_query_bound(len(query.ca), db.lengths)
    for kwargs in ({"top": 1}, {"top": 3}, {"min_tm": 0.5}, {"top": 2, "min_tm": 0.4}, {"min_tm": 1.0}):
        calls = _aligned_entries(monkeypatch)
        got = database.search(query, db, device="cpu", chunk=2, **kwargs)
        want = [r for r in every if r["tm_query"] >= kwargs.get("min_tm", 0.0)][:kwargs.get("top")]
        assert got == want, kwargs
        aligned = {n for c in calls for n in c}
        assert all(len(c) <= 2 for c in calls)
        # every entry left out could not have made the list
        cut = max(kwargs.get("min_tm", 0.0), want[-1]["tm_query"] if kwargs.get("top") and want else 0.0)
        skipped = [k for k, n in enumerate(db.names) if n not in aligned]
        assert all(bound[k] < cut for k in skipped), kwargs
        monkeypatch.undo()
    # the query is the longest entry and comes first; its self hit (tm_query 1) then outranks every
    # shorter entry's bound, so nothing else is aligned
    calls = _aligned_entries(monkeypatch)
    assert database.search(query, db, device="cpu", chunk=1, top=1) == every[:1]
    assert calls == [[query.name]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(5, 40), min_size=1, max_size=30), query_length=st.integers(5, 40),
       levels=st.integers(1, 6), top=st.one_of(st.none(), st.integers(1, 8)),
       min_tm=st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), chunk=st.integers(1, 7), seed=st.integers(0, 2**16))
def test_search_bounds_equal_aligning_everything(monkeypatch, tmp_path, lengths, query_length, levels, top, min_tm,
                                                 chunk, seed):
    """With a stand-in aligner whose tm_query lies anywhere up to the bound (coarse levels, so ties
    are common), the bounded search gives the rows of sorting every entry's scores."""
    from types import SimpleNamespace

    from protgpu.align import api

    rng = np.random.default_rng(seed)
    bound = database.tm_query_bound(query_length, lengths)
    score = {f"e{k}": (bound[k] * rng.integers(0, levels + 1) / levels, rng.integers(0, 3) / 2)
             for k in range(len(lengths))}

    calls = []

    def stand_in(query, entries, **kwargs):
        calls.append([int(e.name[1:]) for e in entries])
        tq, tt = np.array([score[e.name] for e in entries]).T
        n = np.array([len(e.ca) for e in entries])
        return SimpleNamespace(tm_mobile=tq, tm_target=tt, rmsd=tt * 2, n_aligned=n, seq_identity=tt / 3)

    monkeypatch.setattr(api, "tm_align", stand_in)
    monkeypatch.setattr(database, "BOUNDED_CHUNK", 2)
    cs = [Chain(rng.normal(size=(n, 3)), "A" * n, f"e{k}", 0) for k, n in enumerate(lengths)]
    path = tmp_path / f"h{seed}-{len(lengths)}.pgdb"
    db = database.load(database.write(path, cs))
    query = Chain(np.zeros((query_length, 3)), "A" * query_length, "q", 0)
    got = database.search(query, db, top=top, min_tm=min_tm, chunk=chunk)
    keys = sorted(range(len(lengths)), key=lambda k: (-score[f"e{k}"][0], -score[f"e{k}"][1], k))
    want = [f"e{k}" for k in keys if score[f"e{k}"][0] >= min_tm][:top]
    assert [r["target"] for r in got] == want
    assert [r["tm_query"] for r in got] == [score[n][0] for n in want]
    # when the search can skip: the entries at least as long as the query in calls of their own, the
    # shorter ones in calls of at most BOUNDED_CHUNK
    for c in calls:
        assert len(c) <= chunk
        if top is not None or min_tm > 0.0:
            long = {bool(bound[k] >= 1.0) for k in c}
            assert len(long) == 1 and (long == {True} or len(c) <= 2)
