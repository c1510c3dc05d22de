"""Expanding the CLI's INPUT arguments: paths, globs, directories, ``@list.txt`` files and ``-``."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

from ..errors import InputError
from ..io.formats import readable_suffixes


def _has_ext(p: str, exts) -> bool:
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
                elif _has_ext(e.name, extensions) and e.is_file():
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
    ``extensions`` defaults to what ``protgpu.load`` reads (``protgpu.io.formats.readable_suffixes``).
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
        if any(ch in item for ch in "*?["):
            matches = sorted(glob.glob(item, recursive=True))
            if not matches:
                raise InputError(f"{item}: no file matches this pattern")
            for m in matches:
                expand(m, origin)
            return
        if os.path.isdir(item):
            found = _files_under(item, extensions)
            if not found:
                raise InputError(f"{item}: directory holds no file with a known extension")
            for f in found:
                add(f)
            return
        if not os.path.exists(item):
            where = f" (listed in {origin})" if origin else ""
            raise InputError(f"{item}: no such file{where}")
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
