"""The fast CPU paths of TM-score and lDDT: numba-compiled loops, one model per call, models spread over
the process's cores. Optional: without numba (the ``fast`` extra) the NumPy twins run instead.

The NumPy twins (:func:`protgpu.scoring.tmscore.tm_search_numpy`,
:func:`protgpu.scoring.lddt.lddt_counts_numpy`) stay the specification; this module follows them step
by step (same seeds, cutoffs, relaxation, rounds, tie rule; the same QCP as
:mod:`protgpu.superpose.qcp`, scalar). Only the order of a few float64 sums differs (a loop here, BLAS
or pairwise sums there), so TM-scores agree to ~1e-12 and lDDT counts exactly. Why numba and not more
batched NumPy: ``docs/design/cpu-speed.md``.

Each model is computed by one thread from start to end, so a model's numbers never depend on how many
threads run or which models share a call. ``PROTGPU_NUMBA=0`` turns the fast paths off.
"""

from __future__ import annotations

import importlib.util
import math
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .._threads import cpu_threads, run_tasks
from ..superpose import qcp as _q

#: Whether numba can be imported (it is imported, and the loops below compiled, on first use only:
#: importing numba takes ~0.5 s or more, which ``import protgpu`` should not pay).
AVAILABLE = importlib.util.find_spec("numba") is not None
#: False turns the fast paths off for this process (tests compare both; ``PROTGPU_NUMBA=0`` at start).
ENABLED = AVAILABLE and os.environ.get("PROTGPU_NUMBA", "1") != "0"


_IMPORTABLE: bool | None = None  # numba imported without error (checked on first use)


def enabled() -> bool:
    """Whether :func:`tm_search` and :func:`lddt_counts` may be used (numba importable, not switched off).
    An installed numba that fails to import (one built for an older NumPy, say) turns the fast paths off
    with one warning: the NumPy twins give the same numbers."""
    global _IMPORTABLE
    if not (ENABLED and AVAILABLE):
        return False
    if _IMPORTABLE is None:
        try:
            import numba  # noqa: F401
        except Exception as exc:  # ImportError, or numba's own check of the NumPy version
            warnings.warn(f"numba is installed but cannot be imported ({type(exc).__name__}: {exc}); "
                          "protgpu uses its NumPy scoring paths (same numbers, slower)", stacklevel=3)
            _IMPORTABLE = False
        else:
            _IMPORTABLE = True
    return _IMPORTABLE


class Loops:
    """The loop functions of one module that :meth:`compile` replaces by numba dispatchers, once, in the
    module's namespace: numba resolves callees by their global names when it compiles a first call, so
    all are replaced before any is called. ``jit`` marks a loop; ``jit_sum`` one whose sums may be
    reassociated (vectorised): the same compiled order whatever the thread count, within ~1e-15
    relative of the NumPy twin's BLAS / pairwise sums (which differ from a plain loop anyway)."""

    def __init__(self, namespace: dict, after=None):
        self._ns, self._after = namespace, after  # after: a callable compiling the loops these call
        self._flags: dict = {}  # name -> numba fastmath flags
        self._lock = threading.Lock()
        self._ready = False

    def jit(self, fn):
        self._flags[fn.__name__] = False
        return fn

    def jit_sum(self, fn):
        self._flags[fn.__name__] = {"reassoc", "nsz"}
        return fn

    def compile(self) -> None:
        if self._ready:  # the common case, ~100 times per TM-align pair: no lock
            return
        if self._after is not None:
            self._after()
        with self._lock:
            if self._ready:
                return
            import numba

            for name, fastmath in self._flags.items():
                if not hasattr(self._ns[name], "py_func"):
                    self._ns[name] = numba.njit(cache=True, nogil=True, error_model="numpy",
                                                fastmath=fastmath)(self._ns[name])
            self._ready = True


_LOOPS = Loops(globals())
_jit, _jit_sum, _compile = _LOOPS.jit, _LOOPS.jit_sum, _LOOPS.compile


_MAX_ITERS = _q.MAX_ITERS
_NEWTON_RTOL = _q.NEWTON_RTOL
_NEWTON_FLAT = _q.NEWTON_FLAT
_ADJ_TINY = _q.ADJ_TINY
_JACOBI_SWEEPS = _q.JACOBI_SWEEPS
_MAXSUB_D0SQ = 3.5 * 3.5  # tmscore._MAXSUB_D0SQ and _MAX_ROUNDS (compile-time constants here)
_MAX_ROUNDS = 20


