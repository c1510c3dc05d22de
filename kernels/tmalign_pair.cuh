// tmalign_pair.cuh: one pair's state in kernels/tmalign.cu (TaPair: inputs, parameters, its slice of
// the global workspace), the per-pair helpers, secondary structure and the DP (NumPy twins in
// protgpu/align/_dp.py). Host-compilable like the rest (tmalign_team.cuh).
#pragma once
#include "tmalign_team.cuh"

#define TA_NPARAM 8  // per pair: d0, d0_search, score_d8, d0 of L2, of L1, of l_norm, l_norm, its mode
#ifndef TA_MIN_BLOCKS
#define TA_MIN_BLOCKS 2  // blocks per SM the register budget is cut for (__launch_bounds__)
#endif
// Where the time goes (out_prof, when not NULL): SM clock cycles per pair, measured by thread 0.
// Slots: the five initial alignments with their refinement, the final scores, then (across stages)
// time in the DP, in TM-score searches, in quick scores, and the whole pair.
#define TA_PROF_SLOTS 10
#define TA_PROF_DP 6
#define TA_PROF_SEARCH 7
#define TA_PROF_QUICK 8
#define TA_PROF_TOTAL 9
#ifdef TMALIGN_HOST
#define TA_CLOCK() 0LL
#else
#define TA_CLOCK() ((long long)clock64())
#endif

struct TaShared {
    double red[TA_NWARPS * TA_RED_MAX];
    double wscore[TA_NWARPS];
    int wseed[TA_NWARPS];
    double wrt[TA_NWARPS * 12];
    int ival[4];
};

// One pair's inputs, parameters and workspace (a slice of the launch's global workspace).
struct TaPair {
    const double* x;  // mobile CA (l1, 3)
    const double* y;  // target CA (l2, 3)
    int l1, l2, lm;
    double d0, d0s, d8, lnorm;  // numpy_twin.SearchParameters (l_norm = min(L1, L2))
    double *xc, *yc, *xt, *xa, *ya, *xs, *ys, *dv, *d2w;
    int *map_best, *map_t, *map_r, *map_l, *mapw, *mapwb;
    unsigned char *secx, *secy, *pv, *selw, *moves;
    TaBlock blk;
    TaWarp wp;
    TaShared* sh;
    long long* prof;  // TA_PROF_SLOTS counters of this pair, or NULL
};

__device__ __forceinline__ void ta_prof(const TaPair& P, int slot, long long since) {
    if (P.prof && P.blk.rank == 0) P.prof[slot] += TA_CLOCK() - since;
}

__device__ __forceinline__ long long ta_round8(long long v) { return (v + 7) & ~7LL; }

// The workspace of one pair: its size in bytes (and, given base, the pointers of P). The Python side
// (protgpu/align/gpu.py, workspace_bytes) computes the same number; the host test compares them.
__device__ long long ta_layout(int l1, int l2, int nwarps, unsigned char* base, TaPair* P) {
    const int lm = l1 < l2 ? l1 : l2;
    long long off = 0;
    // per warp: the DP's buffers (xt, dv, pv, moves: the local fragment stage runs one DP per warp; the
    // block's DPs use warp 0's), distances and selections, and two alignment maps
    const long long nw = nwarps;
    const long long nd[9] = {3LL * l1, 3LL * l2, nw * 3 * l1, 3LL * lm, 3LL * lm, 3LL * lm, 3LL * lm,
                             nw * 3 * (l1 + 1), nw * l2};
    const long long ni[6] = {l2, l2, l2, l2, nw * l2, nw * l2};
    double** dp[9] = {0};
    int** ip[6] = {0};
    unsigned char** bp[5] = {0};
    if (P) {
        double** d[9] = {&P->xc, &P->yc, &P->xt, &P->xa, &P->ya, &P->xs, &P->ys, &P->dv, &P->d2w};
        int** i[6] = {&P->map_best, &P->map_t, &P->map_r, &P->map_l, &P->mapw, &P->mapwb};
        unsigned char** b[5] = {&P->secx, &P->secy, &P->pv, &P->selw, &P->moves};
        for (int k = 0; k < 9; ++k) dp[k] = d[k];
        for (int k = 0; k < 6; ++k) ip[k] = i[k];
        for (int k = 0; k < 5; ++k) bp[k] = b[k];
    }
    for (int k = 0; k < 9; ++k) {
        if (P) *dp[k] = (double*)(base + off);
        off += ta_round8(nd[k] * 8);
    }
    for (int k = 0; k < 6; ++k) {
        if (P) *ip[k] = (int*)(base + off);
        off += ta_round8(4LL * ni[k]);
    }
    const long long nb[5] = {l1, l2, nw * 2 * (l1 + 1), 2LL * nw * l2, nw * (l1 + 1) * (l2 + 1)};
    for (int k = 0; k < 5; ++k) {
        if (P) *bp[k] = base + off;
        off += ta_round8(nb[k]);
    }
    return off;
}

