"""Scores of a model complex against a reference complex, on the residues a chain mapping pairs.

What exists in protgpu is reused on the mapped residues (the mapping's residue pairs are the explicit
``mapping=`` of those functions): lDDT and backbone (CA) lDDT are :func:`protgpu.lddt`; TM-score,
GDT-TS/HA and the CA RMSD are :func:`protgpu.tm_score` (normalised by the reference's total length, as
US-align's complex mode normalises); the interface lDDT is lDDT's own NumPy twin on the inter-chain
pairs only; superpositions are :func:`protgpu.superpose`. New here: QS-score (Bertoni et al. 2017, as
OpenStructure's ``QSScorer``) and DockQ (Basu & Wallner 2016; the v2 aggregate of Mirabello & Wallner
2024). Definitions, and what reproduces OpenStructure, are in docs/design/complexes.md.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._autograd import refuse_grad
from .._inputs import source_name
from ..errors import InputError
from ..scoring import _mapping as mp
from ..scoring.lddt import lddt, lddt_counts_numpy, lddt_scores
from ..scoring.tmscore import tm_score
from ..superpose import superpose
from ._cleanup import clean
from .mapping import ChainMapping, _map, model_structure, protein_chains, reference_structure

# qs_score and dockq (one mapped model, one interface) stay importable by name for tests; not public API
__all__ = ["METRICS", "score_complex"]

#: Every metric :func:`score_complex` computes, in its column order.
METRICS = ("lddt", "bb_lddt", "ilddt", "tm_score", "gdtts", "gdtha", "rmsd", "qs_global", "qs_best", "dockq")

QS_CONTACT = 12.0  # Angstrom, CB-CB (CA for GLY) inter-chain contact of QS-score
DOCKQ_CONTACT = 5.0  # Angstrom, heavy-atom contact of fnat
DOCKQ_INTERFACE = 10.0  # Angstrom, interface residues of iRMSD
BACKBONE = ("CA", "C", "N", "O")


# --------------------------------------------------------------------------------------------------
# Atoms of residues


def atom_table(info: mp.ResidueInfo, residues: np.ndarray, names) -> np.ndarray:
    """Atom index of each (residue, name), -1 where the residue lacks it; shape (len(residues), len(names))."""
    out = np.full((len(residues), len(names)), -1, dtype=np.int64)
    pos = np.full(len(info.resid), -1, dtype=np.int64)
    pos[residues] = np.arange(len(residues))
    for k, name in enumerate(names):
        at = np.flatnonzero(info.atom_name == name)
        row = pos[info.atom_residue[at]]
        ok = row >= 0
        out[row[ok][::-1], k] = at[ok][::-1]  # first atom of that name wins
    return out


def representative_atoms(info: mp.ResidueInfo, residues: np.ndarray) -> np.ndarray:
    """CB of each residue, CA for glycine (QS-score's representative atom); -1 where missing."""
    t = atom_table(info, residues, ("CB", "CA"))
    gly = info.std_resname[residues] == "GLY"
    return np.where(gly, t[:, 1], t[:, 0])


def heavy_atoms(s, info: mp.ResidueInfo, residues: np.ndarray) -> np.ndarray:
    """Heavy atoms of the given residues."""
    keep = ~np.isin(s.atoms.element, ("H", "D", "h", "d")) & np.isin(info.atom_residue, residues)
    return np.flatnonzero(keep)


# --------------------------------------------------------------------------------------------------
# QS-score


def _w(d: np.ndarray) -> np.ndarray:
    # probability that two residues interact given their CB distance (Xu et al. 2009)
    return np.where(d <= 5.0, 1.0, np.exp(-2.0 * ((d - 5.0) / 4.28) ** 2))


class _QSChains:
    """Representative positions of one structure's protein chains (residues without the atom dropped)."""

    def __init__(self, s, info, chains: dict):
        xyz = np.asarray(s.coords[0], dtype=np.float64)
        self.res, self.pos, self._dist = {}, {}, {}
        for c, res in chains.items():
            rep = representative_atoms(info, res)
            self.res[c] = res[rep >= 0]
            self.pos[c] = xyz[rep[rep >= 0]]
        names = list(chains)
        self.interfaces = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
                           if (self.dist(a, b) < QS_CONTACT).any()]

    def dist(self, a, b) -> np.ndarray:
        """Representative-atom distances between chains a and b (computed once: the reference's serve
        every model, a model's both the interface search and the scores)."""
        if (a, b) not in self._dist:
            pa, pb = self.pos[a], self.pos[b]
            self._dist[a, b] = np.sqrt(((pa[:, None, :] - pb[None, :, :]) ** 2).sum(-1))
        return self._dist[a, b]