# --------------------------------------------------------------------------------------------------
# QCP, one fit at a time (the scalar form of protgpu.superpose.qcp.top_quaternion)


@_jit
def _jacobi_top(k, q):
    a = np.empty((4, 4))
    idx = 0
    for i in range(4):
        for j in range(i, 4):
            a[i, j] = k[idx]
            a[j, i] = k[idx]
            idx += 1
    v = np.eye(4)
    for _ in range(_JACOBI_SWEEPS):
        for p in range(3):
            for r in range(p + 1, 4):
                apq = a[p, r]
                if apq != 0.0:
                    theta = (a[r, r] - a[p, p]) / (2.0 * apq)
                    if abs(theta) > 1e100:
                        t = 0.5 / theta
                    else:
                        t = math.copysign(1.0, theta) / (abs(theta) + math.sqrt(theta * theta + 1.0))
                else:
                    t = 0.0
                c = 1.0 / math.sqrt(t * t + 1.0)
                s = t * c
                for i in range(4):
                    ap, aq = a[i, p], a[i, r]
                    a[i, p] = c * ap - s * aq
                    a[i, r] = s * ap + c * aq
                for i in range(4):
                    ap, aq = a[p, i], a[r, i]
                    a[p, i] = c * ap - s * aq
                    a[r, i] = s * ap + c * aq
                for i in range(4):
                    vp, vq = v[i, p], v[i, r]
                    v[i, p] = c * vp - s * vq
                    v[i, r] = s * vp + c * vq
    best = 0
    for i in range(1, 4):
        if a[i, i] > a[best, best]:
            best = i
    for i in range(4):
        q[i] = v[i, best]


