"""RMSD and superposition of every frame to one reference: the public :func:`rmsd` and
:func:`superpose`, their NumPy twin :func:`rmsd_numpy` (also the CPU path) and their CUDA path
:func:`rmsd_cuda` (``kernels/qcp.cu``: ``frame_moments_*`` -> ``qcp_frames`` -> ``frame_direct_*``).

Internal API (tests and benchmarks use it): :func:`rmsd_numpy`, :func:`rmsd_numpy_frames`,
:func:`rmsd_cuda`, :func:`centre_reference`, :func:`moment_operands`, :func:`moments_numpy`,
:func:`direct_rmsd_numpy`, :func:`reference_operands`, :func:`reference_on_device`,
``REFERENCE_MEMO`` and ``CPU_CHUNK_BYTES``. The QCP maths is :mod:`.qcp`; the accuracy decisions
(float64 moments from one shifted pass, re-measuring near-identical frames) are explained in
``docs/design/qcp.md``.

Conventions: Angstrom; a rotation ``R`` (frames, 3, 3) and translation ``t`` (frames, 3) map mobile
coordinates onto the reference as ``aligned = mobile @ R.T + t`` (``R @ x_i + t`` for each atom).
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, NamedTuple

import numpy as np

from .._array import is_cupy_array, to_numpy
from .._autograd import wants_grad
from .._memory import device_budget_bytes, rows_per_chunk
from .._threads import blas_threads, cpu_threads
from ..errors import InputError
from . import kernels, qcp
from ._prepare import float_dtype, prepare

# Each task of the CPU path's pool holds this much float64 working set of frames (moved coordinates);
# the size does not depend on the thread count, so neither do the results.
CPU_CHUNK_BYTES = 96 << 20


class SuperposeResult(NamedTuple):
    """What :func:`superpose` returns.

    Attributes
    ----------
    coords : array, shape (frames, atoms, 3)
        All atoms of ``mobile`` moved onto the reference, Angstrom; float32 for float32 input (and
        Structures), else float64; same array type as the input.
    rotation : array, shape (frames, 3, 3), float64
        Proper rotations (determinant +1).
    translation : array, shape (frames, 3), float64
        Angstrom; ``coords = mobile @ rotation.T + translation`` per frame.
    rmsd : array, shape (frames,), float64
        RMSD after superposition over the measured atoms (``atoms=``, default the fitted ones).
    """

    coords: Any
    rotation: Any
    translation: Any
    rmsd: Any


# ==================================================================================================
# NumPy twin: RMSD / superposition to one reference


def centre_reference(y, w):
    """Centred reference (N, 3) float64, its centroid (3,), ``G_B``, ``1 / W``."""
    if w is None:
        cy = y.mean(axis=0)
        yc = y - cy
        return yc, cy, float(np.einsum("ij,ij->", yc, yc)), 1.0 / len(y)
    wsum = w.sum()
    cy = (w @ y) / wsum
    yc = y - cy
    return yc, cy, float(np.einsum("i,ij,ij->", w, yc, yc)), 1.0 / wsum


class MomentOperands(NamedTuple):
    """The fixed right-hand sides of :func:`moments_numpy` for one centred reference."""

    wmat: np.ndarray  # (3N, 12) float64: W[3n + a, 3a + b] = w_n yc_nb (-> P), W[3n + a, 9 + a] = w_n (-> S)
    w3: np.ndarray | None  # (3N,) float64 weights repeated per coordinate, None when unweighted
    wyc_sum: np.ndarray  # (3,) sum w yc (0 up to rounding)
    inv_w: float


def moment_operands(yc, w, inv_w) -> MomentOperands:
    """The fixed right-hand sides of :func:`moments_numpy` for one centred reference ``yc`` (N, 3)."""
    n = len(yc)
    wv = np.ones(n) if w is None else np.asarray(w, dtype=np.float64)
    wyc = yc * wv[:, None]
    wmat = np.zeros((n, 3, 12))
    for a in range(3):
        wmat[:, a, 3 * a:3 * a + 3] = wyc
        wmat[:, a, 9 + a] = wv
    w3 = None if w is None else np.repeat(wv, 3)
    return MomentOperands(wmat.reshape(3 * n, 12), w3, wyc.sum(axis=0), inv_w)


def moments_numpy(x, ops: MomentOperands):
    """Per-frame centroid ``c`` (F, 3), ``G_A`` (F,) and ``M = sum w (x - c) yc^T`` (F, 3, 3), all
    float64, for frames ``x`` (F, N, 3) of any float dtype, in one pass over the frames (the kernel
    ``frame_moments_*`` computes the same sums).

    With ``s`` the frame's first atom and ``d = x - s``: ``S = sum w d``, ``P = sum w d yc^T`` (both from
    one GEMM of the flattened frames with :attr:`MomentOperands.wmat`) and ``Q = sum w |d|^2``; then
    ``c - s = S / W``, ``M = P - (c - s) (sum w yc)^T`` (the reference is centred: only its rounding
    residual is left) and ``G_A = Q - W |c - s|^2``. The shift by an atom of the frame keeps ``Q`` and
    ``W |c - s|^2`` of the size of the frame's spread, wherever it lies, so the subtraction loses no
    more than a few bits; the frame needs no separate centroid pass.
    """
    f, n = x.shape[:2]
    xd = np.array(x, dtype=np.float64)  # a copy: shifted in place below
    s = xd[:, 0, :].copy()
    for k in range(3):  # one strided pass per coordinate (a (F, 1, 3) broadcast is ~5x slower)
        xd[:, :, k] -= s[:, k, None]
    flat = xd.reshape(f, 3 * n)
    r = flat @ ops.wmat
    q = np.einsum("fk,fk->f", flat, flat) if ops.w3 is None else (flat * flat) @ ops.w3
    cs = r[:, 9:] * ops.inv_w
    m = r[:, :9].reshape(f, 3, 3) - cs[:, :, None] * ops.wyc_sum[None, None, :]
    ga = np.maximum(q - np.einsum("fi,fi->f", cs, cs) / ops.inv_w, 0.0)
    return cs + s, ga, m


def direct_rmsd_numpy(xs, cx, rot, yc, w, inv_w):
    """``sqrt(sum w |R (x - c_x) - yc|^2 / W)`` in float64 for frames ``xs`` (P, N, 3) with centroids
    ``cx`` (P, 3) and rotations ``rot`` (P, 3, 3), against the centred reference ``yc`` (N, 3): the
    RMSD of the superposition measured on the coordinates (no cancellation near 0)."""
    xc = np.asarray(xs, dtype=np.float64) - cx[:, None, :]
    d = np.matmul(xc, rot.transpose(0, 2, 1)) - yc
    sq = np.einsum("fni,fni->fn", d, d)
    return np.sqrt((sq.sum(axis=1) if w is None else sq @ w) * inv_w)


def rmsd_numpy(x, ref, fit=None, meas=None, w_fit=None, w_meas=None, *, want_coords=False,
                threads: int | None = None):
    """The NumPy twin of :func:`rmsd` / :func:`superpose` (also their CPU path).

    Every step is per frame, so the frames are cut into tasks of a fixed size (``CPU_CHUNK_BYTES``
    of float64 working set, whatever the thread count) that run on a pool of ``threads`` threads,
    BLAS on one thread meanwhile (its own threads would compete with the pool's; a threaded GEMM called
    from several threads was measured slower than one thread on 2 cores). The result is bitwise the
    same for any ``threads``.

    Parameters
    ----------
    x : np.ndarray, shape (F, N, 3), float32 or float64
        Mobile frames, Angstrom.
    ref : tuple ``(ref_fit, ref_meas)``
        ``ref_fit`` (n_fit, 3) float64: reference atoms lined up with ``x[:, fit]``; ``ref_meas``
        (n_meas, 3) lined up with ``x[:, meas]``, or None to measure on the fitted atoms.
    fit, meas : np.ndarray of int64, optional
        Atom indices of ``x`` to fit and to measure (None: all / same as fit).
    w_fit, w_meas : np.ndarray, optional
        Weights of the fitted and measured atoms.
    want_coords : bool
        Also return all atoms of ``x`` moved onto the reference.
    threads : int, optional
        Worker threads (default: the usable CPU cores); the result does not depend on it.

    Returns
    -------
    rmsd (F,) float64, rotation (F, 3, 3) float64, translation (F, 3) float64, coords (F, N, 3) of
    ``x``'s float dtype or None.
    """
    ref_fit, ref_meas = ref
    f, n = x.shape[:2]
    yc, cy, gb, inv_w = centre_reference(ref_fit, w_fit)
    ops = moment_operands(yc, w_fit, inv_w)
    r, rot, t = np.empty(f), np.empty((f, 3, 3)), np.empty((f, 3))
    coords = np.empty(x.shape, dtype=float_dtype(x.dtype)) if want_coords else None
    task = rows_per_chunk(max(n, 1) * 3 * 8 * 3, f, CPU_CHUNK_BYTES)
    starts = range(0, f, task)
    n_threads = min(len(starts), cpu_threads() if threads is None else max(1, int(threads)))

    def run(f0):
        f1 = min(f, f0 + task)
        rmsd_numpy_frames(x[f0:f1], (yc, cy, gb, inv_w, ops), ref_meas, fit, meas, w_fit, w_meas,
                           (r[f0:f1], rot[f0:f1], t[f0:f1], None if coords is None else coords[f0:f1]))

    with blas_threads(1):
        if n_threads > 1:
            with concurrent.futures.ThreadPoolExecutor(n_threads, thread_name_prefix="protgpu-rmsd") as pool:
                for fut in [pool.submit(run, f0) for f0 in starts]:
                    fut.result()
        else:
            for f0 in starts:
                run(f0)
    return r, rot, t, coords


def rmsd_numpy_frames(x, reference, ref_meas, fit, meas, w_fit, w_meas, outs) -> None:
    """:func:`rmsd_numpy` on the frames ``x`` (one task), written into ``outs`` = (rmsd, rotation,
    translation, coords or None) views. ``reference`` = ``(yc, cy, gb, inv_w, moment operands)``.
    Non-finite coordinates give non-finite results quietly: rmsd() reports them (the frame named)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # (per thread: set in the task)
        _rmsd_numpy_frames_body(x, reference, ref_meas, fit, meas, w_fit, w_meas, outs)


