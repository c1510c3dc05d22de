// contacts.cu: residue-pair minimum distances (contact maps) in one fused pass.
//
// The host groups the atoms a scheme uses by residue: atom_idx[starts[r] .. starts[r+1]) are the atoms
// (indices into a frame of xyz) of residue r, r = 0..R-1. One block handles one (frame, row block of
// residues). It stages the atoms of a chunk of column residues in shared memory, keeps its row atoms in
// registers, min-reduces squared distances per (row residue, column residue) on chip with shared-memory
// atomicMin, and writes only the R x R outputs: the upper triangle from the row block and its mirror.
// The (atoms x atoms) matrix is never formed, so device memory is O(frames x R^2).
//
// Squared distances are >= 0, so their IEEE bit patterns order like the values: atomicMin on the bits
// (unsigned / unsigned long long) is a min on the floats. min is exact, so the result does not depend
// on the order of the reduction or on any tile size below, bit for bit.
#include "common.cuh"

// Row atoms per thread (register blocking: each staged column atom serves RPT row atoms).
#ifndef RPT
#define RPT 2
#endif
// Largest number of row residues in one block (the host groups rows to respect it and RPT x blockDim).
#ifndef RB
#define RB 32
#endif
// Column residues per chunk.
#ifndef JT
#define JT 64
#endif
// Column atoms staged in shared memory per pass, for float; double stages half as many (same bytes).
#ifndef COLS
#define COLS 1024
#endif

template <typename T> struct PgMinBits;
template <> struct PgMinBits<float> {
    typedef unsigned type;
    static __device__ __forceinline__ unsigned to(float v) { return __float_as_uint(v); }
    static __device__ __forceinline__ float from(unsigned b) { return __uint_as_float(b); }
    static __device__ __forceinline__ unsigned inf() { return 0x7f800000u; }
};
template <> struct PgMinBits<double> {
    typedef unsigned long long type;
    static __device__ __forceinline__ unsigned long long to(double v) {
        return (unsigned long long)__double_as_longlong(v);
    }
    static __device__ __forceinline__ double from(unsigned long long b) {
        return __longlong_as_double((long long)b);
    }
    static __device__ __forceinline__ unsigned long long inf() { return 0x7ff0000000000000ull; }
};

template <typename T> __device__ __forceinline__ T pg_inf();
template <> __device__ __forceinline__ float pg_inf<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double pg_inf<double>() { return __longlong_as_double(0x7ff0000000000000ll); }

// One staged atom: padded to 4 values so that a warp's broadcast read is a single 16/32-byte load.
template <typename T> struct alignas(4 * sizeof(T)) PgAtom4 { T x, y, z, w; };

// Is the residue pair (i, j) part of the map? Same chain: residue index difference at least min_sep
// (mdtraj's rule; the diagonal is never in). Different chains: only when inter_chain is set.
__device__ __forceinline__ bool pg_pair_allowed(int i, int j, const int* __restrict__ res_chain,
                                                const int* __restrict__ res_seq, int min_sep, int inter_chain) {
    if (i == j) return false;
    if (res_chain[i] != res_chain[j]) return inter_chain != 0;
    const int d = res_seq[i] > res_seq[j] ? res_seq[i] - res_seq[j] : res_seq[j] - res_seq[i];
    return d >= min_sep;
}

