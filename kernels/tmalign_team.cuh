// tmalign_team.cuh: what lets kernels/tmalign.cu compile both for the GPU (NVRTC) and on the host as
// plain C++ (g++ -DTMALIGN_HOST, tests/align/test_tmalign_kernel_host.py), plus the "teams" the
// algorithm runs on. A team is a group of threads that runs one job together: the 32 lanes of a warp
// (one seed of the TM-score search, one candidate's quick score) or the whole block (a DP, a fit).
// Members take items rank, rank + size, ...; sums and the three smallest values are reduced so that
// every member gets the same bits (a butterfly: each step adds the same two partials, in either
// order, and a + b == b + a exactly). On the host a block is one thread: every team is of size 1,
// reductions and barriers are nothing, and the code runs the same steps in the same order.
#pragma once

#ifdef TMALIGN_HOST
#include <math.h>
#include <stdint.h>
#include <string.h>
#define __device__
#define __global__
#define __forceinline__ inline
#define __restrict__ __restrict
#define TA_NOINLINE
#ifdef TMALIGN_HOST_THREADS
// A block of TMALIGN_HOST_THREADS real threads in "warps" of TMALIGN_HOST_WARP (tests only: the strided
// loops, reductions and barriers run concurrently, so a missing barrier shows up, e.g. under TSan).
#define TA_NTHREADS TMALIGN_HOST_THREADS
#define TA_WARP TMALIGN_HOST_WARP
#else
#define TA_NTHREADS 1
#endif
// No fused multiply-add on the host (x86-64 without -mfma): plain products and sums.
#define TA_MUL(a, b) ((a) * (b))
#define TA_ADD(a, b) ((a) + (b))
#define TA_RCP(a) (1.0 / (a))
#define TA_DIV_BY(a, b, inv_b) ((void)(inv_b), (a) / (b))
#else
#ifndef TA_THREADS
#define TA_THREADS 256
#endif
#define TA_NTHREADS TA_THREADS
// Large stages are kept out of line: inlining them into every caller multiplies the code (and NVRTC's time).
#define TA_NOINLINE __noinline__
// The DP's score cells are computed without contraction into FMA, in the NumPy twin's order, so that
// equal superpositions give equal score bits (the DP's tie rules then decide the same way).
#define TA_MUL(a, b) __dmul_rn((a), (b))
#define TA_ADD(a, b) __dadd_rn((a), (b))
// 1 / a correctly rounded (the same bits as the division), in fewer instructions than a division.
#define TA_RCP(a) __drcp_rn(a)
// a / b with inv_b = TA_RCP(b) computed once: quotient by the reciprocal, residual by fma, corrected
// quotient (Markstein's correction step), without a reciprocal per call. The division's bits for the
// operands here (squared distances over d0^2 >= 0.25: no overflow, no subnormal quotients), checked on
// random operands of those ranges with exact arithmetic and by the GPU tests' stored TM-align pairs.
#define TA_DIV_BY(a, b, inv_b) ta_div_by((a), (b), (inv_b))
__device__ __forceinline__ double ta_div_by(double a, double b, double inv_b) {
    const double q = __dmul_rn(a, inv_b);
    return __fma_rn(__fma_rn(-b, q, a), inv_b, q);
}
#endif

#ifndef TA_WARP
#define TA_WARP 32
#endif
#define TA_NWARPS ((TA_NTHREADS + TA_WARP - 1) / TA_WARP)
// The lanes of a warp team (TaWarp::size) as a compile-time constant, for the DP's index arithmetic
// (a modulo by a run-time size is a division): the GPU's 32, the threaded host build's "warp", and 1
// for the one-thread host build (whose TA_WARP still sizes the shared arrays).
#if defined(TMALIGN_HOST) && !defined(TMALIGN_HOST_THREADS)
#define TA_LANES 1
#else
#define TA_LANES TA_WARP
#endif
#define TA_RED_MAX 16  // most values one team reduction sums at once
// Lanes of one TM-score search seed's team on the GPU (ta_search; TaPart), so TA_SEARCH_SLOTS seeds a warp.
#ifndef TA_SEED_LANES
#define TA_SEED_LANES 16
#endif
#define TA_SEARCH_SLOTS (32 / TA_SEED_LANES)
// How much a refinement round's or a stage's score must beat the best to replace its alignment (the CPU
// path's _fast._TIE): alignments that differ only in pairs beyond score_d8 score the same, and TM-align
// keeps the first; sums in another order than TM-align's leave them an ulp apart.
#define TA_TIE 1e-12
#ifdef TMALIGN_HOST
#define TA_INF HUGE_VAL
#else
#define TA_INF __longlong_as_double(0x7ff0000000000000LL)
#endif

