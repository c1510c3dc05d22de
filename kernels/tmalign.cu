// tmalign.cu: TM-align (Zhang & Skolnick 2005, US-align's TMalign code), one CUDA block per pair of
// chains, the whole algorithm inside the kernel. The specification is the CPU path,
// protgpu/align/numpy_twin.py (tm_align_pair, align_maps and the stages), _dp.py and _search.py: every
// function here names its twin, and follows it step by step (same candidates, cutoffs, rounds, tie
// rules; see docs/design/tm-align.md "GPU").
//
// Work split inside a block: the block's DPs run as strips of rows pipelined over its warps, and their
// tracebacks on warp 0 (tmalign_pair.cuh); the TM-score search gives two seeds to a warp, one to each
// half (its 16 lanes take the aligned pairs; the halves run in step); the quick scores of gapless
// threadings give one offset to a warp; the local fragment stage gives fragment pairs to a warp two at a
// time (fits, one sweep of both DPs on half the lanes each, then each traceback and quick score); the
// few block-wide sums and fits run on warp 0. Every float is a double, as in TM-align. The pair's state,
// the workspace layout and the DP are in tmalign_pair.cuh, the fits and searches in tmalign_search.cuh.
//
// The same text compiles on the host as plain C++ with TMALIGN_HOST defined (a block of one thread;
// tests/align/test_tmalign_kernel_host.py builds it with g++ and checks it against the CPU path).
#include "tmalign_team.cuh"
#include "common.cuh"
#include "qcp.cuh"
#include "tmalign_search.cuh"
#include "tmalign_pair.cuh"

// ta_superpose by warp 0 (as ta_block_sums: the same bits for every block size), given to the block.
template <class Get>
__device__ double ta_block_superpose(TaPair& P, int count, Get get, double* R, double* t) {
    double* v = P.sh->bc;
    if (P.blk.warp == 0) {
        const double rmsd = ta_superpose(P.wp, count, get, R, t);
        if (P.blk.lane == 0) {
            for (int k = 0; k < 9; ++k) v[k] = R[k];
            for (int k = 0; k < 3; ++k) v[9 + k] = t[k];
            v[12] = rmsd;
        }
    }
    P.blk.sync();
    for (int k = 0; k < 9; ++k) R[k] = v[k];
    for (int k = 0; k < 3; ++k) t[k] = v[9 + k];
    const double rmsd = v[12];
    P.blk.sync();
    return rmsd;
}

