"""The per-model neighbour searches of the complex scores and design-sanity metrics (k-d trees,
scipy): QS-score's representative-atom contacts (:func:`_pairs_below`), DockQ's and the interface's
residue contacts (:func:`_contact_atoms`, :func:`_contact_pairs`), the clash candidates
(:data:`_QUICK_TREE`, :func:`_grown`). Why each is exact, ties at the cutoff included, is in
docs/design/complexes.md (Throughput)."""

from __future__ import annotations

import numpy as np

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
    (i, j) in the two lists, int64 (K,) each, in no particular order. One vectorised k-d tree pass
    (``sparse_distance_matrix``: the pairs ``query_ball_tree`` finds, ties included) instead of a
    Python loop over atom pairs; each pair's distance is symmetric, so swapping the lists swaps i and j."""
    from scipy.spatial import cKDTree

    sel1, sel2 = np.arange(len(atoms1)), np.arange(len(atoms2))
    if len(atoms1) and len(atoms2):
        # only atoms inside the other side's bounding box grown by the cutoff can be in contact (a
        # chain's interface is a small part of it): smaller trees, the same pairs
        x1, x2 = xyz[atoms1], xyz[atoms2]
        pad = cutoff * (1 + 1e-9) + 1e-9
        sel1 = np.flatnonzero(((x1 >= x2.min(0) - pad) & (x1 <= x2.max(0) + pad)).all(1))
        x1 = x1[sel1]
        if len(sel1):
            sel2 = np.flatnonzero(((x2 >= x1.min(0) - pad) & (x2 <= x1.max(0) + pad)).all(1))
    if not len(sel1) or not len(sel2):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # (trees built without balancing or compaction: twice as fast to build, the same pairs, since each
    # candidate's distance is tested on its own)
    m = cKDTree(xyz[atoms1[sel1]], **_QUICK_TREE).sparse_distance_matrix(
        cKDTree(xyz[atoms2[sel2]], **_QUICK_TREE), cutoff, output_type="ndarray")
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
