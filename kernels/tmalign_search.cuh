// tmalign_search.cuh: the superpositions and scores of kernels/tmalign.cu, on a team (a warp or the
// block; tmalign_team.cuh). NumPy twins: protgpu/align/_search.py (tm_search, fast_scores),
// protgpu/scoring/_kabsch.py (superpose_from_sums, superpose) and protgpu/scoring/tmscore.py (_select).
// Everything is float64, as TM-align; fits are QCP (qcp.cuh), the CPU path's solver.
#pragma once
#include "tmalign_team.cuh"
#include "qcp.cuh"

#ifdef TMALIGN_HOST
#define TA_NAN NAN
#else
#define TA_NAN __longlong_as_double(0x7ff8000000000000LL)
#endif
// qcp.DIRECT_TAU: an RMSD whose square is below this fraction of (G_A + G_B) / n is re-measured on the
// coordinates (the QCP formula has cancelled most of its digits there).
#define TA_DIRECT_TAU 1e-6
#define TA_MAX_ROUNDS 20  // _search.MAX_ROUNDS

__device__ __forceinline__ void ta_identity(double* R, double* t) {
    for (int i = 0; i < 9; ++i) R[i] = (i % 4 == 0) ? 1.0 : 0.0;
    t[0] = t[1] = t[2] = 0.0;
}

// Squared distance of x superposed by (R, t) to y, summed in the twin's order.
__device__ __forceinline__ double ta_d2(const double* R, const double* t, const double* x, const double* y) {
    const double v0 = R[0] * x[0] + R[1] * x[1] + R[2] * x[2] + t[0] - y[0];
    const double v1 = R[3] * x[0] + R[4] * x[1] + R[5] * x[2] + t[1] - y[1];
    const double v2 = R[6] * x[0] + R[7] * x[1] + R[8] * x[2] + t[2] - y[2];
    return v0 * v0 + v1 * v1 + v2 * v2;
}

// Keep the three smallest values seen (a multiset, sorted); the twins' insertion with strict '<'.
__device__ __forceinline__ void ta_push3(double v, double& m0, double& m1, double& m2) {
    if (v < m0) {
        m2 = m1;
        m1 = m0;
        m0 = v;
    } else if (v < m1) {
        m2 = m1;
        m1 = v;
    } else if (v < m2) {
        m2 = v;
    }
}

// superpose_from_sums for one subset: a = {n, sum x (3), sum y (3), sum x_i y_j (9, row-major)}.
// QCP without the traces: Newton starts from sqrt(3) |M|_F, as the twin. Empty: the identity.
__device__ TA_NOINLINE void ta_fit_sums(const double* a, double* R, double* t) {
    const double n = a[0];
    if (!(n > 0)) {
        ta_identity(R, t);
        return;
    }
    const double cx[3] = {a[1] / n, a[2] / n, a[3] / n};
    const double cy[3] = {a[4] / n, a[5] / n, a[6] / n};
    double s[9];
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) s[3 * i + j] = a[7 + 3 * i + j] - n * cx[i] * cy[j];
    QcpKey k;
    double c2, c1, c0;
    qcp_coefficients(s, k, c2, c1, c0);
    const double lam0 = sqrt(fmax(-1.5 * c2, 0.0));
    const double hi = qcp_start(c2, lam0);
    int iters;
    const double lam = qcp_newton(c2, c1, c0, lam0, hi, iters);
    double q[4];
    qcp_quaternion(k, lam, hi, q);
    qcp_rotation(q, R);
    qcp_translation(R, cx, cy, t);
}

// QCP with the traces on the centred sums b = {M (9), G_A, G_B}: rotation, translation, RMSD.
__device__ TA_NOINLINE double ta_qcp_centred(const double* b, double inv, const double* cx, const double* cy, double* R,
                                             double* t) {
    double q[4];
    const double rmsd = qcp_solve(b, b[9], b[10], inv, q);
    qcp_rotation(q, R);
    qcp_translation(R, cx, cy, t);
    return rmsd;
}

