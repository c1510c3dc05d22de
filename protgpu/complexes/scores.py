"""Scores of a model complex against a reference complex, on the residues a chain mapping pairs.

What exists in protgpu is reused on the mapped residues (the mapping's residue pairs are the explicit
``mapping=`` of those functions): lDDT and backbone (CA) lDDT are :func:`protgpu.lddt`; the CA RMSD
is :func:`protgpu.tm_score`; GDT-TS/HA are OpenStructure's window search
(:mod:`protgpu.scoring.gdt_windows`, normalised by the reference's total length); TM-score is
US-align's complex mode (:mod:`protgpu.align.complex_mode`, normalised by the reference's total
length), or the TMscore program's search on the mapped residues (``tm_mode="mapped"``); the interface
lDDT is lDDT's own NumPy twin on the inter-chain pairs only; DockQ's RMSDs after superposition are
:func:`protgpu.rmsd`. New here: QS-score (Bertoni et al. 2017, as OpenStructure's ``QSScorer``)
and DockQ (Basu & Wallner 2016; the v2 aggregate of Mirabello & Wallner 2024). Definitions, and what
reproduces OpenStructure, are in docs/design/complexes.md.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._autograd import refuse_grad
from .._inputs import source_name
from ..align.complex_mode import complex_tm
from ..errors import InputError
from ..scoring import _mapping as mp
from ..scoring.gdt_windows import gdt_windows_started
from ..scoring.lddt import lddt_counts_numpy, lddt_scores
from ..scoring.tmscore import tm_score
from ..structure import Structure
from ..superpose import rmsd
from ._atoms import BACKBONE, atom_table, heavy_atoms, representative_atoms  # noqa: F401  (were defined here)
from ._cleanup import clean, clean_keep
from ._contacts import (
    _contact_atoms,
    _contact_pairs,  # noqa: F401  (was defined here: tests and callers import it from here)
    _contacts,
    _near,
    _pairs_below,  # noqa: F401  (tests import it from here)
    _residue_pairs,
)
from .mapping import MAX_NAIVE, ChainMapping, _map, model_structure, protein_chains, reference_structure
from .qs import QS_CONTACT, _qs_reps, _QSChains, qs_score  # noqa: F401  (were defined here)
from .stereo import stereo_drop

# qs_score and dockq (one mapped model, one interface) stay importable by name for tests; not public API
__all__ = ["METRICS", "score_complex"]

#: Every metric :func:`score_complex` computes, in its column order.
METRICS = ("lddt", "bb_lddt", "ilddt", "tm_score", "gdtts", "gdtha", "rmsd", "qs_global", "qs_best", "dockq")

DOCKQ_CONTACT = 5.0  # Angstrom, heavy-atom contact of fnat
DOCKQ_INTERFACE = 10.0  # Angstrom, interface residues of iRMSD
#: ``tm_score`` modes: "usalign" - US-align's complex mode (MM-align, as OpenStructure) on protgpu's chain
#: mapping (OpenStructure's ``oum``); "usalign-auto" - MM-align assigning chains itself (OpenStructure's
#: default); "mapped" - the TMscore program's search on the mapped residues (docs/design/complexes.md).
TM_MODES = ("usalign", "usalign-auto", "mapped")


# --------------------------------------------------------------------------------------------------
# DockQ


def _bb_pairs(minfo, rinfo, mres, rres):
    """(model atom, reference atom) pairs of the backbone atoms both residues have."""
    mt, rt = atom_table(minfo, mres, BACKBONE), atom_table(rinfo, rres, BACKBONE)
    ok = (mt >= 0) & (rt >= 0)
    return mt[ok], rt[ok]


def _fit_rmsd(mx, rx, fit_m, fit_r, meas_m=None, meas_r=None, device: str = "cpu") -> np.ndarray:
    """RMSD (M,) on the measured atoms after superposing the fitted ones (the measured = fitted by
    default), for models ``mx`` of shape (M, N, 3) (NumPy, or CuPy: gathered there): one batched
    :func:`protgpu.rmsd` call, in float64."""
    from .._array import get_namespace

    m = mx.shape[0]
    if len(fit_m) < 3 or (meas_m is not None and not len(meas_m)):
        return np.zeros(m)  # OpenStructure's and DockQ's convention: too few atoms to superpose
    xp = get_namespace(mx)
    n = len(fit_m)
    both_m = fit_m if meas_m is None else np.concatenate([fit_m, meas_m])
    both_r = fit_r if meas_r is None else np.concatenate([fit_r, meas_r])
    x = mx[:, xp.asarray(both_m)].astype(xp.float64)
    atoms = None if meas_m is None else np.arange(n, len(both_m))
    return _host(rmsd(x, rx[both_r], fit=np.arange(n), atoms=atoms, device=device))


class _NativeInterface:
    """What DockQ needs of one reference interface (r1, r2), computed once per reference: the native
    residue contacts and the interface residues of iRMSD."""

    def __init__(self, ref_s, r1: str, r2: str):
        rinfo = mp.residue_info(ref_s)
        rch = protein_chains(rinfo)
        rx = np.asarray(ref_s.coords[0], np.float64)
        ra1, ra2 = heavy_atoms(ref_s, rinfo, rch[r1]), heavy_atoms(ref_s, rinfo, rch[r2])
        self.native = _contacts(rx, ra1, ra2, rinfo.atom_residue, DOCKQ_CONTACT)
        self.interface = sorted(_near(rx, ra1, ra2, rinfo.atom_residue, DOCKQ_INTERFACE)
                                | _near(rx, ra2, ra1, rinfo.atom_residue, DOCKQ_INTERFACE))
        self.r1_larger = len(rch[r1]) > len(rch[r2])  # the receptor of LRMSD: the larger chain
        self.n_ref_residues = len(rinfo.resid)


def _dockq_model_side(mdl_s, nat: _NativeInterface, mapping: ChainMapping, r1: str, r2: str) -> tuple:
    """(heavy atoms of the model chain on r1, on r2, model residue -> reference residue): per atom table
    and mapping. Unmapped model residues get keys no reference residue has."""
    minfo = mp.residue_info(mdl_s)
    mch = protein_chains(minfo)
    p1, p2 = mapping.residues[r1], mapping.residues[r2]
    to_ref = np.arange(len(minfo.resid), dtype=np.int64) + nat.n_ref_residues
    to_ref[p1[:, 0]], to_ref[p2[:, 0]] = p1[:, 1], p2[:, 1]
    ma1 = heavy_atoms(mdl_s, minfo, mch[mapping.chains[r1]])
    ma2 = heavy_atoms(mdl_s, minfo, mch[mapping.chains[r2]])
    return ma1, ma2, to_ref, minfo.atom_residue


def _dockq_contacts(mdl_s, x, nat: _NativeInterface, mapping: ChainMapping, r1: str, r2: str,
                    memo: dict | None = None, found: dict | None = None, keep=None) -> dict:
    """fnat, fnonnat, nnat and nmdl of one model (coordinates ``x``, (N, 3)) at the reference interface
    (r1, r2): residue pairs with heavy atoms within 5 A, the model's residues read through the mapping.
    ``memo`` as :func:`_qs_interface`. ``found``: the inter-chain atom contacts the design-sanity
    metrics found in the model before its clean-up (see :func:`~protgpu.complexes.sanity.sanity_of`);
    used instead of a second search when they are at 5 A between the same atoms (``keep``: the atoms
    of the model the clean-up kept, None for all)."""
    if memo is None:
        side = _dockq_model_side(mdl_s, nat, mapping, r1, r2)
    else:
        if ("dockq", r1, r2) not in memo:
            memo["dockq", r1, r2] = _dockq_model_side(mdl_s, nat, mapping, r1, r2)
        side = memo["dockq", r1, r2]
    ma1, ma2, to_ref, atom_residue = side
    pairs = _shared_contacts(found, keep, mapping.chains[r1], mapping.chains[r2], ma1, ma2)
    if pairs is None:
        pairs = _contact_atoms(np.asarray(x, np.float64), ma1, ma2, DOCKQ_CONTACT)
    found = to_ref[_residue_pairs(atom_residue[ma1[pairs[0]]], atom_residue[ma2[pairs[1]]])]
    mdl = set(map(tuple, found.tolist()))  # distinct: the mapping is one to one
    nnat = len(nat.native)
    return {"fnat": len(nat.native & mdl) / nnat if nnat else 0.0,
            "fnonnat": len(mdl - nat.native) / len(mdl) if mdl else 0.0,
            "nnat": float(nnat), "nmdl": float(len(mdl))}


def _shared_contacts(found: dict | None, keep, c1: str, c2: str, ma1: np.ndarray, ma2: np.ndarray):
    """The atom contacts (i, j) of model chains c1 and c2 at :data:`DOCKQ_CONTACT`, as positions in
    ``ma1`` and ``ma2``, taken from ``found`` (the design-sanity search, see :func:`_dockq_contacts`):
    None unless it searched at that cutoff between the very same atoms (same coordinates: the
    contacts are the same pairs, so the counts are too)."""
    if not found or found["cutoff"] != DOCKQ_CONTACT:
        return None
    atoms = found["atoms"]
    if c1 not in atoms or c2 not in atoms:
        return None
    raw1, raw2 = (ma1, ma2) if keep is None else (keep[ma1], keep[ma2])
    if not (np.array_equal(raw1, atoms[c1]) and np.array_equal(raw2, atoms[c2])):
        return None
    if (c1, c2) in found["pairs"]:
        return found["pairs"][c1, c2]
    j, i = found["pairs"][c2, c1]
    return i, j


def _dockq_rmsds(mdl_s, xs: np.ndarray, ref_s, nat: _NativeInterface, mapping: ChainMapping, r1: str, r2: str,
                 device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """iRMSD and LRMSD (M,) of models of one atom table and mapping (``xs`` (M, N, 3), NumPy or CuPy):
    one batched :func:`protgpu.rmsd` call each.

    iRMSD: backbone (N, CA, C, O) RMSD of the reference's interface residues (any heavy atom within 10 A
    of the partner chain) that are mapped, after superposing them; LRMSD: backbone RMSD of the ligand
    (the reference chain with fewer residues) after superposing the receptor.
    """
    minfo, rinfo = mp.residue_info(mdl_s), mp.residue_info(ref_s)
    rx = np.asarray(ref_s.coords[0], np.float64)
    p1, p2 = mapping.residues[r1], mapping.residues[r2]
    both = np.concatenate([p1, p2])
    sel = both[np.isin(both[:, 1], nat.interface)]
    fm, fr = _bb_pairs(minfo, rinfo, sel[:, 0], sel[:, 1])
    irmsd = _fit_rmsd(xs, rx, fm, fr, device=device)
    rec, lig = (p1, p2) if nat.r1_larger else (p2, p1)
    fm, fr = _bb_pairs(minfo, rinfo, rec[:, 0], rec[:, 1])
    lm, lr = _bb_pairs(minfo, rinfo, lig[:, 0], lig[:, 1])
    return irmsd, _fit_rmsd(xs, rx, fm, fr, lm, lr, device=device)


def dockq_formula(fnat, irmsd, lrmsd):
    """DockQ = (fnat + 1/(1+(iRMSD/1.5)^2) + 1/(1+(LRMSD/8.5)^2)) / 3 (Basu & Wallner 2016)."""
    return (fnat + 1.0 / (1.0 + (irmsd / 1.5) ** 2) + 1.0 / (1.0 + (lrmsd / 8.5) ** 2)) / 3.0


def dockq(mdl_s, ref_s, mapping: ChainMapping, r1: str, r2: str) -> dict:
    """DockQ of the reference interface (r1, r2) of one model (its first frame) and its parts: floats."""
    nat = _NativeInterface(ref_s, r1, r2)
    d = _dockq_contacts(mdl_s, mdl_s.coords[0], nat, mapping, r1, r2)
    i, lr = _dockq_rmsds(mdl_s, mdl_s.coords[:1], ref_s, nat, mapping, r1, r2)
    d.update(irmsd=float(i[0]), lrmsd=float(lr[0]), dockq=float(dockq_formula(d["fnat"], i[0], lr[0])))
    d["nnat"], d["nmdl"] = int(d["nnat"]), int(d["nmdl"])
    return d


def native_interfaces(ref_s) -> list[tuple[str, str]]:
    """Reference chain pairs (in file order) with at least one heavy-atom contact within 5 A."""
    rinfo = mp.residue_info(ref_s)
    rch = protein_chains(rinfo)
    rx = np.asarray(ref_s.coords[0], np.float64)
    atoms = {c: heavy_atoms(ref_s, rinfo, r) for c, r in rch.items()}
    names = list(rch)
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
            if _near(rx, atoms[a], atoms[b], rinfo.atom_residue, DOCKQ_CONTACT)]


# --------------------------------------------------------------------------------------------------
# lDDT restricted to inter-chain pairs, and on stereochecked structures


def _subset(ref, pair_keep: np.ndarray, ent_keep: np.ndarray):
    """``ref`` (an :class:`~protgpu.scoring.lddt.LDDTReference`) with only the pairs ``pair_keep`` (P,)
    and the symmetry entries ``ent_keep`` (E,) (bool masks); expected counts recomputed."""
    p = ref.pairs[pair_keep]
    n_exp = np.bincount(ref.atom_res[p[:, 0]], minlength=ref.n_res) + \
        np.bincount(ref.atom_res[p[:, 1]], minlength=ref.n_res)
    return replace(ref, pairs=p, dref=ref.dref[pair_keep], n_exp=n_exp.astype(np.int64),
                   ent_atom=ref.ent_atom[ent_keep], ent_swap=ref.ent_swap[ent_keep],
                   ent_partner=ref.ent_partner[ent_keep], ent_dref=ref.ent_dref[ent_keep],
                   ent_group=ref.ent_group[ent_keep], _device={})


def _inter_chain(ref):
    """An :class:`~protgpu.scoring.lddt.LDDTReference` restricted to its inter-chain pairs
    (OpenStructure's ``no_intrachain``), symmetric side chains resolved on those pairs only (as
    OpenStructure's ``sym_ref_indices_ic``)."""
    chain_of_res = np.asarray([lab.rsplit(":", 1)[0] for lab in ref.labels])
    ach = chain_of_res[ref.atom_res]
    return _subset(ref, ach[ref.pairs[:, 0]] != ach[ref.pairs[:, 1]], ach[ref.ent_atom] != ach[ref.ent_partner])


def _without_atoms(ref, gone: np.ndarray):
    """``ref`` without the scored atoms ``gone`` (bool (N,), by slot): their pairs and symmetry entries
    leave the reference (OpenStructure's lDDT on the stereochecked target)."""
    keep = ~gone
    return _subset(ref, keep[ref.pairs[:, 0]] & keep[ref.pairs[:, 1]],
                   keep[ref.ent_atom] & keep[ref.ent_swap] & keep[ref.ent_partner])


def lddt_reference_of(ref_s, flavour: str, cache: dict | None = None, drop: np.ndarray | None = None):
    """(LDDTReference, reference ResidueInfo, scored reference atoms) of :func:`protgpu.lddt` (15 A
    inclusion radius) for ``flavour`` "heavy", "ca" or "inter" (heavy atoms, inter-chain pairs only);
    kept in ``cache`` (a :class:`ComplexReference`'s: built once per run, not per batch, and its device
    copies stay on the GPU between batches). ``drop``: reference atoms (indices into ``ref_s``) the
    stereochecks removed; their pairs leave the "heavy" and "inter" references (not "ca": backbone lDDT
    has no stereochecks). The cache belongs to one reference and one ``drop``."""
    from ..scoring.lddt import _structure_reference

    cache = {} if cache is None else cache
    if flavour not in cache:
        if flavour == "inter":
            r, info, atoms = lddt_reference_of(ref_s, "heavy", cache, drop)
            cache[flavour] = (_inter_chain(r), info, atoms)
        else:
            r, info, atoms = _structure_reference(ref_s, flavour, 15.0)
            if flavour == "heavy" and drop is not None and len(drop):
                r = _without_atoms(r, np.isin(atoms, drop))
            cache[flavour] = (r, info, atoms)
    return cache[flavour]


def lddt_of(model, ref_s, flavour: str, pairs: np.ndarray, device: str = "cpu", cache: dict | None = None,
            drop: np.ndarray | None = None, model_drop: list | None = None, batches: dict | None = None):
    """lDDT (M,) of every frame of ``model`` on the residue ``pairs``: :func:`protgpu.lddt`'s values
    (default thresholds, symmetry resolved) for ``flavour`` "heavy" or "ca", and for "inter" the lDDT
    over the reference's inter-chain pairs only (the interface lDDT); lDDT's NumPy twin (compiled) on
    the CPU, its CUDA kernel on the GPU (one launch). ``cache`` and ``drop`` (the reference's
    stereochecked atoms) as :func:`lddt_reference_of`. ``model``: a Structure (every frame a model) or a
    :class:`~protgpu.scoring._batch.ModelGroup` of one (its coordinates may be on the device already).
    ``model_drop``: each frame's stereochecked atoms (M arrays of its atom indices, None for none):
    missing (NaN) in the batch, as an atom the model lacks. ``batches``: a dict kept by the caller for
    one ``model``, ``pairs`` and ``model_drop``, so that "heavy" and "inter" (the same atoms) gather the
    models' atoms once."""
    from .._array import dispatch, to_numpy
    from ..scoring import _batch, _fast
    from ..scoring.lddt import lddt_counts_cuda

    be = dispatch(model, ref_s, device=device)
    ref, info, ref_atoms = lddt_reference_of(ref_s, flavour, cache, drop)
    atoms = "ca" if flavour == "ca" else "heavy"
    batch = None if batches is None else batches.get(atoms)
    if batch is None:
        groups, _ = _batch.collect_models(model, ref_s)
        batch = _batch.atom_batch(groups, ref_s, info, ref_atoms, pairs, be, _batch.work_dtype(model, ref_s))
        if model_drop is not None and any(d is not None and len(d) for d in model_drop):
            # the model's atoms laid out on the reference slots (the same cached match atom_batch made)
            topology = groups[0].topology
            matoms, slots = _batch.checked_atom_match(mp.residue_info(topology), info, ref_atoms, pairs,
                                                      source_name(topology, "model"), ref_s)
            slot_of = np.full(topology.n_atoms, -1, np.int64)
            slot_of[matoms] = slots
            drops = [np.zeros(0, np.int64) if d is None else np.asarray(d, np.int64) for d in model_drop]
            rows = np.repeat(np.arange(len(drops)), [len(d) for d in drops])
            at = slot_of[np.concatenate(drops)]
            if (at >= 0).any():  # one scatter for the batch (on the GPU: one transfer of the indices)
                batch.coords[be.xp.asarray(rows[at >= 0]), be.xp.asarray(at[at >= 0])] = be.xp.nan
        if batches is not None:
            batches[atoms] = batch
    if be.on_gpu:
        counts = lddt_counts_cuda(batch.coords, ref)
    elif _fast.enabled():  # the compiled twin (integer counts: the same as the NumPy twin's)
        counts = _fast.lddt_counts(batch.coords.astype(np.float64), ref)
    else:
        counts = lddt_counts_numpy(batch.coords.astype(np.float64), ref)
    glob, _ = lddt_scores(counts, ref, 4, be.xp)
    return np.asarray(to_numpy(glob), np.float64).reshape(-1)


def interface_lddt(model, ref_s, pairs: np.ndarray, device: str = "cpu") -> np.ndarray:
    """lDDT (M,) over the reference's inter-chain atom pairs only (OpenStructure's ``no_intrachain``),
    of every frame of ``model`` (see :func:`lddt_of`; no stereochecks)."""
    return lddt_of(model, ref_s, "inter", pairs, device)


# --------------------------------------------------------------------------------------------------
# Public function


def _model_frames(models, ref_s):
    """(Structure of one frame, name) for every model: list items, frames of multi-frame inputs."""
    items = models if isinstance(models, (list, tuple)) else [models]
    out = []
    for k, item in enumerate(items):
        s = model_structure(item, ref_s, f"models[{k}]" if len(items) > 1 else "models")
        name = source_name(s, f"models[{k}]")
        for f in range(s.n_frames):
            out.append((s.frames(f) if s.n_frames > 1 else s, name if s.n_frames == 1 else f"{name} frame {f}"))
    return out


class ComplexReference:
    """A reference complex prepared once for many models: cleaned (:mod:`._cleanup`), its DockQ
    interfaces and its QS-score representative atoms (only what ``metrics`` need).

    Parameters
    ----------
    reference : Structure or path
    metrics : sequence of str
        Any of :data:`METRICS`.
    tm_mode : str
        How ``tm_score`` is computed (:data:`TM_MODES`); "mapped" here (the batch engine's speed),
        "usalign" in :func:`score_complex`.
    stereochecks : bool
        lDDT and the interface lDDT on stereochecked structures (:mod:`.stereo`): the reference's
        removed atoms (``stereo_drop``) are found here, once.
    """

    def __init__(self, reference, metrics=METRICS, tm_mode: str = "mapped", stereochecks: bool = True):
        self.metrics = tuple(metrics)
        bad = [m for m in self.metrics if m not in METRICS]
        if bad:
            raise InputError(f"metrics: unknown {bad}; choose from {list(METRICS)}")
        if tm_mode not in TM_MODES:
            raise InputError(f"tm_mode: unknown {tm_mode!r}; choose from {list(TM_MODES)}")
        self.tm_mode = tm_mode
        self.raw = reference_structure(reference)
        self.structure = clean(self.raw)
        self.interfaces = native_interfaces(self.structure) if "dockq" in self.metrics else []
        self.native = {(a, b): _NativeInterface(self.structure, a, b) for a, b in self.interfaces}
        rinfo = mp.residue_info(self.structure)
        want_qs = "qs_global" in self.metrics or "qs_best" in self.metrics
        self.qs = _QSChains(self.structure, rinfo, protein_chains(rinfo)) if want_qs else None
        self._tables: dict = {}  # model atom tables seen (in this process): see _ModelTable
        self._lddt: dict = {}  # lDDT reference pair lists by flavour: see _lddt_reference
        # stereochecks (lddt, ilddt): the reference's removed atoms; each model's in host_scores
        self.stereochecks = bool(stereochecks) and ("lddt" in self.metrics or "ilddt" in self.metrics)
        self.stereo_drop = stereo_drop(self.structure) if self.stereochecks else None

    def __getstate__(self):
        # the caches are rebuilt where needed (a parse worker, the compute process): not shipped
        return {**self.__dict__, "_tables": {}, "_lddt": {}}


#: Most model atom tables a ComplexReference remembers (a campaign of many designs of different
#: lengths keeps the last ones: the models of one design come together).
MAX_TABLES = 64


def atoms_key(atoms) -> bytes:
    """sha1 over every field of an atom table that cleaning, mapping and scoring read."""
    import hashlib

    h = hashlib.sha1()
    for arr in (atoms.name, atoms.resname, atoms.chain, atoms.segid, atoms.resid, atoms.icode, atoms.element,
                atoms.hetero, atoms.residue_index):
        arr = np.ascontiguousarray(arr)
        h.update(f"{arr.dtype.str}:{len(arr)};".encode())
        h.update(arr.tobytes())
    return h.digest()


class _ModelTable:
    """What one model atom table decides against a reference, computed for the first model that has it
    and reused for the others (the models of one design share their table): the clean-up's atoms, the
    chain mapping (unless the assignment of equivalent chains is decided by coordinates: homomers,
    mapped per model) and the memo of the per-model CPU parts (:func:`host_scores`)."""

    def __init__(self, model_s, ref: ComplexReference, chain_mapping, min_identity: float):
        keep = clean_keep(model_s)
        s = model_s if keep is None else model_s.select(keep)
        self.keep = None if keep is None else np.flatnonzero(keep)
        self.atoms = s.atoms
        self.options = (chain_mapping, min_identity)
        cm = _map(s, ref.structure, min_identity=min_identity, chain_mapping=chain_mapping, max_naive=MAX_NAIVE)
        # an ambiguous assignment (equivalent chains) was chosen by this model's lDDT: not shared
        self.mapping = cm if np.isnan(cm.score) else None
        self.first = (s, cm)
        self.memo: dict = {}  # per mapping's chain pairs: host_scores' memo and the batching key
        self.key = atoms_key(s.atoms)

    def structure(self, model_s):
        """The cleaned Structure of a model with this atom table, on this table's (equal) AtomTable object:
        the models a parse worker sends in one message then carry one table, not one each."""
        x = model_s.coords if self.keep is None else np.ascontiguousarray(model_s.coords[:, self.keep])
        return Structure(x, self.atoms, source=model_s.source, box=model_s.box, time=model_s.time,
                         box_source=model_s.box_source)

    def memo_of(self, cm: ChainMapping) -> dict:
        """The memo of a mapping of this table (the residue pairs follow from the chain pairs)."""
        return self.memo.setdefault(tuple(sorted(cm.chains.items())), {})


def map_model(model_s, ref: ComplexReference, *, chain_mapping="auto", min_identity: float = 30.0,
              table: bool = False, key: bytes | None = None):
    """(cleaned model Structure, :class:`ChainMapping`) of one model frame against a prepared reference;
    with ``table=True`` also its :class:`_ModelTable` (for :func:`host_scores` and :func:`score_mapped`).

    The clean-up and the mapping are computed once per distinct model atom table (remembered in ``ref``,
    in this process); a model whose chains cannot be mapped fails each time, naming itself. ``key``: the
    :func:`atoms_key` of its atom table when the caller has it."""
    key = (key or atoms_key(model_s.atoms), repr(chain_mapping), float(min_identity))
    t = ref._tables.get(key)
    if t is None:
        t = _ModelTable(model_s, ref, chain_mapping, float(min_identity))
        if len(ref._tables) >= MAX_TABLES:
            ref._tables.pop(next(iter(ref._tables)))
        ref._tables[key] = t
        s, cm = t.first
    else:
        s = t.structure(model_s)
        if t.mapping is not None:
            cm = replace(t.mapping, model_source=source_name(s, "model"))
        else:
            cm = _map(s, ref.structure, min_identity=min_identity, chain_mapping=chain_mapping, max_naive=MAX_NAIVE)
    return (s, cm, t) if table else (s, cm)


#: The per-interface DockQ columns of :func:`score_complex`, shape (M, I) each.
DOCKQ_PARTS = ("dockq_per_interface", "fnat", "fnonnat", "irmsd", "lrmsd", "nnat", "nmdl")


def group_key(s, cm: ChainMapping, table: _ModelTable | None = None) -> tuple:
    """Models with equal keys share an atom table and a mapping: their scores are one batched call
    (``table``: the model's :class:`_ModelTable`, which knows its table's digest and keeps the key)."""
    memo = table.memo_of(cm) if table is not None else {}
    if "group_key" not in memo:
        import hashlib

        pairs = hashlib.sha1(np.ascontiguousarray(cm.residue_pairs()).tobytes()).digest()
        memo["group_key"] = (s.n_atoms, table.key if table is not None else atoms_key(s.atoms), pairs,
                             tuple(sorted(cm.chains.items())))
    return memo["group_key"]


def _host(v) -> np.ndarray:
    """A result of a scorer (a float, a NumPy or CuPy array) as a float64 host array of shape (M,)."""
    from .._array import to_numpy

    return np.atleast_1d(np.asarray(to_numpy(v) if not np.isscalar(v) else v, np.float64))


def host_scores(structure, mapping: ChainMapping, ref: ComplexReference, table: _ModelTable | None = None,
                found: dict | None = None) -> dict:
    """The per-model parts of the scores, counted on the CPU (a parse worker can do them): QS_global and
    QS_best, and per reference interface (I,) fnat, fnonnat, nnat and nmdl (NaN where not mapped).
    ``table``: the model's :class:`_ModelTable` (from :func:`map_model`), whose memo keeps what depends
    on the atom table and mapping only. ``found``: the model's inter-chain atom contacts from its
    design-sanity metrics (``sanity_of(..., found=)``, on the model before its clean-up), which DockQ's
    contacts reuse where they are the same search (with ``table`` only). With the reference's stereochecks
    also ``stereo_drop``: the model's atoms they remove (:func:`protgpu.complexes.stereo.stereo_drop`);
    with ``tm_mode`` other than "mapped", ``tm_score``: US-align's complex mode, CPU-bound like the rest."""
    out: dict = {}
    if ref.stereochecks:
        out["stereo_drop"] = stereo_drop(structure, key=table.key if table is not None else None)
    if "tm_score" in ref.metrics and ref.tm_mode != "mapped":  # US-align's complex mode: ~0.4 s, CPU
        out["tm_score"] = _complex_tm(np.asarray(structure.coords[:1]), structure, ref, mapping)[0]
    memo = table.memo_of(mapping) if table is not None else {}
    if ref.qs is not None:
        if "qs_chains" not in memo:
            minfo = mp.residue_info(structure)
            chains = protein_chains(minfo)
            memo["qs_chains"] = (chains, _qs_reps(minfo, chains))
        chains, reps = memo["qs_chains"]
        out["qs_global"], out["qs_best"] = qs_score(ref.qs, _QSChains(structure, None, chains, reps), mapping, memo)
    if "dockq" in ref.metrics:
        parts = {p: np.full(len(ref.interfaces), np.nan) for p in ("fnat", "fnonnat", "nnat", "nmdl")}
        for i, (a, b) in enumerate(ref.interfaces):
            if a in mapping.chains and b in mapping.chains:
                d = _dockq_contacts(structure, structure.coords[0], ref.native[a, b], mapping, a, b, memo,
                                     found if table is not None else None,
                                     None if table is None else table.keep)
                for p, v in d.items():
                    parts[p][i] = v
        out.update(parts)
    return out


def _complex_tm(xs: np.ndarray, model_s, ref: ComplexReference, cm: ChainMapping) -> np.ndarray:
    """US-align's complex-mode TM-score (M,) of the frames ``xs`` (M, N, 3) of ``model_s`` in
    ``ref.tm_mode``: the chain mapping fixed ("usalign") or MM-align's own ("usalign-auto")."""
    return complex_tm(xs, model_s, ref.structure, cm.chains if ref.tm_mode == "usalign" else None)


class _Clock:
    """Adds the seconds since the last call to ``timers[step]`` (nothing without a dict)."""

    def __init__(self, timers: dict | None):
        import time

        self.timers, self.now = timers, time.perf_counter
        self.t = self.now()

    def __call__(self, step: str) -> None:
        if self.timers is not None:
            t = self.now()
            self.timers[step] = self.timers.get(step, 0.0) + t - self.t
            self.t = t


def _stacked(first, frames: list, device: str):
    """The first frames of ``frames`` (Structures of ``first``'s atom table) as one
    :class:`~protgpu.scoring._batch.ModelGroup`, its coordinates checked once (by the Structure made of
    them) and, on the GPU, copied once (float32, from pinned memory) for every score to gather its atoms
    from on the device."""
    from ..scoring import _batch

    be = None
    if len(frames) == 1:
        stack = first
    else:
        coords = [np.asarray(f.coords[0]) for f in frames]
        if device == "gpu":
            from .._array import dispatch

            be = dispatch(device="gpu")
            x = _batch.host_buffer((len(coords), *coords[0].shape), np.float32, 0, be, "complex_stack")
            np.stack(coords, out=x)
        else:
            x = np.stack(coords)
        stack = Structure(x, first.atoms, source=first.source)
    name = source_name(first, "model")
    names = [name] if len(frames) == 1 else [f"{name}[{i}]" for i in range(len(frames))]
    coords = stack.coords if be is None else _batch.to_work(stack.coords, be, np.float32)
    return _batch.ModelGroup(coords=coords, topology=stack, names=names)


def score_mapped(structures: list, mappings: list, ref: ComplexReference, device: str = "cpu",
                 host: list | None = None, keys: list | None = None, timers: dict | None = None) -> dict:
    """The scores of cleaned, mapped model frames (see :func:`score_complex` for the columns).

    Models of one atom table and one mapping (the many models of one design, a trajectory) are stacked
    and scored together: one lDDT launch per lDDT flavour (the reference's pair lists built once per
    ``ref``), one :func:`protgpu.tm_score`, and one batched superposition per DockQ RMSD; on the GPU
    when ``device`` says so. QS-score and the DockQ contacts are counted per model on the CPU
    (:func:`host_scores`; ``host`` holds them when a caller counted them already, one dict per model).
    ``keys``: each model's :func:`group_key` when a caller has them (a parse worker computed them).
    ``timers``: a dict that the seconds of each step are added to (``stack_s``, ``lddt_s``, ``tm_s``,
    ``gdt_s``, ``dockq_rmsd_s``; the results are on the host at the end of each, so GPU time is included).
    """
    metrics = ref.metrics
    m = len(structures)
    host = host if host is not None else [host_scores(s, cm, ref) for s, cm in zip(structures, mappings, strict=True)]
    table: dict = {k: np.full(m, np.nan) for k in metrics}
    for k in ("qs_global", "qs_best"):
        if k in metrics:
            table[k] = np.asarray([h[k] for h in host], np.float64)
    ifaces = ref.interfaces
    if "dockq" in metrics:
        table["interfaces"] = list(ifaces)
        for p in DOCKQ_PARTS:
            table[p] = np.full((m, len(ifaces)), np.nan)
        for p in ("fnat", "fnonnat", "nnat", "nmdl"):
            table[p] = np.asarray([h[p] for h in host], np.float64).reshape(m, len(ifaces))
    want_tm = any(k in metrics for k in ("tm_score", "rmsd"))
    groups: dict = {}
    seen: dict = {}  # (atom table, mapping) objects already keyed: the frames of one input share them
    for k, (s, cm) in enumerate(zip(structures, mappings, strict=True)):
        if keys is not None:
            groups.setdefault(keys[k], []).append(k)
            continue
        ids = (id(s.atoms), id(cm))
        if ids not in seen:
            seen[ids] = group_key(s, cm)
        groups.setdefault(seen[ids], []).append(k)
    ref_s = ref.structure
    clock = _Clock(timers)
    for idx in groups.values():
        first, cm = structures[idx[0]], mappings[idx[0]]
        group = _stacked(first, [structures[k] for k in idx], device)
        rp = cm.residue_pairs()
        clock("stack_s")
        # the longest score first: on the GPU it runs on a stream of its own while the others queue
        gdt = None
        if "gdtts" in metrics or "gdtha" in metrics:  # OpenStructure's GDT, not the TMscore program's
            gdt = gdt_windows_started(group, ref_s, mapping=rp, device=device)
        clock("gdt_s")
        # lddt and ilddt on the stereochecked model (its removed atoms missing) and reference; the
        # heavy-atom batch is gathered once for both
        drops = [host[k].get("stereo_drop") for k in idx] if ref.stereochecks else None
        batches: dict = {}
        for col, flavour in (("lddt", "heavy"), ("bb_lddt", "ca"), ("ilddt", "inter")):
            if col in metrics:
                table[col][idx] = lddt_of(group, ref_s, flavour, rp, device, ref._lddt, ref.stereo_drop,
                                          None if flavour == "ca" else drops, batches)
        del batches
        clock("lddt_s")
        if want_tm:
            t = tm_score(group, ref_s, mapping=rp, device=device)
            for col, v in (("tm_score", t.tm), ("rmsd", t.rmsd)):
                if col in metrics:
                    table[col][idx] = _host(v)
            if "tm_score" in metrics and ref.tm_mode != "mapped":
                # counted with the other host parts (in evaluate's parse workers, in parallel)
                tms = np.array([host[k].get("tm_score", np.nan) for k in idx], np.float64)
                todo = np.flatnonzero(np.isnan(tms))  # host parts counted for another reference's modes
                if len(todo):
                    tms[todo] = _complex_tm(np.stack([structures[idx[k]].coords[0] for k in todo]), first, ref, cm)
                table["tm_score"][idx] = tms
        clock("tm_s")
        if "dockq" in metrics:
            total = np.zeros(len(idx))
            for i, (a, b) in enumerate(ifaces):
                if a in cm.chains and b in cm.chains:
                    ir, lr = _dockq_rmsds(first, group.coords, ref_s, ref.native[a, b], cm, a, b, device=device)
                    table["irmsd"][idx, i], table["lrmsd"][idx, i] = ir, lr
                    d = dockq_formula(table["fnat"][idx, i], ir, lr)
                    table["dockq_per_interface"][idx, i] = d
                    total += d
            # DockQ v2: the mean over every reference interface, an unmapped one counting 0
            table["dockq"][idx] = total / len(ifaces) if ifaces else np.nan
        clock("dockq_rmsd_s")
        if gdt is not None:
            ts, ha = gdt()
            for col, v in (("gdtts", ts), ("gdtha", ha)):
                if col in metrics:
                    table[col][idx] = v
        clock("gdt_s")
    table["chain_mapping"] = list(mappings)
    return table


def score_complex(models, reference, *, metrics=METRICS, chain_mapping="auto", min_identity: float = 30.0,
                  device: str = "auto", tm_mode: str = "usalign", stereochecks: bool = True):
    """Score model complexes against a reference complex: one row per model.

    Parameters
    ----------
    models : Structure, path, coordinate array of the reference's atoms, or a list of these
        Every frame of a multi-frame input is a model.
    reference : Structure or path
        The reference complex.
    metrics : sequence of str
        Any of :data:`METRICS`: ``lddt``, ``bb_lddt`` (CA atoms), ``ilddt`` (inter-chain pairs only),
        ``tm_score``, ``gdtts``, ``gdtha``, ``rmsd`` (CA, after superposition on all mapped CAs),
        ``qs_global``, ``qs_best``, ``dockq`` (with its parts per interface).
    chain_mapping : "auto" or dict
        As :func:`protgpu.map_chains`; a dict ``{reference chain: model chain}`` is used for every model.
    min_identity : float
        As :func:`protgpu.map_chains`.
    device : {"auto", "cpu", "gpu"}
        Where lDDT, TM-score/GDT/RMSD and the DockQ superpositions run. Models of one atom table and
        one mapping are scored in one batched call per metric (on the GPU: one kernel launch each); the
        chain mapping, QS-score and the DockQ contacts are counted on the CPU.
    tm_mode : {"usalign", "usalign-auto", "mapped"}
        ``tm_score`` as OpenStructure's Scorer: US-align's complex mode (MM-align: residues aligned by
        structure, CPU) with the chain mapping fixed to protgpu's ("usalign", OpenStructure's ``oum``) or
        chosen by MM-align ("usalign-auto"); or "mapped": the TMscore program's search on the
        sequence-mapped residues (the GDT/RMSD search; fast, batched, on ``device``).
    stereochecks : bool
        As OpenStructure's Scorer (its default): ``lddt`` and ``ilddt`` leave out the atoms of model and
        reference with stereochemical problems (:mod:`protgpu.complexes.stereo`; missing in the model,
        their pairs out of the reference); ``bb_lddt`` is computed without them, as OpenStructure's.

    Returns
    -------
    dict of str to ndarray
        ``"model"``: names; one float64 array of shape (M,) per requested metric; with ``dockq``:
        ``"interfaces"`` (the reference's interfaces, (chain, chain) in file order), ``"dockq"`` the
        DockQ-v2 aggregate (mean over the reference's interfaces, 0 for an interface whose chains are
        not both mapped), and per interface, shape (M, I): ``dockq_per_interface``, ``fnat``,
        ``fnonnat``, ``irmsd``, ``lrmsd``, ``nnat``, ``nmdl`` (NaN where not mapped);
        ``"chain_mapping"``: the :class:`~protgpu.complexes.ChainMapping` of each model.

    Raises
    ------
    InputError
        An unknown metric, a model whose chains cannot be mapped (naming the file and chains).

    Examples
    --------
    >>> t = score_complex("datasets/openstructure/1eud_mdl_partial-dimer.pdb",
    ...                   "datasets/openstructure/1eud_ref.pdb", metrics=("rmsd", "dockq"))
    >>> round(float(t["dockq"][0]), 3), round(float(t["lrmsd"][0, 0]), 3), t["interfaces"]
    (0.559, 5.533, [('A', 'B')])
    """
    refuse_grad("pg.score_complex", models, reference)
    ref = ComplexReference(reference, metrics, tm_mode, stereochecks=stereochecks)
    # bare arrays hold the reference's atoms as given: take them before cleaning
    frames = _model_frames(models, ref.raw)
    mapped = [map_model(s, ref, chain_mapping=chain_mapping, min_identity=min_identity) for s, _ in frames]
    be_device = _device(device)
    table = {"model": np.asarray([n for _, n in frames], dtype=object)}
    table.update(score_mapped([s for s, _ in mapped], [cm for _, cm in mapped], ref, be_device))
    return table


def _device(device: str) -> str:
    """"cpu" or "gpu" for ``device`` ("auto": the GPU when there is one)."""
    from .._array import dispatch

    return "gpu" if dispatch(device=device).on_gpu else "cpu"