__device__ __forceinline__ void ta_merge3(double& a, double& b, double& c, double oa, double ob, double oc) {
    // the three smallest of two sorted triples (a multiset: duplicates count), sorted
    double r[3];
    int i = 0, j = 0;
    const double A[3] = {a, b, c}, B[3] = {oa, ob, oc};
    for (int t = 0; t < 3; ++t) {
        if (j >= 3 || (i < 3 && A[i] <= B[j])) r[t] = A[i++];
        else r[t] = B[j++];
    }
    a = r[0];
    b = r[1];
    c = r[2];
}

#if defined(TMALIGN_HOST) && defined(TMALIGN_HOST_THREADS)
#include <condition_variable>
#include <mutex>
#include <thread>

struct TaBarrier {  // a reusable barrier of n threads (generation count)
    int n = 0, waiting = 0;
    long long gen = 0;
    std::mutex m;
    std::condition_variable cv;
    void wait() {
        std::unique_lock<std::mutex> lk(m);
        const long long g = gen;
        if (++waiting == n) {
            waiting = 0;
            ++gen;
            cv.notify_all();
        } else {
            cv.wait(lk, [&] { return gen != g; });
        }
    }
};

// One emulated block: its barriers and the exchange buffers that stand in for shuffles.
struct TaHostSync {
    TaBarrier block, warp[TA_NWARPS];
    double xch[TA_NTHREADS][TA_RED_MAX];
    TaHostSync() {
        block.n = TA_NTHREADS;
        for (int w = 0; w < TA_NWARPS; ++w) warp[w].n = TA_WARP;
    }
};

// Team reductions: every member writes its values, waits, reads all members' in rank order, waits.
struct TaHostTeam {
    int rank, size, base;  // base: first thread of the team in xch
    TaBarrier* bar;  // the barrier of every thread running in step with this team
    TaHostSync* hs;
    int gbase = 0, gsize = 0;  // those threads (a half-warp team's warp; 0: the team alone)
    void sync() const { bar->wait(); }
    // Whether any thread running in step with this team (the other half of its warp too) has v.
    int step_any(int v) const {
        const int gb = gsize ? gbase : base, gs = gsize ? gsize : size;
        hs->xch[base + rank][0] = v ? 1.0 : 0.0;
        bar->wait();
        int r = 0;
        for (int i = 0; i < gs; ++i) r |= hs->xch[gb + i][0] > 0.0;
        bar->wait();
        return r;
    }
    void sums(double* v, int k) const {
        for (int i = 0; i < k; ++i) hs->xch[base + rank][i] = v[i];
        bar->wait();
        for (int i = 0; i < k; ++i) {
            double s = 0.0;
            for (int r = 0; r < size; ++r) s += hs->xch[base + r][i];
            v[i] = s;
        }
        bar->wait();
    }
    void min3(double& a, double& b, double& c) const {
        double* x = hs->xch[base + rank];
        x[0] = a;
        x[1] = b;
        x[2] = c;
        bar->wait();
        a = b = c = TA_INF;
        for (int r = 0; r < size; ++r) ta_merge3(a, b, c, hs->xch[base + r][0], hs->xch[base + r][1], hs->xch[base + r][2]);
        bar->wait();
    }
    int any(int v) const {
        double d = v ? 1.0 : 0.0;
        sums(&d, 1);
        return d > 0.0;
    }
    // shfl_up: (h, p) of the member one rank below (the lowest keeps its own); shfl: v of member src.
    void shfl_up(double& h, int& p) const {
        double* x = hs->xch[base + rank];
        x[0] = h;
        x[1] = p;
        bar->wait();
        if (rank > 0) {
            h = hs->xch[base + rank - 1][0];
            p = (int)hs->xch[base + rank - 1][1];
        }
        bar->wait();
    }
    double shfl(double v, int src) const {
        hs->xch[base + rank][0] = v;
        bar->wait();
        v = hs->xch[base + src][0];
        bar->wait();
        return v;
    }    int shfl(int v, int src) const { return (int)shfl((double)v, src); }
    // How many members below this one have pred set, and how many in all.
    void count(int pred, int& below, int& total) const {
        hs->xch[base + rank][0] = pred ? 1.0 : 0.0;
        bar->wait();
        below = total = 0;
        for (int r = 0; r < size; ++r) {
            const int v = hs->xch[base + r][0] > 0.0;
            total += v;
            below += r < rank ? v : 0;
        }
        bar->wait();
    }
};
// The DP's progress flags between warps (tmalign_pair.cuh): release / acquire.
#define TA_FLAG_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define TA_FLAG_LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define TA_SPIN() std::this_thread::yield()
#define TA_FETCH_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)