// Fit of the pairs p < count for which get(p, x, y) is true, from raw sums; returns their number.
template <class Team, class Get>
__device__ double ta_fit(const Team& tm, int count, Get get, double* R, double* t) {
    double a[16];
    for (int i = 0; i < 16; ++i) a[i] = 0.0;
    for (int p = tm.rank; p < count; p += tm.size) {
        double x[3], y[3];
        if (!get(p, x, y)) continue;
        a[0] += 1.0;
        for (int i = 0; i < 3; ++i) {
            a[1 + i] += x[i];
            a[4 + i] += y[i];
            for (int j = 0; j < 3; ++j) a[7 + 3 * i + j] += x[i] * y[j];
        }
    }
    tm.sums(a, 16);
    ta_fit_sums(a, R, t);
    return a[0];
}

// _kabsch.superpose for one set (centred, two passes; QCP with the traces): the rotation, translation
// and RMSD of the pairs for which get(p, x, y) is true (NaN and the identity when there are none).
template <class Team, class Get>
__device__ double ta_superpose(const Team& tm, int count, Get get, double* R, double* t) {
    double a[7];
    for (int i = 0; i < 7; ++i) a[i] = 0.0;
    for (int p = tm.rank; p < count; p += tm.size) {
        double x[3], y[3];
        if (!get(p, x, y)) continue;
        a[0] += 1.0;
        for (int i = 0; i < 3; ++i) {
            a[1 + i] += x[i];
            a[4 + i] += y[i];
        }
    }
    tm.sums(a, 7);
    if (!(a[0] > 0)) {
        ta_identity(R, t);
        return TA_NAN;
    }
    const double inv = 1.0 / a[0];
    const double cx[3] = {a[1] * inv, a[2] * inv, a[3] * inv};
    const double cy[3] = {a[4] * inv, a[5] * inv, a[6] * inv};
    double b[11];
    for (int i = 0; i < 11; ++i) b[i] = 0.0;
    for (int p = tm.rank; p < count; p += tm.size) {
        double x[3], y[3];
        if (!get(p, x, y)) continue;
        for (int i = 0; i < 3; ++i) {
            x[i] -= cx[i];
            y[i] -= cy[i];
        }
        for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 3; ++j) b[3 * i + j] += x[i] * y[j];
        b[9] += x[0] * x[0] + x[1] * x[1] + x[2] * x[2];
        b[10] += y[0] * y[0] + y[1] * y[1] + y[2] * y[2];
    }
    tm.sums(b, 11);
    double rmsd = ta_qcp_centred(b, inv, cx, cy, R, t);
    if (rmsd * rmsd <= TA_DIRECT_TAU * (b[9] + b[10]) * inv) {  // qcp.near_identical: measure instead
        double s = 0.0;
        const double zero[3] = {0.0, 0.0, 0.0};
        for (int p = tm.rank; p < count; p += tm.size) {
            double x[3], y[3];
            if (!get(p, x, y)) continue;
            for (int i = 0; i < 3; ++i) {
                x[i] -= cx[i];
                y[i] -= cy[i];
            }
            s += ta_d2(R, zero, x, y);
        }
        tm.sums(&s, 1);
        rmsd = sqrt(s * inv);
    }
    return rmsd;
}

