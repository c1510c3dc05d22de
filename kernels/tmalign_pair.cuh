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
    double wscore[TA_NWARPS * TA_SEARCH_SLOTS];  // each warp's (ta_initial_local) or team's (ta_search) best
    int wseed[TA_NWARPS * TA_SEARCH_SLOTS];
    double wrt[TA_NWARPS * TA_SEARCH_SLOTS * 12];
    int ival[4];
    double bc[16];  // values warp 0 gives the block (ta_block_sums, ta_block_superpose)
    int prog[TA_NWARPS];  // the block DP: cells published by each warp's current strip (ta_nw)
    int next_seed;  // the TM-score search: the next seed a warp takes (ta_search)
    unsigned char tb[TA_NWARPS * 2 * TA_WARP * TA_WARP];  // each warp's traceback window (ta_traceback)
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
    // per warp: two DP slots (xt, dv, pv: a strip's last row, moves: the local fragment stage runs two
    // DPs a warp; the block's DPs use slot 0's xt and moves and the rows of slots 0 .. W - 1),
    // TA_SEARCH_SLOTS slots of distances and selections (the TM-score search's seeds a warp), and two
    // alignment maps
    const long long nw = nwarps, ns = 2 * nw, nq = (long long)TA_SEARCH_SLOTS * nw;
    const long long nd[9] = {3LL * l1, 3LL * l2, ns * 3 * l1, 3LL * lm, 3LL * lm, 3LL * lm, 3LL * lm,
                             ns * (l2 + 1), nq * l2};
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
    const long long nb[5] = {l1, l2, ns * (l2 + 1), 2LL * nq * l2, ns * (l1 + 1) * (l2 + 1)};
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

