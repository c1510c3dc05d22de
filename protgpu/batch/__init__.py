"""The batch engine: many inputs -> parse (worker pool) -> batched compute -> one output, resumable.

A :class:`Job` says what to do with one input file; :func:`iter_results` yields each input's
:class:`InputResult` as it finishes and :func:`run` returns a :class:`Summary`. With ``out=`` the
results go to ``OUT`` (a table or an ``.npz``/``.npy``, written atomically in input order); the
journal ``OUT.manifest.jsonl`` beside it lives while the run goes (``resume=True`` skips what it
records as done) and is removed once every input succeeded; when inputs failed under ``keep_going``
it stays, with ``OUT.errors.tsv``. ``shard=(i, n)`` runs one of n disjoint parts.
The built-in jobs (:mod:`protgpu.batch.jobs`) are those of the subcommands; any function of a
:class:`~protgpu.structure.Structure` is a job too (:class:`FunctionJob`).

Modules: ``results`` (what comes back), ``job`` (the protocol), ``inputs`` (expansion, hashes,
shards), ``local`` (the parse pool), ``dask``, ``journal`` (manifest and resume), ``writers``
(outputs), ``progress``, ``engine`` (the driver) and ``jobs/``. How it works and why:
``docs/design/batch-engine.md``.
"""

from .engine import iter_results, run
from .inputs import file_sha256, parse_shard, shard_path
from .job import FunctionJob, Job
from .jobs import ContactsJob, CoordinatesJob, DistancesJob, RmsdJob, ScoreJob
from .results import InputResult, Result, Summary
from .writers import ARRAY_SUFFIXES, TABLE_SUFFIXES, OutputError, write_table

__all__ = [
    "ARRAY_SUFFIXES",
    "TABLE_SUFFIXES",
    "ContactsJob",
    "CoordinatesJob",
    "DistancesJob",
    "FunctionJob",
    "InputResult",
    "Job",
    "OutputError",
    "Result",
    "RmsdJob",
    "ScoreJob",
    "Summary",
    "file_sha256",
    "iter_results",
    "parse_shard",
    "run",
    "shard_path",
    "write_table",
]
