// qcp.cu: RMSD after optimal superposition by Theobald's QCP (quaternion characteristic polynomial).
//
// Three jobs, all ending in the same float64 QCP step (protgpu/superpose.py is the NumPy twin, constant
// for constant and branch for branch):
//   frame_moments_*  one block per frame: weighted centroid, G_A = sum w |x - c|^2 and
//                    M = sum w (x - c) y^T against a centred reference, accumulated in float64
//   qcp_frames       one thread per frame: l_max, the quaternion, the rotation and the RMSD
//   qcp_pairs_*      one thread per pair of an all-vs-all tile: reads the pair's 3x3 block of the
//                    cuBLAS product A B^T of the stacked centred frames, writes the RMSD
// The Python side passes the numerical constants below as #defines (the defaults here are the same).
#include "common.cuh"

#ifndef QCP_MAX_ITERS
#define QCP_MAX_ITERS 60
#endif
#ifndef QCP_SLOW_ITERS
#define QCP_SLOW_ITERS 12
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
#ifndef MOMENT_THREADS
#define MOMENT_THREADS 256
#endif

// Output modes of qcp_pairs (bit flags; same values in superpose.py).
#define PAIR_MIRROR 1     // also write out[j, i]
#define PAIR_ZERO_DIAG 2  // global i == j -> exactly 0 (a frame against itself)
#define PAIR_UPPER_ONLY 4 // skip pairs with global i > j (diagonal tiles of a symmetric run)
#define PAIR_CONDENSED 8  // out is SciPy's condensed vector over n_total frames; only i < j written

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

// ----------------------------------------------------------------------------------------------------
// Per-frame moments against one reference.

// Sum K values over the block; thread 0 gets the totals. smem: (MOMENT_THREADS / 32) * K doubles.
template <int K>
__device__ __forceinline__ void block_sum(double (&v)[K], double* smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int j = 0; j < K; ++j) {
        double x = v[j];
        for (int off = 16; off > 0; off >>= 1) x += __shfl_down_sync(0xffffffffu, x, off);
        v[j] = x;
    }
    __syncthreads();  // smem may still be read from a previous reduction
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < K; ++j) smem[warp * K + j] = v[j];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nwarps; ++w) {
#pragma unroll
            for (int j = 0; j < K; ++j) v[j] += smem[w * K + j];
        }
    }
}

//   x: (n_frames, n, 3) mobile frames; yc: (n, 3) reference, centred with the same weights;
//   w: (n,) weights or NULL (all 1); inv_w = 1 / sum w
//   out: (n_frames, 13) float64 = M (9, row-major S_ab), G_A, centroid (3)
// blockDim.x must be a multiple of 32, at most MOMENT_THREADS.
template <typename T>
__device__ void frame_moments(const T* __restrict__ x, const double* __restrict__ yc, const double* __restrict__ w,
                              double* __restrict__ out, int n_frames, int n, double inv_w) {
    __shared__ double smem[(MOMENT_THREADS / 32) * 10];
    __shared__ double centroid[3];
    for (i64 f = blockIdx.x; f < n_frames; f += gridDim.x) {
        const T* xf = x + f * (i64)n * 3;
        // Pass 1: weighted centroid.
        double c[3] = {0.0, 0.0, 0.0};
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const double wi = w ? w[i] : 1.0;
            c[0] += wi * (double)xf[3 * i];
            c[1] += wi * (double)xf[3 * i + 1];
            c[2] += wi * (double)xf[3 * i + 2];
        }
        block_sum<3>(c, smem);
        if (threadIdx.x == 0) {
            centroid[0] = c[0] * inv_w;
            centroid[1] = c[1] * inv_w;
            centroid[2] = c[2] * inv_w;
        }
        __syncthreads();
        const double cx = centroid[0], cy = centroid[1], cz = centroid[2];
        // Pass 2: moments of the centred coordinates (centring first keeps G_A exact to float64
        // rounding; raw sums minus W c c^T would cancel far from the origin).
        double m[10];
#pragma unroll
        for (int j = 0; j < 10; ++j) m[j] = 0.0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const double wi = w ? w[i] : 1.0;
            const double ax = (double)xf[3 * i] - cx, ay = (double)xf[3 * i + 1] - cy, az = (double)xf[3 * i + 2] - cz;
            const double bx = yc[3 * i], by = yc[3 * i + 1], bz = yc[3 * i + 2];
            const double wx = wi * ax, wy = wi * ay, wz = wi * az;
            m[0] += wx * bx; m[1] += wx * by; m[2] += wx * bz;
            m[3] += wy * bx; m[4] += wy * by; m[5] += wy * bz;
            m[6] += wz * bx; m[7] += wz * by; m[8] += wz * bz;
            m[9] += wx * ax + wy * ay + wz * az;
        }
        block_sum<10>(m, smem);
        if (threadIdx.x == 0) {
            double* o = out + f * 13;
#pragma unroll
            for (int j = 0; j < 10; ++j) o[j] = m[j];
            o[10] = cx;
            o[11] = cy;
            o[12] = cz;
        }
        __syncthreads();  // centroid[] is rewritten by the next frame
    }
}