// Sums every thread of the block gets, added by warp 0 alone: its lanes take items lane, lane + S, ...
// (add(p, v) adds item p into v[0 .. k)) and the warp's butterfly adds the lanes. The same bits for
// every block size (TA_THREADS), as the reductions inside a warp's own jobs: the block size changes
// how the work is spread, never a result.
template <class Add>
__device__ void ta_block_sums(TaPair& P, int n, double* v, int k, Add add) {
    for (int i = 0; i < k; ++i) v[i] = 0.0;
    if (P.blk.warp == 0) {
        for (int p = P.wp.rank; p < n; p += P.wp.size) add(p, v);
        P.wp.sums(v, k);
        if (P.blk.lane == 0)
            for (int i = 0; i < k; ++i) P.sh->bc[i] = v[i];
    }
    P.blk.sync();
    for (int i = 0; i < k; ++i) v[i] = P.sh->bc[i];
    P.blk.sync();
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

// _dp.nw_align for one problem: Needleman-Wunsch with free end gaps, gap_open charged when a gap
// opens after an aligned pair; ties: the diagonal when it is >= both gap moves, else the move along
// the target (j - 1) when it is >= the move along the mobile chain. score(i, j) for 0-based residues.
// The result j2i[j] (mobile residue of target residue j, or -1). Scores (the sweep's template argument
// KIND): TA_DP_TM 1 / (1 + d^2 / d0sq) under the superposition in xt, TA_DP_SS 1 for equal secondary
// structure letters, TA_DP_TM_SS their sum with 0.5 for equal letters.
// Relative time of a sweep step with 1, 2 and 4 rows a lane, for the choice of R: the warp instructions
// a step took in the H200 profile (~198, 240, 324; a step's fixed part - shuffles, the handover, the loop -
// is shared by its rows). docs/design/tm-align.md has the A/B against the fewest steps (all equal).
#ifndef TA_DP_STEP_COST_1
#define TA_DP_STEP_COST_1 83
#define TA_DP_STEP_COST_2 100
#define TA_DP_STEP_COST_4 135
#endif
#ifndef TA_DP_PARTS
#define TA_DP_PARTS 2  // the block DP's row handover in parts of S / TA_DP_PARTS columns (ta_nw_strips)
#endif
// Columns of the row above a block DP's strip reads (and its predecessor publishes) at a time, for S lanes.
__device__ __forceinline__ constexpr int ta_dp_part(int s) { return s / TA_DP_PARTS > 0 ? s / TA_DP_PARTS : 1; }
#define TA_DP_TM 0
#define TA_DP_SS 1
#define TA_DP_TM_SS 2
//
// Work split: strips of S * R rows (S = the warp's lanes, R = 1, 2 or 4 rows a lane), swept along the
// target as anti-diagonals: at step s lane l holds, for r = 0 .. R - 1, row i = strip * S * R + r * S +
// l + 1 at column j = s - l - r * S + 1, so every cell of a step lies on the diagonal i + j = strip * S *
// R + s + 2 and the R cells of a lane are independent (the lane's arithmetic overlaps). A cell takes the
// one above (and, a step earlier, the one diagonally above-left) from lane l - 1, or, for lane 0, from
// lane S - 1's row r - 1: one rotating shuffle; row 0 of lane 0 reads the row the previous strip's last
// lane left in a row buffer. No barrier inside a strip. The block's DP gives strip k to warp k mod W (W =
// the block's warps): strip k writes its last row into warp (k mod W)'s row buffer and publishes every
// S / TA_DP_PARTS columns (sh->prog, a monotone count), strip k + 1 waits for the part it reads next (the
// smaller the part, the shorter strip k + 1's lag behind strip k, the more handovers); a buffer is
// rewritten only by strip k + W, which reads (through the chain of strips between) only after strip k + 1
// has read it. Every cell is the same expression as the twin's in the same order, so the bits (and the
// tie decisions) are the twin's. Moves are stored skewed, cell (i, j) at ((i + j) mod (L2 + 1)) * (L1 + 1)
// + i: one step of a warp writes R runs of S consecutive bytes.
//
// S lanes of the warp run one DP: all of them (S = TA_LANES), or, for two of one warp's DPs at once (the local
// fragment stage's, ta_nw_pair), each half (S = TA_LANES / 2): half g sweeps DP slot slot + g.
template <int R, int KIND, int S = TA_LANES>
__device__ TA_NOINLINE void ta_nw_strips(TaPair& P, const TaWarp& wp, int q, int nw, int slot, double d0sq, double gap) {
    constexpr int H = S * R;
    // the row above is read (and published) PART columns at a time: strip k + 1 runs PART + H - 2 steps
    // behind strip k (S + H - 2 with whole chunks of S)
    constexpr int PART = ta_dp_part(S);
    const int lane = S == TA_LANES ? wp.rank : wp.rank % S, base = wp.rank - lane;  // lane in the half, its first
    if (S != TA_LANES) slot += base / S;
    const int l1 = P.l1, l2 = P.l2, w = l2 + 1;
    const int from = base + (lane == 0 ? S - 1 : lane - 1);  // the rotating shuffle's source
    const double* xt = P.xt + 3LL * slot * l1;
    unsigned char* moves = P.moves + (long long)slot * (l1 + 1) * (l2 + 1);
    int* prog = P.sh->prog;
    const double* y = P.y;  // (locals: the stores through char pointers below may alias P)
    const unsigned char* secy = P.secy;
    const double inv_d0sq = TA_RCP(d0sq);
    for (int st = q; st * H < l1; st += nw) {
        const int mine = nw > 1 ? q : slot, prev = nw > 1 ? (q + nw - 1) % nw : slot;
        double* my_h = P.dv + (long long)mine * w;
        unsigned char* my_p = P.pv + (long long)mine * w;
        const double* up_h = P.dv + (long long)prev * w;
        const unsigned char* up_p = P.pv + (long long)prev * w;
        const int need_base = (st - 1) * w, pub_base = st * w;
        double own[R], diag[R], ax[R], ay[R], az[R];  // H(i, j - 1); H(i - 1, j - 1); row i's mobile residue
        unsigned char sx[R];
        int own_p = 0;  // bit r: row r's last cell took the diagonal
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int i = st * H + r * S + lane + 1;
            const int ii = i <= l1 ? i - 1 : 0;
            own[r] = diag[r] = 0.0;
            ax[r] = xt[3 * ii];
            ay[r] = xt[3 * ii + 1];
            az[r] = xt[3 * ii + 2];
            sx[r] = P.secx[ii];
        }
        double chunk_h = 0.0;
        int chunk_p = 0;
        // c = s mod S; kd = (i + j) mod (L2 + 1), the skewed column of this step's cells
        for (int s = 0, c = 0, kd = (st * H + 2) % w; s < l2 + H - 1;
             ++s, c = c + 1 == S ? 0 : c + 1, kd = kd + 1 == w ? 0 : kd + 1) {
            if (c % PART == 0) {  // the row above's next PART columns, s + 1 ..: into lanes c .. c + PART - 1
                const int col = s - c + 1 + lane;  // (lane l holds column s - c + 1 + l of this S-step chunk)
                const bool part = lane >= c && lane < c + PART;
                if (part) {
                    chunk_h = 0.0;
                    chunk_p = 0;
                }
                if (st > 0) {
                    if (nw > 1) {
                        const int need = need_base + (s + PART < l2 ? s + PART : l2);
                        while (TA_FLAG_LOAD(prog + prev) < need) TA_SPIN();
#ifndef TMALIGN_HOST
                        __threadfence_block();
#endif
                    }
                    if (part && col <= l2) {
                        chunk_h = ((volatile const double*)up_h)[col];
                        chunk_p = ((volatile const unsigned char*)up_p)[col];
                    }
                }
            }
            const int recv_p = wp.shfl(own_p, from);
            const double top_h = wp.shfl(chunk_h, base + c);
            const int top_p = wp.shfl(chunk_p, base + c);
            int new_p = 0;
            double last = 0.0;  // the shuffled value of row r - 1 (lane 0's row above for r > 0)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const double got = wp.shfl(own[r], from);  // before row r's update: the last step's
                // H(i - 1, j) and whether it took the diagonal
                const double uh = lane > 0 ? got : r == 0 ? top_h : last;
                const int up = lane > 0 ? (recv_p >> r) & 1 : r == 0 ? top_p : (recv_p >> (r > 0 ? r - 1 : 0)) & 1;
                last = got;
                const int i = st * H + r * S + lane + 1, j = s - lane - r * S + 1;
                if (i <= l1 && j >= 1 && j <= l2) {
                    double sc;
                    if (KIND == TA_DP_SS) {
                        sc = sx[r] == secy[j - 1] ? 1.0 : 0.0;
                    } else {
                        const double* b = y + 3 * (j - 1);
                        const double e0 = ax[r] - b[0], e1 = ay[r] - b[1], e2 = az[r] - b[2];
                        const double d2 = TA_ADD(TA_ADD(TA_MUL(e0, e0), TA_MUL(e1, e1)), TA_MUL(e2, e2));
                        sc = TA_RCP(1.0 + TA_DIV_BY(d2, d0sq, inv_d0sq));
                        if (KIND == TA_DP_TM_SS) sc = TA_ADD(sc, sx[r] == secy[j - 1] ? 0.5 : 0.0);
                    }
                    const double d = diag[r] + sc;
                    const double h = uh + (up ? gap : 0.0);  // from (i - 1, j)
                    const double v = own[r] + (((own_p >> r) & 1) ? gap : 0.0);  // from (i, j - 1)
                    unsigned char m;
                    if (d >= h && d >= v) {
                        own[r] = d;
                        m = 0;
                    } else if (v >= h) {
                        own[r] = v;
                        m = 1;
                    } else {
                        own[r] = h;
                        m = 2;
                    }
                    new_p |= (m == 0) << r;
                    moves[(long long)kd * (l1 + 1) + i] = m;
                    if (r == R - 1 && lane == S - 1) {
                        my_h[j] = own[r];
                        my_p[j] = (unsigned char)(m == 0);
                        if (nw > 1 && (j % PART == 0 || j == l2)) TA_FLAG_STORE(prog + q, pub_base + j);
                    }
                } else {
                    new_p |= own_p & (1 << r);
                }
                diag[r] = uh;
            }
            own_p = new_p;
        }
        wp.sync();  // one warp alone: its next strip reads this strip's row
    }
}

