"""The batch engine: many inputs -> parse (worker pool) -> batched compute -> one output, resumable.

A *job* says what to do with one input file (:class:`Job`): ``load(path)`` parses it (this runs in a
pool of worker processes or threads, overlapped with the compute), ``size(item)`` groups parsed inputs
of similar size, and ``compute(items)`` turns a list of parsed inputs into one result per input, so that
a folder of 10,000 small structures is a few hundred batched calls (one GPU launch stream), not 10,000.
Worker processes get the inputs in chunks (up to 16 per task) and should return compact items: what
crosses back is pickled, and the compute loop is one process. ``Summary.stats`` says where the time
went.
:class:`ScoreJob` (``protgpu score``) and :class:`DistancesJob` (``protgpu distances``) are the built-in
jobs; any function of a :class:`~protgpu.structure.Structure` can be one (:class:`FunctionJob`).

:func:`iter_results` yields each input's :class:`InputResult` as it finishes; :func:`run` consumes it
and returns a :class:`Summary`. With ``out=`` the results are written:

* ``OUT`` - one table of per-input rows (``.csv``, ``.jsonl``, ``.parquet`` through pyarrow) or the
  per-input arrays (``.npz``, keyed by file stem, plus ``inputs``; ``.npy`` for one input), in input
  order, atomically (temporary name in the same folder, then rename), so a reader never sees half a file;
* ``OUT.manifest.jsonl`` - the journal: a header (job and options), then one JSON line per finished
  input with its path, content sha256, status (``ok``/``failed``), its rows, or the error. A batch is
  committed by first writing its arrays (if any) to ``OUT.parts/part-*.npz`` atomically and then
  appending its lines in one write; a run killed at any moment leaves at most one torn last line, which
  the next run drops. The final output is assembled from the journal, so an interrupted run that is
  resumed writes byte for byte what an uninterrupted run writes;
* ``OUT.errors.tsv`` - with ``keep_going``, the inputs that failed and why (removed when none did).

``resume=True`` skips inputs whose latest manifest entry is ``ok`` with the same content hash (and the
same job options, checked from the header); failed inputs are tried again. ``shard=(i, n)`` keeps the
inputs whose position in the expanded input list is ``i`` modulo ``n``: the n shards partition the
inputs, and their outputs (``OUT`` becomes ``OUT-stem.shard-i-of-n.suffix``) hold together exactly the
rows of one full run.

Start-up: the parse workers are forked (on Linux, while the process runs one thread and has no GPU
library loaded; else a forkserver) and handed their first inputs before :meth:`Job.warm_up` runs, which
for the built-in jobs is where CuPy is imported and the CUDA context made (``device="auto"``): so the
workers parse while the GPU starts; they are stopped as soon as the last input is parsed.

Faults: a file that cannot be read or parsed fails that input (message names it); a parse worker
process that dies has its in-flight inputs retried once, one at a time, and one that kills a worker
again is recorded as failed; a batch whose compute fails is split in halves until the failing input is
alone (GPU out of memory: retried in halves, then a clear error for the input that does not fit alone);
a failed write (disk full, permission) raises :class:`OutputError` and leaves the previous output and
the journal valid. Without ``keep_going`` the first failure stops the run after committing what had
finished; with it, failures are recorded and the run goes on.

``scheduler=``/``workers=``/``gpus=`` run the batches on a Dask distributed cluster (an existing one, a
local one of ``workers`` processes, or dask-cuda's ``LocalCUDACluster`` with one worker per GPU): each
Dask task parses and computes one batch of inputs of similar file size; the client journals and writes
as above, so results equal a single-process run's.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import logging
import math
import multiprocessing
import os
import pickle
import sys
import threading
import time
import traceback
import uuid
import warnings
import zipfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import GPUUnavailableError, InputError, KernelCompileError, MemoryBudgetError, ProtgpuError

__all__ = [
    "ARRAY_SUFFIXES",
    "TABLE_SUFFIXES",
    "DistancesJob",
    "FunctionJob",
    "InputResult",
    "Job",
    "OutputError",
    "Result",
    "ScoreJob",
    "Summary",
    "file_sha256",
    "iter_results",
    "parse_shard",
    "run",
    "shard_path",
    "write_table",
]

TABLE_SUFFIXES = (".csv", ".jsonl", ".parquet")
ARRAY_SUFFIXES = (".npz", ".npy")
MANIFEST_FORMAT = "protgpu-batch/1"

_logger = logging.getLogger("protgpu.batch")


class OutputError(ProtgpuError, OSError):
    """An output file could not be written (disk full, permission denied, missing folder). What was
    written before stays valid: the previous output is untouched and the manifest can be resumed."""


# ----------------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------------


@dataclass
class Result:
    """What a job's compute returns for one input.

    Attributes
    ----------
    rows : list of dict
        Table rows (column name -> str, int, float or None); a multi-model file may give several.
    arrays : dict of str to np.ndarray
        Named arrays for ``.npz`` output; the name ``""`` is the input's one array (stored under the
        file's stem), other names are stored as ``stem/name``.
    """

    rows: list = field(default_factory=list)
    arrays: dict = field(default_factory=dict)


@dataclass
class InputResult:
    """The outcome for one input file.

    Attributes
    ----------
    index : int
        Position of the input in the expanded input list (before sharding).
    input : str
        The path as given (after expansion of directories, globs and lists).
    status : {"ok", "failed"}
    sha256 : str or None
        Hex digest of the file's bytes (None when the file could not be read).
    rows : list of dict
    arrays : dict of str to np.ndarray
        Empty for inputs resumed from an earlier run when :func:`run` does not need them.
    error : str or None
        Why the input failed, one line.
    resumed : bool
        True when the result was read from the manifest of an earlier run instead of computed.
    """

    index: int
    input: str
    status: str
    sha256: str | None = None
    rows: list = field(default_factory=list)
    arrays: dict = field(default_factory=dict)
    error: str | None = None
    resumed: bool = False
    _failure: _Failure | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class Summary:
    """What :func:`run` did.

    Attributes
    ----------
    n_inputs : int
        Inputs of this run (this shard's, after expansion).
    n_ok, n_failed, n_resumed : int
        Inputs that succeeded (including resumed ones), failed, and were taken from an earlier run.
    rows : list of dict
        Rows of the inputs that succeeded, in input order.
    failed : list of (str, str)
        (input, reason) of the inputs that failed, in input order.
    out, manifest, errors : pathlib.Path or None
        The output, the manifest, and the errors file (None when nothing failed or no output).
    elapsed_s : float
        Wall-clock seconds.
    stats : dict of str to float
        Where the time went, in seconds: ``hash_s`` and
        ``load_s`` summed over the parse workers (``read_s`` and ``match_s`` split ``load_s`` for
        :class:`ScoreJob`); in this process, one after the other: ``list_s`` (expanding the inputs;
        near 0 for the CLI's already expanded list), ``setup_s`` (output checks, the manifest and, with
        ``resume``, hashing the inputs), ``pool_start_s`` (starting the parse workers and handing them
        the first inputs), ``warmup_s`` (:meth:`Job.warm_up`, while the workers parse), ``submit_s``
        (handing the workers the other inputs), ``wait_s`` (the compute loop waiting for parsed
        inputs), ``compute_s`` (batched compute; :class:`ScoreJob` adds ``tm_s`` and ``lddt_s``, the
        time in its two scores, of which ``stack_s`` built host batches and ``transfer_s`` copied them
        to the GPU, and ``rows_s``), ``pool_shutdown_s`` (stopping the workers) and ``write_s``
        (journal and output). What ``elapsed_s`` holds beyond these is the loop's own bookkeeping
        (taking parsed inputs in, progress). Runs on Dask parse and compute on the workers and report
        only ``list_s``, ``setup_s`` and ``write_s``.
    """

    n_inputs: int
    n_ok: int
    n_failed: int
    n_resumed: int
    rows: list
    failed: list
    out: Path | None
    manifest: Path | None
    errors: Path | None
    elapsed_s: float
    stats: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 when every input succeeded, 1 when any failed (``--keep-going``)."""
        return 1 if self.n_failed else 0


# ----------------------------------------------------------------------------------------------------
# Failures: what went wrong with one input, picklable across processes
# ----------------------------------------------------------------------------------------------------


@dataclass
class _Failure:
    reason: str
    kind: str  # "input" (bad file), "oom", "crash" (worker died), "fatal" (stop regardless), "error" (bug)
    detail: str = ""  # traceback text for "error"
    exc: BaseException | None = None  # the live exception, only in the process that caught it

    def __getstate__(self):
        # Exceptions do not always pickle (and need not cross processes): keep the text only.
        return {**self.__dict__, "exc": None}


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, MemoryBudgetError)):
        return True
    name = type(exc).__name__
    text = str(exc).lower()
    # cupy.cuda.memory.OutOfMemoryError, torch.cuda.OutOfMemoryError, cuBLAS/CUDA status texts.
    return "outofmemory" in name.lower() or "out of memory" in text or "cuda_error_out_of_memory" in text


