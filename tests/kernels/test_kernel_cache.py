"""The kernel cache's folder must be private: code found there runs in every protgpu process."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("cuda.core")

from protgpu._cuda.cache import ChecksummedProgramCache, unsafe_folder_reason  # noqa: E402

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX owner and mode bits")


@posix_only
def test_new_folder_is_private(tmp_path):
    folder = tmp_path / "a" / "kernels"
    cache = ChecksummedProgramCache(folder)
    assert not cache.refused
    assert os.stat(folder).st_mode & 0o777 == 0o700


@posix_only
@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_folder_writable_by_others_is_refused(tmp_path, mode):
    folder = tmp_path / "kernels"
    folder.mkdir()
    os.chmod(folder, mode)
    planted = folder / ("0" * 64 + ".cubin")
    planted.write_bytes(b"planted")
    expected = rf"not using the kernel cache .*writable by other users \(mode 0{mode:o}\)"
    with pytest.warns(RuntimeWarning, match=expected):
        cache = ChecksummedProgramCache(folder)
    assert cache.refused
    assert len(cache) == 0
    with pytest.raises(KeyError):
        cache[b"any key"]
    cache[b"k"] = b"payload"  # dropped, not written into the unsafe folder
    assert sorted(p.name for p in folder.iterdir()) == [planted.name]


@posix_only
def test_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(folder).st_uid + 1)
    assert "owned by another user" in unsafe_folder_reason(folder)


def test_a_file_is_not_a_folder(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert unsafe_folder_reason(f) == "it is not a folder"
