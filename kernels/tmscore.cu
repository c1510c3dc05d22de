// tmscore.cu: the TMscore program's superposition search, batched: all models and all seed fragments
// run at once. The NumPy twin (protgpu/scoring/tmscore.py, tm_search_numpy) is the specification.
//
// Work split: block (m, c) holds model m's aligned CA pairs (in shared memory when they fit); its
// warps take the model's search tasks c*TM_WARPS + w, c*TM_WARPS + w + gridDim.y*TM_WARPS, ...
// A task is one seed fragment of one stage:
//   tasks [0, S):   stage 2, the final search (d0 of the normalisation length); gives TM, R, t
//   tasks [S, 2S):  stage 1, the search with the TMscore program's search parameters; only its GDT
//                   and MaxSub counts matter (its best superposition is not used by the program)
// One warp runs one task: lanes own pairs j = lane + 32k; subset masks are the warp's ballot words,
// kept in shared memory; superpositions are float64 QCP on the warp-reduced float64 sums, and
// distances are float64 too (TM_EVAL_STORAGE below), so float32 input gives the float64 search. Each block writes
// its best stage-2 score (ties: lowest task, the program's order), that rotation and translation, and
// its maxima of the GDT counts and MaxSub sum; the host reduces over the blocks of a model.
#include "common.cuh"
#include "qcp.cuh"  // the QCP solver shared with qcp.cu

#ifndef TM_WARPS
#define TM_WARPS 4
#endif
// TM_EVAL_STORAGE=1 evaluates distances in the storage precision (float for tm_search_f32): faster,
// but a pair can then cross a selection or GDT cutoff that float64 would not, which moves GDT by
// 1/L. The default evaluates in float64, so float32 input gives the float64 search's numbers.
#ifndef TM_EVAL_STORAGE
#define TM_EVAL_STORAGE 0
#endif

#define TM_FULL_MASK 0xffffffffu
#define TM_MAX_ITER 20

// Superposition of the pairs in [lo, hi) (words == nullptr) or of the pairs whose bit is set in words.
template <typename T>
__device__ void tm_superpose(const T* __restrict__ xs, const T* __restrict__ ys, int n, int lo, int hi,
                             const unsigned* words, int nwords, double* R, double* t) {
    const int lane = threadIdx.x & 31;
    double a[17];
#pragma unroll
    for (int i = 0; i < 17; ++i) a[i] = 0.0;
    int cnt = 0;
    for (int k = 0; k < nwords; ++k) {
        const int j = k * 32 + lane;
        bool take;
        if (words) {
            const unsigned wd = words[k];
            cnt += __popc(wd);
            take = (wd >> lane) & 1u;
        } else {
            take = j >= lo && j < hi;
        }
        if (take && j < n) {
            // float64 sums of float32-exact products: the centring below cancels nothing that matters
            const double x0 = (double)xs[3 * j], x1 = (double)xs[3 * j + 1], x2 = (double)xs[3 * j + 2];
            const double y0 = (double)ys[3 * j], y1 = (double)ys[3 * j + 1], y2 = (double)ys[3 * j + 2];
            a[0] += x0; a[1] += x1; a[2] += x2;
            a[3] += y0; a[4] += y1; a[5] += y2;
            a[6] += x0 * y0; a[7] += x0 * y1; a[8] += x0 * y2;
            a[9] += x1 * y0; a[10] += x1 * y1; a[11] += x1 * y2;
            a[12] += x2 * y0; a[13] += x2 * y1; a[14] += x2 * y2;
            a[15] += x0 * x0 + x1 * x1 + x2 * x2;
            a[16] += y0 * y0 + y1 * y1 + y2 * y2;
        }
    }
#pragma unroll
    for (int i = 0; i < 17; ++i) a[i] = pg_warp_sum(a[i]);
    if (!words) cnt = max(0, min(hi, n) - lo);
    if (cnt == 0) {
        for (int i = 0; i < 9; ++i) R[i] = (i % 4 == 0) ? 1.0 : 0.0;
        t[0] = t[1] = t[2] = 0.0;
        return;
    }
    double cx[3], cy[3], s[9];
    qcp_centred_from_sums(a, cnt, cx, cy, s);
    const double ga = a[15] - (double)cnt * (cx[0] * cx[0] + cx[1] * cx[1] + cx[2] * cx[2]);
    const double gb = a[16] - (double)cnt * (cy[0] * cy[0] + cy[1] * cy[1] + cy[2] * cy[2]);
    qcp_rotation_or_identity(s, ga, gb, R);
    qcp_translation(R, cx, cy, t);
}