def _rmsd_numpy_frames_body(x, reference, ref_meas, fit, meas, w_fit, w_meas, outs) -> None:
    yc, cy, gb, inv_w, ops = reference
    r, rot, t, coords = outs
    f, n = x.shape[:2]
    # 1. Moments, in chunks small enough for the float64 copy to stay in cache.
    cx, ga, m = np.empty((f, 3)), np.empty(f), np.empty((f, 3, 3))
    chunk = rows_per_chunk(len(yc) * 3 * 8 * 2, f, qcp.CACHE_CHUNK_BYTES)
    for f0 in range(0, f, chunk):
        f1 = min(f, f0 + chunk)
        xf = x[f0:f1] if fit is None else x[f0:f1, fit]
        cx[f0:f1], ga[f0:f1], m[f0:f1] = moments_numpy(xf, ops)
    # 2. QCP (13 numbers per frame), in groups of frames whose temporaries stay in cache.
    for f0 in range(0, f, qcp.CHUNK_PAIRS):
        f1 = min(f, f0 + qcp.CHUNK_PAIRS)
        r[f0:f1], rot[f0:f1] = qcp.rmsd_and_rotation(m[f0:f1], ga[f0:f1], gb, inv_w)
    t[...] = cy - np.einsum("fij,fj->fi", rot, cx)
    if ref_meas is None:
        # Near-identical frames: re-measure without the cancellation (docs/design/qcp.md).
        small = np.flatnonzero(qcp.near_identical(r, ga + gb, inv_w))
        chunk = rows_per_chunk(len(yc) * 3 * 8 * 3, max(small.size, 1), qcp.CACHE_CHUNK_BYTES)
        for k0 in range(0, small.size, chunk):
            sel = small[k0:k0 + chunk]
            xs = x[sel] if fit is None else x[sel][:, fit]
            r[sel] = direct_rmsd_numpy(xs, cx[sel], rot[sel], yc, w_fit, inv_w)
    # 3. Measured atoms other than the fitted ones, and the moved coordinates (one task's frames
    # are at most CPU_CHUNK_BYTES of float64 here).
    if ref_meas is not None or coords is not None:
        rt = rot.transpose(0, 2, 1)
        if ref_meas is not None:
            xm = np.asarray(x[:, meas], dtype=np.float64)
            d = np.matmul(xm, rt) + t[:, None, :] - ref_meas
            if w_meas is None:
                r[...] = np.sqrt(np.einsum("fni,fni->f", d, d) / len(ref_meas))
            else:
                r[...] = np.sqrt(np.einsum("fni,fni,n->f", d, d, w_meas) / w_meas.sum())
        if coords is not None:
            coords[...] = np.matmul(np.asarray(x, dtype=np.float64), rt) + t[:, None, :]


