// qcp.cuh: Theobald's QCP for one 3x3 correlation M, per thread, in float64: the key matrix K, the
// largest root l_max of its characteristic quartic by guarded Newton, its unit quaternion (adjugate row,
// or Jacobi at a near-repeated root), the RMSD and the rotation. Pure per-pair math, no entry points:
// qcp.cu (RMSD, superposition, all-vs-all) and tmscore.cu (the TM-score search's fits) share it. The
// loader inlines it as text, once per source, so the cache key covers it. protgpu/superpose/qcp.py holds
// the NumPy twin (same constants, same branches).
#pragma once

// The numerical constants. protgpu/superpose/kernels.py passes them to qcp.cu as #defines (qcp.MAX_ITERS,
// ...); other kernels get these defaults, which are the same values.
#ifndef QCP_MAX_ITERS
#define QCP_MAX_ITERS 60
#endif
#ifndef QCP_NEWTON_RTOL
#define QCP_NEWTON_RTOL 1e-14
#endif
#ifndef QCP_NEWTON_FLAT
#define QCP_NEWTON_FLAT 1e-08
#endif
#ifndef QCP_ADJ_TINY
#define QCP_ADJ_TINY 0.001
#endif
#ifndef QCP_JACOBI_SWEEPS
#define QCP_JACOBI_SWEEPS 10
#endif

// The 10 distinct entries of the symmetric key matrix K, named by (row, column).
struct QcpKey {
    double k00, k01, k02, k03, k11, k12, k13, k22, k23, k33;
};

// S = {Sxx, Sxy, Sxz, Syx, Syy, Syz, Szx, Szy, Szz}, S_ab = sum w x_a y_b (x mobile, y reference).
__device__ __forceinline__ QcpKey qcp_key(const double* s) {
    QcpKey k;
    k.k00 = s[0] + s[4] + s[8];
    k.k01 = s[5] - s[7];
    k.k02 = s[6] - s[2];
    k.k03 = s[1] - s[3];
    k.k11 = s[0] - s[4] - s[8];
    k.k12 = s[1] + s[3];
    k.k13 = s[6] + s[2];
    k.k22 = -s[0] + s[4] - s[8];
    k.k23 = s[5] + s[7];
    k.k33 = -s[0] - s[4] + s[8];
    return k;
}

// det of the symmetric 4x4 matrix by complementary 2x2 minors of rows (0,1) and (2,3).
__device__ __forceinline__ double qcp_det4(const QcpKey& k) {
    const double s0 = k.k00 * k.k11 - k.k01 * k.k01;
    const double s1 = k.k00 * k.k12 - k.k01 * k.k02;
    const double s2 = k.k00 * k.k13 - k.k01 * k.k03;
    const double s3 = k.k01 * k.k12 - k.k11 * k.k02;
    const double s4 = k.k01 * k.k13 - k.k11 * k.k03;
    const double s5 = k.k02 * k.k13 - k.k12 * k.k03;
    const double c5 = k.k22 * k.k33 - k.k23 * k.k23;
    const double c4 = k.k12 * k.k33 - k.k13 * k.k23;
    const double c3 = k.k12 * k.k23 - k.k13 * k.k22;
    const double c2 = k.k02 * k.k33 - k.k03 * k.k23;
    const double c1 = k.k02 * k.k23 - k.k03 * k.k22;
    const double c0 = k.k02 * k.k13 - k.k03 * k.k12;
    return s0 * c5 - s1 * c4 + s2 * c3 + s3 * c2 - s4 * c1 + s5 * c0;
}

// Newton's start and the problem's scale: the smaller of two upper bounds of l_max, lam0 = (G_A + G_B) / 2
// (tight for similar structures) and the nuclear-norm bound sqrt(3) |M|_F = sqrt(-1.5 c2) (tight for
// dissimilar ones). Every term of the quartic is at most ~hi^4: the thresholds below are relative to it.
__device__ __forceinline__ double qcp_start(double c2, double lam0) {
    const double nuc = sqrt(fmax(-1.5 * c2, 0.0));
    return (lam0 < nuc || isnan(lam0)) ? lam0 : nuc;  // as numpy.minimum: NaN stays NaN
}