// _search.tm_search on the n pairs (xa, ya): seeds by half-warp teams, each team's first strict maximum,
// then the first seed of the highest score (the reference code's order). Returns the score (-1 for n = 0);
// (R, t) superposes the mobile coordinates.
__device__ TA_NOINLINE double ta_search(TaPair& P, const double* xa, const double* ya, int n, double d0, double d0s, double norm,
                            int step, double d8, double* R, double* t) {
    const TaBlock& b = P.blk;
    const TaWarp& wp = P.wp;
    if (n == 0) {
        ta_identity(R, t);
        return -1.0;
    }
    const long long t0 = TA_CLOCK();
    double c[6];
    ta_block_sums(P, n, c, 6, [&](int p, double* v) {
        for (int k = 0; k < 3; ++k) {
            v[k] += xa[3 * p + k];
            v[3 + k] += ya[3 * p + k];
        }
    });
    const double cx[3] = {c[0] / n, c[1] / n, c[2] / n}, cy[3] = {c[3] / n, c[4] / n, c[5] / n};
    for (int p = b.rank; p < n; p += b.size)
        for (int k = 0; k < 3; ++k) {
            P.xs[3 * p + k] = xa[3 * p + k] - cx[k];
            P.ys[3 * p + k] = ya[3 * p + k] - cy[k];
        }
    // Two seeds a warp at once, one on each half (TA_SEED_TEAMS teams a warp; team slot = warp x teams
    // + team): the halves run the same steps together, each on its own seed, so the fit's QCP and the
    // reductions serve two seeds per warp instruction.
    constexpr int TEAMS = TA_SEED_TEAMS;
    int team;
    const TaSeedTeam st = ta_seed_team(wp, team);
    const int slot = b.warp * TEAMS + team;
    if (b.rank == 0) P.sh->next_seed = TA_NWARPS * TEAMS;
    b.sync();
    const double* xs = P.xs;
    const double* ys = P.ys;
    int L[6], cnt[6], n_seeds = 0;
    const int n_len = ta_seed_lengths(n, L);
    for (int i = 0; i < n_len; ++i) n_seeds += (cnt[i] = ta_seed_count(n, L[i], step));
    double* d2 = P.d2w + (long long)slot * P.l2;
    unsigned char* cur = P.selw + 2LL * slot * P.l2;
    unsigned char* nxt = cur + P.l2;
    const double d0sq = d0 * d0, inv_d0sq = TA_RCP(d0sq);
    double wbest = -TA_INF, wr[12];
    int wseed = 0x7fffffff;
    ta_identity(wr, wr + 9);
    // seed s's length and first pair
    int len = 0, start = 0;
    auto place = [&](int s) {
        if (s >= n_seeds) return;
        int li = 0, r = s;
        while (r >= cnt[li]) r -= cnt[li++];
        len = L[li];
        start = r == cnt[li] - 1 ? n - len : r * step;
    };
    // A team takes the next seed when it is done with its last (a shared counter; a seed takes 1 to 21
    // fits): which team takes a seed does not change the result, as each team's seeds are ascending.
    // Each step is one fit: a seed's own (round -1), then the refits on its kept pairs (rounds 0 ..);
    // a team without a seed left steps along with nothing to fit until its warp's other team is done.
    int s = slot, round = -1;
    place(s);
    while (wp.any(s < n_seeds)) {
        const bool live = s < n_seeds, first = round < 0;
        const int m = live ? n : 0;  // the pairs this team scores
        double Rs[9], ts[3];
        ta_fit(st, live ? (first ? len : n) : 0, [&](int p, double* x, double* y) -> bool {
            const int q = first ? start + p : p;
            if (!first && !cur[q]) return false;
            for (int k = 0; k < 3; ++k) {
                x[k] = xs[3 * q + k];
                y[k] = ys[3 * q + k];
            }
            return true;
        }, Rs, ts);
        // distances, selection (a seed's own fit: into cur; a refit: into nxt, against cur), score
        int diff;
        const double sc = ta_search_step(st, Rs, ts, xs, ys, m, first ? d0s - 1.0 : d0s + 1.0, d0sq, inv_d0sq, d8,
                                         norm, d2, first ? cur : nxt, first ? nullptr : cur, diff);
        if (live && sc > wbest) {  // the team's first strict maximum
            wbest = sc;
            wseed = s;
            for (int k = 0; k < 9; ++k) wr[k] = Rs[k];
            for (int k = 0; k < 3; ++k) wr[9 + k] = ts[k];
        }
        const bool moved = st.any(diff);  // (outside the branch: both halves take every vote)
        bool done = false;
        if (!first) {  // the kept set repeats: the seed is done
            done = !moved || round + 1 == TA_MAX_ROUNDS;
            unsigned char* tmp = cur;
            cur = nxt;
            nxt = tmp;
        }
        ++round;
        const bool want = live && done;
        int next = 0;
        if (want && st.rank == 0) next = TA_FETCH_ADD(&P.sh->next_seed, 1);
        next = wp.shfl(next, team * (TA_LANES / TEAMS));
        if (want) {
            s = next;
            round = -1;
            place(s);
        }
        wp.sync();
    }
    if (st.rank == 0) {
        P.sh->wscore[slot] = wbest;
        P.sh->wseed[slot] = wseed;
        for (int k = 0; k < 12; ++k) P.sh->wrt[slot * 12 + k] = wr[k];
    }
    b.sync();
    int bw = 0;
    for (int w = 1; w < TA_NWARPS * TEAMS; ++w)
        if (P.sh->wscore[w] > P.sh->wscore[bw] || (P.sh->wscore[w] == P.sh->wscore[bw] && P.sh->wseed[w] < P.sh->wseed[bw]))
            bw = w;
    const double best = P.sh->wscore[bw];
    for (int k = 0; k < 9; ++k) R[k] = P.sh->wrt[bw * 12 + k];
    for (int k = 0; k < 3; ++k) t[k] = P.sh->wrt[bw * 12 + 9 + k];
    b.sync();
    for (int k = 0; k < 3; ++k) t[k] = (t[k] + cy[k]) - (R[3 * k] * cx[0] + R[3 * k + 1] * cx[1] + R[3 * k + 2] * cx[2]);
    ta_prof(P, TA_PROF_SEARCH, t0);
    return best;
}