# ==================================================================================================
# CUDA path: RMSD / superposition to one reference

def reference_operands(yc, w):
    """``(ref (4, N) float64 as the kernels read it, sum w yc (3,))`` for a centred reference."""
    n = len(yc)
    ref = np.empty((4, n))
    ref[:3] = yc.T
    ref[3] = 1.0 if w is None else w
    wyc = yc.sum(axis=0) if w is None else (yc * w[:, None]).sum(axis=0)
    return ref, wyc


# The last reference of each device, as rmsd_cuda's kernels read it: rmsd() against one reference is
# often called again and again (trajectory chunks, or a loop over inputs), and centring and uploading
# it costs more host time than the kernels take on 10^5 frames.
REFERENCE_MEMO: dict = {}


def reference_on_device(ref_fit, w_fit, fit):
    """``((cy, gb, inv_w), wyc, ref_d, idx_d)`` for :func:`rmsd_cuda` on the current device: the
    reference centred with the fit weights (:func:`centre_reference`, :func:`reference_operands`),
    its kernel operands uploaded, and the fitted atoms' indices uploaded (None for all). Memoised per
    device on the exact bytes of the reference, weights and indices (the last one only)."""
    import cupy as cp

    key = (ref_fit.tobytes(), ref_fit.shape,
           None if w_fit is None else np.asarray(w_fit, dtype=np.float64).tobytes(),
           None if fit is None else np.asarray(fit, dtype=np.int32).tobytes())
    dev = cp.cuda.runtime.getDevice()
    hit = REFERENCE_MEMO.get(dev)
    if hit is not None and hit[0] == key:
        return hit[1]
    yc, cy, gb, inv_w = centre_reference(ref_fit, w_fit)
    ref_h, wyc = reference_operands(yc, w_fit)
    ops = ((cy, gb, inv_w), wyc, cp.asarray(ref_h),
           None if fit is None else cp.asarray(np.asarray(fit, dtype=np.int32)))
    REFERENCE_MEMO[dev] = (key, ops)
    return ops


