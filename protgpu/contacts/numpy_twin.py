"""The NumPy twin of the contact kernel (:func:`residue_distances_numpy`: residue-pair minimum
distances in row tiles, the specification and the CPU path) and the CPU path of :func:`protgpu.contacts`
(:func:`contacts_cpu`: the twin in frame chunks, so that frequency and pairs outputs stay small).

Internal API (tests, benchmarks): :func:`residue_distances_numpy`, :func:`contacts_cpu`.
"""

from __future__ import annotations

import numpy as np

from .._pbc import box_arrays, half_plane_spacing_sq, min_image_sq_triclinic
from .._threads import cpu_threads
from .maps import ContactPairs


def _sq_dist_block(rows, cols, mode, vec, inv, out, tmp):
    """``out[f, a, b] = |cols[f, b] - rows[f, a]|^2`` (minimum image when a box is given).

    rows (fc, nr, 3), cols (fc, nc, 3); vec/inv (fc, 3, 3) or None; out/tmp (fc, nr, nc).
    """
    if mode == 2:
        for f in range(rows.shape[0]):
            d = cols[f][None, :, :] - rows[f][:, None, :]
            out[f] = min_image_sq_triclinic(d, vec[f], inv[f], half_plane_spacing_sq(vec[f]))
        return out
    # One component at a time into preallocated buffers: no (fc, nr, nc, 3) temporary.
    for c in range(3):
        t = out if c == 0 else tmp
        np.subtract(cols[:, None, :, c], rows[:, :, None, c], out=t)
        if mode == 1:
            length = vec[:, c, c][:, None, None]
            t -= length * np.rint(t * inv[:, c, c][:, None, None])
        np.multiply(t, t, out=t)
        if c:
            out += t
    return out


def _row_tiles(seg_starts: np.ndarray, tile: int):
    """Greedy groups of consecutive residues holding at most ``tile`` atoms (at least one residue)."""
    n = len(seg_starts) - 1
    i = 0
    while i < n:
        k = i + 1
        while k < n and seg_starts[k + 1] - seg_starts[i] <= tile:
            k += 1
        yield i, k
        i = k


def _min_sq_numpy(x: np.ndarray, seg: np.ndarray, tile: int, mode: int, vec, inv) -> np.ndarray:
    """Per-frame minimum squared distance between every two residue segments.

    Parameters
    ----------
    x : ndarray (fc, A, 3)
        The scheme's atoms, grouped by residue; every segment non-empty.
    seg : ndarray of int (S + 1,)
        Segment boundaries in ``x``.
    tile : int
        Row atoms per block (whole residues; a larger residue is a block of its own).

    Returns
    -------
    ndarray (fc, S, S), symmetric.
    """
    fc, n_atoms = x.shape[:2]
    n_seg = len(seg) - 1
    out = np.empty((fc, n_seg, n_seg), dtype=x.dtype)
    for i, k in _row_tiles(seg, tile):
        a0, a1 = int(seg[i]), int(seg[k])
        rows = x[:, a0:a1]
        cols = x[:, a0:]  # the upper part: residues >= i
        shape = (fc, a1 - a0, n_atoms - a0)
        d2 = _sq_dist_block(rows, cols, mode, vec, inv, np.empty(shape, x.dtype), np.empty(shape, x.dtype))
        # min over each row residue's atoms first (few segments of long contiguous rows: fast), then
        # over each column residue's atoms
        m = np.minimum.reduceat(d2, seg[i:k] - a0, axis=1)
        m = np.minimum.reduceat(m, seg[i:-1] - a0, axis=2)
        out[:, i:k, i:] = m
        out[:, i:, i:k] = m.transpose(0, 2, 1)
    return out