def _failure(exc: BaseException, path: str) -> _Failure:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    prefix = f"{path}: "
    if msg.startswith(prefix):  # the errors file has its own column for the path
        msg = msg[len(prefix):]
    if isinstance(exc, (GPUUnavailableError, KernelCompileError)):
        # not the input's fault: every input would fail the same way, so never keep going past it
        return _Failure(msg, "fatal", exc=exc)
    if _is_oom(exc):
        return _Failure(f"out of memory ({type(exc).__name__}: {msg})", "oom", exc=exc)
    if isinstance(exc, InputError):
        return _Failure(msg, "input", exc=exc)
    if isinstance(exc, OSError):
        why = exc.strerror or msg
        return _Failure(f"cannot read ({why})", "input", exc=exc)
    detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return _Failure(f"{type(exc).__name__}: {msg}", "error", detail=detail, exc=exc)


def _raise_for(r: InputResult):
    """Stop the run for a failed input (no keep_going): a one-line error naming the file."""
    f = r._failure or _Failure(r.error or "failed", "input")
    if f.kind in ("fatal", "error") and f.exc is not None:
        if hasattr(f.exc, "add_note"):
            f.exc.add_note(f"while processing {r.input}")
        raise f.exc
    if f.kind == "input" and isinstance(f.exc, InputError) and os.path.basename(r.input) in str(f.exc):
        raise f.exc  # its message already names the file
    if f.kind == "oom":
        raise MemoryBudgetError(f"{r.input}: {f.reason}; it does not fit even alone in a batch")
    if f.kind == "error":
        raise RuntimeError(f"{r.input}: {f.reason}\n{f.detail}")
    raise InputError(f"{r.input}: {f.reason}")


# ----------------------------------------------------------------------------------------------------
# Jobs
# ----------------------------------------------------------------------------------------------------


class Job:
    """What to do with each input. Subclass and override :meth:`load`, :meth:`size` and :meth:`compute`
    (or :meth:`compute_one`).

    Instances are pickled to parse workers and Dask workers, so keep them to plain attributes (a loaded
    reference Structure is fine; open files and GPU arrays are not).

    Attributes
    ----------
    name : str
        Job name, recorded in the manifest.
    batch_size : int
        Most inputs handed to one :meth:`compute` call.
    columns : list of str or None
        Table columns, in order; None means every key of the rows in order of first appearance.
    """

    name: str = "job"
    batch_size: int = 64
    columns: list | None = None

    def options(self) -> dict:
        """JSON-serialisable settings that change results; ``resume`` refuses a manifest whose header
        holds different ones."""
        return {}

    def load(self, path: str):
        """Parse one input (runs in a parse worker). Raise :class:`InputError` naming ``path`` for a
        bad file."""
        from .io import load

        return load(path)

    def size(self, item) -> object:
        """A hashable key: parsed inputs with equal keys are batched together (e.g. a length bucket)."""
        return 0

    def compute(self, items: list) -> list:
        """One result per parsed input, in order: a :class:`Result`, a dict (one row), a list of dicts,
        an array (the input's array), or None (nothing)."""
        return [self.compute_one(it) for it in items]

    def compute_one(self, item):
        """The result of one parsed input (used by the default :meth:`compute`)."""
        raise NotImplementedError(f"{type(self).__name__} defines neither compute nor compute_one")

    def warm_up(self) -> None:
        """Called once in the computing process right after the first inputs went to the parse
        workers: prepare what :meth:`compute` needs (a GPU context, kernels, reference data) while the
        workers start. Errors should be left for the inputs to meet."""


def _warm_device(device: str, on_gpu: Callable[[], object] | None = None) -> bool | None:
    """The device part of a built-in job's :meth:`Job.warm_up`: decide ``device`` and, on the GPU, call
    ``on_gpu`` (a small computation that creates the CUDA context and loads the job's kernels).

    For ``device="auto"`` this is where CuPy is imported and a GPU looked for: the engine calls warm-ups
    once its parse workers have started, so they are still forked (see :func:`_fork_is_safe`); a job
    (or the CLI) that decided ``auto`` before the run would have them come from a forkserver instead.
    Errors (``device="gpu"`` without a GPU, a kernel that does not build) are swallowed: the first
    batch meets them again and stops the run with a one-line error naming its input.

    Parameters
    ----------
    device : {"auto", "cpu", "gpu"}
    on_gpu : callable, optional
        Called with no argument when the work runs on the GPU.

    Returns
    -------
    bool or None
        Whether the job's work runs on the GPU; None when deciding failed.
    """
    from ._array import dispatch

    try:
        gpu = dispatch(device=device).on_gpu
    except Exception:  # the inputs will meet it again and report it properly
        return None
    if gpu and on_gpu is not None:
        with contextlib.suppress(Exception):
            on_gpu()
    return gpu


def _select(s, select: str | None, path: str):
    if not select:
        return s
    out = s.select(select)
    if out.n_atoms == 0:  # select() may already have said so; name the file either way
        raise InputError(f"{path}: selection {select!r} matches no atom")
    return out


class FunctionJob(Job):
    """A job from a function of one loaded :class:`~protgpu.structure.Structure`.

    Parameters
    ----------
    fn : callable
        ``fn(structure)`` -> dict (one row), list of dicts, :class:`Result`, array or None. Runs in the
        calling process (so a lambda is fine).
    load : callable, optional
        ``load(path)`` -> item handed to ``fn``; default ``protgpu.load(path, top=top)`` then ``select``.
        Must be picklable (a module-level function) for a process pool; otherwise threads parse.
    top, select : optional
        Topology for trajectory inputs and an atom selection, for the default loader.
    name : str
    batch_size : int
    options : dict, optional
        Recorded in the manifest; resuming with different options is refused.
    """

    def __init__(self, fn: Callable, *, load: Callable | None = None, top=None, select: str | None = None,
                 name: str | None = None, batch_size: int = 64, options: dict | None = None):
        self.fn = fn
        self._load = load
        self.top = None if top is None else str(top)
        self.select = select
        self.name = name or getattr(fn, "__name__", "function")
        self.batch_size = int(batch_size)
        self._options = dict(options or {})

    def options(self) -> dict:
        return {"function": self.name, "top": self.top, "select": self.select, **self._options}

    def load(self, path: str):
        if self._load is not None:
            return self._load(path)
        from .io import load

        return _select(load(path, top=self.top), self.select, path)

    def compute_one(self, item):
        return self.fn(item)


def _length_bucket(n: int) -> int:
    """Round a length up to 32, 48, 64, 96, 128, 192, ...: batches of similar length waste at most a
    third of their padding."""
    b = 32
    while b < n:
        b = b * 3 // 2 if (b & (b - 1)) == 0 else (b // 3) * 4
    return b