extern "C" __global__ void frame_moments_f32(const float* x, const double* yc, const double* w, double* out, int n_frames, int n, double inv_w) {
    frame_moments<float>(x, yc, w, out, n_frames, n, inv_w);
}

extern "C" __global__ void frame_moments_f64(const double* x, const double* yc, const double* w, double* out, int n_frames, int n, double inv_w) {
    frame_moments<double>(x, yc, w, out, n_frames, n, inv_w);
}

// QCP per frame with the rotation:
//   moments: (n_frames, 13) from frame_moments; gb = G_B of the reference
//   rmsd: (n_frames,); rot: (n_frames, 9) row-major rotation (or NULL): reference ~ rot @ mobile
// The RMSD is that of the returned rotation (Rayleigh quotient of its quaternion).
extern "C" __global__ void qcp_frames(const double* moments, double* rmsd, double* rot, int n_frames, double gb, double inv_w) {
    PG_GRID_STRIDE_LOOP(f, n_frames) {
        const double* mo = moments + f * 13;
        double s[9];
#pragma unroll
        for (int j = 0; j < 9; ++j) s[j] = mo[j];
        const double ga = mo[9];
        QcpKey k;
        double c2, c1, c0;
        qcp_coefficients(s, k, c2, c1, c0);
        const double lam0 = 0.5 * (ga + gb);
        const double hi = qcp_start(c2, lam0);
        int iters;
        const double lam = qcp_newton(c2, c1, c0, lam0, hi, iters);
        double q[4];
        qcp_quaternion(k, lam, hi, q);
        rmsd[f] = qcp_rmsd_from(ga, gb, qcp_rayleigh(k, q), inv_w);
        if (rot) {
            const double qw = q[0], qx = q[1], qy = q[2], qz = q[3];
            double* r = rot + f * 9;
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
    }
}

// ----------------------------------------------------------------------------------------------------
// All-vs-all tiles.
//   blocks: the tile's (3 ti, 3 tj) product of stacked centred frames; element (r, c) at
//           blocks[r * rs + c * cs] (row- or column-major cuBLAS output, no copy)
//   ga, gb: G of every frame of x and y (global arrays, indexed by row0 + a and col0 + b)
//   out:    dense: element (out_row0 + a, out_col0 + b) at out[(out_row0 + a) * out_ld + out_col0 + b];
//           condensed (PAIR_CONDENSED): pair (i, j), i < j, of n_total frames at i n - i(i+1)/2 + j-i-1
//   mode:   PAIR_* flags
template <typename T, typename O>
__device__ void qcp_pairs(const T* __restrict__ blocks, const double* __restrict__ ga, const double* __restrict__ gb,
                          O* __restrict__ out, int ti, int tj, i64 rs, i64 cs, i64 row0, i64 col0, i64 out_ld,
                          i64 out_row0, i64 out_col0, i64 n_total, double inv_w, int mode) {
    PG_GRID_STRIDE_LOOP(idx, (i64)ti * tj) {
        const i64 a = idx / tj;
        const i64 b = idx - a * tj;
        const i64 gi = row0 + a, gj = col0 + b;
        if ((mode & (PAIR_UPPER_ONLY | PAIR_CONDENSED)) && gi > gj) continue;
        if ((mode & PAIR_CONDENSED) && gi == gj) continue;
        double v;
        if ((mode & PAIR_ZERO_DIAG) && gi == gj) {
            v = 0.0;
        } else {
            double s[9];
#pragma unroll
            for (int p = 0; p < 3; ++p)
#pragma unroll
                for (int q = 0; q < 3; ++q) s[3 * p + q] = (double)blocks[(3 * a + p) * rs + (3 * b + q) * cs];
            const double gai = ga[gi], gbj = gb[gj];
            QcpKey k;
            double c2, c1, c0;
            qcp_coefficients(s, k, c2, c1, c0);
            const double lam0 = 0.5 * (gai + gbj);
            const double hi = qcp_start(c2, lam0);
            int iters;
            double lam = qcp_newton(c2, c1, c0, lam0, hi, iters);
            const double dp = (4.0 * lam * lam + 2.0 * c2) * lam + c1;
            const double thr = QCP_ADJ_TINY * hi * hi * hi;
            if (iters > QCP_SLOW_ITERS || (!(fabs(dp) > thr) && hi > 0.0)) {
                // Near-repeated root: Newton converged slowly, or stopped where the polynomial is
                // flat (rounding noise moves lam by ~eps scale^2 / gap there). The quaternion path
                // (adjugate, or Jacobi) and its Rayleigh quotient are accurate.
                double qv[4];
                qcp_quaternion(k, lam, hi, qv);
                lam = qcp_rayleigh(k, qv);
            }
            v = qcp_rmsd_from(gai, gbj, lam, inv_w);
        }
        if (mode & PAIR_CONDENSED) {
            out[gi * n_total - gi * (gi + 1) / 2 + (gj - gi - 1)] = (O)v;
        } else {
            out[(out_row0 + a) * out_ld + out_col0 + b] = (O)v;
            if ((mode & PAIR_MIRROR) && gi != gj) out[(out_col0 + b) * out_ld + out_row0 + a] = (O)v;
        }
    }
}

extern "C" __global__ void qcp_pairs_b32_o32(const float* blocks, const double* ga, const double* gb, float* out, int ti, int tj, long long rs, long long cs, long long row0, long long col0, long long out_ld, long long out_row0, long long out_col0, long long n_total, double inv_w, int mode) {
    qcp_pairs<float, float>(blocks, ga, gb, out, ti, tj, rs, cs, row0, col0, out_ld, out_row0, out_col0, n_total, inv_w, mode);
}

extern "C" __global__ void qcp_pairs_b32_o64(const float* blocks, const double* ga, const double* gb, double* out, int ti, int tj, long long rs, long long cs, long long row0, long long col0, long long out_ld, long long out_row0, long long out_col0, long long n_total, double inv_w, int mode) {
    qcp_pairs<float, double>(blocks, ga, gb, out, ti, tj, rs, cs, row0, col0, out_ld, out_row0, out_col0, n_total, inv_w, mode);
}

extern "C" __global__ void qcp_pairs_b64_o32(const double* blocks, const double* ga, const double* gb, float* out, int ti, int tj, long long rs, long long cs, long long row0, long long col0, long long out_ld, long long out_row0, long long out_col0, long long n_total, double inv_w, int mode) {
    qcp_pairs<double, float>(blocks, ga, gb, out, ti, tj, rs, cs, row0, col0, out_ld, out_row0, out_col0, n_total, inv_w, mode);
}

extern "C" __global__ void qcp_pairs_b64_o64(const double* blocks, const double* ga, const double* gb, double* out, int ti, int tj, long long rs, long long cs, long long row0, long long col0, long long out_ld, long long out_row0, long long out_col0, long long n_total, double inv_w, int mode) {
    qcp_pairs<double, double>(blocks, ga, gb, out, ti, tj, rs, cs, row0, col0, out_ld, out_row0, out_col0, n_total, inv_w, mode);
}