// Largest root of l^4 + c2 l^2 + c1 l + c0 by Newton from hi, downward only. It stops at the first step
// that is not larger than QCP_NEWTON_RTOL * lam0 (from above the iteration is monotone, so a
// non-positive step is noise), and takes no step where P' <= QCP_NEWTON_FLAT hi^3: at a near-repeated
// root P and P' are both rounding noise and a step could jump anywhere (callers refine those).
__device__ __forceinline__ double qcp_newton(double c2, double c1, double c0, double lam0, double hi, int& iters) {
    double lam = hi;
    const double tol = QCP_NEWTON_RTOL * fabs(lam0);
    const double flat = QCP_NEWTON_FLAT * hi * hi * hi;
    int it = 0;
    while (it < QCP_MAX_ITERS) {
        ++it;
        const double l2 = lam * lam;
        const double b = (l2 + c2) * lam;
        const double a = b + c1;
        const double p = a * lam + c0;
        const double dp = 2.0 * l2 * lam + b + a;
        if (!(dp > flat)) break;
        const double step = p / dp;
        if (step > 0.0) lam -= step;
        if (!(step > tol)) break;
    }
    iters = it;
    return lam;
}

// Cyclic Jacobi eigen-decomposition of K; writes the unit eigenvector of the largest eigenvalue.
// Used only where l_max is a repeated eigenvalue (the adjugate then vanishes).
__device__ void qcp_jacobi_top(const QcpKey& k, double q[4]) {
    double a[4][4] = {{k.k00, k.k01, k.k02, k.k03},
                      {k.k01, k.k11, k.k12, k.k13},
                      {k.k02, k.k12, k.k22, k.k23},
                      {k.k03, k.k13, k.k23, k.k33}};
    double v[4][4] = {{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}};
    for (int sweep = 0; sweep < QCP_JACOBI_SWEEPS; ++sweep) {
#pragma unroll
        for (int p = 0; p < 3; ++p) {
#pragma unroll
            for (int r = p + 1; r < 4; ++r) {
                const double apr = a[p][r];
                if (apr == 0.0) continue;
                const double theta = (a[r][r] - a[p][p]) / (2.0 * apr);
                const double t = fabs(theta) > 1e100
                                     ? 0.5 / theta
                                     : copysign(1.0, theta) / (fabs(theta) + sqrt(theta * theta + 1.0));
                const double c = 1.0 / sqrt(t * t + 1.0);
                const double s = t * c;
                // A <- J^T A J (columns, then rows), V <- V J; same order as the NumPy twin.
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const double x = a[i][p], y = a[i][r];
                    a[i][p] = c * x - s * y;
                    a[i][r] = s * x + c * y;
                }
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const double x = a[p][i], y = a[r][i];
                    a[p][i] = c * x - s * y;
                    a[r][i] = s * x + c * y;
                }
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const double x = v[i][p], y = v[i][r];
                    v[i][p] = c * x - s * y;
                    v[i][r] = s * x + c * y;
                }
            }
        }
    }
    // Select with compile-time indices only (a dynamic index would put a[][] and v[][] in local memory).
    double top = a[0][0];
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = v[j][0];
#pragma unroll
    for (int i = 1; i < 4; ++i) {
        if (a[i][i] > top) {  // first maximum, as numpy.argmax
            top = a[i][i];
#pragma unroll
            for (int j = 0; j < 4; ++j) q[j] = v[j][i];
        }
    }
}

