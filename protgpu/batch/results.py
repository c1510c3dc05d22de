"""What the batch engine hands back: :class:`Result` (a job's output for one input),
:class:`InputResult` (one input's outcome), :class:`Summary` (a whole run), and the failure kinds.

Internal API (used by the engine's other modules and by tests): :class:`Failure` (why one input
failed, picklable across processes), :func:`failure_of` (an exception -> a failure kind),
:func:`raise_for` (stop a run for a failed input with a one-line error), :func:`failed_result` and
:func:`as_result` (a job's return value -> a :class:`Result` of plain values and NumPy arrays).
"""

from __future__ import annotations

import math
import os
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import GPUUnavailableError, InputError, KernelCompileError, MemoryBudgetError

__all__ = ["InputResult", "Result", "Summary"]


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
    _failure: Failure | None = field(default=None, repr=False, compare=False)

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
    rows : sequence of dict
        Rows of the inputs that succeeded, in input order (with ``out``, a sequence that decodes them
        from the journal's compact form as it is read).
    failed : list of (str, str)
        (input, reason) of the inputs that failed, in input order.
    out, manifest, errors : pathlib.Path or None
        The output, the manifest (the journal, kept only when inputs failed: None once removed), and
        the errors file (None when nothing failed or no output).
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
class Failure:
    """Why one input failed: ``reason`` (one line), ``kind`` (``"input"``: a bad file, ``"oom"``,
    ``"crash"``: its worker died, ``"fatal"``: stop regardless, ``"error"``: a bug, with the traceback in
    ``detail``), and the live exception in the process that caught it (dropped when pickled)."""

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


def failure_of(exc: BaseException, path: str) -> Failure:
    """The :class:`Failure` of ``exc`` raised while processing ``path`` (a prefix ``path: `` is dropped
    from the reason: the errors file has a column for the path)."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    prefix = f"{path}: "
    if msg.startswith(prefix):  # the errors file has its own column for the path
        msg = msg[len(prefix):]
    if isinstance(exc, (GPUUnavailableError, KernelCompileError)):
        # not the input's fault: every input would fail the same way, so never keep going past it
        return Failure(msg, "fatal", exc=exc)
    if _is_oom(exc):
        return Failure(f"out of memory ({type(exc).__name__}: {msg})", "oom", exc=exc)
    if isinstance(exc, InputError):
        return Failure(msg, "input", exc=exc)
    if isinstance(exc, OSError):
        why = exc.strerror or msg
        return Failure(f"cannot read ({why})", "input", exc=exc)
    detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Failure(f"{type(exc).__name__}: {msg}", "error", detail=detail, exc=exc)


def raise_for(r: InputResult):
    """Stop the run for a failed input (no keep_going): a one-line error naming the file."""
    from .inputs import display_path

    f = r._failure or Failure(r.error or "failed", "input")
    name = display_path(r.input)
    if f.kind in ("fatal", "error") and f.exc is not None:
        if hasattr(f.exc, "add_note"):
            f.exc.add_note(f"while processing {name}")
        raise f.exc
    if (f.kind == "input" and isinstance(f.exc, InputError) and os.path.basename(r.input) in str(f.exc)
            and name == r.input):
        raise f.exc  # its message already names the file
    if f.kind == "oom":
        raise MemoryBudgetError(f"{name}: {f.reason}; it does not fit even alone in a batch")
    if f.kind == "error":
        raise RuntimeError(f"{name}: {f.reason}\n{f.detail}")
    raise InputError(f"{name}: {display_path(f.reason)}")


def failed_result(index: int, path: str, sha, f: Failure) -> InputResult:
    """The :class:`InputResult` of a failed input."""
    return InputResult(index, path, "failed", sha, error=f.reason, _failure=f)


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


def as_result(out) -> Result:
    """A job's return value for one input (a :class:`Result`, a dict, a list of dicts, an array or None)
    as a :class:`Result` of JSON-exact row values and C-ordered NumPy arrays.

    Raises
    ------
    TypeError
        Any other return value.
    """
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
    from .._array import to_numpy

    # np.asarray(order="C"), not np.ascontiguousarray: the latter makes a 0-d array (a scalar result)
    # one-dimensional, and the stored array must keep the shape the job returned
    return Result(rows=[{str(k): _plain(v) for k, v in r.items()} for r in rows],
                  arrays={str(k): np.asarray(to_numpy(a), order="C") for k, a in arrays.items()})

