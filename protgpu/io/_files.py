"""Reading input files safely: regular files only, a size cap, gzip/bzip2/xz decompression (by the
content's magic bytes), temporary decompressed copies for mdtraj, and the C-level output of
third-party readers sent to logging.

Internal API (used by :mod:`protgpu.io.load`, :mod:`protgpu.io.trajectory` and tests):
:func:`check_file`, :func:`read_bytes`, :func:`max_input_bytes`, :func:`decompressed_copy`,
:func:`quiet_reader`.
"""

from __future__ import annotations

import bz2
import contextlib
import ctypes
import gzip
import io
import logging
import lzma
import os
import stat
import sys
import tempfile
import threading
import warnings
import zlib
from pathlib import Path

import numpy as np

from ..errors import InputError

logger = logging.getLogger("protgpu.io")

#: Default cap on the bytes protgpu reads into memory from one input (after decompression).
DEFAULT_MAX_INPUT_BYTES = 1 << 30
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))
_OPENERS = {"gzip": lambda f: gzip.GzipFile(fileobj=f), "bzip2": bz2.BZ2File, "xz": lzma.LZMAFile}
# bytes per read when decompressing: the file object's reads hold about two chunks at a time beside
# what is kept, so memory stays within a few MiB of the cap
_CHUNK = 1 << 20


def max_input_bytes() -> int:
    """The cap on one input's bytes: ``$PROTGPU_MAX_INPUT_BYTES`` when set to a positive integer,
    else :data:`DEFAULT_MAX_INPUT_BYTES` (1 GiB)."""
    text = os.environ.get("PROTGPU_MAX_INPUT_BYTES", "")
    try:
        value = int(text)
    except ValueError:
        return DEFAULT_MAX_INPUT_BYTES
    return value if value > 0 else DEFAULT_MAX_INPUT_BYTES


def _too_big(name: str, what: str) -> InputError:
    cap = max_input_bytes()
    return InputError(
        f"{name}: {what} more than {cap} bytes (the input size cap; set PROTGPU_MAX_INPUT_BYTES to raise it)"
    )


