"""Turning the ``models`` / ``reference`` arguments of the scores into padded, batched arrays.

``models`` may be one Structure (every frame is a model), one path, one coordinate array of shape
(atoms, 3) or (models, atoms, 3), or a list of any of these (files of different lengths and
numbering). Models that share a topology (the frames of one Structure, or an array given with a
reference Structure of the same atom count) are matched once and gathered together, on the device
when the coordinates are already there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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


def _array_group(a, name: str) -> ModelGroup:
    shape = tuple(a.shape)
    if len(shape) == 2:
        a = a[None]
        shape = tuple(a.shape)
    if len(shape) != 3 or shape[2] != 3:
        raise InputError(f"{name}: coordinates must have shape (atoms, 3) or (models, atoms, 3), got {shape}")
    names = [name] if shape[0] == 1 else [f"{name}[{i}]" for i in range(shape[0])]
    return ModelGroup(coords=a, topology=None, names=names)


def _structure_group(s: Structure, fallback: str) -> ModelGroup:
    name = mp.source_name(s, fallback)
    names = [name] if s.n_frames == 1 else [f"{name}[{i}]" for i in range(s.n_frames)]
    return ModelGroup(coords=s.coords, topology=s, names=names)


def collect_models(models, reference_topology: Structure | None) -> tuple[list[ModelGroup], bool]:
    """Normalise ``models`` into groups; also say whether one single model was given.

    A bare array whose atom count equals the reference Structure's takes the reference's topology.
    """
    def one(item, fallback):
        if mp.is_array(item):
            g = _array_group(item, fallback)
            if reference_topology is not None:
                if g.coords.shape[1] != reference_topology.n_atoms:
                    raise InputError(
                        f"{fallback}: a coordinate array scored against a Structure must have its "
                        f"{reference_topology.n_atoms} atoms, got {g.coords.shape[1]}"
                    )
                g.topology = reference_topology
            return g
        return _structure_group(mp.as_structure(item, fallback), fallback)

    if isinstance(models, (list, tuple)):
        if not models:
            raise InputError("models: empty list")
        groups = [one(m, f"model_{i}") for i, m in enumerate(models)]
        return groups, False
    g = one(models, "model")
    return [g], len(g.names) == 1


def reference_of(reference) -> tuple[Structure | None, object]:
    """The reference as (Structure, None) or, for a bare array, (None, array of shape (N, 3))."""
    if mp.is_array(reference):
        shape = tuple(reference.shape)
        if len(shape) == 3 and shape[0] == 1:
            reference = reference[0]
            shape = shape[1:]
        if len(shape) != 2 or shape[1] != 3:
            raise InputError(f"reference: coordinates must have shape (atoms, 3), got {shape}")
        return None, reference
    s = mp.as_structure(reference, "reference")
    if s.n_frames != 1:
        raise InputError(f"{mp.source_name(s, 'reference')}: the reference must have one frame, has {s.n_frames}")
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
    xp = be.xp
    ref_s, ref_arr = reference_of(reference)
    groups, single = collect_models(models, ref_s)
    if ref_s is None:
        y_all = be.asarray(ref_arr, dtype)
        n_ref = int(y_all.shape[0])
        xs, names, n_ali, n_model = [], [], [], []
        for g in groups:
            if g.topology is not None:
                raise InputError(f"{g.names[0]}: the reference is a bare array, so the models must be arrays too")
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
    ref_ca_atoms = ref_info.ca_atom[mp.reference_ca(ref_info)]
    n_ref = len(ref_ca_atoms)
    if n_ref < 3:
        raise InputError(f"{mp.source_name(ref_s, 'reference')}: the reference has {n_ref} residues with a CA atom; "
                         "TM-score needs at least 3")
    y_ref = ref_s.coords[0, ref_ca_atoms]
    matches = []
    for gi, g in enumerate(groups):
        explicit = group_mapping(mapping, len(groups), gi)
        info = ref_info if g.topology is ref_s else mp.residue_info(g.topology)
        cm = mp.match_ca(info, ref_info, explicit, g.names[0])
        if len(cm.ref_pos) == 0:
            raise InputError(f"{g.names[0]}: no residue in common with the reference "
                             f"({mp.source_name(ref_s, 'reference')}; mapping={_mapping_name(mapping)})")
        if len(cm.ref_pos) < 3:
            raise InputError(f"{g.names[0]}: only {len(cm.ref_pos)} residue(s) with a CA in common with the "
                             "reference; TM-score needs at least 3")
        matches.append(cm)
    lmax = max(len(cm.ref_pos) for cm in matches)
    m_total = sum(len(g.names) for g in groups)
    shared_y = all(np.array_equal(cm.ref_pos, matches[0].ref_pos) for cm in matches)
    names, n_ali, n_model, n_skipped = [], [], [], []
    if len(groups) == 1:
        c = be.asarray(groups[0].coords, dtype)
        x = xp.ascontiguousarray(c[:, xp.asarray(matches[0].model_atoms)])
    else:
        host = all(not mp.is_array(g.coords) or isinstance(g.coords, np.ndarray) for g in groups)
        x = np.zeros((m_total, lmax, 3), dtype=dtype) if host else xp.zeros((m_total, lmax, 3), dtype=dtype)
        row = 0
        for g, cm in zip(groups, matches, strict=True):
            f = len(g.names)
            if host:
                x[row:row + f, :len(cm.model_atoms)] = np.asarray(g.coords)[:, cm.model_atoms]
            else:
                c = be.asarray(g.coords, dtype)
                x[row:row + f, :len(cm.model_atoms)] = c[:, xp.asarray(cm.model_atoms)]
            row += f
        x = be.asarray(x, dtype)
    for g, cm in zip(groups, matches, strict=True):
        f = len(g.names)
        names += g.names
        n_ali += [len(cm.ref_pos)] * f
        n_model += [cm.n_model] * f
        n_skipped += [cm.n_skipped] * f
    if shared_y:
        y = np.zeros((1, lmax, 3), dtype=dtype)
        y[0, :len(matches[0].ref_pos)] = y_ref[matches[0].ref_pos]
    else:
        y = np.zeros((m_total, lmax, 3), dtype=dtype)
        row = 0
        for g, cm in zip(groups, matches, strict=True):
            y[row:row + len(g.names), :len(cm.ref_pos)] = y_ref[cm.ref_pos]
            row += len(g.names)
    return TMBatch(names, x, be.asarray(y, dtype), np.asarray(n_ali, np.int64), np.asarray(n_model, np.int64),
                   n_ref, np.asarray(n_skipped, np.int64)), single


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
    xp = be.xp
    n = len(ref_atoms)
    m_total = sum(len(g.names) for g in groups)
    names: list = []
    if ref_s is None:
        # arrays matched by index
        parts = []
        for g in groups:
            if g.topology is not None:
                raise InputError(f"{g.names[0]}: the reference is a bare array, so the models must be arrays too")
            c = be.asarray(g.coords, dtype)
            if c.shape[1] != n:
                raise InputError(f"{g.names[0]}: arrays are matched by index; the model has {c.shape[1]} atoms, "
                                 f"the reference {n}")
            parts.append(c)
            names += g.names
        coords = parts[0] if len(parts) == 1 else xp.concatenate(parts)
        return AtomBatch(names, xp.ascontiguousarray(coords))
    host = all(isinstance(g.coords, np.ndarray) for g in groups)
    if host:
        out = np.full((m_total, n, 3), np.nan, dtype=dtype)
    else:
        out = xp.full((m_total, n, 3), xp.nan, dtype=dtype)
    row = 0
    for gi, g in enumerate(groups):
        f = len(g.names)
        info = ref_info if g.topology is ref_s else mp.residue_info(g.topology)
        matoms, slots, _ = mp.match_atoms(info, ref_info, ref_atoms, group_mapping(mapping, len(groups), gi),
                                          g.names[0])
        if len(slots) == 0:
            raise InputError(f"{g.names[0]}: no residue in common with the reference "
                             f"({mp.source_name(ref_s, 'reference')}; mapping={_mapping_name(mapping)})")
        if host:
            out[row:row + f, slots] = np.asarray(g.coords)[:, matoms]
        else:
            c = be.asarray(g.coords, dtype)
            out[row:row + f, xp.asarray(slots)] = c[:, xp.asarray(matoms)]
        names += g.names
        row += f
    return AtomBatch(names, be.asarray(out, dtype))