template <typename T> struct tm_eval_type { typedef double type; };
#if TM_EVAL_STORAGE
template <> struct tm_eval_type<float> { typedef float type; };
#endif

// Squared distance of pair j after superposing x with (R, t), in the evaluation precision C.
template <typename T, typename C>
__device__ __forceinline__ C tm_d2(const T* __restrict__ xs, const T* __restrict__ ys, int j, const C* r,
                                   const C* t) {
    const C x0 = (C)xs[3 * j], x1 = (C)xs[3 * j + 1], x2 = (C)xs[3 * j + 2];
    const C dx = r[0] * x0 + r[1] * x1 + r[2] * x2 + t[0] - (C)ys[3 * j];
    const C dy = r[3] * x0 + r[4] * x1 + r[5] * x2 + t[1] - (C)ys[3 * j + 1];
    const C dz = r[6] * x0 + r[7] * x1 + r[8] * x2 + t[2] - (C)ys[3 * j + 2];
    return dx * dx + dy * dy + dz * dz;
}

// Superpose all pairs with (R, t); write the subset d < dcut (relaxed by 0.5 A while fewer than 3
// pairs pass and n > 3) to words; optionally sum the TM terms and count the GDT/MaxSub terms.
// Returns the subset size. All lanes return the same values.
template <typename T>
__device__ int tm_evaluate(const T* __restrict__ xs, const T* __restrict__ ys, int n, int nwords, const double* Rd,
                           const double* td, double dcut, unsigned* words, bool want_score, double d0sq,
                           double* score, bool want_gdt, int* gdt, double* maxsub) {
    typedef typename tm_eval_type<T>::type C;
    const int lane = threadIdx.x & 31;
    C r[9], t[3];
    for (int i = 0; i < 9; ++i) r[i] = (C)Rd[i];
    for (int i = 0; i < 3; ++i) t[i] = (C)td[i];
    const C cut2 = (C)(dcut * dcut);
    const C inv_d0sq = (C)(1.0 / d0sq);
    int ncut = 0;
    int g0 = 0, g1 = 0, g2 = 0, g3 = 0, g4 = 0;
    double sc = 0.0, ms = 0.0;
    for (int k = 0; k < nwords; ++k) {
        const int j = k * 32 + lane;
        const bool valid = j < n;
        const C d2 = valid ? tm_d2<T, C>(xs, ys, j, r, t) : (C)0;
        const unsigned wd = __ballot_sync(TM_FULL_MASK, valid && d2 < cut2);
        if (lane == 0) words[k] = wd;
        ncut += __popc(wd);
        if (want_score && valid) sc += (double)((C)1 / ((C)1 + d2 * inv_d0sq));
        if (want_gdt) {
            // the TMscore program's strict cutoffs on squared distances: 0.5, 1, 2, 4, 8 Angstrom
            g4 += __popc(__ballot_sync(TM_FULL_MASK, valid && d2 < (C)64));
            g3 += __popc(__ballot_sync(TM_FULL_MASK, valid && d2 < (C)16));
            g2 += __popc(__ballot_sync(TM_FULL_MASK, valid && d2 < (C)4));
            g1 += __popc(__ballot_sync(TM_FULL_MASK, valid && d2 < (C)1));
            g0 += __popc(__ballot_sync(TM_FULL_MASK, valid && d2 < (C)0.25));
            if (valid && d2 < (C)12.25) ms += (double)((C)1 / ((C)1 + d2 / (C)12.25));
        }
    }
    int inc = 0;
    while (ncut < 3 && n > 3) {
        ++inc;
        const double dd = dcut + inc * 0.5;
        const C c2 = (C)(dd * dd);
        ncut = 0;
        for (int k = 0; k < nwords; ++k) {
            const int j = k * 32 + lane;
            const bool valid = j < n;
            const C d2 = valid ? tm_d2<T, C>(xs, ys, j, r, t) : (C)0;
            const unsigned wd = __ballot_sync(TM_FULL_MASK, valid && d2 < c2);
            if (lane == 0) words[k] = wd;
            ncut += __popc(wd);
        }
    }
    if (want_score) *score = pg_warp_sum(sc);
    if (want_gdt) {
        *maxsub = pg_warp_sum(ms);
        gdt[0] = g0; gdt[1] = g1; gdt[2] = g2; gdt[3] = g3; gdt[4] = g4;
    }
    __syncwarp();
    return ncut;
}

