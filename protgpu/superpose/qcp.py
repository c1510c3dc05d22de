"""Theobald's QCP in NumPy, vectorised over pairs: the one CPU implementation of the optimal
superposition of two centred point sets from their 3 x 3 correlation ``M`` and traces ``G_A``, ``G_B``.

Steps: the key matrix ``K(M)`` (:func:`key_matrix`), the quartic's coefficients (:func:`coefficients`),
its largest root by guarded Newton (:func:`newton_start`, :func:`newton`), the unit quaternion of the
rotation (:func:`quaternion`: adjugate column, Jacobi at a near-repeated root), the rotation
(:func:`quaternion_to_rotation`) and the RMSD (:func:`rmsd_from_lambda`). :func:`rmsd_and_rotation`,
:func:`rmsd_only` and :func:`top_quaternion` are the entry points the rest of protgpu uses
(:mod:`protgpu.superpose`, :mod:`protgpu.scoring`). ``kernels/qcp.cuh`` is the device twin: the
constants below are passed to it as ``#define``s, so both take the same branches. The accuracy
decisions are explained in ``docs/design/qcp.md``.

Every function takes float64 arrays of any (equal) shape unless it says otherwise.
"""

from __future__ import annotations

import numpy as np

# Numerical constants of the QCP step (kernels/qcp.cuh holds the same defaults; protgpu.superpose.kernels
# passes these values as #defines).
MAX_ITERS = 60  # Newton steps at most (a double root converges linearly: ~50 halvings to eps)
SLOW_ITERS = 12  # more steps than this means a near-repeated root: refine by the Rayleigh quotient
NEWTON_RTOL = 1e-14  # stop when a step is at most this fraction of (G_A + G_B) / 2
# Scale: hi = min((G_A + G_B) / 2, sqrt(3) |M|_F), the Newton start (an upper bound of l_max).
NEWTON_FLAT = 1e-8  # no Newton step where P' <= this * hi^3: P, P' are rounding noise there
# Adjugate column norm (or |P'(l)|) below this * hi^3: l_max is within ~1e-3 hi of a second eigenvalue,
# where rounding noise (~eps hi^4 / |P'|) could mix the two eigenvectors; Jacobi resolves the
# eigenvalues to eps |K| whatever their multiplicity.
ADJ_TINY = 1e-3
JACOBI_SWEEPS = 10  # cyclic Jacobi sweeps on the 4 x 4 key matrix (converges in ~5)
# RMSD^2 at most this fraction of (G_A + G_B) / W: re-measure on the coordinates (:func:`near_identical`).
DIRECT_TAU = 1e-6

# Sizes of the vectorised NumPy work (none depends on the thread count, so neither do the results).
CHUNK_PAIRS = 8192  # pairs (or frames) per vectorised QCP call: ~30 float64 temporaries in cache
CACHE_CHUNK_BYTES = 8 << 20  # float64 working set of one chunk of frames (centring, moments, moving)


def key_matrix(s):
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


def det4_sym(k):
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


def coefficients(s):
    """Coefficients ``C2, C1, C0`` of the characteristic polynomial ``l^4 + C2 l^2 + C1 l + C0`` of
    K(M), and K itself (10 entries). ``C2 = -2 sum S^2``, ``C1 = -8 det M``, ``C0 = det K``."""
    sxx, sxy, sxz, syx, syy, syz, szx, szy, szz = s
    c2 = -2.0 * (sxx * sxx + sxy * sxy + sxz * sxz + syx * syx + syy * syy + syz * syz
                 + szx * szx + szy * szy + szz * szz)
    det_m = (sxx * (syy * szz - syz * szy) - sxy * (syx * szz - syz * szx) + sxz * (syx * szy - syy * szx))
    k = key_matrix(s)
    return c2, -8.0 * det_m, det4_sym(k), k


