"""Tests of protgpu.io.write: the atomic writer, stale-temporary cleanup, save_array and pg.save."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from protgpu.errors import InputError
from protgpu.io import save_array, write_atomic


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