struct TaWarp : TaHostTeam {};
struct TaBlock : TaHostTeam {
    int warp, lane;
    double* red;
};

#elif defined(TMALIGN_HOST)

struct TaWarp {
    int rank, size;
    void sync() const {}
    void sums(double*, int) const {}
    void min3(double&, double&, double&) const {}
    int any(int v) const { return v; }
    int step_any(int v) const { return v; }
    void shfl_up(double&, int&) const {}
    double shfl(double v, int) const { return v; }
    int shfl(int v, int) const { return v; }
    void count(int pred, int& below, int& total) const {
        below = 0;
        total = pred ? 1 : 0;
    }
};
#define TA_FLAG_STORE(p, v) (*(p) = (v))
#define TA_FLAG_LOAD(p) (*(p))
#define TA_SPIN()
#define TA_FETCH_ADD(p, v) ((*(p) += (v)) - (v))

struct TaShared;
struct TaBlock {
    int rank, size, warp, lane;
    double* red;
    void sync() const {}
    void sums(double*, int) const {}
    void min3(double&, double&, double&) const {}
    int any(int v) const { return v; }
    int step_any(int v) const { return v; }
};

#else
#include "common.cuh"  // pg_warp_sum

// The three smallest values of the lanes of each group of 2 FIRST lanes (xor FIRST .. 1), every lane
// getting them: a whole warp's (FIRST = 16) or a part's (TaPart).
template <int FIRST>
__device__ __forceinline__ void ta_xor_min3(double& a, double& b, double& c) {
#pragma unroll
    for (int o = FIRST; o > 0; o >>= 1) {
        const double oa = __shfl_xor_sync(0xffffffffu, a, o);
        const double ob = __shfl_xor_sync(0xffffffffu, b, o);
        const double oc = __shfl_xor_sync(0xffffffffu, c, o);
        ta_merge3(a, b, c, oa, ob, oc);
    }
}

struct TaWarp {
    int rank, size;
    __device__ void sync() const { __syncwarp(); }
    __device__ void sums(double* v, int k) const {
        for (int i = 0; i < k; ++i) v[i] = pg_warp_sum(v[i]);
    }
    __device__ void min3(double& a, double& b, double& c) const { ta_xor_min3<16>(a, b, c); }
    __device__ int any(int v) const { return __any_sync(0xffffffffu, v); }
    // Whether any thread running in step with this team has v: a warp runs alone, and v is the same
    // on all its lanes wherever this is asked (a value after a team reduction).
    __device__ int step_any(int v) const { return v; }
    __device__ void shfl_up(double& h, int& p) const {
        h = __shfl_up_sync(0xffffffffu, h, 1);
        p = __shfl_up_sync(0xffffffffu, p, 1);
    }
    __device__ double shfl(double v, int src) const { return __shfl_sync(0xffffffffu, v, src); }
    __device__ int shfl(int v, int src) const { return __shfl_sync(0xffffffffu, v, src); }
    __device__ void count(int pred, int& below, int& total) const {
        const unsigned m = __ballot_sync(0xffffffffu, pred);
        below = __popc(m & ((1u << rank) - 1u));
        total = __popc(m);
    }
};
// The DP's progress flags between the warps of a block (tmalign_pair.cuh): the producer's writes are
// fenced before its flag; the consumer fences after seeing it. The flag itself is read and written by
// shared-memory atomics: plain volatile accesses worked but are, to racecheck, a race on the flag.
#define TA_FLAG_STORE(p, v) (__threadfence_block(), atomicExch((p), (v)))
#define TA_FLAG_LOAD(p) atomicAdd((p), 0)
#define TA_SPIN() __nanosleep(32)  // leave the issue slots to the warp being waited for
#define TA_FETCH_ADD(p, v) atomicAdd((p), (v))