@_jit
def _fit_from_sums(n, sx, sy, sxy, rot, trans, kbuf, q, rows):
    """superpose_from_sums for one subset: rot (3, 3), trans (3,) written in place."""
    if n > 0:
        cx0, cx1, cx2 = sx[0] / n, sx[1] / n, sx[2] / n
        cy0, cy1, cy2 = sy[0] / n, sy[1] / n, sy[2] / n
    else:
        cx0, cx1, cx2 = sx[0], sx[1], sx[2]
        cy0, cy1, cy2 = sy[0], sy[1], sy[2]
    cx = (cx0, cx1, cx2)
    cy = (cy0, cy1, cy2)
    # the centred cross-covariance, as superpose_from_sums: sxy - (n cx_i) cy_j
    sxx, sxy_, sxz = sxy[0] - n * cx0 * cy0, sxy[1] - n * cx0 * cy1, sxy[2] - n * cx0 * cy2
    syx, syy, syz = sxy[3] - n * cx1 * cy0, sxy[4] - n * cx1 * cy1, sxy[5] - n * cx1 * cy2
    szx, szy, szz = sxy[6] - n * cx2 * cy0, sxy[7] - n * cx2 * cy1, sxy[8] - n * cx2 * cy2
    c2 = -2.0 * (sxx * sxx + sxy_ * sxy_ + sxz * sxz + syx * syx + syy * syy + syz * syz
                 + szx * szx + szy * szy + szz * szz)
    det_m = (sxx * (syy * szz - syz * szy) - sxy_ * (syx * szz - syz * szx) + sxz * (syx * szy - syy * szx))
    c1 = -8.0 * det_m
    k00, k01, k02, k03 = sxx + syy + szz, syz - szy, szx - sxz, sxy_ - syx
    k11, k12, k13 = sxx - syy - szz, sxy_ + syx, szx + sxz
    k22, k23 = -sxx + syy - szz, syz + szy
    k33 = -sxx - syy + szz
    d0 = k00 * k11 - k01 * k01
    d1 = k00 * k12 - k01 * k02
    d2 = k00 * k13 - k01 * k03
    d3 = k01 * k12 - k11 * k02
    d4 = k01 * k13 - k11 * k03
    d5 = k02 * k13 - k12 * k03
    e5 = k22 * k33 - k23 * k23
    e4 = k12 * k33 - k13 * k23
    e3 = k12 * k23 - k13 * k22
    e2 = k02 * k33 - k03 * k23
    e1 = k02 * k23 - k03 * k22
    e0 = k02 * k13 - k03 * k12
    c0 = d0 * e5 - d1 * e4 + d2 * e3 + d3 * e2 - d4 * e1 + d5 * e0
    lam0 = math.sqrt(max(-1.5 * c2, 0.0))
    hi = min(lam0, math.sqrt(max(-1.5 * c2, 0.0)))
    lam = hi
    tol = _NEWTON_RTOL * abs(lam0)
    flat = _NEWTON_FLAT * hi * hi * hi
    for _ in range(_MAX_ITERS):  # protgpu.superpose.qcp.newton_step, same operation order
        l2 = lam * lam
        b = (l2 + c2) * lam
        a = b + c1
        p = a * lam + c0
        dp = 2.0 * l2 * lam + b + a
        ok = dp > flat
        step = p / dp if dp != 0.0 else math.nan
        if step > 0 and ok:
            lam = lam - step
        if not (step > tol and ok):
            break
    # quaternion from the largest-norm column of adj(K - lam I) (qcp.adjugate_rows)
    a00, a11, a22, a33 = k00 - lam, k11 - lam, k22 - lam, k33 - lam
    a01, a02, a03, a12, a13, a23 = k01, k02, k03, k12, k13, k23
    s0 = a00 * a11 - a01 * a01
    s1 = a00 * a12 - a01 * a02
    s2 = a00 * a13 - a01 * a03
    s3 = a01 * a12 - a11 * a02
    s4 = a01 * a13 - a11 * a03
    s5 = a02 * a13 - a12 * a03
    g5 = a22 * a33 - a23 * a23
    g4 = a12 * a33 - a13 * a23
    g3 = a12 * a23 - a13 * a22
    g2 = a02 * a33 - a03 * a23
    g1 = a02 * a23 - a03 * a22
    g0 = a02 * a13 - a03 * a12
    rows[0, 0] = a11 * g5 - a12 * g4 + a13 * g3
    rows[0, 1] = -a01 * g5 + a02 * g4 - a03 * g3
    rows[0, 2] = a13 * s5 - a23 * s4 + a33 * s3
    rows[0, 3] = -a12 * s5 + a22 * s4 - a23 * s3
    rows[1, 0] = -a01 * g5 + a12 * g2 - a13 * g1
    rows[1, 1] = a00 * g5 - a02 * g2 + a03 * g1
    rows[1, 2] = -a03 * s5 + a23 * s2 - a33 * s1
    rows[1, 3] = a02 * s5 - a22 * s2 + a23 * s1
    rows[2, 0] = a01 * g4 - a11 * g2 + a13 * g0
    rows[2, 1] = -a00 * g4 + a01 * g2 - a03 * g0
    rows[2, 2] = a03 * s4 - a13 * s2 + a33 * s0
    rows[2, 3] = -a02 * s4 + a12 * s2 - a23 * s0
    rows[3, 0] = -a01 * g3 + a11 * g1 - a12 * g0
    rows[3, 1] = a00 * g3 - a01 * g1 + a02 * g0
    rows[3, 2] = -a03 * s3 + a13 * s1 - a23 * s0
    rows[3, 3] = a02 * s3 - a12 * s1 + a22 * s0
    best = 0
    nrm2 = rows[0, 0] * rows[0, 0] + rows[0, 1] * rows[0, 1] + rows[0, 2] * rows[0, 2] + rows[0, 3] * rows[0, 3]
    for r in range(1, 4):  # np.argmax: the first largest
        v = rows[r, 0] * rows[r, 0] + rows[r, 1] * rows[r, 1] + rows[r, 2] * rows[r, 2] + rows[r, 3] * rows[r, 3]
        if v > nrm2:
            best, nrm2 = r, v
    thr = _ADJ_TINY * hi * hi * hi
    if not (nrm2 > thr * thr):
        kbuf[0], kbuf[1], kbuf[2], kbuf[3], kbuf[4] = k00, k01, k02, k03, k11
        kbuf[5], kbuf[6], kbuf[7], kbuf[8], kbuf[9] = k12, k13, k22, k23, k33
        _jacobi_top(kbuf, q)
    else:
        inv = 1.0 / math.sqrt(nrm2)
        for i in range(4):
            q[i] = rows[best, i] * inv
    w, x, y, z = q[0], q[1], q[2], q[3]
    if n > 0:
        rot[0, 0] = w * w + x * x - y * y - z * z
        rot[0, 1] = 2.0 * (x * y - w * z)
        rot[0, 2] = 2.0 * (x * z + w * y)
        rot[1, 0] = 2.0 * (x * y + w * z)
        rot[1, 1] = w * w - x * x + y * y - z * z
        rot[1, 2] = 2.0 * (y * z - w * x)
        rot[2, 0] = 2.0 * (x * z - w * y)
        rot[2, 1] = 2.0 * (y * z + w * x)
        rot[2, 2] = w * w - x * x - y * y + z * z
    else:
        for i in range(3):
            for j in range(3):
                rot[i, j] = 1.0 if i == j else 0.0
    for i in range(3):
        trans[i] = cy[i] - (rot[i, 0] * cx[0] + rot[i, 1] * cx[1] + rot[i, 2] * cx[2])