// Unit quaternion (w, x, y, z) of the optimal rotation: the largest-norm row (= column: symmetric) of
// adj(K - lam I) (Liu 2010 tries the next column when one is tiny; the largest one is the best
// conditioned), or Jacobi where even that is below QCP_ADJ_TINY scale^3 (scale = hi; l_max nearly
// repeated: noise would mix the eigenvectors of the close eigenvalues; Jacobi resolves them to eps |K|).
__device__ void qcp_quaternion(const QcpKey& k, double lam, double scale, double q[4]) {
    const double a00 = k.k00 - lam, a11 = k.k11 - lam, a22 = k.k22 - lam, a33 = k.k33 - lam;
    const double a01 = k.k01, a02 = k.k02, a03 = k.k03, a12 = k.k12, a13 = k.k13, a23 = k.k23;
    const double s0 = a00 * a11 - a01 * a01;
    const double s1 = a00 * a12 - a01 * a02;
    const double s2 = a00 * a13 - a01 * a03;
    const double s3 = a01 * a12 - a11 * a02;
    const double s4 = a01 * a13 - a11 * a03;
    const double s5 = a02 * a13 - a12 * a03;
    const double c5 = a22 * a33 - a23 * a23;
    const double c4 = a12 * a33 - a13 * a23;
    const double c3 = a12 * a23 - a13 * a22;
    const double c2 = a02 * a33 - a03 * a23;
    const double c1 = a02 * a23 - a03 * a22;
    const double c0 = a02 * a13 - a03 * a12;
    double r[4][4];
    r[0][0] = a11 * c5 - a12 * c4 + a13 * c3;
    r[0][1] = -a01 * c5 + a02 * c4 - a03 * c3;
    r[0][2] = a13 * s5 - a23 * s4 + a33 * s3;
    r[0][3] = -a12 * s5 + a22 * s4 - a23 * s3;
    r[1][0] = -a01 * c5 + a12 * c2 - a13 * c1;
    r[1][1] = a00 * c5 - a02 * c2 + a03 * c1;
    r[1][2] = -a03 * s5 + a23 * s2 - a33 * s1;
    r[1][3] = a02 * s5 - a22 * s2 + a23 * s1;
    r[2][0] = a01 * c4 - a11 * c2 + a13 * c0;
    r[2][1] = -a00 * c4 + a01 * c2 - a03 * c0;
    r[2][2] = a03 * s4 - a13 * s2 + a33 * s0;
    r[2][3] = -a02 * s4 + a12 * s2 - a23 * s0;
    r[3][0] = -a01 * c3 + a11 * c1 - a12 * c0;
    r[3][1] = a00 * c3 - a01 * c1 + a02 * c0;
    r[3][2] = -a03 * s3 + a13 * s1 - a23 * s0;
    r[3][3] = a02 * s3 - a12 * s1 + a22 * s0;
    // The largest row, selected with compile-time indices only (no local-memory copy of r[][]).
    double nbest = -1.0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const double n2 = r[i][0] * r[i][0] + r[i][1] * r[i][1] + r[i][2] * r[i][2] + r[i][3] * r[i][3];
        if (n2 > nbest) {  // first maximum, as numpy.argmax
            nbest = n2;
#pragma unroll
            for (int j = 0; j < 4; ++j) q[j] = r[i][j];
        }
    }
    const double thr = QCP_ADJ_TINY * scale * scale * scale;
    if (nbest > thr * thr) {
        const double inv = 1.0 / sqrt(nbest);
#pragma unroll
        for (int j = 0; j < 4; ++j) q[j] *= inv;
    } else {
        qcp_jacobi_top(k, q);
    }
}

__device__ __forceinline__ double qcp_rayleigh(const QcpKey& k, const double q[4]) {
    return k.k00 * q[0] * q[0] + k.k11 * q[1] * q[1] + k.k22 * q[2] * q[2] + k.k33 * q[3] * q[3] +
           2.0 * (k.k01 * q[0] * q[1] + k.k02 * q[0] * q[2] + k.k03 * q[0] * q[3] + k.k12 * q[1] * q[2] +
                  k.k13 * q[1] * q[3] + k.k23 * q[2] * q[3]);
}

// sqrt(max(0, e)), keeping NaN (fmax would turn NaN into 0 and hide bad input).
__device__ __forceinline__ double qcp_rmsd_from(double ga, double gb, double lam, double inv_w) {
    const double e = (ga + gb - 2.0 * lam) * inv_w;
    if (isnan(e)) return e;
    return e > 0.0 ? sqrt(e) : 0.0;
}

// Polynomial coefficients and K from the 9 entries of M.
__device__ __forceinline__ void qcp_coefficients(const double* s, QcpKey& k, double& c2, double& c1,
                                                 double& c0) {
    c2 = 0.0;
#pragma unroll
    for (int i = 0; i < 9; ++i) c2 += s[i] * s[i];
    c2 *= -2.0;
    const double det_m = s[0] * (s[4] * s[8] - s[5] * s[7]) - s[1] * (s[3] * s[8] - s[5] * s[6]) +
                         s[2] * (s[3] * s[7] - s[4] * s[6]);
    c1 = -8.0 * det_m;
    k = qcp_key(s);
    c0 = qcp_det4(k);
}

// l_max for one correlation M (9 entries, row-major) with traces ga, gb: K and the quartic's
// coefficients, then Newton from hi = qcp_start(c2, (ga + gb) / 2). Also gives K, c2 and c1, hi (the
// problem's scale) and Newton's pass count, for callers that judge the root (qcp_needs_refine) or go on
// to the quaternion. Always inlined: qcp_pairs_* keeps only this part in its registers.
__device__ __forceinline__ double qcp_largest(const double* s, double ga, double gb, QcpKey& k, double& c2,
                                              double& c1, double& hi, int& iters) {
    double c0;
    qcp_coefficients(s, k, c2, c1, c0);
    const double lam0 = 0.5 * (ga + gb);
    hi = qcp_start(c2, lam0);
    return qcp_newton(c2, c1, c0, lam0, hi, iters);
}