// Triclinic minimum image with a shortcut: wrap in fractional coordinates (as common.cuh does); a
// wrapped displacement shorter than half the smallest lattice-plane spacing (near2 = its square, from
// the host) is already the minimum image, so only longer ones search the 27 neighbouring images (the
// rule of common.cuh's pg_minimum_image, written out here to add the shortcut). Most atom pairs of a
// protein in a box of the usual size take the shortcut; the NumPy twin applies the same rule.
template <typename T>
__device__ __forceinline__ void pg_triclinic_image(T& dx, T& dy, T& dz, const T* box, const T* inv, T near2) {
    T sx = dx * inv[0] + dy * inv[3] + dz * inv[6];
    T sy = dx * inv[1] + dy * inv[4] + dz * inv[7];
    T sz = dx * inv[2] + dy * inv[5] + dz * inv[8];
    sx -= pg_rint<T>(sx);
    sy -= pg_rint<T>(sy);
    sz -= pg_rint<T>(sz);
    dx = sx * box[0] + sy * box[3] + sz * box[6];
    dy = sx * box[1] + sy * box[4] + sz * box[7];
    dz = sx * box[2] + sy * box[5] + sz * box[8];
    T best = dx * dx + dy * dy + dz * dz;
    if (best <= near2) return;
    const T bx = dx, by = dy, bz = dz;
    for (int i = -1; i <= 1; ++i)
        for (int j = -1; j <= 1; ++j)
            for (int k = -1; k <= 1; ++k) {
                const T cx = bx + i * box[0] + j * box[3] + k * box[6];
                const T cy = by + i * box[1] + j * box[4] + k * box[7];
                const T cz = bz + i * box[2] + j * box[5] + k * box[8];
                const T d2 = cx * cx + cy * cy + cz * cz;
                if (d2 < best) { best = d2; dx = cx; dy = cy; dz = cz; }
            }
}