// tmscore._select's relaxation: given cnt, this lane's count of sel[p] = d < dcut (set by the caller), the
// cutoff is relaxed by 0.5 A while fewer than 3 pairs pass (n > 3), in closed form from the third smallest
// distance and settled against the loop's own test; sel is rewritten then. Returns whether it was. Teams
// that run in step (two half-warp seeds) both take the relaxation's reductions when either needs them.
template <class Team>
__device__ bool ta_select_relax(const Team& tm, const double* d2, int n, double dcut, unsigned char* sel, double cnt) {
    tm.sums(&cnt, 1);
    const bool relax = n > 3 && cnt < 3.0;
    if (!tm.step_any(relax)) return false;
    double m0 = TA_INF, m1 = TA_INF, m2 = TA_INF, nfin = 0.0;
    for (int p = tm.rank; p < (relax ? n : 0); p += tm.size) {
        const double v = d2[p];
        if (!isfinite(v)) continue;
        nfin += 1.0;
        ta_push3(v, m0, m1, m2);
    }
    tm.sums(&nfin, 1);
    tm.min3(m0, m1, m2);
    if (!relax) return false;
    if (nfin < 3.0) {
        for (int p = tm.rank; p < n; p += tm.size) sel[p] = isfinite(d2[p]);
        return true;
    }
    const double third = m2;
    double inc = fmax(floor((sqrt(third) - dcut) / 0.5), 0.0) + 1.0;
    for (int it = 0; it < 4; ++it) {
        double dd = dcut + inc * 0.5;
        if (dd * dd <= third) inc += 1.0;
        dd = dcut + (inc - 1.0) * 0.5;
        if (inc > 1.0 && dd * dd > third) inc -= 1.0;
    }
    const double dd = dcut + inc * 0.5;
    const double dd2 = dd * dd;
    for (int p = tm.rank; p < n; p += tm.size) sel[p] = d2[p] < dd2;
    return true;
}

// One step of _search.tm_search after its fit (R, t), in one pass over the n centred pairs (xs, ys): the
// squared distances into d2 (kept for the relaxation), the selection sel[p] = d < dcut (tmscore._select,
// relaxed by ta_select_relax), the score (_search._scores: sum of 1 / (1 + d^2 / d0^2), pairs beyond d8
// adding nothing when d8 > 0, over norm; inv_d0sq = TA_RCP(d0sq)) and, given the last selection prev
// (or nullptr), whether the selection differs from it at some pair of this lane (changed). Each lane
// takes its pairs in ascending order, as the separate passes did, so every sum has their bits. Out of line:
// inlined into ta_search it spilled more and ran 1-5% slower (benchmarks/results/align-search-step-ab-h200.txt).
template <class Team>
__device__ TA_NOINLINE double ta_search_step(const Team& tm, const double* R, const double* t, const double* xs,
                                             const double* ys, int n, double dcut, double d0sq, double inv_d0sq,
                                             double d8, double norm, double* d2, unsigned char* sel,
                                             const unsigned char* prev, int& changed) {
    const double c2 = dcut * dcut, d8sq = d8 * d8;
    double cnt = 0.0, s = 0.0;
    int diff = 0;
    for (int p = tm.rank; p < n; p += tm.size) {
        const double v = ta_d2(R, t, xs + 3 * p, ys + 3 * p);
        d2[p] = v;
        const unsigned char k = v < c2;
        sel[p] = k;
        cnt += k;
        if (!(d8 > 0.0) || v <= d8sq) s += TA_RCP(1.0 + TA_DIV_BY(v, d0sq, inv_d0sq));
        if (prev) diff |= prev[p] != k;
    }
    if (ta_select_relax(tm, d2, n, dcut, sel, cnt) && prev) {  // relaxed: count the change again
        diff = 0;
        for (int p = tm.rank; p < n; p += tm.size) diff |= prev[p] != sel[p];
    }
    changed = diff;
    tm.sums(&s, 1);
    return s / norm;
}

