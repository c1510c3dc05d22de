"""The per-model neighbour searches of the complex scores and design-sanity metrics (k-d trees,
scipy): QS-score's representative-atom contacts (:func:`_pairs_below`), DockQ's and the interface's
residue contacts (:func:`_contact_atoms`, :func:`_contact_pairs`), the clash candidates
(:data:`_QUICK_TREE`, :func:`_grown`). Why each is exact, ties at the cutoff included, is in
docs/design/complexes.md (Throughput)."""

from __future__ import annotations

import math

import numpy as np

from ..scoring._fast import cell_sort

#: k-d trees of one model's atoms, built for one search: unbalanced and not compacted (about half the
#: build time of scipy's defaults for a few thousand atoms; the searches find the same pairs)
_QUICK_TREE = {"balanced_tree": False, "compact_nodes": False}


def _grown(cutoff: float) -> float:
    """A k-d tree's search radius for pairs closer than ``cutoff`` by NumPy's arithmetic: grown past any
    rounding of the tree's own distances (the candidates are tested again, exactly)."""
    return cutoff * (1 + 1e-6) + 1e-6


def _pairs_below(x1: np.ndarray, x2: np.ndarray, cutoff: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs (i, j) of points ``x1`` (N1, 3) and ``x2`` (N2, 3), float64 Angstrom, closer than
    ``cutoff`` (strict ``<``): (i, j, distance), each (K,), sorted by ``i * N2 + j`` (the row-major
    order of the full distance matrix). The distance is the full matrix's NumPy arithmetic
    (``sqrt(((x1[i] - x2[j]) ** 2).sum())``, the same bits), so ties at the cutoff fall as they would
    there; a k-d tree only proposes the candidates, within a radius grown past any rounding of its own."""
    from scipy.spatial import cKDTree

    if not len(x1) or not len(x2):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    # (the candidates' order does not matter: they are sorted below)
    m = cKDTree(x1, **_QUICK_TREE).sparse_distance_matrix(cKDTree(x2, **_QUICK_TREE), _grown(cutoff),
                                                          output_type="ndarray")
    i, j = m["i"].astype(np.int64), m["j"].astype(np.int64)
    order = np.argsort(i * len(x2) + j, kind="stable")
    i, j = i[order], j[order]
    d = np.sqrt(((x1[i] - x2[j]) ** 2).sum(-1))
    keep = d < cutoff
    return i[keep], j[keep], d[keep]


def _contact_pairs(xyz, atoms1, atoms2, res_of, cutoff) -> np.ndarray:
    """Distinct residue pairs (K, 2) int64, sorted, with any atom of ``atoms1`` within ``cutoff`` (<=) of
    one of ``atoms2`` (heavy atoms given): the residues of :func:`_contact_atoms`' pairs."""
    i, j = _contact_atoms(xyz, atoms1, atoms2, cutoff)
    return _residue_pairs(res_of[atoms1[i]], res_of[atoms2[j]])


def _contact_atoms(xyz, atoms1, atoms2, cutoff) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of an atom of ``atoms1`` within ``cutoff`` (<=) of one of ``atoms2``, as positions
    (i, j) in the two lists, int64 (K,) each, in no particular order; each pair's distance is
    symmetric, so swapping the lists swaps i and j.

    "Within" is the k-d tree's test (``sparse_distance_matrix``: the pairs ``query_ball_tree`` finds,
    ties included; :func:`_contact_atoms_tree`). With numba (:func:`protgpu.scoring._fast.enabled`) a
    compiled cell list finds them instead: pairs clearly inside or outside the cutoff (squared distance
    more than 1e-9 relative from the squared cutoff: far beyond any difference of rounding between
    two float64 sums of three squares) are decided there, the few left in that band by the k-d tree's
    own test, so both give the same pairs."""
    from ..scoring import _fast

    if len(atoms1) and len(atoms2) and _fast.enabled():
        _LOOPS.compile()
        x1 = np.ascontiguousarray(xyz[atoms1], np.float64)
        x2 = np.ascontiguousarray(xyz[atoms2], np.float64)
        lo, hi = _bounds(x2)
        edge = _grown(cutoff)  # cells of edge >= cutoff: the 27 around an atom's hold every partner
        dims = _fast.cell_grid(lo, hi, len(x2), edge)
        if dims is not None:
            r2 = float(cutoff) * float(cutoff)
            i, j, unsure = _contact_cells(x1, x2, r2 * (1 - 1e-9), r2 * (1 + 1e-9), lo, edge, dims)
            if unsure.any():
                keep = ~unsure
                ui, uj = i[unsure], j[unsure]
                m = _contact_atoms_tree(x1[ui], x2[uj], cutoff)
                keep[np.flatnonzero(unsure)[m[0][m[0] == m[1]]]] = True  # each band pair, alone
                i, j = i[keep], j[keep]
            return i, j
    return _contact_atoms_tree(xyz[atoms1], xyz[atoms2], cutoff)


def _contact_atoms_tree(x1: np.ndarray, x2: np.ndarray, cutoff: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_contact_atoms` of the points ``x1`` (N1, 3) and ``x2`` (N2, 3) by a k-d tree pass, the
    NumPy-and-scipy twin: positions (i, j) of the pairs within ``cutoff`` (<=)."""
    from scipy.spatial import cKDTree

    sel1, sel2 = np.arange(len(x1)), np.arange(len(x2))
    if len(x1) and len(x2):
        # only atoms inside the other side's bounding box grown by the cutoff can be in contact (a
        # chain's interface is a small part of it): smaller trees, the same pairs
        pad = cutoff * (1 + 1e-9) + 1e-9
        sel1 = np.flatnonzero(((x1 >= x2.min(0) - pad) & (x1 <= x2.max(0) + pad)).all(1))
        if len(sel1):
            y1 = x1[sel1]
            sel2 = np.flatnonzero(((x2 >= y1.min(0) - pad) & (x2 <= y1.max(0) + pad)).all(1))
    if not len(sel1) or not len(sel2):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # (trees built without balancing or compaction: twice as fast to build, the same pairs, since each
    # candidate's distance is tested on its own)
    m = cKDTree(x1[sel1], **_QUICK_TREE).sparse_distance_matrix(cKDTree(x2[sel2], **_QUICK_TREE), cutoff,
                                                                output_type="ndarray")
    return sel1[m["i"]], sel2[m["j"]]


