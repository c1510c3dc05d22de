"""The CUDA path of :func:`protgpu.contacts`: :class:`GPUPlan` (the device-side constants of one call:
index lists, interleaved row atoms, row blocks, box) and :func:`contacts_cuda` (frames in chunks under
the device memory budget through ``kernels/contacts.cu``). ``docs/design/contacts.md`` describes the
kernel's blocks.

Internal API (tests, benchmarks): :class:`GPUPlan`, :func:`contacts_cuda`, :func:`interleaved_rows`,
``MAX_THREADS`` (threads per block at most).
"""

from __future__ import annotations

import numpy as np

from .._array import is_cupy_array
from .._memory import device_budget_bytes, rows_per_chunk
from .._pbc import box_arrays, half_plane_spacing_sq
from .maps import ContactPairs

_RPT = 2          # row atoms per thread (kernel RPT default)
_RB = 32          # row residues per block (kernel RB default)
MAX_THREADS = 256


def _row_blocks(starts: np.ndarray, rb: int = _RB, cap: int = MAX_THREADS * _RPT) -> np.ndarray:
    """Row-block boundaries over residues: at most ``rb`` residues and ``cap`` atoms each (a residue
    larger than ``cap`` gets a block of its own; the kernel then loops over its atoms)."""
    n = len(starts) - 1
    bounds = [0]
    i = 0
    while i < n:
        k = i + 1
        while k < n and k - i < rb and starts[k + 1] - starts[i] <= cap:
            k += 1
        bounds.append(k)
        i = k
    return np.asarray(bounds, dtype=np.int32)


def interleaved_rows(atom_idx: np.ndarray, starts: np.ndarray, bounds: np.ndarray):
    """Row atoms for the kernel: within each row block, ordered by (rank within residue, residue), so
    consecutive threads hold atoms of different residues. Returns (row_idx, row_res), int32 (A,)."""
    counts = np.diff(starts)
    res = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    rank = np.arange(len(res), dtype=np.int64) - np.repeat(starts[:-1].astype(np.int64), counts)
    block = np.repeat(np.arange(len(bounds) - 1, dtype=np.int64), np.diff(starts[bounds]))
    order = np.lexsort((res, rank, block))  # block is the primary key: ranges stay in place
    return (np.ascontiguousarray(np.asarray(atom_idx)[order], dtype=np.int32),
            np.ascontiguousarray(res[order], dtype=np.int32))