// _search._relaxed_cut for one candidate: cut2 raised by 0.5 A^2 steps until 3 valid pairs have
// d2 <= cut (when the candidate has more than 3 pairs), in closed form, settled as the twin does.
template <class Team, class Map>
__device__ double ta_relaxed_cut(const Team& tm, const double* d2, int l2, Map map, double cut2, double n_ali) {
    double cnt = 0.0;
    for (int j = tm.rank; j < l2; j += tm.size) cnt += (map(j) >= 0 && d2[j] <= cut2) ? 1.0 : 0.0;
    tm.sums(&cnt, 1);
    if (cnt >= 3.0 || n_ali <= 3.0) return cut2;
    double m0 = TA_INF, m1 = TA_INF, m2 = TA_INF;
    for (int j = tm.rank; j < l2; j += tm.size)
        if (map(j) >= 0) ta_push3(d2[j], m0, m1, m2);
    tm.min3(m0, m1, m2);
    double m = fmax(ceil((m2 - cut2) / 0.5), 0.0);
    for (int it = 0; it < 3; ++it) {
        if (cut2 + 0.5 * m < m2) m += 1.0;
        if (m > 0 && cut2 + 0.5 * (m - 1.0) >= m2) m -= 1.0;
    }
    return cut2 + 0.5 * m;
}

// _search.fast_scores for one candidate alignment: map(j) is the mobile residue aligned to target
// residue j (or -1); xc, yc the centred chains. The best of three unnormalised scores.
template <class Team, class Map>
__device__ double ta_fast_score(const Team& tm, const double* xc, const double* yc, int l2, Map map, double d0,
                                double d0s, double* d2, unsigned char* sel) {
    double R[9], t[3];
    const double d02 = d0 * d0, d002 = d0s * d0s, inv_d02 = TA_RCP(d02);
    auto valid = [&](int j, double* x, double* y) -> bool {
        const int i = map(j);
        if (i < 0) return false;
        for (int k = 0; k < 3; ++k) {
            x[k] = xc[3 * i + k];
            y[k] = yc[3 * j + k];
        }
        return true;
    };
    auto chosen = [&](int j, double* x, double* y) -> bool { return sel[j] && valid(j, x, y); };
    auto score = [&]() -> double {
        double s = 0.0;
        for (int j = tm.rank; j < l2; j += tm.size) {
            const int i = map(j);
            if (i < 0) continue;
            d2[j] = ta_d2(R, t, xc + 3 * i, yc + 3 * j);
            s += TA_RCP(1.0 + TA_DIV_BY(d2[j], d02, inv_d02));
        }
        tm.sums(&s, 1);
        return s;
    };
    auto choose = [&](double cut) -> double {
        double kept = 0.0;
        for (int j = tm.rank; j < l2; j += tm.size) {
            sel[j] = map(j) >= 0 && d2[j] <= cut;
            kept += sel[j];
        }
        tm.sums(&kept, 1);
        return kept;
    };
    const double n_ali = ta_fit(tm, l2, valid, R, t);
    double best = score();
    if (choose(ta_relaxed_cut(tm, d2, l2, map, d002, n_ali)) != n_ali) {
        ta_fit(tm, l2, chosen, R, t);
        const double s1 = score();
        choose(ta_relaxed_cut(tm, d2, l2, map, d002 + 1.0, n_ali));
        ta_fit(tm, l2, chosen, R, t);
        const double s2 = score();
        best = fmax(fmax(best, s1), s2);
    }
    return best;
}

// tmscore.seed_lengths: n, n/2, n/4, ... (at least min(4, n)), at most six. Returns how many.
__device__ __forceinline__ int ta_seed_lengths(int n, int* L) {
    const int lmin = n < 4 ? n : 4;
    for (int i = 0; i < 5; ++i) {
        const int l = n >> i;
        if (l <= lmin) {
            L[i] = lmin;
            return i + 1;
        }
        L[i] = l;
    }
    L[5] = lmin;
    return 6;
}

// Starts of the seeds of one length (_search.seed_starts): 0, step, 2 step, ... below n - len, then n - len.
__device__ __forceinline__ int ta_seed_count(int n, int len, int step) {
    const int last = n - len;
    return (last > 0 ? (last + step - 1) / step : 0) + 1;
}
