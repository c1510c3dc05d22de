// lddt.cu: lDDT of many models against one reference (OpenStructure's definition, SCORING.md).
// The NumPy twin (protgpu/scoring/lddt.py, lddt_counts_numpy) is the specification.
//
// The reference decides everything that does not depend on the model, once, on the host: the pairs of
// atoms of different residues closer than the inclusion radius, with their reference distances,
// as an ordered pair list grouped by the residue of the first atom (CSR, res_ptr), and the symmetric
// side-chain atoms with their non-symmetric partners (CSR by residue group, grp_ptr).
// Model coordinates come laid out on the reference's atoms, NaN where the model lacks an atom: every
// comparison with NaN is false, so a missing atom's pairs stay in the denominator and are never
// conserved, with no mask to read.
#include "common.cuh"

#ifndef LDDT_WARPS
#define LDDT_WARPS 8
#endif
#ifndef LDDT_MAX_THRESHOLDS
#define LDDT_MAX_THRESHOLDS 8
#endif

#define LDDT_FULL_MASK 0xffffffffu

__device__ __forceinline__ int lddt_warp_sum(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(LDDT_FULL_MASK, v, o);
    return v;
}

template <typename T>
__device__ __forceinline__ T lddt_dist(const T* __restrict__ c, int a, int b) {
    const T dx = c[3 * a] - c[3 * b], dy = c[3 * a + 1] - c[3 * b + 1], dz = c[3 * a + 2] - c[3 * b + 2];
    return pg_sqrt<T>(dx * dx + dy * dy + dz * dz);
}

template <typename T>
__device__ __forceinline__ int lddt_conserved(T d, T dref, const T* th, int n_th) {
    const T dd = fabs(d - dref);  // NaN (missing atom) fails every test below
    int c = 0;
#pragma unroll
    for (int i = 0; i < LDDT_MAX_THRESHOLDS; ++i)
        if (i < n_th && dd <= th[i]) ++c;
    return c;
}

// Symmetry resolution, one warp per (model, residue group): score the group's symmetric atoms against
// their non-symmetric partners as named and with every valid tuple swapped; swap the model's
// coordinates in place when that strictly conserves more. Partners are never symmetric atoms, so
// warps of other groups never read what this warp writes.
//   coords: (M, N, 3) in/out; entries e of group g in [grp_ptr[g], grp_ptr[g+1]): atom ent_atom[e],
//   its tuple partner ent_swap[e], the non-symmetric partner ent_partner[e] at reference distance
//   ent_dref[e]; tuples of group g in [tup_ptr[g], tup_ptr[g+1]): (tup_a, tup_b);
//   swapped: (M, G) 1 where the group was swapped (may be null).
template <typename T>
__device__ void lddt_symmetry(T* __restrict__ coords, const int* __restrict__ grp_ptr, const int* __restrict__ ent_atom,
                              const int* __restrict__ ent_swap, const int* __restrict__ ent_partner,
                              const T* __restrict__ ent_dref, const int* __restrict__ tup_ptr,
                              const int* __restrict__ tup_a, const int* __restrict__ tup_b,
                              const T* __restrict__ thresholds, int n_th, int n_groups, int n_atoms,
                              unsigned char* __restrict__ swapped) {
    const i64 m = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = blockIdx.y * LDDT_WARPS + warp;
    if (g >= n_groups) return;
    T th[LDDT_MAX_THRESHOLDS];
    for (int i = 0; i < LDDT_MAX_THRESHOLDS; ++i) th[i] = i < n_th ? thresholds[i] : (T)0;
    T* c = coords + m * n_atoms * 3;
    int c1 = 0, c2 = 0;
    for (int e = grp_ptr[g] + lane; e < grp_ptr[g + 1]; e += 32) {
        const int a = ent_atom[e], s = ent_swap[e], p = ent_partner[e];
        // a tuple counts only when the model has both of its atoms
        if (isnan(c[3 * a]) || isnan(c[3 * s])) continue;
        const T dref = ent_dref[e];
        c1 += lddt_conserved<T>(lddt_dist<T>(c, a, p), dref, th, n_th);
        c2 += lddt_conserved<T>(lddt_dist<T>(c, s, p), dref, th, n_th);
    }
    c1 = lddt_warp_sum(c1);
    c2 = lddt_warp_sum(c2);
    const bool do_swap = c2 > c1;
    if (lane == 0) {
        if (do_swap) {
            for (int k = tup_ptr[g]; k < tup_ptr[g + 1]; ++k) {
                const int a = tup_a[k], b = tup_b[k];
                if (isnan(c[3 * a]) || isnan(c[3 * b])) continue;
                for (int q = 0; q < 3; ++q) {
                    const T tmp = c[3 * a + q];
                    c[3 * a + q] = c[3 * b + q];
                    c[3 * b + q] = tmp;
                }
            }
        }
        if (swapped) swapped[m * n_groups + g] = do_swap ? 1 : 0;
    }
}