// Fragment lengths of the TMscore program's seeds: n, n/2, n/4, ... (integer halving, at least
// min(4, n)), at most 6 of them. Returns how many.
__device__ __forceinline__ int tm_seed_lengths(int n, int* L) {
    const int lmin = n < 4 ? n : 4;
    int cnt = 0, i;
    for (i = 0; i < 5; ++i) {
        const int l = n >> i;
        ++cnt;
        if (l <= lmin) {
            L[i] = lmin;
            break;
        }
        L[i] = l;
    }
    if (i == 5) {
        L[5] = lmin;
        ++cnt;
    }
    return cnt;
}

template <typename T>
__device__ void tm_search(const T* __restrict__ x, const T* __restrict__ y, int y_step, const int* __restrict__ n_ali,
                          const double* __restrict__ params, int lmax, int do_stage1, int use_smem,
                          double* __restrict__ out_score, int* __restrict__ out_task, double* __restrict__ out_rt,
                          int* __restrict__ out_gdt, double* __restrict__ out_maxsub) {
    extern __shared__ __align__(16) unsigned char tm_smem[];
    __shared__ double s_score[TM_WARPS];
    __shared__ int s_task[TM_WARPS];
    __shared__ double s_rt[TM_WARPS][12];
    __shared__ int s_gdt[TM_WARPS][5];
    __shared__ double s_ms[TM_WARPS];

    const i64 m = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = n_ali[m];
    const int nwords_max = (lmax + 31) >> 5;
    const int nwords = (n + 31) >> 5;
    const T* xs = x + m * lmax * 3;
    const T* ys = y + m * (i64)y_step * lmax * 3;
    unsigned* masks = pg_stage_subset_search(tm_smem, TM_WARPS, nwords_max, lmax, n, use_smem, xs, ys);
    unsigned* cur = masks + (warp * 2) * nwords_max;
    unsigned* nxt = masks + (warp * 2 + 1) * nwords_max;

    const double dsearch1 = params[m * 4 + 0], dsearch2 = params[m * 4 + 1], d0 = params[m * 4 + 2];
    const double inv_lnorm = params[m * 4 + 3];
    const double d0sq = d0 * d0;
    int L[6];
    const int n_len = tm_seed_lengths(n, L);
    int n_seeds = 0;
    for (int i = 0; i < n_len; ++i) n_seeds += n - L[i] + 1;
    const int n_tasks = (n >= 1) ? (do_stage1 ? 2 * n_seeds : n_seeds) : 0;

    // the warp's best rotation|translation lives in shared memory (written by lane 0): registers are
    // what limits occupancy here
    double best = -1.0;
    int best_task = 0x7fffffff;
    if (lane == 0)
        for (int i = 0; i < 12; ++i) s_rt[warp][i] = (i == 0 || i == 4 || i == 8) ? 1.0 : 0.0;
    int gmax[5] = {0, 0, 0, 0, 0};
    double msmax = 0.0;
    int g[5];
    double ms = 0.0, score = 0.0;
    double R[9], t[3];

    for (int task = blockIdx.y * TM_WARPS + warp; task < n_tasks; task += gridDim.y * TM_WARPS) {
        const bool final_stage = task < n_seeds;
        int seed = final_stage ? task : task - n_seeds;
        int li = 0;
        while (seed > n - L[li]) {
            seed -= n - L[li] + 1;
            ++li;
        }
        const double dsr = final_stage ? dsearch2 : dsearch1;
        // seed: superpose the fragment, select d < d0_search - 1
        tm_superpose<T>(xs, ys, n, seed, seed + L[li], nullptr, nwords, R, t);
        tm_evaluate<T>(xs, ys, n, nwords, R, t, dsr - 1.0, cur, final_stage, d0sq, &score, true, g, &ms);
        for (int i = 0; i < 5; ++i) gmax[i] = max(gmax[i], g[i]);
        msmax = fmax(msmax, ms);
        if (final_stage && score * inv_lnorm > best) {
            best = score * inv_lnorm;
            best_task = task;
            if (lane == 0) {
                for (int i = 0; i < 9; ++i) s_rt[warp][i] = R[i];
                for (int i = 0; i < 3; ++i) s_rt[warp][9 + i] = t[i];
            }
        }
        // extend: up to 20 rounds of superposing the subset and re-selecting d < d0_search + 1
        for (int it = 0; it < TM_MAX_ITER; ++it) {
            tm_superpose<T>(xs, ys, n, 0, 0, cur, nwords, R, t);
            // the program counts GDT/MaxSub on every round of the first search but, in the final
            // search, only at the seed superposition (its extension rounds call the overload without
            // GDT); reproduced on purpose
            tm_evaluate<T>(xs, ys, n, nwords, R, t, dsr + 1.0, nxt, final_stage, d0sq, &score, !final_stage, g, &ms);
            if (!final_stage) {
                for (int i = 0; i < 5; ++i) gmax[i] = max(gmax[i], g[i]);
                msmax = fmax(msmax, ms);
            } else if (score * inv_lnorm > best) {
                best = score * inv_lnorm;
                best_task = task;
                if (lane == 0) {
                    for (int i = 0; i < 9; ++i) s_rt[warp][i] = R[i];
                    for (int i = 0; i < 3; ++i) s_rt[warp][9 + i] = t[i];
                }
            }
            bool same = true;
            for (int k = 0; k < nwords; ++k) same = same && (cur[k] == nxt[k]);
            unsigned* tmp = cur;
            cur = nxt;
            nxt = tmp;
            __syncwarp();
            if (same) break;
        }
    }

    if (lane == 0) {
        s_score[warp] = best;
        s_task[warp] = best_task;
        for (int i = 0; i < 5; ++i) s_gdt[warp][i] = gmax[i];
        s_ms[warp] = msmax;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int bw = 0;
        for (int w = 1; w < TM_WARPS; ++w)
            if (s_score[w] > s_score[bw] || (s_score[w] == s_score[bw] && s_task[w] < s_task[bw])) bw = w;
        const i64 o = m * gridDim.y + blockIdx.y;
        out_score[o] = s_score[bw];
        out_task[o] = s_task[bw];
        for (int i = 0; i < 12; ++i) out_rt[o * 12 + i] = s_rt[bw][i];
        double msb = 0.0;
        for (int i = 0; i < 5; ++i) {
            int gm = 0;
            for (int w = 0; w < TM_WARPS; ++w) gm = max(gm, s_gdt[w][i]);
            out_gdt[o * 5 + i] = gm;
        }
        for (int w = 0; w < TM_WARPS; ++w) msb = fmax(msb, s_ms[w]);
        out_maxsub[o] = msb;
    }
}

