"""Decompression stays bounded in memory (issue 21): a small file that unpacks to far more than the input
cap fails after decompressing at most the cap, and a trajectory's temporary decompressed copy is written
chunk by chunk (memory at one chunk, whatever the file's size)."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import tracemalloc

import pytest

import protgpu as pg
from protgpu.errors import InputError
from protgpu.io import _files

COMPRESS = {"gz": lambda b: gzip.compress(b, 1), "bz2": lambda b: bz2.compress(b, 1),
            "xz": lambda b: lzma.compress(b, preset=0)}
NAMES = {"gz": "gzip", "bz2": "bzip2", "xz": "xz"}
MiB = 1 << 20


def _peak(fn) -> int:
    """Peak bytes Python allocated while ``fn()`` ran (tracemalloc sees every bytes object the
    decompressors hand back)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("ext", list(COMPRESS))
def test_a_decompression_bomb_stops_at_the_cap(tmp_path, monkeypatch, ext):
    cap = 6 * MiB
    monkeypatch.setenv("PROTGPU_MAX_INPUT_BYTES", str(cap))
    bomb = tmp_path / f"bomb.pdb.{ext}"
    bomb.write_bytes(COMPRESS[ext](b"ATOM" * (16 * MiB)))  # 64 MiB unpacked, a few kB packed

    def load():
        with pytest.raises(InputError) as e:
            pg.load(bomb)
        # the cap's own message, not "corrupt data (<the cap's message>)"
        assert str(e.value).startswith(f"{bomb}: {NAMES[ext]} stream unpacks to more than {cap} bytes")

    peak = _peak(load)
    # the cap plus a few chunks in flight; the former loop read 4 MiB chunks, one past the cap (~14 MiB)
    assert peak < cap + 3 * MiB, peak


def test_a_valid_file_under_the_cap_still_loads_whole(tmp_path, datasets, monkeypatch):
    data = (datasets / "adk_open.pdb").read_bytes()
    for ext, pack in COMPRESS.items():
        p = tmp_path / f"a.pdb.{ext}"
        p.write_bytes(pack(data))
        assert _files.read_bytes(p) == data
        monkeypatch.setenv("PROTGPU_MAX_INPUT_BYTES", str(len(data)))  # exactly at the cap: still fine
        assert _files.read_bytes(p) == data
        monkeypatch.setenv("PROTGPU_MAX_INPUT_BYTES", str(len(data) - 1))
        with pytest.raises(InputError, match="unpacks to more than"):
            _files.read_bytes(p)
        monkeypatch.delenv("PROTGPU_MAX_INPUT_BYTES")


@pytest.mark.parametrize("ext", list(COMPRESS))
def test_a_decompressed_copy_streams_to_disk(tmp_path, ext):
    raw = os.urandom(MiB) * 24  # 24 MiB unpacked
    src = tmp_path / f"t.dcd.{ext}"
    src.write_bytes(COMPRESS[ext](raw))
    seen = {}

    def copy():
        with _files.decompressed_copy(str(src), ".dcd") as path:
            seen["path"] = path
            seen["size"] = os.path.getsize(path)

    peak = _peak(copy)
    assert seen["size"] == len(raw) and not os.path.exists(seen["path"])
    assert peak < 10 * MiB, peak  # the former copy held the whole 24 MiB (and the packed file) in memory


def test_a_decompressed_copy_keeps_the_cap_and_cleans_up(tmp_path, monkeypatch):
    monkeypatch.setenv("PROTGPU_MAX_INPUT_BYTES", str(MiB))
    src = tmp_path / "t.dcd.gz"
    src.write_bytes(gzip.compress(b"\0" * (8 * MiB)))
    before = set(os.listdir(_files.tempfile.gettempdir()))
    with pytest.raises(InputError, match=r"t\.dcd\.gz: gzip stream unpacks to more than 1048576"):
        with _files.decompressed_copy(str(src), ".dcd"):
            pass
    assert {n for n in os.listdir(_files.tempfile.gettempdir()) if n.startswith("protgpu-")} <= before
    plain = tmp_path / "p.dcd"
    plain.write_bytes(b"x" * 10)
    with _files.decompressed_copy(str(plain), ".dcd") as path:
        assert path == str(plain)
