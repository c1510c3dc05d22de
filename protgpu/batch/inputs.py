"""The batch engine's inputs: expanding paths, globs, directories, ``@list.txt`` files and ``-`` into
a list of files (:func:`expand_inputs`), content hashes (:func:`file_sha256`) and shards
(:func:`parse_shard`, :func:`shard_path`).

Internal API (the engine, the CLI and tests): :func:`has_ext` (the one suffix test of directory
expansion), :class:`ExpandedInputs`, :func:`input_paths` (what :func:`protgpu.batch.run` does with its
``inputs``) and :func:`hash_all`.
"""

from __future__ import annotations

import glob
import hashlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..errors import InputError
from ..io._files import open_regular
from ..io.formats import readable_suffixes


def has_ext(p: str, exts) -> bool:
    """Whether the file name ``p`` ends with one of ``exts`` (any case): the one suffix test of
    directory expansion (:func:`expand_inputs`)."""
    low = p.lower()
    return any(low.endswith(e) for e in exts)


class ExpandedInputs(list):
    """What :func:`expand_inputs` returns: a list of paths that the batch engine takes as they are,
    without expanding (and checking) every one of them a second time."""


def _files_under(root: str, extensions) -> list[str]:
    """Files below ``root`` with one of ``extensions``, sorted: what ``sorted(Path(root).rglob("*"))``
    keeps (symlinked files included, symlinked folders not entered, unreadable folders skipped), from
    os.scandir's entry types instead of one stat per file."""
    found: list[str] = []
    stack = [str(Path(root))]  # normalised as pathlib spells it, so the paths are pathlib's too
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except (PermissionError, FileNotFoundError, NotADirectoryError):
            continue
        for e in entries:
            path = os.path.join(folder, e.name)
            try:
                if e.is_dir() and not e.is_symlink():
                    stack.append(path)
                elif has_ext(e.name, extensions) and e.is_file():
                    found.append(path)
            except OSError:
                continue
    found.sort()
    return found


def expand_inputs(items, *, extensions=None) -> list[str]:
    """Turn INPUT arguments into a list of file paths, in order, without duplicates.

    ``@file`` reads one path per line (blank lines and ``#`` comments skipped); ``-`` reads that list
    from standard input; a directory is searched recursively for files with ``extensions``; anything
    with ``*``, ``?`` or ``[`` is a glob. A path that does not exist is an error naming it.

    Parameters
    ----------
    items : iterable of str
        The INPUT arguments.
    extensions : tuple of str, optional
        File name endings a directory is searched for; default: every suffix :func:`protgpu.load`
        reads (:func:`protgpu.io.formats.readable_suffixes`, compressed forms included).

    Returns
    -------
    ExpandedInputs
        The paths (a list), which :func:`protgpu.batch.run` takes without expanding them again.

    Raises
    ------
    InputError
        A path, list file or pattern that names nothing, a directory without a known file, or no input.
    """
    extensions = readable_suffixes() if extensions is None else extensions
    out: list[str] = []
    seen: set[str] = set()

    def add(p: str) -> None:
        if p not in seen:
            seen.add(p)
            out.append(p)

    def expand(item: str, origin: str | None) -> None:
        if item == "-":
            for line in sys.stdin:
                _list_line(line, "<stdin>")
            return
        if item.startswith("@"):
            list_file = item[1:]
            try:
                with open(list_file) as fh:
                    lines = fh.readlines()
            except OSError as exc:
                raise InputError(f"{list_file}: cannot read input list: {exc.strerror}") from None
            base = os.path.dirname(list_file)
            for line in lines:
                _list_line(line, list_file, base)
            return
        # a path that exists is itself, whatever characters its name holds (glob[1].pdb, star*.pdb)
        if not os.path.lexists(item) and any(ch in item for ch in "*?["):
            matches = sorted(glob.glob(item, recursive=True))
            if not matches:
                raise InputError(f"{display_path(item)}: no file matches this pattern")
            for m in matches:  # a match is a path, never a pattern to expand again
                path(m, origin)
            return
        path(item, origin)

    def path(item: str, origin: str | None) -> None:
        if os.path.isdir(item):
            found = _files_under(item, extensions)
            if not found:
                raise InputError(f"{display_path(item)}: directory holds no file with a known extension")
            for f in found:
                add(f)
            return
        if not os.path.exists(item):
            where = f" (listed in {display_path(origin)})" if origin else ""
            raise InputError(f"{display_path(item)}: no such file{where}")
        add(item)

    def _list_line(line: str, origin: str, base: str = "") -> None:
        s = line.strip()
        if not s or s.startswith("#"):
            return
        if base and not os.path.isabs(s) and not os.path.exists(s):
            s = os.path.join(base, s)
        expand(s, origin)

    for it in items:
        expand(it, None)
    if not out:
        raise InputError("no input files given")
    return ExpandedInputs(out)


def regular_file_or_error(path, max_bytes: int | None = None) -> int:
    """The size of ``path`` when it is a regular file (a symbolic link to one is fine) of at most
    ``max_bytes`` (no limit by default); otherwise an :class:`InputError` naming it. A named pipe, a
    device (``/dev/zero``), a socket or a directory is refused without reading from it
    (:func:`protgpu.io._files.open_regular`, the loaders' own check).

    Examples
    --------
    >>> regular_file_or_error("/dev/zero")
    Traceback (most recent call last):
    ...
    protgpu.errors.InputError: /dev/zero: not a regular file (a device)
    """
    fd, st = open_regular(path, display_path(path))
    os.close(fd)
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputError(f"{display_path(path)}: {st.st_size} bytes, more than the {max_bytes} allowed")
    return st.st_size