// x: (M, lmax, 3) model CAs in aligned order, y: (M or 1, lmax, 3) the matched reference CAs (y_step 1 or 0);
// n_ali: (M,) pairs per model (rows past it are ignored)
// params: (M, 4) float64 = d0_search of stage 1, d0_search of stage 2, d0 of stage 2, 1 / L_norm
// outputs per (model, block column): (M, gridDim.y) score, task; (M, gridDim.y, 12) R|t;
// (M, gridDim.y, 5) GDT counts at 0.5, 1, 2, 4, 8 A; (M, gridDim.y) MaxSub sum.
extern "C" __global__ __launch_bounds__(TM_WARPS * 32) void tm_search_f32(
    const float* x, const float* y, int y_step, const int* n_ali, const double* params, int lmax, int do_stage1,
    int use_smem, double* out_score, int* out_task, double* out_rt, int* out_gdt, double* out_maxsub) {
    tm_search<float>(x, y, y_step, n_ali, params, lmax, do_stage1, use_smem, out_score, out_task, out_rt, out_gdt,
                     out_maxsub);
}

extern "C" __global__ __launch_bounds__(TM_WARPS * 32) void tm_search_f64(
    const double* x, const double* y, int y_step, const int* n_ali, const double* params, int lmax, int do_stage1,
    int use_smem, double* out_score, int* out_task, double* out_rt, int* out_gdt, double* out_maxsub) {
    tm_search<double>(x, y, y_step, n_ali, params, lmax, do_stage1, use_smem, out_score, out_task, out_rt, out_gdt,
                      out_maxsub);
}