// numpy_twin.pairs_of: the aligned pairs of a map into xa, ya (target order); returns their number.
// Warp 0 takes the target residues S at a time; a ballot gives each aligned one its place.
__device__ TA_NOINLINE int ta_gather(TaPair& P, const int* map) {
    int n = 0;
    if (P.blk.warp == 0) {
        const TaWarp& wp = P.wp;
        for (int base = 0; base < P.l2; base += wp.size) {
            const int j = base + wp.rank;
            const int i = j < P.l2 ? map[j] : -1;
            int below, total;
            wp.count(i >= 0, below, total);
            if (i >= 0)
                for (int k = 0; k < 3; ++k) {
                    P.xa[3 * (n + below) + k] = P.x[3 * i + k];
                    P.ya[3 * (n + below) + k] = P.y[3 * j + k];
                }
            n += total;
        }
    }
    return ta_bcast(P, n);
}

// numpy_twin.detailed_search: the search (seeds every `step`, pairs beyond score_d8 count nothing).
__device__ TA_NOINLINE double ta_detailed(TaPair& P, const int* map, double* R, double* t) {
    const int n = ta_gather(P, map);
    return ta_search(P, P.xa, P.ya, n, P.d0, P.d0s, P.lnorm, 40, P.d8, R, t);
}

// numpy_twin.refine: DP under the current superposition, then the search on its alignment, for each
// gap penalty until the score moves by < 1e-6 or max_iter rounds. Best score's map in map_r.
__device__ TA_NOINLINE double ta_refine(TaPair& P, double* R, double* t, const double* gaps, int n_gaps, int max_iter) {
    double best = -1.0, old = 0.0;
    const double d0sq = P.d0 * P.d0;
    for (int g = 0; g < n_gaps; ++g)
        for (int it = 0; it < max_iter; ++it) {
            ta_transform(P, P.blk, 0, R, t);
            ta_nw(P, P.blk, 0, TA_DP_TM, d0sq, gaps[g], P.map_t);
            const double score = ta_detailed(P, P.map_t, R, t);
            if (score > best + TA_TIE) {  // an equal score is a tie: the first alignment stays
                best = score;
                ta_copy_map(P, P.map_t, P.map_r);
            }
            if (it > 0 && fabs(old - score) < 1e-6) break;
            old = score;
        }
    return best;
}

// Gapless threadings (numpy_twin.threading_maps): a fragment [fs, fs + lf) of one chain slides along
// the other; offsets k0 .. k0 + nk - 1.
struct TaThread {
    int fs, lf, on_x, k0, nk;
};

__device__ __forceinline__ int ta_thread_map(const TaThread& c, int k, int j, int l1) {
    if (c.on_x) {
        const int pos = j + k;
        return (pos >= 0 && pos < c.lf) ? c.fs + pos : -1;
    }
    const int p = j - c.fs;
    if (p < 0 || p >= c.lf) return -1;
    const int pos = p + k;
    return (pos >= 0 && pos < l1) ? pos : -1;
}

__device__ TaThread ta_threading(int fs, int lf, int on_x, int min_ali, int l1, int l2) {
    TaThread c;
    c.fs = fs;
    c.lf = lf;
    c.on_x = on_x;
    c.k0 = on_x ? -l2 + min_ali : -lf + min_ali;
    const int k1 = on_x ? lf - min_ali : l1 - min_ali;
    c.nk = k1 >= c.k0 ? k1 - c.k0 + 1 : 0;
    return c;
}

