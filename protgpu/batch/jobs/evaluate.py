"""The job of ``protgpu evaluate``: one row per design (per frame of a multi-model file) with its
complex scores against a reference (when given), its model confidence and its design-sanity metrics."""

from __future__ import annotations

import os

from ...errors import InputError
from ..inputs import file_sha256
from ..job import Job, warm_device
from ..results import Result

__all__ = ["EvaluateJob"]


class _Loaded(dict):
    """A loaded design (a dict, see :meth:`EvaluateJob.load`) with the seconds of each load step in
    ``timings``: the batch engine adds them up into its statistics (``read_s``, ``sanity_s``, ...)."""

    timings: dict


class EvaluateJob(Job):
    """Scores, confidence and sanity of design files: the table of ``protgpu evaluate``.

    :meth:`load` (in a parse worker) reads a design, computes its sanity and confidence columns and,
    with a reference, cleans it, maps its chains (:func:`protgpu.complexes.scores.map_model`) and counts
    the per-model CPU parts of the scores (QS-score, DockQ contacts: ``host_scores``): a design whose
    chains cannot be mapped fails there, with one line naming the file and the chains of both
    structures. :meth:`compute` scores a batch's mapped designs together
    (:func:`protgpu.complexes.scores.score_mapped`: designs of one atom table and mapping share one
    batched lDDT, TM-score and superposition call, on the GPU when there is one).

    Parameters
    ----------
    reference : str, os.PathLike, Structure or None
        The reference complex; None: confidence and sanity columns only.
    confidence : {"auto", "none"}
        See :func:`protgpu.complexes.evaluate.confidence_columns`.
    chain_mapping : "auto" or dict
        As :func:`protgpu.map_chains`.
    min_identity : float
        As :func:`protgpu.map_chains`, percent.
    device : {"auto", "cpu", "gpu"}
    tm_mode : {"mapped", "usalign", "usalign-auto"}
        ``tm_score``: "mapped" (default here: the TMscore program's search on the chain-mapped residues,
        batched on the device) or US-align's complex mode as OpenStructure reports it (CPU, ~0.4 s a
        model: see :data:`protgpu.complexes.scores.TM_MODES`).
    stereochecks : bool
        lddt and ilddt on stereochecked model and reference, as OpenStructure (default True).
    batch_size : int
        Most designs per compute batch (the engine's journal interval bounds a batch's time too): large,
        since each batch pays fixed costs (launches, superposition calls, the rows) on top of its models.
    """

    name = "evaluate"
    #: stats: the compute's seconds by step (``stack_s``, ``lddt_s``, ``tm_s``, ``dockq_rmsd_s``, see
    #: :func:`~protgpu.complexes.scores.score_mapped`) and ``batches``, added up in the compute process;
    #: ``warmup_score_s``: the warm-up's scoring of the reference (the engine's ``warmup_s`` less the
    #: device's start: importing CuPy, the CUDA context)
    uses_blas = True  # TM-score's search (as ScoreJob)

    def __init__(self, reference=None, *, confidence: str = "auto", chain_mapping="auto",
                 min_identity: float = 30.0, device: str = "auto", batch_size: int = 1024,
                 tm_mode: str = "mapped", stereochecks: bool = True):
        from ...complexes.evaluate import CONFIDENCE_COLUMNS, SANITY_COLUMNS, score_column_names
        from ...complexes.scores import METRICS, ComplexReference

        if confidence not in ("auto", "none"):
            raise InputError(f"confidence {confidence!r}: use auto or none")
        if not 0 <= float(min_identity) <= 100:
            raise InputError(f"min_identity is a percentage from 0 to 100, got {min_identity}")
        self.confidence = confidence
        self.chain_mapping = chain_mapping
        self.min_identity = float(min_identity)
        self.device = device
        self.batch_size = int(batch_size)
        self.tm_mode = tm_mode
        self.stereochecks = bool(stereochecks)
        self.reference_name = self.reference_sha256 = None
        self.reference = None
        score_cols: list = []
        if reference is not None:
            if isinstance(reference, (str, os.PathLike)):
                self.reference_name = str(reference)
                self.reference_sha256 = file_sha256(reference) if os.path.isfile(reference) else None
            else:
                self.reference_name = str(getattr(reference, "source", None) or "reference")
            self.reference = ComplexReference(reference, METRICS, tm_mode, stereochecks=self.stereochecks)
            score_cols = score_column_names(METRICS, self.reference.interfaces)
        self.columns = ["model", *score_cols, *CONFIDENCE_COLUMNS, *SANITY_COLUMNS]

    def options(self) -> dict:
        return {"reference": None if self.reference_name is None else os.path.basename(self.reference_name),
                "reference_sha256": self.reference_sha256, "confidence": self.confidence,
                "chain_mapping": self.chain_mapping, "min_identity": self.min_identity, "tm_mode": self.tm_mode,
                "stereochecks": self.stereochecks}

    def __getstate__(self):
        # the per-atom-table caches are rebuilt in each process (a parse worker's are its own)
        return {**self.__dict__, "_sanity": {}, "stats": {}}

    def _sanity_table(self, frame, key: bytes):
        """The :class:`~protgpu.complexes.sanity.SanityTopology` of a frame's atom table, kept per table."""
        from ...complexes.sanity import SanityTopology

        cache = self.__dict__.setdefault("_sanity", {})
        if key not in cache:
            if len(cache) >= 64:  # a campaign of many lengths: keep the latest tables
                cache.pop(next(iter(cache)))
            cache[key] = SanityTopology(frame.atoms, frame.source or "structure")
        return cache[key]

    def load(self, path: str) -> dict:
        """Read one design; its confidence and sanity columns, and (with a reference) its cleaned
        frames, chain mappings, per-model CPU scores and batching keys: ``{"names", "rows",
        "structures", "mappings", "host", "tables"}``. What depends on the atom table only (the
        clean-up, the chain mapping, the atoms the sanity and CPU scores read) is computed for the
        first design of each table and reused (the models of one design share theirs)."""
        import time

        from ...complexes.evaluate import confidence_columns, sanity_columns
        from ...complexes.scores import atoms_key, group_key, host_scores, map_model
        from ...io import load

        t0 = time.perf_counter()
        s = load(path)
        t1 = time.perf_counter()
        name = self.input_name(path)
        names = [name] if s.n_frames == 1 else [f"{name}[{i}]" for i in range(s.n_frames)]
        frames = [s] if s.n_frames == 1 else [s.frames(i) for i in range(s.n_frames)]
        key = atoms_key(s.atoms)  # the frames share the atom table
        conf = confidence_columns(frames[0], path, self.confidence)
        t2 = time.perf_counter()
        table = self._sanity_table(s, key)
        # each frame's interface atom contacts: DockQ's contacts below are the same search (found once)
        found: list = [{} for _ in frames]
        rows = [{"model": n, **conf, **sanity_columns(f, table, c)}
                for n, f, c in zip(names, frames, found, strict=True)]
        t3 = time.perf_counter()
        structures, mappings, tables = [], [], []
        host: list = []
        if self.reference is not None:
            for f in frames:
                cs, cm, mt = map_model(f, self.reference, chain_mapping=self.chain_mapping,
                                       min_identity=self.min_identity, table=True, key=key)
                structures.append(cs)
                mappings.append(cm)
                tables.append(mt)
            t4 = time.perf_counter()
            # QS-score and the DockQ contacts are per model and CPU-bound: here, in the parse workers
            host = [host_scores(cs, cm, self.reference, mt, c) for cs, cm, mt, c in zip(structures, mappings, tables,
                                                                                         found, strict=True)]
            # the compute process needs only each model's batching key, not the table's caches
            keys = [group_key(cs, cm, mt) for cs, cm, mt in zip(structures, mappings, tables, strict=True)]
        else:
            t4, keys = t3, []
        t5 = time.perf_counter()
        item = _Loaded(names=names, rows=rows, structures=structures, mappings=mappings, host=host, keys=keys)
        item.timings = {"read_s": t1 - t0, "confidence_s": t2 - t1, "sanity_s": t3 - t2, "map_s": t4 - t3,
                        "host_scores_s": t5 - t4}
        return item

    def size(self, item) -> object:
        # designs of one length batch together (most of a design campaign shares its atom table)
        return item["structures"][0].n_atoms if item["structures"] else 0

    def warm_up(self) -> None:
        """Decide ``device="auto"`` after the parse workers started (see :func:`warm_device`), and score
        the reference against itself once while they parse: the CUDA context, the kernels (or the
        compiled CPU loops) and the reference's lDDT pair lists are ready before the first batch, whose
        time would otherwise set the engine's first batch sizes (see ``iter_local``'s ``cap``)."""
        import contextlib
        import time

        def score_reference():
            if self.reference is not None:
                from ..._array import dispatch
                from ...complexes.scores import map_model, score_mapped

                t0 = time.perf_counter()
                s, cm = map_model(self.reference.raw, self.reference)
                device = "gpu" if dispatch(device=self.device).on_gpu else "cpu"
                score_mapped([s], [cm], self.reference, device)
                # the warm-up's part after the device was decided (CuPy imported, on the GPU)
                stats = self.__dict__.setdefault("stats", {})
                stats["warmup_score_s"] = stats.get("warmup_score_s", 0.0) + time.perf_counter() - t0

        if warm_device(self.device, score_reference) is False:
            with contextlib.suppress(Exception):  # the inputs will meet it again and report it properly
                score_reference()

    def compute(self, items: list) -> list:
        from ..._array import dispatch
        from ...complexes.evaluate import score_columns
        from ...complexes.scores import score_mapped

        if self.reference is not None:
            structures = [s for it in items for s in it["structures"]]
            mappings = [m for it in items for m in it["mappings"]]
            device = "gpu" if dispatch(device=self.device).on_gpu else "cpu"
            host = [h for it in items for h in it["host"]]
            keys = [k for it in items for k in it["keys"]] if all("keys" in it for it in items) else None
            stats = self.__dict__.setdefault("stats", {})
            stats["batches"] = stats.get("batches", 0) + 1
            table = score_mapped(structures, mappings, self.reference, device, host=host, keys=keys, timers=stats)
            k = 0
            for it in items:
                for row in it["rows"]:
                    row.update(score_columns(table, k))
                    k += 1
        return [Result(rows=[{c: r.get(c) for c in self.columns} for r in it["rows"]]) for it in items]