template <typename T, int PBC>
__device__ void contact_map_body(const T* __restrict__ xyz, const int* __restrict__ atom_idx,
                                 const int* __restrict__ row_idx, const int* __restrict__ row_res,
                                 const int* __restrict__ starts,
                                 const int* __restrict__ rb_starts, const int* __restrict__ res_chain,
                                 const int* __restrict__ res_seq, const T* __restrict__ box,
                                 const T* __restrict__ inv, T* __restrict__ dist, unsigned char* __restrict__ contact,
                                 unsigned* __restrict__ counts, int n_frames, int n_atoms, int n_res, int n_rb,
                                 int min_sep, int inter_chain, T cutoff, T near2, int box_step,
                                 PgAtom4<T>* s_col, typename PgMinBits<T>::type* s_min, int* s_cs) {
    typedef PgMinBits<T> B;
    const int cols_t = sizeof(T) == 4 ? COLS : COLS / 2;
    const i64 bid = blockIdx.x;
    const int f = (int)(bid / n_rb);
    if (f >= n_frames) return;
    const int rb = (int)(bid - (i64)f * n_rb);
    const int I0 = rb_starts[rb], I1 = rb_starts[rb + 1];
    const int nI = I1 - I0;
    const int A0 = starts[I0], A1 = starts[I1];
    const T* xf = xyz + (i64)f * n_atoms * 3;
    const int tid = threadIdx.x, nt = blockDim.x;
    const i64 RR = (i64)n_res * n_res;

    // This frame's box in registers (constant indices after inlining), only when periodic.
    T lbox[9], linv[9];
#pragma unroll
    for (int k = 0; k < 9; ++k) {
        lbox[k] = PBC ? box[(i64)f * box_step * 9 + k] : T(0);
        linv[k] = PBC ? inv[(i64)f * box_step * 9 + k] : T(0);
    }

    // Columns start at the block's first row residue: pairs (i, j < i) are the mirror of another row's.
    for (int j0 = I0; j0 < n_res;) {
        // Chunk [j0, j1): at most JT residues and cols_t atoms, but always at least one residue (a
        // residue larger than cols_t is staged in several passes below). Every thread computes the
        // same j1 from the same reads, so the loop bounds stay uniform across the block.
        int j1 = j0 + 1;
        {
            const int lim = min(j0 + JT, n_res);
            const int base = starts[j0];
            while (j1 < lim && starts[j1 + 1] - base <= cols_t) ++j1;
        }
        const int nj = j1 - j0;
        for (int k = tid; k < nI * nj; k += nt) s_min[k] = B::inf();
        for (int k = tid; k <= nj; k += nt) s_cs[k] = starts[j0 + k];
        __syncthreads();
        const int B0 = s_cs[0], B1 = s_cs[nj];
        for (int sb = B0; sb < B1; sb += cols_t) {
            const int se = min(sb + cols_t, B1);
            for (int k = tid; k < se - sb; k += nt) {
                const T* p = xf + (i64)atom_idx[sb + k] * 3;
                PgAtom4<T> q;
                q.x = p[0]; q.y = p[1]; q.z = p[2]; q.w = T(0);
                s_col[k] = q;
            }
            __syncthreads();
            // Row atoms in passes of RPT x blockDim (one pass unless a row residue is very large).
            for (int rbase = A0; rbase < A1; rbase += nt * RPT) {
                T rx[RPT], ry[RPT], rz[RPT];
                int ril[RPT];
#pragma unroll
                for (int r = 0; r < RPT; ++r) {
                    const int a = rbase + tid + r * nt;
                    if (a < A1) {
                        const T* p = xf + (i64)row_idx[a] * 3;
                        rx[r] = p[0]; ry[r] = p[1]; rz[r] = p[2];
                        ril[r] = row_res[a] - I0;
                    } else {
                        rx[r] = ry[r] = rz[r] = T(0);
                        ril[r] = -1;
                    }
                }
                for (int jl = 0; jl < nj; ++jl) {
                    const int lo = max(s_cs[jl], sb) - sb, hi = min(s_cs[jl + 1], se) - sb;
                    if (lo >= hi) continue;  // uniform: empty residue or not in this pass
                    T m[RPT];
#pragma unroll
                    for (int r = 0; r < RPT; ++r) m[r] = pg_inf<T>();
                    for (int b = lo; b < hi; ++b) {
                        const PgAtom4<T> q = s_col[b];  // same address for the whole warp: broadcast
#pragma unroll
                        for (int r = 0; r < RPT; ++r) {
                            T dx = q.x - rx[r], dy = q.y - ry[r], dz = q.z - rz[r];
                            if (PBC == PG_PBC_ORTHO) pg_minimum_image<T>(dx, dy, dz, lbox, linv, PBC);
                            if (PBC == PG_PBC_TRICLINIC) pg_triclinic_image<T>(dx, dy, dz, lbox, linv, near2);
                            m[r] = min(m[r], dx * dx + dy * dy + dz * dz);
                        }
                    }
#pragma unroll
                    for (int r = 0; r < RPT; ++r)
                        if (ril[r] >= 0) atomicMin(&s_min[ril[r] * nj + jl], B::to(m[r]));
                }
            }
            __syncthreads();
        }
        // Upper triangle (j >= i), j fastest so that a warp's stores along a row are contiguous.
        for (int k = tid; k < nI * nj; k += nt) {
            const int il = k / nj, jl = k - il * nj;
            const int i = I0 + il, j = j0 + jl;
            if (j < i) continue;
            const bool ok = pg_pair_allowed(i, j, res_chain, res_seq, min_sep, inter_chain);
            const T d = ok ? pg_sqrt<T>(B::from(s_min[k])) : pg_inf<T>();
            const bool c = ok && d < cutoff;
            const i64 o = (i64)f * RR + (i64)i * n_res + j;
            if (dist) dist[o] = d;
            if (contact) contact[o] = c ? 1 : 0;
            if (counts && c) atomicAdd(&counts[(i64)i * n_res + j], 1u);  // c implies i < j
        }
        // Mirror (j > i) into row j, i fastest so that the stores along row j are contiguous.
        if (dist || contact) {
            for (int k = tid; k < nI * nj; k += nt) {
                const int jl = k / nI, il = k - jl * nI;
                const int i = I0 + il, j = j0 + jl;
                if (j <= i) continue;
                const bool ok = pg_pair_allowed(i, j, res_chain, res_seq, min_sep, inter_chain);
                const T d = ok ? pg_sqrt<T>(B::from(s_min[il * nj + jl])) : pg_inf<T>();
                const i64 o = (i64)f * RR + (i64)j * n_res + i;
                if (dist) dist[o] = d;
                if (contact) contact[o] = (ok && d < cutoff) ? 1 : 0;
            }
        }
        __syncthreads();  // s_min and s_cs are reused by the next chunk
        j0 = j1;
    }
}