// The candidate threading with the best quick score, the last on ties (numpy_twin.best_last), into
// out: one candidate per warp.
__device__ TA_NOINLINE void ta_best_threading(TaPair& P, const TaThread* sets, int n_sets, int* out) {
    const TaBlock& b = P.blk;
    const long long t0 = TA_CLOCK();
    int total = 0;
    for (int s = 0; s < n_sets; ++s) total += sets[s].nk;
    double* d2 = P.d2w + (long long)b.warp * P.l2;
    unsigned char* sel = P.selw + 2LL * b.warp * P.l2;
    double wbest = -TA_INF;
    int wc = -1;
    for (int c = b.warp; c < total; c += TA_NWARPS) {
        int s = 0, r = c;
        while (r >= sets[s].nk) r -= sets[s++].nk;
        const TaThread set = sets[s];
        const int k = set.k0 + r;
        const double sc = ta_fast_score(P.wp, P.xc, P.yc, P.l2, [&](int j) { return ta_thread_map(set, k, j, P.l1); },
                                        P.d0, P.d0s, d2, sel);
        if (sc >= wbest) {
            wbest = sc;
            wc = c;
        }
    }
    if (b.lane == 0) {
        P.sh->wscore[b.warp] = wbest;
        P.sh->wseed[b.warp] = wc;
    }
    b.sync();
    int bw = 0;
    for (int w = 1; w < TA_NWARPS; ++w)
        if (P.sh->wscore[w] > P.sh->wscore[bw] || (P.sh->wscore[w] == P.sh->wscore[bw] && P.sh->wseed[w] > P.sh->wseed[bw]))
            bw = w;
    int c = P.sh->wseed[bw];
    b.sync();
    if (c < 0) {  // no candidate at all
        for (int j = b.rank; j < P.l2; j += b.size) out[j] = -1;
    } else {
        int s = 0;
        while (c >= sets[s].nk) c -= sets[s++].nk;
        for (int j = b.rank; j < P.l2; j += b.size) out[j] = ta_thread_map(sets[s], sets[s].k0 + c, j, P.l1);
    }
    b.sync();
    ta_prof(P, TA_PROF_QUICK, t0);
}

// numpy_twin.max_fragment (one thread): the longest run of consecutive CA-CA distances below dcu0,
// the cutoff raised by factors of 1.1 until the run has min(L / 3, 4) residues. Start and end.
__device__ TA_NOINLINE void ta_max_fragment(const double* x, int n, double dcu0, int* out) {
    const int r_min = (int)(n / 3.0) < 4 ? (int)(n / 3.0) : 4;
    double cut2 = dcu0 * dcu0;
    for (int inc = 1;; ++inc) {
        int best = 0, smax = 0, emax = 0, run = 1, start = 0;
        for (int i = 1; i < n; ++i) {
            const double u = x[3 * i] - x[3 * i - 3], v = x[3 * i + 1] - x[3 * i - 2], w = x[3 * i + 2] - x[3 * i - 1];
            if (u * u + v * v + w * w < cut2) {
                ++run;
                if (i == n - 1) {
                    if (run > best) {
                        best = run;
                        smax = start;
                        emax = i;
                    }
                    run = 1;
                }
            } else {
                if (run > best) {
                    best = run;
                    smax = start;
                    emax = i - 1;
                }
                run = 1;
                start = i;
            }
        }
        if (best >= r_min) {
            out[0] = smax;
            out[1] = emax;
            return;
        }
        const double c = pow(1.1, (double)inc) * dcu0;
        cut2 = c * c;
    }
}

// numpy_twin._fragment_maps' candidate set: the fragment trimmed to its 10-89% part when it is the
// whole shorter chain, at least max(len / 2.5, 3) residues aligned.
__device__ TaThread ta_fragment_set(int fs, int lf, int on_x, int l0, int l1, int l2) {
    if (lf == l0) {
        const int a = (int)(l0 * 0.1);
        int e = (int)(l0 * 0.89) + 1;
        if (e > lf) e = lf;
        fs += a;
        lf = e - a;
    }
    const int other = on_x ? l2 : l1;
    const int m = (int)((lf < other ? lf : other) / 2.5);
    return ta_threading(fs, lf, on_x, m > 3 ? m : 3, l1, l2);
}

__device__ __forceinline__ int ta_jump(int length) {
    const int j = length > 250 ? 45 : length > 200 ? 35 : length > 150 ? 25 : 15;
    return j < length / 3 ? j : length / 3;
}

