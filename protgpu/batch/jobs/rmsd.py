"""The jobs of ``protgpu rmsd`` (:class:`RmsdJob`: RMSD of every frame to a reference) and ``protgpu
pairwise-rmsd`` (:class:`CoordinatesJob`: every input's coordinates, for a whole-run matrix)."""

from __future__ import annotations

import os

import numpy as np

from ...errors import InputError
from ..inputs import file_sha256
from ..job import Job, warm_device
from ..results import Result

__all__ = ["CoordinatesJob", "RmsdJob"]


class RmsdJob(Job):
    """RMSD of every frame of every input to one reference frame after optimal superposition (QCP).

    One row per frame: ``input`` (the path), ``frame`` (0-based) and ``rmsd_angstrom``. The
    selections are resolved in the parse workers, which hand over only the atoms used (fitted, then
    measured), so the compute sees small arrays; the values are those of
    ``protgpu.rmsd(structure, reference, fit=fit, atoms=atoms)``, bit for bit.

    Parameters
    ----------
    reference : Structure
        One frame (a multi-frame Structure uses frame 0).
    reference_name : str, optional
        Its file, for messages and the manifest (its sha256 is recorded when it is a file).
    fit : str, optional
        Selection superposed on (default: all atoms).
    atoms : str, optional
        Selection measured after fitting on ``fit`` (default: the fitted atoms).
    top : str, optional
        Topology for trajectory inputs.
    ref_frame : int
        Recorded in the manifest (the frame ``reference`` was taken from).
    keep_aligned : bool
        Superpose all atoms and keep ``(structure, aligned coords)`` per input path in
        :attr:`aligned`. Only for runs whose compute happens in this process (not Dask), and not
        with ``resume`` (resumed inputs are not recomputed).
    device : {"auto", "cpu", "gpu"}
    batch_size : int
    """

    name = "rmsd"
    # the CPU superposition's matrix products (superpose/to_reference.py) run in BLAS, whose threaded
    # sums can differ in the last digit with the thread count
    uses_blas = True
    columns = ["input", "frame", "rmsd_angstrom"]

    def __init__(self, reference, *, reference_name: str | None = None, fit: str | None = None,
                 atoms: str | None = None, top=None, ref_frame: int = 0, keep_aligned: bool = False,
                 device: str = "auto", batch_size: int = 64):
        self.reference_name = str(reference_name or getattr(reference, "source", None) or "reference")
        self.reference_sha256 = (file_sha256(reference_name) if reference_name and os.path.isfile(reference_name)
                                 else None)
        ref = reference if reference.n_frames == 1 else reference.frames(0)
        self.reference = ref
        self.fit, self.atoms = fit, atoms
        self.top = None if top is None else str(top)
        self.ref_frame = int(ref_frame)
        self.keep_aligned = bool(keep_aligned)
        self.device = device
        self.batch_size = int(batch_size)
        self.aligned: dict = {}
        # The reference's atoms, resolved once (a bad selection fails here, before any input).
        fit_r = self._indices(ref, fit, self.reference_name)
        meas_r = self._indices(ref, atoms, self.reference_name)
        self.n_fit = ref.n_atoms if fit_r is None else len(fit_r)
        self.n_meas = None if meas_r is None else len(meas_r)
        if (keep_aligned or atoms is not None) and self.n_fit < 3:
            raise InputError(f"{self.reference_name}: the fit selection has {self.n_fit} atom(s); superposing "
                             "(and measuring other atoms than the fitted ones) needs at least 3")
        self.ref_compact = self._compact(ref.coords, fit_r, meas_r)[0]
        # Positions of the fitted and measured atoms inside the compact arrays (fitted ones first).
        self.fit_idx = None if meas_r is None else np.arange(self.n_fit)
        self.meas_idx = None if meas_r is None else np.arange(self.n_fit, self.n_fit + self.n_meas)

    @staticmethod
    def _indices(s, sel, name: str):
        if not sel:
            return None
        idx = s.select_indices(sel)
        if idx.size == 0:
            raise InputError(f"{name}: selection {sel!r} matches no atom")
        return idx

    @staticmethod
    def _compact(coords, fit, meas):
        """The atoms used, fitted ones first: all, the fitted ones, or fitted then measured."""
        if fit is None and meas is None:
            return coords
        if meas is None:
            return coords[:, fit]
        return coords[:, np.concatenate([np.arange(coords.shape[1]) if fit is None else fit, meas])]

    def options(self) -> dict:
        return {"reference": os.path.basename(self.reference_name), "reference_sha256": self.reference_sha256,
                "ref_frame": self.ref_frame, "fit": self.fit, "atoms": self.atoms, "top": self.top}

    def load(self, path: str):
        from ...io import load

        s = load(path, top=self.top)
        fit_m = self._indices(s, self.fit, path)
        meas_m = self._indices(s, self.atoms, path)
        n_fit = s.n_atoms if fit_m is None else len(fit_m)
        for n, n_ref, sel in ((n_fit, self.n_fit, self.fit), (None if meas_m is None else len(meas_m), self.n_meas,
                                                             self.atoms)):
            if n != n_ref:
                what = f" in selection {sel!r}" if sel else ""
                raise InputError(f"{path}: {n} atoms{what}, but the reference {self.reference_name} has {n_ref}; "
                                 "RMSD needs corresponding atoms")
        compact = np.ascontiguousarray(self._compact(s.coords, fit_m, meas_m))
        bad = ~np.isfinite(compact).all(axis=(1, 2))
        if bad.any():
            raise InputError(f"{path}: NaN or infinite coordinates in frame {int(np.argmax(bad))}")
        return {"path": path, "coords": compact, "structure": s if self.keep_aligned else None}

    def size(self, item) -> object:
        return item["coords"].shape[1]

    def warm_up(self) -> None:
        """Decide ``device="auto"`` once the engine's parse workers have started
        (:func:`protgpu.batch.job.warm_device`); on the GPU also take the RMSD of the reference to itself,
        which creates the CUDA context and loads the QCP kernels while the workers parse."""
        from ...superpose import rmsd

        warm_device(self.device, lambda: rmsd(self.ref_compact, self.ref_compact, fit=self.fit_idx,
                                               atoms=self.meas_idx, device=self.device))

    def compute_one(self, item):
        from ..._array import to_numpy
        from ...superpose import rmsd, superpose

        path = item["path"]
        if self.keep_aligned:
            s = item["structure"]
            res = superpose(s, self.reference, fit=self.fit, atoms=self.atoms, device=self.device)
            r = to_numpy(res.rmsd)
            self.aligned[path] = (s, to_numpy(res.coords))
        else:
            r = to_numpy(rmsd(item["coords"], self.ref_compact, fit=self.fit_idx, atoms=self.meas_idx,
                              device=self.device))
        return [{"input": path, "frame": i, "rmsd_angstrom": float(v)} for i, v in enumerate(r.tolist())]