// Rows a lane takes in the DP of L1 x L2 on W warps of S lanes: the R of 1, 2, 4 with the least time,
// steps weighted by TA_DP_STEP_COST_R. The strips' pipeline: strip k (of n, each L2 + H - 1 steps, H = S R)
// starts when strip k - 1 is PART + H - 2 steps ahead (the lag of ta_nw_strips) and strip k - W, the last one
// on its warp, is done: start_k = max(start_{k-1} + lag, start_{k-W} + steps), whose largest path for the
// last strip takes either no turn through a warp's previous strip or as many as it can.
__device__ __forceinline__ int ta_rows_per_lane(int l1, int l2, int S, int W) {
#ifdef TA_DP_ROWS
    return TA_DP_ROWS;  // tests: one R throughout
#endif
    int best = 1;
    long long best_time = -1;
    const int part = ta_dp_part(S);
    for (int R = 1; R <= 4; R *= 2) {
        const long long n = (l1 + S * R - 1) / (S * R), steps = l2 + S * R - 1, lag = part + S * R - 2;
        const long long k = n - 1, via_warps = (k / W) * steps + (k % W) * lag, last = k * lag > via_warps ? k * lag : via_warps;
        const long long cost = R == 1 ? TA_DP_STEP_COST_1 : R == 2 ? TA_DP_STEP_COST_2 : TA_DP_STEP_COST_4;
        const long long time = cost * (last + steps);
        if (best_time < 0 || time < best_time) {
            best_time = time;
            best = R;
        }
    }
    return best;
}