def _residue_pairs(r1: np.ndarray, r2: np.ndarray) -> np.ndarray:
    """The distinct (r1, r2) pairs of two residue index arrays (K,), as (P, 2) int64 sorted rows."""
    r1, r2 = np.asarray(r1, np.int64), np.asarray(r2, np.int64)
    n = int(max(r1.max(initial=0), r2.max(initial=0))) + 1
    code = r1 * n + r2
    if n * n <= 1 << 22:  # a table of every residue pair (at most 4 MB): distinct and sorted in O(pairs)
        seen = np.zeros(n * n, bool)
        seen[code] = True
        code = np.flatnonzero(seen)
    else:
        code = np.unique(code)
    return np.stack([code // n, code % n], axis=1)


def _contacts(xyz, atoms1, atoms2, res_of, cutoff) -> set:
    """Residue pairs (r1, r2) with any atom pair closer than ``cutoff`` (heavy atoms given)."""
    return set(map(tuple, _contact_pairs(xyz, atoms1, atoms2, res_of, cutoff).tolist()))


def _near(xyz, atoms1, atoms2, res_of, cutoff) -> set:
    """Residues of ``atoms1`` with any atom within ``cutoff`` of ``atoms2``."""
    from scipy.spatial import cKDTree

    if not len(atoms1) or not len(atoms2):
        return set()
    d, _ = cKDTree(xyz[atoms2]).query(xyz[atoms1], distance_upper_bound=cutoff)
    return {int(r) for r in res_of[atoms1[d <= cutoff]]}


# --------------------------------------------------------------------------------------------------
# Clash candidates: a compiled cell list (optional, numba; the k-d tree otherwise)


def clash_candidates(x: np.ndarray, res: np.ndarray, chain_code: np.ndarray, sg: np.ndarray,
                     cutoff: float) -> tuple[np.ndarray, np.ndarray]:
    """Atom pairs (i, j), i < j, int64 (K,) each, that may be closer than ``cutoff`` (Angstrom): every
    pair within the cutoff grown past rounding (:func:`_grown`), less the pairs a clash never is
    (one residue, sequence-adjacent residues of one chain, two SG atoms). ``x`` (N, 3) float64.

    The caller tests ``<`` on NumPy's distances, so both searches give the same clashes: a compiled
    cell list (numba, when :func:`protgpu.scoring._fast.enabled`: the bonded pairs, most of what a
    k-d tree returns at 2.2 A, are dropped inside the loop) or, without numba or for a cell grid much
    sparser than the atoms, the k-d tree (:func:`clash_candidates_tree`)."""
    from ..scoring import _fast

    r = _grown(cutoff)
    if len(x) and _fast.enabled():
        _LOOPS.compile()
        x = np.ascontiguousarray(x, np.float64)
        lo, hi = _bounds(x)
        # cells of edge r: the 27 around an atom's hold every partner (a grid much sparser than the
        # atoms, parts far apart: the k-d tree, as lDDT's pairs_within)
        dims = _fast.cell_grid(lo, hi, len(x), r)
        if dims is not None:
            return _clash_cells(x, r, np.ascontiguousarray(res, np.int64),
                                np.ascontiguousarray(chain_code, np.int64), np.ascontiguousarray(sg, np.bool_),
                                lo, r, dims)
    return clash_candidates_tree(x, res, chain_code, sg, cutoff)


def clash_candidates_tree(x, res, chain_code, sg, cutoff):
    """:func:`clash_candidates` by a k-d tree (``query_pairs``), the NumPy-and-scipy twin."""
    from scipy.spatial import cKDTree

    pairs = cKDTree(x, **_QUICK_TREE).query_pairs(_grown(cutoff), output_type="ndarray")
    i, j = pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)
    keep = ~(((chain_code[i] == chain_code[j]) & (np.abs(res[i] - res[j]) <= 1)) | (sg[i] & sg[j]))
    return i[keep], j[keep]


def _bounds(x):
    """(lowest, highest) coordinate on each axis of ``x`` (N >= 1, 3): one pass (NumPy's axis-0
    min and max of an (N, 3) array are slow for their work)."""
    lo = x[0].copy()
    hi = x[0].copy()
    for a in range(1, x.shape[0]):
        for k in range(3):
            lo[k] = min(lo[k], x[a, k])
            hi[k] = max(hi[k], x[a, k])
    return lo, hi


def _contact_cells(x1, x2, r2lo, r2hi, lo, edge, dims):
    """:func:`_contact_atoms`' pairs by a cell list of ``x2`` (compiled by numba, see ``_LOOPS``):
    positions (i, j) of the pairs with squared distance <= ``r2hi``, and whether it is above
    ``r2lo`` (a pair for the k-d tree's own test)."""
    nx, ny, nz = dims[0], dims[1], dims[2]
    _, start, order, xs = cell_sort(x2, lo, edge, dims)
    cap = 64
    oi = np.empty(cap, dtype=np.int64)
    oj = np.empty(cap, dtype=np.int64)
    ou = np.empty(cap, dtype=np.bool_)
    k_out = 0
    for i in range(x1.shape[0]):
        p0, p1, p2 = x1[i, 0], x1[i, 1], x1[i, 2]
        c0 = int(math.floor((p0 - lo[0]) / edge))
        c1 = int(math.floor((p1 - lo[1]) / edge))
        c2 = int(math.floor((p2 - lo[2]) / edge))
        for cx in range(max(c0 - 1, 0), min(c0 + 2, nx)):
            for cy in range(max(c1 - 1, 0), min(c1 + 2, ny)):
                for cz in range(max(c2 - 1, 0), min(c2 + 2, nz)):
                    c = (cx * ny + cy) * nz + cz
                    for t in range(start[c], start[c + 1]):
                        v0 = p0 - xs[t, 0]
                        v1 = p1 - xs[t, 1]
                        v2 = p2 - xs[t, 2]
                        d2 = v0 * v0 + v1 * v1 + v2 * v2
                        if d2 <= r2hi:
                            if k_out == cap:
                                cap *= 2
                                gi = np.empty(cap, dtype=np.int64)
                                gj = np.empty(cap, dtype=np.int64)
                                gu = np.empty(cap, dtype=np.bool_)
                                gi[:k_out] = oi[:k_out]
                                gj[:k_out] = oj[:k_out]
                                gu[:k_out] = ou[:k_out]
                                oi, oj, ou = gi, gj, gu
                            oi[k_out] = i
                            oj[k_out] = order[t]
                            ou[k_out] = d2 > r2lo
                            k_out += 1
    return oi[:k_out].copy(), oj[:k_out].copy(), ou[:k_out].copy()


def _clash_cells(x, r, res, code, sg, lo, edge, dims):
    """:func:`clash_candidates` by a cell list (compiled by numba, see ``_LOOPS``): the atoms sorted by
    cell, each atom's own cell (later atoms) and the 13 cells after it tested, so that each pair is
    seen once, on contiguous rows."""
    n = x.shape[0]
    nx, ny, nz = dims[0], dims[1], dims[2]
    ci, start, order, xs = cell_sort(x, lo, edge, dims)
    rs = np.empty(n, dtype=np.int64)
    cs = np.empty(n, dtype=np.int64)
    gs = np.empty(n, dtype=np.bool_)
    for t in range(n):
        a = order[t]
        rs[t], cs[t], gs[t] = res[a], code[a], sg[a]
    r2 = r * r
    cap = 64
    oi = np.empty(cap, dtype=np.int64)
    oj = np.empty(cap, dtype=np.int64)
    k_out = 0
    for p in range(n):
        i = order[p]
        px, py, pz = ci[i, 0], ci[i, 1], ci[i, 2]
        for dx in range(0, 2):
            cx = px + dx
            if cx >= nx:
                continue
            for dy in range(-1, 2):
                cy = py + dy
                if cy < 0 or cy >= ny or (dx == 0 and dy < 0):
                    continue
                for dz in range(-1, 2):
                    cz = pz + dz
                    if cz < 0 or cz >= nz or (dx == 0 and dy == 0 and dz < 0):
                        continue
                    c = (cx * ny + cy) * nz + cz
                    t0 = p + 1 if (dx == 0 and dy == 0 and dz == 0) else start[c]
                    for t in range(t0, start[c + 1]):
                        if (cs[p] == cs[t] and abs(rs[p] - rs[t]) <= 1) or (gs[p] and gs[t]):
                            continue
                        v0 = xs[p, 0] - xs[t, 0]
                        v1 = xs[p, 1] - xs[t, 1]
                        v2 = xs[p, 2] - xs[t, 2]
                        if v0 * v0 + v1 * v1 + v2 * v2 <= r2:
                            if k_out == cap:
                                cap *= 2
                                gi = np.empty(cap, dtype=np.int64)
                                gj = np.empty(cap, dtype=np.int64)
                                gi[:k_out] = oi[:k_out]
                                gj[:k_out] = oj[:k_out]
                                oi, oj = gi, gj
                            j = order[t]
                            oi[k_out] = min(i, j)
                            oj[k_out] = max(i, j)
                            k_out += 1
    return oi[:k_out].copy(), oj[:k_out].copy()


def _make_loops():
    from ..scoring._fast import Loops

    loops = Loops(globals())
    # (cell_sort, imported from scoring._fast, is compiled here too: numba takes a callee from this
    # module's globals)
    for fn in (_bounds, cell_sort, _contact_cells, _clash_cells):
        loops.jit(fn)
    return loops


_LOOPS = _make_loops()