def rmsd_cuda(x, ref, fit=None, meas=None, w_fit=None, w_meas=None, *, want_coords=False):
    """CUDA twin of :func:`rmsd_numpy`: ``x`` (F, N, 3) NumPy or CuPy; results are CuPy arrays.

    Three launches, no host synchronisation: ``frame_moments_*`` reads every frame once (one warp per
    frame, in its dtype, fitted atoms gathered through an index array: no copy of the frames) and leaves
    13 float64 numbers per frame; ``qcp_frames`` turns them into the RMSD, the rotation and the
    translation; ``frame_direct_*`` re-measures the (rare) near-identical frames on the coordinates.
    Host input is uploaded in frame chunks sized by the device memory budget; device input is used as
    it is (one chunk) unless measured atoms or moved coordinates need float64 temporaries.
    """
    import cupy as cp

    ref_fit, ref_meas = ref
    f, n_atoms = x.shape[:2]
    dt = float_dtype(x.dtype)
    sfx = "f32" if dt == np.float32 else "f64"
    h_mom = kernels.get(f"frame_moments_{sfx}")
    (cy, gb, inv_w), wyc, ref_d, idx_d = reference_on_device(ref_fit, w_fit, fit)
    n = ref_d.shape[1]
    weighted = int(w_fit is not None)
    on_device = is_cupy_array(x)
    per_frame = 13 * 8
    if not on_device:
        per_frame += n_atoms * 3 * np.dtype(dt).itemsize
    if ref_meas is not None:
        per_frame += len(ref_meas) * 3 * 8 * 3
    if want_coords:
        per_frame += n_atoms * 3 * 8 * 3
    chunk = f if (on_device and per_frame <= 256) else rows_per_chunk(per_frame, f, device_budget_bytes())
    for f0 in range(0, f, chunk):
        f1 = min(f, f0 + chunk)
        nf = f1 - f0
        xs = x if (f1 - f0 == f and is_cupy_array(x) and x.dtype == dt and x.flags.c_contiguous) else \
            cp.ascontiguousarray(cp.asarray(x[f0:f1]), dtype=dt)
        mom = cp.empty((nf, 13))
        kernels.launch(h_mom, kernels.warp_grid(nf, 32 // kernels.MOMENT_LANES, kernels.MOMENT_THREADS),
                       (kernels.MOMENT_THREADS,), xs, idx_d, ref_d, mom, nf, n_atoms, n, weighted, float(inv_w),
                       float(wyc[0]), float(wyc[1]), float(wyc[2]))
        if f0 == 0:
            # Set up the rest while the device reads the frames (host time before the first launch is
            # device idle time for a caller timing the whole call).
            h_qcp, h_dir = kernels.get("qcp_frames"), kernels.get(f"frame_direct_{sfx}")
            out_r = cp.empty(f)
            out_rot = cp.empty((f, 3, 3))
            out_t = cp.empty((f, 3))
            coords = cp.empty((f, n_atoms, 3), dtype=dt) if want_coords else None
            ref_meas_d = None if ref_meas is None else cp.asarray(ref_meas)
            w_meas_d = None if w_meas is None else cp.asarray(w_meas)
            meas_d = None if meas is None else cp.asarray(meas)
        r, rot, t = out_r[f0:f1], out_rot[f0:f1], out_t[f0:f1]
        kernels.launch(h_qcp, ((nf + kernels.QCP_THREADS - 1) // kernels.QCP_THREADS,), (kernels.QCP_THREADS,), mom,
                       r, rot, t, nf, float(gb), float(inv_w), float(cy[0]), float(cy[1]), float(cy[2]))
        if ref_meas_d is None:
            # Near-identical frames: re-measured on the coordinates (docs/design/qcp.md), on the device.
            kernels.launch(h_dir, kernels.warp_grid(nf), (kernels.WARP_THREADS,), xs, idx_d, ref_d, mom, rot, r, nf,
                           n_atoms, n, weighted, float(gb), float(inv_w), float(qcp.DIRECT_TAU))
        else:
            xm = xs[:, meas_d].astype(cp.float64)
            d = cp.matmul(xm, rot.transpose(0, 2, 1)) + t[:, None, :] - ref_meas_d
            if w_meas_d is None:
                r[...] = cp.sqrt((d * d).sum(axis=(1, 2)) / len(ref_meas))
            else:
                r[...] = cp.sqrt(((d * d).sum(axis=2) * w_meas_d).sum(axis=1) / float(w_meas.sum()))
        if want_coords:
            coords[f0:f1] = cp.matmul(xs.astype(cp.float64), rot.transpose(0, 2, 1)) + t[:, None, :]
    return out_r, out_rot, out_t, coords

# ==================================================================================================
# Public: rmsd, superpose


def _run_rmsd(mobile, reference, fit, atoms, weights, ref_frame, device, want_coords):
    p = prepare(mobile, reference, fit, atoms, weights, ref_frame, device, need_rotation=want_coords)
    be = p.be
    if be.on_gpu:
        x = p.mobile
        if be.kind.startswith("torch"):
            x = be.asarray(x)
        if not (is_cupy_array(x) or isinstance(x, np.ndarray)):
            x = np.asarray(x)
        x = x if x.ndim == 3 else x[None]
        res = rmsd_cuda(x, p.ref, p.fit, p.meas, p.w_fit, p.w_meas, want_coords=want_coords)
        if not want_coords and isinstance(x, np.ndarray):
            res = (_finite_rmsd(to_numpy(res[0]), p.name), *res[1:])
    else:
        x = p.mobile
        if not isinstance(x, np.ndarray):
            x = be.asarray(x)
        if x.dtype.kind != "f":
            x = x.astype(np.float64)
        x = x if x.ndim == 3 else x[None]
        res = rmsd_numpy(x, p.ref, p.fit, p.meas, p.w_fit, p.w_meas, want_coords=want_coords)
        if not want_coords:  # the result's check stands for a pass over the coordinates (prepare)
            _finite_rmsd(res[0], p.name)
    return be, res, p.squeeze


def _finite_rmsd(r: np.ndarray, name: str) -> np.ndarray:
    """``r`` (host RMSDs), or InputError naming the first frame whose RMSD is NaN or infinite: a NaN
    or infinite coordinate of a fitted or measured atom gives one."""
    bad = ~np.isfinite(r)
    if bad.any():
        raise InputError(f"{name}: NaN or infinite coordinates in frame {int(np.argmax(bad))}")
    return r


def rmsd(mobile, reference, *, fit=None, atoms=None, weights=None, ref_frame: int = 0, device: str = "auto"):
    """RMSD of every frame of ``mobile`` to ``reference`` after optimal superposition (QCP).

    Parameters
    ----------
    mobile : array (frames, atoms, 3) or (atoms, 3), Structure, list of Structures, mdtraj.Trajectory
        Angstrom; NumPy, CuPy or torch arrays. A list of Structures is stacked as frames.
    reference : array (atoms, 3) or (frames, atoms, 3), Structure, mdtraj.Trajectory
        One structure; for several frames, frame ``ref_frame`` is used.
    fit : str or array_like of int or bool, optional
        Atoms to superpose on (default all): a selection string (``"ca"``, ``"backbone"``, ...;
        needs a Structure), an index array or a boolean mask, applied to both inputs.
    atoms : str or array_like, optional
        Atoms to measure the RMSD on after fitting on ``fit`` (default: the fitted atoms), e.g. fit on
        CA and measure on heavy atoms. Needs at least 3 fitted atoms (else the rotation is not
        unique).
    weights : array_like, shape (atoms,), optional
        Non-negative per-atom weights (e.g. masses) of the full atom list (or of the selection),
        weighting the centroids, the fit and the measured RMSD: ``sqrt(sum w d^2 / sum w)``.
    ref_frame : int
        Frame of a multi-frame reference.
    device : {"auto", "cpu", "gpu"}

    Returns
    -------
    array, shape (frames,), float64, Angstrom
        Same array type as ``mobile`` (a NumPy array for Structures).

    Raises
    ------
    InputError
        Atom counts differing after selection (both are given), an empty selection, NaN coordinates
        in host input (the frame is named; device-resident NaN gives NaN), a bad shape.

    Notes
    -----
    One or two atoms are accepted: the RMSD after superposition is still well defined (0 for one
    atom, half the difference of the two lengths for two). Precision: float64 accumulation and QCP
    whatever the input dtype; self-RMSD is ~1e-14 Angstrom (near-identical frames are re-measured
    on the coordinates with the fitted rotation, avoiding the cancellation of the QCP formula).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[0., 0, 0], [1, 0, 0], [0, 2, 0], [0, 0, 3]])
    >>> rot = np.array([[0., -1, 0], [1, 0, 0], [0, 0, 1]])
    >>> float(rmsd(x @ rot.T + 5.0, x, device="cpu")[0]) < 1e-6
    True
    """
    if wants_grad(mobile, reference, weights):
        from .differentiable import rmsd_with_grad

        return rmsd_with_grad(mobile, reference, fit, atoms, weights, ref_frame, device, want_superpose=False)
    be, res, squeeze = _run_rmsd(mobile, reference, fit, atoms, weights, ref_frame, device, False)
    return be.wrap(res[0])


def superpose(mobile, reference, *, fit=None, atoms=None, weights=None, ref_frame: int = 0,
              device: str = "auto") -> SuperposeResult:
    """Superpose every frame of ``mobile`` onto ``reference`` (QCP): aligned coordinates, rotations,
    translations and RMSDs.

    Parameters
    ----------
    mobile, reference, fit, atoms, weights, ref_frame, device
        As :func:`rmsd`. The rotation is fitted on ``fit`` (at least 3 atoms), applied to all atoms
        of ``mobile``; the RMSD is measured on ``atoms`` (default the fitted ones).

    Returns
    -------
    SuperposeResult
        ``(coords, rotation, translation, rmsd)``: ``coords`` (frames, atoms, 3) in the input's float
        dtype (float32 for Structures), ``rotation`` (frames, 3, 3) float64 proper rotations,
        ``translation`` (frames, 3) float64 Angstrom, ``rmsd`` (frames,) float64 Angstrom; with
        ``coords = mobile @ rotation.T + translation[:, None]``. Same array type as ``mobile``. A 2-D
        ``mobile`` still gives a leading frame axis of 1.

    Raises
    ------
    InputError
        As :func:`rmsd`, and fewer than 3 fitted atoms.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[0., 0, 0], [1, 0, 0], [0, 2, 0], [0, 0, 3]])
    >>> rot = np.array([[0., -1, 0], [1, 0, 0], [0, 0, 1]])
    >>> res = superpose(x @ rot.T + 5.0, x, device="cpu")
    >>> bool(np.allclose(res.coords[0], x)), bool(np.allclose(res.rotation[0], rot.T))
    (True, True)
    """
    if wants_grad(mobile, reference, weights):
        from .differentiable import rmsd_with_grad

        return rmsd_with_grad(mobile, reference, fit, atoms, weights, ref_frame, device, want_superpose=True)
    be, res, squeeze = _run_rmsd(mobile, reference, fit, atoms, weights, ref_frame, device, True)
    r, rot, t, coords = res
    return be.wrap(SuperposeResult(coords, rot, t, r))