def newton_start(c2, lam0):
    """Newton's start and the problem's scale: the smaller of two upper bounds of ``l_max``,
    ``(G_A + G_B) / 2`` (tight for similar structures) and the nuclear-norm bound
    ``sqrt(3) |M|_F = sqrt(-1.5 C2)`` (tight for dissimilar ones, where the first would cost ~15
    Newton steps instead of ~6). Every term of the quartic is at most ~ this to the 4th power, so it
    also sets the size of the rounding noise the thresholds below are relative to."""
    return np.minimum(lam0, np.sqrt(np.maximum(-1.5 * c2, 0.0)))


def newton_step(lam, c2, c1, c0, tol, flat):
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


def newton(c2, c1, c0, lam0, hi):
    """Largest root of the QCP quartic by Newton's method from ``hi`` (:func:`newton_start`).

    Returns ``(lam, iters)``, both of the shape of the inputs (1-D); ``iters`` counts the loop passes,
    as the kernel does. An entry stops at the pass that finishes it (as the kernel's thread exits): its
    value is stored and it leaves the working set, which is compacted only on the (few) passes where
    some entries finish and others go on; ~19 ufunc calls per pass and no ``np.where`` (whose
    per-element branches cost as much as the arithmetic).
    """
    shape = np.shape(hi)
    lam = np.array(hi, dtype=np.float64).reshape(-1)
    iters = np.full(lam.shape, MAX_ITERS, dtype=np.int32)
    wl = lam.copy()
    wc2, wc1, wc0 = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (c2, c1, c0))
    wtol = NEWTON_RTOL * np.abs(np.asarray(lam0, dtype=np.float64).reshape(-1))
    wflat = NEWTON_FLAT * wl * wl * wl
    idx = None  # positions of the working set in ``lam`` (None: all, in order)
    with np.errstate(divide="ignore", invalid="ignore"):
        for it in range(1, MAX_ITERS + 1):
            cont = newton_step(wl, wc2, wc1, wc0, wtol, wflat)
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
    lam[slice(None) if idx is None else idx] = wl  # entries still going after MAX_ITERS passes
    return lam.reshape(shape), iters.reshape(shape)


def adjugate_rows(k, lam):
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


