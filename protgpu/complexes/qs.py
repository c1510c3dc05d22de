"""QS-score (Bertoni et al. 2017, as OpenStructure's ``QSScorer``) of one mapped model: the
representative atoms' inter-chain contacts of model and reference, weighted by their distance
(docs/design/complexes.md)."""

from __future__ import annotations

import numpy as np

from ._atoms import representative_atoms
from ._contacts import _pairs_below
from .mapping import ChainMapping

QS_CONTACT = 12.0  # Angstrom, CB-CB (CA for GLY) inter-chain contact of QS-score


def _w(d: np.ndarray) -> np.ndarray:
    # probability that two residues interact given their CB distance (Xu et al. 2009)
    return np.where(d <= 5.0, 1.0, np.exp(-2.0 * ((d - 5.0) / 4.28) ** 2))


class _QSChains:
    """Representative positions of one structure's protein chains (residues without the atom dropped)."""

    def __init__(self, s, info, chains: dict, reps: dict | None = None):
        xyz = np.asarray(s.coords[0], dtype=np.float64)
        self.res, self.pos, self._contacts = {}, {}, {}
        reps = _qs_reps(info, chains) if reps is None else reps
        for c, (res, rep) in reps.items():
            self.res[c] = res
            self.pos[c] = xyz[rep]
        names = list(chains)
        self.interfaces = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
                           if len(self.contacts(a, b)[0])]

    def contacts(self, a, b) -> tuple[np.ndarray, np.ndarray]:
        """The representative-atom pairs of chains a and b closer than :data:`QS_CONTACT`: their cells
        ``row * len(b) + column`` of the (a, b) distance matrix in row-major order, int64 (K,), and
        their distances (K,), Angstrom (those of the full matrix, bit for bit: :func:`_pairs_below`).
        Computed once: the reference's serve every model, a model's both the interface search and the
        scores."""
        if (a, b) not in self._contacts:
            pa, pb = self.pos[a], self.pos[b]
            i, j, d = _pairs_below(pa, pb, QS_CONTACT)
            self._contacts[a, b] = (i * len(pb) + j, d)
        return self._contacts[a, b]


def _qs_reps(info, chains: dict) -> dict:
    """Chain -> (residues that have a representative atom, its atom index): per atom table."""
    out = {}
    for c, res in chains.items():
        rep = representative_atoms(info, res)
        out[c] = (res[rep >= 0], rep[rep >= 0])
    return out


def _positions(values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Index of each of ``keys`` in ``values`` (distinct non-negative integers), -1 where absent."""
    size = int(max(values.max(initial=-1), keys.max(initial=-1))) + 1
    pos = np.full(size, -1, np.int64)
    pos[values] = np.arange(len(values))
    return pos[keys]


def _qs_pairs(ref: _QSChains, mdl: _QSChains, r_int, m_int, mapping: ChainMapping) -> list:
    """Per chain of the interface: (reference position, model position) rows, shape (K, 2), of the mapped
    residues both structures have a representative atom for, in the mapping's order."""
    idx = []
    for rc, mc in zip(r_int, m_int, strict=True):
        pairs = mapping.residues.get(rc, np.zeros((0, 2), np.int64))
        rp, mpos = _positions(ref.res[rc], pairs[:, 1]), _positions(mdl.res[mc], pairs[:, 0])
        ok = (rp >= 0) & (mpos >= 0)
        idx.append(np.stack([rp[ok], mpos[ok]], axis=1))
    return idx


def _qs_interface(ref: _QSChains, mdl: _QSChains, r_int, m_int, mapping: ChainMapping, memo: dict | None = None):
    """(weighted_scores, weight_sum, weight_extra_mapped, weight_extra_all) of one mapped interface.
    ``memo``: a dict kept per model atom table and mapping (the residue pairs are the same for all its
    models).

    On the contacts only (:meth:`_QSChains.contacts`), not the full distance matrices: each contact's
    cell in the grid of mapped residue pairs (rows: chain 1's mapped residues, columns: chain 2's, in the
    mapping's order); a contact is shared when both structures have one in that grid cell. Every sum
    runs over the same values in the same order as on the full matrices (shared contacts in grid order,
    the others in their matrix's row-major order): the same result, bit for bit."""
    if memo is None:
        idx = _qs_pairs(ref, mdl, r_int, m_int, mapping)
    else:
        key = ("qs", r_int, m_int)
        if key not in memo:
            memo[key] = _qs_pairs(ref, mdl, r_int, m_int, mapping)
        idx = memo[key]
    (a1, a2), (b1, b2) = idx[0].T, idx[1].T
    ncol = len(b1)

    def grid(s: _QSChains, chains, rows, cols):
        # (grid cell of each contact, -1 off the grid; distances)
        code, d = s.contacts(*chains)
        n_b = len(s.pos[chains[1]])
        p, q = _positions(rows, code // n_b), _positions(cols, code % n_b)
        return np.where((p >= 0) & (q >= 0), p * ncol + q, -1), d

    g1, d1 = grid(ref, r_int, a1, b1)
    g2, d2 = grid(mdl, m_int, a2, b2)
    on1, on2 = g1[g1 >= 0], g2[g2 >= 0]
    shared1 = (g1 >= 0) & np.isin(g1, on2)
    shared2 = (g2 >= 0) & np.isin(g2, on1)
    # the shared contacts in grid order in both structures (the grid cells are distinct)
    s1 = d1[shared1][np.argsort(g1[shared1])]
    s2 = d2[shared2][np.argsort(g2[shared2])]
    w = _w(np.minimum(s1, s2))
    weighted = float((w * (1.0 - np.abs(s1 - s2) / 12.0)).sum())
    wsum = float(w.sum())
    extra_mapped = float(_w(d1[(g1 >= 0) & ~shared1]).sum() + _w(d2[(g2 >= 0) & ~shared2]).sum())
    extra_all = float(_w(d1[~shared1]).sum() + _w(d2[~shared2]).sum())
    return weighted, wsum, extra_mapped, extra_all


def qs_score(ref: _QSChains, mdl: _QSChains, mapping: ChainMapping, memo: dict | None = None) -> tuple[float, float]:
    """QS_global and QS_best of a mapped model (NaN when neither structure has an inter-chain contact);
    ``memo`` as :func:`_qs_interface`."""
    flat = mapping.chains
    back = {m: r for r, m in flat.items()}
    tot = np.zeros(4)
    done = set()
    for r_int in ref.interfaces:
        if r_int[0] in flat and r_int[1] in flat:
            m_int = (flat[r_int[0]], flat[r_int[1]])
            tot += _qs_interface(ref, mdl, r_int, m_int, mapping, memo)
            done.add(frozenset(m_int))
        else:
            tot[3] += _w(ref.contacts(*r_int)[1]).sum()
    for m_int in mdl.interfaces:
        if frozenset(m_int) in done:
            continue
        if m_int[0] in back and m_int[1] in back:
            tot += _qs_interface(ref, mdl, (back[m_int[0]], back[m_int[1]]), m_int, mapping, memo)
        else:
            tot[3] += _w(mdl.contacts(*m_int)[1]).sum()
    weighted, wsum, extra_mapped, extra_all = tot
    glob = weighted / (wsum + extra_all) if wsum + extra_all > 0 else float("nan")
    best = weighted / (wsum + extra_mapped) if wsum + extra_mapped > 0 else float("nan")
    return float(glob), float(best)
