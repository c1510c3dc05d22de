"""RMSD after optimal superposition, the superposition itself, and all-vs-all RMSD matrices (QCP).

Three layers, as everywhere in protgpu: the public functions :func:`rmsd`, :func:`superpose` and
:func:`pairwise_rmsd` (validate, pick the backend, convert back); the NumPy twins
:func:`_rmsd_numpy` and :func:`_pairwise_numpy` (the specification, and the CPU path); and the CUDA
path (``kernels/qcp.cu`` plus cuBLAS through :func:`protgpu._cuda.blas.matmul`).

GPU data flow. To one reference: ``frame_moments_*`` reads each frame once (one warp per frame; no
centring copy, no float64 copy, fitted atoms gathered by index) and leaves ``M``, ``G_A`` and the
centroid (13 float64 per frame), ``qcp_frames`` makes the RMSD, rotation and translation, and
``frame_direct_*`` re-measures near-identical frames; three launches, no host synchronisation.
All-vs-all: ``centre_frames_*`` writes the stacked centred frames (3F, N) and G in one pass; a
symmetric result is made in row strips of ~F/6 frames, each strip's GEMM against its own and every
later frame only (~58% of the full square's flops, each GEMM still large), ``qcp_pairs_*`` writing each
pair and its mirror (through shared memory, so the mirrored rows are whole segments) and leaving the
rare near-repeated roots to ``qcp_refine_*`` (which keeps the quaternion path, and its registers, out of
the main kernel: 48 registers instead of 120). :func:`_pairwise_tiles_cuda` yields square device tiles
of the same computation for callers that fold tiles into their own state.

The method is Theobald's quaternion characteristic polynomial (QCP; Theobald 2005, Liu, Agrafiotis and
Theobald 2010), as ``SCORING.md`` defines it:

1. centre both coordinate sets (weighted centroids when weights are given);
   ``G_A = sum w |x|^2``, ``G_B = sum w |y|^2``, ``M = sum w x y^T`` (3 x 3, ``x`` mobile, ``y``
   reference);
2. the largest eigenvalue ``l_max`` of the 4 x 4 key matrix ``K(M)`` is the largest root of
   ``l^4 + C2 l^2 + C1 l + C0``; Newton's method from an upper bound of ``l_max`` finds it, always
   in float64;
3. ``RMSD = sqrt(max(0, (G_A + G_B - 2 l_max) / W))`` with ``W = sum w`` (the atom count when
   unweighted);
4. the rotation is the unit quaternion along a column of ``adj(K - l_max I)``.

Accuracy decisions (all shared, constant for constant, by the NumPy twin and the kernel):

* ``G`` and ``M`` are accumulated in float64 whatever the input dtype, so that ``G_A + G_B - 2 l_max``
  (which cancels to ~0 for near-identical structures) loses only float64 rounding: ~3e-7 Angstrom after
  the square root at worst (MDTraj's float32 gives ~4e-3), and ~1e-14 for :func:`rmsd` /
  :func:`superpose`, which re-measure such frames (below). Against one (centred) reference the frames
  are not centred first: with ``s`` the frame's first fitted atom, ``M = sum w (x - s) yc^T - (c - s)
  (sum w yc)^T`` and ``G_A = sum w |x - s|^2 - W |c - s|^2`` come from one pass (the shift keeps the
  subtraction within a few bits of float64 wherever the frame lies); all-vs-all frames are centred.
* Newton's iteration starts from ``hi = min((G_A + G_B) / 2, sqrt(3) |M|_F)`` (both upper bounds of
  ``l_max``; the second saves ~8 steps for dissimilar structures), only ever moves down, and stops at
  the first step that is not larger than ``1e-14 (G_A + G_B) / 2``. It takes no step where
  ``P'(l) <= 1e-8 hi^3``: at a (nearly) repeated root P and P' are both rounding noise and the step
  could land anywhere.
* The adjugate column used is the one of largest norm (Liu 2010 tries the next column when the first
  is tiny; taking the largest is the same idea, and the best-conditioned choice). When even that
  column is below ``1e-3 hi^3``, ``l_max`` is within ~1e-3 hi of a second eigenvalue (collinear or
  nearly collinear atoms, two atoms, some mirror images), where rounding noise would mix the
  eigenvectors of the close eigenvalues; the quaternion then comes from a cyclic Jacobi
  eigen-decomposition of ``K``, which resolves eigenvalues to ``eps |K|`` whatever their
  multiplicity. The rotation is always proper (determinant +1) and never NaN for finite input.
* For :func:`rmsd` and :func:`superpose` (which compute the rotation anyway), ``l_max`` is replaced
  by the Rayleigh quotient ``q^T K q`` of the returned quaternion: the reported RMSD is then exactly
  that of the returned superposition, and it is second-order accurate even where Newton is not.
* Near-identical frames: ``G_A + G_B - 2 l_max`` cancels, and its float64 rounding noise
  (~eps (G_A + G_B) / W, about 1e-13 Angstrom^2 for a protein) becomes an RMSD of
  ~sqrt(eps) R_g ~ 3e-7 Angstrom (or exactly 0, depending on the sign of the noise) after the square
  root. Where ``RMSD^2 <= 1e-6 (G_A + G_B) / W`` (the formula has then lost at least 6 of its 16
  digits; only self and near-duplicate frames, < ~0.03 Angstrom for a protein), :func:`rmsd` and
  :func:`superpose` measure instead ``sqrt(sum w |R (x - c_x) - (y - c_y)|^2 / W)`` in float64 on the
  fitted atoms with the returned rotation (the same quantity without the cancellation: the rotation
  itself is accurate to eps, being an eigenvector of a well-separated eigenvalue or Jacobi's): self-RMSD
  then comes out ~1e-14 Angstrom, float32 input included. :func:`pairwise_rmsd` keeps the noise
  (~1e-7 to 1e-6 Angstrom for duplicate frames; self-pairs are exactly 0).
  :func:`pairwise_rmsd` takes the Newton value, and refines it the same way only for the rare pairs
  at a near-repeated root (Newton needed more than 12 steps, or ``|P'(l)| < 1e-3 hi^3`` where it
  stopped); real protein conformations never need it.

Conventions: Angstrom; a rotation ``R`` (frames, 3, 3) and translation ``t`` (frames, 3) map mobile
coordinates onto the reference as ``aligned = mobile @ R.T + t`` (``R @ x_i + t`` for each atom).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
from typing import Any, NamedTuple

import numpy as np

from ._array import dispatch, is_cupy_array, to_numpy
from ._memory import _cpu_threads, check_host_fits, device_budget_bytes, format_bytes, rows_per_chunk
from .errors import InputError, MemoryBudgetError

__all__ = ["SuperposeResult", "pairwise_rmsd", "rmsd", "superpose"]

# Numerical constants of the QCP step. They are passed to kernels/qcp.cu as #defines, so that the
# NumPy twin and the kernel always take the same branches; the .cu file holds the same defaults.
_MAX_ITERS = 60  # Newton steps at most (a double root converges linearly: ~50 halvings to eps)
_SLOW_ITERS = 12  # more steps than this means a near-repeated root: refine by the Rayleigh quotient
_NEWTON_RTOL = 1e-14  # stop when a step is at most this fraction of (G_A + G_B) / 2
# Scale: hi = min((G_A + G_B) / 2, sqrt(3) |M|_F), the Newton start (an upper bound of l_max).
_NEWTON_FLAT = 1e-8  # no Newton step where P' <= this * hi^3: P, P' are rounding noise there
# Adjugate column norm (or |P'(l)|) below this * hi^3: l_max is within ~1e-3 hi of a second eigenvalue,
# where rounding noise (~eps hi^4 / |P'| in l) could mix the two eigenvectors; Jacobi resolves the
# eigenvalues to eps |K| whatever their multiplicity.
_ADJ_TINY = 1e-3
_JACOBI_SWEEPS = 10  # cyclic Jacobi sweeps on the 4 x 4 key matrix (converges in ~5)
# RMSD^2 at most this fraction of (G_A + G_B) / W: re-measure on the coordinates (see the module notes).
_DIRECT_TAU = 1e-6

# Pair kernel output modes (bit flags; same values in qcp.cu).
_MIRROR, _ZERO_DIAG, _UPPER_ONLY, _CONDENSED = 1, 2, 4, 8

# CPU path. Each chunk or group is one task for the worker threads; none of these sizes depends on the
# number of threads, so neither do the results.
_CPU_TILE = 512  # frames per all-vs-all tile side: the tile's GEMM blocks are 9 * 512^2 float64 (19 MB)
_CPU_CHUNK_BYTES = 96 << 20  # float64 working set of one task of rmsd()/superpose()'s frames (moved coordinates)
_QCP_CHUNK_PAIRS = 8192  # pairs (or frames) per vectorised QCP call: ~30 float64 temporaries in cache
_CACHE_CHUNK_BYTES = 8 << 20  # float64 working set of one chunk of frames (centring, moments, moving)


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
# QCP core, vectorised (NumPy). Every function takes arrays of any (equal) shape, float64.


def _key_matrix(s):
    """The 10 distinct entries of the symmetric 4 x 4 key matrix K from the 9 entries of M.

    ``s`` is a sequence of 9 arrays ``Sxx, Sxy, Sxz, Syx, Syy, Syz, Szx, Szy, Szz``
    (``S_ab = sum w x_a y_b``). Returns ``(k00, k01, k02, k03, k11, k12, k13, k22, k23, k33)``.
    """
    sxx, sxy, sxz, syx, syy, syz, szx, szy, szz = s
    return (
        sxx + syy + szz, syz - szy, szx - sxz, sxy - syx,
        sxx - syy - szz, sxy + syx, szx + sxz,
        -sxx + syy - szz, syz + szy,
        -sxx - syy + szz,
    )


def _det4_sym(k):
    """det of a symmetric 4 x 4 matrix from its 10 distinct entries, by complementary 2 x 2 minors of
    rows (0, 1) and (2, 3) (Laplace expansion)."""
    k00, k01, k02, k03, k11, k12, k13, k22, k23, k33 = k
    s0 = k00 * k11 - k01 * k01
    s1 = k00 * k12 - k01 * k02
    s2 = k00 * k13 - k01 * k03
    s3 = k01 * k12 - k11 * k02
    s4 = k01 * k13 - k11 * k03
    s5 = k02 * k13 - k12 * k03
    c5 = k22 * k33 - k23 * k23
    c4 = k12 * k33 - k13 * k23
    c3 = k12 * k23 - k13 * k22
    c2 = k02 * k33 - k03 * k23
    c1 = k02 * k23 - k03 * k22
    c0 = k02 * k13 - k03 * k12
    return s0 * c5 - s1 * c4 + s2 * c3 + s3 * c2 - s4 * c1 + s5 * c0


def _qcp_coefficients(s):
    """Coefficients ``C2, C1, C0`` of the characteristic polynomial ``l^4 + C2 l^2 + C1 l + C0`` of
    K(M), and K itself (10 entries). ``C2 = -2 sum S^2``, ``C1 = -8 det M``, ``C0 = det K``."""
    sxx, sxy, sxz, syx, syy, syz, szx, szy, szz = s
    c2 = -2.0 * (sxx * sxx + sxy * sxy + sxz * sxz + syx * syx + syy * syy + syz * syz
                 + szx * szx + szy * szy + szz * szz)
    det_m = (sxx * (syy * szz - syz * szy) - sxy * (syx * szz - syz * szx) + sxz * (syx * szy - syy * szx))
    k = _key_matrix(s)
    return c2, -8.0 * det_m, _det4_sym(k), k


def _qcp_start(c2, lam0):
    """Newton's start and the problem's scale: the smaller of two upper bounds of ``l_max``,
    ``(G_A + G_B) / 2`` (tight for similar structures) and the nuclear-norm bound
    ``sqrt(3) |M|_F = sqrt(-1.5 C2)`` (tight for dissimilar ones, where the first would cost ~15
    Newton steps instead of ~6). Every term of the quartic is at most ~ this to the 4th power, so it
    also sets the size of the rounding noise the thresholds below are relative to."""
    return np.minimum(lam0, np.sqrt(np.maximum(-1.5 * c2, 0.0)))


def _newton_step(lam, c2, c1, c0, tol, flat):
    """One guarded Newton step of the quartic from above, in place: ``lam`` (1-D float64) moves to
    the new value where the step is taken; returns ``cont``, True where the iteration goes on."""
    l2 = lam * lam
    b = l2 + c2
    b *= lam  # (l^2 + C2) l
    a = b + c1
    p = a * lam
    p += c0  # l^4 + C2 l^2 + C1 l + C0, Horner
    dp = 2.0 * l2
    dp *= lam
    dp += b
    dp += a  # 4 l^3 + 2 C2 l + C1 (summed in this order, as the kernel does)
    # Where the polynomial is flat (a near-repeated root) P and P' are both rounding noise and a step
    # could jump anywhere: stop there (the caller refines such entries). Elsewhere a noisy step is at
    # most ~eps hi^4 / (1e-8 hi^3), far too small to leave the root's neighbourhood.
    ok = dp > flat
    step = np.divide(p, dp, out=p)  # inf/NaN where dp is 0: masked by ``ok`` below
    # Only downward steps are taken: from the upper bound the iteration approaches the largest root
    # monotonically, and a non-positive step means rounding noise has been reached. The last step
    # (not larger than tol) is still taken.
    move = step > 0
    move &= ok
    np.subtract(lam, step, out=lam, where=move)
    cont = step > tol
    cont &= ok
    return cont


def _qcp_newton(c2, c1, c0, lam0, hi):
    """Largest root of the QCP quartic by Newton's method from ``hi`` (:func:`_qcp_start`).

    Returns ``(lam, iters)``, both of the shape of the inputs (1-D); ``iters`` counts the loop passes,
    as the kernel does. An entry stops at the pass that finishes it (as the kernel's thread exits): its
    value is stored and it leaves the working set, which is compacted only on the (few) passes where
    some entries finish and others go on; ~19 ufunc calls per pass and no ``np.where`` (whose
    per-element branches cost as much as the arithmetic).
    """
    shape = np.shape(hi)
    lam = np.array(hi, dtype=np.float64).reshape(-1)
    iters = np.full(lam.shape, _MAX_ITERS, dtype=np.int32)
    wl = lam.copy()
    wc2, wc1, wc0 = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (c2, c1, c0))
    wtol = _NEWTON_RTOL * np.abs(np.asarray(lam0, dtype=np.float64).reshape(-1))
    wflat = _NEWTON_FLAT * wl * wl * wl
    idx = None  # positions of the working set in ``lam`` (None: all, in order)
    with np.errstate(divide="ignore", invalid="ignore"):
        for it in range(1, _MAX_ITERS + 1):
            cont = _newton_step(wl, wc2, wc1, wc0, wtol, wflat)
            n_cont = int(np.count_nonzero(cont))
            if n_cont == cont.size:
                continue
            fin = ~cont
            where = fin if idx is None else idx[fin]
            lam[where] = wl[fin]
            iters[where] = it
            if n_cont == 0:
                return lam.reshape(shape), iters.reshape(shape)
            idx = np.flatnonzero(cont) if idx is None else idx[cont]
            wl, wc2, wc1, wc0, wtol, wflat = (v[cont] for v in (wl, wc2, wc1, wc0, wtol, wflat))
    lam[slice(None) if idx is None else idx] = wl  # entries still going after _MAX_ITERS passes
    return lam.reshape(shape), iters.reshape(shape)


def _adjugate_rows(k, lam):
    """The 4 rows (= columns: the matrix is symmetric) of adj(K - lam I), as a list of 4 lists of 4
    arrays."""
    k00, k01, k02, k03, k11, k12, k13, k22, k23, k33 = k
    a00, a11, a22, a33 = k00 - lam, k11 - lam, k22 - lam, k33 - lam
    a01, a02, a03, a12, a13, a23 = k01, k02, k03, k12, k13, k23
    # 2 x 2 minors of rows (0, 1) and of rows (2, 3); the adjugate is built from them (cofactor
    # expansion along complementary minors), 12 minors instead of 16 separate 3 x 3 determinants.
    s0 = a00 * a11 - a01 * a01
    s1 = a00 * a12 - a01 * a02
    s2 = a00 * a13 - a01 * a03
    s3 = a01 * a12 - a11 * a02
    s4 = a01 * a13 - a11 * a03
    s5 = a02 * a13 - a12 * a03
    c5 = a22 * a33 - a23 * a23
    c4 = a12 * a33 - a13 * a23
    c3 = a12 * a23 - a13 * a22
    c2 = a02 * a33 - a03 * a23
    c1 = a02 * a23 - a03 * a22
    c0 = a02 * a13 - a03 * a12
    r0 = [a11 * c5 - a12 * c4 + a13 * c3, -a01 * c5 + a02 * c4 - a03 * c3,
          a13 * s5 - a23 * s4 + a33 * s3, -a12 * s5 + a22 * s4 - a23 * s3]
    r1 = [-a01 * c5 + a12 * c2 - a13 * c1, a00 * c5 - a02 * c2 + a03 * c1,
          -a03 * s5 + a23 * s2 - a33 * s1, a02 * s5 - a22 * s2 + a23 * s1]
    r2 = [a01 * c4 - a11 * c2 + a13 * c0, -a00 * c4 + a01 * c2 - a03 * c0,
          a03 * s4 - a13 * s2 + a33 * s0, -a02 * s4 + a12 * s2 - a23 * s0]
    r3 = [-a01 * c3 + a11 * c1 - a12 * c0, a00 * c3 - a01 * c1 + a02 * c0,
          -a03 * s3 + a13 * s1 - a23 * s0, a02 * s3 - a12 * s1 + a22 * s0]
    return [r0, r1, r2, r3]


def _jacobi_top_eigenvector(k):
    """Unit eigenvector of the largest eigenvalue of K (10 entries, 1-D arrays of length P) by cyclic
    Jacobi rotations; shape (P, 4). Robust to repeated eigenvalues; same sweeps as the kernel."""
    n = len(k[0])
    a = np.empty((n, 4, 4))
    pos = ((0, 0), (0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (3, 3))
    for (i, j), v in zip(pos, k, strict=True):
        a[:, i, j] = v
        a[:, j, i] = v
    vec = np.broadcast_to(np.eye(4), (n, 4, 4)).copy()
    for _ in range(_JACOBI_SWEEPS):
        for p in range(3):
            for q in range(p + 1, 4):
                apq = a[:, p, q]
                nz = apq != 0
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    theta = (a[:, q, q] - a[:, p, p]) / np.where(nz, 2.0 * apq, 1.0)
                    big = np.abs(theta) > 1e100
                    t = np.where(big, 0.5 / theta,
                                 np.copysign(1.0, theta) / (np.abs(theta) + np.sqrt(theta * theta + 1.0)))
                t = np.where(nz, t, 0.0)
                c = 1.0 / np.sqrt(t * t + 1.0)
                s = t * c
                # A <- J^T A J with J the rotation by (c, s) in the (p, q) plane; V <- V J.
                ap, aq = a[:, :, p].copy(), a[:, :, q].copy()
                a[:, :, p] = c[:, None] * ap - s[:, None] * aq
                a[:, :, q] = s[:, None] * ap + c[:, None] * aq
                ap, aq = a[:, p, :].copy(), a[:, q, :].copy()
                a[:, p, :] = c[:, None] * ap - s[:, None] * aq
                a[:, q, :] = s[:, None] * ap + c[:, None] * aq
                vp, vq = vec[:, :, p].copy(), vec[:, :, q].copy()
                vec[:, :, p] = c[:, None] * vp - s[:, None] * vq
                vec[:, :, q] = s[:, None] * vp + c[:, None] * vq
    best = np.argmax(np.diagonal(a, axis1=1, axis2=2), axis=1)
    return vec[np.arange(n), :, best]


def _qcp_quaternion(k, lam, scale):
    """Unit quaternion (P, 4) of the optimal rotation, from the largest-norm column of
    adj(K - lam I); Jacobi on K where that column is tiny (repeated ``l_max``)."""
    rows = _adjugate_rows(k, lam)
    norms = np.stack([r[0] * r[0] + r[1] * r[1] + r[2] * r[2] + r[3] * r[3] for r in rows])  # (4, P)
    best = np.argmax(norms, axis=0)
    ar = np.arange(best.size)
    q = np.stack([np.stack(r) for r in rows])[best, :, ar]  # (P, 4)
    nrm2 = norms[best, ar]
    thr = _ADJ_TINY * scale * scale * scale
    tiny = ~(nrm2 > thr * thr)  # also catches an all-zero K (scale 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = q / np.sqrt(np.where(tiny, 1.0, nrm2))[:, None]
    if tiny.any():
        sub = [v[tiny] for v in k]
        q[tiny] = _jacobi_top_eigenvector(sub)
    return q


def _rayleigh(k, q):
    """``q^T K q`` for unit quaternions q (P, 4)."""
    k00, k01, k02, k03, k11, k12, k13, k22, k23, k33 = k
    q0, q1, q2, q3 = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    return (k00 * q0 * q0 + k11 * q1 * q1 + k22 * q2 * q2 + k33 * q3 * q3
            + 2.0 * (k01 * q0 * q1 + k02 * q0 * q2 + k03 * q0 * q3 + k12 * q1 * q2 + k13 * q1 * q3
                     + k23 * q2 * q3))


def _quaternion_to_rotation(q):
    """Rotation matrices (P, 3, 3) of unit quaternions (P, 4) ``(w, x, y, z)``; with K built from
    ``M = sum x y^T`` they rotate mobile onto reference (``y ~ R x``)."""
    w, x, y, z = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    r = np.empty((len(q), 3, 3))
    r[:, 0, 0] = w * w + x * x - y * y - z * z
    r[:, 0, 1] = 2.0 * (x * y - w * z)
    r[:, 0, 2] = 2.0 * (x * z + w * y)
    r[:, 1, 0] = 2.0 * (x * y + w * z)
    r[:, 1, 1] = w * w - x * x + y * y - z * z
    r[:, 1, 2] = 2.0 * (y * z - w * x)
    r[:, 2, 0] = 2.0 * (x * z - w * y)
    r[:, 2, 1] = 2.0 * (y * z + w * x)
    r[:, 2, 2] = w * w - x * x - y * y + z * z
    return r


def _rmsd_from_lambda(gsum, lam, inv_w):
    """``sqrt(max(0, (G_A + G_B - 2 lam) / W))`` with ``gsum = G_A + G_B``; NaN stays NaN (np.maximum
    propagates it)."""
    e = gsum - 2.0 * lam
    e *= inv_w
    np.maximum(e, 0.0, out=e)
    return np.sqrt(e, out=e)


def _qcp_top_quaternion(m, lam0=None):
    """Unit quaternion (P, 4) float64 of the optimal rotation for ``m`` (P, 3, 3) float64 (``M = sum w
    x y^T`` of centred sets), and K's 10 entries.

    ``lam0`` (P,) is ``(G_A + G_B) / 2``, Newton's start bound and the scale of its tolerances. None
    (the G's unknown, e.g. a fit from sums only, ``protgpu.scoring._kabsch``): the other bound
    ``sqrt(3) |M|_F`` serves as both.
    """
    s = [m[:, i, j] for i in range(3) for j in range(3)]
    c2, c1, c0, k = _qcp_coefficients(s)
    if lam0 is None:
        lam0 = np.sqrt(np.maximum(-1.5 * c2, 0.0))
    hi = _qcp_start(c2, lam0)
    lam, _ = _qcp_newton(c2, c1, c0, lam0, hi)
    return _qcp_quaternion(k, lam, hi), k


def _qcp_full(m, ga, gb, inv_w):
    """QCP with the rotation: ``m`` (P, 3, 3) float64, ``ga`` (P,), ``gb`` scalar or (P,), ``inv_w``
    scalar or (P,).

    Returns ``(rmsd (P,), rotation (P, 3, 3))``; the RMSD is that of the returned rotation
    (Rayleigh quotient of its quaternion).
    """
    gsum = ga + gb
    q, k = _qcp_top_quaternion(m, 0.5 * gsum)
    return _rmsd_from_lambda(gsum, _rayleigh(k, q), inv_w), _quaternion_to_rotation(q)


def _qcp_rmsd_only(s, gsum, inv_w):
    """QCP RMSD without the rotation (all-vs-all): ``s`` 9 float64 arrays (P,) (the entries of M),
    ``gsum`` (P,) float64 ``G_A + G_B`` of each pair. Returns the RMSDs (P,) float64.

    Pairs at a near-repeated root (Newton slow, or the polynomial flat at its result) are refined by
    the Rayleigh quotient of their quaternion, as the kernel does.
    """
    c2, c1, c0, k = _qcp_coefficients(s)
    lam0 = 0.5 * gsum
    hi = _qcp_start(c2, lam0)
    lam, iters = _qcp_newton(c2, c1, c0, lam0, hi)
    # Near-repeated roots: Newton converged slowly, or it stopped where the polynomial is flat (its
    # rounding noise then moves l by up to ~eps hi^4 / |P'|). The quaternion path (adjugate, or
    # Jacobi when the adjugate vanishes) and its Rayleigh quotient are accurate there.
    # flat = not |P'(l)| > 1e-3 hi^3, P'(l) = (4 l^2 + 2 C2) l + C1; in place, in the kernel's order.
    dp = 4.0 * lam
    dp *= lam
    dp += 2.0 * c2
    dp *= lam
    dp += c1
    np.abs(dp, out=dp)
    thr = _ADJ_TINY * hi
    thr *= hi
    thr *= hi
    slow = dp > thr
    np.logical_not(slow, out=slow)
    slow &= hi > 0
    slow |= iters > _SLOW_ITERS
    if slow.any():
        ks = [v[slow] for v in k]
        q = _qcp_quaternion(ks, lam[slow], hi[slow])
        lam[slow] = _rayleigh(ks, q)
    return _rmsd_from_lambda(gsum, lam, inv_w)


# ==================================================================================================
# Inputs


def _is_structure(x) -> bool:
    return hasattr(x, "coords") and hasattr(x, "select_indices") and hasattr(x, "atoms")


def _source(x, what: str) -> str:
    return getattr(x, "source", None) or what


def _frames_of(obj, what: str):
    """``(coords, structure, name)``: coordinates (any array type, (F, N, 3) or (N, 3)) of a
    Structure, a list of Structures (stacked as frames), an mdtraj Trajectory (nm -> Angstrom) or an
    array."""
    if _is_structure(obj):
        return obj.coords, obj, _source(obj, what)
    if isinstance(obj, (list, tuple)) and obj and all(_is_structure(s) for s in obj):
        n = {s.n_atoms for s in obj}
        if len(n) != 1:
            raise InputError(f"{what}: the structures in the list have different atom counts {sorted(n)}")
        return np.concatenate([s.coords for s in obj]), obj[0], _source(obj[0], what)
    if (type(obj).__module__ or "").startswith("mdtraj") and hasattr(obj, "xyz"):
        return np.asarray(obj.xyz, dtype=np.float32) * np.float32(10.0), None, what
    return obj, None, what


def _check_shape(shape, name: str):
    if len(shape) not in (2, 3) or shape[-1] != 3:
        raise InputError(f"{name}: coordinates must have shape (atoms, 3) or (frames, atoms, 3), got {tuple(shape)}")
    if shape[-2] == 0:
        raise InputError(f"{name}: no atoms")
    if len(shape) == 3 and shape[0] == 0:
        raise InputError(f"{name}: no frames")


def _host_coords(x, name: str):
    """A NumPy view of host input (for validation) or None for device arrays."""
    if is_cupy_array(x) or (hasattr(x, "is_cuda") and getattr(x, "is_cuda", False)):
        return None
    if hasattr(x, "detach"):
        return x.detach().numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "fiu":
        raise InputError(f"{name}: coordinates must be numeric, got dtype {a.dtype}")
    return a


def _check_finite(a: np.ndarray | None, name: str, atoms=None):
    """InputError naming the first frame with a NaN/inf coordinate (host arrays only: checking device
    arrays would synchronise the caller's stream; NaN there propagates into NaN results)."""
    if a is None or a.dtype.kind != "f":
        return
    a3 = a if a.ndim == 3 else a[None]
    if atoms is not None:
        a3 = a3[:, atoms]
    bad = ~np.isfinite(a3).all(axis=(1, 2))
    if bad.any():
        f = int(np.argmax(bad))
        raise InputError(f"{name}: NaN or infinite coordinates in frame {f}")


def _resolve_selection(sel, struct, n_atoms: int, name: str, kind: str, other=None):
    """Atom indices (int64) for ``fit=``/``atoms=``: a selection string (needs a Structure; an array
    input with the same atom count borrows the other input's Structure), an index array or a boolean
    mask. ``None`` means all atoms."""
    if sel is None:
        return None
    if isinstance(sel, str):
        src = struct
        if src is None and other is not None and other.n_atoms == n_atoms:
            src = other
        if src is None:
            raise InputError(f"{kind}={sel!r}: a selection string needs a Structure (protgpu.load) for "
                             f"{name}, not a bare array; pass atom indices instead")
        idx = src.select_indices(sel)
        if idx.size == 0:
            raise InputError(f"{kind}={sel!r} selects no atoms of {name}")
        return idx
    arr = to_numpy(sel)
    arr = np.asarray(arr)
    if arr.dtype == bool:
        if arr.shape != (n_atoms,):
            raise InputError(f"{kind}: boolean mask has shape {arr.shape}, {name} has {n_atoms} atoms")
        idx = np.flatnonzero(arr)
    else:
        if arr.size and arr.dtype.kind not in "iu":
            raise InputError(f"{kind}: must be a selection string, an integer index array or a boolean mask")
        idx = arr.astype(np.int64).reshape(-1)
        if idx.size and (idx.min() < -n_atoms or idx.max() >= n_atoms):
            raise InputError(f"{kind}: atom index out of range for {name} ({n_atoms} atoms)")
        idx = np.where(idx < 0, idx + n_atoms, idx)
    if idx.size == 0:
        raise InputError(f"{kind}: the selection is empty")
    return idx


def _resolve_weights(weights, n_full: int, sel, name: str):
    """Weights (float64) of the selected atoms: ``weights`` has one value per atom of the input, or
    one per selected atom. ``None`` -> None (unweighted)."""
    if weights is None:
        return None
    w = np.asarray(to_numpy(weights), dtype=np.float64).reshape(-1)
    n_sel = n_full if sel is None else len(sel)
    if w.shape == (n_full,):
        w = w if sel is None else w[sel]
    elif w.shape != (n_sel,):
        raise InputError(f"weights has {w.size} values; {name} has {n_full} atoms ({n_sel} selected)")
    if not np.isfinite(w).all() or (w < 0).any():
        raise InputError("weights must be finite and non-negative")
    if not w.sum() > 0:
        raise InputError("weights of the selected atoms sum to zero")
    return w


class _Prepared(NamedTuple):
    be: Any
    mobile: Any  # (F, N, 3) in the input's array library (NumPy for host input)
    ref: tuple  # (ref_fit (n_fit, 3), ref_meas (n_meas, 3) or None), float64, lined up with mobile
    fit: np.ndarray | None  # indices into mobile/ref atoms (None: all)
    meas: np.ndarray | None  # measured atoms (None: same as fit)
    w_fit: np.ndarray | None
    w_meas: np.ndarray | None
    squeeze: bool


def _prepare(mobile, reference, fit, atoms, weights, ref_frame, device, *, need_rotation: bool):
    mob, mob_s, mob_name = _frames_of(mobile, "mobile")
    ref, ref_s, ref_name = _frames_of(reference, "reference")
    be = dispatch(mob, device=device)
    mob_shape = tuple(getattr(mob, "shape", None) or np.shape(mob))
    _check_shape(mob_shape, mob_name)
    ref_host = np.asarray(to_numpy(ref))
    _check_shape(ref_host.shape, ref_name)
    if ref_host.ndim == 3:
        nf = ref_host.shape[0]
        if not -nf <= ref_frame < nf:
            raise InputError(f"ref_frame={ref_frame} is out of range: {ref_name} has {nf} frames")
        ref_host = ref_host[ref_frame]
    elif ref_frame not in (0, -1):
        raise InputError(f"ref_frame={ref_frame} given but {ref_name} is a single frame")
    n_mob, n_ref = mob_shape[-2], ref_host.shape[0]
    fit_m = _resolve_selection(fit, mob_s, n_mob, mob_name, "fit", other=ref_s)
    fit_r = _resolve_selection(fit, ref_s, n_ref, ref_name, "fit", other=mob_s)
    meas_m = _resolve_selection(atoms, mob_s, n_mob, mob_name, "atoms", other=ref_s)
    meas_r = _resolve_selection(atoms, ref_s, n_ref, ref_name, "atoms", other=mob_s)
    nf_m = n_mob if fit_m is None else len(fit_m)
    nf_r = n_ref if fit_r is None else len(fit_r)
    if nf_m != nf_r:
        raise InputError(f"mobile and reference differ in atom count after the fit selection: "
                         f"{mob_name} has {nf_m}, {ref_name} has {nf_r}")
    nm_m = nf_m if atoms is None else len(meas_m)
    nm_r = nf_r if atoms is None else len(meas_r)
    if nm_m != nm_r:
        raise InputError(f"mobile and reference differ in atom count after the atoms selection: "
                         f"{mob_name} has {nm_m}, {ref_name} has {nm_r}")
    if (need_rotation or atoms is not None) and nf_m < 3:
        what = "superposition" if need_rotation else "measuring on other atoms than the fitted ones"
        raise InputError(f"{what} needs at least 3 fitted atoms, got {nf_m}: with 1 or 2 atoms the rotation "
                         "is not unique (rmsd() without atoms= accepts them)")
    host = _host_coords(mob, mob_name)
    used = None
    if not need_rotation and fit_m is not None:
        used = fit_m if meas_m is None else np.union1d(fit_m, meas_m)
    if need_rotation:
        _check_finite(host, mob_name, used)
    # else: rmsd() checks its (F,) result instead (a NaN or infinite coordinate of a fitted or measured
    # atom makes that frame's RMSD NaN or infinite), which costs nothing: a host pass over 10^8
    # coordinates takes longer than the GPU computation, and a fifth of the CPU one.
    _check_finite(ref_host.astype(np.float64), ref_name)
    # Reference atoms reordered/selected to line up with the mobile's fit (and measured) atoms.
    ref64 = ref_host.astype(np.float64)
    ref_fit = ref64 if fit_r is None else ref64[fit_r]
    ref_meas = None if atoms is None else ref64[meas_r]
    w_fit = _resolve_weights(weights, n_mob, fit_m, mob_name)
    w_meas = None if atoms is None else _resolve_weights(weights, n_mob, meas_m, mob_name)
    squeeze = len(mob_shape) == 2
    mob_arr = mob if host is None else host
    return _Prepared(be, mob_arr, (ref_fit, ref_meas), fit_m, meas_m, w_fit, w_meas, squeeze)


def _float_dtype(dtype):
    return np.float32 if np.dtype(dtype) == np.float32 else np.float64


# ==================================================================================================
# NumPy twin: RMSD / superposition to one reference


def _centre_reference(y, w):
    """Centred reference (N, 3) float64, its centroid (3,), ``G_B``, ``1 / W``."""
    if w is None:
        cy = y.mean(axis=0)
        yc = y - cy
        return yc, cy, float(np.einsum("ij,ij->", yc, yc)), 1.0 / len(y)
    wsum = w.sum()
    cy = (w @ y) / wsum
    yc = y - cy
    return yc, cy, float(np.einsum("i,ij,ij->", w, yc, yc)), 1.0 / wsum


class _MomentOperands(NamedTuple):
    wmat: np.ndarray  # (3N, 12) float64: W[3n + a, 3a + b] = w_n yc_nb (-> P), W[3n + a, 9 + a] = w_n (-> S)
    w3: np.ndarray | None  # (3N,) float64 weights repeated per coordinate, None when unweighted
    wyc_sum: np.ndarray  # (3,) sum w yc (0 up to rounding)
    inv_w: float


def _moment_operands(yc, w, inv_w) -> _MomentOperands:
    """The fixed right-hand sides of :func:`_moments_numpy` for one centred reference ``yc`` (N, 3)."""
    n = len(yc)
    wv = np.ones(n) if w is None else np.asarray(w, dtype=np.float64)
    wyc = yc * wv[:, None]
    wmat = np.zeros((n, 3, 12))
    for a in range(3):
        wmat[:, a, 3 * a:3 * a + 3] = wyc
        wmat[:, a, 9 + a] = wv
    w3 = None if w is None else np.repeat(wv, 3)
    return _MomentOperands(wmat.reshape(3 * n, 12), w3, wyc.sum(axis=0), inv_w)


def _moments_numpy(x, ops: _MomentOperands):
    """Per-frame centroid ``c`` (F, 3), ``G_A`` (F,) and ``M = sum w (x - c) yc^T`` (F, 3, 3), all
    float64, for frames ``x`` (F, N, 3) of any float dtype, in one pass over the frames (the kernel
    ``frame_moments_*`` computes the same sums).

    With ``s`` the frame's first atom and ``d = x - s``: ``S = sum w d``, ``P = sum w d yc^T`` (both from
    one GEMM of the flattened frames with :attr:`_MomentOperands.wmat`) and ``Q = sum w |d|^2``; then
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


def _direct_rmsd_numpy(xs, cx, rot, yc, w, inv_w):
    """``sqrt(sum w |R (x - c_x) - yc|^2 / W)`` in float64 for frames ``xs`` (P, N, 3) with centroids
    ``cx`` (P, 3) and rotations ``rot`` (P, 3, 3), against the centred reference ``yc`` (N, 3): the
    RMSD of the superposition measured on the coordinates (no cancellation near 0)."""
    xc = np.asarray(xs, dtype=np.float64) - cx[:, None, :]
    d = np.matmul(xc, rot.transpose(0, 2, 1)) - yc
    sq = np.einsum("fni,fni->fn", d, d)
    return np.sqrt((sq.sum(axis=1) if w is None else sq @ w) * inv_w)


def _rmsd_numpy(x, ref, fit=None, meas=None, w_fit=None, w_meas=None, *, want_coords=False,
                threads: int | None = None):
    """The NumPy twin of :func:`rmsd` / :func:`superpose` (also their CPU path).

    Every step is per frame, so the frames are cut into tasks of a fixed size (``_CPU_CHUNK_BYTES``
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
    yc, cy, gb, inv_w = _centre_reference(ref_fit, w_fit)
    ops = _moment_operands(yc, w_fit, inv_w)
    r, rot, t = np.empty(f), np.empty((f, 3, 3)), np.empty((f, 3))
    coords = np.empty(x.shape, dtype=_float_dtype(x.dtype)) if want_coords else None
    task = rows_per_chunk(max(n, 1) * 3 * 8 * 3, f, _CPU_CHUNK_BYTES)
    starts = range(0, f, task)
    n_threads = min(len(starts), _cpu_threads() if threads is None else max(1, int(threads)))

    def run(f0):
        f1 = min(f, f0 + task)
        _rmsd_numpy_frames(x[f0:f1], (yc, cy, gb, inv_w, ops), ref_meas, fit, meas, w_fit, w_meas,
                           (r[f0:f1], rot[f0:f1], t[f0:f1], None if coords is None else coords[f0:f1]))

    with _blas_threads(1):
        if n_threads > 1:
            with concurrent.futures.ThreadPoolExecutor(n_threads, thread_name_prefix="protgpu-rmsd") as pool:
                for fut in [pool.submit(run, f0) for f0 in starts]:
                    fut.result()
        else:
            for f0 in starts:
                run(f0)
    return r, rot, t, coords


def _rmsd_numpy_frames(x, reference, ref_meas, fit, meas, w_fit, w_meas, outs) -> None:
    """:func:`_rmsd_numpy` on the frames ``x`` (one task), written into ``outs`` = (rmsd, rotation,
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
    chunk = rows_per_chunk(len(yc) * 3 * 8 * 2, f, _CACHE_CHUNK_BYTES)
    for f0 in range(0, f, chunk):
        f1 = min(f, f0 + chunk)
        xf = x[f0:f1] if fit is None else x[f0:f1, fit]
        cx[f0:f1], ga[f0:f1], m[f0:f1] = _moments_numpy(xf, ops)
    # 2. QCP (13 numbers per frame), in groups of frames whose temporaries stay in cache.
    for f0 in range(0, f, _QCP_CHUNK_PAIRS):
        f1 = min(f, f0 + _QCP_CHUNK_PAIRS)
        r[f0:f1], rot[f0:f1] = _qcp_full(m[f0:f1], ga[f0:f1], gb, inv_w)
    t[...] = cy - np.einsum("fij,fj->fi", rot, cx)
    if ref_meas is None:
        # Near-identical frames: re-measure without the cancellation (module notes).
        small = np.flatnonzero(r * r <= _DIRECT_TAU * (ga + gb) * inv_w)
        chunk = rows_per_chunk(len(yc) * 3 * 8 * 3, max(small.size, 1), _CACHE_CHUNK_BYTES)
        for k0 in range(0, small.size, chunk):
            sel = small[k0:k0 + chunk]
            xs = x[sel] if fit is None else x[sel][:, fit]
            r[sel] = _direct_rmsd_numpy(xs, cx[sel], rot[sel], yc, w_fit, inv_w)
    # 3. Measured atoms other than the fitted ones, and the moved coordinates (one task's frames
    # are at most _CPU_CHUNK_BYTES of float64 here).
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

_WARP_THREADS = 256  # blocks of the warp-per-frame kernels (8 warps per block)
_STREAM_TILE = 4096  # frames per tile side when streaming to host memory (see _pairwise_cuda)
_STREAM_PANEL_BYTES = 3 << 30  # most bytes of 3x3 blocks per GEMM panel when streaming
_STREAM_PANEL_COLS = 16384  # column width of the condensed strips' GEMM panels (see _stream_condensed)
_STREAM_PANEL_QUANTUM = 1024  # a strip's first panel starts this close left of the diagonal, or closer
_STREAM_STRIP_BYTES = 256 << 20  # most bytes of a condensed row strip when streaming (see _stream_condensed)
_MOMENT_LANES = 32  # lanes per frame in frame_moments_* (kernels/qcp.cu: MOMENT_LANES, measured)
_MOMENT_THREADS = 128  # blocks of frame_moments_* (measured on the H200, see kernels/qcp.cu)
_QCP_THREADS = 128
_PAIR_BLOCK = (32, 8)  # qcp_pairs_* blocks: PAIR_BX (fixed: a warp) x PAIR_BY (a #define)


def _qcp_defines():
    """qcp.cu's #defines from this module's constants (read on every call: tests change them)."""
    return _qcp_defines_of(_MAX_ITERS, _SLOW_ITERS, _NEWTON_RTOL, _NEWTON_FLAT, _ADJ_TINY, _JACOBI_SWEEPS,
                           _PAIR_BLOCK[1], _MOMENT_LANES)


@functools.cache
def _qcp_defines_of(max_iters, slow_iters, rtol, flat, adj_tiny, sweeps, pair_by, lanes):
    # Built once per set of values: kernels are looked up on every call, and the repr()s are not free.
    return {"QCP_MAX_ITERS": max_iters, "QCP_SLOW_ITERS": slow_iters, "QCP_NEWTON_RTOL": repr(rtol),
            "QCP_NEWTON_FLAT": repr(flat), "QCP_ADJ_TINY": repr(adj_tiny), "QCP_JACOBI_SWEEPS": sweeps,
            "PAIR_BY": pair_by, "MOMENT_LANES": lanes}


def _kernel(entry):
    """``qcp.cu``'s entry point with the QCP constants (the loader memoises the module per device)."""
    from . import _cuda

    return _cuda.get_kernel("qcp", entry, _qcp_defines())


def _warp_grid(n_frames: int, frames_per_warp: int = 1, threads: int = _WARP_THREADS) -> tuple:
    """Grid of the warp-per-frame kernels (they loop over frames, so the cap only bounds the grid);
    ``frames_per_warp`` for ``frame_moments_*``, whose warps take 32 / MOMENT_LANES frames at once."""
    per_block = threads // 32 * frames_per_warp
    return (int(max(1, min(-(-n_frames // per_block), 1 << 20))),)


def _reference_operands(yc, w):
    """``(ref (4, N) float64 as the kernels read it, sum w yc (3,))`` for a centred reference."""
    n = len(yc)
    ref = np.empty((4, n))
    ref[:3] = yc.T
    ref[3] = 1.0 if w is None else w
    wyc = yc.sum(axis=0) if w is None else (yc * w[:, None]).sum(axis=0)
    return ref, wyc


# The last reference of each device, as _rmsd_cuda's kernels read it: rmsd() against one reference is
# often called again and again (trajectory chunks, or a loop over inputs), and centring and uploading
# it costs more host time than the kernels take on 10^5 frames.
_REFERENCE_MEMO: dict = {}


def _reference_on_device(ref_fit, w_fit, fit):
    """``((cy, gb, inv_w), wyc, ref_d, idx_d)`` for :func:`_rmsd_cuda` on the current device: the
    reference centred with the fit weights (:func:`_centre_reference`, :func:`_reference_operands`),
    its kernel operands uploaded, and the fitted atoms' indices uploaded (None for all). Memoised per
    device on the exact bytes of the reference, weights and indices (the last one only)."""
    import cupy as cp

    key = (ref_fit.tobytes(), ref_fit.shape,
           None if w_fit is None else np.asarray(w_fit, dtype=np.float64).tobytes(),
           None if fit is None else np.asarray(fit, dtype=np.int32).tobytes())
    dev = cp.cuda.runtime.getDevice()
    hit = _REFERENCE_MEMO.get(dev)
    if hit is not None and hit[0] == key:
        return hit[1]
    yc, cy, gb, inv_w = _centre_reference(ref_fit, w_fit)
    ref_h, wyc = _reference_operands(yc, w_fit)
    ops = ((cy, gb, inv_w), wyc, cp.asarray(ref_h),
           None if fit is None else cp.asarray(np.asarray(fit, dtype=np.int32)))
    _REFERENCE_MEMO[dev] = (key, ops)
    return ops


def _rmsd_cuda(x, ref, fit=None, meas=None, w_fit=None, w_meas=None, *, want_coords=False):
    """CUDA twin of :func:`_rmsd_numpy`: ``x`` (F, N, 3) NumPy or CuPy; results are CuPy arrays.

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
    dt = _float_dtype(x.dtype)
    sfx = "f32" if dt == np.float32 else "f64"
    h_mom = _kernel(f"frame_moments_{sfx}")
    (cy, gb, inv_w), wyc, ref_d, idx_d = _reference_on_device(ref_fit, w_fit, fit)
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
        _launch(h_mom, _warp_grid(nf, 32 // _MOMENT_LANES, _MOMENT_THREADS), (_MOMENT_THREADS,), xs, idx_d, ref_d, mom,
                nf, n_atoms, n, weighted, float(inv_w), float(wyc[0]), float(wyc[1]), float(wyc[2]))
        if f0 == 0:
            # Set up the rest while the device reads the frames (host time before the first launch is
            # device idle time for a caller timing the whole call).
            h_qcp, h_dir = _kernel("qcp_frames"), _kernel(f"frame_direct_{sfx}")
            out_r = cp.empty(f)
            out_rot = cp.empty((f, 3, 3))
            out_t = cp.empty((f, 3))
            coords = cp.empty((f, n_atoms, 3), dtype=dt) if want_coords else None
            ref_meas_d = None if ref_meas is None else cp.asarray(ref_meas)
            w_meas_d = None if w_meas is None else cp.asarray(w_meas)
            meas_d = None if meas is None else cp.asarray(meas)
        r, rot, t = out_r[f0:f1], out_rot[f0:f1], out_t[f0:f1]
        _launch(h_qcp, ((nf + _QCP_THREADS - 1) // _QCP_THREADS,), (_QCP_THREADS,), mom, r, rot, t, nf, float(gb),
                float(inv_w), float(cy[0]), float(cy[1]), float(cy[2]))
        if ref_meas_d is None:
            # Near-identical frames: re-measured on the coordinates (module notes), on the device.
            _launch(h_dir, _warp_grid(nf), (_WARP_THREADS,), xs, idx_d, ref_d, mom, rot, r, nf, n_atoms, n, weighted,
                    float(gb), float(inv_w), float(_DIRECT_TAU))
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


def _launch(h, grid, block, *args):
    from . import _cuda

    _cuda.launch(h, grid, block, *args)


# ==================================================================================================
# Public: rmsd, superpose


def _run_rmsd(mobile, reference, fit, atoms, weights, ref_frame, device, want_coords):
    p = _prepare(mobile, reference, fit, atoms, weights, ref_frame, device, need_rotation=want_coords)
    be = p.be
    if be.on_gpu:
        x = p.mobile
        if be.kind.startswith("torch"):
            x = be.asarray(x)
        if not (is_cupy_array(x) or isinstance(x, np.ndarray)):
            x = np.asarray(x)
        x = x if x.ndim == 3 else x[None]
        res = _rmsd_cuda(x, p.ref, p.fit, p.meas, p.w_fit, p.w_meas, want_coords=want_coords)
        if not want_coords and isinstance(x, np.ndarray):
            res = (_finite_rmsd(to_numpy(res[0]), mobile), *res[1:])
    else:
        x = p.mobile
        if not isinstance(x, np.ndarray):
            x = be.asarray(x)
        if x.dtype.kind != "f":
            x = x.astype(np.float64)
        x = x if x.ndim == 3 else x[None]
        res = _rmsd_numpy(x, p.ref, p.fit, p.meas, p.w_fit, p.w_meas, want_coords=want_coords)
        if not want_coords:  # the result's check stands for a pass over the coordinates (_prepare)
            _finite_rmsd(res[0], mobile)
    return be, res, p.squeeze


def _finite_rmsd(r: np.ndarray, mobile) -> np.ndarray:
    """``r`` (host RMSDs), or InputError naming the first frame whose RMSD is NaN or infinite: a NaN
    or infinite coordinate of a fitted or measured atom gives one."""
    bad = ~np.isfinite(r)
    if bad.any():
        name = _frames_of(mobile, "mobile")[2]
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
    be, res, squeeze = _run_rmsd(mobile, reference, fit, atoms, weights, ref_frame, device, True)
    r, rot, t, coords = res
    return be.wrap(SuperposeResult(coords, rot, t, r))


# ==================================================================================================
# All-vs-all


def _tiles(n_rows: int, n_cols: int, tile: int, symmetric: bool):
    """Tile schedule ``(i0, i1, j0, j1)``: all tiles, or (symmetric) those with ``j0 >= i0``."""
    for i0 in range(0, n_rows, tile):
        i1 = min(n_rows, i0 + tile)
        for j0 in range(i0 if symmetric else 0, n_cols, tile):
            yield i0, i1, j0, min(n_cols, j0 + tile)


def _condensed_index(i, j, n):
    """Index of pair (i, j), i < j, in SciPy's condensed distance vector of n items."""
    return n * i - i * (i + 1) // 2 + (j - i - 1)


class _Sink:
    """Writes finished tiles into the destination (a NumPy array, np.memmap, Zarr array, or anything
    with ``__setitem__``): dense (mirrored across the diagonal for symmetric runs) or condensed."""

    def __init__(self, out, n: int, symmetric: bool, condensed: bool):
        import threading

        self.out, self.n, self.symmetric, self.condensed = out, n, symmetric, condensed
        # Tiles are disjoint regions, so NumPy destinations (np.memmap too) take writes from several
        # threads at once; other stores (Zarr) may share a chunk between tiles and rewrite it whole,
        # so their writes go one at a time.
        self._lock = None if isinstance(out, np.ndarray) else threading.Lock()

    def write(self, i0, i1, j0, j1, tile):
        """``tile`` (i1 - i0, j1 - j0) on the host; for symmetric runs it holds valid values at
        least for the pairs with i < j (diagonal tiles: upper triangle and a zero diagonal)."""
        if self._lock is None:
            self._write(i0, i1, j0, j1, tile)
        else:
            with self._lock:
                self._write(i0, i1, j0, j1, tile)

    def _write(self, i0, i1, j0, j1, tile):
        out = self.out
        if self.condensed:
            for i in range(i0, i1):
                js = max(j0, i + 1)
                if js < j1:
                    k0 = _condensed_index(i, js, self.n)
                    out[k0:k0 + (j1 - js)] = tile[i - i0, js - j0:]
            return
        if self.symmetric and i0 == j0:
            up = np.triu(tile, 1)
            out[i0:i1, j0:j1] = up + up.T
        else:
            out[i0:i1, j0:j1] = tile
            if self.symmetric:
                # The mirrored block in column strips: a whole transposed tile gathers every element
                # from a different cache line (~3.5x slower into an np.memmap).
                for b0 in range(0, i1 - i0, 512):
                    b1 = min(i1 - i0, b0 + 512)
                    out[j0:j1, i0 + b0:i0 + b1] = tile[b0:b1].T


def _centre_frames_numpy(x, w, fit, pool=None):
    """Centred, weight-scaled frames as the stacked (3F, N) float64 matrix of the GEMM formulation,
    and ``G`` (F,) float64. Row ``3f + c`` is coordinate c of frame f times sqrt(w).

    Frames go in cache-sized chunks (their float64 temporaries stay in cache), on ``pool``'s threads
    when one is given; each frame's numbers do not depend on the chunking or on the threads."""
    f = x.shape[0]
    n = x.shape[1] if fit is None else len(fit)
    a = np.empty((3 * f, n))
    g = np.empty(f)
    sw = None if w is None else np.sqrt(w)
    chunk = rows_per_chunk(n * 3 * 8 * 3, f, _CACHE_CHUNK_BYTES)

    def work(f0):
        f1 = min(f, f0 + chunk)
        xd = np.asarray(x[f0:f1] if fit is None else x[f0:f1, fit], dtype=np.float64)
        cx = xd.mean(axis=1) if w is None else np.einsum("fni,n->fi", xd, w) / w.sum()
        c = (xd - cx[:, None, :]).transpose(0, 2, 1)
        if sw is not None:
            c = c * sw
        g[f0:f1] = np.einsum("fin,fin->f", c, c)
        a[3 * f0:3 * f1] = c.reshape(-1, n)

    _run(pool, work, range(0, f, chunk))
    return a, g


def _run(pool, fn, items):
    """``fn(item)`` for every item: on ``pool``'s threads when given (NumPy's ufuncs and BLAS release
    the GIL), else in order here. Each call writes its own part of the result, so the order of
    completion does not matter; the first exception is raised."""
    items = list(items)
    if pool is None or len(items) < 2:
        for it in items:
            fn(it)
    else:
        for fut in [pool.submit(fn, it) for it in items]:
            fut.result()


def _qcp_group(threads: int) -> int:
    """Pairs (or frames) per vectorised QCP call with ``threads`` workers: ``_QCP_CHUNK_PAIRS`` on one
    thread, four times that on a pool. Each NumPy call holds the GIL for ~1 us of Python around its
    loop, and a thread waiting for the GIL takes a wake-up to get it: with calls of ~3 us (8192 pairs)
    two threads run no faster than one (measured), with ~12 us calls (32768 pairs) they do (1.3x on 2
    cores), at a few % more time per pair on one core. Results do not depend on it."""
    return _QCP_CHUNK_PAIRS if threads < 2 else 4 * _QCP_CHUNK_PAIRS


def _qcp_tile_numpy(blocks, ga, gb, inv_w, upper: bool, pool=None, group: int | None = None):
    """RMSD for a tile of 3x3 blocks (3 Ti, 3 Tj) (float32 or float64): (Ti, Tj) float64. With
    ``upper`` (a diagonal tile of a symmetric run) only the pairs i < j are computed; the rest is 0.

    The vectorised QCP runs on groups of whole rows of about ``group`` pairs (counting only the pairs
    computed; default ``_QCP_CHUNK_PAIRS``): its temporaries then stay in the CPU's cache (on a whole
    512 x 512 tile they are 2 MB each, and every step of the QCP would stream from memory), and each
    group is one task for ``pool``'s threads. Every pair's value is computed elementwise, whatever its
    group or thread."""
    res, futures = _qcp_tile_start(blocks, ga, gb, inv_w, upper, pool, group)
    for fut in futures:
        fut.result()
    return res


def _qcp_tile_start(blocks, ga, gb, inv_w, upper: bool, pool, group=None):
    """:func:`_qcp_tile_numpy` without the wait: ``(res, futures)``, ``res`` complete once every future
    is (all done here, and no futures, when ``pool`` is None)."""
    ti, tj = blocks.shape[0] // 3, blocks.shape[1] // 3
    b4 = blocks.reshape(ti, 3, tj, 3)
    res = np.zeros((ti, tj))
    counts = np.maximum(tj - 1 - np.arange(ti), 0) if upper else np.full(ti, tj)
    groups, r0, acc = [], 0, 0
    for i, c in enumerate(counts.tolist()):
        acc += c
        if acc >= (group or _QCP_CHUNK_PAIRS) or i == ti - 1:
            if acc:
                groups.append((r0, i + 1))
            r0, acc = i + 1, 0

    def work(rows):
        r0, r1 = rows
        if upper:
            ii, jj = np.nonzero(np.arange(tj)[None, :] > np.arange(r0, r1)[:, None])
            ii += r0
            m = np.empty((3, 3, ii.size))
            np.copyto(m, b4[ii, :, jj, :].transpose(1, 2, 0))  # one gather; float64 whatever the GEMM's
            s = [m[p, q] for p in range(3) for q in range(3)]
            res[ii, jj] = _qcp_rmsd_only(s, ga[ii] + gb[jj], inv_w)
        else:
            m = np.empty((3, 3, r1 - r0, tj))
            np.copyto(m, b4[r0:r1].transpose(1, 3, 0, 2))
            s = [m[p, q].reshape(-1) for p in range(3) for q in range(3)]
            gsum = (ga[r0:r1, None] + gb[None, :]).reshape(-1)
            res[r0:r1] = _qcp_rmsd_only(s, gsum, inv_w).reshape(r1 - r0, tj)

    if pool is None:
        for rows in groups:
            work(rows)
        return res, []
    return res, [pool.submit(work, rows) for rows in groups]


def _pairwise_numpy(x, y=None, *, fit=None, weights=None, precision="float64", out=None, condensed=False,
                    tile: int | None = None, out_dtype=np.float32, threads: int | None = None):
    """The NumPy twin of :func:`pairwise_rmsd` (also its CPU path): the same GEMM formulation through
    NumPy's BLAS and a vectorised QCP, tile by tile.

    Parallel on the CPU's cores: each tile's GEMM is one BLAS call from this thread (BLAS threads it),
    and the tile's QCP row groups (:func:`_qcp_tile_numpy`) run on a pool of threads (NumPy's ufuncs
    release the GIL) while this thread makes the next tile's GEMM; the centring goes over frame chunks
    on the same pool. The cores are split between the two (:func:`_cpu_split`: a quarter for the QCP
    pool, the rest for BLAS, which is limited to them during the call). Tiles are written to ``out``
    from this thread, in order, once complete. The result is bitwise the same for any ``threads`` (the
    groups and chunks do not depend on it, every pair is computed elementwise, and BLAS gets the same
    thread count whatever ``threads`` is) and for any ``tile`` as long as BLAS sums each block entry in
    the same order whatever the GEMM's shape (OpenBLAS's small-matrix kernels, for tiles of a few
    frames, can differ by ~1e-13 relative).

    Parameters
    ----------
    x : np.ndarray, shape (F, N, 3)
    y : np.ndarray, shape (G, N, 3), optional
    fit : np.ndarray of int64, optional
        Atom indices used (both inputs).
    weights : np.ndarray (n_fit,), optional
    precision : {"float64", "float32"}
        dtype of the stacked coordinates and of the 3x3 blocks (the GEMM).
    out : array-like, optional
        Destination (F, G) or condensed (F (F - 1) / 2,); written tile by tile.
    condensed : bool
        Condensed output (``y`` None only).
    tile : int, optional
        Frames per tile side (default ``_CPU_TILE``, 512); the result does not depend on it.
    out_dtype : dtype
        Result dtype when ``out`` is None.
    threads : int, optional
        Cores to use (default: the usable CPU cores): a quarter of them (1 to 8) run the QCP pool; the
        result does not depend on it.

    Returns
    -------
    np.ndarray (or ``out``), Angstrom.
    """
    n_threads = _cpu_threads() if threads is None else max(1, int(threads))
    n_pairs = x.shape[0] * (x.shape[0] if y is None else y.shape[0])
    # BLAS gets the cores the default QCP pool leaves, whatever ``threads`` is: its thread count can
    # change a GEMM's rounding, and the result must not depend on ``threads``.
    with _blas_threads(_cpu_split(_cpu_threads())[1]):
        # A pool only where there is work for several threads (starting one costs ~0.1 ms).
        if n_threads > 1 and n_pairs >= 8 * _QCP_CHUNK_PAIRS:
            qcp_threads = _cpu_split(n_threads)[0]
            with concurrent.futures.ThreadPoolExecutor(qcp_threads, thread_name_prefix="protgpu-rmsd") as pool:
                return _pairwise_numpy_run(x, y, fit, weights, precision, out, condensed, tile, out_dtype, pool,
                                           _qcp_group(qcp_threads))
        return _pairwise_numpy_run(x, y, fit, weights, precision, out, condensed, tile, out_dtype, None,
                                   _QCP_CHUNK_PAIRS)


def _cpu_split(n_threads: int) -> tuple[int, int]:
    """``(QCP pool threads, BLAS threads)`` for :func:`_pairwise_numpy` on ``n_threads`` cores.

    The QCP threads and BLAS's threads (the next tile's GEMM) run at the same time, so together they
    must not exceed the cores: OpenBLAS's idle threads spin for ~0.1 s after each GEMM, and a tile's
    QCP takes less than that, so every core they share runs at half speed. Measured on 16 cores
    (4,000 x 500 frames): 16 QCP + 16 BLAS threads 2.77 s, 4 + 12 0.85 s, 8 + 8 0.98 s, 16 + 4 0.95 s,
    1 + 16 1.86 s (mdtraj.rmsd over every reference, same run: 1.67 s). A quarter of the cores for the QCP
    (at most 8: it scales sub-linearly, GIL hand-overs) and the rest for BLAS."""
    qcp = max(1, min(8, n_threads // 4))
    return qcp, max(1, n_threads - qcp)


_BLAS_CONTROLLER: list = []  # threadpoolctl's ThreadpoolController, made once (it scans the loaded libraries)


@contextlib.contextmanager
def _blas_threads(n: int):
    """BLAS limited to ``n`` threads inside the block (threadpoolctl; the setting is process-wide)."""
    if not _BLAS_CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController

            _BLAS_CONTROLLER.append(ThreadpoolController())
        except ImportError:  # (a dependency; without it BLAS keeps its own thread count)
            _BLAS_CONTROLLER.append(None)
    controller = _BLAS_CONTROLLER[0]
    if controller is None:
        yield
        return
    with controller.limit(limits=int(n), user_api="blas"):
        yield


def _pairwise_numpy_run(x, y, fit, weights, precision, out, condensed, tile, out_dtype, pool, group):
    """:func:`_pairwise_numpy` with its thread pool (or None: all in this thread) and QCP group size."""
    prec = np.dtype(precision)
    symmetric = y is None
    a, ga = _centre_frames_numpy(x, weights, fit, pool)
    if symmetric:
        b, gb = a, ga
    else:
        b, gb = _centre_frames_numpy(y, weights, fit, pool)
    a = a.astype(prec, copy=False)
    b = a if symmetric else b.astype(prec, copy=False)
    n = a.shape[1]
    inv_w = 1.0 / (n if weights is None else float(weights.sum()))
    f, g = len(ga), len(gb)
    if out is None:
        shape = (f * (f - 1) // 2,) if condensed else (f, g)
        check_host_fits(int(np.prod(shape)) * np.dtype(out_dtype).itemsize, "the RMSD matrix")
        out = np.empty(shape, dtype=out_dtype)
        if not condensed and symmetric:
            out[np.arange(f), np.arange(f)] = 0
    sink = _Sink(out, f, symmetric, condensed)
    t = int(tile or _CPU_TILE)
    # With a pool, the QCP of one tile runs on the pool's threads while this thread makes the next
    # tile's GEMM (BLAS holds no GIL: its threads use the cores the QCP threads leave while they wait
    # for the GIL); tiles are written here, in order, once their QCP is complete.
    pending = None
    for i0, i1, j0, j1 in _tiles(f, g, t, symmetric):
        blocks = a[3 * i0:3 * i1] @ b[3 * j0:3 * j1].T
        diag = symmetric and i0 == j0
        job = (i0, i1, j0, j1, *_qcp_tile_start(blocks, ga[i0:i1], gb[j0:j1], inv_w, diag, pool, group))
        if pending is not None:
            _write_tile(sink, *pending)
        pending = job
    if pending is not None:
        _write_tile(sink, *pending)
    return out


def _write_tile(sink, i0, i1, j0, j1, res, futures):
    for fut in futures:
        fut.result()
    sink.write(i0, i1, j0, j1, res)


def _gpu_tile_size(f, g, prec_size, out_size, budget, fixed):
    """Frames per tile side on the GPU: the 3x3 blocks (9 T^2 * precision) plus two output tiles fit in
    what the budget leaves after the resident stacked coordinates (``fixed`` bytes)."""
    avail = budget - fixed
    per = 9 * prec_size + 2 * out_size + 16
    if avail < per * 8 * 8:
        raise MemoryBudgetError(
            f"pairwise RMSD: the stacked coordinates need {format_bytes(fixed)} of the device budget of "
            f"{format_bytes(budget)}; select fewer atoms or frames, or raise PROTGPU_GPU_MEMORY_BUDGET")
    t = int(np.sqrt(avail / per))
    t = min(t, 8192, max(f, g))
    if t >= 64:
        t -= t % 32
    return max(t, 1)


def _centre_frames_cuda(x, w, fit, prec):
    """Device twin of :func:`_centre_frames_numpy` (kernel ``centre_frames_*``, one warp per frame):
    the stacked (3F, N) ``prec`` CuPy array and G (F,) float64. ``x`` may be host or device (float32
    stays float32 on the way); host input is uploaded frame chunk by frame chunk."""
    import cupy as cp

    f, n_atoms = x.shape[:2]
    n = n_atoms if fit is None else len(fit)
    dt = _float_dtype(x.dtype)
    h = _kernel(f"centre_frames_{'f32' if dt == np.float32 else 'f64'}_{'b32' if prec == np.float32 else 'b64'}")
    a = cp.empty((3 * f, n), dtype=prec)
    g = cp.empty(f)
    idx_d = None if fit is None else cp.asarray(np.asarray(fit, dtype=np.int32))
    w_d = None if w is None else cp.asarray(w)
    sw_d = None if w is None else cp.asarray(np.sqrt(w))
    inv_w = 1.0 / (n if w is None else float(w.sum()))
    if is_cupy_array(x):
        chunk = f
    else:
        chunk = rows_per_chunk(n_atoms * 3 * np.dtype(dt).itemsize, f, max(device_budget_bytes() // 4, 1 << 24))
    for f0 in range(0, f, chunk):
        f1 = min(f, f0 + chunk)
        xs = cp.ascontiguousarray(cp.asarray(x[f0:f1]), dtype=dt)
        _launch(h, _warp_grid(f1 - f0), (_WARP_THREADS,), xs, idx_d, w_d, sw_d, a[3 * f0:3 * f1], g[f0:f1], f1 - f0,
                n_atoms, n, inv_w)
    return a, g


class _PairPlan:
    """The device state of one all-vs-all run: the stacked centred frames ``a`` (3F, N) and ``b``
    (3G, N) in the GEMM precision (``b is a`` when symmetric), their traces ``ga``, ``gb``, and the
    pair kernels. :meth:`gemm` makes a panel's 3x3 blocks, :meth:`qcp` turns (part of) a panel into
    RMSDs."""

    def __init__(self, x, y, fit, weights, precision, out_dtype, check_names=(None, None)):
        prec = np.dtype(precision)
        self.prec, self.odt = prec, np.dtype(out_dtype)
        self.symmetric = y is None
        self.a, self.ga = _centre_frames_cuda(x, weights, fit, prec)
        if self.symmetric:
            self.b, self.gb = self.a, self.ga
        else:
            self.b, self.gb = _centre_frames_cuda(y, weights, fit, prec)
        _check_traces(self.ga, check_names[0])
        if not self.symmetric:
            _check_traces(self.gb, check_names[1])
        n = self.a.shape[1]
        self.inv_w = 1.0 / (n if weights is None else float(weights.sum()))
        self.f, self.g = len(self.ga), len(self.gb)
        sfx = f"{'b32' if prec == np.float32 else 'b64'}_{'o32' if self.odt == np.float32 else 'o64'}"
        self.h_pairs, self.h_refine = _kernel(f"qcp_pairs_{sfx}"), _kernel(f"qcp_refine_{sfx}")
        self.fixed = self.a.nbytes + (0 if self.symmetric else self.b.nbytes) + 8 * (self.f + self.g)

    def gemm(self, i0, i1, j0, j1):
        """Blocks of rows i0:i1 against columns j0:j1: (3 (i1 - i0), 3 (j1 - j0)), row-major (cuBLAS through
        nvmath follows the row-major first operand; a column-major result is copied to be safe)."""
        import cupy as cp

        from ._cuda.blas import matmul

        blocks = matmul(self.a[3 * i0:3 * i1], self.b[3 * j0:3 * j1].T)
        return blocks if blocks.flags.c_contiguous else cp.ascontiguousarray(blocks)

    def qcp(self, blocks, p0, i0, i1, j0, j1, dst, out_ld, out_row0, out_col0, mode):
        """Pairs (i0:i1) x (j0:j1) from ``blocks`` (a panel whose first column frame is ``p0``) into ``dst``."""
        ti, tj = i1 - i0, j1 - j0
        bx, by = _PAIR_BLOCK
        grid = ((tj + bx - 1) // bx, (ti + by - 1) // by)
        args = (blocks, blocks.shape[1], 3 * (j0 - p0), self.ga, self.gb, dst, ti, tj, i0, j0, out_ld, out_row0,
                out_col0, self.f, float(self.inv_w), mode)
        _launch(self.h_pairs, grid, _PAIR_BLOCK, *args)
        _launch(self.h_refine, grid, _PAIR_BLOCK, *args)

    def panel_cols(self, rows, avail, granule, start):
        """Columns of one GEMM panel of ``rows`` rows: a multiple of ``granule`` whose blocks fit in
        ``avail`` bytes (at least one granule), at most what is left from column ``start``."""
        left = self.g - start
        per_col = 9 * rows * self.prec.itemsize
        k = max(1, int(avail // (per_col * granule)))
        return min(left, k * granule)


def _check_traces(g, name: str | None) -> None:
    """:func:`_check_finite` for the GPU paths, on the device: a frame with a NaN or infinite coordinate
    among the fitted atoms has a non-finite trace ``g`` (its centred sum of squares), whatever its
    weights (0 x inf is NaN). Checking the (F,) traces costs one small reduction, where scanning the
    host coordinates cost ~70 ms for 100,000 x 300 frames, before any GPU could start. ``name`` None:
    no check (device input: NaN propagates into the results, as documented)."""
    if name is None:
        return
    import cupy as cp

    bad = ~cp.isfinite(g)
    if bool(bad.any()):
        raise InputError(f"{name}: NaN or infinite coordinates in frame {int(cp.argmax(bad))}")


def _strip_rows(f: int) -> int:
    """Rows of a GEMM strip in a symmetric resident run: about 1/6 of the frames, at least 256, a
    multiple of 32. A strip's GEMM covers its rows against every later column, so 6 strips do ~58% of
    the full square's work (k strips: (k + 1) / 2k), while each GEMM stays large enough for cuBLAS's full
    speed and the strips are few enough for the host to enqueue them (~0.1-0.3 ms of Python each)
    faster than the device runs them."""
    r = max(256, -(-f // 6))
    return min(f, -(-r // 32) * 32)


def _pairwise_tiles_cuda(x, *, fit=None, weights=None, precision="float64", tile=None, out_dtype=np.float32):
    """Square tiles of the symmetric all-vs-all RMSD matrix on the device, one at a time (for callers
    that fold each tile into their own state, e.g. ``protgpu.scoring.consensus``).

    Parameters
    ----------
    x : np.ndarray or cupy.ndarray, shape (F, N, 3)
        Frames, Angstrom (float32 or float64; host input is uploaded once).
    fit : np.ndarray of int, optional
        Atom indices used (default all).
    weights : np.ndarray (n_fit,), optional
    precision : {"float64", "float32"}
        GEMM precision, as :func:`pairwise_rmsd`.
    tile : int, optional
        Frames per tile side (default: from the device memory budget, at most 8192).
    out_dtype : dtype
        float32 or float64 tiles.

    Yields
    ------
    (i0, i1, j0, j1, dst)
        For ``i0`` over the row tiles and ``j0 >= i0`` over the column tiles (the upper triangle of
        tiles, row by row, as :func:`_tiles`): ``dst`` a C-contiguous CuPy (i1 - i0, j1 - j0) array of RMSDs,
        Angstrom. A diagonal tile (``i0 == j0``) is complete: symmetric, zero diagonal (made with
        ``_MIRROR | _UPPER_ONLY | _ZERO_DIAG``). ``dst`` is written on CuPy's current stream and reused
        for the next tile: consume it (launch on the same stream, or copy) before advancing.

    Raises
    ------
    MemoryBudgetError
        The stacked coordinates and one tile do not fit in the device budget.
    """
    import cupy as cp

    plan = _PairPlan(x, None, fit, weights, precision, out_dtype)
    f = plan.f
    budget = device_budget_bytes()
    t = int(tile) if tile else _gpu_tile_size(f, f, plan.prec.itemsize, plan.odt.itemsize, budget, plan.fixed)
    t = max(1, min(t, f, 65535 * _PAIR_BLOCK[1]))
    buf = cp.empty(t * t, dtype=plan.odt)
    avail = max(budget - plan.fixed - buf.nbytes, 0)
    blocks = None
    for i0, i1, p0, p1 in _panels(plan, t, avail):
        blocks = None  # one panel alive at a time
        blocks = plan.gemm(i0, i1, p0, p1)
        for j0 in range(p0, p1, t):
            j1 = min(p1, j0 + t)
            dst = buf[:(i1 - i0) * (j1 - j0)].reshape(i1 - i0, j1 - j0)
            mode = (_MIRROR | _UPPER_ONLY | _ZERO_DIAG) if i0 == j0 else 0
            plan.qcp(blocks, p0, i0, i1, j0, j1, dst, j1 - j0, 0, 0, mode)
            yield i0, i1, j0, j1, dst


def _panels(plan, t, avail, row_starts=None):
    """``(i0, i1, p0, p1)``: row tiles of ``t`` frames (those starting at ``row_starts``, default all),
    each against its columns (from ``i0`` when symmetric) in panels of whole tiles (one GEMM each),
    panels as wide as ``avail`` bytes allow. The caller runs each panel's GEMM after dropping the
    previous panel, so one panel is alive at a time."""
    for i0 in (range(0, plan.f, t) if row_starts is None else row_starts):
        i1 = min(plan.f, i0 + t)
        start = i0 if plan.symmetric else 0
        p0 = start
        while p0 < plan.g:
            p1 = p0 + plan.panel_cols(i1 - i0, avail, t, p0)
            yield i0, i1, p0, p1
            p0 = p1


def _pairwise_cuda(x, y=None, *, fit=None, weights=None, precision="float64", out=None, condensed=False,
                   tile: int | None = None, out_dtype=np.float32, host_result: bool = True, check_names=(None, None)):
    """CUDA path of :func:`pairwise_rmsd`: ``centre_frames_*`` stacks the centred frames on the device,
    one cuBLAS GEMM per panel of the stacked (3F, N) coordinates gives every pair's 3x3 block, and
    ``qcp_pairs_*`` (+ ``qcp_refine_*`` for the rare near-repeated roots) turns blocks into RMSDs.

    Resident result (it fits in half the device budget, no ``out``): symmetric runs go in row strips of
    ~F/6 frames, each strip's GEMM against its own and every later column only (~58% of the square's
    work), the kernel mirroring each pair (or writing the condensed vector); ``tile`` replaces the strips
    by square tiles. Otherwise tiles stream to the host: each finished tile is copied device-to-host on a
    second stream into one of two pinned buffers while the next tile computes, and a writer thread stores
    it into ``out``. Returns ``out``, the host result, or (``host_result=False``) the CuPy result.
    """
    import cupy as cp

    plan = _PairPlan(x, y, fit, weights, precision, out.dtype if out is not None else out_dtype, check_names)
    f, g, odt, symmetric = plan.f, plan.g, plan.odt, plan.symmetric
    budget = device_budget_bytes()
    shape = (f * (f - 1) // 2,) if condensed else (f, g)
    result_bytes = int(np.prod(shape)) * odt.itemsize
    # Resident when the whole result takes at most half the budget (panels get the rest); else stream.
    resident = out is None and result_bytes + plan.fixed <= budget // 2
    if out is None and not resident and not host_result:
        raise MemoryBudgetError(
            f"pairwise RMSD: the {shape} result ({format_bytes(result_bytes)}) does not fit in the device "
            f"budget ({format_bytes(budget)}); pass out= (an np.memmap or Zarr array) to stream it")
    if resident:
        dst = cp.empty(shape, dtype=odt)
        avail = budget - plan.fixed - result_bytes
        if tile:
            rows = cols = max(1, min(int(tile), max(f, g)))
        else:
            rows = _strip_rows(f) if symmetric else f
            cols = 32
        rows = min(rows, f, 65535 * _PAIR_BLOCK[1])  # grid.y limit
        if 9 * rows * cols * plan.prec.itemsize > avail:  # a budget too small for the strip: square tiles
            rows = cols = _gpu_tile_size(f, g, plan.prec.itemsize, odt.itemsize, budget - result_bytes, plan.fixed)
        if condensed:
            mode = _CONDENSED
        elif symmetric:
            mode = _MIRROR | _UPPER_ONLY | _ZERO_DIAG  # no-ops away from the diagonal
        else:
            mode = 0
        for i0 in range(0, f, rows):
            i1 = min(f, i0 + rows)
            p0 = i0 if symmetric else 0
            while p0 < g:
                p1 = p0 + plan.panel_cols(i1 - i0, avail, cols, p0)
                if tile:
                    p1 = min(p1, p0 + cols)
                blocks = plan.gemm(i0, i1, p0, p1)
                plan.qcp(blocks, p0, i0, i1, p0, p1, dst, g, 0 if condensed else i0, p0, mode)
                del blocks
                p0 = p1
        return dst.get() if host_result else dst
    # Streaming to the host, tile by tile.
    if out is None:
        check_host_fits(result_bytes, "the RMSD matrix")
        out = np.empty(shape, dtype=odt)
        if symmetric and not condensed:
            out[np.arange(f), np.arange(f)] = 0
    sink = _Sink(out, f, symmetric, condensed)
    # The host writes bound a streamed run's speed, not the tile size: tiles of at most _STREAM_TILE
    # frames and GEMM panels of at most _STREAM_PANEL_BYTES keep its device footprint to a few GB
    # (50,000 x 300 frames: ~3 GB) however large the budget.
    if condensed and not tile:
        _stream_condensed(plan, out, budget)
        return out
    t = tile or min(_STREAM_TILE, _gpu_tile_size(f, g, plan.prec.itemsize, odt.itemsize, budget, plan.fixed))
    t = max(1, min(int(t), max(f, g), 65535 * _PAIR_BLOCK[1]))
    _stream_tiles(plan, sink, t, budget)
    return out


def _condensed_strip_rows(f: int, itemsize: int) -> int:
    """Rows per strip when streaming a condensed result: a strip's part of the vector (at most
    ~``_STREAM_STRIP_BYTES``, its first rows being the longest) is one contiguous block."""
    rows = _STREAM_STRIP_BYTES // max(1, itemsize * max(f - 1, 1))
    return int(max(32, min(8192, rows - rows % 32 if rows >= 64 else rows)))


def _stream_condensed(plan, out, budget, row_starts=None, rows=None):
    """The condensed vector of a symmetric run streamed to the host in row strips: the pairs of rows
    [i0, i1) against every later frame are one contiguous block of SciPy's layout, so the kernel writes
    them straight into a device strip buffer in that order, one device-to-host copy moves the block and
    one NumPy copy stores it (few large operations per strip: the host side releases the GIL and keeps
    up with several GPUs, where a tile's row segments would be one Python-level copy each). Page-locking
    ``out`` instead, for the copy engines to write it directly, was measured slower: registering 20 GB
    took 1.25 s (and 0.39 s to release), more than the whole run with staging buffers."""
    import threading

    import cupy as cp
    import cupyx

    f, odt = plan.f, plan.odt
    rows = rows or _condensed_strip_rows(f, odt.itemsize)
    rows = max(1, min(int(rows), f, 65535 * _PAIR_BLOCK[1]))

    def start(i):  # condensed index of pair (i, i + 1)
        return i * f - i * (i + 1) // 2

    cap = start(min(f, rows)) - start(0)  # the first strip is the longest
    # A page-locked destination is written by the copy engine straight from the device strip: no
    # staging buffer, no host-side copy, and so no bound from the host's memcpy bandwidth.
    direct = _page_locked(out)
    n_writers = _stream_writers()
    n_buf = n_writers + 1
    compute = cp.cuda.get_current_stream()
    copy_stream = cp.cuda.Stream(non_blocking=True)
    dev_bufs = [cp.empty(max(cap, 1), dtype=odt) for _ in range(n_buf)]
    host_bufs = [] if direct else [cupyx.empty_pinned(max(cap, 1), dtype=odt) for _ in range(n_buf)]
    avail = min(max(budget - plan.fixed - n_buf * dev_bufs[0].nbytes, 0), _STREAM_PANEL_BYTES)
    width = max(32, min(plan.panel_cols(rows, avail, 32, 0), _STREAM_PANEL_COLS))
    quantum = max(32, min(_STREAM_PANEL_QUANTUM, width) // 32 * 32)
    width = max(quantum, width // quantum * quantum)  # grid lines fall on the quantum's
    copied: list = [None] * n_buf
    pending: list = [None] * n_buf
    # NumPy destinations take strips from several writers at once (disjoint blocks); others (Zarr may
    # share a chunk between strips) one at a time.
    lock = None if isinstance(out, np.ndarray) else threading.Lock()

    # A strip's store into a NumPy destination is split over helper threads as well: one thread's
    # copy into pageable memory runs at a fraction of the host's memory bandwidth.
    n_pieces = _store_pieces()  # (the helper pool, ``helpers``, is opened below with the writers)

    def store(ev, buf, k0, k1):
        ev.synchronize()
        if lock is not None:
            with lock:
                out[k0:k1] = buf
            return
        m = int(min(n_pieces, max(1, (k1 - k0) * buf.itemsize // _STORE_PIECE_BYTES)))
        cuts = [k0 + (k1 - k0) * q // m for q in range(m + 1)]

        def piece(q):
            out[cuts[q]:cuts[q + 1]] = buf[cuts[q] - k0:cuts[q + 1] - k0]

        others = [helpers.submit(piece, q) for q in range(1, m)]
        piece(0)
        for o in others:
            o.result()

    with concurrent.futures.ThreadPoolExecutor(max_workers=n_writers) as writer, \
            (concurrent.futures.ThreadPoolExecutor(max_workers=n_writers * (n_pieces - 1)) if n_pieces > 1
             else contextlib.nullcontext()) as helpers:
        k = 0
        for i0 in (range(0, f, rows) if row_starts is None else row_starts):
            i1 = min(f, i0 + rows)
            k0, k1 = start(i0), start(i1)
            if k1 == k0:
                continue
            s = k % n_buf
            k += 1
            if copied[s] is not None:
                compute.wait_event(copied[s])
            dst = dev_bufs[s][:k1 - k0]
            # Panels on a fixed grid of one width, so that every strip's GEMMs have a few shapes and reuse
            # their cuBLAS plans (planning a new shape costs milliseconds of host time). The first panel
            # starts on the quantum's grid just left of the diagonal (the kernel skips the pairs left of
            # it) and runs to the next grid line: at most width / quantum first-panel shapes, and little
            # GEMM work wasted left of the diagonal (up to a whole panel would be ~8% of the GEMMs at
            # 100,000 frames), with wide panels: fewer launches, whose host time bounds several GPUs.
            p0 = (i0 // quantum) * quantum
            blocks = None
            while p0 < f:
                p1 = min(f, (p0 // width + 1) * width)
                blocks = None  # one panel alive at a time
                blocks = plan.gemm(i0, i1, p0, p1)
                plan.qcp(blocks, p0, i0, i1, p0, p1, dst, 0, k0, 0, _CONDENSED)
                p0 = p1
            blocks = None
            done = compute.record()
            copy_stream.wait_event(done)
            if direct:
                cp.asnumpy(dst, stream=copy_stream, out=out[k0:k1], blocking=False)
                copied[s] = copy_stream.record()
                if row_starts is not None and copied[k % n_buf] is not None:
                    # Several devices share the queue of strips: take the next one only once this device
                    # has its buffer free (the copy of the strip that used it last is done), so that the
                    # strips go to the devices at the pace they finish them. Unpaced, each host thread
                    # took strips as fast as it could enqueue them, far ahead of its device and unevenly
                    # (measured: 87 against 70 strips, one GPU idle for the last 0.25 s of 0.58 s).
                    copied[k % n_buf].synchronize()
                continue
            if pending[s] is not None:
                pending[s].result()
            host_view = host_bufs[s][:k1 - k0]
            cp.asnumpy(dst, stream=copy_stream, out=host_view, blocking=False)
            copied[s] = copy_stream.record()
            pending[s] = writer.submit(store, copied[s], host_view, k0, k1)
        for p in pending:
            if p is not None:
                p.result()
        copy_stream.synchronize()


def _page_locked(out) -> bool:
    """Whether ``out`` is a C-contiguous NumPy array in page-locked host memory (``cupyx.empty_pinned``,
    ``cudaHostAlloc`` or ``cudaHostRegister``): the copy engines can then write into it directly."""
    if type(out) is not np.ndarray or out.size == 0 or not out.flags.c_contiguous:
        return False
    import cupy as cp

    rt = cp.cuda.runtime
    host_kind = getattr(rt, "memoryTypeHost", 1)
    query = getattr(rt, "pointerGetAttributes", None)
    if query is None:
        return False
    try:  # both ends: a registered range must cover the whole array
        ends = (out.ctypes.data, out.ctypes.data + out.nbytes - 1)
        return all(query(p).type == host_kind for p in ends)
    except getattr(rt, "CUDARuntimeError", RuntimeError):  # memory the driver does not know
        return False


def _stream_tiles(plan, sink, t, budget, row_starts=None):
    """Every tile of the row tiles ``row_starts`` (default all) computed on the current device and
    stored into ``sink``: each finished tile is copied device-to-host on a second stream into one of two
    pinned buffers while the next tile computes, and a writer thread stores it."""
    import cupy as cp
    import cupyx

    odt, symmetric = plan.odt, plan.symmetric
    compute = cp.cuda.get_current_stream()
    copy_stream = cp.cuda.Stream(non_blocking=True)
    # Host memory bandwidth (writes into out) is what bounds streaming, so several writer threads
    # store tiles at once (NumPy copies release the GIL); each needs its own pinned buffer, plus one
    # being filled by the copy engine.
    n_writers = _stream_writers()
    n_buf = n_writers + 1
    dev_tiles = [cp.empty((t, t), dtype=odt) for _ in range(n_buf)]
    host_tiles = [cupyx.empty_pinned((t, t), dtype=odt) for _ in range(n_buf)]
    avail = min(max(budget - plan.fixed - n_buf * dev_tiles[0].nbytes, 0), _STREAM_PANEL_BYTES)
    copied: list = [None] * n_buf
    pending: list = [None] * n_buf

    def store(ev, buf, i0, i1, j0, j1):
        ev.synchronize()
        sink.write(i0, i1, j0, j1, buf[: i1 - i0, : j1 - j0])

    with concurrent.futures.ThreadPoolExecutor(max_workers=n_writers) as writer:
        k = 0
        blocks = None
        for i0, i1, p0, p1 in _panels(plan, t, avail, row_starts):
            blocks = None  # back to the pool (stream-ordered) before the next panel is allocated
            blocks = plan.gemm(i0, i1, p0, p1)
            for j0 in range(p0, p1, t):
                j1 = min(p1, j0 + t)
                s = k % n_buf
                k += 1
                ti, tj = i1 - i0, j1 - j0
                if copied[s] is not None:
                    compute.wait_event(copied[s])  # the device tile buffer must have been copied out
                dst = dev_tiles[s].reshape(-1)[: ti * tj].reshape(ti, tj)
                diag = symmetric and i0 == j0
                plan.qcp(blocks, p0, i0, i1, j0, j1, dst, tj, 0, 0, (_UPPER_ONLY | _ZERO_DIAG) if diag else 0)
                done = compute.record()
                if pending[s] is not None:
                    pending[s].result()  # the writer must be finished with this pinned buffer
                copy_stream.wait_event(done)
                host_view = host_tiles[s].reshape(-1)[: ti * tj]
                cp.asnumpy(dst.reshape(-1), stream=copy_stream, out=host_view, blocking=False)
                copied[s] = copy_stream.record()
                pending[s] = writer.submit(store, copied[s], host_view.reshape(ti, tj), i0, i1, j0, j1)
        for p in pending:
            if p is not None:
                p.result()


def _stream_writers() -> int:
    """Writer threads per device when streaming to the host: up to 3, fewer on small machines."""
    return int(max(1, min(3, _cpu_threads() // 2)))


_STORE_PIECE_BYTES = 16 << 20  # smallest piece of a strip's store given to a helper thread


def _store_pieces() -> int:
    """Pieces each writer splits a condensed strip's store into (1: no helpers): up to 4, on machines
    with at least 4 cores per writer."""
    return int(max(1, min(4, _cpu_threads() // (4 * _stream_writers()) + 1)))


def _device_ids(devices) -> list[int]:
    """GPU ordinals from ``devices``: None (the current one), "all", a count, or a list of ordinals."""
    import cupy as cp

    n_visible = cp.cuda.runtime.getDeviceCount()
    if devices is None:
        return [cp.cuda.runtime.getDevice()]
    if isinstance(devices, str):
        if devices != "all":
            raise InputError(f"devices={devices!r}: use 'all', a count, or a list of GPU ordinals")
        return list(range(n_visible))
    if isinstance(devices, (int, np.integer)):
        if not 1 <= int(devices) <= n_visible:
            raise InputError(f"devices={devices}: {n_visible} GPU(s) visible")
        return list(range(int(devices)))
    ids = [int(d) for d in devices]
    if not ids or len(set(ids)) != len(ids) or not all(0 <= d < n_visible for d in ids):
        raise InputError(f"devices={list(devices)}: give distinct GPU ordinals in 0..{n_visible - 1}")
    return ids


def _pairwise_multi_gpu(x, y, *, fit, weights, precision, out, condensed, devices, tile=None,
                        out_dtype=np.float32, check_names=(None, None)):
    """:func:`_pairwise_cuda`'s streaming path spread over several GPUs: one host thread per device
    takes row tiles from a shared queue (largest first, so the triangle's work evens out), with its own
    copy of the centred frames, its own streams and writer, into the one host destination (tiles are
    disjoint regions of it)."""
    import threading
    from collections import deque

    import cupy as cp

    f = x.shape[0]
    g = f if y is None else y.shape[0]
    symmetric = y is None
    shape = (f * (f - 1) // 2,) if condensed else (f, g)
    odt = np.dtype(out.dtype if out is not None else out_dtype)
    if out is None:
        check_host_fits(int(np.prod(shape)) * odt.itemsize, "the RMSD matrix")
        out = np.empty(shape, dtype=odt)
        if symmetric and not condensed:
            out[np.arange(f), np.arange(f)] = 0
    sink = _Sink(out, f, symmetric, condensed)
    strips = condensed and not tile
    if strips:
        t = _condensed_strip_rows(f, odt.itemsize)
    else:
        t = max(1, min(int(tile or _STREAM_TILE), max(f, g), 65535 * _PAIR_BLOCK[1]))
    queue = deque(range(0, f, t))
    lock = threading.Lock()

    def row_starts():
        while True:
            with lock:
                if not queue:
                    return
                i0 = queue.popleft()
            yield i0

    def work(dev):
        with cp.cuda.Device(dev):
            plan = _PairPlan(x, y, fit, weights, precision, odt, check_names)
            if strips:
                _stream_condensed(plan, out, device_budget_bytes(), row_starts(), rows=t)
            else:
                _stream_tiles(plan, sink, t, device_budget_bytes(), row_starts())
            cp.cuda.get_current_stream().synchronize()

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(devices)) as pool:
        for fut in [pool.submit(work, d) for d in devices]:
            fut.result()
    return out


def _check_out(out, shape, condensed: bool):
    if out is None:
        return
    if not (hasattr(out, "shape") and hasattr(out, "dtype") and hasattr(out, "__setitem__")):
        raise InputError("out= must be an array-like with shape, dtype and item assignment "
                         "(np.ndarray, np.memmap, Zarr array)")
    if tuple(out.shape) != tuple(shape):
        what = "condensed " if condensed else ""
        raise InputError(f"out= has shape {tuple(out.shape)}, the {what}RMSD result needs {tuple(shape)}")
    if np.dtype(out.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise InputError(f"out= must be float32 or float64, not {out.dtype}")
    if is_cupy_array(out):
        raise InputError("out= is for host destinations (np.memmap, Zarr); a CuPy result is returned "
                         "when the input is CuPy")


def pairwise_rmsd(x, y=None, *, fit=None, weights=None, out=None, precision: str = "float64",
                  condensed: bool = False, device: str = "auto", devices=None):
    """All-vs-all RMSD after optimal superposition of every pair of frames (QCP on GEMM blocks).

    The centred frames are stacked as a (3F, N) matrix; one matrix product ``A B^T`` (cuBLAS on the
    GPU, NumPy's BLAS on the CPU) holds every pair's 3x3 correlation block ``M``, and a QCP step per
    block (the ``qcp_pairs`` kernel, or its vectorised NumPy twin) turns it and the two traces into
    the RMSD. With ``y`` None each pair is computed once (triangular tiles) and mirrored.

    Parameters
    ----------
    x : array (frames, atoms, 3), Structure, list of Structures
        Angstrom.
    y : same, optional
        Second set of frames, same atoms: an (F, G) matrix. Default: ``x`` against itself.
    fit : str or array_like, optional
        Atoms used (selection string with Structures, index array or mask); default all.
    weights : array_like (atoms,), optional
        Per-atom weights (of the full atom list or of the selection).
    out : np.ndarray, np.memmap or Zarr array, optional
        Destination, float32 or float64, shape (F, G) or condensed (F (F - 1) / 2,); filled tile by
        tile (on the GPU the copies overlap the compute), so the result never has to fit in device
        memory. Returned as given. A condensed destination in page-locked memory
        (``cupyx.empty_pinned``) is written by the GPUs' copy engines directly, without staging
        buffers or host-side copies: the fastest way to take a large result into host memory, as
        a pageable destination is bound by the host's memory-copy bandwidth (tens of GB/s).
    precision : {"float64", "float32"}
        dtype of the GEMM. float64 (default) keeps every RMSD within ~1e-6 Angstrom of a float64
        Kabsch reference, and is nearly free on GPUs with FP64 tensor cores; float32 blocks lose up
        to ~5e-3 Angstrom for near-identical frames (the cancellation in ``G_A + G_B - 2 l_max``) and
        ~1e-4 elsewhere. The QCP step is float64 either way.
    condensed : bool
        Return SciPy's condensed vector (pairs i < j, row by row) instead of the square matrix;
        ``y`` must be None.
    device : {"auto", "cpu", "gpu"}
    devices : "all", int or list of int, optional
        GPUs to spread the tiles over (GPU runs with a host result: NumPy input or ``out=``): "all", the
        first n, or ordinals. Each GPU takes row tiles from a shared queue and writes its finished
        tiles into the same destination. Default: the current GPU only.

    Returns
    -------
    array, shape (F, G) (or (F, F)) or (F (F - 1) / 2,), float32, Angstrom
        float32 (values are accurate far beyond float32's 6e-8 relative rounding) unless ``out`` is
        float64. Same array type as ``x``. With ``y`` None the matrix is exactly symmetric with a zero
        diagonal.

    Raises
    ------
    InputError
        Atom counts differing, ``condensed`` with ``y``, bad ``out``, NaN coordinates (host input),
        bad ``precision``.
    MemoryBudgetError
        A CuPy-resident result that does not fit in the device budget without ``out=``, or a host
        result larger than free memory.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(4, 10, 3))
    >>> d = pairwise_rmsd(x, device="cpu")
    >>> d.shape, bool(np.allclose(d, d.T)), float(d[0, 0])
    ((4, 4), True, 0.0)
    """
    if precision not in ("float32", "float64"):
        raise InputError(f"precision must be 'float32' or 'float64', not {precision!r}")
    if condensed and y is not None:
        raise InputError("condensed=True needs y=None (a condensed vector holds one symmetric matrix)")
    xa, xs, xname = _frames_of(x, "x")
    be = dispatch(xa, None if y is None else _frames_of(y, "y")[0], device=device)
    xshape = tuple(getattr(xa, "shape", None) or np.shape(xa))
    _check_shape(xshape, xname)
    if y is not None:
        ya, ys, yname = _frames_of(y, "y")
        yshape = tuple(getattr(ya, "shape", None) or np.shape(ya))
        _check_shape(yshape, yname)
    n_x = xshape[-2]
    fit_x = _resolve_selection(fit, xs, n_x, xname, "fit", other=None if y is None else ys)
    if y is not None:
        fit_y = _resolve_selection(fit, ys, yshape[-2], yname, "fit", other=xs)
        nx = n_x if fit_x is None else len(fit_x)
        ny = yshape[-2] if fit_y is None else len(fit_y)
        if nx != ny:
            raise InputError(f"x and y differ in atom count after selection: {xname} has {nx}, {yname} has {ny}")
    w = _resolve_weights(weights, n_x, fit_x, xname)

    # Per input (x, then y): its name where the GPU path checks it for NaN on the device (host float
    # input, by the traces of the centred frames: _check_traces), else None.
    check_names = []

    def frames(arr, shape, name, sel):
        host = _host_coords(arr, name)
        if not be.on_gpu:
            _check_finite(host, name, sel)
        check_names.append(name if be.on_gpu and host is not None and host.dtype.kind == "f" else None)
        a = host if host is not None else arr
        if host is None and be.kind.startswith("torch"):
            a = be.asarray(a)
        if isinstance(a, np.ndarray) and a.dtype.kind != "f":
            a = a.astype(np.float64)
        return a if len(shape) == 3 else a[None]

    xx = frames(xa, xshape, xname, fit_x)
    yy = None
    if y is not None:
        yy = frames(ya, yshape, yname, fit_y)
        if fit_y is not None and fit_x is not None and not np.array_equal(fit_x, fit_y):
            # Different index sets on the two sides: gather both, then fit on all.
            xx, yy = xx[:, fit_x], yy[:, fit_y]
            fit_x = None
    f = xx.shape[0]
    g = f if y is None else yy.shape[0]
    shape = (f * (f - 1) // 2,) if condensed else (f, g)
    _check_out(out, shape, condensed)
    check_names = (check_names[0], check_names[1] if y is not None else None)
    if be.on_gpu:
        ids = _device_ids(devices)
        host_result = be.kind == "numpy" or out is not None
        if len(ids) > 1:
            if not host_result:
                raise InputError(f"devices={devices!r}: several GPUs write into host memory; pass NumPy "
                                 "coordinates or out= (an np.ndarray, np.memmap or Zarr array)")
            res = _pairwise_multi_gpu(to_numpy(xx), None if yy is None else to_numpy(yy), fit=fit_x, weights=w,
                                      precision=precision, out=out, condensed=condensed, devices=ids,
                                      check_names=check_names)
        else:
            import cupy as cp

            with cp.cuda.Device(ids[0]):
                res = _pairwise_cuda(xx, yy, fit=fit_x, weights=w, precision=precision, out=out,
                                     condensed=condensed, host_result=host_result, check_names=check_names)
    elif devices is not None:
        raise InputError("devices= is for GPU runs (device='gpu' or 'auto' with a GPU)")
    else:
        if not isinstance(xx, np.ndarray):
            xx = np.asarray(be.asarray(xx))
        if yy is not None and not isinstance(yy, np.ndarray):
            yy = np.asarray(be.asarray(yy))
        res = _pairwise_numpy(xx, yy, fit=fit_x, weights=w, precision=precision, out=out, condensed=condensed)
    if out is not None:
        return out
    return be.wrap(res)