def jacobi_top_eigenvector(k):
    """Unit eigenvector of the largest eigenvalue of K (10 entries, 1-D arrays of length P) by cyclic
    Jacobi rotations; shape (P, 4). Robust to repeated eigenvalues; same sweeps as the kernel."""
    n = len(k[0])
    a = np.empty((n, 4, 4))
    pos = ((0, 0), (0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (3, 3))
    for (i, j), v in zip(pos, k, strict=True):
        a[:, i, j] = v
        a[:, j, i] = v
    vec = np.broadcast_to(np.eye(4), (n, 4, 4)).copy()
    for _ in range(JACOBI_SWEEPS):
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


def quaternion(k, lam, scale):
    """Unit quaternion (P, 4) of the optimal rotation, from the largest-norm column of
    adj(K - lam I); Jacobi on K where that column is tiny (repeated ``l_max``)."""
    rows = adjugate_rows(k, lam)
    norms = np.stack([r[0] * r[0] + r[1] * r[1] + r[2] * r[2] + r[3] * r[3] for r in rows])  # (4, P)
    best = np.argmax(norms, axis=0)
    ar = np.arange(best.size)
    q = np.stack([np.stack(r) for r in rows])[best, :, ar]  # (P, 4)
    nrm2 = norms[best, ar]
    thr = ADJ_TINY * scale * scale * scale
    tiny = ~(nrm2 > thr * thr)  # also catches an all-zero K (scale 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = q / np.sqrt(np.where(tiny, 1.0, nrm2))[:, None]
    if tiny.any():
        sub = [v[tiny] for v in k]
        q[tiny] = jacobi_top_eigenvector(sub)
    return q


def rayleigh(k, q):
    """``q^T K q`` for unit quaternions q (P, 4)."""
    k00, k01, k02, k03, k11, k12, k13, k22, k23, k33 = k
    q0, q1, q2, q3 = q[:, 0], q[:, 1], q[:, 2], q[:, 3]
    return (k00 * q0 * q0 + k11 * q1 * q1 + k22 * q2 * q2 + k33 * q3 * q3
            + 2.0 * (k01 * q0 * q1 + k02 * q0 * q2 + k03 * q0 * q3 + k12 * q1 * q2 + k13 * q1 * q3
                     + k23 * q2 * q3))


def quaternion_to_rotation(q):
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


def rmsd_from_lambda(gsum, lam, inv_w):
    """``sqrt(max(0, (G_A + G_B - 2 lam) / W))`` with ``gsum = G_A + G_B``; NaN stays NaN (np.maximum
    propagates it)."""
    e = gsum - 2.0 * lam
    e *= inv_w
    np.maximum(e, 0.0, out=e)
    return np.sqrt(e, out=e)


def top_quaternion(m, lam0=None):
    """Unit quaternion (P, 4) float64 of the optimal rotation for ``m`` (P, 3, 3) float64 (``M = sum w
    x y^T`` of centred sets), and K's 10 entries.

    ``lam0`` (P,) is ``(G_A + G_B) / 2``, Newton's start bound and the scale of its tolerances. None
    (the G's unknown, e.g. a fit from sums only, ``protgpu.scoring._kabsch``): the other bound
    ``sqrt(3) |M|_F`` serves as both.
    """
    s = [m[:, i, j] for i in range(3) for j in range(3)]
    c2, c1, c0, k = coefficients(s)
    if lam0 is None:
        lam0 = np.sqrt(np.maximum(-1.5 * c2, 0.0))
    hi = newton_start(c2, lam0)
    lam, _ = newton(c2, c1, c0, lam0, hi)
    return quaternion(k, lam, hi), k


def rmsd_and_rotation(m, ga, gb, inv_w):
    """QCP with the rotation: ``m`` (P, 3, 3) float64, ``ga`` (P,), ``gb`` scalar or (P,), ``inv_w``
    scalar or (P,).

    Returns ``(rmsd (P,), rotation (P, 3, 3))``; the RMSD is that of the returned rotation
    (Rayleigh quotient of its quaternion).
    """
    gsum = ga + gb
    q, k = top_quaternion(m, 0.5 * gsum)
    return rmsd_from_lambda(gsum, rayleigh(k, q), inv_w), quaternion_to_rotation(q)


def rmsd_only(s, gsum, inv_w):
    """QCP RMSD without the rotation (all-vs-all): ``s`` 9 float64 arrays (P,) (the entries of M),
    ``gsum`` (P,) float64 ``G_A + G_B`` of each pair. Returns the RMSDs (P,) float64.

    Pairs at a near-repeated root (Newton slow, or the polynomial flat at its result) are refined by
    the Rayleigh quotient of their quaternion, as the kernel does.
    """
    c2, c1, c0, k = coefficients(s)
    lam0 = 0.5 * gsum
    hi = newton_start(c2, lam0)
    lam, iters = newton(c2, c1, c0, lam0, hi)
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
    thr = ADJ_TINY * hi
    thr *= hi
    thr *= hi
    slow = dp > thr
    np.logical_not(slow, out=slow)
    slow &= hi > 0
    slow |= iters > SLOW_ITERS
    if slow.any():
        ks = [v[slow] for v in k]
        q = quaternion(ks, lam[slow], hi[slow])
        lam[slow] = rayleigh(ks, q)
    return rmsd_from_lambda(gsum, lam, inv_w)


def near_identical(rmsd, gsum, inv_w):
    """Where the QCP formula has cancelled away most of its digits: ``rmsd^2 <= DIRECT_TAU gsum / W``.

    Such sets (self and near-duplicate frames, < ~0.03 Angstrom for a protein) are re-measured on the
    coordinates with the fitted rotation by the callers that have them (see ``docs/design/qcp.md``).

    Parameters
    ----------
    rmsd : np.ndarray, shape (P,), float64
        RMSDs from :func:`rmsd_and_rotation`, Angstrom.
    gsum : np.ndarray, shape (P,) or scalar, float64
        ``G_A + G_B`` of each pair, Angstrom^2 (weighted).
    inv_w : float or np.ndarray (P,)
        ``1 / W``, the inverse total weight.

    Returns
    -------
    np.ndarray of bool, shape (P,)
        False where ``rmsd`` is NaN.
    """
    return rmsd * rmsd <= DIRECT_TAU * gsum * inv_w