// Shared memory is declared once here (not in the PBC instantiations, which would each get a copy).
template <typename T>
__device__ void contact_map(const T* xyz, const int* atom_idx, const int* row_idx, const int* row_res,
                            const int* starts, const int* rb_starts, const int* res_chain, const int* res_seq,
                            const T* box, const T* inv, T* dist, unsigned char* contact, unsigned* counts, int n_frames,
                            int n_atoms, int n_res, int n_rb, int min_sep, int inter_chain, T cutoff, T near2,
                            int box_step, int pbc) {
    __shared__ PgAtom4<T> s_col[sizeof(T) == 4 ? COLS : COLS / 2];
    __shared__ typename PgMinBits<T>::type s_min[RB * JT];
    __shared__ int s_cs[JT + 1];
    if (pbc == PG_PBC_NONE)
        contact_map_body<T, PG_PBC_NONE>(
            xyz, atom_idx, row_idx, row_res, starts, rb_starts, res_chain, res_seq, box, inv, dist, contact,
            counts, n_frames, n_atoms, n_res, n_rb, min_sep, inter_chain, cutoff, near2, box_step, s_col, s_min,
            s_cs);
    else if (pbc == PG_PBC_ORTHO)
        contact_map_body<T, PG_PBC_ORTHO>(
            xyz, atom_idx, row_idx, row_res, starts, rb_starts, res_chain, res_seq, box, inv, dist, contact,
            counts, n_frames, n_atoms, n_res, n_rb, min_sep, inter_chain, cutoff, near2, box_step, s_col, s_min,
            s_cs);
    else
        contact_map_body<T, PG_PBC_TRICLINIC>(
            xyz, atom_idx, row_idx, row_res, starts, rb_starts, res_chain, res_seq, box, inv, dist, contact,
            counts, n_frames, n_atoms, n_res, n_rb, min_sep, inter_chain, cutoff, near2, box_step, s_col, s_min,
            s_cs);
}

// Entry points. Grid: n_frames * n_rb blocks (block = frame * n_rb + row block), blockDim <= 256.
//   xyz (F, n_atoms, 3); atom_idx (A,) atoms grouped by residue (columns); row_idx, row_res (A,) the same
//   atoms and their residues with each row block's range [starts[I0], starts[I1]) interleaved by residue
//   (first atoms of every residue, then second atoms, ...), so that a warp's lanes hold atoms of
//   different residues and their shared-memory atomicMin rarely hit the same address;
//   starts (R+1,); rb_starts (n_rb+1,);
//   res_chain, res_seq (R,); box, inv (Fb, 9) with Fb = F (box_step 1) or 1 (box_step 0), unused if pbc 0;
//   dist (F, R, R) or NULL; contact (F, R, R) uint8 or NULL; counts (R, R) or NULL: only the strict
//   upper triangle (i < j) is incremented, once per frame in contact (the pair's unique (row block,
//   column chunk) visit; the mirror pass does not count), so the host adds the transpose once;
//   near2: squared half plane spacing of the box (triclinic only; for per-frame boxes the smallest).
extern "C" __global__ __launch_bounds__(256) void contact_map_f32(const float* xyz, const int* atom_idx,
        const int* row_idx, const int* row_res, const int* starts, const int* rb_starts, const int* res_chain,
        const int* res_seq,
        const float* box, const float* inv, float* dist, unsigned char* contact, unsigned* counts, int n_frames,
        int n_atoms, int n_res, int n_rb, int min_sep, int inter_chain, float cutoff, float near2, int box_step,
        int pbc) {
    contact_map<float>(xyz, atom_idx, row_idx, row_res, starts, rb_starts, res_chain, res_seq, box, inv, dist, contact,
                       counts, n_frames, n_atoms, n_res, n_rb, min_sep, inter_chain, cutoff, near2, box_step, pbc);
}

extern "C" __global__ __launch_bounds__(256) void contact_map_f64(const double* xyz, const int* atom_idx,
        const int* row_idx, const int* row_res, const int* starts, const int* rb_starts, const int* res_chain,
        const int* res_seq,
        const double* box, const double* inv, double* dist, unsigned char* contact, unsigned* counts, int n_frames,
        int n_atoms, int n_res, int n_rb, int min_sep, int inter_chain, double cutoff, double near2,
        int box_step, int pbc) {
    contact_map<double>(xyz, atom_idx, row_idx, row_res, starts, rb_starts, res_chain, res_seq, box, inv, dist, contact,
                        counts, n_frames, n_atoms, n_res, n_rb, min_sep, inter_chain, cutoff, near2, box_step, pbc);
}