def _qs_interface(ref: _QSChains, mdl: _QSChains, r_int, m_int, mapping: ChainMapping):
    """(weighted_scores, weight_sum, weight_extra_mapped, weight_extra_all) of one mapped interface."""
    d1 = ref.dist(*r_int)
    d2 = mdl.dist(*m_int)
    idx = []
    for rc, mc in zip(r_int, m_int, strict=True):
        pairs = mapping.residues.get(rc, np.zeros((0, 2), np.int64))
        rpos = {int(r): i for i, r in enumerate(ref.res[rc])}
        mpos = {int(m): i for i, m in enumerate(mdl.res[mc])}
        both = [(rpos[int(r)], mpos[int(m)]) for m, r in pairs if int(r) in rpos and int(m) in mpos]
        idx.append(np.asarray(both, dtype=np.int64).reshape(-1, 2))
    (a1, a2), (b1, b2) = idx[0].T, idx[1].T
    c1, c2 = d1 < QS_CONTACT, d2 < QS_CONTACT
    shared1 = np.zeros(d1.shape, bool)
    shared2 = np.zeros(d2.shape, bool)
    mapped1 = np.zeros(d1.shape, bool)
    mapped2 = np.zeros(d2.shape, bool)
    s1 = s2 = np.zeros(0)
    if len(a1) and len(b1):
        g1, g2 = np.ix_(a1, b1), np.ix_(a2, b2)
        shared = c1[g1] & c2[g2]
        shared1[g1], shared2[g2] = shared, shared
        mapped1[g1] = c1[g1] & ~shared
        mapped2[g2] = c2[g2] & ~shared
        # the distances of each shared contact in both structures, pair by pair (mapped grid order)
        s1, s2 = d1[g1][shared], d2[g2][shared]
    w = _w(np.minimum(s1, s2))
    weighted = float((w * (1.0 - np.abs(s1 - s2) / 12.0)).sum())
    wsum = float(w.sum())
    extra_mapped = float(_w(d1[mapped1]).sum() + _w(d2[mapped2]).sum())
    extra_all = float(_w(d1[c1 & ~shared1]).sum() + _w(d2[c2 & ~shared2]).sum())
    return weighted, wsum, extra_mapped, extra_all


def qs_score(ref: _QSChains, mdl: _QSChains, mapping: ChainMapping) -> tuple[float, float]:
    """QS_global and QS_best of a mapped model (NaN when neither structure has an inter-chain contact)."""
    flat = mapping.chains
    back = {m: r for r, m in flat.items()}
    tot = np.zeros(4)
    done = set()
    for r_int in ref.interfaces:
        if r_int[0] in flat and r_int[1] in flat:
            m_int = (flat[r_int[0]], flat[r_int[1]])
            tot += _qs_interface(ref, mdl, r_int, m_int, mapping)
            done.add(frozenset(m_int))
        else:
            d = ref.dist(*r_int)
            tot[3] += _w(d[d < QS_CONTACT]).sum()
    for m_int in mdl.interfaces:
        if frozenset(m_int) in done:
            continue
        if m_int[0] in back and m_int[1] in back:
            tot += _qs_interface(ref, mdl, (back[m_int[0]], back[m_int[1]]), m_int, mapping)
        else:
            d = mdl.dist(*m_int)
            tot[3] += _w(d[d < QS_CONTACT]).sum()
    weighted, wsum, extra_mapped, extra_all = tot
    glob = weighted / (wsum + extra_all) if wsum + extra_all > 0 else float("nan")
    best = weighted / (wsum + extra_mapped) if wsum + extra_mapped > 0 else float("nan")
    return float(glob), float(best)


# --------------------------------------------------------------------------------------------------
# DockQ