struct TaBlock {
    int rank, size, warp, lane;
    double* red;  // shared, TA_NWARPS * TA_RED_MAX
    __device__ void sync() const { __syncthreads(); }
    // Warp sums, then every thread adds the warps' partials in warp order: the same bits everywhere.
    __device__ void sums(double* v, int k) const {
        for (int i = 0; i < k; ++i) {
            const double s = pg_warp_sum(v[i]);
            if (lane == 0) red[warp * TA_RED_MAX + i] = s;
        }
        __syncthreads();
        for (int i = 0; i < k; ++i) {
            double s = 0.0;
            for (int w = 0; w < TA_NWARPS; ++w) s += red[w * TA_RED_MAX + i];
            v[i] = s;
        }
        __syncthreads();
    }
    __device__ void min3(double& a, double& b, double& c) const {
        ta_xor_min3<16>(a, b, c);
        if (lane == 0) {
            red[warp * TA_RED_MAX] = a;
            red[warp * TA_RED_MAX + 1] = b;
            red[warp * TA_RED_MAX + 2] = c;
        }
        __syncthreads();
        a = b = c = TA_INF;
        for (int w = 0; w < TA_NWARPS; ++w)
            ta_merge3(a, b, c, red[w * TA_RED_MAX], red[w * TA_RED_MAX + 1], red[w * TA_RED_MAX + 2]);
        __syncthreads();
    }
    __device__ int any(int v) const { return __syncthreads_or(v); }
    __device__ int step_any(int v) const { return v; }
};

// A part of a warp (TA_SEED_LANES lanes) as a team, for several jobs a warp (the TM-score search's
// seeds): all parts run the same steps together, so reductions are full-warp shuffles within each part
// (xor TA_SEED_LANES / 2 .. 1), and a branch around a reduction is taken by every part when any needs it
// (step_any).
struct TaPart {
    int rank, size, part;  // lane in the part, TA_SEED_LANES, which part of the warp
    __device__ void sync() const { __syncwarp(); }
    __device__ void sums(double* v, int k) const {
        for (int i = 0; i < k; ++i) {
#pragma unroll
            for (int o = TA_SEED_LANES / 2; o > 0; o >>= 1) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
        }
    }
    __device__ void min3(double& a, double& b, double& c) const { ta_xor_min3<TA_SEED_LANES / 2>(a, b, c); }
    __device__ int any(int v) const {
        return (__ballot_sync(0xffffffffu, v) >> (TA_SEED_LANES * part)) & (0xffffffffu >> (32 - TA_SEED_LANES));
    }
    __device__ int step_any(int v) const { return __any_sync(0xffffffffu, v); }
};

#endif

// The team of one TM-score search seed (ta_search): a part of TA_SEED_LANES lanes of a warp on the GPU,
// TA_SEARCH_SLOTS seeds a warp at once (the workspace and the shared arrays hold that many a warp in
// every build); the threaded host build's "warp" is cut into as many parts as it has lanes for, and the
// one-thread build runs one seed at a time.
#if defined(TMALIGN_HOST) && !defined(TMALIGN_HOST_THREADS)
typedef TaWarp TaSeedTeam;
#define TA_SEED_TEAMS 1
__device__ __forceinline__ TaSeedTeam ta_seed_team(const TaWarp& wp, int& team) {
    team = 0;
    return wp;
}
#elif defined(TMALIGN_HOST)
typedef TaHostTeam TaSeedTeam;
#define TA_SEED_TEAMS (TA_WARP < TA_SEARCH_SLOTS ? TA_WARP : TA_SEARCH_SLOTS)
__device__ __forceinline__ TaSeedTeam ta_seed_team(const TaWarp& wp, int& team) {
    TaHostTeam t = wp;
    const int lanes = TA_WARP / TA_SEED_TEAMS;
    team = wp.rank / lanes;
    t.rank = wp.rank % lanes;
    t.size = lanes;
    t.base = wp.base + team * lanes;
    t.gbase = wp.base;
    t.gsize = wp.size;
    return t;
}
#else
typedef TaPart TaSeedTeam;
#define TA_SEED_TEAMS TA_SEARCH_SLOTS
__device__ __forceinline__ TaSeedTeam ta_seed_team(const TaWarp& wp, int& team) {
    constexpr int shift = TA_SEED_LANES == 16 ? 4 : TA_SEED_LANES == 8 ? 3 : TA_SEED_LANES == 4 ? 2 : 1;
    static_assert(TA_SEED_LANES == 1 << shift, "TA_SEED_LANES: 2, 4, 8 or 16");
    team = wp.rank >> shift;
    return TaPart{wp.rank & (TA_SEED_LANES - 1), TA_SEED_LANES, team};
}
#endif
