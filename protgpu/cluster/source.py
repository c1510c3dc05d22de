"""Where clustering reads distances: rows of the F x F matrix on demand, never the whole of it.

:class:`RmsdRows` takes them from the all-vs-all RMSD engine (:class:`protgpu.superpose.pairwise_cpu.RowsNumpy`
on the CPU, :func:`protgpu.superpose.pairwise_gpu.pairwise_rows_cuda` on the GPU: the same GEMM + QCP as
:func:`protgpu.pairwise_rmsd`, for rows of the caller's choosing); :class:`MatrixRows` reads them from a
precomputed matrix (NumPy, np.memmap, Zarr, CuPy). Both give float64 rows in the namespace ``xp`` the
clustering runs in (NumPy or CuPy) and check each row they read for NaN.

Internal API (the cluster methods and tests use it).
"""

from __future__ import annotations

import numpy as np

from .._array import to_numpy
from .._memory import rows_per_chunk
from ..errors import InputError

#: Bytes of one strip of rows (float64) on the CPU; the GPU takes a share of the device budget.
STRIP_BYTES_CPU = 64 << 20


class Rows:
    """Common part: ``n`` frames, namespace ``xp``, :meth:`rows`, :meth:`strips` and :attr:`strip_rows`."""

    def counts_below(self, cutoff: float):
        """Neighbour counts by a faster route than row strips, or None (there is none)."""
        return None

    n: int
    xp = np
    on_gpu = False
    name = "x"

    def strip_rows_for(self, budget_bytes: int | None = None) -> int:
        """Rows per strip: ``budget_bytes`` (default :data:`STRIP_BYTES_CPU`, or 1/8 of the device budget)
        of float64 rows, at least 1."""
        if budget_bytes is None:
            if self.on_gpu:
                from .._memory import device_budget_bytes

                budget_bytes = device_budget_bytes() // 8
            else:
                budget_bytes = STRIP_BYTES_CPU
        return rows_per_chunk(8 * self.n * 12, self.n, budget_bytes)  # the strip and its temporaries

    @property
    def strip_rows(self) -> int:
        if getattr(self, "_strip_rows", None) is None:
            self._strip_rows = self.strip_rows_for()
        return self._strip_rows

    @strip_rows.setter
    def strip_rows(self, value: int) -> None:
        self._strip_rows = max(1, int(value))

    def strips(self):
        """``(i0, i1, rows i0:i1)`` over all rows, :attr:`strip_rows` at a time."""
        for i0 in range(0, self.n, self.strip_rows):
            i1 = min(self.n, i0 + self.strip_rows)
            yield i0, i1, self.rows(np.arange(i0, i1))

    def rows_chunked(self, idx):
        """``(chunk, rows of chunk)`` for the frames ``idx`` (host int array), :attr:`strip_rows` at a time."""
        idx = np.asarray(idx, dtype=np.int64)
        for k in range(0, idx.size, self.strip_rows):
            c = idx[k:k + self.strip_rows]
            yield c, self.rows(c)

    def condensed(self) -> np.ndarray:
        """The upper triangle as SciPy's condensed vector, float64 NumPy (checked, strip by strip)."""
        from .._memory import check_host_fits

        n = self.n
        check_host_fits(8 * n * (n - 1) // 2, "the condensed distance matrix")
        out = np.empty(n * (n - 1) // 2)
        k = 0
        for i0, i1, s in self.strips():
            s = to_numpy(s)
            for i in range(i0, i1):
                out[k:k + n - i - 1] = s[i - i0, i + 1:]
                k += n - i - 1
        return out

    def check(self, r, idx):
        """``r`` (rows ``idx``) unless it holds NaN, infinite or negative distances: then one line."""
        xp = self.xp
        bad = ~(r >= 0) | ~xp.isfinite(r)
        if bool(bad.any()):
            i, j = (int(v) for v in xp.argwhere(bad)[0])
            raise InputError(f"{self.name}: distance matrix has {float(r[i, j])!r} at row {int(idx[i])}, "
                             f"column {j}; distances must be finite and >= 0")
        return r


class RmsdRows(Rows):
    """Rows of the all-vs-all RMSD after superposition of the frames ``x`` (F, N, 3), Angstrom.

    Parameters
    ----------
    x : np.ndarray or cupy.ndarray, shape (F, N, 3)
        Checked finite by the caller (host input).
    fit, weights : as :func:`protgpu.pairwise_rmsd` after resolution (index array, per-atom weights).
    on_gpu : bool
    precision : {"float64", "float32"}
    """

    def __init__(self, x, *, fit=None, weights=None, on_gpu=False, precision="float64", name="x"):
        self.n, self.on_gpu, self.name = int(x.shape[0]), bool(on_gpu), name
        self.x, self.fit, self.weights, self.precision = x, fit, weights, precision
        if on_gpu:
            import cupy as cp

            from ..superpose.pairwise_gpu import PairPlan

            self.xp = cp
            self.plan = PairPlan(x, None, fit, weights, precision, np.float64)
        else:
            from ..superpose.pairwise_cpu import RowsNumpy

            self.engine = RowsNumpy(np.asarray(x), fit=fit, weights=weights, precision=precision)

    def rows(self, idx):
        """RMSD of frames ``idx`` (int array or slice) to every frame: (len(idx), F) float64 in ``xp``."""
        idx = np.arange(self.n)[idx] if isinstance(idx, slice) else np.asarray(idx, dtype=np.int64)
        if self.on_gpu:
            from ..superpose.pairwise_gpu import pairwise_rows_cuda

            r = pairwise_rows_cuda(self.plan, idx)
        else:
            r = self.engine.rows(idx)
        r[self.xp.arange(idx.size), self.xp.asarray(idx)] = 0.0  # as pairwise_rmsd: an exact zero diagonal
        return r

    def counts_below(self, cutoff: float):
        """GPU: neighbours of every frame (distance < ``cutoff``, itself included) from the upper triangle of
        square tiles (:func:`protgpu.superpose.pairwise_gpu.pairwise_tiles_cuda`: half the work of full row
        strips), row and column sums; a CuPy (F,) int64 array. CPU: None (the caller sums row strips)."""
        if not self.on_gpu:
            return None
        import cupy as cp

        from ..superpose.pairwise_gpu import pairwise_tiles_cuda

        counts = cp.zeros(self.n, dtype=cp.int64)
        for i0, i1, j0, j1, t in pairwise_tiles_cuda(self.x, fit=self.fit, weights=self.weights,
                                                     precision=self.precision, out_dtype=np.float64):
            below = t < cutoff
            counts[i0:i1] += below.sum(axis=1)
            if j0 != i0:  # an off-diagonal tile stands for its mirror image too
                counts[j0:j1] += below.sum(axis=0)
        return counts

    def condensed(self) -> np.ndarray:
        """The condensed matrix (pairs i < j, SciPy's layout), float64 NumPy, from :func:`protgpu.pairwise_rmsd`."""
        from .._memory import check_host_fits
        from ..superpose import pairwise_rmsd

        m = self.n * (self.n - 1) // 2
        check_host_fits(8 * m, "the condensed distance matrix")
        out = np.empty(m, dtype=np.float64)
        x = self.x
        return pairwise_rmsd(x, fit=self.fit, weights=self.weights, out=out, condensed=True,
                             precision=self.precision, device="gpu" if self.on_gpu else "cpu")


class MatrixRows(Rows):
    """Rows of a precomputed (F, F) distance matrix: NumPy, np.memmap, Zarr or CuPy (read row strip by
    row strip; only CuPy input or ``on_gpu`` moves rows to the device)."""

    def __init__(self, m, *, on_gpu=False, name="metric"):
        shape = tuple(getattr(m, "shape", ()))
        if len(shape) != 2 or shape[0] != shape[1]:
            raise InputError(f"{name}: a precomputed distance matrix must be square (F, F), got shape {shape}")
        dt = np.dtype(getattr(m, "dtype", np.float64))
        if dt.kind not in "fiu":
            raise InputError(f"{name}: a distance matrix must be numeric, got dtype {dt}")
        self.m, self.n, self.on_gpu, self.name = m, int(shape[0]), bool(on_gpu), name
        if on_gpu:
            import cupy as cp

            self.xp = cp

    def _read(self, idx):
        from .._array import is_cupy_array

        m = self.m
        if is_cupy_array(m) or isinstance(m, np.ndarray):
            return m[self.xp.asarray(idx) if is_cupy_array(m) else idx]
        if idx.size and np.all(np.diff(idx) == 1):  # a contiguous strip: one read (Zarr, memmap)
            return np.asarray(m[int(idx[0]):int(idx[-1]) + 1])
        if hasattr(m, "get_orthogonal_selection"):  # Zarr: one read of the rows asked for
            return np.asarray(m.get_orthogonal_selection((idx, slice(None))))
        return np.stack([np.asarray(m[int(i)]) for i in idx])

    def rows(self, idx):
        idx = np.arange(self.n)[idx] if isinstance(idx, slice) else np.asarray(idx, dtype=np.int64)
        r = self._read(idx)
        r = self.xp.asarray(r if self.on_gpu else to_numpy(r), dtype=self.xp.float64)
        return self.check(r, idx)



class TmRows(Rows):
    """Rows of 1 - TM-score between frames with a fixed residue correspondence (the frames of one
    trajectory or ensemble: residue r of one frame is residue r of every other), each row one
    :func:`protgpu.tm_score` call of all frames against the row's frame (the TMscore program's search,
    normalised by the common length).

    Parameters
    ----------
    ca : np.ndarray or cupy.ndarray, shape (F, L, 3)
        One atom per residue (CA), Angstrom; checked finite by the caller.
    on_gpu : bool
    """

    def __init__(self, ca, *, on_gpu=False, name="x"):
        self.ca, self.n, self.on_gpu, self.name = ca, int(ca.shape[0]), bool(on_gpu), name
        if on_gpu:
            import cupy as cp

            self.xp = cp
            self.ca = cp.asarray(ca, dtype=cp.float64)

    def rows(self, idx):
        """1 - TM-score of every frame against each frame of ``idx``: (len(idx), F) float64 in ``xp``.
        TM-score of two frames of equal length is the same either way round up to rounding (~1e-15)."""
        from ..scoring.tmscore import tm_score

        idx = np.arange(self.n)[idx] if isinstance(idx, slice) else np.asarray(idx, dtype=np.int64)
        xp = self.xp
        out = xp.empty((idx.size, self.n), dtype=xp.float64)
        dev = "gpu" if self.on_gpu else "cpu"
        for k, i in enumerate(idx.tolist()):
            tm = xp.asarray(tm_score(self.ca, self.ca[i], device=dev).tm, dtype=xp.float64)
            out[k] = xp.maximum(1.0 - tm, 0.0)  # a TM-score of 1 + 1 ulp is a distance of 0, not -2e-16
            out[k, i] = 0.0
        return out
