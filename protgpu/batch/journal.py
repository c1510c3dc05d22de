"""The journal of a batch run: ``OUT.manifest.jsonl`` (a header, then one line per finished input)
and the array parts in ``OUT.parts/``, read back for ``resume`` and assembled into the output.

The journal lives only while a run is in progress or was interrupted: once the output is written and
every input succeeded, :meth:`Store.remove` deletes it (with ``keep_going`` and failed inputs it stays,
so that ``--resume`` retries only those). :class:`OutputLock` (``.OUT.lock``) keeps two runs from
writing one output. Neither the manifest nor the parts folder is followed when it is a symbolic link,
and a manifest entry can only name a part file inside ``OUT.parts/``.

Internal API (the engine, the CLI): :class:`Store` (the journal of one output), :class:`OutputLock`
and :func:`write_run_record` (the same manifest for a run written in one piece).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..io.write import atomic_path
from .inputs import display_path
from .job import Job
from .results import InputResult
from .writers import (
    TABLE_SUFFIXES,
    OutputError,
    stem_keys,
    write_errors,
    write_npz,
    write_output,
    write_table,
)

MANIFEST_FORMAT = "protgpu-batch/1"
# the only part names a manifest may hold: a name this engine made, inside OUT.parts/ (no "/", no "..")
_PART_NAME = re.compile(r"part-[0-9a-f]{8}-[0-9]{6}\.npz")


def _refuse_link(path: Path, what: str) -> None:
    """InputError when ``path`` is a symbolic link: the journal never writes or deletes through one."""
    if path.is_symlink():
        raise InputError(f"{path}: the {what} is a symbolic link; protgpu does not follow it (remove the link)")


def blas_setting() -> str:
    """This process's BLAS thread setting as the journal records it: ``"openblas:8"`` (each BLAS
    library loaded, with its thread count; threadpoolctl reads it)."""
    from threadpoolctl import threadpool_info

    libs = sorted(f"{i.get('internal_api')}:{i.get('num_threads')}" for i in threadpool_info()
                  if i.get("user_api") == "blas")
    return ",".join(libs) or "none"


class Entry:
    """What the journal keeps in memory of one input: its status and hash, where its arrays are, and its
    rows as their JSON text (a few hundred bytes, where the row dicts took about a kilobyte: memory stays
    small per input over 100,000 of them)."""

    __slots__ = ("arrays", "error", "n_rows", "part", "rows_json", "sha256", "slot", "status")

    def __init__(self, line: dict):
        self.status = line.get("status")
        self.sha256 = line.get("sha256")
        self.part = line.get("part")
        self.slot = line.get("slot")
        self.arrays = tuple(line.get("arrays", ()))
        self.error = line.get("error")
        rows = line.get("rows") or []
        self.n_rows = len(rows)
        self.rows_json = json.dumps(rows).encode() if rows else None

    @property
    def rows(self) -> list:
        """The rows, decoded (a new list each time)."""
        return json.loads(self.rows_json) if self.rows_json is not None else []


class Rows(Sequence):
    """The rows of a run's journaled inputs, in input order, decoded when read: :attr:`Summary.rows` of a
    run with ``out``, which keeps them as JSON text instead of one dict per value."""

    def __init__(self, entries: list):
        self._entries = [e for e in entries if e.n_rows]
        self._n = sum(e.n_rows for e in self._entries)

    def __len__(self) -> int:
        return self._n

    def __iter__(self):
        for e in self._entries:
            yield from e.rows

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(self)[i]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("row index out of range")
        for e in self._entries:
            if i < e.n_rows:
                return e.rows[i]
            i -= e.n_rows
        raise IndexError("row index out of range")

    def __eq__(self, other):
        return isinstance(other, (list, tuple, Sequence)) and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(list(self))


def _lock_calls():
    """``(lock, unlock)`` of this platform's exclusive, non-blocking lock on an open file, or None:
    ``fcntl.flock`` on POSIX (``unlock`` None: closing the descriptor releases it); on Windows
    ``msvcrt.locking`` of the file's first byte (released before closing, as Windows asks)."""
    try:
        import fcntl
    except ImportError:
        fcntl = None
    if fcntl is not None:
        return (lambda fd: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)), None
    try:
        import msvcrt
    except ImportError:  # neither: runs are not guarded
        return None

    def at_start(fd, mode):
        os.lseek(fd, 0, os.SEEK_SET)  # msvcrt locks from the current position
        msvcrt.locking(fd, mode, 1)

    return (lambda fd: at_start(fd, msvcrt.LK_NBLCK)), (lambda fd: at_start(fd, msvcrt.LK_UNLCK))