# --------------------------------------------------------------------------------------------------
# TM-score search of one model


@_jit_sum
def _fit_subset(x, y, sel, start, length, rot, trans, kbuf, q, rows, wk):
    """Fit on the pairs where ``sel`` is True (``length`` < 0) or on the fragment [start, start+length).

    ``x``, ``y``: (3, n) centred coordinates (rows of x, y, z: the loops below vectorise)."""
    n = s0 = s1 = s2 = t0 = t1 = t2 = 0.0
    m00 = m01 = m02 = m10 = m11 = m12 = m20 = m21 = m22 = 0.0
    lo, hi = (0, x.shape[1]) if length < 0 else (start, start + length)
    for p in range(lo, hi):
        w = 1.0 if length >= 0 or sel[p] else 0.0  # a 0 weight adds +0.0: the same sums as skipping
        a0, a1, a2 = w * x[0, p], w * x[1, p], w * x[2, p]
        b0, b1, b2 = y[0, p], y[1, p], y[2, p]
        n += w
        s0 += a0
        s1 += a1
        s2 += a2
        t0 += w * b0
        t1 += w * b1
        t2 += w * b2
        m00 += a0 * b0
        m01 += a0 * b1
        m02 += a0 * b2
        m10 += a1 * b0
        m11 += a1 * b1
        m12 += a1 * b2
        m20 += a2 * b0
        m21 += a2 * b1
        m22 += a2 * b2
    wk[0], wk[1], wk[2], wk[3], wk[4], wk[5] = s0, s1, s2, t0, t1, t2
    wk[6], wk[7], wk[8], wk[9], wk[10], wk[11], wk[12], wk[13], wk[14] = m00, m01, m02, m10, m11, m12, m20, m21, m22
    _fit_from_sums(n, wk[0:3], wk[3:6], wk[6:15], rot, trans, kbuf, q, rows)


@_jit
def _dist2(x, y, rot, trans, d2):
    r00, r01, r02, r10, r11, r12, r20, r21, r22 = (rot[0, 0], rot[0, 1], rot[0, 2], rot[1, 0], rot[1, 1],
                                                   rot[1, 2], rot[2, 0], rot[2, 1], rot[2, 2])
    u0, u1, u2 = trans[0], trans[1], trans[2]
    for p in range(x.shape[1]):
        a0, a1, a2 = x[0, p], x[1, p], x[2, p]
        v0 = r00 * a0 + r01 * a1 + r02 * a2 + u0 - y[0, p]
        v1 = r10 * a0 + r11 * a1 + r12 * a2 + u1 - y[1, p]
        v2 = r20 * a0 + r21 * a1 + r22 * a2 + u2 - y[2, p]
        d2[p] = v0 * v0 + v1 * v1 + v2 * v2


@_jit
def _select(d2, dcut, sel):
    """tmscore._select for one task: d < dcut, relaxed by 0.5 A while fewer than 3 pass (n > 3)."""
    n = d2.shape[0]
    cnt = 0
    c2 = dcut * dcut
    for p in range(n):
        sel[p] = d2[p] < c2
        cnt += sel[p]
    if n <= 3 or cnt >= 3:
        return
    # third smallest finite distance (NaN sorts last)
    m0 = m1 = m2 = math.inf
    nfin = 0
    for p in range(n):
        v = d2[p]
        if not math.isfinite(v):
            continue
        nfin += 1
        if v < m0:
            m0, m1, m2 = v, m0, m1
        elif v < m1:
            m1, m2 = v, m1
        elif v < m2:
            m2 = v
    if nfin < 3:
        for p in range(n):
            sel[p] = math.isfinite(d2[p])
        return
    third = m2
    inc = max(math.floor((math.sqrt(third) - dcut) / 0.5), 0.0) + 1.0
    for _ in range(4):
        if (dcut + inc * 0.5) ** 2 <= third:
            inc += 1.0
        if inc > 1.0 and (dcut + (inc - 1.0) * 0.5) ** 2 > third:
            inc -= 1.0
    dd = dcut + inc * 0.5
    dd2 = dd * dd
    for p in range(n):
        sel[p] = d2[p] < dd2