// numpy_twin.initial_local: fragment pairs superposed, DP on 1 / (1 + d^2 / (d0 + 1.5)^2) with gap 0,
// the first strictly best quick score (above 0) into map_l; one candidate per warp (each warp keeps its
// first strict maximum over its candidates, taken in order; across warps the highest score, then the
// first candidate). Returns whether one was found.
__device__ TA_NOINLINE bool ta_initial_local(TaPair& P) {
    const TaBlock& b = P.blk;
    const TaWarp& wp = P.wp;
    const int l1 = P.l1, l2 = P.l2, j1 = ta_jump(l1), j2 = ta_jump(l2), al = P.lm, w = b.warp;
    const int nfs[2] = {20 < al / 3 ? 20 : al / 3, 100 < al / 2 ? 100 : al / 2};
    int ni[2], nj[2];
    for (int f = 0; f < 2; ++f) {  // len(range(0, L - nf + 1, jump))
        ni[f] = l1 >= nfs[f] ? (l1 - nfs[f]) / j1 + 1 : 0;
        nj[f] = l2 >= nfs[f] ? (l2 - nfs[f]) / j2 + 1 : 0;
    }
    const int total = ni[0] * nj[0] + ni[1] * nj[1];
    const double d01 = P.d0 + 1.5, d01sq = d01 * d01;
    int* map = P.mapw + (long long)w * l2;
    int* keep = P.mapwb + (long long)w * l2;
    double* d2 = P.d2w + (long long)w * l2;
    unsigned char* sel = P.selw + 2LL * w * l2;
    const long long t0 = TA_CLOCK();
    double wbest = 0.0;
    int wc = -1;
    // a warp takes its candidates two at a time (c and c + W: fitted into DP slots 2 w and 2 w + 1, swept
    // together on half the lanes each, then traced back and scored in order); a last one alone on the warp
    constexpr int per_warp = TA_LANES >= 2 ? 2 : 1;  // (the one-thread host build: one at a time)
    for (int c = w; c < total; c += per_warp * TA_NWARPS) {
        const int n_c = per_warp == 2 && c + TA_NWARPS < total ? 2 : 1;
        for (int h = 0; h < n_c; ++h) {
            int f = 0, r = c + h * TA_NWARPS;
            if (r >= ni[0] * nj[0]) {
                r -= ni[0] * nj[0];
                f = 1;
            }
            const int nf = nfs[f], i = (r / nj[f]) * j1, j = (r % nj[f]) * j2;
            double R[9], t[3];
            ta_superpose(wp, nf, [&](int p, double* x, double* y) -> bool {
                for (int k = 0; k < 3; ++k) {
                    x[k] = P.x[3 * (i + p) + k];
                    y[k] = P.y[3 * (j + p) + k];
                }
                return true;
            }, R, t);
            ta_transform(P, wp, 2 * w + h, R, t);
        }
        if (n_c == 2) ta_nw_pair(P, wp, 2 * w, d01sq, 0.0);
        else ta_nw_run(P, wp, 0, 1, 2 * w, TA_DP_TM, d01sq, 0.0);
        for (int h = 0; h < n_c; ++h) {
            for (int q = wp.rank; q < l2; q += wp.size) map[q] = -1;
            wp.sync();
            ta_traceback(P, wp, P.moves + (2LL * w + h) * (l1 + 1) * (l2 + 1),
                         P.sh->tb + 2LL * TA_WARP * TA_WARP * w, map);
            wp.sync();
            const double sc = ta_fast_score(wp, P.xc, P.yc, l2, [&](int q) { return map[q]; }, P.d0, P.d0s, d2, sel);
            if (sc > wbest) {
                wbest = sc;
                wc = c + h * TA_NWARPS;
                for (int q = wp.rank; q < l2; q += wp.size) keep[q] = map[q];
            }
            wp.sync();  // (the next traceback rewrites map)
        }
    }
    if (b.lane == 0) {
        P.sh->wscore[w] = wbest;
        P.sh->wseed[w] = wc;
    }
    b.sync();
    int bw = -1;
    for (int v = 0; v < TA_NWARPS; ++v) {
        if (P.sh->wseed[v] < 0) continue;
        if (bw < 0 || P.sh->wscore[v] > P.sh->wscore[bw] ||
            (P.sh->wscore[v] == P.sh->wscore[bw] && P.sh->wseed[v] < P.sh->wseed[bw]))
            bw = v;
    }
    b.sync();
    if (bw >= 0) ta_copy_map(P, P.mapwb + (long long)bw * l2, P.map_l);
    ta_prof(P, TA_PROF_DP, t0);  // the warps' DPs with their fits and quick scores
    return bw >= 0;
}

