"""Turning the ``models`` / ``reference`` arguments of the scores into padded, batched arrays.

``models`` may be one Structure (every frame is a model), one path, one coordinate array of shape
(atoms, 3) or (models, atoms, 3), or a list of any of these (files of different lengths and
numbering). Models that share a topology (the frames of one Structure, or an array given with a
reference Structure of the same atom count) are matched once and gathered together, on the device
when the coordinates are already there.

A model may also come *prepared* (:class:`PreparedModel`, made by :func:`prepare_model`): matched to
the reference in advance, typically in a parse worker of the batch engine, holding only the arrays the
scores read. Batches of prepared models are stacked without any matching and give the numbers the
Structures they came from give.

On the GPU path, host batches are built in reused page-locked (pinned) buffers (:func:`host_buffer`)
and copied to the device with one DMA each (:func:`to_work`); ``timers`` adds up the copy time.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .._inputs import as_structure, check_finite, host_view, is_array, source_name
from ..errors import InputError
from ..structure import Structure
from . import _mapping as mp


@dataclass
class ModelGroup:
    """Models sharing one topology.

    Attributes
    ----------
    coords : array, shape (F, N, 3)
        NumPy, CuPy or torch coordinates, Angstrom.
    topology : Structure or None
        The atom table the coordinates follow; None for bare arrays (matched by index).
    names : list of str, length F
    """

    coords: object
    topology: Structure | None
    names: list
    prepared: PreparedModel | None = None


def _array_group(a, name: str) -> ModelGroup:
    shape = tuple(a.shape)
    if len(shape) == 2:
        a = a[None]
        shape = tuple(a.shape)
    if len(shape) != 3 or shape[2] != 3:
        raise InputError(f"{name}: coordinates must have shape (atoms, 3) or (models, atoms, 3), got {shape}")
    check_finite(host_view(a, name), name)
    names = [name] if shape[0] == 1 else [f"{name}[{i}]" for i in range(shape[0])]
    return ModelGroup(coords=a, topology=None, names=names)


def _structure_group(s: Structure, fallback: str) -> ModelGroup:
    name = source_name(s, fallback)
    check_finite(host_view(s.coords, name), name)
    names = [name] if s.n_frames == 1 else [f"{name}[{i}]" for i in range(s.n_frames)]
    return ModelGroup(coords=s.coords, topology=s, names=names)


def collect_models(models, reference_topology: Structure | None) -> tuple[list[ModelGroup], bool]:
    """Normalise ``models`` into groups; also say whether one single model was given. A
    :class:`ModelGroup` passes as it is (its caller checked its coordinates).

    A bare array whose atom count equals the reference Structure's takes the reference's topology.
    """
    def one(item, fallback):
        if isinstance(item, ModelGroup):  # gathered by a caller (e.g. its coordinates already on the device)
            return item
        if isinstance(item, PreparedModel):
            return ModelGroup(coords=item.ca, topology=None, names=list(item.names), prepared=item)
        if is_array(item):
            g = _array_group(item, fallback)
            if reference_topology is not None:
                if g.coords.shape[1] != reference_topology.n_atoms:
                    raise InputError(
                        f"{fallback}: a coordinate array scored against a Structure must have its "
                        f"{reference_topology.n_atoms} atoms, got {g.coords.shape[1]}"
                    )
                g.topology = reference_topology
            return g
        return _structure_group(as_structure(item, fallback), fallback)

    if isinstance(models, (list, tuple)):
        if not models:
            raise InputError("models: empty list")
        groups = [one(m, f"model_{i}") for i, m in enumerate(models)]
        return groups, False
    g = one(models, "model")
    return [g], len(g.names) == 1


def reference_of(reference) -> tuple[Structure | None, object]:
    """The reference as (Structure, None) or, for a bare array, (None, array of shape (N, 3))."""
    if is_array(reference):
        shape = tuple(reference.shape)
        if len(shape) == 3 and shape[0] == 1:
            reference = reference[0]
            shape = shape[1:]
        if len(shape) != 2 or shape[1] != 3:
            raise InputError(f"reference: coordinates must have shape (atoms, 3), got {shape}")
        check_finite(host_view(reference, "reference"), "reference")
        return None, reference
    s = as_structure(reference, "reference")
    if s.n_frames != 1:
        raise InputError(f"{source_name(s, 'reference')}: the reference must have one frame, has {s.n_frames}")
    check_finite(s.coords, source_name(s, "reference"))
    return s, None


# --------------------------------------------------------------------------------------------------
# TM-score batches


@dataclass
class TMBatch:
    """Aligned CA pairs of every model, padded to a common length.

    Attributes
    ----------
    names : list of str, length M
    x : array, shape (M, Lmax, 3)
        Model CAs in reference order (zeros past ``n_ali``), work-device array.
    y : array, shape (M, Lmax, 3) or (1, Lmax, 3)
        The matched reference CAs; one shared row when every model matches the same residues.
    n_ali : np.ndarray of int64, shape (M,)
    n_model : np.ndarray of int64, shape (M,)
        Model residues with a CA (the TMscore program's model length).
    n_ref : int
        Reference residues with a CA (L_N).
    n_skipped : np.ndarray of int64, shape (M,)
        Model polymer residues without CA.
    """

    names: list
    x: object
    y: object
    n_ali: np.ndarray
    n_model: np.ndarray
    n_ref: int
    n_skipped: np.ndarray


def tm_batch(models, reference, mapping, be, dtype) -> tuple[TMBatch, bool]:
    """Build the :class:`TMBatch` for :func:`protgpu.scoring.tm_score` on backend ``be``."""
    with _stacking():
        return _tm_batch(models, reference, mapping, be, dtype)


def _tm_batch(models, reference, mapping, be, dtype) -> tuple[TMBatch, bool]:
    xp = be.xp
    ref_s, ref_arr = reference_of(reference)
    groups, single = collect_models(models, ref_s)
    if ref_s is None:
        y_all = be.asarray(ref_arr, dtype)
        n_ref = int(y_all.shape[0])
        xs, names, n_ali, n_model = [], [], [], []
        for g in groups:
            _check_bare(g)
            c = be.asarray(g.coords, dtype)
            k = min(int(c.shape[1]), n_ref)
            if k < 3:
                raise InputError(f"{g.names[0]}: fewer than 3 residues in common with the reference")
            xs.append(c[:, :k])
            names += g.names
            n_ali += [k] * c.shape[0]
            n_model += [int(c.shape[1])] * c.shape[0]
        lmax = max(n_ali)
        if len(xs) == 1:
            x = xp.ascontiguousarray(xs[0])
        else:
            x = xp.zeros((len(names), lmax, 3), dtype=dtype)
            row = 0
            for c in xs:
                x[row:row + c.shape[0], :c.shape[1]] = c
                row += c.shape[0]
        y = xp.ascontiguousarray(y_all[None, :lmax])
        return TMBatch(names, x, y, np.asarray(n_ali, np.int64), np.asarray(n_model, np.int64), n_ref,
                       np.zeros(len(names), np.int64)), single

    ref_info = mp.residue_info(ref_s)
    ref_ca_atoms = reference_ca_atoms(ref_s, ref_info)
    n_ref = len(ref_ca_atoms)
    y_ref = ref_s.coords[0, ref_ca_atoms]
    matches = []
    for gi, g in enumerate(groups):
        explicit = group_mapping(mapping, len(groups), gi)
        if g.prepared is not None:
            matches.append(_prepared_ca(g.prepared, ref_info, explicit))
            continue
        info = ref_info if g.topology is ref_s else mp.residue_info(g.topology)
        matches.append(checked_ca_match(info, ref_info, explicit, g.names[0], ref_s))
    lmax = max(len(cm.ref_pos) for cm in matches)
    m_total = sum(len(g.names) for g in groups)
    shared_y = all(np.array_equal(cm.ref_pos, matches[0].ref_pos) for cm in matches)
    names, n_ali, n_model, n_skipped = [], [], [], []
    if len(groups) == 1:
        c = be.asarray(groups[0].coords, dtype)
        x = xp.ascontiguousarray(c[:, xp.asarray(matches[0].model_atoms)])
    else:
        host = all(not is_array(g.coords) or isinstance(g.coords, np.ndarray) for g in groups)
        x = host_buffer((m_total, lmax, 3), dtype, 0, be, "tm_x") if host else xp.zeros((m_total, lmax, 3), dtype)
        row = 0
        for g, cm in zip(groups, matches, strict=True):
            f = len(g.names)
            k = len(cm.model_atoms)
            if g.prepared is not None:  # already the matched CAs, in reference order
                x[row:row + f, :k] = g.coords if host else be.asarray(g.coords, dtype)
            elif host:
                x[row:row + f, :k] = np.asarray(g.coords)[:, cm.model_atoms]
            else:
                c = be.asarray(g.coords, dtype)
                x[row:row + f, :k] = c[:, xp.asarray(cm.model_atoms)]
            row += f
        x = to_work(x, be, dtype) if host else be.asarray(x, dtype)
    for g, cm in zip(groups, matches, strict=True):
        f = len(g.names)
        names += g.names
        n_ali += [len(cm.ref_pos)] * f
        n_model += [cm.n_model] * f
        n_skipped += [cm.n_skipped] * f
    if shared_y:
        y = host_buffer((1, lmax, 3), dtype, 0, be, "tm_y")
        y[0, :len(matches[0].ref_pos)] = y_ref[matches[0].ref_pos]
    else:
        y = host_buffer((m_total, lmax, 3), dtype, 0, be, "tm_y")
        row = 0
        for g, cm in zip(groups, matches, strict=True):
            y[row:row + len(g.names), :len(cm.ref_pos)] = y_ref[cm.ref_pos]
            row += len(g.names)
    return TMBatch(names, x, to_work(y, be, dtype), np.asarray(n_ali, np.int64), np.asarray(n_model, np.int64),
                   n_ref, np.asarray(n_skipped, np.int64)), single


def reference_ca_atoms(ref_s: Structure, ref_info) -> np.ndarray:
    """Atom indices of the reference CAs that count for TM-score; fewer than 3 is an error."""
    ref_ca_atoms = ref_info.ca_atom[mp.reference_ca(ref_info)]
    n_ref = len(ref_ca_atoms)
    if n_ref < 3:
        raise InputError(f"{source_name(ref_s, 'reference')}: the reference has {n_ref} residues with a CA atom; "
                         "TM-score needs at least 3")
    return ref_ca_atoms


def checked_ca_match(info, ref_info, mapping, name: str, ref_s: Structure) -> mp.CAMatch:
    """:func:`~protgpu.scoring._mapping.match_ca`, with an error naming ``name`` when fewer than 3
    CA pairs are in common (TM-score needs 3)."""
    cm = mp.match_ca(info, ref_info, mapping, name)
    if len(cm.ref_pos) == 0:
        raise InputError(f"{name}: no residue in common with the reference "
                         f"({source_name(ref_s, 'reference')}; mapping={_mapping_name(mapping)})")
    if len(cm.ref_pos) < 3:
        raise InputError(f"{name}: only {len(cm.ref_pos)} residue(s) with a CA in common with the "
                         "reference; TM-score needs at least 3")
    return cm


def _check_bare(g: ModelGroup) -> None:
    if g.prepared is not None:
        raise InputError(f"{g.names[0]}: prepared against a reference Structure; score it against that Structure, "
                         "not a bare array")
    if g.topology is not None:
        raise InputError(f"{g.names[0]}: the reference is a bare array, so the models must be arrays too")


def _prepared_ca(pm: PreparedModel, ref_info, mapping) -> mp.CAMatch:
    """The CA match a prepared model carries, after checking it was made for this reference."""
    pm.check(ref_info.key, mapping)
    if pm.ca is None:
        raise InputError(f"{pm.names[0]}: prepared without the TM-score arrays (prepare_model(..., tm=True))")
    k = pm.ca.shape[1]
    return mp.CAMatch(model_atoms=np.arange(k, dtype=np.int64), ref_pos=pm.ca_ref_pos, n_model=pm.n_model,
                      n_skipped=pm.n_skipped)


def work_dtype(models, reference) -> np.dtype:
    """float64 when every coordinate array given is float64, else float32 (Structures are float32)."""
    items = list(models) if isinstance(models, (list, tuple)) else [models]
    arrays = [a for a in [*items, reference] if hasattr(a, "dtype") and hasattr(a, "shape")]
    if arrays and all(str(a.dtype) in ("float64", "torch.float64") for a in arrays):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def first_model(v):
    """The single model's entry of a batched result (a Python scalar for 0-d values)."""
    try:
        item = v[0]
    except (TypeError, IndexError):
        return v
    if getattr(item, "ndim", None) == 0 and hasattr(item, "item"):
        return item.item()
    return item


def _mapping_name(mapping) -> str:
    return mapping if isinstance(mapping, str) else "explicit"


def group_mapping(mapping, n_groups: int, gi: int):
    """The mapping for group ``gi``: a string, one explicit (K, 2) array, or the gi-th of a list of them."""
    if isinstance(mapping, str):
        return mapping
    if isinstance(mapping, (list, tuple)) and len(mapping) == n_groups and len(mapping) > 0 \
            and np.ndim(mapping[0]) == 2:
        return mapping[gi]
    return mapping


# --------------------------------------------------------------------------------------------------
# lDDT batches


@dataclass
class AtomBatch:
    """Model coordinates laid out on the reference's scored atoms.

    Attributes
    ----------
    names : list of str, length M
    coords : array, shape (M, N, 3)
        Work-device array; NaN where the model lacks the atom (so every distance to it fails every
        threshold, which is how missing atoms count, and a residue none of whose atoms is there is
        absent from the model).
    """

    names: list
    coords: object


def atom_batch(groups, ref_s: Structure | None, ref_info, ref_atoms: np.ndarray, mapping, be, dtype) -> AtomBatch:
    """Gather every model's atoms into the reference's scored-atom order (see :class:`AtomBatch`)."""
    with _stacking():
        return _atom_batch(groups, ref_s, ref_info, ref_atoms, mapping, be, dtype)


def _atom_batch(groups, ref_s, ref_info, ref_atoms, mapping, be, dtype) -> AtomBatch:
    xp = be.xp
    n = len(ref_atoms)
    m_total = sum(len(g.names) for g in groups)
    names: list = []
    if ref_s is None:
        # arrays matched by index
        parts = []
        for g in groups:
            _check_bare(g)
            c = be.asarray(g.coords, dtype)
            if c.shape[1] != n:
                raise InputError(f"{g.names[0]}: arrays are matched by index; the model has {c.shape[1]} atoms, "
                                 f"the reference {n}")
            parts.append(c)
            names += g.names
        coords = parts[0] if len(parts) == 1 else xp.concatenate(parts)
        return AtomBatch(names, xp.ascontiguousarray(coords))
    host = all(isinstance(g.coords, np.ndarray) or g.prepared is not None for g in groups)
    if host:
        out = host_buffer((m_total, n, 3), dtype, np.nan, be, "atoms")
    else:
        out = xp.full((m_total, n, 3), xp.nan, dtype=dtype)
    atoms_key = mp.array_key(np.asarray(ref_atoms)) if any(g.prepared is not None for g in groups) else b""
    row = 0
    for gi, g in enumerate(groups):
        f = len(g.names)
        explicit = group_mapping(mapping, len(groups), gi)
        if g.prepared is not None:
            a = _prepared_atoms(g.prepared, ref_info, explicit, atoms_key, n)
            out[row:row + f] = a if host else be.asarray(a, dtype)
            names += g.names
            row += f
            continue
        info = ref_info if g.topology is ref_s else mp.residue_info(g.topology)
        matoms, slots = checked_atom_match(info, ref_info, ref_atoms, explicit, g.names[0], ref_s)
        if host:
            out[row:row + f, slots] = np.asarray(g.coords)[:, matoms]
        else:
            c = be.asarray(g.coords, dtype)
            out[row:row + f, xp.asarray(slots)] = c[:, xp.asarray(matoms)]
        names += g.names
        row += f
    return AtomBatch(names, to_work(out, be, dtype) if host else be.asarray(out, dtype))


def checked_atom_match(info, ref_info, ref_atoms: np.ndarray, mapping, name: str, ref_s: Structure,
                       atoms_key: bytes | None = None):
    """:func:`~protgpu.scoring._mapping.match_atoms` (model atoms, slots), with an error naming ``name``
    when no residue is in common."""
    matoms, slots, _ = mp.match_atoms(info, ref_info, ref_atoms, mapping, name, atoms_key)
    if len(slots) == 0:
        raise InputError(f"{name}: no residue in common with the reference "
                         f"({source_name(ref_s, 'reference')}; mapping={_mapping_name(mapping)})")
    return matoms, slots


def _prepared_atoms(pm: PreparedModel, ref_info, mapping, atoms_key: bytes, n: int) -> np.ndarray:
    """The lDDT layout a prepared model carries, after checking it was made for these atoms."""
    pm.check(ref_info.key, mapping)
    if pm.atoms is None or pm.atoms_key != atoms_key or pm.atoms.shape[1] != n:
        raise InputError(f"{pm.names[0]}: prepared for other lDDT atoms of the reference (lddt_atoms differs, or "
                         "prepared without lDDT)")
    return pm.atoms


# --------------------------------------------------------------------------------------------------
# Models matched in advance (the batch engine's parse workers make these)


@dataclass
class PreparedModel:
    """A model matched to a reference in advance, holding only the arrays TM-score and lDDT read.

    Made by :func:`prepare_model` (in the batch engine: in the parse worker, so that the matching runs
    in parallel and only these arrays cross back to the scoring process). :func:`protgpu.tm_score` and
    :func:`protgpu.lddt` take it wherever they take a model Structure, against the same reference and
    mapping, and give the same numbers.

    Attributes
    ----------
    names : list of str, length F
        Model names: the file name, or ``name[i]`` for frame i of a multi-frame file.
    n_residues : int
        Residues of the model (the batch engine groups models of similar size).
    reference_key : bytes
        :func:`~protgpu.scoring._mapping.topology_key` of the reference it was matched to.
    mapping : {"resnum", "sequence"}
    ca : np.ndarray of float32, shape (F, K, 3) or None
        The model's CAs of the K matched residues, in reference order, Angstrom (None: no TM-score data).
    ca_ref_pos : np.ndarray of int64, shape (K,) or None
        Their positions in the reference's CA list.
    n_model, n_skipped : int
        Model residues with a CA; polymer residues without one (see :class:`TMBatch`).
    atoms : np.ndarray of float32, shape (F, N, 3) or None
        The model's coordinates on the reference's N scored lDDT atoms, NaN where it lacks the atom.
    atoms_key : bytes
        Digest of the reference atom indices ``atoms`` follows (which ``lddt_atoms`` it was made for).
    timings : dict of str to float
        Seconds spent preparing (``match_s``), for the batch engine's breakdown.
    """

    names: list
    n_residues: int
    reference_key: bytes
    mapping: str
    ca: np.ndarray | None = None
    ca_ref_pos: np.ndarray | None = None
    n_model: int = 0
    n_skipped: int = 0
    atoms: np.ndarray | None = None
    atoms_key: bytes = b""
    timings: dict = field(default_factory=dict)

    @property
    def n_frames(self) -> int:
        return len(self.names)

    def check(self, reference_key: bytes, mapping) -> None:
        """Raise :class:`InputError` unless prepared against this reference table and mapping."""
        if self.reference_key != reference_key or self.mapping != mapping:
            raise InputError(f"{self.names[0]}: prepared against another reference or mapping "
                             f"(mapping={self.mapping}); prepare it again for this one")


class PreparedReference:
    """The reference side of :func:`prepare_model`, computed once and reused for every model.

    Parameters
    ----------
    reference : Structure or path
        One frame.
    """

    def __init__(self, reference):
        ref_s, _ = reference_of(reference)
        if ref_s is None:
            raise InputError("reference: models are prepared against a reference Structure, not an array")
        self.structure = ref_s
        self.info = mp.residue_info(ref_s)
        self._atoms: dict = {}

    @property
    def key(self) -> bytes:
        return self.info.key

    def scored_atoms(self, atoms: str) -> tuple[np.ndarray, bytes]:
        """The reference atoms lDDT scores with ``atoms`` ("heavy" or "ca") and their digest."""
        if atoms not in self._atoms:
            idx = mp.lddt_reference_atoms(self.info, self.structure, atoms)
            self._atoms[atoms] = (idx, mp.array_key(idx))
        return self._atoms[atoms]


def prepare_model(model, reference, *, mapping: str = "resnum", tm: bool = True,
                  lddt_atoms: str | None = "heavy") -> PreparedModel:
    """Match one model to the reference ahead of scoring (see :class:`PreparedModel`).

    Parameters
    ----------
    model : Structure or path
        Every frame is a model.
    reference : PreparedReference, Structure or path
        Pass a :class:`PreparedReference` when preparing many models.
    mapping : {"resnum", "sequence"}
    tm : bool
        Keep the TM-score arrays (CA pairs).
    lddt_atoms : {"heavy", "ca"} or None
        Keep the lDDT arrays for these reference atoms (None: none).

    Returns
    -------
    PreparedModel

    Raises
    ------
    InputError
        What :func:`protgpu.tm_score` / :func:`protgpu.lddt` would raise for this model, naming it: no
        (or fewer than 3) residues in common, chains that cannot be paired, a reference without CAs.
    """
    t0 = time.perf_counter()
    ref = reference if isinstance(reference, PreparedReference) else PreparedReference(reference)
    if mapping not in ("resnum", "sequence"):
        raise InputError(f"mapping must be 'resnum' or 'sequence' to prepare models, not {mapping!r}")
    s = as_structure(model, "model")
    g = _structure_group(s, "model")
    name = g.names[0]
    info = mp.residue_info(s)
    pm = PreparedModel(names=g.names, n_residues=s.n_residues, reference_key=ref.key, mapping=mapping)
    # the checks (and their order) of tm_score, then lddt, so that a bad model fails with the same message
    if tm:
        reference_ca_atoms(ref.structure, ref.info)
        cm = checked_ca_match(info, ref.info, mapping, name, ref.structure)
        pm.ca = s.coords[:, cm.model_atoms]
        pm.ca_ref_pos, pm.n_model, pm.n_skipped = cm.ref_pos, cm.n_model, cm.n_skipped
    if lddt_atoms is not None:
        ref_atoms, atoms_key = ref.scored_atoms(lddt_atoms)
        if ref_atoms.size == 0:
            raise InputError(f"{source_name(ref.structure, 'reference')}: no atoms to score with "
                             f"atoms={lddt_atoms!r}")
        matoms, slots = checked_atom_match(info, ref.info, ref_atoms, mapping, name, ref.structure, atoms_key)
        pm.atoms, pm.atoms_key = _laid_out(s.coords, matoms, slots, len(ref_atoms)), atoms_key
    pm.timings["match_s"] = time.perf_counter() - t0
    return pm


def _laid_out(coords: np.ndarray, matoms: np.ndarray, slots: np.ndarray, n: int) -> np.ndarray:
    """(F, n, 3) float32: ``coords[:, matoms]`` at ``slots``, NaN elsewhere - as one gather from the
    coordinates with a NaN atom appended (scattering (x, y, z) rows by fancy index is ~5x slower)."""
    f, n_atoms = coords.shape[:2]
    src = np.full(n, n_atoms, dtype=np.intp)
    src[slots] = matoms
    ext = np.empty((f, n_atoms + 1, 3), dtype=np.float32)
    ext[:, :n_atoms] = coords
    ext[:, n_atoms] = np.nan
    return np.take(ext, src, axis=1)


# --------------------------------------------------------------------------------------------------
# Host staging for the GPU path

#: Seconds spent building batches (matching, gathering, padding: ``stack_s``) and copying them to the
#: device (``transfer_s``), summed over this process's calls; the batch engine reads the differences.
timers = {"stack_s": 0.0, "transfer_s": 0.0}


@contextlib.contextmanager
def _stacking():
    t0, moved = time.perf_counter(), timers["transfer_s"]
    try:
        yield
    finally:
        timers["stack_s"] += time.perf_counter() - t0 - (timers["transfer_s"] - moved)

_PINNED_MAX = 256 << 20  # larger batches go through CuPy's own copy (pinning that much costs more)
_staging = threading.local()  # per thread: two threads scoring at once must not share a buffer


def _pinned_view(tag: str, shape: tuple, dtype: np.dtype) -> np.ndarray | None:
    n = math.prod(shape)
    nbytes = n * dtype.itemsize
    if nbytes == 0 or nbytes > _PINNED_MAX:
        return None
    bufs = getattr(_staging, "bufs", None)
    if bufs is None:
        bufs = _staging.bufs = {}
    mem, size = bufs.get(tag, (None, 0))
    if mem is None or size < nbytes:
        import cupy

        size = 1 << max(20, (nbytes - 1).bit_length())  # grow by powers of two: few reallocations
        try:
            mem = cupy.cuda.alloc_pinned_memory(size)
        except Exception:  # pinned memory is a nicety; without it the copy is only slower
            return None
        bufs[tag] = (mem, size)
    return np.frombuffer(mem, dtype=dtype, count=n).reshape(shape)


def host_buffer(shape: tuple, dtype, fill, be, tag: str) -> np.ndarray:
    """A host array of ``shape`` filled with ``fill``, to build a batch in before :func:`to_work`.

    On the GPU path it is a view of a page-locked buffer kept per ``tag`` (and thread) and reused by
    the next batch: the device copy is then one DMA, without the staging copy that a copy from
    pageable memory makes. On the CPU path (or when pinning fails) it is a new NumPy array.
    """
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    a = _pinned_view(tag, shape, dtype) if be.on_gpu else None
    if a is None:
        return np.full(shape, fill, dtype=dtype)
    a.fill(fill)
    return a


def to_work(host: np.ndarray, be, dtype):
    """``host`` on the work device: itself on the CPU path; on the GPU a device copy, finished before
    returning because :func:`host_buffer` reuses the host memory for the next batch."""
    if not be.on_gpu:
        return be.asarray(host, dtype)
    import cupy as cp

    t0 = time.perf_counter()
    host = np.ascontiguousarray(host, dtype=dtype)
    out = cp.empty(host.shape, dtype=dtype)
    stream = cp.cuda.get_current_stream()
    out.set(host, stream=stream)
    stream.synchronize()
    timers["transfer_s"] += time.perf_counter() - t0
    return out