class ScoreJob(Job):
    """TM-score, RMSD, GDT-TS/GDT-HA, MaxSub and lDDT of every model file against one reference.

    One row per model (per frame of a multi-model file): ``model`` (file name, ``name[i]`` for frame i),
    then the metrics asked for, as :func:`protgpu.tm_score` and :func:`protgpu.lddt` compute them.
    :meth:`load` (in a parse worker) reads a model and matches it to the reference there, keeping only
    the arrays the scores read (:class:`~protgpu.scoring._batch.PreparedModel`: matched CA pairs and the
    model on the reference's lDDT atoms); matches are cached per distinct atom table, so the many models
    of one target are matched once per worker. Models are batched by residue count, each batch scored
    with one TM-score search and one lDDT launch on the stacked arrays (the lDDT reference pairs are
    built once per job, not per batch).

    Parameters
    ----------
    reference : str, os.PathLike or Structure
        The native structure (one frame).
    metrics : sequence of {"tm", "lddt", "gdt", "rmsd"}
    mapping : {"resnum", "sequence"}
    normalize_by : {"reference", "model"} or float
    lddt_atoms : {"heavy", "ca"}
    symmetry : bool
        lDDT resolves symmetric side-chain atoms.
    per_residue : bool
        Add per-residue lDDT columns ``lddt:<chain>:<resid>`` to the table.
    keep_per_residue : bool
        Keep the per-residue values in the rows (for a plot) without making them table columns.
    select : str, optional
        Atom selection applied to the reference and every model.
    top : str, optional
        Topology for trajectory models (every frame is scored).
    device : {"auto", "cpu", "gpu"}
    batch_size : int
    """

    name = "score"

    def __init__(self, reference, *, metrics=("tm", "lddt", "gdt", "rmsd"), mapping: str = "resnum",
                 normalize_by="reference", lddt_atoms: str = "heavy", symmetry: bool = True,
                 per_residue: bool = False, keep_per_residue: bool = False, select: str | None = None,
                 top=None, device: str = "auto", batch_size: int = 256):
        from .io import load
        from .scoring import lddt_residue_labels

        bad = [m for m in metrics if m not in ("tm", "lddt", "gdt", "rmsd")]
        if bad or not metrics:
            raise InputError(f"metrics {list(metrics)!r}: choose from tm, lddt, gdt, rmsd")
        if not isinstance(mapping, str) or mapping not in ("resnum", "sequence"):
            raise InputError(f"mapping {mapping!r}: use resnum or sequence")
        if lddt_atoms not in ("heavy", "ca"):
            raise InputError(f"lddt_atoms {lddt_atoms!r}: use heavy or ca")
        self.metrics = tuple(metrics)
        self.mapping = mapping
        self.normalize_by = normalize_by
        self.lddt_atoms = lddt_atoms
        self.symmetry = bool(symmetry)
        self.per_residue = bool(per_residue)
        self.select = select
        self.top = None if top is None else str(top)
        self.device = device
        self.batch_size = int(batch_size)
        self.reference_sha256 = None
        if isinstance(reference, (str, os.PathLike)):
            self.reference_name = str(reference)
            self.reference_sha256 = file_sha256(reference) if os.path.isfile(reference) else None
        else:
            self.reference_name = str(getattr(reference, "source", None) or "reference")
        self.reference = _select(load(reference), select, self.reference_name)
        self.want_tm = any(m in self.metrics for m in ("tm", "gdt", "rmsd"))
        self.want_lddt = "lddt" in self.metrics or self.per_residue or keep_per_residue
        self.residue_labels = lddt_residue_labels(self.reference) if self.want_lddt else []
        # per-residue values go into the rows only when asked for: R more values per row to journal
        self.rows_per_residue = self.per_residue or bool(keep_per_residue)
        self.tm_fields = ([f for m, f in (("tm", "tm"), ("rmsd", "rmsd")) if m in self.metrics]
                          + (["gdt_ts", "gdt_ha", "maxsub"] if "gdt" in self.metrics else []))
        columns = ["model"] + self.tm_fields + (["n_aligned"] if self.want_tm else [])
        if "lddt" in self.metrics:
            columns.append("lddt")
        if self.per_residue:
            columns += [f"lddt:{lab}" for lab in self.residue_labels]
        self.columns = columns
        self.stats: dict = {}  # seconds by step, added up by compute (this process)
        self._caches: dict = {}  # prepared reference, lDDT reference pairs: built where needed

    def __getstate__(self):
        # the caches hold device arrays and are cheap to rebuild: workers start without them
        return {**self.__dict__, "_caches": {}, "stats": {}}

    def options(self) -> dict:
        return {"reference": os.path.basename(self.reference_name), "reference_sha256": self.reference_sha256,
                "metrics": list(self.metrics), "mapping": self.mapping, "normalize_by": self.normalize_by,
                "lddt_atoms": self.lddt_atoms, "symmetry": self.symmetry, "per_residue": self.per_residue,
                "select": self.select, "top": self.top}

    def _prepared_reference(self):
        from .scoring._batch import PreparedReference

        ref = self._caches.get("prepared")
        if ref is None:
            ref = self._caches["prepared"] = PreparedReference(self.reference)
        return ref

    def _prepare(self, s):
        from .scoring._batch import prepare_model

        return prepare_model(s, self._prepared_reference(), mapping=self.mapping, tm=self.want_tm,
                             lddt_atoms=self.lddt_atoms if self.want_lddt else None)

    def load(self, path: str):
        """Read one model file and match it to the reference: a
        :class:`~protgpu.scoring._batch.PreparedModel` (its ``timings`` say how long each step took)."""
        from .io import load

        t0 = time.perf_counter()
        s = _select(load(path, top=self.top), self.select, path)
        read_s = time.perf_counter() - t0
        item = self._prepare(s)
        item.timings["read_s"] = read_s
        return item

    def size(self, item) -> object:
        return _length_bucket(item.n_residues)

    def _add(self, key: str, seconds: float) -> None:
        self.stats[key] = self.stats.get(key, 0.0) + seconds

    def warm_up(self) -> None:
        """Build the lDDT reference pairs; on the GPU also score the reference against itself once,
        which creates the CUDA context, loads the kernels and puts the pair lists on the device. With
        ``device="auto"`` this is also where the device is decided (importing CuPy when there is a
        GPU): the engine calls it after its parse workers started."""
        saved = dict(self.stats)
        try:
            on_gpu = _warm_device(self.device, lambda: self.compute([self.reference]))
            if on_gpu is False and self.want_lddt:  # (None: no device, the first batch says why)
                self._lddt_reference()
        except Exception:  # the inputs will meet it again and report it properly
            pass
        finally:
            self.stats = saved

    def compute(self, items: list) -> list:
        from .scoring import _batch as sb
        from .scoring import tm_score

        # Structures are accepted too (a caller's own loop); the engine hands over prepared models
        items = [it if isinstance(it, sb.PreparedModel) else self._prepare(it) for it in items]
        names = [it.names for it in items]
        rows = [{"model": n} for ns in names for n in ns]
        timers0 = dict(sb.timers)
        if self.want_tm:
            t0 = time.perf_counter()
            r = tm_score(items, self.reference, normalize_by=self.normalize_by, mapping=self.mapping,
                         device=self.device)
            self._add("tm_s", time.perf_counter() - t0)
            for f in [*self.tm_fields, "n_aligned"]:
                for row, v in zip(rows, np.asarray(getattr(r, f)).reshape(-1).tolist(), strict=True):
                    row[f] = v
        if self.want_lddt:
            t0 = time.perf_counter()
            g, per = self._lddt(items)
            self._add("lddt_s", time.perf_counter() - t0)
            t0 = time.perf_counter()
            cols = [f"lddt:{lab}" for lab in self.residue_labels] if self.rows_per_residue else []
            per_rows = per.tolist() if cols else [()] * len(rows)
            for row, gv, pv in zip(rows, g.reshape(-1).tolist(), per_rows, strict=True):
                if "lddt" in self.metrics:
                    row["lddt"] = gv
                row.update(zip(cols, pv, strict=True))
            self._add("rows_s", time.perf_counter() - t0)
        for k, v in sb.timers.items():  # stack_s, transfer_s: parts of tm_s and lddt_s
            self._add(k, v - timers0.get(k, 0.0))
        out, k = [], 0
        for ns in names:
            out.append(Result(rows=rows[k:k + len(ns)]))
            k += len(ns)
        return out

    def _lddt_reference(self):
        """(LDDTReference, reference ResidueInfo, scored reference atoms), built once per job with
        :func:`protgpu.lddt`'s default inclusion radius (15 A)."""
        from .scoring.lddt import _structure_reference

        key = ("lddt", self.lddt_atoms)
        if key not in self._caches:
            self._caches[key] = _structure_reference(self.reference, self.lddt_atoms, 15.0)
        return self._caches[key]

    def _lddt(self, items: list) -> tuple[np.ndarray, np.ndarray]:
        """Global (M,) and per-residue (M, R) lDDT of prepared models, as :func:`protgpu.lddt` computes
        them (its default thresholds and inclusion radius), with the reference's pair lists built once
        per job instead of once per batch (and kept on the device between batches)."""
        from ._array import dispatch, to_numpy
        from .scoring import _batch as sb
        from .scoring.lddt import lddt_counts_cuda, lddt_counts_numpy, lddt_scores

        thresholds = (0.5, 1.0, 2.0, 4.0)
        be = dispatch(*items, self.reference, device=self.device)
        ref, info, ref_atoms = self._lddt_reference()
        groups, _ = sb.collect_models(items, self.reference)
        batch = sb.atom_batch(groups, self.reference, info, ref_atoms, self.mapping, be,
                              sb.work_dtype(items, self.reference))
        if be.on_gpu:
            counts = lddt_counts_cuda(batch.coords, ref, thresholds, self.symmetry)
        else:
            counts = lddt_counts_numpy(batch.coords.astype(np.float64), ref, thresholds, self.symmetry)
        glob, per = lddt_scores(counts, ref, len(thresholds), be.xp)
        return to_numpy(glob), to_numpy(per)


