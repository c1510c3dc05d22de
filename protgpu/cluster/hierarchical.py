"""Hierarchical clustering: SciPy's ``linkage`` on the condensed matrix when it fits in memory (SciPy is
the reference: the same merge order, heights and ties by construction), and single linkage from row
strips through a minimum spanning tree (:func:`single_linkage_rows`) when it does not.

:func:`single_linkage_rows` follows SciPy's ``mst_single_linkage`` step by step (Prim's algorithm from
frame 0; the next frame is the first one at the smallest distance; the edges sorted stably by height,
then labelled through a union-find), so its linkage equals SciPy's, each step needing one row.
"""

from __future__ import annotations

import numpy as np

from .._array import to_numpy


def single_linkage_rows(src) -> np.ndarray:
    """Single linkage of the frames ``src`` gives rows of (:class:`.source.Rows`), SciPy's format
    ((F - 1, 4) float64: the two clusters merged, the height, the new cluster's size)."""
    n = src.n
    z = np.empty((n - 1, 4))
    merged = np.zeros(n, dtype=bool)
    best = np.full(n, np.inf)
    x = 0
    for k in range(n - 1):
        merged[x] = True
        row = to_numpy(src.rows(np.array([x]))[0])
        np.minimum(best, row, out=best, where=~merged)
        cand = np.where(merged, np.inf, best)
        y = int(np.argmin(cand))  # the first of the smallest, as SciPy's strict '<' scan
        z[k, 0], z[k, 1], z[k, 2] = x, y, cand[y]
        x = y
    z = z[np.argsort(z[:, 2], kind="mergesort")]
    _label(z, n)
    return z


def _label(z: np.ndarray, n: int) -> None:
    """SciPy's ``label``: cluster ids through a union-find, the smaller root first, sizes in column 3."""
    parent = np.arange(2 * n - 1)
    size = np.ones(2 * n - 1, dtype=np.int64)

    def find(a):
        root = a
        while parent[root] != root:
            root = parent[root]
        while parent[a] != root:
            parent[a], a = root, parent[a]
        return root

    nxt = n
    for i in range(n - 1):
        a, b = find(int(z[i, 0])), find(int(z[i, 1]))
        z[i, 0], z[i, 1] = (a, b) if a < b else (b, a)
        parent[a] = parent[b] = nxt
        size[nxt] = size[a] + size[b]
        z[i, 3] = size[nxt]
        nxt += 1


def linkage_scipy(condensed: np.ndarray, method: str) -> np.ndarray:
    """``scipy.cluster.hierarchy.linkage`` of a condensed matrix (float64)."""
    from scipy.cluster.hierarchy import linkage

    return linkage(condensed, method=method)


def cut(z: np.ndarray, *, cutoff=None, k=None) -> np.ndarray:
    """Flat labels (0-based) from a linkage: ``fcluster`` at height ``cutoff`` (criterion "distance") or
    into ``k`` clusters (criterion "maxclust")."""
    from scipy.cluster.hierarchy import fcluster

    if k is not None:
        return fcluster(z, int(k), criterion="maxclust").astype(np.int64) - 1
    return fcluster(z, float(cutoff), criterion="distance").astype(np.int64) - 1