extern "C" __global__ void lddt_symmetry_f32(float* coords, const int* grp_ptr, const int* ent_atom,
                                             const int* ent_swap, const int* ent_partner, const float* ent_dref,
                                             const int* tup_ptr, const int* tup_a, const int* tup_b,
                                             const float* thresholds, int n_th, int n_groups, int n_atoms,
                                             unsigned char* swapped) {
    lddt_symmetry<float>(coords, grp_ptr, ent_atom, ent_swap, ent_partner, ent_dref, tup_ptr, tup_a, tup_b,
                         thresholds, n_th, n_groups, n_atoms, swapped);
}

extern "C" __global__ void lddt_symmetry_f64(double* coords, const int* grp_ptr, const int* ent_atom,
                                             const int* ent_swap, const int* ent_partner, const double* ent_dref,
                                             const int* tup_ptr, const int* tup_a, const int* tup_b,
                                             const double* thresholds, int n_th, int n_groups, int n_atoms,
                                             unsigned char* swapped) {
    lddt_symmetry<double>(coords, grp_ptr, ent_atom, ent_swap, ent_partner, ent_dref, tup_ptr, tup_a, tup_b,
                          thresholds, n_th, n_groups, n_atoms, swapped);
}

// Conserved-pair counts per (model, residue): one warp per residue r sums, over the ordered pairs
// [res_ptr[r], res_ptr[r+1]) whose first atom is in r, the number of thresholds each pair passes.
// A residue none of whose atoms [res_atom_ptr[r], res_atom_ptr[r+1]) is in the model gets -1.
// Block (m, tile) holds model m; when use_smem is set its coordinates are first copied to shared
// memory (n_atoms * 3 * sizeof(T) bytes of dynamic shared memory), since every pair reads two atoms.
//   out: (M, R) int32
template <typename T>
__device__ void lddt_pairs(const T* __restrict__ coords, const int* __restrict__ res_ptr,
                           const int* __restrict__ res_atom_ptr, const int* __restrict__ pair_a,
                           const int* __restrict__ pair_b, const T* __restrict__ dref,
                           const T* __restrict__ thresholds, int n_th, int n_res, int n_atoms, int use_smem,
                           int* __restrict__ out) {
    extern __shared__ __align__(16) unsigned char lddt_smem[];
    const i64 m = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const T* c = coords + m * n_atoms * 3;
    if (use_smem) {
        T* cs = (T*)lddt_smem;
        for (int i = threadIdx.x; i < 3 * n_atoms; i += blockDim.x) cs[i] = c[i];
        __syncthreads();
        c = cs;
    }
    T th[LDDT_MAX_THRESHOLDS];
    for (int i = 0; i < LDDT_MAX_THRESHOLDS; ++i) th[i] = i < n_th ? thresholds[i] : (T)0;
    for (int r = blockIdx.y * LDDT_WARPS + warp; r < n_res; r += gridDim.y * LDDT_WARPS) {
        bool here = false;
        for (int a = res_atom_ptr[r] + lane; a < res_atom_ptr[r + 1]; a += 32) here = here || !isnan(c[3 * a]);
        if (!__any_sync(LDDT_FULL_MASK, here)) {
            if (lane == 0) out[m * n_res + r] = -1;
            continue;
        }
        int cnt = 0;
        for (int p = res_ptr[r] + lane; p < res_ptr[r + 1]; p += 32)
            cnt += lddt_conserved<T>(lddt_dist<T>(c, pair_a[p], pair_b[p]), dref[p], th, n_th);
        cnt = lddt_warp_sum(cnt);
        if (lane == 0) out[m * n_res + r] = cnt;
    }
}

extern "C" __global__ void lddt_pairs_f32(const float* coords, const int* res_ptr, const int* res_atom_ptr,
                                          const int* pair_a, const int* pair_b, const float* dref,
                                          const float* thresholds, int n_th, int n_res, int n_atoms, int use_smem,
                                          int* out) {
    lddt_pairs<float>(coords, res_ptr, res_atom_ptr, pair_a, pair_b, dref, thresholds, n_th, n_res, n_atoms,
                      use_smem, out);
}

extern "C" __global__ void lddt_pairs_f64(const double* coords, const int* res_ptr, const int* res_atom_ptr,
                                          const int* pair_a, const int* pair_b, const double* dref,
                                          const double* thresholds, int n_th, int n_res, int n_atoms, int use_smem,
                                          int* out) {
    lddt_pairs<double>(coords, res_ptr, res_atom_ptr, pair_a, pair_b, dref, thresholds, n_th, n_res, n_atoms,
                       use_smem, out);
}