class DistancesJob(Job):
    """All-atom (or selected) distance matrices of every input, float32 Angstrom, one array per input.

    Inputs with the same atom count (and no periodic box) are stacked into one
    :func:`protgpu.distances` call of at most ``max_batch_bytes`` of output.

    Parameters
    ----------
    select : str, optional
    top : str, optional
        Topology for trajectory inputs.
    periodic : bool
        Minimum-image distances with each input's box (an input without a box fails).
    summary : bool
        Put frames, atoms and the smallest non-zero / largest distance in each input's row.
    device : {"auto", "cpu", "gpu"}
    batch_size : int
    max_batch_bytes : int
        Largest stacked output of one call.
    """

    name = "distances"

    def __init__(self, *, select: str | None = None, top=None, periodic: bool = False, summary: bool = False,
                 device: str = "auto", batch_size: int = 64, max_batch_bytes: int = 1 << 28):
        self.select = select
        self.top = None if top is None else str(top)
        self.periodic = bool(periodic)
        self.summary = bool(summary)
        self.device = device
        self.batch_size = int(batch_size)
        self.max_batch_bytes = int(max_batch_bytes)

    def options(self) -> dict:
        return {"select": self.select, "top": self.top, "periodic": self.periodic}

    def load(self, path: str):
        from .io import load

        s = _select(load(path, top=self.top), self.select, path)
        if self.periodic and s.box is None:
            raise InputError(f"{path}: --periodic given but the file has no box")
        return {"coords": s.coords, "box": s.box if self.periodic else None}

    def size(self, item) -> object:
        return (item["coords"].shape[1], item["box"] is not None)

    def warm_up(self) -> None:
        """Decide ``device="auto"`` once the engine's parse workers have started (:func:`_warm_device`);
        on the GPU also compute one 2-atom matrix, which creates the CUDA context and loads the
        distance kernel (every box mode runs the same kernel) while the workers parse."""
        from .distances import distances

        _warm_device(self.device, lambda: distances(np.zeros((1, 2, 3), np.float32), device=self.device))

    def compute(self, items: list) -> list:
        from .distances import distances

        out: list = [None] * len(items)
        i = 0
        while i < len(items):
            c = items[i]["coords"]
            if items[i]["box"] is not None:
                out[i] = distances(c, box=items[i]["box"], device=self.device)
                i += 1
                continue
            # stack the run of inputs with this atom count, up to the byte budget
            per_frame = 4 * c.shape[1] ** 2
            j, frames = i, 0
            while (j < len(items) and items[j]["box"] is None and items[j]["coords"].shape[1] == c.shape[1]
                   and (j == i or (frames + items[j]["coords"].shape[0]) * per_frame <= self.max_batch_bytes)):
                frames += items[j]["coords"].shape[0]
                j += 1
            stack = c if j == i + 1 else np.concatenate([it["coords"] for it in items[i:j]])
            d = distances(stack, device=self.device)
            f0 = 0
            for k in range(i, j):
                n = items[k]["coords"].shape[0]
                out[k] = d[f0:f0 + n]
                f0 += n
            i = j
        results = []
        for d in out:
            row = {}
            if self.summary:
                pos = d[d > 0]
                row = {"frames": int(d.shape[0]), "atoms": int(d.shape[1]),
                       "min": float(pos.min()) if pos.size else 0.0, "max": float(d.max()) if d.size else 0.0}
            results.append(Result(rows=[row] if row else [], arrays={"": d}))
        return results


def _as_job(job) -> Job:
    if isinstance(job, Job):
        return job
    if callable(job):
        return FunctionJob(job)
    raise InputError(f"job must be a protgpu.batch.Job or a function of a Structure, got {type(job).__name__}")


# ----------------------------------------------------------------------------------------------------
# Small helpers: hashing, shards, value normalisation
# ----------------------------------------------------------------------------------------------------


def file_sha256(path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes (the manifest's content hash).

    Parameters
    ----------
    path : str or os.PathLike
    chunk : int
        Read size, bytes.

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
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            b = fh.read(chunk)
            if not b:
                break
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


def _plain(v):
    """A value as JSON stores it exactly: Python scalars, NaN/inf -> None, arrays -> lists."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return v if math.isfinite(v) else None
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, str):
        return v
    return str(v)


def _as_result(out) -> Result:
    if out is None:
        return Result()
    if isinstance(out, Result):
        rows, arrays = out.rows, out.arrays
    elif isinstance(out, dict):
        rows, arrays = [out], {}
    elif isinstance(out, (list, tuple)) and all(isinstance(r, dict) for r in out):
        rows, arrays = list(out), {}
    elif hasattr(out, "shape"):
        rows, arrays = [], {"": out}
    else:
        raise TypeError("a job's result must be a Result, dict, list of dicts, array or None, "
                        f"not {type(out).__name__}")
    from ._array import to_numpy

    # np.asarray(order="C"), not np.ascontiguousarray: the latter makes a 0-d array (a scalar result)
    # one-dimensional, and the stored array must keep the shape the job returned
    return Result(rows=[{str(k): _plain(v) for k, v in r.items()} for r in rows],
                  arrays={str(k): np.asarray(to_numpy(a), order="C") for k, a in arrays.items()})


# ----------------------------------------------------------------------------------------------------
# Parsing (in workers) and computing (in batches)
# ----------------------------------------------------------------------------------------------------

_WORKER_JOB: Job | None = None


def _install_job(job_bytes: bytes, owner: int) -> None:
    """Process-pool initializer: the job is unpickled once per worker, not once per input; and a watch
    on the process that owns the pool, since a pool worker whose owner was SIGKILLed would otherwise
    wait for work forever (a forked worker is orphaned; a forkserver's worker has the server as its
    parent, which outlives the owner)."""
    global _WORKER_JOB
    _WORKER_JOB = pickle.loads(job_bytes)

    def watch():
        while True:
            time.sleep(0.5)
            try:
                os.kill(owner, 0)
            except ProcessLookupError:
                os._exit(0)
            except OSError:
                pass

    threading.Thread(target=watch, name="protgpu-owner-watch", daemon=True).start()


def _parse_one(job: Job, index: int, path: str, times: dict | None = None):
    """(index, sha256, parsed item, None) or (index, sha256 or None, None, _Failure); adds the seconds
    spent hashing and loading to ``times``."""
    sha = None
    t0 = time.perf_counter()
    try:
        sha = file_sha256(path)
        t1 = time.perf_counter()
        item = job.load(path)
    except Exception as exc:  # recorded per input; the engine decides whether to stop
        return index, sha, None, _failure(exc, path)
    if times is not None:
        t2 = time.perf_counter()
        times["hash_s"] = times.get("hash_s", 0.0) + (t1 - t0)
        times["load_s"] = times.get("load_s", 0.0) + (t2 - t1)
    return index, sha, item, None


def _parse_chunk(job: Job, chunk: list) -> tuple[list, dict]:
    """Parse a chunk of (index, path): one task per chunk, so that the pool's per-task cost (pickling,
    queues, a future) is paid once per chunk and not once per small file."""
    times: dict = {}
    return [_parse_one(job, index, path, times) for index, path in chunk], times


def _parse_in_worker(index: int, path: str):
    return _parse_one(_WORKER_JOB, index, path)


def _parse_chunk_in_worker(chunk: list) -> tuple[list, dict]:
    return _parse_chunk(_WORKER_JOB, chunk)


@dataclass
class _Parsed:
    index: int
    path: str
    sha256: str | None
    item: object


def _free_gpu_memory() -> None:
    cp = sys.modules.get("cupy")
    if cp is not None:
        with contextlib.suppress(Exception):
            cp.get_default_memory_pool().free_all_blocks()
            cp.get_default_pinned_memory_pool().free_all_blocks()


def _compute_group(job: Job, entries: list[_Parsed], log: Callable[[str], None]) -> list[InputResult]:
    """Compute one batch; on failure split it in halves until the failing input is alone."""
    try:
        outs = job.compute([e.item for e in entries])
        if len(outs) != len(entries):
            raise RuntimeError(f"{job.name}: compute returned {len(outs)} results for {len(entries)} inputs")
        results = [_as_result(o) for o in outs]
    except Exception as exc:
        f = _failure(exc, entries[0].path if len(entries) == 1 else "")
        if f.kind == "fatal":
            raise
        if len(entries) == 1:
            e = entries[0]
            return [InputResult(e.index, e.path, "failed", e.sha256, error=f.reason, _failure=f)]
        if f.kind == "oom":
            _free_gpu_memory()
            log(f"{job.name}: out of memory with a batch of {len(entries)}; retrying in halves")
        mid = len(entries) // 2
        return _compute_group(job, entries[:mid], log) + _compute_group(job, entries[mid:], log)
    return [InputResult(e.index, e.path, "ok", e.sha256, rows=r.rows, arrays=r.arrays)
            for e, r in zip(entries, results, strict=True)]


def _failed(index: int, path: str, sha, f: _Failure) -> InputResult:
    return InputResult(index, path, "failed", sha, error=f.reason, _failure=f)


def _default_jobs() -> int:
    """Parse workers by default: every CPU this process may run on (at most 32). The compute loop
    shares a CPU with them, but it mostly waits (for the GPU, or for parsed inputs)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(32, n))


# Modules whose presence means this process may have started CUDA (or a library's thread pool that a
# forked child would inherit in a locked state): parse workers are then not forked.
_NO_FORK_MODULES = ("cupy", "cuda", "torch", "nvmath", "numba", "jax", "tensorflow", "pycuda")


def _fork_is_safe() -> bool:
    """Whether parse workers may be forked from this process: on Linux, while it runs a single Python
    thread and has not imported a GPU library. A forked worker starts in about a millisecond and
    inherits every module already imported, where a forkserver costs a fresh interpreter (~0.5 s,
    before the first worker exists) and a spawned worker re-imports everything; but a child forked
    after CUDA was initialised, or while another thread held a lock, can hang. The CLI starts its pool
    before the job's warm-up imports CuPy, so it forks."""
    if not sys.platform.startswith("linux") or "fork" not in multiprocessing.get_all_start_methods():
        return False
    if threading.active_count() > 1:
        return False
    return not any(m in sys.modules for m in _NO_FORK_MODULES)