class GPUPlan:
    """Device-side constants of one contact-map call (index lists, row blocks, box), built once."""

    def __init__(self, atom_idx, starts, chain, seq, box, n_frames, dtype, defines=None):
        import cupy

        from .. import _cuda

        defines = dict(defines or {})
        rpt = int(defines.get("RPT", _RPT))
        rb = int(defines.get("RB", _RB))
        self.n_res = len(starts) - 1
        starts = np.asarray(starts, dtype=np.int32)
        bounds = _row_blocks(starts, rb=rb, cap=MAX_THREADS * rpt)
        self.n_rb = len(bounds) - 1
        most = int(np.max(starts[bounds[1:]] - starts[bounds[:-1]])) if self.n_rb else 0
        # Enough threads for a block's row atoms at RPT each, in whole warps, at most 256.
        per_thread = -(-max(most, 1) // rpt)
        self.threads = int(min(MAX_THREADS, max(32, (per_thread + 31) // 32 * 32)))
        row_idx, row_res = interleaved_rows(atom_idx, starts, bounds)
        self.atom_idx = cupy.asarray(np.ascontiguousarray(atom_idx, dtype=np.int32))
        self.row_idx = cupy.asarray(row_idx)
        self.row_res = cupy.asarray(row_res)
        self.starts = cupy.asarray(starts)
        self.bounds = cupy.asarray(bounds)
        self.chain = cupy.asarray(np.ascontiguousarray(chain, dtype=np.int32))
        self.seq = cupy.asarray(np.ascontiguousarray(seq, dtype=np.int32))
        vec, inv, self.mode = box_arrays(box, n_frames, dtype)
        # The triclinic shortcut bound; with a box per frame the smallest is safe for all of them.
        self.near2 = float(np.min(half_plane_spacing_sq(vec))) if self.mode == 2 else 0.0
        if self.mode:
            self.box = cupy.asarray(vec.reshape(-1, 9))
            self.inv = cupy.asarray(inv.reshape(-1, 9))
            self.box_step = 1 if len(vec) > 1 else 0
        else:
            self.box = self.inv = cupy.zeros((1, 9), dtype=dtype)
            self.box_step = 0
        suffix = "f64" if np.dtype(dtype) == np.float64 else "f32"
        self.kernel = _cuda.get_kernel("contacts", f"contact_map_{suffix}", defines or None)
        self.dtype = np.dtype(dtype)

    def launch(self, x, f0, nf, dist, contact, counts, min_sep, inter_chain, cutoff):
        """Run frames ``f0 .. f0 + nf`` of ``x`` (a CuPy (nf, N, 3) array holding exactly them)."""
        from .. import _cuda

        box = self.box[f0:f0 + nf] if self.box_step else self.box
        inv = self.inv[f0:f0 + nf] if self.box_step else self.inv
        grid = nf * self.n_rb
        if grid == 0:
            return
        _cuda.launch(self.kernel, grid, self.threads, x, self.atom_idx, self.row_idx, self.row_res, self.starts,
                     self.bounds,
                     self.chain, self.seq, box, inv, dist, contact, counts, nf, x.shape[1], self.n_res, self.n_rb,
                     int(min_sep), int(bool(inter_chain)), self.dtype.type(cutoff), self.dtype.type(self.near2),
                     self.box_step, self.mode)


def contacts_cuda(x, atom_idx, starts, chain, seq, box, *, cutoff, min_sep, inter_chain, keep, dense_on_host,
                   defines=None):
    """Contact maps on the GPU, frames in chunks under the device memory budget.

    ``x`` is a NumPy or CuPy (F, N, 3) array of the work dtype. ``keep`` is ``"dense"``, ``"pairs"`` or
    ``"frequency"``. Returns (distances, contacts, counts, pairs) where dense outputs are host arrays
    when ``dense_on_host`` else device arrays. ``counts`` is a CuPy (R, R) uint32 array, symmetric
    with a zero diagonal: per residue pair, the number of frames in contact (the kernel counts the
    upper triangle only; the transpose is added here, once), so ``counts / F`` is the frequency.
    """
    import cupy

    n_frames, n_atoms = x.shape[:2]
    dtype = np.dtype(x.dtype)
    plan = GPUPlan(atom_idx, starts, chain, seq, box, n_frames, dtype, defines)
    r = plan.n_res
    per_frame = (r * r * (dtype.itemsize + 1) if keep != "frequency" else 0)
    if not is_cupy_array(x):
        per_frame += n_atoms * 3 * dtype.itemsize
    chunk = rows_per_chunk(per_frame, n_frames, device_budget_bytes())
    chunk = min(chunk, (2**31 - 1) // max(plan.n_rb, 1))  # grid.x limit
    counts = cupy.zeros((r, r), dtype=np.uint32)
    dist_all = cont_all = None
    if keep == "dense":
        if dense_on_host:
            dist_all = np.empty((n_frames, r, r), dtype=dtype)
            cont_all = np.empty((n_frames, r, r), dtype=bool)
        else:
            dist_all = cupy.empty((n_frames, r, r), dtype=dtype)
            cont_all = cupy.empty((n_frames, r, r), dtype=np.uint8)
    pieces = []
    iu = None
    for f0 in range(0, n_frames, chunk):
        f1 = min(n_frames, f0 + chunk)
        nf = f1 - f0
        xc = cupy.ascontiguousarray(cupy.asarray(x[f0:f1]))
        if keep == "dense" and not dense_on_host:
            d, c = dist_all[f0:f1], cont_all[f0:f1]
        elif keep != "frequency":
            d = cupy.empty((nf, r, r), dtype=dtype)
            c = cupy.empty((nf, r, r), dtype=np.uint8)
        else:
            d = c = None
        plan.launch(xc, f0, nf, d, c, counts, min_sep, inter_chain, cutoff)
        if keep == "dense" and dense_on_host:
            dist_all[f0:f1] = d.get()
            cont_all[f0:f1] = c.get().view(bool)
        elif keep == "pairs":
            if iu is None:
                iu = cupy.triu(cupy.ones((r, r), dtype=bool), 1)
            f, i, j = cupy.nonzero(c.view(bool) & iu[None])
            pieces.append(((f + f0).astype(np.int64), i.astype(np.int32), j.astype(np.int32), d[f, i, j]))
    if cont_all is not None and not dense_on_host:
        cont_all = cont_all.view(bool)
    pairs = None
    if keep == "pairs":
        if pieces:
            pairs = ContactPairs(*(cupy.concatenate([p[k] for p in pieces]) for k in range(4)))
        else:
            pairs = ContactPairs(cupy.zeros(0, np.int64), cupy.zeros(0, np.int32), cupy.zeros(0, np.int32),
                                 cupy.zeros(0, dtype))
    counts = counts + counts.T  # the kernel fills i < j only: mirror once, the result is complete
    return dist_all, cont_all, counts, pairs
