"""Batch-engine jobs of ``protgpu contacts``, ``protgpu rmsd`` and ``protgpu pairwise-rmsd``, and the
whole-run outputs that do not go through the engine's journal (a Zarr store, a one-shot manifest).

Each job is a :class:`protgpu.batch.Job`: ``load`` runs in the engine's parse workers, ``compute`` in
the calling process (or on a Dask worker), one result per input, so that every subcommand gets the
engine's input forms, manifest, ``--resume``, ``--keep-going``, ``--shard`` and Dask options::

    import protgpu as pg
    from protgpu.jobs import ContactsJob, RmsdJob

    pg.batch.run("models/", ContactsJob(scheme="ca", cutoff=8.0), out="maps.npz", keep_going=True)
    pg.batch.run("models/", RmsdJob(pg.load("native.pdb"), fit="ca"), out="rmsd.parquet")

Results never depend on which inputs share a batch (each input is computed on its own), which is what
makes a resumed run write the bytes of an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from .batch import MANIFEST_FORMAT, Job, Result, _warm_device
from .errors import InputError

# require_zarr, remove_stale_stores and write_run_record are the CLI's helpers: importable, not listed
__all__ = ["ContactsJob", "CoordinatesJob", "RmsdJob", "atomic_store", "write_zarr"]


# ----------------------------------------------------------------------------------------------------
# Jobs
# ----------------------------------------------------------------------------------------------------


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
        from .contacts import SCHEMES

        if scheme not in SCHEMES:
            raise InputError(f"scheme {scheme!r}: choose from {', '.join(SCHEMES)}")
        if output not in ("dense", "pairs"):
            raise InputError(f"output must be 'dense' or 'pairs', not {output!r}")
        if not (np.isfinite(cutoff) and cutoff > 0):
            raise InputError(f"--cutoff {cutoff}: must be positive")
        if int(min_separation) != min_separation or min_separation < 0:
            raise InputError(f"--min-separation {min_separation}: must be an integer >= 0")
        self.scheme = scheme
        self.cutoff = float(cutoff)
        self.min_separation = int(min_separation)
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
        from .io import load

        return path, load(path, top=self.top)

    def warm_up(self) -> None:
        """Decide ``device="auto"`` once the engine's parse workers have started
        (:func:`protgpu.batch._warm_device`); on the GPU also load the contact-map kernel (Structures hold
        float32 coordinates, so the float32 one), which creates the CUDA context while the workers parse."""
        def load_kernel():
            from . import _cuda

            _cuda.get_kernel("contacts", "contact_map_f32")

        _warm_device(self.device, load_kernel)

    def compute_one(self, item):
        from .contacts import contacts

        path, s = item
        t0 = time.perf_counter()
        cm = contacts(s, scheme=self.scheme, cutoff=self.cutoff, min_separation=self.min_separation,
                      residues=self.residues, frequency=self.frequency, output=self.output,
                      inter_chain=self.inter_chain, periodic=self.periodic, device=self.device)
        arrays = cm.to_dict()  # on the host: the timing below includes the copy back
        dt = time.perf_counter() - t0
        if self.on_map is not None:
            self.on_map(path, cm)
        return Result(rows=[{"residues": cm.n_residues, "frames": cm.n_frames, "summary": cm.summary(),
                             "device": cm.device, "seconds": dt}], arrays=arrays)


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
    columns = ["input", "frame", "rmsd_angstrom"]

    def __init__(self, reference, *, reference_name: str | None = None, fit: str | None = None,
                 atoms: str | None = None, top=None, ref_frame: int = 0, keep_aligned: bool = False,
                 device: str = "auto", batch_size: int = 64):
        from .batch import file_sha256

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
        from .io import load

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
        (:func:`protgpu.batch._warm_device`); on the GPU also take the RMSD of the reference to itself,
        which creates the CUDA context and loads the QCP kernels while the workers parse."""
        from .superpose import rmsd

        _warm_device(self.device, lambda: rmsd(self.ref_compact, self.ref_compact, fit=self.fit_idx,
                                               atoms=self.meas_idx, device=self.device))

    def compute_one(self, item):
        from ._array import to_numpy
        from .superpose import rmsd, superpose

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
        from .io import load

        s = load(path, top=self.top)
        if self.select:
            idx = s.select_indices(self.select)
            if idx.size == 0:
                raise InputError(f"{path}: selection {self.select!r} matches no atom")
            return np.ascontiguousarray(s.coords[:, idx], dtype=np.float32)
        return np.ascontiguousarray(s.coords, dtype=np.float32)

    def compute_one(self, item):
        return Result(rows=[{"frames": int(item.shape[0]), "atoms": int(item.shape[1])}], arrays={"": item})


# ----------------------------------------------------------------------------------------------------
# Whole-run outputs: a Zarr store written atomically, and the record of a run that has no journal
# ----------------------------------------------------------------------------------------------------