# Descriptors of the output locks this process holds. A forked child (the parse pool's workers) gets a
# copy of each, and flock belongs to the shared open file: a worker outliving a killed run would keep
# the output locked, and the --resume right after would be refused. Children close their copies.
_HELD_LOCK_FDS: set[int] = set()


def _close_held_locks_in_child() -> None:
    for fd in _HELD_LOCK_FDS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD_LOCK_FDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_locks_in_child)


class OutputLock:
    """An exclusive lock on one output: ``.OUT.lock`` beside it, held for a whole run and removed at its
    end; a second run on the same output fails at once with a one-line error.

    POSIX takes ``fcntl.flock``; Windows ``msvcrt.locking`` on the file's first byte (tested here only
    with a stand-in ``msvcrt``, not on Windows itself). Where neither exists nothing is locked."""

    def __init__(self, out: Path):
        self.out = out
        self.path = out.with_name(f".{out.name}.lock")
        self.fd = None
        self._unlock = None

    def acquire(self) -> None:
        calls = _lock_calls()
        if calls is None:
            return
        lock, self._unlock = calls
        _refuse_link(self.path, "lock file")
        for _ in range(10):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
            except OSError as exc:
                raise InputError(f"--out {self.out}: cannot create the lock file {self.path} "
                                 f"({exc.strerror or exc})") from None
            try:
                lock(fd)
            except OSError:
                os.close(fd)
                raise InputError(f"--out {self.out}: another protgpu run is writing this output "
                                 f"(lock {self.path}); wait for it or choose another --out") from None
            # the holder before us may have removed the file after we opened it: lock the one on disk
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                _HELD_LOCK_FDS.add(fd)
                return
            self._release_fd(fd)
        raise InputError(f"--out {self.out}: cannot take the lock {self.path} (it keeps being replaced)")

    def _release_fd(self, fd) -> None:
        if self._unlock is not None:
            with contextlib.suppress(OSError):
                self._unlock(fd)
        os.close(fd)

    def release(self) -> None:
        if self.fd is None:
            return
        _HELD_LOCK_FDS.discard(self.fd)
        if self._unlock is None:
            with contextlib.suppress(OSError):
                self.path.unlink()  # while still locked: a waiting run then locks a fresh file
            os.close(self.fd)
        else:
            # Windows removes no file that is open: unlock and close first. A run that opened it
            # meanwhile keeps it (the unlink fails) and locks that file, which is as good.
            self._release_fd(self.fd)
            with contextlib.suppress(OSError):
                self.path.unlink()
        self.fd = None