def _contacts(xyz, atoms1, atoms2, res_of, cutoff):
    """Residue pairs (r1, r2) with any atom pair closer than ``cutoff`` (heavy atoms given)."""
    from scipy.spatial import cKDTree

    if not len(atoms1) or not len(atoms2):
        return set()
    hits = cKDTree(xyz[atoms1]).query_ball_tree(cKDTree(xyz[atoms2]), cutoff)
    out = set()
    for i, js in enumerate(hits):
        for j in js:
            out.add((int(res_of[atoms1[i]]), int(res_of[atoms2[j]])))
    return out


def _near(xyz, atoms1, atoms2, res_of, cutoff) -> set:
    """Residues of ``atoms1`` with any atom within ``cutoff`` of ``atoms2``."""
    from scipy.spatial import cKDTree

    if not len(atoms1) or not len(atoms2):
        return set()
    d, _ = cKDTree(xyz[atoms2]).query(xyz[atoms1], distance_upper_bound=cutoff)
    return {int(r) for r in res_of[atoms1[d <= cutoff]]}


def _bb_pairs(minfo, rinfo, mres, rres):
    """(model atom, reference atom) pairs of the backbone atoms both residues have."""
    mt, rt = atom_table(minfo, mres, BACKBONE), atom_table(rinfo, rres, BACKBONE)
    ok = (mt >= 0) & (rt >= 0)
    return mt[ok], rt[ok]


def _fit_rmsd(mx, rx, fit_m, fit_r, meas_m=None, meas_r=None, device: str = "cpu") -> np.ndarray:
    """RMSD (M,) on the measured atoms after superposing the fitted ones (the measured = fitted by
    default), for models ``mx`` of shape (M, N, 3): one batched :func:`protgpu.superpose` call."""
    m = mx.shape[0]
    if len(fit_m) < 3 or (meas_m is not None and not len(meas_m)):
        return np.zeros(m)  # OpenStructure's and DockQ's convention: too few atoms to superpose
    if meas_m is None:
        return _host(superpose(mx[:, fit_m], rx[fit_r], device=device).rmsd)
    n = len(fit_m)
    both_m, both_r = np.concatenate([fit_m, meas_m]), np.concatenate([fit_r, meas_r])
    res = superpose(mx[:, both_m], rx[both_r], fit=np.arange(n), atoms=np.arange(n, len(both_m)), device=device)
    return _host(res.rmsd)


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


def _dockq_contacts(mdl_s, x, nat: _NativeInterface, mapping: ChainMapping, r1: str, r2: str) -> dict:
    """fnat, fnonnat, nnat and nmdl of one model (coordinates ``x``, (N, 3)) at the reference interface
    (r1, r2): residue pairs with heavy atoms within 5 A, the model's residues read through the mapping."""
    minfo = mp.residue_info(mdl_s)
    mch = protein_chains(minfo)
    p1, p2 = mapping.residues[r1], mapping.residues[r2]
    # model residue -> reference residue; unmapped model residues get keys no reference residue has
    to_ref = np.arange(len(minfo.resid), dtype=np.int64) + nat.n_ref_residues
    to_ref[p1[:, 0]], to_ref[p2[:, 0]] = p1[:, 1], p2[:, 1]
    ma1 = heavy_atoms(mdl_s, minfo, mch[mapping.chains[r1]])
    ma2 = heavy_atoms(mdl_s, minfo, mch[mapping.chains[r2]])
    mdl = {(int(to_ref[a]), int(to_ref[b]))
           for a, b in _contacts(np.asarray(x, np.float64), ma1, ma2, minfo.atom_residue, DOCKQ_CONTACT)}
    nnat = len(nat.native)
    return {"fnat": len(nat.native & mdl) / nnat if nnat else 0.0,
            "fnonnat": len(mdl - nat.native) / len(mdl) if mdl else 0.0,
            "nnat": float(nnat), "nmdl": float(len(mdl))}