def _start_method(start_method: str | None) -> str:
    """The parse pool's start method: the caller's, else ``$PROTGPU_BATCH_START_METHOD``, else fork when
    :func:`_fork_is_safe`, else forkserver (spawn where there is none)."""
    if start_method:
        return start_method
    env = os.environ.get("PROTGPU_BATCH_START_METHOD")
    if env:
        return env
    if _fork_is_safe():
        return "fork"
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _mp_context(start_method: str | None):
    start_method = _start_method(start_method)
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        # imported once in the server, inherited by every worker it forks
        ctx.set_forkserver_preload(["numpy", "protgpu.io", "protgpu.batch", "protgpu.scoring._batch"])
    return ctx


class _Parser:
    """Parses inputs in a process pool, a thread pool, or inline; survives dying worker processes."""

    def __init__(self, job: Job, kind: str, n: int, start_method: str | None, log, job_bytes: bytes | None = None):
        self.job, self.kind, self.n, self.log = job, kind, n, log
        self.executor = self._solo = None
        self.start_method_arg = start_method
        self.start_method = None  # of the current process pool
        self.closed = False
        self._joining: list = []
        if kind == "process":
            self.job_bytes = pickle.dumps(job) if job_bytes is None else job_bytes
        self._start()

    def _context(self):
        # decided at each pool start: a pool restarted after the job's warm-up (CuPy loaded) is not forked
        ctx = _mp_context(self.start_method_arg)
        self.start_method = ctx.get_start_method()
        return ctx

    def _start(self):
        if self.kind == "process":
            self.executor = ProcessPoolExecutor(self.n, mp_context=self._context(), initializer=_install_job,
                                                initargs=(self.job_bytes, os.getpid()))
        elif self.kind == "thread":
            self.executor = ThreadPoolExecutor(self.n, thread_name_prefix="protgpu-parse")

    def submit(self, chunk: list):
        """Parse a list of (index, path) in one task; its future gives ``_parse_chunk``'s result."""
        if self.kind != "process":
            return self.executor.submit(_parse_chunk, self.job, chunk)
        if self.start_method != "fork":
            return self.executor.submit(_parse_chunk_in_worker, chunk)
        with warnings.catch_warnings():  # a forking pool forks all its workers at its first task
            # Python 3.12+ warns about fork() whenever the process has other OS threads, and NumPy's
            # BLAS always starts some (idle, and fork-safe through its atfork handlers); _fork_is_safe
            # has checked this process's own threads
            warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)
            return self.executor.submit(_parse_chunk_in_worker, chunk)

    def restart(self):
        self.executor.shutdown(wait=False, cancel_futures=True)
        self._start()

    def isolated(self, index: int, path: str):
        """Parse one input alone in a single-worker pool; None when that worker dies too."""
        if self._solo is None:
            self._solo = ProcessPoolExecutor(1, mp_context=_mp_context(self.start_method_arg),
                                             initializer=_install_job, initargs=(self.job_bytes, os.getpid()))
        try:
            return self._solo.submit(_parse_in_worker, index, path).result()
        except BrokenProcessPool:
            self._solo.shutdown(wait=False, cancel_futures=True)
            self._solo = None
            return None

    def close(self, wait: bool = True):
        """Stop the workers. ``wait=False`` (every input parsed, the compute still running) lets idle
        workers exit in the background instead of holding up the run; a later ``close()`` joins them."""
        self.closed = True
        for ex in (self.executor, self._solo):
            if ex is not None:
                # shutdown(wait=False) forgets the thread that joins the workers: keep it to join later
                self._joining.append(getattr(ex, "_executor_manager_thread", None))
                ex.shutdown(wait=wait, cancel_futures=True)
        if wait:
            for t in self._joining:
                if t is not None:
                    t.join()
            self._joining = []


def _add_times(stats: dict, times) -> None:
    for k, v in (times or {}).items():
        stats[k] = stats.get(k, 0.0) + v


