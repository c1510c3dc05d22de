"""GROMOS clustering (Daura et al. 1999; ``gmx cluster -method gromos``).

Neighbours of a frame: the frames at a distance strictly below the cutoff, the frame itself included
(GROMACS's ``gromos()`` lists every ``j`` with ``rmsd[i][j] < cutoff``, ``j == i`` among them). Repeat:
take the remaining frame with the most remaining neighbours (ties: the lowest frame index; GROMACS's
``qsort`` leaves ties to the C library) and its remaining neighbours as the next cluster, centred on it;
remove them. Clusters are numbered 0, 1, ... in the order they are found (largest first).

:func:`gromos_numpy` is the twin written from that definition on a full matrix (counts recomputed from
scratch every round); :func:`gromos_rows` is the same algorithm from row strips (:mod:`.source`): the
counts are row sums of the strips, and removing a cluster recomputes its members' rows and subtracts
their neighbours from the counts, so at most a strip of rows is held at once, never F x F.
"""

from __future__ import annotations

import numpy as np

from .._array import to_numpy


def gromos_numpy(d, cutoff: float):
    """The twin: GROMOS clusters of the full (F, F) symmetric matrix ``d``.

    Returns
    -------
    labels : np.ndarray (F,) int64
        Cluster of each frame, 0-based, in the order found.
    centres : np.ndarray (clusters,) int64
        Each cluster's central frame (the one with the most neighbours when it was taken).
    """
    d = np.asarray(d)
    n = d.shape[0]
    near = d < cutoff
    alive = np.ones(n, dtype=bool)
    labels = np.full(n, -1, dtype=np.int64)
    centres = []
    while alive.any():
        counts = np.where(alive, (near & alive[None, :]).sum(axis=1), -1)
        c = int(np.argmax(counts))  # argmax: the first of the maxima, the lowest frame index
        members = np.flatnonzero(alive & near[c])
        members = np.union1d(members, [c])
        labels[members] = len(centres)
        centres.append(c)
        alive[members] = False
    return labels, np.asarray(centres, dtype=np.int64)


def gromos_rows(src, cutoff: float):
    """GROMOS clusters from row strips of ``src`` (a :class:`.source.Rows`): the same clusters as
    :func:`gromos_numpy` on the matrix whose rows ``src`` gives. Returns ``(labels, centres)`` as NumPy and
    the sum of the members' distances to their centre (from the centres' rows, no extra pass)."""
    xp, n = src.xp, src.n
    counts = src.counts_below(cutoff)
    if counts is None:
        counts = xp.empty(n, dtype=xp.int64)
        for i0, i1, s in src.strips():
            counts[i0:i1] = (s < cutoff).sum(axis=1)
    alive = xp.ones(n, dtype=bool)
    labels = np.full(n, -1, dtype=np.int64)
    centres = []
    total = 0.0
    while True:
        c = int(xp.argmax(counts))  # the removed hold -1
        top = int(counts[c])
        if top <= 0:
            break
        if top == 1:
            # Every remaining frame is its own only neighbour: singletons, taken in index order.
            rest = np.flatnonzero(to_numpy(alive))
            labels[rest] = len(centres) + np.arange(rest.size)
            centres.extend(rest.tolist())
            break
        row = src.rows(np.array([c]))[0]
        members = alive & (row < cutoff)
        members[c] = True
        total += float(xp.where(members, row, 0.0).sum())
        m = np.flatnonzero(to_numpy(members))
        labels[m] = len(centres)
        centres.append(c)
        alive &= ~members
        for _, s in src.rows_chunked(m):
            counts -= (s < cutoff).sum(axis=0)
        counts = xp.where(alive, counts, -1)
    return labels, np.asarray(centres, dtype=np.int64), total
