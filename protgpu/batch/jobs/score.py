"""The job of ``protgpu score``: TM-score, RMSD, GDT and lDDT of many models against one reference."""

from __future__ import annotations

import os
import time

import numpy as np

from ...errors import InputError
from ..inputs import file_sha256
from ..job import Job, apply_selection, warm_device
from ..results import Result

__all__ = ["ScoreJob"]

# (model, pair) distances per chunk of the CPU lDDT: its temporaries take ~70 bytes each, so 2**21 holds
# a batch's peak near 150 MB (lddt_counts_numpy's default, 2**24, took 1.2 GB for the 261,000 pairs of
# AdK's heavy atoms, and ran 3x slower, out of cache); the counts are integers per model, the same
# whatever the chunk
_CPU_LDDT_ELEMENTS = 1 << 21


def _length_bucket(n: int) -> int:
    """Round a length up to 32, 48, 64, 96, 128, 192, ...: batches of similar length waste at most a
    third of their padding."""
    b = 32
    while b < n:
        b = b * 3 // 2 if (b & (b - 1)) == 0 else (b // 3) * 4
    return b


class ScoreJob(Job):
    """TM-score, RMSD, GDT-TS/GDT-HA, MaxSub and lDDT of every model file against one reference.

    One row per model (per frame of a multi-model file): ``model`` (the file's path relative to the
    folder of all inputs, ``name[i]`` for frame i),
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
    # the CPU TM-score search's matrix products (scoring/tmscore.py: w @ x, w @ pxy, rot @ pyx.T, ...)
    # run in BLAS, whose threaded sums differ in the last digit with the thread count
    uses_blas = True

    def __init__(self, reference, *, metrics=("tm", "lddt", "gdt", "rmsd"), mapping: str = "resnum",
                 normalize_by="reference", lddt_atoms: str = "heavy", symmetry: bool = True,
                 per_residue: bool = False, keep_per_residue: bool = False, select: str | None = None,
                 top=None, device: str = "auto", batch_size: int = 256):
        from ...io import load
        from ...scoring import lddt_residue_labels

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
        self.reference = apply_selection(load(reference), select, self.reference_name)
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
        from ...scoring._batch import PreparedReference

        ref = self._caches.get("prepared")
        if ref is None:
            ref = self._caches["prepared"] = PreparedReference(self.reference)
        return ref

    def _prepare(self, s):
        from ...scoring._batch import prepare_model

        return prepare_model(s, self._prepared_reference(), mapping=self.mapping, tm=self.want_tm,
                             lddt_atoms=self.lddt_atoms if self.want_lddt else None)

    def load(self, path: str):
        """Read one model file and match it to the reference: a
        :class:`~protgpu.scoring._batch.PreparedModel` (its ``timings`` say how long each step took)."""
        from ...io import load

        t0 = time.perf_counter()
        s = apply_selection(load(path, top=self.top), self.select, path)
        read_s = time.perf_counter() - t0
        item = self._prepare(s)
        item.timings["read_s"] = read_s
        name = self.input_name(path)  # relative to the inputs' common folder: equal base names stay apart
        item.names = [name] if len(item.names) == 1 else [f"{name}[{i}]" for i in range(len(item.names))]
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
            on_gpu = warm_device(self.device, lambda: self.compute([self.reference]))
            if on_gpu is False and self.want_lddt:  # (None: no device, the first batch says why)
                self._lddt_reference()
        except Exception:  # the inputs will meet it again and report it properly
            pass
        finally:
            self.stats = saved

    def compute(self, items: list) -> list:
        from ...scoring import _batch as sb
        from ...scoring import tm_score

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
            if self.want_lddt:
                self.report_progress(0.5)  # the batch's TM-scores are done, its lDDT next
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
        from ...scoring.lddt import _structure_reference

        key = ("lddt", self.lddt_atoms)
        if key not in self._caches:
            self._caches[key] = _structure_reference(self.reference, self.lddt_atoms, 15.0)
        return self._caches[key]

    def _lddt(self, items: list) -> tuple[np.ndarray, np.ndarray]:
        """Global (M,) and per-residue (M, R) lDDT of prepared models, as :func:`protgpu.lddt` computes
        them (its default thresholds and inclusion radius), with the reference's pair lists built once
        per job instead of once per batch (and kept on the device between batches)."""
        from ..._array import dispatch, to_numpy
        from ...scoring import _batch as sb
        from ...scoring import _fast
        from ...scoring.lddt import lddt_counts_cuda, lddt_counts_numpy, lddt_scores

        thresholds = (0.5, 1.0, 2.0, 4.0)
        be = dispatch(*items, self.reference, device=self.device)
        ref, info, ref_atoms = self._lddt_reference()
        groups, _ = sb.collect_models(items, self.reference)
        batch = sb.atom_batch(groups, self.reference, info, ref_atoms, self.mapping, be,
                              sb.work_dtype(items, self.reference))
        if be.on_gpu:
            counts = lddt_counts_cuda(batch.coords, ref, thresholds, self.symmetry)
        elif _fast.enabled():  # the compiled twin, as pg.lddt takes it (docs/design/cpu-speed.md)
            counts = _fast.lddt_counts(batch.coords.astype(np.float64), ref, thresholds, self.symmetry)
        else:
            counts = lddt_counts_numpy(batch.coords.astype(np.float64), ref, thresholds, self.symmetry,
                                       max_elements=_CPU_LDDT_ELEMENTS)
        glob, per = lddt_scores(counts, ref, len(thresholds), be.xp)
        return to_numpy(glob), to_numpy(per)