def _chunk_size(kind: str, n_inputs: int, jobs: int) -> int:
    """Inputs per parse task: up to 16 for processes (IPC per task costs about as much as hashing a
    small file), fewer when there are few inputs so that every worker gets some; 1 for threads."""
    if kind != "process":
        return 1
    return max(1, min(16, n_inputs // (4 * jobs)))


def _iter_local(job: Job, todo: list, *, jobs: int, pool: str, start_method, batch_size: int,
                log, stats: dict | None = None) -> Iterator[list[InputResult]]:
    """Yield lists of results, one list per computed batch (plus lists of parse failures).

    ``stats`` (if given) receives seconds: ``hash_s``/``load_s`` (parse work, summed over workers),
    whatever the parsed items report in a ``timings`` dict, ``pool_start_s`` (starting the parse pool
    and handing it its first inputs), ``submit_s`` (handing it the others), ``warmup_s``, ``wait_s``
    (waiting for parse results), ``compute_s`` (the job's compute) and ``pool_shutdown_s``.
    """
    stats = {} if stats is None else stats

    def add_time(key: str, t0: float) -> None:
        stats[key] = stats.get(key, 0.0) + time.perf_counter() - t0

    t_start = time.perf_counter()
    job_bytes = None
    if pool == "process":
        try:
            job_bytes = pickle.dumps(job)
        except Exception:  # a lambda inside the job: threads can still parse
            log(f"{job.name}: the job cannot be pickled for worker processes; parsing in threads")
            pool = "thread"
    parser = _Parser(job, pool, jobs, start_method, log, job_bytes) if pool != "inline" else None
    queue = deque(todo)
    in_flight: dict = {}  # future -> its chunk of (index, path)
    n_in_flight = 0
    groups: dict = {}
    n_buffered = 0
    chunk = _chunk_size(pool, len(todo), jobs)
    # parsed ahead while a batch computes (the overlap): three chunks per worker keep each one busy
    # through a batch's compute, when no new chunk is submitted
    ahead = max(3 * jobs * chunk, batch_size)
    max_buffer = 2 * batch_size
    # The job's warm-up (in a fresh process: importing CuPy, a CUDA context, kernels; a second or more)
    # holds up the compute loop, but not the workers: they are handed more inputs before it
    has_warm_up = type(job).warm_up is not Job.warm_up
    warm_ahead = _warmup_prefetch(todo, ahead) if parser is not None and has_warm_up else ahead

    def add(res):
        nonlocal n_buffered
        index, sha, item, fail = res
        path = paths[index]
        if fail is None:
            _add_times(stats, getattr(item, "timings", None))
            try:
                key = job.size(item)
            except Exception as exc:
                fail = _failure(exc, path)
        if fail is not None:
            return [_failed(index, path, sha, fail)]
        groups.setdefault(key, []).append(_Parsed(index, path, sha, item))
        n_buffered += 1
        return []

    def flush(key) -> list[InputResult]:
        nonlocal n_buffered
        group = groups[key]
        entries, rest = group[:batch_size], group[batch_size:]
        if rest:
            groups[key] = rest
        else:
            del groups[key]
        n_buffered -= len(entries)
        t0 = time.perf_counter()
        out = _compute_group(job, entries, log)
        add_time("compute_s", t0)
        return out

    warmed = False

    def warm_up():
        nonlocal warmed
        warmed = True
        t0 = time.perf_counter()
        job.warm_up()
        add_time("warmup_s", t0)

    if parser is not None:
        add_time("pool_start_s", t_start)

    paths = dict(todo)
    try:
        while queue or in_flight or groups:
            # a full group, a full buffer, or nothing more to parse: compute
            full = next((k for k, g in groups.items() if len(g) >= batch_size), None)
            if full is None and groups:
                if not queue and not in_flight:  # everything parsed: drain, lowest input first
                    full = min(groups, key=lambda k: groups[k][0].index)
                elif n_buffered >= max_buffer:  # memory bound reached before any group filled
                    full = max(groups, key=lambda k: len(groups[k]))
            if full is not None:
                yield flush(full)
                continue
            if parser is None:
                if not warmed:
                    warm_up()
                index, path = queue.popleft()
                failed = add(_parse_one(job, index, path, stats))
                if failed:
                    yield failed
                continue
            t0 = time.perf_counter()
            limit = ahead if warmed else warm_ahead
            broken = False
            while queue and n_in_flight < limit and n_buffered + n_in_flight < max_buffer + limit:
                part = [queue.popleft() for _ in range(min(chunk, len(queue)))]
                try:
                    in_flight[parser.submit(part)] = part  # the first submit forks the workers
                except BrokenProcessPool:  # a worker died since the last results came in
                    queue.extendleft(reversed(part))
                    broken = True
                    break
                n_in_flight += len(part)
            add_time("submit_s" if warmed else "pool_start_s", t0)
            if broken:
                failed = _recover(parser, in_flight, add, log)
                n_in_flight = 0
                if failed:
                    yield failed
                continue
            if not warmed:  # while the workers start and parse the first chunks
                warm_up()
            t0 = time.perf_counter()
            done, _ = wait(list(in_flight), return_when=FIRST_COMPLETED)
            add_time("wait_s", t0)
            failed: list = []
            broken = False
            for fut in done:
                try:
                    results, times = fut.result()
                except BrokenProcessPool:
                    broken = True
                    continue
                n_in_flight -= len(in_flight.pop(fut))
                _add_times(stats, times)
                for res in results:
                    failed += add(res)
            if broken:
                failed += _recover(parser, in_flight, add, log)
                n_in_flight = 0
            if not queue and not in_flight and not parser.closed:
                # every input parsed: the workers go while the last batches compute
                t0 = time.perf_counter()
                parser.close(wait=False)
                add_time("pool_shutdown_s", t0)
            if failed:
                yield failed
    finally:
        if parser is not None:
            t0 = time.perf_counter()
            parser.close()
            add_time("pool_shutdown_s", t0)


def _warmup_prefetch(todo: list, ahead: int) -> int:
    """Inputs handed to the parse workers before the job's warm-up: at least ``ahead``, else as many as
    fit in ``$PROTGPU_BATCH_PREFETCH_MB`` (default 1024) MiB of input files, judged from the sizes of the
    first 16 (parsed items are smaller than their files: a PDB's text is ~7x its coordinates)."""
    try:
        budget = float(os.environ.get("PROTGPU_BATCH_PREFETCH_MB") or 1024) * 2**20
    except ValueError:
        budget = 1024 * 2**20
    sizes = []
    for _, p in todo[:16]:
        with contextlib.suppress(OSError):
            sizes.append(os.path.getsize(p))
    mean = max(sum(sizes) / len(sizes), 1.0) if sizes else 1 << 20
    return max(ahead, min(len(todo), int(budget // mean)))


def _recover(parser: _Parser, in_flight: dict, add, log) -> list[InputResult]:
    """A parse worker died: every input of every chunk in flight is a suspect; retry each once, alone."""
    suspects, failed = [], []
    for fut, part in list(in_flight.items()):
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            for res in fut.result()[0]:
                failed += add(res)
        else:
            suspects += part
    in_flight.clear()
    parser.restart()
    log(f"a parse worker process died; retrying {len(suspects)} input(s) one at a time")
    for index, path in sorted(suspects):
        res = parser.isolated(index, path)
        if res is None:
            f = _Failure("the worker process parsing it died, also when retried alone", "crash")
            failed.append(_failed(index, path, None, f))
        else:
            failed += add(res)
    return failed


# ----------------------------------------------------------------------------------------------------
# Dask
# ----------------------------------------------------------------------------------------------------


def _dask_batch(job: Job, items: list) -> list[InputResult]:
    """One Dask task: parse and compute a batch of (index, path) on a worker."""
    out, entries = [], []
    for index, path in items:
        i, sha, item, fail = _parse_one(job, index, path)
        if fail is not None:
            out.append(_failed(index, path, sha, fail))
        else:
            entries.append(_Parsed(index, path, sha, item))
    if entries:
        out += _compute_group(job, entries, _logger.warning)
    for r in out:  # exceptions stay on the worker; the text travels
        if r._failure is not None:
            r._failure.exc = None
    return out


@contextlib.contextmanager
def _dask_client(scheduler: str | None, workers: int | None, gpus):
    try:
        import dask
        from distributed import Client, LocalCluster
    except ImportError:
        raise InputError("running on Dask needs dask[distributed]: pip install 'protgpu[dask]'") from None
    if sum(x is not None for x in (scheduler, workers, gpus)) > 1:
        raise InputError("give one of --scheduler, --workers and --gpus")
    if scheduler is not None:
        with Client(scheduler) as client:
            yield client
        return
    # a task that kills its worker is retried once by the scheduler, then reported (KilledWorker)
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        if gpus is not None:
            try:
                from dask_cuda import LocalCUDACluster
            except ImportError:
                raise InputError("--gpus needs dask-cuda: pip install dask-cuda") from None
            kw = {} if gpus == "all" else {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(int(gpus)))}
            cluster = LocalCUDACluster(dashboard_address=None, silence_logs=logging.ERROR, **kw)
        else:
            cluster = LocalCluster(n_workers=int(workers), threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=logging.ERROR)
        with cluster, Client(cluster) as client:
            yield client


def _plan_batches(todo: list, batch_size: int) -> list[list]:
    """Batches of inputs of similar file size (a proxy for structure size before parsing)."""
    def nbytes(p):
        try:
            return os.path.getsize(p)
        except OSError:
            return 0

    ordered = sorted(todo, key=lambda t: (nbytes(t[1]), t[0]))
    return [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]


def _iter_dask(job: Job, todo: list, *, scheduler, workers, gpus, batch_size: int,
               log) -> Iterator[list[InputResult]]:
    with _dask_client(scheduler, workers, gpus) as client:
        from distributed import as_completed

        job_f = client.scatter(job, broadcast=True, hash=False)
        futs = {}
        for b in _plan_batches(todo, batch_size):
            futs[client.submit(_dask_batch, job_f, b, pure=False)] = b
        ac = as_completed(list(futs))
        try:
            for fut in ac:
                batch = futs.pop(fut)
                try:
                    results = fut.result()
                except Exception as exc:
                    if type(exc).__name__ != "KilledWorker":
                        raise
                    if len(batch) > 1:
                        log(f"a Dask worker died on a batch of {len(batch)}; retrying its inputs one by one")
                        for item in batch:
                            nf = client.submit(_dask_batch, job_f, [item], pure=False)
                            futs[nf] = [item]
                            ac.add(nf)
                        continue
                    index, path = batch[0]
                    f = _Failure("the Dask worker computing it died, also when retried alone", "crash")
                    results = [_failed(index, path, None, f)]
                yield results
        finally:
            for fut in futs:
                fut.cancel()


# ----------------------------------------------------------------------------------------------------
# Output: tables, arrays, the manifest
# ----------------------------------------------------------------------------------------------------


def _check_out_suffix(out: Path) -> str:
    low = out.name.lower()
    for s in TABLE_SUFFIXES + ARRAY_SUFFIXES:
        if low.endswith(s):
            return s
    raise InputError(f"--out {out}: use one of {', '.join(TABLE_SUFFIXES + ARRAY_SUFFIXES)}")


def _writing(path, fn):
    """``write_atomic`` with write failures turned into :class:`OutputError`."""
    from .io import write_atomic

    try:
        return write_atomic(path, fn)
    except OSError as exc:
        if isinstance(exc, ProtgpuError):
            raise
        raise OutputError(f"{path}: cannot write ({exc.strerror or exc}); the previous file, if any, is "
                          "unchanged") from None


def _columns_of(rows: list[dict]) -> list[str]:
    seen: dict = {}
    for r in rows:
        for k in r:
            seen.setdefault(k, None)
    return list(seen)


def write_table(path, rows: list[dict], columns: list[str] | None = None) -> Path:
    """Write rows as a ``.csv``, ``.jsonl`` or ``.parquet`` table, atomically.

    Parameters
    ----------
    path : str or os.PathLike
        Destination; the suffix picks the format. Parquet needs pyarrow.
    rows : list of dict
        Column name -> value (str, int, float, bool or None; None is an empty CSV cell, JSON null,
        a Parquet null).
    columns : list of str, optional
        Columns in order (missing values are None); default: every key in order of first appearance.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    InputError
        Unknown suffix, or parquet without pyarrow.
    OutputError
        The file could not be written; an earlier file of that name is left as it was.

    Examples
    --------
    >>> import os, tempfile
    >>> rows = [{"model": "a.pdb", "tm": 0.91}, {"model": "b.pdb", "tm": 0.45, "note": "partial"}]
    >>> path = write_table(os.path.join(tempfile.mkdtemp(), "scores.csv"), rows)
    >>> print(path.read_text(), end="")
    model,tm,note
    a.pdb,0.91,
    b.pdb,0.45,partial
    """
    path = Path(path)
    cols = list(columns) if columns is not None else _columns_of(rows)
    low = path.name.lower()
    if low.endswith(".csv"):
        def write_csv(tmp):
            with open(tmp, "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(cols)
                for r in rows:
                    w.writerow(["" if r.get(c) is None else r.get(c) for c in cols])

        return _writing(path, write_csv)
    if low.endswith(".jsonl"):
        def write_jsonl(tmp):
            with open(tmp, "w") as fh:
                for r in rows:
                    fh.write(json.dumps({c: r.get(c) for c in cols}) + "\n")

        return _writing(path, write_jsonl)
    if low.endswith(".parquet"):
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise InputError(f"--out {path}: writing parquet needs pyarrow (pip install pyarrow); "
                             "or use .csv / .jsonl") from None
        table = pa.table({c: [r.get(c) for r in rows] for c in cols})
        return _writing(path, lambda tmp: pq.write_table(table, tmp))
    raise InputError(f"--out {path}: use a .csv, .jsonl or .parquet file name")


def _write_npz(tmp: str, items: Iterable) -> None:
    """A compressed .npz written one array at a time (np.load reads it), with fixed zip timestamps so
    that equal results give equal bytes."""
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
        for key, arr in items:
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asarray(arr), allow_pickle=False)


def stem_keys(paths: list[str], reserved=("inputs",)) -> list[str]:
    """One .npz key per input: its file stem (``.gz`` and the extension dropped), made unique."""
    used, keys = set(reserved), []
    for p in paths:
        base = os.path.basename(p)
        if base.lower().endswith(".gz"):
            base = base[:-3]
        stem = os.path.splitext(base)[0] or "input"
        key, i = stem, 1
        while key in used:
            i += 1
            key = f"{stem}_{i}"
        used.add(key)
        keys.append(key)
    return keys


def _errors_path(out: Path) -> Path:
    return out.with_name(out.name + ".errors.tsv")


class _Store:
    """The manifest (journal) and array parts of one output path."""

    def __init__(self, out: Path, job: Job, paths: list[str] | None = None):
        self.out = out
        self.job = job
        self.paths = paths  # the whole expanded input list (all shards): what .npz keys are drawn from
        self.manifest = out.with_name(out.name + ".manifest.jsonl")
        self.parts = out.with_name(out.name + ".parts")
        self.header = {"kind": "header", "format": MANIFEST_FORMAT, "job": job.name,
                       "options": json.loads(json.dumps(job.options(), default=str))}
        self.entries: dict[str, dict] = {}  # key -> latest entry
        self.started = False  # header written by this run (or resumed onto)
        self.run_id = uuid.uuid4().hex[:8]
        self.n_parts = 0

    @staticmethod
    def key(path: str) -> str:
        return os.path.abspath(path)

    # -- reading -------------------------------------------------------------------------------
    def read(self) -> bool:
        """Load the manifest for a resume; False when there is none. Drops a torn last line and parts
        that no entry references (a run killed between writing a part and journaling it)."""
        try:
            data = self.manifest.read_bytes()
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
        if good_end < len(data):
            with open(self.manifest, "r+b") as fh:
                fh.truncate(good_end)
        for e in lines[1:]:
            if e.get("kind") == "input":
                self.entries[e["key"]] = e
        referenced = {e.get("part") for e in self.entries.values() if e.get("part")}
        if self.parts.is_dir():
            for p in self.parts.iterdir():
                if p.name not in referenced and (p.name.startswith("part-") or p.name.startswith(".part-")):
                    with contextlib.suppress(OSError):
                        p.unlink()
        self.started = True
        return True

    def done(self, path: str, sha: str | None) -> dict | None:
        e = self.entries.get(self.key(path))
        if e is None or e.get("status") != "ok" or sha is None or e.get("sha256") != sha:
            return None
        if e.get("part") and not (self.parts / e["part"]).is_file():
            return None
        return e

    def arrays_of(self, e: dict) -> dict:
        if not e.get("part"):
            return {}
        slot = e["slot"]
        with np.load(self.parts / e["part"]) as z:
            return {name: z[f"{slot}:{name}"] for name in e.get("arrays", [])}

    # -- writing -------------------------------------------------------------------------------
    def _start(self) -> None:
        """First commit of a fresh run: replace an old journal (only files this engine names)."""
        if self.parts.is_dir():
            for p in self.parts.iterdir():
                if p.name.startswith(("part-", ".part-")):
                    with contextlib.suppress(OSError):
                        p.unlink()
        line = json.dumps({**self.header, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n"
        _writing(self.manifest, lambda tmp: Path(tmp).write_text(line))
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
                with _atomic_in(self.parts, part) as tmp:
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
            self.entries[e["key"]] = e
            lines.append(json.dumps(e) + "\n")
        try:
            with open(self.manifest, "a") as fh:
                fh.write("".join(lines))
        except OSError as exc:
            raise OutputError(f"{self.manifest}: cannot append ({exc.strerror or exc}); rerun with --resume "
                              "once there is space") from None

    def finish(self, order: list) -> tuple[list, list, Path | None]:
        """Write the output and errors file from the journal, in input order."""
        ok, failed = [], []
        for _index, path in order:
            e = self.entries.get(self.key(path))
            if e is None:
                continue
            (ok if e["status"] == "ok" else failed).append((path, e))
        rows = [r for _, e in ok for r in e.get("rows", [])]
        if self.out.name.lower().endswith(TABLE_SUFFIXES):
            write_table(self.out, rows, self.job.columns)
        else:
            self._write_arrays([(p, e) for p, e in ok])
        errors = _write_errors(self.out, [(p, e.get("sha256"), e.get("error", "")) for p, e in failed])
        return rows, [(p, e.get("error", "")) for p, e in failed], errors

    def _write_arrays(self, ok: list) -> None:
        if self.out.name.lower().endswith(".npy"):
            arrays = [a for _, e in ok for a in self.arrays_of(e).values()]
            if not arrays:  # the one input failed (keep_going): the errors file says so
                return
            if len(arrays) != 1:
                raise InputError(f"--out {self.out}: a .npy file holds one array; this run has {len(arrays)} "
                                 "(use .npz)")
            _writing(self.out, lambda tmp: np.save(tmp, arrays[0]))
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
            yield "inputs", np.array([p for p, _ in ok], dtype=str)

        _writing(self.out, lambda tmp: _write_npz(tmp, items()))


@contextlib.contextmanager
def _atomic_in(directory: Path, name: str):
    tmp = directory / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        yield str(tmp)
        os.replace(tmp, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _write_errors(out: Path, failed: list) -> Path | None:
    path = _errors_path(out)
    if not failed:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return None

    def clean(s):
        return " ".join(str(s or "").split())  # one line, no tabs

    text = "input\tsha256\terror\n" + "".join(f"{clean(p)}\t{sha or ''}\t{clean(err)}\n" for p, sha, err in failed)
    _writing(path, lambda tmp: Path(tmp).write_text(text))
    return path


def _remove_stale_temps(out: Path) -> None:
    """Temporary files a killed run left beside ``out`` (``atomic_path`` names them ``.NAME.*.tmp*``)."""
    d = out.parent if str(out.parent) else Path(".")
    with contextlib.suppress(OSError):
        for p in d.glob(f".{out.name}.*.tmp*"):
            with contextlib.suppress(OSError):
                p.unlink()


# ----------------------------------------------------------------------------------------------------
# The public entry points
# ----------------------------------------------------------------------------------------------------


def _expand(inputs) -> list[str]:
    from .commands._inputs import ExpandedInputs, expand_inputs

    if isinstance(inputs, ExpandedInputs):  # the CLI's list, already expanded (and checked): not again
        return list(inputs)
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    return expand_inputs([str(p) for p in inputs])


def _hash_all(paths: list[str], jobs: int) -> dict:
    def one(p):
        try:
            return p, file_sha256(p)
        except OSError:
            return p, None

    with ThreadPoolExecutor(max(1, jobs)) as ex:  # hashlib releases the GIL on large reads
        return dict(ex.map(one, paths))


class _Run:
    """State of one iter_results call, filled in as it goes (for run's Summary)."""

    def __init__(self):
        self.n_inputs = self.n_ok = self.n_failed = self.n_resumed = 0
        self.rows: list = []
        self.failed: list = []
        self.out = self.manifest = self.errors = None
        self.collected: list[InputResult] = []
        self.stats: dict = {}  # seconds by step (Summary.stats)


def iter_results(inputs, job, *, out=None, resume: bool = False, keep_going: bool = False, shard=None,
                 jobs: int | None = None, pool: str = "auto", batch_size: int | None = None,
                 scheduler: str | None = None, workers: int | None = None, gpus=None, progress=False,
                 quiet: bool = False, description: str | None = None, start_method: str | None = None,
                 log: Callable[[str], None] | None = None, _state: _Run | None = None,
                 _resumed_arrays: bool = True) -> Iterator[InputResult]:
    """Process many inputs with a job and yield each input's :class:`InputResult` as it finishes.

    Parameters
    ----------
    inputs : str, os.PathLike or sequence of them
        Paths, globs, directories (searched recursively for structure and trajectory files, ``.gz``
        included), ``@list.txt`` files (one path per line), ``-`` (the list on standard input).
    job : Job or callable
        What to compute (:class:`ScoreJob`, :class:`DistancesJob`, any :class:`Job`), or a function of
        a loaded Structure returning a dict (one row), a list of dicts, an array or a :class:`Result`.
    out : str or os.PathLike, optional
        Output file: ``.csv``, ``.jsonl``, ``.parquet`` (rows) or ``.npz``, ``.npy`` (arrays), written
        after the last input with the manifest ``OUT.manifest.jsonl`` beside it (journaled as inputs
        finish) and ``OUT.errors.tsv`` when inputs failed. None: results are only yielded.
    resume : bool
        Skip inputs that the manifest records as done with the same content sha256 (needs ``out``).
    keep_going : bool
        Record a failing input and go on; otherwise the first failure raises (after journaling what
        had finished).
    shard : str or (int, int), optional
        ``"i/N"`` or ``(i, N)``: only the inputs at positions i, i+N, i+2N, ... of the expanded list;
        ``out`` gets ``.shard-i-of-N`` before its suffix (or replaces ``{shard}`` in its name).
    jobs : int, optional
        Parse workers (default: the CPUs this process may use, at most 32).
    pool : {"auto", "process", "thread", "inline"}
        Parse workers as processes (true parallel parsing; the default for 32 inputs or more; each task
        parses a chunk of up to 16 inputs), threads, or inline in the calling thread (no overlap).
    batch_size : int, optional
        Most inputs per compute call (default: the job's).
    scheduler : str, optional
        Address of a running Dask scheduler to run the batches on.
    workers : int, optional
        Start a local Dask cluster of this many worker processes.
    gpus : "all" or int, optional
        Start dask-cuda's LocalCUDACluster, one worker per GPU.
    progress : bool
        Show progress on stderr: a bar on a terminal, a log line every 10 s otherwise.
    quiet : bool
        No progress and no notes.
    description : str, optional
        Label of the progress display (default: the job name).
    start_method : str, optional
        multiprocessing start method of the parse processes. Default: ``$PROTGPU_BATCH_START_METHOD``,
        else ``fork`` on Linux while this process runs one thread and has imported no GPU library
        (workers start at once and import nothing), else ``forkserver`` (scripts using the process
        pool then need the ``if __name__ == "__main__":`` guard).
    log : callable, optional
        Receives one-line notes (worker died, batch split); default: the ``protgpu.batch`` logger.

    Yields
    ------
    InputResult
        Resumed inputs first (``resumed=True``), then each input as its batch finishes. Only after
        the last one is the output written.

    Raises
    ------
    InputError
        Bad options, no inputs, a different manifest on resume, or (without ``keep_going``) the first
        input that failed, named.
    OutputError
        An output, part or manifest could not be written; what was journaled before stays valid.

    Examples
    --------
    Any function of a Structure that returns a row is a job; ``pool="inline"`` parses in this
    thread (no worker processes, for a few small inputs):

    >>> def count_ca(s):
    ...     return {"ca_atoms": s.select("ca").n_atoms, "frames": s.n_frames}
    >>> inputs = ["datasets/adk_open.pdb", "datasets/adk_closed.pdb"]
    >>> for r in iter_results(inputs, count_ca, pool="inline", quiet=True):
    ...     print(r.input, r.status, r.rows)
    datasets/adk_open.pdb ok [{'ca_atoms': 214, 'frames': 1}]
    datasets/adk_closed.pdb ok [{'ca_atoms': 214, 'frames': 1}]
    """
    job = _as_job(job)
    state = _state if _state is not None else _Run()
    stats = state.stats
    job_stats0 = dict(getattr(job, "stats", None) or {})
    if log is None:
        log = (lambda m: None) if quiet else _logger.warning
    if pool not in ("auto", "process", "thread", "inline"):
        raise InputError(f"pool must be auto, process, thread or inline, not {pool!r}")
    batch_size = int(batch_size or job.batch_size)
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    jobs = _default_jobs() if jobs is None else int(jobs)
    if jobs < 1:
        raise InputError(f"jobs must be at least 1, got {jobs}")
    if gpus is not None and gpus != "all":
        try:
            gpus = int(gpus)
        except (TypeError, ValueError):
            raise InputError(f"--gpus {gpus!r}: use all or a number") from None
        if gpus < 1:
            raise InputError(f"--gpus {gpus}: use all or a number >= 1")
    if workers is not None and int(workers) < 1:
        raise InputError(f"--workers {workers}: need at least 1")
    use_dask = scheduler is not None or workers is not None or gpus is not None

    out_path = None
    if out is not None:
        out_path = Path(out)
        if shard is not None:
            i, n = shard if isinstance(shard, tuple) else parse_shard(shard)
            out_path = shard_path(out_path, i, n)
        _check_out_suffix(out_path)
        folder = out_path.parent if str(out_path.parent) else Path(".")
        if not folder.is_dir():
            raise InputError(f"--out {out_path}: folder {folder} does not exist")
    elif resume:
        raise InputError("--resume needs --out (the manifest lives beside the output)")

    t0 = time.perf_counter()
    paths = _expand(inputs)
    stats["list_s"] = stats.get("list_s", 0.0) + time.perf_counter() - t0
    t0 = time.perf_counter()
    order = list(enumerate(paths))
    if shard is not None:
        i, n = shard if isinstance(shard, tuple) else parse_shard(shard)
        order = [t for t in order if t[0] % n == i]
    state.n_inputs = len(order)
    # .npz keys come from the whole input list, so that every shard names an input as the full run does
    store = _Store(out_path, job, paths) if out_path is not None else None
    if store is not None:
        state.out, state.manifest = out_path, store.manifest
        _remove_stale_temps(out_path)

    resumed: list[InputResult] = []
    if resume and store.read():
        hashes = _hash_all([p for _, p in order], jobs)
        for index, path in order:
            e = store.done(path, hashes[path])
            if e is not None:
                resumed.append(InputResult(index, path, "ok", e["sha256"], rows=e.get("rows", []),
                                           arrays=store.arrays_of(e) if _resumed_arrays else {},
                                           resumed=True))
    done_idx = {r.index for r in resumed}
    todo = [t for t in order if t[0] not in done_idx]
    if pool == "auto":
        pool = "process" if len(todo) >= 32 and jobs > 1 else ("thread" if len(todo) > 1 else "inline")

    from .commands._progress import BatchProgress

    bar = BatchProgress(len(order), description=description or job.name, quiet=quiet or not progress)
    stats["setup_s"] = stats.get("setup_s", 0.0) + time.perf_counter() - t0
    try:
        for r in resumed:
            state.n_ok += 1
            state.n_resumed += 1
            bar.advance(ok=True)
            yield r
        if use_dask:
            batches = _iter_dask(job, todo, scheduler=scheduler, workers=workers, gpus=gpus,
                                 batch_size=batch_size, log=bar.note_to(log))
        else:
            batches = _iter_local(job, todo, jobs=jobs, pool=pool, start_method=start_method,
                                  batch_size=batch_size, log=bar.note_to(log), stats=stats)
        try:
            for results in batches:
                results.sort(key=lambda r: r.index)
                fatal = next((r for r in results if not r.ok and r._failure is not None
                              and r._failure.kind == "fatal"), None)
                if fatal is not None:
                    _raise_for(fatal)
                if store is not None:
                    t0 = time.perf_counter()
                    store.commit(results if keep_going else [r for r in results if r.ok])
                    stats["write_s"] = stats.get("write_s", 0.0) + time.perf_counter() - t0
                for r in results:
                    if r.ok:
                        state.n_ok += 1
                    else:
                        state.n_failed += 1
                        state.failed.append((r.input, r.error))
                    bar.advance(ok=r.ok)
                first_bad = next((r for r in results if not r.ok), None)
                if first_bad is not None and not keep_going:
                    for r in results:  # what finished in this batch was journaled; hand it out too
                        if r.ok:
                            yield r
                    _raise_for(first_bad)
                for r in results:
                    yield r
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
    finally:
        bar.close()
        # the job's own timers (ScoreJob.stats), as far as this run added to them
        for k, v in (getattr(job, "stats", None) or {}).items():
            if isinstance(v, float):
                stats[k] = stats.get(k, 0.0) + v - job_stats0.get(k, 0.0)
    t0 = time.perf_counter()
    if store is not None and store.started:
        rows, failed, errors = store.finish(order)
        state.rows, state.failed, state.errors = rows, failed, errors
    elif store is not None:  # nothing at all to journal (no inputs left): still write an (empty) output
        store._start()
        rows, failed, errors = store.finish(order)
        state.rows, state.failed, state.errors = rows, failed, errors
    stats["write_s"] = stats.get("write_s", 0.0) + time.perf_counter() - t0


def run(inputs, job, *, on_result: Callable[[InputResult], None] | None = None, **kwargs) -> Summary:
    """Process many inputs with a job; write the output (if ``out=``) and return a :class:`Summary`.

    Takes the parameters of :func:`iter_results`, plus ``on_result``, called with each
    :class:`InputResult` as it finishes. With ``out=None`` the rows of every input come back in
    ``Summary.rows`` (input order) and nothing is written.

    Examples
    --------
    >>> import protgpu as pg, os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> for i in range(3):
    ...     with open(os.path.join(d, f"m{i}.pdb"), "w") as fh:
    ...         _ = fh.write(f"ATOM      1  CA  GLY A   1      {i:6.3f}   0.000   0.000  1.00  0.00           C\\n")
    >>> s = pg.batch.run(d, lambda st: {"x": float(st.coords[0, 0, 0])}, pool="inline")
    >>> [r["x"] for r in s.rows], s.n_ok, s.exit_code
    ([0.0, 1.0, 2.0], 3, 0)
    """
    t0 = time.perf_counter()
    state = _Run()
    collect = kwargs.get("out") is None
    for r in iter_results(inputs, job, _state=state, _resumed_arrays=False, **kwargs):
        if on_result is not None:
            on_result(r)
        if collect:
            state.collected.append(r)
    if collect:
        state.collected.sort(key=lambda r: r.index)
        state.rows = [row for r in state.collected if r.ok for row in r.rows]
        state.failed = [(r.input, r.error) for r in state.collected if not r.ok]
    return Summary(n_inputs=state.n_inputs, n_ok=state.n_ok, n_failed=state.n_failed, n_resumed=state.n_resumed,
                   rows=state.rows, failed=state.failed, out=state.out, manifest=state.manifest,
                   errors=state.errors, elapsed_s=time.perf_counter() - t0, stats=dict(state.stats))