def require_zarr(dest, option: str = "--out"):
    """The ``zarr`` module (version 3 or later), or an :class:`InputError` naming ``dest``."""
    try:
        import zarr
    except ImportError:
        raise InputError(f"{option} {dest}: writing .zarr needs the zarr package (pip install zarr)") from None
    if int(zarr.__version__.split(".")[0]) < 3:
        raise InputError(f"{option} {dest}: writing .zarr needs zarr 3 or later (found {zarr.__version__})")
    return zarr


@contextlib.contextmanager
def atomic_store(dest):
    """Context manager yielding a temporary folder path beside ``dest``; on success it takes ``dest``'s
    place, on an exception it is removed and ``dest`` is left as it was.

    A folder (a Zarr store) cannot be renamed over a non-empty one, so an existing ``dest`` is first
    renamed aside and removed after the swap: a reader sees the old store, or the new one, or (for
    the instant between two renames) none, never a partly written one.

    Parameters
    ----------
    dest : str or os.PathLike

    Yields
    ------
    str
        ``.NAME.<random>.tmp`` in ``dest``'s folder.

    Examples
    --------
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with atomic_store(os.path.join(d, "out.zarr")) as tmp:
    ...     os.makedirs(tmp)
    ...     _ = open(os.path.join(tmp, "zarr.json"), "w").write("{}")
    >>> os.listdir(d), os.listdir(os.path.join(d, "out.zarr"))
    (['out.zarr'], ['zarr.json'])
    """
    dest = Path(str(dest).rstrip("/"))
    folder = dest.parent if str(dest.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"{dest}: folder {folder} does not exist")
    tag = uuid.uuid4().hex[:8]
    tmp = folder / f".{dest.name}.{tag}.tmp"
    try:
        yield str(tmp)
        old = None
        if dest.exists() or dest.is_symlink():
            old = folder / f".{dest.name}.{tag}.old.tmp"
            os.replace(dest, old)
        try:
            os.replace(tmp, dest)
        except BaseException:
            if old is not None:
                os.replace(old, dest)
            raise
        if old is not None:
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_stale_stores(dest) -> None:
    """Remove temporary stores that a killed run left beside ``dest`` (``.NAME.*.tmp`` folders)."""
    dest = Path(str(dest).rstrip("/"))
    folder = dest.parent if str(dest.parent) else Path(".")
    for p in folder.glob(f".{dest.name}.*.tmp"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)


def _zarr_put(group, key: str, arr: np.ndarray) -> None:
    if arr.dtype.kind in "US":
        # variable-length UTF-8: the string type the Zarr v3 specification defines
        z = group.create_array(key, shape=arr.shape, dtype=str)
        z[...] = arr.astype(str)
        return
    # chunks of about 4 MiB along the first axis (one input's frames or a matrix's rows)
    rows = (1 << 22) // max(1, arr.itemsize * int(np.prod(arr.shape[1:])))
    chunks = tuple(max(1, c) for c in (min(arr.shape[0], rows), *arr.shape[1:])) if arr.ndim else ()
    z = group.create_array(key, shape=arr.shape, dtype=arr.dtype, chunks=chunks)
    z[...] = arr


def write_zarr(dest, items: Iterable, attrs: dict | None = None) -> Path:
    """Write named arrays as one Zarr (v3) group, atomically (:func:`atomic_store`).

    Parameters
    ----------
    dest : str or os.PathLike
        The store folder, ``NAME.zarr``.
    items : iterable of (str, array_like)
        Array names (a ``/`` makes a subgroup: ``adk_open/distances``) and arrays; string arrays are
        stored as variable-length UTF-8. Written one at a time, so a generator keeps memory low.
    attrs : dict, optional
        JSON attributes of the root group.

    Returns
    -------
    pathlib.Path
        ``dest``.

    Raises
    ------
    InputError
        zarr is not installed, or the folder of ``dest`` does not exist.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np
    >>> items = [("adk_open/distances", np.zeros((1, 3, 3), np.float32)), ("inputs", np.array(["adk_open.pdb"]))]
    >>> path = write_zarr(os.path.join(tempfile.mkdtemp(), "d.zarr"), items)
    >>> import zarr
    >>> g = zarr.open_group(str(path), mode="r")
    >>> g["adk_open/distances"].shape, g["inputs"][:].tolist()
    ((1, 3, 3), ['adk_open.pdb'])
    """
    zarr = require_zarr(dest)
    with atomic_store(dest) as tmp:
        root = zarr.open_group(tmp, mode="w")
        if attrs:
            root.attrs.update(attrs)
        for key, arr in items:
            _zarr_put(root, str(key), np.asarray(arr))
    return Path(str(dest).rstrip("/"))


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
    from .batch import _write_errors, _writing

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
    _writing(manifest, lambda tmp: Path(tmp).write_text(text))
    failed = [(e["input"], e.get("sha256"), e.get("error", "")) for e in entries if e["status"] != "ok"]
    return manifest, _write_errors(out, failed)