// The sweep with the R ta_rows_per_lane picks, on DPs of S lanes (ta_nw_strips).
template <int KIND, int S = TA_LANES>
__device__ __forceinline__ void ta_nw_rows(TaPair& P, const TaWarp& wp, int q, int nw, int slot, double d0sq, double gap) {
    const int R = ta_rows_per_lane(P.l1, P.l2, S == TA_LANES ? wp.size : S, nw);  // (wp.size is TA_LANES)
    if (R == 4) ta_nw_strips<4, KIND, S>(P, wp, q, nw, slot, d0sq, gap);
    else if (R == 2) ta_nw_strips<2, KIND, S>(P, wp, q, nw, slot, d0sq, gap);
    else ta_nw_strips<1, KIND, S>(P, wp, q, nw, slot, d0sq, gap);
}

// The score kind is a template argument of the sweep (no branch per cell; a TM-score DP reads no letters).
__device__ __forceinline__ void ta_nw_run(TaPair& P, const TaWarp& wp, int q, int nw, int slot, int kind, double d0sq,
                                          double gap) {
    if (kind == TA_DP_SS) ta_nw_rows<TA_DP_SS>(P, wp, q, nw, slot, d0sq, gap);
    else if (kind == TA_DP_TM_SS) ta_nw_rows<TA_DP_TM_SS>(P, wp, q, nw, slot, d0sq, gap);
    else ta_nw_rows<TA_DP_TM>(P, wp, q, nw, slot, d0sq, gap);
}

// Two TM-score DPs of L1 x L2 on one warp (the local fragment stage's: the same d0sq and gap, two
// superpositions), each on half the lanes: slot's and slot + 1's (their xt and moves; traced back
// apart). Two half-warp sweeps of S / 2 lanes take fewer steps than two whole-warp ones, as a strip's fill
// and drain (S R - 1 steps) halve and the chains' rows are cut finer.
__device__ __forceinline__ void ta_nw_pair(TaPair& P, const TaWarp& wp, int slot, double d0sq, double gap) {
#if TA_LANES >= 2
    ta_nw_rows<TA_DP_TM, TA_LANES / 2>(P, wp, 0, 1, slot, d0sq, gap);
#endif
}