// A value thread 0 computed, given to every thread of the block.
__device__ __forceinline__ int ta_bcast(TaPair& P, int v) {
    if (P.blk.rank == 0) P.sh->ival[0] = v;
    P.blk.sync();
    const int r = P.sh->ival[0];
    P.blk.sync();
    return r;
}

__device__ TA_NOINLINE void ta_copy_map(TaPair& P, const int* from, int* to) {
    for (int j = P.blk.rank; j < P.l2; j += P.blk.size) to[j] = from[j];
    P.blk.sync();
}

// _dp.secondary_structure: H, E, T or C per residue from the CA distances among i-2..i+2.
__device__ TA_NOINLINE void ta_secondary(const TaBlock& b, const double* x, int n, unsigned char* sec) {
    for (int i = b.rank; i < n; i += b.size) {
        unsigned char c = 'C';
        if (n >= 5 && i >= 2 && i < n - 2) {
            auto d = [&](int a, int e) {
                const double* p = x + 3 * (i + a);
                const double* q = x + 3 * (i + e);
                const double u = p[0] - q[0], v = p[1] - q[1], w = p[2] - q[2];
                return sqrt(u * u + v * v + w * w);
            };
            const double d13 = d(-2, 0), d14 = d(-2, 1), d15 = d(-2, 2), d24 = d(-1, 1), d25 = d(-1, 2), d35 = d(0, 2);
            auto near = [&](double i3, double i4, double i5, double tol) {
                return fabs(d15 - i5) < tol && fabs(d14 - i4) < tol && fabs(d25 - i4) < tol && fabs(d13 - i3) < tol &&
                       fabs(d24 - i3) < tol && fabs(d35 - i3) < tol;
            };
            c = near(5.45, 5.18, 6.37, 2.1) ? 'H' : near(6.1, 10.4, 13.0, 1.42) ? 'E' : d15 < 8.0 ? 'T' : 'C';
        }
        sec[i] = c;
    }
}

// _dp.transform: the mobile chain under (R, t) into DP slot w's xt, summed u_k0 x_0 + u_k1 x_1 +
// u_k2 x_2 + t_k.
template <class Team>
__device__ TA_NOINLINE void ta_transform(TaPair& P, const Team& tm, int w, const double* R, const double* t) {
    double* xt = P.xt + 3LL * w * P.l1;
    for (int i = tm.rank; i < P.l1; i += tm.size) {
        const double* a = P.x + 3 * i;
        for (int k = 0; k < 3; ++k)
            xt[3 * i + k] = TA_ADD(TA_ADD(TA_ADD(TA_MUL(R[3 * k], a[0]), TA_MUL(R[3 * k + 1], a[1])),
                                          TA_MUL(R[3 * k + 2], a[2])), t[k]);
    }
    tm.sync();
}

// _dp.tm_scores_matrix's cell: 1 / (1 + d^2 / d0^2) between superposed mobile i (in xt) and target j.
__device__ __forceinline__ double ta_tm_cell(const TaPair& P, const double* xt, int i, int j, double d0sq) {
    const double* a = xt + 3 * i;
    const double* b = P.y + 3 * j;
    const double e0 = a[0] - b[0], e1 = a[1] - b[1], e2 = a[2] - b[2];
    const double d2 = TA_ADD(TA_ADD(TA_MUL(e0, e0), TA_MUL(e1, e1)), TA_MUL(e2, e2));
    return 1.0 / (1.0 + d2 / d0sq);
}

