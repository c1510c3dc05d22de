// common.cuh: small helpers shared by every protgpu kernel. The loader inlines this file as text
// (it is never #included from disk at compile time), so the kernel cache key covers it.
#pragma once

typedef long long i64;

// Grid-stride loop over [0, n) with 64-bit indices: outputs of F * N * N elements pass 2^31 easily.
#define PG_GRID_STRIDE_LOOP(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (i64)(n); i += (i64)blockDim.x * gridDim.x)

template <typename T> __device__ __forceinline__ T pg_sqrt(T v);
template <> __device__ __forceinline__ float pg_sqrt<float>(float v) { return sqrtf(v); }
template <> __device__ __forceinline__ double pg_sqrt<double>(double v) { return sqrt(v); }

template <typename T> __device__ __forceinline__ T pg_rint(T v);
template <> __device__ __forceinline__ float pg_rint<float>(float v) { return rintf(v); }
template <> __device__ __forceinline__ double pg_rint<double>(double v) { return rint(v); }

// Periodic boundary modes, as the host passes them.
#define PG_PBC_NONE 0
#define PG_PBC_ORTHO 1
#define PG_PBC_TRICLINIC 2

// Minimum-image displacement d (in place) for one frame's box, in the arithmetic type A.
//   box: 9 values of type B, rows are the box vectors a, b, c (Angstrom); inv: the inverse matrix.
// Orthorhombic: each component wraps by its box length. Triclinic: wrap in fractional coordinates,
// then look at the 27 neighbouring images, because the fractional wrap alone is not the minimum image
// for a skewed cell.
template <typename A, typename B>
__device__ __forceinline__ void pg_minimum_image(A& dx, A& dy, A& dz, const B* box, const B* inv, int pbc) {
    if (pbc == PG_PBC_ORTHO) {
        dx -= (A)box[0] * pg_rint<A>(dx * (A)inv[0]);
        dy -= (A)box[4] * pg_rint<A>(dy * (A)inv[4]);
        dz -= (A)box[8] * pg_rint<A>(dz * (A)inv[8]);
    } else if (pbc == PG_PBC_TRICLINIC) {
        // fractional s = d . inv (d a row vector)
        A sx = dx * (A)inv[0] + dy * (A)inv[3] + dz * (A)inv[6];
        A sy = dx * (A)inv[1] + dy * (A)inv[4] + dz * (A)inv[7];
        A sz = dx * (A)inv[2] + dy * (A)inv[5] + dz * (A)inv[8];
        sx -= pg_rint<A>(sx);
        sy -= pg_rint<A>(sy);
        sz -= pg_rint<A>(sz);
        A bx = sx * (A)box[0] + sy * (A)box[3] + sz * (A)box[6];
        A by = sx * (A)box[1] + sy * (A)box[4] + sz * (A)box[7];
        A bz = sx * (A)box[2] + sy * (A)box[5] + sz * (A)box[8];
        A best = bx * bx + by * by + bz * bz;
        A rx = bx, ry = by, rz = bz;
        for (int i = -1; i <= 1; ++i)
            for (int j = -1; j <= 1; ++j)
                for (int k = -1; k <= 1; ++k) {
                    A cx = bx + i * (A)box[0] + j * (A)box[3] + k * (A)box[6];
                    A cy = by + i * (A)box[1] + j * (A)box[4] + k * (A)box[7];
                    A cz = bz + i * (A)box[2] + j * (A)box[5] + k * (A)box[8];
                    A d2 = cx * cx + cy * cy + cz * cz;
                    if (d2 < best) { best = d2; rx = cx; ry = cy; rz = cz; }
                }
        dx = rx; dy = ry; dz = rz;
    }
}

#ifndef TMALIGN_HOST  // (warp- and block-cooperative: not part of tmalign.cu's plain C++ build)
// Sum of v over the 32 lanes of a full warp, every lane gets it (butterfly: the same order on each).
__device__ __forceinline__ double pg_warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Subset searches (tmscore.cu, gdt_windows.cu) keep each warp's two subset bit masks at the start of
// dynamic shared memory ([warps][2][nwords_max] words) and, when use_smem, the model's and the
// reference's 3 n coordinates after them (16-byte aligned), where every warp's fits read them. Stages
// those (xs and ys then point at the copies), ends with the block barrier, returns the masks.
template <typename T>
__device__ __forceinline__ unsigned* pg_stage_subset_search(unsigned char* smem, int warps, int nwords_max, int lmax,
                                                            int n, int use_smem, const T*& xs, const T*& ys) {
    if (use_smem) {
        T* cs = (T*)(smem + ((warps * 2 * nwords_max * sizeof(unsigned) + 15) / 16) * 16);
        for (int i = threadIdx.x; i < 3 * n; i += blockDim.x) {
            cs[i] = xs[i];
            cs[3 * lmax + i] = ys[i];
        }
        xs = cs;
        ys = cs + 3 * lmax;
    }
    __syncthreads();
    return (unsigned*)smem;
}
#endif