// The DP's traceback on one warp (S lanes). From (i, j) the path runs through diagonals i + j, i + j - 1,
// ... and rows i, i - 1, ...: the warp loads the window of 2S diagonals by S rows ending at (i, j) into
// shared memory (lane q: diagonals k - q and k - S - q, each S consecutive bytes of the skewed moves),
// then lane 0 walks it until the path leaves it; one round trip to memory per 16 to 32 steps of the
// path instead of one per step.
__device__ TA_NOINLINE void ta_traceback(const TaPair& P, const TaWarp& wp, const unsigned char* moves, unsigned char* win,
                                         int* j2i) {
    constexpr int S = TA_LANES;  // (= wp.size)
    const int l1 = P.l1, l2 = P.l2, lane = wp.rank, w = l2 + 1;
    int i = l1, j = l2;
    while (i > 0 && j > 0) {
        const int k = i + j, i0 = i - S + 1;
        for (int h = 0; h < 2; ++h) {
            const int dq = lane + h * S, kq = k - dq;
            // diagonal kq's cells (ii, kq - ii) lie at consecutive bytes from here (ii from 0); kq < 2
            // holds no cell of the matrix (jj < 1 below)
            const unsigned char* diag = moves + (kq >= 0 ? (long long)(kq % w) * (l1 + 1) : 0LL);
            for (int r = 0; r < S; ++r) {
                const int ii = i0 + r, jj = kq - ii;
                win[dq * S + r] = (ii >= 1 && jj >= 1 && jj <= l2) ? diag[ii] : 0;
            }
        }
        wp.sync();
        if (lane == 0) {
            while (i > 0 && j > 0) {
                const int dq = k - i - j, r = i - i0;
                if (dq >= 2 * S || r < 0) break;
                const unsigned char m = win[dq * S + r];
                if (m == 0) j2i[j - 1] = i - 1;
                if (m != 1) --i;
                if (m != 2) --j;
            }
        }
        i = wp.shfl(i, 0);
        j = wp.shfl(j, 0);
        wp.sync();  // the next round rewrites the window
    }
}

__device__ __forceinline__ bool ta_is_block(const TaBlock&) { return true; }
__device__ __forceinline__ bool ta_is_block(const TaWarp&) { return false; }

// The team (the block, or one warp: its own slot) runs the DP; the block's uses slot 0's xt and moves.
template <class Team>
__device__ TA_NOINLINE void ta_nw(TaPair& P, const Team& b, int slot, int kind, double d0sq, double gap, int* j2i) {
    const int l1 = P.l1, l2 = P.l2;
    const long long t0 = TA_CLOCK();
    const bool block = ta_is_block(b) && TA_NWARPS > 1;
    for (int j = b.rank; j < l2; j += b.size) j2i[j] = -1;
    if (block) {
        for (int v = b.rank; v < TA_NWARPS; v += b.size) P.sh->prog[v] = -1;
        b.sync();
        ta_nw_run(P, P.wp, P.blk.warp, TA_NWARPS, 0, kind, d0sq, gap);
    } else {
        ta_nw_run(P, P.wp, 0, 1, slot, kind, d0sq, gap);
    }
    b.sync();
    if (!block || P.blk.warp == 0)
        ta_traceback(P, P.wp, P.moves + (long long)slot * (l1 + 1) * (l2 + 1),
                     P.sh->tb + 2LL * TA_WARP * TA_WARP * P.blk.warp, j2i);
    b.sync();
    if (ta_is_block(b)) ta_prof(P, TA_PROF_DP, t0);  // the block's DPs (the warps' are in their stage)
}