def _dockq_rmsds(mdl_s, xs: np.ndarray, ref_s, nat: _NativeInterface, mapping: ChainMapping, r1: str, r2: str,
                 device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """iRMSD and LRMSD (M,) of models of one atom table and mapping (``xs`` (M, N, 3)): one batched
    :func:`protgpu.superpose` call each.

    iRMSD: backbone (N, CA, C, O) RMSD of the reference's interface residues (any heavy atom within 10 A
    of the partner chain) that are mapped, after superposing them; LRMSD: backbone RMSD of the ligand
    (the reference chain with fewer residues) after superposing the receptor.
    """
    minfo, rinfo = mp.residue_info(mdl_s), mp.residue_info(ref_s)
    rx = np.asarray(ref_s.coords[0], np.float64)
    xs = np.asarray(xs, np.float64)
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
# lDDT restricted to inter-chain pairs


def interface_lddt(model, ref_s, pairs: np.ndarray, device: str = "cpu") -> np.ndarray:
    """lDDT (M,) over the reference's inter-chain atom pairs only (OpenStructure's ``no_intrachain``),
    of every frame of ``model``: lDDT's NumPy twin on the CPU, its CUDA kernel on the GPU (one launch)."""
    from .._array import dispatch, to_numpy
    from ..scoring import _batch, _fast
    from ..scoring.lddt import _prepare, lddt_counts_cuda

    be = dispatch(model, ref_s, device=device)
    ref, batch, _, _ = _prepare(model, ref_s, "heavy", 15.0, pairs, be,
                                _batch.work_dtype(model, ref_s) if be.on_gpu else np.dtype(np.float64))
    chain_of_res = np.asarray([lab.rsplit(":", 1)[0] for lab in ref.labels])
    ach = chain_of_res[ref.atom_res]
    inter = ach[ref.pairs[:, 0]] != ach[ref.pairs[:, 1]]
    p = ref.pairs[inter]
    n_exp = np.bincount(ref.atom_res[p[:, 0]], minlength=ref.n_res) + \
        np.bincount(ref.atom_res[p[:, 1]], minlength=ref.n_res)
    sub = replace(ref, pairs=p, dref=ref.dref[inter], n_exp=n_exp.astype(np.int64), _device={})
    if be.on_gpu:
        counts = lddt_counts_cuda(batch.coords, sub)
    elif _fast.enabled():  # the compiled twin (integer counts: the same as the NumPy twin's)
        counts = _fast.lddt_counts(np.asarray(batch.coords, np.float64), sub)
    else:
        counts = lddt_counts_numpy(np.asarray(batch.coords, np.float64), sub)
    glob, _ = lddt_scores(counts, sub, 4, be.xp)
    return np.asarray(to_numpy(glob), np.float64).reshape(-1)


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
    """

    def __init__(self, reference, metrics=METRICS):
        self.metrics = tuple(metrics)
        bad = [m for m in self.metrics if m not in METRICS]
        if bad:
            raise InputError(f"metrics: unknown {bad}; choose from {list(METRICS)}")
        self.raw = reference_structure(reference)
        self.structure = clean(self.raw)
        self.interfaces = native_interfaces(self.structure) if "dockq" in self.metrics else []
        self.native = {(a, b): _NativeInterface(self.structure, a, b) for a, b in self.interfaces}
        rinfo = mp.residue_info(self.structure)
        want_qs = "qs_global" in self.metrics or "qs_best" in self.metrics
        self.qs = _QSChains(self.structure, rinfo, protein_chains(rinfo)) if want_qs else None


def map_model(model_s, ref: ComplexReference, *, chain_mapping="auto", min_identity: float = 30.0):
    """(cleaned model Structure, :class:`ChainMapping`) of one model frame against a prepared reference."""
    s = clean(model_s)
    return s, _map(s, ref.structure, min_identity=min_identity, chain_mapping=chain_mapping, max_naive=40320)


#: The per-interface DockQ columns of :func:`score_complex`, shape (M, I) each.
DOCKQ_PARTS = ("dockq_per_interface", "fnat", "fnonnat", "irmsd", "lrmsd", "nnat", "nmdl")


def _topology_key(s, cm: ChainMapping) -> tuple:
    """Models with equal keys share an atom table and a mapping: their scores are one batched call."""
    import hashlib

    a = s.atoms
    h = hashlib.sha1()
    for arr in (a.name, a.resname, a.chain, a.resid, a.icode, a.element):
        h.update(np.ascontiguousarray(arr).tobytes())
    h.update(np.ascontiguousarray(cm.residue_pairs()).tobytes())
    return (s.n_atoms, h.hexdigest(), tuple(sorted(cm.chains.items())))


def _host(v) -> np.ndarray:
    """A result of a scorer (a float, a NumPy or CuPy array) as a float64 host array of shape (M,)."""
    from .._array import to_numpy

    return np.atleast_1d(np.asarray(to_numpy(v) if not np.isscalar(v) else v, np.float64))


def host_scores(structure, mapping: ChainMapping, ref: ComplexReference) -> dict:
    """The per-model parts of the scores, counted on the CPU (a parse worker can do them): QS_global and
    QS_best, and per reference interface (I,) fnat, fnonnat, nnat and nmdl (NaN where not mapped)."""
    out: dict = {}
    if ref.qs is not None:
        minfo = mp.residue_info(structure)
        out["qs_global"], out["qs_best"] = qs_score(ref.qs, _QSChains(structure, minfo, protein_chains(minfo)),
                                                    mapping)
    if "dockq" in ref.metrics:
        parts = {p: np.full(len(ref.interfaces), np.nan) for p in ("fnat", "fnonnat", "nnat", "nmdl")}
        for i, (a, b) in enumerate(ref.interfaces):
            if a in mapping.chains and b in mapping.chains:
                d = _dockq_contacts(structure, structure.coords[0], ref.native[a, b], mapping, a, b)
                for p, v in d.items():
                    parts[p][i] = v
        out.update(parts)
    return out


def score_mapped(structures: list, mappings: list, ref: ComplexReference, device: str = "cpu",
                 host: list | None = None) -> dict:
    """The scores of cleaned, mapped model frames (see :func:`score_complex` for the columns).

    Models of one atom table and one mapping (the many models of one design, a trajectory) are stacked
    and scored together: one :func:`protgpu.lddt` call per lDDT flavour, one :func:`protgpu.tm_score`,
    one interface-lDDT launch and one batched superposition per DockQ RMSD; on the GPU when ``device``
    says so. QS-score and the DockQ contacts are counted per model on the CPU (:func:`host_scores`;
    ``host`` holds them when a caller counted them already, one dict per model).
    """
    from ..structure.core import Structure

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
    want_tm = any(k in metrics for k in ("tm_score", "gdtts", "gdtha", "rmsd"))
    groups: dict = {}
    seen: dict = {}  # (atom table, mapping) objects already keyed: the frames of one input share them
    for k, (s, cm) in enumerate(zip(structures, mappings, strict=True)):
        ids = (id(s.atoms), id(cm))
        if ids not in seen:
            seen[ids] = _topology_key(s, cm)
        groups.setdefault(seen[ids], []).append(k)
    ref_s = ref.structure
    for idx in groups.values():
        first, cm = structures[idx[0]], mappings[idx[0]]
        xs = np.stack([np.asarray(structures[k].coords[0]) for k in idx])
        stack = first if len(idx) == 1 else Structure(xs, first.atoms, source=first.source)
        rp = cm.residue_pairs()
        if "lddt" in metrics:
            table["lddt"][idx] = _host(lddt(stack, ref_s, mapping=rp, device=device))
        if "bb_lddt" in metrics:
            table["bb_lddt"][idx] = _host(lddt(stack, ref_s, atoms="ca", mapping=rp, device=device))
        if "ilddt" in metrics:
            table["ilddt"][idx] = interface_lddt(stack, ref_s, rp, device=device)
        if want_tm:
            t = tm_score(stack, ref_s, mapping=rp, device=device)
            for col, v in (("tm_score", t.tm), ("gdtts", t.gdt_ts), ("gdtha", t.gdt_ha), ("rmsd", t.rmsd)):
                if col in metrics:
                    table[col][idx] = _host(v)
        if "dockq" in metrics:
            total = np.zeros(len(idx))
            for i, (a, b) in enumerate(ifaces):
                if a in cm.chains and b in cm.chains:
                    ir, lr = _dockq_rmsds(first, xs, ref_s, ref.native[a, b], cm, a, b, device=device)
                    table["irmsd"][idx, i], table["lrmsd"][idx, i] = ir, lr
                    d = dockq_formula(table["fnat"][idx, i], ir, lr)
                    table["dockq_per_interface"][idx, i] = d
                    total += d
            # DockQ v2: the mean over every reference interface, an unmapped one counting 0
            table["dockq"][idx] = total / len(ifaces) if ifaces else np.nan
    table["chain_mapping"] = list(mappings)
    return table


def score_complex(models, reference, *, metrics=METRICS, chain_mapping="auto", min_identity: float = 30.0,
                  device: str = "auto"):
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
    ref = ComplexReference(reference, metrics)
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
