"""The job of ``protgpu contacts``: a residue contact map per input (:func:`protgpu.contacts`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..job import Job, warm_device
from ..results import Result

__all__ = ["ContactsJob"]


class ContactsJob(Job):
    """Residue contact map of every input (:func:`protgpu.contacts`), one set of arrays per input.

    Each input's result is :meth:`protgpu.contacts.ContactMap.to_dict` (``frequency``, ``distances``,
    ``contacts``, residue labels, ...; stored in an ``.npz`` as ``<stem>/<name>``) and one row with
    ``residues``, ``frames``, ``summary`` (the one-line summary), ``device`` and ``seconds``.

    Parameters
    ----------
    scheme, cutoff, min_separation, residues, frequency, output, inter_chain, periodic
        As :func:`protgpu.contacts` (``residues`` is the CLI's ``--select``).
    top : str, optional
        Topology for trajectory inputs.
    device : {"auto", "cpu", "gpu"}
    on_map : callable, optional
        ``on_map(path, contact_map)``, called where the map is computed (e.g. to draw it). Must be
        picklable (a module-level function or a ``functools.partial`` of one) for Dask.
    batch_size : int
        Inputs per engine batch (each is still computed on its own).
    """

    name = "contacts"
    columns = ["residues", "frames", "summary", "device", "seconds"]

    def __init__(self, *, scheme: str = "closest-heavy", cutoff: float = 4.5, min_separation: int = 3,
                 residues=None, frequency: bool = False, output: str = "dense", inter_chain: bool = True,
                 periodic: bool = True, top=None, device: str = "auto", on_map: Callable | None = None,
                 batch_size: int = 32):
        from ...contacts.api import check_parameters

        # protgpu.contacts' own check, before any input is read: a bad parameter stops the run at once
        # (with --keep-going too) instead of failing every input
        check_parameters(scheme=scheme, cutoff=cutoff, min_separation=min_separation, output=output)
        self.scheme = scheme
        self.cutoff = float(cutoff)
        # an integer as given (bool, np.int64: as int() makes it); anything else is for contacts() to refuse
        self.min_separation = int(min_separation) if isinstance(min_separation, (int, np.integer)) else min_separation
        self.residues = residues
        self.frequency = bool(frequency)
        self.output = output
        self.inter_chain = bool(inter_chain)
        self.periodic = bool(periodic)
        self.top = None if top is None else str(top)
        self.device = device
        self.on_map = on_map
        self.batch_size = int(batch_size)

    def options(self) -> dict:
        return {"scheme": self.scheme, "cutoff": self.cutoff, "min_separation": self.min_separation,
                "residues": self.residues if isinstance(self.residues, (str, type(None))) else "array",
                "frequency": self.frequency, "output": self.output, "inter_chain": self.inter_chain,
                "periodic": self.periodic, "top": self.top}

    def load(self, path: str):
        from ...io import load

        return path, load(path, top=self.top)

    def warm_up(self) -> None:
        """Decide ``device="auto"`` once the engine's parse workers have started
        (:func:`protgpu.batch.job.warm_device`); on the GPU also load the contact-map kernel (Structures hold
        float32 coordinates, so the float32 one), which creates the CUDA context while the workers parse."""
        def load_kernel():
            from ... import _cuda

            _cuda.get_kernel("contacts", "contact_map_f32")

        warm_device(self.device, load_kernel)

    def compute_one(self, item):
        from ...contacts import contacts

        path, s = item
        t0 = time.perf_counter()
        cm = contacts(s, scheme=self.scheme, cutoff=self.cutoff, min_separation=self.min_separation,
                      residues=self.residues, frequency=self.frequency, output=self.output,
                      inter_chain=self.inter_chain, periodic=None if self.periodic else False, device=self.device)
        arrays = cm.to_dict()  # on the host: the timing below includes the copy back
        dt = time.perf_counter() - t0
        if self.on_map is not None:
            self.on_map(path, cm)
        return Result(rows=[{"residues": cm.n_residues, "frames": cm.n_frames, "summary": cm.summary(),
                             "device": cm.device, "seconds": dt}], arrays=arrays)