def residue_distances_numpy(coords, atom_idx, starts, allowed, *, box=None, tile: int = 128,
                            frame_chunk: int | None = None, threads: int | None = None, out=None):
    """The NumPy twin of the contact kernel: residue-pair minimum distances.

    For each frame and each residue pair (i, j): the minimum over atoms a of residue i and b of
    residue j of ``|x_b - x_a|`` (minimum image with a box), computed in row blocks of ``tile`` atoms
    against the residues at or after the block (the rest is the mirror), with ``np.minimum.reduceat``
    over residue ranges on both axes. Only one (frames chunk, tile, atoms) block is alive at a time.

    Parameters
    ----------
    coords : np.ndarray, shape (F, N, 3), float32 or float64
        Angstrom. Computed in its dtype.
    atom_idx : np.ndarray of int, shape (A,)
        Atoms grouped by residue (:func:`scheme_atoms`).
    starts : np.ndarray of int, shape (R + 1,)
        Residue boundaries in ``atom_idx``.
    allowed : np.ndarray of bool, shape (R, R)
        Pairs to report (:func:`allowed_pairs`); the rest are +inf.
    box : array_like, optional
        Periodic box: (3,) or (F, 3) edge lengths, or (3, 3) / (F, 3, 3) vectors (rows a, b, c),
        Angstrom; a (3, 3) array is one box's vectors.
    tile : int
        Row block size in atoms. Results do not depend on it (min is exact).
    frame_chunk : int, optional
        Frames per block; default keeps a block near 2**18 elements.
    threads : int, optional
        Worker threads over frame blocks (default: the usable CPU cores).
    out : np.ndarray, shape (F, R, R), optional
        Where to write.

    Returns
    -------
    np.ndarray, shape (F, R, R), coords' dtype
        Distances in Angstrom; +inf where ``allowed`` is False or a residue has no atom.
    """
    x_all = np.asarray(coords)
    n_frames = x_all.shape[0]
    dtype = x_all.dtype
    starts = np.asarray(starts, dtype=np.int64)
    atom_idx = np.asarray(atom_idx, dtype=np.int64)
    n_res = len(starts) - 1
    counts = np.diff(starts)
    nonempty = np.flatnonzero(counts > 0)
    seg = np.append(starts[:-1][nonempty], starts[-1])
    vec, inv, mode = box_arrays(box, n_frames, dtype)
    res = out if out is not None else np.empty((n_frames, n_res, n_res), dtype=dtype)
    res.fill(np.inf)
    if nonempty.size:
        tile = max(int(tile), 1)
        n_atoms = int(atom_idx.size)
        if frame_chunk is None:
            # Blocks of about 2**18 elements (1 MiB in float32) stay in cache: NumPy's passes over
            # them are then not limited by memory bandwidth.
            frame_chunk = max(1, (1 << 18) // max(1, min(tile, n_atoms) * n_atoms))
        sub = np.ix_(nonempty, nonempty)

        def work(f0):
            f1 = min(n_frames, f0 + frame_chunk)
            x = x_all[f0:f1][:, atom_idx]
            fv = fi = None
            if mode:
                b = slice(f0, f1) if len(vec) > 1 else np.zeros(f1 - f0, dtype=np.int64)
                fv, fi = vec[b], inv[b]
            m = np.sqrt(_min_sq_numpy(x, seg, tile, mode, fv, fi))
            if nonempty.size == n_res:
                res[f0:f1] = m
            else:
                res[f0:f1][(slice(None), *sub)] = m

        starts_f = range(0, n_frames, frame_chunk)
        n_workers = min(len(starts_f), cpu_threads() if threads is None else max(1, int(threads)))
        if n_workers > 1:
            # NumPy's ufunc loops release the GIL: frame chunks run in parallel on the cores.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(n_workers) as pool:
                list(pool.map(work, starts_f))
        else:
            for f0 in starts_f:
                work(f0)
    res[:, ~np.asarray(allowed, dtype=bool)] = np.inf
    return res


def contacts_cpu(x, atom_idx, starts, allowed, box, *, cutoff, keep, tile=128):
    n_frames = x.shape[0]
    r = len(starts) - 1
    dtype = x.dtype
    vec, _inv, _mode = box_arrays(box, n_frames, np.float64)
    counts = np.zeros((r, r), dtype=np.int64)
    dist_all = cont_all = None
    if keep == "dense":
        dist_all = np.empty((n_frames, r, r), dtype=dtype)
        cont_all = np.empty((n_frames, r, r), dtype=bool)
        chunk = n_frames
    else:
        chunk = max(1, (1 << 24) // max(1, r * r * (dtype.itemsize + 1)))
    pieces = []
    iu = np.triu(np.ones((r, r), dtype=bool), 1)
    for f0 in range(0, n_frames, chunk):
        f1 = min(n_frames, f0 + chunk)
        b = None if vec is None else (vec[f0:f1] if len(vec) > 1 else vec[0])
        d = residue_distances_numpy(x[f0:f1], atom_idx, starts, allowed, box=b, tile=tile,
                                    out=None if dist_all is None else dist_all[f0:f1])
        c = d < cutoff
        counts += c.sum(axis=0)
        if cont_all is not None:
            cont_all[f0:f1] = c
        if keep == "pairs":
            f, i, j = np.nonzero(c & iu[None])
            pieces.append(((f + f0).astype(np.int64), i.astype(np.int32), j.astype(np.int32), d[f, i, j]))
    pairs = None
    if keep == "pairs":
        pairs = ContactPairs(*(np.concatenate([p[k] for p in pieces]) if pieces else np.zeros(0, t)
                               for k, t in enumerate((np.int64, np.int32, np.int32, dtype))))
    return dist_all, cont_all, counts, pairs
