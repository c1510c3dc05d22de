"""k-medoids: k-means++-style seeding and the FasterPAM swap rule (Schubert & Rousseeuw 2021), on strips.

FasterPAM visits the frames in index order and makes the best swap for a frame as soon as it improves
the loss (the sum of distances to the nearest medoid), until a whole pass finds no swap. Each frame keeps
its nearest and second-nearest medoid; a swap's change is computed from them and the frame's row of
distances. Here the rows come a strip at a time (:mod:`.source`), and the changes of a strip's frames are
computed together (:func:`swap_changes`: elementwise terms and one product with the one-hot matrix of
nearest medoids); after a swap the strip's later frames are evaluated again against the new state, so
the sequence of swaps is FasterPAM's. The rules for ties follow the ``kmedoids`` package (Rust
``fasterpam``): the first medoid at the smallest distance is the nearest (a medoid is its own nearest),
the first slot with the smallest loss is the one replaced, and a change must be < 0.

Seeding: the first medoid uniformly at random, each next one with probability proportional to the squared
distance to the nearest medoid chosen so far (Arthur & Vassilvitskii 2007), from
``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

import numpy as np

from .._array import to_numpy


def kmeanspp_seed(src, k: int, seed) -> tuple[np.ndarray, object]:
    """``k`` initial medoids (NumPy int64) and their rows (k, F) in ``src.xp``."""
    xp = src.xp
    rng = np.random.default_rng(seed)
    meds = [int(rng.integers(src.n))]
    rows = [src.rows(np.array(meds))[0]]
    dmin = rows[0].copy()
    for _ in range(1, k):
        w = to_numpy(dmin) ** 2
        w[meds] = 0.0
        tot = w.sum()
        if tot > 0:
            nxt = int(rng.choice(src.n, p=w / tot))
        else:  # every frame sits on a medoid: the first frame not chosen
            nxt = int(np.flatnonzero(~np.isin(np.arange(src.n), meds))[0])
        meds.append(nxt)
        r = src.rows(np.array([nxt]))[0]
        rows.append(r)
        dmin = xp.minimum(dmin, r)
    return np.asarray(meds, dtype=np.int64), xp.stack(rows)


class State:
    """Nearest / second-nearest medoid of every frame (slot and distance) and the removal losses."""

    def __init__(self, xp, meds, drows):
        self.xp, self.meds, self.d = xp, np.array(meds, dtype=np.int64), drows  # d: (k, F) medoid rows
        k, n = drows.shape
        ar = xp.arange(n)
        # Nearest: the first slot at the smallest distance; second: the same over the other slots.
        first = xp.argmin(drows, axis=0)
        masked = drows.copy()
        masked[first, ar] = xp.inf
        after = xp.argmin(masked, axis=0)
        own = xp.full(n, -1, dtype=xp.int64)
        own[xp.asarray(self.meds)] = xp.arange(k)
        is_med = own >= 0
        # A medoid is its own nearest; the second is then the first other slot at the smallest distance.
        self.near_i = xp.where(is_med, own, first)
        self.seco_i = xp.where(is_med, xp.where(first == own, after, first), after)
        self.near_d, self.seco_d = drows[self.near_i, ar], drows[self.seco_i, ar]
        self.k = k
        self.update_removal()

    def update_removal(self):
        xp = self.xp
        self.removal = xp.zeros(self.k)
        self.removal = self.removal + xp.bincount(self.near_i, weights=self.seco_d - self.near_d, minlength=self.k)
        self.onehot = (self.near_i[:, None] == xp.arange(self.k)[None, :]).astype(xp.float64)

    def loss(self) -> float:
        return float(self.near_d.sum())

    def swap(self, b: int, j: int, row):
        """Medoid slot ``b`` becomes frame ``j`` (``row``: its distances), updating every frame's nearest
        and second-nearest as ``do_swap`` does."""
        xp = self.xp
        self.meds[b] = j
        self.d[b] = row
        ar = xp.arange(row.shape[0])
        ni, si, nd, sd = self.near_i, self.seco_i, self.near_d, self.seco_d
        lost = ni == b
        near_i = xp.where(lost, xp.where(row < sd, b, si), xp.where(row < nd, b, ni))
        # The second nearest recomputed (do_swap's update_second_nearest): the smallest distance over the
        # slots other than the new nearest, slot b first on a tie, then the first slot.
        masked = self.d.copy()
        masked[near_i, ar] = xp.inf
        redo = xp.where(masked[b] == masked.min(axis=0), b, xp.argmin(masked, axis=0))
        seco_i = xp.where(lost, xp.where(row < sd, si, redo),
                          xp.where(row < nd, ni, xp.where(row < sd, b, xp.where(si == b, redo, si))))
        # Frame j itself: nearest b at distance 0, the second its former nearest unless that was b.
        seco_i[j] = si[j] if int(ni[j]) == b else ni[j]
        near_i[j] = b
        self.near_i, self.seco_i = near_i, seco_i
        self.near_d, self.seco_d = self.d[near_i, ar], self.d[seco_i, ar]
        self.near_d[j] = 0.0
        self.update_removal()


def swap_changes(st: State, strip):
    """For each row of ``strip`` (candidate frames' distances, (m, F)): the loss change of its best swap
    and the slot replaced, as ``find_best_swap``."""
    xp = st.xp
    nd, sd = st.near_d[None, :], st.seco_d[None, :]
    closer = strip < nd
    acc = xp.where(closer, strip - nd, 0.0).sum(axis=1)
    t = xp.where(closer, nd - sd, xp.where(strip < sd, strip - sd, 0.0))
    ploss = st.removal[None, :] + t @ st.onehot
    b = xp.argmin(ploss, axis=1)
    return ploss[xp.arange(ploss.shape[0]), b] + acc, b


def fasterpam_rows(src, meds, drows, max_iter: int = 100):
    """FasterPAM from medoids ``meds`` (with their rows ``drows``): ``(labels, medoids, loss, swaps)``
    (labels: each frame's medoid slot, NumPy)."""
    n, k = src.n, len(meds)
    if k == 1:
        return _single(src, int(meds[0]))
    st = State(src.xp, meds, drows)
    swaps = 0
    lastswap = n
    for _ in range(max_iter):
        before, lastloss = swaps, st.loss()
        j = 0
        while j < n and j != lastswap:
            j1 = min(n, j + src.strip_rows)
            if j < lastswap < j1:
                j1 = lastswap
            rows = src.rows(np.arange(j, j1))
            while j < j1:
                change, b = swap_changes(st, rows[j - (j1 - rows.shape[0]):])
                ch, bb = to_numpy(change), to_numpy(b)
                cand = np.arange(j, j1)
                not_med = st.meds[to_numpy(st.near_i[j:j1])] != cand
                hit = np.flatnonzero(not_med & (ch < 0))
                if hit.size == 0:
                    j = j1
                    break
                c = j + int(hit[0])
                st.swap(int(bb[hit[0]]), c, rows[c - (j1 - rows.shape[0])])
                swaps += 1
                lastswap = c
                j = c + 1
        if swaps == before or st.loss() >= lastloss:
            break
    return to_numpy(st.near_i).astype(np.int64), st.meds.copy(), st.loss(), swaps


def _single(src, start: int):
    """k = 1: the medoid is the frame with the smallest sum of distances (the first of them)."""
    sums = np.concatenate([to_numpy(s.sum(axis=1)) for _, _, s in src.strips()])
    m = int(np.argmin(sums))
    return np.zeros(src.n, dtype=np.int64), np.array([m]), float(sums[m]), int(m != start)
