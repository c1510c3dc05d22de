"""A disk cache of compiled kernels that detects corrupt entries.

cuda.core's :class:`~cuda.core.utils.FileStreamProgramCache` stores raw cubins and trusts them; a cubin
truncated by a full disk or flipped by a bad sector would then fail at module load, far from its cause.
This cache frames each entry with a magic tag and the SHA-256 of the payload, so a damaged entry reads
as a miss (and is deleted), and ``Program.compile(..., cache=...)`` simply compiles it again.
Writes go to a temporary file in the same folder and are ``os.replace``-d into place, so concurrent
processes never see half an entry.

The checksum guards against damage, not against an attacker who can write the folder: a cubin
planted there would run in every protgpu process. So the folder is created private (0700), and a
folder owned by another user or writable by group or others is refused (as ssh and pip refuse such
folders): protgpu then says so once and compiles without a disk cache.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import tempfile
import warnings
from pathlib import Path

from cuda.core.utils import ProgramCacheResource

_MAGIC = b"PGCUBIN1"
_HEADER = len(_MAGIC) + 32


def default_cache_dir() -> Path:
    """``$PROTGPU_CACHE_DIR``, else ``$XDG_CACHE_HOME/protgpu/kernels`` (``~/.cache/protgpu/kernels``)."""
    env = os.environ.get("PROTGPU_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "protgpu" / "kernels"


def unsafe_folder_reason(path: Path, *, create: bool = False, allow_root: bool = False,
                         kind: str = "folder") -> str | None:
    """Why ``path`` is not a safe place for code that protgpu will run, or None when it is.

    Parameters
    ----------
    path : Path
        The folder (a symbolic link is judged by its target).
    create : bool
        Create it (mode 0700, parents as the umask says) when missing.
    allow_root : bool
        Accept root as the owner too (a package installed system-wide), not only the current user.
    kind : str
        ``"folder"``, or ``"file"`` to judge a file by the same owner and mode rules.

    Returns
    -------
    str or None
        For example ``"it is writable by other users (mode 0777)"``.
    """
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            return f"it cannot be created ({exc.strerror or exc})"
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    if not (stat.S_ISDIR(st.st_mode) if kind == "folder" else stat.S_ISREG(st.st_mode)):
        return f"it is not a {kind}"
    if sys.platform == "win32":  # no POSIX owner and mode bits to judge
        return None
    if st.st_uid != os.getuid() and not (allow_root and st.st_uid == 0):
        return f"it is owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"it is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _key_bytes(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else bytes(key)


def _payload_bytes(value) -> bytes:
    code = getattr(value, "code", value)  # an ObjectCode carries its binary in .code
    if isinstance(code, (bytes, bytearray, memoryview)):
        return bytes(code)
    raise TypeError(f"cache values must be bytes or ObjectCode, got {type(value).__name__}")


class ChecksummedProgramCache(ProgramCacheResource):
    """Program cache in a folder: one file per key, framed with a SHA-256 of its payload.

    Parameters
    ----------
    path : path-like, optional
        The folder; created if missing. Default: :func:`default_cache_dir`.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_cache_dir()
        self.corrupt_entries_dropped = 0
        self.refused = unsafe_folder_reason(self.path, create=True)
        if self.refused:
            warnings.warn(f"protgpu: not using the kernel cache {self.path}: {self.refused}; kernels are compiled "
                          "in every process (fix the folder's owner or mode, or set PROTGPU_CACHE_DIR)",
                          RuntimeWarning, stacklevel=2)

    def _file(self, key: bytes | str) -> Path:
        return self.path / (hashlib.sha256(_key_bytes(key)).hexdigest() + ".cubin")

    def __getitem__(self, key: bytes | str) -> bytes:
        if self.refused:
            raise KeyError(key)
        f = self._file(key)
        try:
            blob = f.read_bytes()
        except FileNotFoundError:
            raise KeyError(key) from None
        payload = blob[_HEADER:]
        if (
            len(blob) <= _HEADER
            or blob[: len(_MAGIC)] != _MAGIC
            or hashlib.sha256(payload).digest() != blob[len(_MAGIC) : _HEADER]
        ):
            # Damaged: drop it so the caller recompiles and rewrites a good entry.
            self.corrupt_entries_dropped += 1
            f.unlink(missing_ok=True)
            raise KeyError(key)
        return payload

    def __setitem__(self, key: bytes | str, value) -> None:
        payload = _payload_bytes(value)
        if not payload:
            raise ValueError("refusing to cache an empty kernel binary")
        if self.refused:
            return
        blob = _MAGIC + hashlib.sha256(payload).digest() + payload
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-", suffix=".cubin")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
            os.replace(tmp, self._file(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def __delitem__(self, key: bytes | str) -> None:
        try:
            self._file(key).unlink()
        except FileNotFoundError:
            raise KeyError(key) from None

    def __len__(self) -> int:
        if self.refused:
            return 0
        return sum(1 for _ in self.path.glob("*.cubin"))

    def clear(self) -> None:
        for f in self.path.glob("*.cubin"):
            f.unlink(missing_ok=True)