def open_regular(path, shown: str | None = None) -> tuple[int, os.stat_result]:
    """An open descriptor of ``path`` and its fstat, if it is a regular file (after symlinks): the one
    check that loading and the batch engine's hashing share.

    Opened with O_NONBLOCK, so that a named pipe does not block the open; the mode is then checked
    on the open descriptor (no race between a check and the open). ``shown`` is the name messages
    use (default: ``path``).
    """
    name = shown or str(path)
    flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if os.path.islink(path):
            raise InputError(f"{name}: broken symbolic link (its target does not exist)") from None
        raise InputError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{name}: is a directory, not a structure file") from None
    except OSError as exc:
        if os.path.isdir(path):
            raise InputError(f"{name}: is a directory, not a structure file") from None
        raise InputError(f"{name}: cannot read ({exc.strerror or exc})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{name}: is a directory, not a structure file")
        kind = ("a named pipe" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a plain file")
        raise InputError(f"{name}: not a regular file ({kind})")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return fd, st


def check_file(path) -> None:
    """Raise InputError unless ``path`` is an existing, non-empty regular file (symlinks followed)."""
    fd, st = open_regular(path)
    os.close(fd)
    if st.st_size == 0:
        raise InputError(f"{path}: file is empty")


def compression_of(head: bytes) -> str | None:
    """"gzip", "bzip2" or "xz" when ``head`` starts with that format's magic bytes, else None."""
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    return None


def read_bytes(path, gz: bool = False) -> bytes:
    """The bytes of the regular file ``path``, decompressed when its content is gzip, bzip2 or xz.

    Parameters
    ----------
    path : str or os.PathLike
    gz : bool
        Unused (kept for callers of the former signature): compression is recognised from the
        content, so a file named ``.gz`` that holds plain text is read as plain text.

    Raises
    ------
    InputError
        Missing, not a regular file (pipe, device, directory), empty, larger than
        :func:`max_input_bytes` (before or after decompression), or a corrupt compressed stream.
    """
    name = str(path)
    fd, st = open_regular(name)
    cap = max_input_bytes()
    try:
        if st.st_size > cap:
            raise _too_big(name, "file holds")
        # os.read of the size fstat reports: the whole file in one read straight into the bytes
        # object (a file object also seeks and reads once more to meet the end).
        data = os.read(fd, st.st_size + 1)
        if len(data) != st.st_size:  # a short read or a file that grew: read on, up to the cap
            chunks, total = [data], len(data)
            while chunks[-1]:
                chunks.append(os.read(fd, 1 << 20))
                total += len(chunks[-1])
                if total > cap:
                    raise _too_big(name, "file holds")
            data = b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{name}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if not data:
        raise InputError(f"{name}: file is empty")
    kind = compression_of(data[:6])
    if kind is not None:
        data = _decompress(data, kind, name, cap)
        if not data:
            raise InputError(f"{name}: file is empty (after {kind} decompression)")
    return data


def _decompressed_chunks(source, kind: str, name: str, cap: int):
    """The decompressed bytes of ``source`` (a binary file object) in chunks of at most ``_CHUNK``,
    stopping as soon as they pass ``cap``: no more than ``cap + 1`` bytes are ever decompressed, so a
    small file that unpacks to gigabytes fails without taking them, and a caller that does not keep
    the chunks (:func:`decompressed_copy`) holds one at a time."""
    total = 0
    try:
        with _OPENERS[kind](source) as fh:
            while True:
                # the last read asks for one byte past the cap: enough to know the stream is too big
                chunk = fh.read(min(_CHUNK, cap + 1 - total))
                if not chunk:
                    return
                total += len(chunk)
                if total > cap:
                    raise _too_big(name, f"{kind} stream unpacks to")
                yield chunk
    except InputError:  # the cap (an InputError is a ValueError: not "corrupt")
        raise
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
        raise InputError(f"{name}: corrupt or truncated {kind} data ({exc})") from None


def _decompress(data: bytes, kind: str, name: str, cap: int) -> bytes:
    """``data`` decompressed, at most ``cap`` bytes (see :func:`_decompressed_chunks`)."""
    return b"".join(_decompressed_chunks(io.BytesIO(data), kind, name, cap))


@contextlib.contextmanager
def decompressed_copy(name: str, ext: str):
    """A path that mdtraj can read: ``name`` itself when it is not compressed, else a temporary
    decompressed copy named ``*{ext}`` (removed on the way out). The copy is written chunk by chunk
    straight from the compressed file (memory stays at one chunk whatever the sizes); the cap of
    :func:`read_bytes` holds for its size."""
    fd, _ = open_regular(name)
    with os.fdopen(fd, "rb") as src:
        kind = compression_of(src.read(6))
        if kind is None:
            src.close()
            yield name
            return
        src.seek(0)
        out_fd, tmp = tempfile.mkstemp(suffix=ext, prefix="protgpu-")
        try:
            empty = True
            with os.fdopen(out_fd, "wb") as out:
                for chunk in _decompressed_chunks(src, kind, name, max_input_bytes()):
                    try:
                        out.write(chunk)
                    except OSError as exc:  # the temporary folder is full, say
                        raise InputError(f"{name}: cannot decompress into {tempfile.gettempdir()} "
                                         f"({exc.strerror or exc})") from None
                    empty = False
            if empty:
                raise InputError(f"{name}: file is empty (after {kind} decompression)")
            src.close()
            yield tmp
        finally:
            with contextlib.suppress(OSError):
                os.remove(tmp)


_REDIRECT_LOCK = threading.Lock()
_REDIRECT = {"depth": 0, "saved": {}, "sink": None}


def _fflush() -> None:
    """Flush C stdio buffers (what a plugin printed may still sit in libc's stdout buffer)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def quiet_reader(name: str, fds: tuple[int, ...] = (1,)):
    """Run a third-party reader quietly: its Python warnings and NumPy floating-point warnings are
    suppressed, and what it writes to the C-level file descriptors ``fds`` (mdtraj's DCD plugin
    prints to fd 1, HDF5 its error stack to fd 2) goes to the ``protgpu.io`` logger at DEBUG level
    instead of the process's stdout/stderr.

    The redirection is process-wide: nested and concurrent uses share one (a count under a lock),
    so text other threads write to those descriptors meanwhile also goes to the log.
    """
    with _REDIRECT_LOCK:
        if _REDIRECT["depth"] == 0:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            _fflush()
            sink = tempfile.TemporaryFile()
            saved = {}
            for fd in fds:
                try:
                    saved[fd] = os.dup(fd)
                    os.dup2(sink.fileno(), fd)
                except OSError:  # no such descriptor (a daemon): nothing to redirect
                    saved.pop(fd, None)
            _REDIRECT.update(saved=saved, sink=sink)
        _REDIRECT["depth"] += 1
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            yield
    finally:
        with _REDIRECT_LOCK:
            _REDIRECT["depth"] -= 1
            if _REDIRECT["depth"] == 0:
                _fflush()
                for fd, old in _REDIRECT["saved"].items():
                    os.dup2(old, fd)
                    os.close(old)
                sink = _REDIRECT["sink"]
                sink.seek(0)
                text = sink.read().decode("utf-8", "replace")
                sink.close()
                _REDIRECT.update(saved={}, sink=None)
                for line in text.splitlines():
                    if line.strip():
                        logger.debug("%s: %s", name, line)


def is_regular_path(path) -> bool:
    """Whether ``path`` is a regular file after following symlinks (no open, no read)."""
    try:
        return stat.S_ISREG(os.stat(Path(path)).st_mode)
    except OSError:
        return False