@_jit_sum
def _gdt_update(d2, cuts2, gdt, maxsub):
    """Raise the GDT counts (pairs within 0.5, 1, 2, 4, 8 A) and MaxSub's best sum by this superposition."""
    c0, c1, c2, c3, c4 = cuts2[0], cuts2[1], cuts2[2], cuts2[3], cuts2[4]
    k0 = k1 = k2 = k3 = k4 = 0
    ms = 0.0
    for p in range(d2.shape[0]):
        v = d2[p]
        k0 += v < c0
        k1 += v < c1
        k2 += v < c2
        k3 += v < c3
        k4 += v < c4
        ms += 1.0 / (1.0 + v / _MAXSUB_D0SQ) if v < _MAXSUB_D0SQ else 0.0
    gdt[0] = max(gdt[0], k0)
    gdt[1] = max(gdt[1], k1)
    gdt[2] = max(gdt[2], k2)
    gdt[3] = max(gdt[3], k3)
    gdt[4] = max(gdt[4], k4)
    return max(maxsub, ms)


@_jit_sum
def _score(d2, d0sq, inv_l):
    s = 0.0
    for p in range(d2.shape[0]):
        s += 1.0 / (1.0 + d2[p] / d0sq)
    return s * inv_l


@_jit
def _search_model(x0, y0, dsearch1, dsearch2, d0, inv_l, stage1, seeds, cuts2, out_rt, gdt):
    """Both searches of tmscore._search_one for one model; returns (score, maxsub); rotation and
    translation go to out_rt[:9], out_rt[9:], GDT counts to ``gdt``."""
    n = x0.shape[0]
    cx = np.zeros(3)
    cy = np.zeros(3)
    for p in range(n):
        for i in range(3):
            cx[i] += x0[p, i]
            cy[i] += y0[p, i]
    for i in range(3):
        cx[i] /= n
        cy[i] /= n
    x = np.empty((3, n))  # centred, one row per axis
    y = np.empty((3, n))
    for p in range(n):
        for i in range(3):
            x[i, p] = x0[p, i] - cx[i]
            y[i, p] = y0[p, i] - cy[i]
    d0sq = d0 * d0
    best = -1.0
    brot = np.eye(3)
    btr = np.zeros(3)
    maxsub = 0.0
    rot = np.empty((3, 3))
    trans = np.empty(3)
    kbuf = np.empty(10)
    q = np.empty(4)
    rows = np.empty((4, 4))
    wk = np.empty(15)
    d2 = np.empty(n)
    cur = np.empty(n, dtype=np.bool_)
    new = np.empty(n, dtype=np.bool_)
    n_stages = 2 if stage1 else 1
    for si in range(n_stages):
        stage = 2 if si == 0 else 1
        dsr = dsearch2 if stage == 2 else dsearch1
        for t in range(seeds.shape[0]):
            _fit_subset(x, y, cur, seeds[t, 1], seeds[t, 0], rot, trans, kbuf, q, rows, wk)
            _dist2(x, y, rot, trans, d2)
            _select(d2, dsr - 1.0, cur)
            maxsub = _gdt_update(d2, cuts2, gdt, maxsub)
            bs = -1.0
            if stage == 2:
                bs = _score(d2, d0sq, inv_l)
                if bs > best:
                    best = bs
                    brot[:, :] = rot
                    btr[:] = trans
            for _ in range(_MAX_ROUNDS):
                _fit_subset(x, y, cur, 0, -1, rot, trans, kbuf, q, rows, wk)
                _dist2(x, y, rot, trans, d2)
                _select(d2, dsr + 1.0, new)
                if stage == 1:
                    maxsub = _gdt_update(d2, cuts2, gdt, maxsub)
                else:
                    sc = _score(d2, d0sq, inv_l)
                    if sc > bs:
                        bs = sc
                        if sc > best:
                            best = sc
                            brot[:, :] = rot
                            btr[:] = trans
                same = True
                for p in range(n):
                    if new[p] != cur[p]:
                        same = False
                    cur[p] = new[p]
                if same:
                    break
    for i in range(3):
        for j in range(3):
            out_rt[3 * i + j] = brot[i, j]
        out_rt[9 + i] = btr[i] + cy[i] - (brot[i, 0] * cx[0] + brot[i, 1] * cx[1] + brot[i, 2] * cx[2])
    return best, maxsub


@_jit
def _search_models(x, y, n_ali, params, stage1, m0, m1, seeds_all, seed_ptr, cuts2, score, rt, gdt, maxsub):
    y_step = y.shape[0] > 1
    for m in range(m0, m1):
        n = n_ali[m]
        ym = y[m if y_step else 0, :n]
        seeds = seeds_all[seed_ptr[m]:seed_ptr[m + 1]]
        s, ms = _search_model(x[m, :n], ym, params[m, 0], params[m, 1], params[m, 2], params[m, 3], stage1,
                              seeds, cuts2, rt[m], gdt[m])
        score[m] = s
        maxsub[m] = ms


