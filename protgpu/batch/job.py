"""The job protocol: :class:`Job` says what to do with one input (``load`` in a parse worker,
``size`` to group, ``compute`` a batch, ``warm_up`` once); :class:`FunctionJob` makes a job of any
function of a Structure.

Internal API for the built-in jobs (:mod:`protgpu.batch.jobs`) and tests: :func:`warm_device` (the
device part of a warm-up), :func:`apply_selection` (a selection that names the file when it matches no
atom) and :func:`as_job` (a Job or a function -> a Job).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from ..errors import InputError

__all__ = ["FunctionJob", "Job"]

# where Job.report_progress goes in this thread: set by the engine around each compute call (a thread
# local, not an attribute of the job, which is pickled to workers)
_sink = threading.local()


@contextlib.contextmanager
def progress_sink(fn: Callable[[float], None] | None):
    """Within the block, :meth:`Job.report_progress` in this thread calls ``fn(fraction)``."""
    old = getattr(_sink, "fn", None)
    _sink.fn = fn
    try:
        yield
    finally:
        _sink.fn = old


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
    input_root : str or None
        The inputs' common folder, set by the engine (:meth:`input_name`).
    uses_blas : bool
        The results depend on the BLAS thread count in their last digits (a resume must use the same).
    """

    name: str = "job"
    batch_size: int = 64
    columns: list | None = None
    #: Whether the job's numbers go through BLAS matrix products, whose last digits depend on the BLAS
    #: thread count: the journal then records that count and a resume with another one is refused
    uses_blas: bool = False
    #: The folder holding every input of the run (set by the engine before its workers start):
    #: :meth:`input_name` names inputs relative to it
    input_root: str | None = None

    def input_name(self, path: str) -> str:
        """How a row names the input ``path``: relative to the run's common folder (``af/a/ranked_0.pdb``
        and ``af/b/ranked_0.pdb`` are ``a/ranked_0.pdb`` and ``b/ranked_0.pdb``), the base name outside a
        run."""
        from .inputs import input_name

        return input_name(path, self.input_root)

    def options(self) -> dict:
        """JSON-serialisable settings that change results; ``resume`` refuses a manifest whose header
        holds different ones."""
        return {}

    def load(self, path: str):
        """Parse one input (runs in a parse worker). Raise :class:`InputError` naming ``path`` for a
        bad file."""
        from ..io import load

        return load(path)

    def size(self, item) -> object:
        """A hashable key: parsed inputs with equal keys are batched together (e.g. a length bucket)."""
        return 0

    def compute(self, items: list) -> list:
        """One result per parsed input, in order: a :class:`Result`, a dict (one row), a list of dicts,
        an array (the input's array), or None (nothing). A long compute should call
        :meth:`report_progress` as it goes (this one does after each input)."""
        out = []
        for k, it in enumerate(items):
            out.append(self.compute_one(it))
            self.report_progress((k + 1) / len(items))
        return out

    @staticmethod
    def report_progress(fraction: float) -> None:
        """Tell the engine's progress display that ``fraction`` (0 to 1) of the current
        :meth:`compute` call's work is done (frames of a long trajectory, chunks of a batch).
        Without a display (a Dask worker, a caller's own loop) it does nothing."""
        fn = getattr(_sink, "fn", None)
        if fn is not None:
            fn(min(max(float(fraction), 0.0), 1.0))

    def compute_one(self, item):
        """The result of one parsed input (used by the default :meth:`compute`)."""
        raise NotImplementedError(f"{type(self).__name__} defines neither compute nor compute_one")

    def warm_up(self) -> None:
        """Called once in the computing process right after the first inputs went to the parse
        workers: prepare what :meth:`compute` needs (a GPU context, kernels, reference data) while the
        workers start. Errors should be left for the inputs to meet."""


def warm_device(device: str, on_gpu: Callable[[], object] | None = None) -> bool | None:
    """The device part of a built-in job's :meth:`Job.warm_up`: decide ``device`` and, on the GPU, call
    ``on_gpu`` (a small computation that creates the CUDA context and loads the job's kernels).

    For ``device="auto"`` this is where CuPy is imported and a GPU looked for: the engine calls warm-ups
    once its parse workers have started, so they are still forked (see :func:`fork_is_safe`); a job
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
    from .._array import dispatch

    try:
        gpu = dispatch(device=device).on_gpu
    except Exception:  # the inputs will meet it again and report it properly
        return None
    if gpu and on_gpu is not None:
        with contextlib.suppress(Exception):
            on_gpu()
    return gpu


def apply_selection(s, select: str | None, path: str):
    """``s.select(select)`` (``s`` itself when ``select`` is empty).

    Raises
    ------
    InputError
        The selection matches no atom; the message names ``path``.
    """
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
        from ..io import load

        return apply_selection(load(path, top=self.top), self.select, path)

    def compute_one(self, item):
        return self.fn(item)


def as_job(job) -> Job:
    """``job`` itself when it is a :class:`Job`, a :class:`FunctionJob` of it when it is callable.

    Raises
    ------
    InputError
        Neither.
    """
    if isinstance(job, Job):
        return job
    if callable(job):
        return FunctionJob(job)
    raise InputError(f"job must be a protgpu.batch.Job or a function of a Structure, got {type(job).__name__}")