// numpy_twin.align_maps: every initial alignment, each searched and (past its gate) refined; the best
// alignment in map_best.
__device__ TA_NOINLINE void ta_align_maps(TaPair& P) {
    const TaBlock& b = P.blk;
    const int l1 = P.l1, l2 = P.l2;
    double tm_max = -1.0, R[9], t[3], score;
    auto keep = [&](double sc, const int* map) {
        if (sc > tm_max + TA_TIE) {
            tm_max = sc;
            ta_copy_map(P, map, P.map_best);
        }
    };
    const double both[2] = {-0.6, 0.0}, zero[1] = {0.0};
    const double ddcc = P.lnorm <= 40 ? 0.1 : 0.4;
    for (int j = b.rank; j < l2; j += b.size) P.map_best[j] = -1;
    b.sync();
    long long t0 = TA_CLOCK();
    // 1. gapless threading
    int min_ali = P.lm / 2 > 5 ? P.lm / 2 : 5;
    TaThread sets[2];
    sets[0] = ta_threading(0, l1, 1, min_ali, l1, l2);
    ta_best_threading(P, sets, 1, P.map_t);
    score = ta_detailed(P, P.map_t, R, t);
    keep(score, P.map_t);
    score = ta_refine(P, R, t, both, 2, 30);
    keep(score, P.map_r);
    ta_prof(P, 0, t0);
    t0 = TA_CLOCK();
    // 2. secondary structure
    ta_nw(P, P.blk, 0, TA_DP_SS, 1.0, -1.0, P.map_t);
    score = ta_detailed(P, P.map_t, R, t);
    keep(score, P.map_t);
    if (score > tm_max * 0.2) {
        score = ta_refine(P, R, t, both, 2, 30);
        keep(score, P.map_r);
    }
    ta_prof(P, 1, t0);
    t0 = TA_CLOCK();
    // 3. local fragment superposition
    if (ta_initial_local(P)) {
        score = ta_detailed(P, P.map_l, R, t);
        keep(score, P.map_l);
        if (score > tm_max * ddcc) {
            score = ta_refine(P, R, t, both, 2, 2);
            keep(score, P.map_r);
        }
    }
    ta_prof(P, 2, t0);
    t0 = TA_CLOCK();
    // 4. the best alignment so far plus secondary structure
    const int* mb = P.map_best;
    ta_block_superpose(P, l2, [&](int j, double* x, double* y) -> bool {
        const int i = mb[j];
        if (i < 0) return false;
        for (int k = 0; k < 3; ++k) {
            x[k] = P.x[3 * i + k];
            y[k] = P.y[3 * j + k];
        }
        return true;
    }, R, t);
    ta_transform(P, P.blk, 0, R, t);
    const double d01 = P.d0 + 1.5, d01sq = d01 * d01;
    ta_nw(P, P.blk, 0, TA_DP_TM_SS, d01sq, -1.0, P.map_t);
    score = ta_detailed(P, P.map_t, R, t);
    keep(score, P.map_t);
    if (score > tm_max * ddcc) {
        score = ta_refine(P, R, t, both, 2, 30);
        keep(score, P.map_r);
    }
    ta_prof(P, 3, t0);
    t0 = TA_CLOCK();
    // 5. fragment gapless threading
    int fx[2], fy[2];
    if (b.rank == 0) {
        ta_max_fragment(P.x, l1, 4.25, fx);
        ta_max_fragment(P.y, l2, 4.25, fy);
    }
    fx[0] = ta_bcast(P, fx[0]);
    fx[1] = ta_bcast(P, fx[1]);
    fy[0] = ta_bcast(P, fy[0]);
    fy[1] = ta_bcast(P, fy[1]);
    const int lx = fx[1] - fx[0] + 1, ly = fy[1] - fy[0] + 1;
    int n_sets = 1;
    if (lx == ly && l1 == l2) {
        sets[0] = ta_fragment_set(fx[0], lx, 1, l1, l1, l2);
        sets[1] = ta_fragment_set(fy[0], ly, 0, l1, l1, l2);
        n_sets = 2;
    } else {
        const int on_x = lx < ly || (lx == ly && l1 < l2);
        sets[0] = ta_fragment_set(on_x ? fx[0] : fy[0], lx < ly ? lx : ly, on_x, P.lm, l1, l2);
    }
    ta_best_threading(P, sets, n_sets, P.map_t);
    score = ta_detailed(P, P.map_t, R, t);
    keep(score, P.map_t);
    if (score > tm_max * ddcc) {
        score = ta_refine(P, R, t, zero, 1, 2);
        keep(score, P.map_r);
    }
    ta_prof(P, 4, t0);
}