def _pool_run(m_total: int, fn, per_task: int = 4):
    """``fn(m0, m1)`` over model ranges, on ``cpu_threads()`` threads (numba releases the GIL)."""
    threads = min(cpu_threads(), max(1, m_total))
    step = max(1, min(per_task, -(-m_total // threads)))
    ranges = [(m0, min(m_total, m0 + step)) for m0 in range(0, m_total, step)]
    if threads == 1 or len(ranges) < 2:
        run_tasks(None, lambda r: fn(*r), ranges)
        return
    with ThreadPoolExecutor(threads) as pool:
        run_tasks(pool, lambda r: fn(*r), ranges)


def tm_search(x, y, n_ali, params, *, stage1: bool = True) -> dict:
    """:func:`protgpu.scoring.tmscore.tm_search_numpy`, compiled (same arguments and result)."""
    from .tmscore import _GDT_CUTS2, seed_fragments

    _compile()
    x = np.ascontiguousarray(x, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    params = np.ascontiguousarray(params, dtype=np.float64)
    n_ali = np.ascontiguousarray(n_ali, dtype=np.int64)
    m_total = x.shape[0]
    cache: dict = {}
    parts = [cache.setdefault(int(n), seed_fragments(int(n))) for n in n_ali]
    seed_ptr = np.zeros(m_total + 1, dtype=np.int64)
    seed_ptr[1:] = np.cumsum([len(p) for p in parts])
    seeds_all = np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)
    score = np.zeros(m_total)
    rt = np.zeros((m_total, 12))
    gdt = np.zeros((m_total, 5), np.int64)
    maxsub = np.zeros(m_total)
    _pool_run(m_total, lambda m0, m1: _search_models(x, y, n_ali, params, bool(stage1), m0, m1, seeds_all,
                                                     seed_ptr, _GDT_CUTS2, score, rt, gdt, maxsub))
    return {"score": score, "rotation": np.ascontiguousarray(rt[:, :9].reshape(m_total, 3, 3)),
            "translation": np.ascontiguousarray(rt[:, 9:]), "gdt_counts": gdt, "maxsub_sum": maxsub}


# --------------------------------------------------------------------------------------------------
# lDDT counts


@_jit
def _d(x, a, b):
    d0 = x[a, 0] - x[b, 0]
    d1 = x[a, 1] - x[b, 1]
    d2 = x[a, 2] - x[b, 2]
    return math.sqrt(d0 * d0 + d1 * d1 + d2 * d2)


@_jit
def _cons(dm, dref, th):
    dev = abs(dm - dref)
    c = 0
    for t in th:
        c += dev <= t
    return c


@_jit
def _lddt_models(coords, m0, m1, pi, pj, ri, rj, dref, th, atom_res, symmetry, ent_atom, ent_swap,
                 ent_partner, ent_dref, ent_group, n_groups, tup_a, tup_b, tup_group, out):
    n_atoms = coords.shape[1]
    n_res = out.shape[1]
    x = np.empty((n_atoms, 3))
    s1 = np.zeros(n_groups, dtype=np.int64)
    s2 = np.zeros(n_groups, dtype=np.int64)
    for m in range(m0, m1):
        x[:, :] = coords[m]
        if symmetry and n_groups > 0:
            s1[:] = 0
            s2[:] = 0
            for e in range(ent_atom.shape[0]):
                a, b, p = ent_atom[e], ent_swap[e], ent_partner[e]
                if math.isnan(x[a, 0]) or math.isnan(x[b, 0]):
                    continue
                g = ent_group[e]
                s1[g] += _cons(_d(x, a, p), ent_dref[e], th)
                s2[g] += _cons(_d(x, b, p), ent_dref[e], th)
            for k in range(tup_a.shape[0]):
                a, b = tup_a[k], tup_b[k]
                if s2[tup_group[k]] > s1[tup_group[k]] and not math.isnan(x[a, 0]) and not math.isnan(x[b, 0]):
                    for i in range(3):
                        v = x[a, i]
                        x[a, i] = x[b, i]
                        x[b, i] = v
        row = out[m]
        row[:] = 0
        for k in range(pi.shape[0]):
            c = _cons(_d(x, pi[k], pj[k]), dref[k], th)
            row[ri[k]] += c
            row[rj[k]] += c
        here = np.zeros(n_res, dtype=np.bool_)
        for a in range(n_atoms):
            if not math.isnan(x[a, 0]):
                here[atom_res[a]] = True
        for r in range(n_res):
            if not here[r]:
                row[r] = -1


def lddt_counts(coords, ref, thresholds=(0.5, 1.0, 2.0, 4.0), symmetry: bool = True) -> np.ndarray:
    """:func:`protgpu.scoring.lddt.lddt_counts_numpy` for float64 coordinates, compiled (same result)."""
    _compile()
    coords = np.ascontiguousarray(coords, dtype=np.float64)
    m_total = coords.shape[0]
    th = np.asarray(thresholds, dtype=np.float64)
    out = np.zeros((m_total, ref.n_res), dtype=np.int64)
    i, j = ref.pairs[:, 0], ref.pairs[:, 1]
    args = (np.ascontiguousarray(i), np.ascontiguousarray(j), ref.atom_res[i], ref.atom_res[j],
            np.ascontiguousarray(ref.dref, dtype=np.float64), th, np.ascontiguousarray(ref.atom_res),
            bool(symmetry), ref.ent_atom, ref.ent_swap, ref.ent_partner,
            np.ascontiguousarray(ref.ent_dref, dtype=np.float64), ref.ent_group, int(ref.n_groups),
            np.ascontiguousarray(ref.tuples[:, 0]), np.ascontiguousarray(ref.tuples[:, 1]), ref.tuple_group, out)
    _pool_run(m_total, lambda m0, m1: _lddt_models(coords, m0, m1, *args))
    return out


# --------------------------------------------------------------------------------------------------
# lDDT reference: the pairs within the inclusion radius


@_jit
def cell_sort(x, lo, edge, dims):
    """A cell list of the points ``x`` (N, 3) in cells of edge ``edge`` from ``lo`` (``dims`` cells per
    axis, :func:`cell_grid`): each point's cell coordinates (N, 3), the first sorted position of each
    cell (C + 1,), the points sorted by cell, in index order within a cell (N,), and their coordinates
    in that order (N, 3). A counting sort; used here and by the complexes' contact and clash searches."""
    n = x.shape[0]
    ny, nz = dims[1], dims[2]
    n_cells = dims[0] * ny * nz
    ci = np.empty((n, 3), dtype=np.int64)
    cell = np.empty(n, dtype=np.int64)
    for a in range(n):
        for k in range(3):
            ci[a, k] = min(int((x[a, k] - lo[k]) / edge), dims[k] - 1)
        cell[a] = (ci[a, 0] * ny + ci[a, 1]) * nz + ci[a, 2]
    start = np.zeros(n_cells + 1, dtype=np.int64)
    for a in range(n):
        start[cell[a] + 1] += 1
    for c in range(n_cells):
        start[c + 1] += start[c]
    fill = start.copy()
    order = np.empty(n, dtype=np.int64)
    xs = np.empty((n, 3))
    for a in range(n):
        t = fill[cell[a]]
        order[t] = a
        xs[t, 0], xs[t, 1], xs[t, 2] = x[a, 0], x[a, 1], x[a, 2]
        fill[cell[a]] += 1
    return ci, start, order, xs


@_jit
def _pairs_cells(y, radius, origin, dims):
    """Pairs (i < j) with |y_i - y_j|^2 <= radius^2, sorted by (i, j), by a cell list of edge ``radius``."""
    n = y.shape[0]
    nx, ny, nz = dims[0], dims[1], dims[2]
    ci, start, order, _ = cell_sort(y, origin, radius, dims)
    r2 = radius * radius
    cap = max(16, 64 * n)
    out = np.empty((cap, 2), dtype=np.int64)
    k_out = 0
    buf = np.empty(n, dtype=np.int64)
    for i in range(n):
        nb = 0
        for dx in range(-1, 2):
            cx = ci[i, 0] + dx
            if cx < 0 or cx >= nx:
                continue
            for dy in range(-1, 2):
                cy = ci[i, 1] + dy
                if cy < 0 or cy >= ny:
                    continue
                for dz in range(-1, 2):
                    cz = ci[i, 2] + dz
                    if cz < 0 or cz >= nz:
                        continue
                    c = (cx * ny + cy) * nz + cz
                    for t in range(start[c], start[c + 1]):
                        j = order[t]
                        if j <= i:
                            continue
                        v0 = y[i, 0] - y[j, 0]
                        v1 = y[i, 1] - y[j, 1]
                        v2 = y[i, 2] - y[j, 2]
                        if v0 * v0 + v1 * v1 + v2 * v2 <= r2:
                            buf[nb] = j
                            nb += 1
        if k_out + nb > cap:
            cap = max(2 * cap, k_out + nb)
            grown = np.empty((cap, 2), dtype=np.int64)
            grown[:k_out] = out[:k_out]
            out = grown
        js = np.sort(buf[:nb])
        for t in range(nb):
            out[k_out, 0] = i
            out[k_out, 1] = js[t]
            k_out += 1
    return out[:k_out].copy()


@_jit
def _pairs_all(y, radius):
    """:func:`_pairs_cells` by testing every pair: fewer operations up to a few thousand atoms (no sort)."""
    n = y.shape[0]
    r2 = radius * radius
    cap = max(16, 64 * n)
    out = np.empty((cap, 2), dtype=np.int64)
    k_out = 0
    for i in range(n):
        if k_out + n - i > cap:
            cap = max(2 * cap, k_out + n - i)
            grown = np.empty((cap, 2), dtype=np.int64)
            grown[:k_out] = out[:k_out]
            out = grown
        a0, a1, a2 = y[i, 0], y[i, 1], y[i, 2]
        for j in range(i + 1, n):
            v0 = a0 - y[j, 0]
            v1 = a1 - y[j, 1]
            v2 = a2 - y[j, 2]
            if v0 * v0 + v1 * v1 + v2 * v2 <= r2:
                out[k_out, 0] = i
                out[k_out, 1] = j
                k_out += 1
    return out[:k_out].copy()


@_jit
def _keep_pairs(y, pairs, atom_res, chain, radius):
    """lddt_reference's filter: different residues, and d < radius within a chain (<= between chains,
    as the search gave); the distances computed as NumPy's ``sqrt(((a - b) ** 2).sum(axis=1))``."""
    n = pairs.shape[0]
    keep = np.empty(n, dtype=np.bool_)
    d = np.empty(n)
    for k in range(n):
        i, j = pairs[k, 0], pairs[k, 1]
        v0 = y[i, 0] - y[j, 0]
        v1 = y[i, 1] - y[j, 1]
        v2 = y[i, 2] - y[j, 2]
        d[k] = math.sqrt(v0 * v0 + v1 * v1 + v2 * v2)
        keep[k] = atom_res[i] != atom_res[j] and (d[k] < radius or chain[i] != chain[j])
    return pairs[keep], d[keep]


def reference_pairs(y, radius: float, atom_res, atom_chain):
    """The scored pairs of :func:`protgpu.scoring.lddt.lddt_reference` and their reference distances,
    ``(pairs (P, 2), d (P,))``, or None where :func:`pairs_within` declines."""
    _compile()
    y = np.ascontiguousarray(y, dtype=np.float64)
    pairs = pairs_within(y, radius)
    if pairs is None:
        return None
    chain = np.unique(np.asarray(atom_chain), return_inverse=True)[1].astype(np.int64).reshape(-1)
    return _keep_pairs(y, pairs, np.ascontiguousarray(atom_res, dtype=np.int64), chain, float(radius))


_ALL_PAIRS_MAX = 4096  # atoms up to which testing every pair beats the cell list (measured: 1,656 atoms 3x)


def pairs_within(y: np.ndarray, radius: float) -> np.ndarray | None:
    """:func:`protgpu.scoring.lddt._pairs_within` by a compiled cell list, or None where the cell grid
    would be too sparse to be worth it (atoms spread far beyond the radius: the k-d tree then)."""
    _compile()
    y = np.ascontiguousarray(y, dtype=np.float64)
    if len(y) == 0:
        return np.zeros((0, 2), np.int64)
    if len(y) <= _ALL_PAIRS_MAX:
        return _pairs_all(y, float(radius))
    lo = y.min(axis=0)
    dims = cell_grid(lo, y.max(axis=0), len(y), radius)
    if dims is None:
        return None
    return _pairs_cells(y, float(radius), lo, dims)


def cell_grid(lo, hi, n: int, edge: float):
    """Cells per axis (int64 (3,)) of a grid of cells of edge ``edge`` (Angstrom) over the box [lo, hi]
    of ``n`` points, or None when the grid would be much sparser than the points (parts far apart: a
    k-d tree is the better search then). The one rule of every compiled cell list (lDDT's pairs, the
    complexes' clash and contact searches)."""
    dims = np.floor((np.asarray(hi) - np.asarray(lo)) / edge).astype(np.int64) + 1
    return dims if float(np.prod(dims.astype(np.float64))) <= 8 * n + 4096 else None
