// gdt_windows.cu: OpenStructure's GDT (ost.mol.alg.GDT as its Scorer calls it), batched: every model and
// every seed window at once. The NumPy twin (protgpu/scoring/gdt_windows.py, gdt_windows_numpy) is the
// specification.
//
// Work split: block (m, c) holds model m's centred CA pairs (in shared memory when they fit); its warps
// take the model's seed windows c*GW_WARPS + w, c*GW_WARPS + w + gridDim.y*GW_WARPS, ... for each of the
// five cutoffs in turn: fit the window, then up to GW_ROUNDS rounds of "select the pairs closer than the
// cutoff, refit on them", until the subset repeats or has fewer than 3 pairs. Lanes own pairs
// j = lane + 32k; a subset is the warp's ballot words, kept in shared memory. The pass that selects a
// subset also sums its fit terms, so a round reads the pairs once. Sums, QCP (qcp.cuh) and distances
// are float64. Each warp keeps its best count of a cutoff and ends it with one atomicMax into out[m][5].
#include "common.cuh"
#include "qcp.cuh"  // the QCP solver shared with qcp.cu and tmscore.cu

#ifndef GW_WARPS
#define GW_WARPS 4
#endif
#define GW_FULL_MASK 0xffffffffu
#define GW_ROUNDS 10
#define GW_NCUT 5
#define GW_NSUM 15

// Adds pair j's fit terms to a: sums of x, y and x y^T (row-major).
__device__ __forceinline__ void gw_add(double* a, const double* xs, const double* ys, int j) {
    const double x0 = xs[3 * j], x1 = xs[3 * j + 1], x2 = xs[3 * j + 2];
    const double y0 = ys[3 * j], y1 = ys[3 * j + 1], y2 = ys[3 * j + 2];
    a[0] += x0; a[1] += x1; a[2] += x2;
    a[3] += y0; a[4] += y1; a[5] += y2;
    a[6] += x0 * y0; a[7] += x0 * y1; a[8] += x0 * y2;
    a[9] += x1 * y0; a[10] += x1 * y1; a[11] += x1 * y2;
    a[12] += x2 * y0; a[13] += x2 * y1; a[14] += x2 * y2;
}

// Superposition (R row-major, t: R x + t ~ y) of the cnt pairs whose per-lane sums are in a (reduced
// over the warp here; every lane gets the same R, t). As the twin's fit from sums
// (protgpu.scoring._kabsch.superpose_from_sums): no sums of squares, so Newton starts from, and scales
// its tolerances by, the bound sqrt(3) |M|_F. Non-finite input gives the identity rotation.
__device__ void gw_fit(double* a, int cnt, double* R, double* t) {
#pragma unroll
    for (int i = 0; i < GW_NSUM; ++i) a[i] = pg_warp_sum(a[i]);
    double cx[3], cy[3], s[9];
    qcp_centred_from_sums(a, cnt, cx, cy, s);
    double f2 = 0.0;
    for (int i = 0; i < 9; ++i) f2 += s[i] * s[i];
    const double nuc = sqrt(3.0 * f2);  // qcp_top_quaternion's (ga + gb) / 2
    qcp_rotation_or_identity(s, nuc, nuc, R);
    qcp_translation(R, cx, cy, t);
}

// Bits of word kw (pairs 32 kw .. 32 kw + 31) that lie in the window [lo, hi).
__device__ __forceinline__ unsigned gw_window_word(int kw, int lo, int hi) {
    const int b = kw * 32;
    const int a0 = max(lo - b, 0), a1 = min(hi - b, 32);
    if (a1 <= a0) return 0u;
    const unsigned upto = (a1 >= 32) ? GW_FULL_MASK : ((1u << a1) - 1u);
    return upto & ~((1u << a0) - 1u);
}