// _dp.nw_align for one problem: Needleman-Wunsch with free end gaps, gap_open charged when a gap
// opens after an aligned pair; ties: the diagonal when it is >= both gap moves, else the move along
// the target (j - 1) when it is >= the move along the mobile chain. score(i, j) for 0-based residues.
// The result j2i[j] (mobile residue of target residue j, or -1). Scores (one function, not a template
// per score: the code stays small): TA_DP_TM 1 / (1 + d^2 / d0sq) under the superposition in xt,
// TA_DP_SS 1 for equal secondary structure letters, TA_DP_TM_SS their sum with 0.5 for equal letters.
#define TA_DP_TM 0
#define TA_DP_SS 1
#define TA_DP_TM_SS 2
// The team (the block, or one warp) uses the DP buffers of slot `slot` (warp 0's for the block).
template <class Team>
__device__ TA_NOINLINE void ta_nw(TaPair& P, const Team& b, int slot, int kind, double d0sq, double gap, int* j2i) {
    const int l1 = P.l1, l2 = P.l2, w = l2 + 1;
    const double* xt = P.xt + 3LL * slot * l1;
    auto score = [&](int i, int j) -> double {
        const double ss = P.secx[i] == P.secy[j] ? 1.0 : 0.0;
        if (kind == TA_DP_SS) return ss;
        const double s = ta_tm_cell(P, xt, i, j, d0sq);
        return kind == TA_DP_TM ? s : TA_ADD(s, 0.5 * ss);
    };
    double* va = P.dv + 3LL * slot * (l1 + 1);  // diagonal k - 2
    double* vb = va + (l1 + 1);  // k - 1
    double* vc = va + 2 * (l1 + 1);  // k
    unsigned char* pb = P.pv + 2LL * slot * (l1 + 1);  // k - 1 took the diagonal move
    unsigned char* pc = pb + (l1 + 1);
    unsigned char* moves = P.moves + (long long)slot * (l1 + 1) * (l2 + 1);
    const long long t0 = TA_CLOCK();
    for (int i = b.rank; i <= l1; i += b.size) {
        va[i] = vb[i] = 0.0;
        pb[i] = 0;
    }
    for (int j = b.rank; j < l2; j += b.size) j2i[j] = -1;
    b.sync();
    for (int k = 2; k <= l1 + l2; ++k) {
        const int lo = k - l2 > 1 ? k - l2 : 1, hi = l1 < k - 1 ? l1 : k - 1;
        for (int i = b.rank; i <= l1; i += b.size) {
            if (i < lo || i > hi) {
                vc[i] = 0.0;
                pc[i] = 0;
                continue;
            }
            const int j = k - i;
            const double d = va[i - 1] + score(i - 1, j - 1);
            const double h = vb[i - 1] + (pb[i - 1] ? gap : 0.0);  // from (i - 1, j)
            const double v = vb[i] + (pb[i] ? gap : 0.0);  // from (i, j - 1)
            unsigned char m;
            if (d >= h && d >= v) {
                vc[i] = d;
                m = 0;
            } else if (v >= h) {
                vc[i] = v;
                m = 1;
            } else {
                vc[i] = h;
                m = 2;
            }
            pc[i] = m == 0;
            moves[(long long)i * w + j] = m;
        }
        b.sync();
        double* tv = va;
        va = vb;
        vb = vc;
        vc = tv;
        unsigned char* tp = pb;
        pb = pc;
        pc = tp;
    }
    if (b.rank == 0) {
        int i = l1, j = l2;
        while (i > 0 && j > 0) {
            const unsigned char m = moves[(long long)i * w + j];
            if (m == 0) j2i[j - 1] = i - 1;
            if (m != 1) --i;
            if (m != 2) --j;
        }
    }
    b.sync();
    if (b.size == P.blk.size) ta_prof(P, TA_PROF_DP, t0);  // the block's DPs (the warps' are in their stage)
}