// numpy_twin.tm_align_pair for one pair: out_val = (tm_mobile, tm_target, tm, rmsd), out_n =
// n_aligned, out_rt = the returned superposition (R row-major, t), out_map = the final alignment
// (mobile residue of each target residue, -1 for gaps and for pairs dropped beyond score_d8).
__device__ TA_NOINLINE void ta_pair(TaPair& P, const double* par, double* out_val, int* out_n, double* out_rt, int* out_map) {
    const TaBlock& b = P.blk;
    const int l1 = P.l1, l2 = P.l2;
    const long long start = TA_CLOCK();
    P.lm = l1 < l2 ? l1 : l2;
    P.d0 = par[0];
    P.d0s = par[1];
    P.d8 = par[2];
    P.lnorm = (double)P.lm;
    ta_secondary(b, P.x, l1, P.secx);
    ta_secondary(b, P.y, l2, P.secy);
    double c[6];
    ta_block_sums(P, l1 > l2 ? l1 : l2, c, 6, [&](int p, double* v) {
        for (int k = 0; k < 3; ++k) {
            if (p < l1) v[k] += P.x[3 * p + k];
            if (p < l2) v[3 + k] += P.y[3 * p + k];
        }
    });
    for (int i = b.rank; i < l1; i += b.size)
        for (int k = 0; k < 3; ++k) P.xc[3 * i + k] = P.x[3 * i + k] - c[k] / l1;
    for (int j = b.rank; j < l2; j += b.size)
        for (int k = 0; k < 3; ++k) P.yc[3 * j + k] = P.y[3 * j + k] - c[3 + k] / l2;
    b.sync();
    ta_align_maps(P);
    const long long t_final = TA_CLOCK();
    // the final superposition of the alignment: a full search, scores over the aligned count
    double R[9], t[3];
    int n = ta_gather(P, P.map_best);
    ta_search(P, P.xa, P.ya, n, P.d0, P.d0s, (double)n, 1, P.d8, R, t);
    int m = 0;
    if (b.rank == 0) {  // drop the pairs farther than score_d8 (in place: m <= p)
        int p = 0;
        for (int j = 0; j < l2; ++j) {
            out_map[j] = -1;
            if (P.map_best[j] < 0) continue;
            if (sqrt(ta_d2(R, t, P.xa + 3 * p, P.ya + 3 * p)) <= P.d8) {
                out_map[j] = P.map_best[j];
                for (int k = 0; k < 3; ++k) {
                    P.xa[3 * m + k] = P.xa[3 * p + k];
                    P.ya[3 * m + k] = P.ya[3 * p + k];
                }
                ++m;
            }
            ++p;
        }
    }
    n = ta_bcast(P, m);
    const double* xa = P.xa;
    const double* ya = P.ya;
    auto pairs = [&](int p, double* x, double* y) -> bool {
        for (int k = 0; k < 3; ++k) {
            x[k] = xa[3 * p + k];
            y[k] = ya[3 * p + k];
        }
        return true;
    };
    const double rmsd = n ? ta_block_superpose(P, n, pairs, R, t) : TA_NAN;
    // the TM-scores by each length: d0 of that length, every pair scored
    auto final_search = [&](double d0, double length, double* Rf, double* tf) {
        const double d0s = d0 < 4.5 ? 4.5 : (d0 > 8.0 ? 8.0 : d0);
        return ta_search(P, xa, ya, n, d0, d0s, length, 1, 0.0, Rf, tf);
    };
    double Rt[9], tt[3], Rm[9], tmv[3];
    const double tm_t = final_search(par[3], (double)l2, Rt, tt);
    const double tm_m = final_search(par[4], (double)l1, Rm, tmv);
    double tm = tm_t;
    const double* Ro = Rt;
    const double* to = tt;
    const int mode = (int)par[7];
    if (mode == 1) {
        tm = tm_m;
        Ro = Rm;
        to = tmv;
    } else if (mode == 2) {
        tm = final_search(par[5], par[6], R, t);
        Ro = R;
        to = t;
    }
    ta_prof(P, 5, t_final);
    ta_prof(P, TA_PROF_TOTAL, start);
    if (b.rank == 0) {
        out_val[0] = tm_m;
        out_val[1] = tm_t;
        out_val[2] = tm;
        out_val[3] = rmsd;
        *out_n = n;
        for (int k = 0; k < 9; ++k) out_rt[k] = Ro[k];
        for (int k = 0; k < 3; ++k) out_rt[9 + k] = to[k];
    }
}

// Arguments of both entry points:
//   coords (N, 3) float64: every chain's CA coordinates, concatenated; chain_off (C,) int64 first row
//   of each chain, chain_len (C,) int32; pair_chain (P, 2) int32: (mobile chain, target chain) of each
//   pair; params (P, TA_NPARAM) float64 (see TA_NPARAM; gpu.py pair_params); map_off (P,) int64: where
//   each pair's alignment (L2 int32) starts in out_map; outputs out_val (P, 4), out_n (P,),
//   out_rt (P, 12), out_map (sum of L2); out_prof (P, TA_PROF_SLOTS) int64 zeros, or NULL.
#ifdef TMALIGN_HOST
#include <stdlib.h>
#ifdef TMALIGN_HOST_THREADS
#include <thread>
#include <vector>
#endif