// Unit quaternion q of the optimal rotation (and K) for one correlation M with traces ga, gb.
__device__ __forceinline__ void qcp_top_quaternion(const double* s, double ga, double gb, QcpKey& k, double q[4]) {
    double c2, c1, hi;
    int iters;
    const double lam = qcp_largest(s, ga, gb, k, c2, c1, hi, iters);
    qcp_quaternion(k, lam, hi, q);
}

// The whole QCP chain for one correlation M (9 entries, row-major) with traces ga, gb: the largest
// eigenvalue by Newton from (ga + gb) / 2, its quaternion q (for the rotation), and the RMSD of that
// quaternion's rotation (the Rayleigh quotient, accurate at a near-repeated root).
__device__ __forceinline__ double qcp_solve(const double* s, double ga, double gb, double inv_w, double q[4]) {
    QcpKey k;
    qcp_top_quaternion(s, ga, gb, k, q);
    return qcp_rmsd_from(ga, gb, qcp_rayleigh(k, q), inv_w);
}

// Row-major rotation matrix r (9) of the unit quaternion q = (w, x, y, z): reference ~ r @ mobile.
__device__ __forceinline__ void qcp_rotation(const double* q, double* r) {
    const double qw = q[0], qx = q[1], qy = q[2], qz = q[3];
    r[0] = qw * qw + qx * qx - qy * qy - qz * qz;
    r[1] = 2.0 * (qx * qy - qw * qz);
    r[2] = 2.0 * (qx * qz + qw * qy);
    r[3] = 2.0 * (qx * qy + qw * qz);
    r[4] = qw * qw - qx * qx + qy * qy - qz * qz;
    r[5] = 2.0 * (qy * qz - qw * qx);
    r[6] = 2.0 * (qx * qz - qw * qy);
    r[7] = 2.0 * (qy * qz + qw * qx);
    r[8] = qw * qw - qx * qx - qy * qy + qz * qz;
}

// Rotation R (row-major) that best superposes x onto y (R x + t ~ y), from the centred
// cross-covariance s[a*3+b] = sum (x_a - xbar_a)(y_b - ybar_b) and the bounds ga, gb that Newton starts
// from (the centred sums of squares, or both sqrt(3) |M|_F without them): qcp_top_quaternion's
// quaternion; degenerate input (M = 0: K = 0, whose Jacobi eigenvector is the identity quaternion) gives
// the identity, and so does non-finite input (its non-finite quaternion is replaced here).
__device__ void qcp_rotation_or_identity(const double* s, double ga, double gb, double* R) {
    QcpKey k;
    double q[4];
    qcp_top_quaternion(s, ga, gb, k, q);
    if (!(isfinite(q[0]) && isfinite(q[1]) && isfinite(q[2]) && isfinite(q[3]))) {
        q[0] = 1.0;
        q[1] = q[2] = q[3] = 0.0;
    }
    qcp_rotation(q, R);
}

// From the raw sums of cnt pairs, a[0..2] = sum x, a[3..5] = sum y, a[6..14] = sum x y^T (row-major):
// the centroids cx, cy and the centred cross-covariance s (row-major), as the twins' fits from sums.
__device__ __forceinline__ void qcp_centred_from_sums(const double* a, int cnt, double* cx, double* cy, double* s) {
    const double inv = 1.0 / (double)cnt;
    for (int p = 0; p < 3; ++p) cx[p] = a[p] * inv;
    for (int p = 0; p < 3; ++p) cy[p] = a[3 + p] * inv;
    for (int p = 0; p < 3; ++p)
        for (int q = 0; q < 3; ++q) s[p * 3 + q] = a[6 + p * 3 + q] - (double)cnt * cx[p] * cy[q];
}

// The translation t = cy - R cx that goes with rotation R (row-major) and the centroids cx, cy.
__device__ __forceinline__ void qcp_translation(const double* R, const double* cx, const double* cy, double* t) {
    for (int p = 0; p < 3; ++p) t[p] = cy[p] - (R[p * 3] * cx[0] + R[p * 3 + 1] * cx[1] + R[p * 3 + 2] * cx[2]);
}