class CoordinatesJob(Job):
    """Coordinates of every input (after ``select``), (frames, atoms, 3) float32 Angstrom, as the input's
    array; for whole-run computations such as ``protgpu pairwise-rmsd`` that need every input's frames
    at once but still want the engine's parallel parsing and ``keep_going``.

    Parameters
    ----------
    select : str, optional
    top : str, optional
        Topology for trajectory inputs.
    batch_size : int
    """

    name = "coordinates"
    columns = ["frames", "atoms"]

    def __init__(self, *, select: str | None = None, top=None, batch_size: int = 64):
        self.select = select
        self.top = None if top is None else str(top)
        self.batch_size = int(batch_size)

    def options(self) -> dict:
        return {"select": self.select, "top": self.top}

    def load(self, path: str):
        from ...io import load

        s = load(path, top=self.top)
        if self.select:
            idx = s.select_indices(self.select)
            if idx.size == 0:
                raise InputError(f"{path}: selection {self.select!r} matches no atom")
            return np.ascontiguousarray(s.coords[:, idx], dtype=np.float32)
        return np.ascontiguousarray(s.coords, dtype=np.float32)

    def compute_one(self, item):
        return Result(rows=[{"frames": int(item.shape[0]), "atoms": int(item.shape[1])}], arrays={"": item})