class Store:
    """The manifest (journal) and array parts of one output path."""

    def __init__(self, out: Path, job: Job, paths: list[str] | None = None, blas: str | None = None):
        self.out = out
        self.job = job
        self.paths = paths  # the whole expanded input list (all shards): what .npz keys are drawn from
        self.manifest = out.with_name(out.name + ".manifest.jsonl")
        self.parts = out.with_name(out.name + ".parts")
        self.header = {"kind": "header", "format": MANIFEST_FORMAT, "job": job.name,
                       "options": json.loads(json.dumps(job.options(), default=str))}
        if blas is not None:  # the BLAS thread setting the job's numbers depend on (Job.uses_blas)
            self.header["blas"] = blas
        self.entries: dict[str, Entry] = {}  # key -> latest entry
        self.started = False  # header written by this run (or resumed onto)
        self.run_id = uuid.uuid4().hex[:8]
        self.n_parts = 0

    @staticmethod
    def key(path: str) -> str:
        """The manifest key of an input: its absolute path."""
        return os.path.abspath(path)

    # -- reading -------------------------------------------------------------------------------
    def read(self) -> bool:
        """Load the manifest for a resume; False when there is none. Drops a torn last line and parts
        that no entry references (a run killed between writing a part and journaling it)."""
        _refuse_link(self.manifest, "manifest")
        _refuse_link(self.parts, "parts folder")
        try:
            fd = os.open(self.manifest, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise InputError(f"{self.manifest}: cannot read the manifest ({exc.strerror})") from None
        good_end, lines = 0, []
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                break  # an unterminated last line: torn by a kill mid-write
            try:
                lines.append(json.loads(data[pos:nl]))
            except ValueError:
                break
            pos = good_end = nl + 1
        if not lines or lines[0].get("kind") != "header" or lines[0].get("format") != MANIFEST_FORMAT:
            raise InputError(f"{self.manifest}: not a protgpu batch manifest; remove it or drop --resume")
        head = lines[0]
        if head.get("job") != self.header["job"] or head.get("options") != self.header["options"]:
            diff = sorted(k for k in set(head.get("options", {})) | set(self.header["options"])
                          if head.get("options", {}).get(k) != self.header["options"].get(k))
            what = f"options {', '.join(diff)}" if diff else f"job {head.get('job')!r}"
            raise InputError(f"{self.manifest}: written with different {what} than this run; "
                             "run without --resume to start over")
        old, new = head.get("blas"), self.header.get("blas")
        if old is not None and new is not None and old != new:
            raise InputError(f"{self.manifest}: its results were computed with BLAS threads {old}, this run "
                             f"has {new}; the last digits of {self.header['job']} results depend on it. Resume "
                             "with the same setting (e.g. OPENBLAS_NUM_THREADS, the same Dask or local run) "
                             "or run without --resume")
        if good_end < len(data):
            with open(self.manifest, "r+b") as fh:
                fh.truncate(good_end)
        for e in lines[1:]:
            if e.get("kind") == "input":
                part = e.get("part")
                if part is not None and not (isinstance(part, str) and _PART_NAME.fullmatch(part)):
                    raise InputError(f"{self.manifest}: the entry of {e.get('input')!r} names part {part!r}, "
                                     f"which is not a part file in {self.parts}; run without --resume")
                self.entries[e["key"]] = Entry(e)
        referenced = {e.part for e in self.entries.values() if e.part}
        if self.parts.is_dir():
            for p in self.parts.iterdir():
                if p.name not in referenced and (p.name.startswith("part-") or p.name.startswith(".part-")):
                    with contextlib.suppress(OSError):
                        p.unlink()
        self.started = True
        return True

    def done(self, path: str, sha: str | None) -> Entry | None:
        """The journal entry of ``path`` when it is ``ok`` with content ``sha`` (and its part file
        exists): the input need not run again. None otherwise."""
        e = self.entries.get(self.key(path))
        if e is None or e.status != "ok" or sha is None or e.sha256 != sha:
            return None
        if e.part and not (self.parts / e.part).is_file():
            return None
        return e

    def arrays_of(self, e: Entry) -> dict:
        """The arrays of a journaled entry, read from its part file (empty when it has none)."""
        if not e.part:
            return {}
        with np.load(self.parts / e.part) as z:
            return {name: z[f"{e.slot}:{name}"] for name in e.arrays}

    # -- writing -------------------------------------------------------------------------------
    def _start(self) -> None:
        """First commit of a fresh run: replace an old journal (only files this engine names)."""
        _refuse_link(self.parts, "parts folder")
        if self.parts.is_dir():
            for p in self.parts.iterdir():
                if p.name.startswith(("part-", ".part-")):
                    with contextlib.suppress(OSError):
                        p.unlink()
        line = json.dumps({**self.header, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n"
        write_output(self.manifest, lambda tmp: Path(tmp).write_text(line))
        self.started = True

    def commit(self, results: list[InputResult]) -> None:
        """Journal a batch: its arrays as one part file (atomic), then its lines in one append."""
        if not results:
            return
        if not self.started:
            self._start()
        part = None
        with_arrays = [r for r in results if r.ok and r.arrays]
        if with_arrays:
            self.n_parts += 1
            part = f"part-{self.run_id}-{self.n_parts:06d}.npz"
            self.parts.mkdir(exist_ok=True)
            items = [(f"{k}:{name}", a) for k, r in enumerate(with_arrays) for name, a in r.arrays.items()]

            def write_part(tmp):
                with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
                    for key, arr in items:
                        with zf.open(f"{key}.npy", "w", force_zip64=True) as fh:
                            np.lib.format.write_array(fh, np.asarray(arr), allow_pickle=False)

            try:
                with atomic_path(self.parts / part) as tmp:
                    write_part(tmp)
            except OSError as exc:
                raise OutputError(f"{self.parts / part}: cannot write ({exc.strerror or exc}); inputs finished "
                                  f"so far are journaled in {self.manifest} (rerun with --resume)") from None
        slots = {id(r): k for k, r in enumerate(with_arrays)}
        lines = []
        for r in results:
            e = {"kind": "input", "input": r.input, "key": self.key(r.input), "sha256": r.sha256,
                 "status": r.status}
            if r.ok:
                e["rows"] = r.rows
                if r.arrays:
                    e.update(part=part, slot=slots[id(r)], arrays=list(r.arrays))
            else:
                e["error"] = r.error
            self.entries[e["key"]] = Entry(e)
            lines.append(json.dumps(e) + "\n")
        try:
            fd = os.open(self.manifest, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "w") as fh:
                fh.write("".join(lines))
        except OSError as exc:
            raise OutputError(f"{self.manifest}: cannot append ({exc.strerror or exc}); rerun with --resume "
                              "once there is space") from None

    def finish(self, order: list) -> tuple[Rows, list, Path | None]:
        """Write the output and errors file from the journal, in input order; the rows (decoded as they
        are read, not held as dicts) and the failures."""
        ok, failed = [], []
        for _index, path in order:
            e = self.entries.get(self.key(path))
            if e is None:
                continue
            (ok if e.status == "ok" else failed).append((path, e))
        rows = Rows([e for _, e in ok])
        if self.out.name.lower().endswith(TABLE_SUFFIXES):
            write_table(self.out, rows, self.job.columns)
        else:
            self._write_arrays(ok)
        errors = write_errors(self.out, [(p, e.sha256, e.error or "") for p, e in failed])
        return rows, [(p, e.error or "") for p, e in failed], errors

    def remove(self) -> None:
        """Delete the journal (the manifest, and the part files in ``OUT.parts/``, then the folder
        when nothing else is in it): the run is complete and its output written."""
        with contextlib.suppress(FileNotFoundError):
            self.manifest.unlink()
        if self.parts.is_dir() and not self.parts.is_symlink():
            for p in self.parts.iterdir():
                if p.name.startswith(("part-", ".part-")):
                    with contextlib.suppress(OSError):
                        p.unlink()
            with contextlib.suppress(OSError):
                self.parts.rmdir()

    def _write_arrays(self, ok: list) -> None:
        if self.out.name.lower().endswith(".npy"):
            arrays = [a for _, e in ok for a in self.arrays_of(e).values()]
            if not arrays:  # the one input failed (keep_going): the errors file says so
                return
            if len(arrays) != 1:
                raise InputError(f"--out {self.out}: a .npy file holds one array; this run has {len(arrays)} "
                                 "(use .npz)")
            write_output(self.out, lambda tmp: np.save(tmp, arrays[0]))
            return
        # A key is the input's stem, made unique over the whole input list (not only over this shard's
        # inputs, nor only over those that succeeded): shard outputs then never share a key, and a
        # shard's keys are those of the full run.
        names = self.paths if self.paths is not None else [p for p, _ in ok]
        key_of = dict(zip(names, stem_keys(names), strict=True))
        keys = [key_of[p] for p, _ in ok]

        def items():
            for key, (_, e) in zip(keys, ok, strict=True):
                for name, a in self.arrays_of(e).items():
                    yield (key if name == "" else f"{key}/{name}"), a
            yield "inputs", np.array([display_path(p) for p, _ in ok], dtype=str)

        write_output(self.out, lambda tmp: write_npz(tmp, items()))


def write_run_record(out, job_name: str, options: dict, entries: list) -> tuple[Path, Path | None]:
    """The manifest (``OUT.manifest.jsonl``) and errors file (``OUT.errors.tsv``) of a run whose output
    is written in one piece, not journaled input by input (``protgpu pairwise-rmsd``, ``protgpu rmsd
    --out .npy``): same format as the engine's journal, written atomically after the output.

    Parameters
    ----------
    out : str or os.PathLike
        The output the record belongs to.
    job_name : str
    options : dict
        JSON-serialisable settings of the run.
    entries : list of dict
        One per input, in input order: ``input``, ``sha256``, ``status`` (``"ok"``/``"failed"``), and
        ``rows`` (list of dict) or ``error`` (str).

    Returns
    -------
    (pathlib.Path, pathlib.Path or None)
        The manifest, and the errors file (None when no input failed; an old one is removed).
    """
    out = Path(str(out).rstrip("/"))
    manifest = out.with_name(out.name + ".manifest.jsonl")
    head = {"kind": "header", "format": MANIFEST_FORMAT, "job": job_name,
            "options": json.loads(json.dumps(options, default=str)), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    lines = [json.dumps(head)]
    for e in entries:
        line = {"kind": "input", "input": e["input"], "key": os.path.abspath(e["input"]), "sha256": e.get("sha256"),
                "status": e["status"]}
        if e["status"] == "ok":
            line["rows"] = e.get("rows", [])
        else:
            line["error"] = e.get("error", "")
        lines.append(json.dumps(line))
    text = "\n".join(lines) + "\n"
    write_output(manifest, lambda tmp: Path(tmp).write_text(text))
    failed = [(e["input"], e.get("sha256"), e.get("error", "")) for e in entries if e["status"] != "ok"]
    return manifest, write_errors(out, failed)