extern "C" long long tmalign_workspace_bytes(int l1, int l2, int nwarps) {
    return ta_layout(l1, l2, nwarps, nullptr, nullptr);
}

extern "C" int tmalign_host(const double* coords, const long long* chain_off, const int* chain_len, const int* pair_chain,
                            const double* params, const long long* map_off, int n_pairs, double* out_val, int* out_n,
                            double* out_rt, int* out_map, long long* out_prof) {
    TaShared sh;
    for (int p = 0; p < n_pairs; ++p) {
        const int a = pair_chain[2 * p], c = pair_chain[2 * p + 1];
        const int l1 = chain_len[a], l2 = chain_len[c];
        unsigned char* ws = (unsigned char*)malloc(ta_layout(l1, l2, TA_NWARPS, nullptr, nullptr));
        if (!ws) return 1;
        auto run = [&](TaBlock blk, TaWarp wp) {
            TaPair P;
            P.x = coords + 3 * chain_off[a];
            P.y = coords + 3 * chain_off[c];
            P.l1 = l1;
            P.l2 = l2;
            ta_layout(l1, l2, TA_NWARPS, ws, &P);
            P.blk = blk;
            P.wp = wp;
            P.sh = &sh;
            P.prof = out_prof ? out_prof + (long long)TA_PROF_SLOTS * p : nullptr;
            ta_pair(P, params + (long long)TA_NPARAM * p, out_val + 4LL * p, out_n + p, out_rt + 12LL * p,
                    out_map + map_off[p]);
        };
#ifdef TMALIGN_HOST_THREADS
        TaHostSync* hs = new TaHostSync();
        std::vector<std::thread> threads;
        for (int tid = 0; tid < TA_NTHREADS; ++tid) {
            const int w = tid / TA_WARP, lane = tid % TA_WARP;
            TaBlock blk;
            blk.rank = tid;
            blk.size = TA_NTHREADS;
            blk.base = 0;
            blk.bar = &hs->block;
            blk.hs = hs;
            blk.warp = w;
            blk.lane = lane;
            blk.red = sh.red;
            TaWarp wp;
            wp.rank = lane;
            wp.size = TA_WARP;
            wp.base = w * TA_WARP;
            wp.bar = &hs->warp[w];
            wp.hs = hs;
            threads.emplace_back(run, blk, wp);
        }
        for (auto& t : threads) t.join();
        delete hs;
#else
        run(TaBlock{0, 1, 0, 0, sh.red}, TaWarp{0, 1});
#endif
        free(ws);
    }
    return 0;
}
#else
// One block of TA_THREADS threads per pair; workspace: one slice of ws_stride bytes per block.
extern "C" __global__ __launch_bounds__(TA_THREADS, TA_MIN_BLOCKS) void tmalign_pairs(
    const double* coords, const long long* chain_off, const int* chain_len, const int* pair_chain, const double* params,
    const long long* map_off, int n_pairs, unsigned char* workspace, long long ws_stride, double* out_val, int* out_n,
    double* out_rt, int* out_map, long long* out_prof) {
    __shared__ TaShared sh;
    const int p = blockIdx.x;
    if (p >= n_pairs) return;
    TaPair P;
    const int a = pair_chain[2 * p], c = pair_chain[2 * p + 1];
    P.x = coords + 3 * chain_off[a];
    P.y = coords + 3 * chain_off[c];
    P.l1 = chain_len[a];
    P.l2 = chain_len[c];
    ta_layout(P.l1, P.l2, TA_NWARPS, workspace + (long long)p * ws_stride, &P);
    P.blk = TaBlock{(int)threadIdx.x, (int)blockDim.x, (int)(threadIdx.x >> 5), (int)(threadIdx.x & 31), sh.red};
    P.wp = TaWarp{(int)(threadIdx.x & 31), 32};
    P.sh = &sh;
    P.prof = out_prof ? out_prof + (long long)TA_PROF_SLOTS * p : nullptr;
    ta_pair(P, params + (long long)TA_NPARAM * p, out_val + 4LL * p, out_n + p, out_rt + 12LL * p, out_map + map_off[p]);
}
#endif