// x, y: (M, lmax, 3) centred model and reference CAs in mapping order (rows past n_ali ignored);
// n_ali: (M,); seeds: (S_total, 2) int32 (start, length) rows, model m's seed_cnt[m] rows from seed_off[m]
// (models of one length share theirs);
// out: (M, 5) int32, zero on entry: the best subset size for the cutoffs 0.5, 1, 2, 4, 8 Angstrom.
extern "C" __global__ __launch_bounds__(GW_WARPS * 32) void gdt_windows_f64(
    const double* x, const double* y, const int* n_ali, const int* seeds, const int* seed_off, const int* seed_cnt,
    int lmax, int use_smem, int* out) {
    extern __shared__ __align__(16) unsigned char gw_smem[];
    const i64 m = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = n_ali[m];
    const int nwords_max = (lmax + 31) >> 5;
    const int nwords = (n + 31) >> 5;
    const double* xs = x + m * (i64)lmax * 3;
    const double* ys = y + m * (i64)lmax * 3;
    unsigned* masks = pg_stage_subset_search(gw_smem, GW_WARPS, nwords_max, lmax, n, use_smem, xs, ys);
    unsigned* buf0 = masks + (warp * 2) * nwords_max;
    unsigned* buf1 = masks + (warp * 2 + 1) * nwords_max;
    const int s0 = seed_off[m], n_seeds = seed_cnt[m];
    double a[GW_NSUM];
    double R[9], t[3];

    // cutoffs outside, windows inside: the best count stays a register (a window's fit, a few dozen
    // pairs, is redone per cutoff: cheaper than keeping five counts in local memory)
    for (int c = 0; c < GW_NCUT; ++c) {
        const double c2 = ldexp(0.25, 2 * c);  // 0.5^2, 1^2, 2^2, 4^2, 8^2, exactly
        int best = 0;
        for (int si = blockIdx.y * GW_WARPS + warp; si < n_seeds; si += gridDim.y * GW_WARPS) {
            const int lo = seeds[2 * (s0 + si)], len = seeds[2 * (s0 + si) + 1];
            const int hi = lo + len;
#pragma unroll
            for (int i = 0; i < GW_NSUM; ++i) a[i] = 0.0;
            for (int j = lo + lane; j < hi; j += 32) gw_add(a, xs, ys, j);
            gw_fit(a, len, R, t);
            unsigned* cur = buf0;
            unsigned* nxt = buf1;
            for (int r = 0; r < GW_ROUNDS; ++r) {
#pragma unroll
                for (int i = 0; i < GW_NSUM; ++i) a[i] = 0.0;
                int cnt = 0;
                bool same = true;
                for (int kw = 0; kw < nwords; ++kw) {
                    const int j = kw * 32 + lane;
                    bool sel = false;
                    if (j < n) {
                        const double x0 = xs[3 * j], x1 = xs[3 * j + 1], x2 = xs[3 * j + 2];
                        const double dx = R[0] * x0 + R[1] * x1 + R[2] * x2 + t[0] - ys[3 * j];
                        const double dy = R[3] * x0 + R[4] * x1 + R[5] * x2 + t[1] - ys[3 * j + 1];
                        const double dz = R[6] * x0 + R[7] * x1 + R[8] * x2 + t[2] - ys[3 * j + 2];
                        sel = dx * dx + dy * dy + dz * dz < c2;
                    }
                    const unsigned wd = __ballot_sync(GW_FULL_MASK, sel);
                    const unsigned old = (r == 0) ? gw_window_word(kw, lo, hi) : cur[kw];
                    same = same && (wd == old);
                    cnt += __popc(wd);
                    if (lane == 0) nxt[kw] = wd;
                    if (sel) gw_add(a, xs, ys, j);  // the next round's fit, if there is one
                }
                __syncwarp();
                best = max(best, cnt);
                if (same || cnt < 3) break;
                unsigned* tmp = cur;
                cur = nxt;
                nxt = tmp;
                if (r + 1 < GW_ROUNDS) gw_fit(a, cnt, R, t);
            }
            __syncwarp();
        }
        if (lane == 0 && best > 0) atomicMax(out + m * GW_NCUT + c, best);
    }
}