def display_path(path) -> str:
    """A path as messages and tables show it: an undecodable byte of its name (a surrogate escape,
    ``\\udcff``) as ``\\xff``, so that it prints and encodes as UTF-8.

    Examples
    --------
    >>> display_path("m_\\udcff.pdb")
    'm_\\\\xff.pdb'
    """
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def common_root(paths) -> str:
    """The deepest folder holding every one of ``paths`` (absolute); inputs are named relative to it
    (:func:`input_name`), so that ``af/a/ranked_0.pdb`` and ``af/b/ranked_0.pdb`` stay apart."""
    folders = {os.path.dirname(os.path.abspath(p)) for p in paths}
    if not folders:
        return os.getcwd()
    try:
        return os.path.commonpath(sorted(folders))
    except ValueError:  # Windows: paths on different drives have no common folder
        return ""


def input_name(path, root: str | None) -> str:
    """How tables and ``.npz`` keys name the input ``path``: its path relative to ``root`` (the inputs'
    :func:`common_root`; the base name when ``root`` is None), shown by :func:`display_path`.

    Examples
    --------
    >>> root = common_root(["af/a/ranked_0.pdb", "af/b/ranked_0.pdb"])
    >>> [input_name(p, root) for p in ("af/a/ranked_0.pdb", "af/b/ranked_0.pdb")]
    ['a/ranked_0.pdb', 'b/ranked_0.pdb']
    """
    if root is None:
        name = os.path.basename(path)
    elif root == "":
        name = os.path.abspath(path)
    else:
        name = os.path.relpath(os.path.abspath(path), root)
    return display_path(name.replace(os.sep, "/"))


def file_sha256(path, chunk: int = 1 << 20, max_bytes: int | None = None) -> str:
    """Hex sha256 of a file's bytes (the manifest's content hash).

    Parameters
    ----------
    path : str or os.PathLike
        A regular file (or a link to one).
    chunk : int
        Read size, bytes.
    max_bytes : int, optional
        Largest size accepted; default: no limit (a regular file ends).

    Raises
    ------
    InputError
        ``path`` is not a regular file (a named pipe, ``/dev/zero``), or is larger than ``max_bytes``:
        it is not read at all.

    Returns
    -------
    str
        64 hex digits.

    Examples
    --------
    >>> import os, tempfile
    >>> from pathlib import Path
    >>> path = Path(tempfile.mkdtemp()) / "abc.txt"
    >>> _ = path.write_text("abc")
    >>> file_sha256(path)
    'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad'
    """
    fd, st = open_regular(path, display_path(path))  # a pipe or /dev/zero would be read forever
    if max_bytes is not None and st.st_size > max_bytes:
        os.close(fd)
        raise InputError(f"{display_path(path)}: {st.st_size} bytes, more than the {max_bytes} allowed")
    h = hashlib.sha256()
    n = 0
    with os.fdopen(fd, "rb") as fh:
        while True:
            b = fh.read(chunk)
            if not b:
                break
            n += len(b)
            if max_bytes is not None and n > max_bytes:  # the file grew while read
                raise InputError(f"{display_path(path)}: more than the {max_bytes} bytes allowed")
            h.update(b)
    return h.hexdigest()


def parse_shard(text: str) -> tuple[int, int]:
    """Parse ``"i/N"`` (0 <= i < N) into ``(i, N)``.

    Examples
    --------
    >>> parse_shard("2/8")
    (2, 8)
    """
    try:
        a, b = str(text).split("/")
        i, n = int(a), int(b)
    except ValueError:
        raise InputError(f"--shard {text!r}: use i/N, e.g. 0/4 (i counts from 0)") from None
    if n < 1 or not 0 <= i < n:
        raise InputError(f"--shard {text!r}: need N >= 1 and 0 <= i < N (i counts from 0: 0/{max(n, 1)} .. "
                         f"{max(n, 1) - 1}/{max(n, 1)})")
    return i, n


def shard_path(out, i: int, n: int) -> Path:
    """Output path of shard i of n: ``{shard}`` in the name is replaced by ``i-of-n``; otherwise
    ``.shard-i-of-n`` goes before the suffix (``scores.csv`` -> ``scores.shard-0-of-4.csv``).

    Examples
    --------
    >>> shard_path("scores.csv", 0, 4).as_posix()
    'scores.shard-0-of-4.csv'
    >>> shard_path("out/{shard}.npz", 2, 4).as_posix()
    'out/2-of-4.npz'
    """
    p = Path(out)
    tag = f"{i}-of-{n}"
    if "{shard}" in p.name:
        return p.with_name(p.name.replace("{shard}", tag))
    return p.with_name(f"{p.stem}.shard-{tag}{p.suffix}")


def input_paths(inputs) -> list[str]:
    """The paths :func:`protgpu.batch.iter_results` works on: ``inputs`` expanded by
    :func:`expand_inputs`, unless they already were (an :class:`ExpandedInputs`)."""
    if isinstance(inputs, ExpandedInputs):  # the CLI's list, already expanded (and checked): not again
        return list(inputs)
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    return expand_inputs([str(p) for p in inputs])


def hash_all(paths: list[str], jobs: int) -> dict:
    """``{path: sha256 or None}`` (None: unreadable) of ``paths``, hashed in ``jobs`` threads."""
    def one(p):
        try:
            return p, file_sha256(p)
        except (OSError, InputError):  # the input's own run then says why
            return p, None

    with ThreadPoolExecutor(max(1, jobs)) as ex:  # hashlib releases the GIL on large reads
        return dict(ex.map(one, paths))

