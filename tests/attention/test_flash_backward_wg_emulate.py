"""The index arithmetic of the wgmma backward ``flash_bwd_wg_*`` (kernels/attention_flash_bwd_wg.cuh),
emulated on the CPU in float64 without 16-bit rounding: the kernel's cp.async chunk placement and dS^T
stores into 128-byte-swizzled shared memory, the wgmma operands as the kernel's descriptors address them
(K-major: k-step kk 16 columns along the rows; MN-major: k-step kc 16 rows down), the m64n64 accumulator
and register-A fragment layouts, the packing of P^T and dS^T, the shuffle reduce-scatter of the query
side of dcoords and the per-warp partials. It must reproduce the NumPy twin to rounding: a wrong lane
mapping, swizzle phase or transposition shows up as an O(1) error. (The model of a descriptor read is
the one the forward's wgmma kernel relies on for K and V; the GPU tests check the kernel itself.)"""

from __future__ import annotations

import numpy as np
import pytest

# (ldmatrix and mma.sync as the PTX manual defines their fragments: the mma kernel's emulation, beside this file)
from test_flash_backward_emulate import check_emulation_against_twin, ldmatrix, mma

T = 64  # BWG_TILE; HEAD_DIM = 64
W = np.arange(4)[:, None, None]
LN = np.arange(32)[None, :, None]
GRP, TIG = LN >> 2, LN & 3
I = np.arange(32)[None, None, :]  # accumulator register: tile n = i >> 2, element e = i & 3
ROW = 16 * W + GRP + 8 * ((I & 3) >> 1)  # accumulator (warp, lane, register) -> row of the m64n64 result
COL = 8 * (I >> 2) + 2 * TIG + (I & 1)  # -> column
ROW, COL = np.broadcast_arrays(ROW, COL)


def swz(r, c):
    """Element offset of (row r, column c) in a 64 x 64 16-bit tile of 128-byte rows, 128-byte swizzle."""
    return r * 64 + (((c >> 3) ^ (r & 7)) << 3) + (c & 7)


R64, C64 = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")


def logical(tile):
    """The 64 x 64 matrix a descriptor sees in a swizzled tile (the hardware undoes the swizzle)."""
    return tile[swz(R64, C64)]


def cp_async_tile(rows):
    """The kernel's copy of 64 rows x 64 values: thread tid, chunk tid % 8 of rows tid / 8 + 16 p, to
    byte soff + 2048 p with soff = lr 128 + ((lc ^ (lr & 7)) << 4)."""
    tile = np.full(T * T, np.nan)
    for tid in range(128):
        lr, lc = tid >> 3, tid & 7
        soff = lr * 128 + ((lc ^ (lr & 7)) << 4)
        for p in range(4):
            e = (soff + p * 2048) // 2
            tile[e:e + 8] = rows[lr + 16 * p, lc * 8:lc * 8 + 8]
    return tile


def wgmma(a, b):
    """m64n64k16: a (64, 16), b (16, 64)."""
    return a @ b


def a_from_regs(regs):
    """The m64k16 A operand from registers (warp, lane, 4 registers, 2 values), the mma.sync A layout per
    warp: register r = row grp + 8 (r & 1), columns 2 tig + 8 (r >> 1) + (0, 1)."""
    a = np.zeros((T, 16))
    for r in range(4):
        rows = 16 * W[:, :, 0] + GRP[:, :, 0] + 8 * (r & 1)
        cols = 2 * TIG[:, :, 0] + 8 * (r >> 1)
        rows, cols = np.broadcast_arrays(rows, cols)
        a[rows, cols] = regs[:, :, r, 0]
        a[rows, cols + 1] = regs[:, :, r, 1]
    return a


def pack(acc, kc):
    """pa[kc] of the kernel from an accumulator (warp, lane, 32): registers (8 kc + 2 r, 8 kc + 2 r + 1)."""
    return np.stack([acc[:, :, 8 * kc + 2 * r:8 * kc + 2 * r + 2] for r in range(4)], axis=2)


def halve(v, bit, mask):
    """bwg_halve over the lanes: v (warps, 32 lanes, ..., 2N) -> (warps, 32, ..., N)."""
    n = v.shape[-1] // 2
    hi = ((np.arange(32) & bit) != 0).reshape((1, 32) + (1,) * (v.ndim - 2))
    keep = np.where(hi, v[..., n:], v[..., :n])
    send = np.where(hi, v[..., :n], v[..., n:])
    return keep + send[:, np.arange(32) ^ mask]


def dq_by_mma(dst, ks):
    """BWG_DQ_MMA: dQ = dS K per warp on mma.sync, A^T = dS^T and B = K by ldmatrix.trans from the swizzled
    tiles, as the kernel addresses them. Returns the accumulator (warp, lane, 32)."""
    lane = np.arange(32)
    mrow, mcol = ((lane >> 3) & 1) * 8 + (lane & 7), (lane >> 4) & 1
    acc = np.zeros((4, 32, 32))
    for w in range(4):
        tiles = np.zeros((8, 32, 4))
        for kc in range(4):
            row = 16 * kc + mrow
            r = ldmatrix(dst, (row * 128 + (((2 * w + mcol) ^ (lane & 7)) << 4)) // 2, True)
            a = r[:, [0, 2, 1, 3]]
            for fp in range(4):
                bk = ldmatrix(ks, (row * 128 + (((2 * fp + mcol) ^ (lane & 7)) << 4)) // 2, True)
                mma(tiles[2 * fp], a, bk[:, 0], bk[:, 1])
                mma(tiles[2 * fp + 1], a, bk[:, 2], bk[:, 3])
        acc[w] = tiles.transpose(1, 0, 2).reshape(32, 32)
    return acc


def dq_by_bulk(dq, dqa, b, h, i0, scale):
    """BWG_DQ_BULK: per warp, 8 rows at a time staged in rows of 72 floats (lane: row grp, columns
    8 n + 2 tig (+ 1)), then row r < 8 added whole to dQ row i0 + 16 w + r + 8 hh."""
    L = dq.shape[1]
    lane = np.arange(32)
    for w in range(4):
        for hh in (0, 1):
            stg = np.full(8 * 72, np.nan)
            for n in range(8):
                for e in (0, 1):
                    stg[(lane >> 2) * 72 + 8 * n + 2 * (lane & 3) + e] = scale * dqa[w, :, 4 * n + 2 * hh + e]
            for r in range(8):
                qi = i0 + 16 * w + r + 8 * hh
                if qi < L:
                    dq[b, qi, h] += stg[r * 72:r * 72 + 64]


def emulate(q, k, v, x, gamma, cutoff, mask, scale, out, lse, dout, dq_mma=False, dq_bulk=False):
    B, L, H, d = q.shape
    assert d == 64
    dq, dk, dv = (np.zeros_like(q) for _ in range(3))
    dx, dg = np.zeros((B, L, 3)), np.zeros(H)
    delta = np.einsum("bihc,bihc->bhi", dout, out)
    c2 = -1.0 if cutoff is None else cutoff**2

    def rows_of(a, b, h, r0):
        m = np.zeros((T, d))
        n = max(0, min(T, L - r0))
        m[:n] = a[b, r0:r0 + n, h]
        return m

    for b, h, j0 in ((b, h, j0) for b in range(B) for h in range(H) for j0 in range(0, L, T)):
        g = gamma[h]
        kt, vt = rows_of(k, b, h, j0), rows_of(v, b, h, j0)  # (the register A fragments: kf, vf)
        ks = cp_async_tile(kt)
        key = j0 + np.arange(T)
        kok = (key < L) & (True if mask is None else np.concatenate([mask[b], np.zeros(T, bool)])[key])
        xk = np.where(kok[:, None], np.concatenate([x[b], np.zeros((T, 3))])[np.minimum(key, L + T - 1)], 0.0)
        dva, dka = np.zeros((4, 32, 32)), np.zeros((4, 32, 32))
        cg = np.zeros((4, 32, 2, 3))  # keys grp (+ 8): sum dS (x_j - x_i)
        gacc = 0.0
        for i0 in range(0, L, T):
            qs, dos = cp_async_tile(rows_of(q, b, h, i0)), cp_async_tile(rows_of(dout, b, h, i0))
            qi = i0 + np.arange(T)
            inq = qi < L
            xq = np.where(inq[:, None], np.concatenate([x[b], np.zeros((T, 3))])[np.minimum(qi, L + T - 1)], 0.0)
            lq = np.where(inq, np.concatenate([lse[b, h], np.zeros(T)])[np.minimum(qi, L + T - 1)], -np.inf)
            dl = np.where(inq, np.concatenate([delta[b, h], np.zeros(T)])[np.minimum(qi, L + T - 1)], 0.0)
            # 1. S^T, dP^T: B = Q, dO K-major (B^T[n][k] = row n, column 16 kk + k)
            qlog, dolog = logical(qs), logical(dos)
            st = sum(wgmma(kt[:, 16 * kk:16 * kk + 16], qlog[:, 16 * kk:16 * kk + 16].T) for kk in range(4))
            dpt = sum(wgmma(vt[:, 16 * kk:16 * kk + 16], dolog[:, 16 * kk:16 * kk + 16].T) for kk in range(4))
            st, dpt = st[ROW, COL], dpt[ROW, COL]  # accumulator registers
            xqe, kxe = xq[COL], xk[ROW]
            dxyz = xqe - kxe
            d2 = np.sum(dxyz**2, axis=-1)
            ok = kok[ROW] & (lq[COL] != -np.inf) & ((c2 < 0) | (d2 <= c2))
            with np.errstate(invalid="ignore", over="ignore"):
                p = np.where(ok, np.exp(scale * st - g * d2 - lq[COL]), 0.0)
            ds = np.where(ok, p * (dpt - dl[COL]), 0.0)
            gacc -= float(np.sum(ds * d2))
            f = np.where((ds != 0)[..., None], ds[..., None] * dxyz, 0.0)  # (warp, lane, 32, 3)
            for hh in (0, 1):
                cg[:, :, hh] -= f[:, :, (np.arange(32) & 3) >> 1 == hh].sum(axis=2)
            qg = np.full((4, 3, T), np.nan)
            for hf in (0, 1):
                qp = np.zeros((4, 32, 3, 8))
                for nn in range(4):
                    for e in range(4):
                        qp[:, :, :, 2 * nn + (e & 1)] += f[:, :, 4 * (4 * hf + nn) + e]
                r = halve(halve(halve(qp, 16, 16), 8, 8), 4, 4)[..., 0]  # (4, 32, 3)
                lane = np.arange(32)
                col = 32 * hf + 8 * ((lane >> 2) >> 1) + 2 * (lane & 3) + ((lane >> 2) & 1)
                for w in range(4):
                    qg[w][:, col] = r[w].T
            # 2. dV += P^T dO, dK += dS^T Q: A from registers, B = dO, Q MN-major (rows 16 kc + k)
            for kc in range(4):
                dv_add = wgmma(a_from_regs(pack(p, kc)), dolog[16 * kc:16 * kc + 16])
                dk_add = wgmma(a_from_regs(pack(ds, kc)), qlog[16 * kc:16 * kc + 16])
                dva += dv_add[ROW, COL]
                dka += dk_add[ROW, COL]
            # dS^T stores: row = 16 w + grp + 8 hh, bytes row 128 + ((n ^ (row & 7)) << 4) + 4 tig
            dst = np.full(T * T, np.nan)
            sa = [pack(ds, kc) for kc in range(4)]
            for n in range(8):
                for hh in (0, 1):
                    row = 16 * W[:, :, 0] + GRP[:, :, 0] + 8 * hh
                    e = (row * 128 + ((n ^ (row & 7)) << 4) + 4 * TIG[:, :, 0]) // 2
                    vals = sa[n >> 1][:, :, (n & 1) * 2 + hh]
                    dst[e], dst[e + 1] = vals[..., 0], vals[..., 1]
            # 3. dQ = dS K: A = dS^T MN-major (A[m][k] = row 16 kc + k, column m), B = K MN-major
            if dq_mma:
                dqa = dq_by_mma(dst, ks)
            else:
                dslog, klog = logical(dst), logical(ks)
                dqa = sum(wgmma(dslog[16 * kc:16 * kc + 16].T, klog[16 * kc:16 * kc + 16]) for kc in range(4))
                dqa = dqa[ROW, COL]
            if dq_bulk:
                dq_by_bulk(dq, dqa, b, h, i0, scale)
            # 16-byte reductions: lanes tig, tig ^ 1 swap halves (the even one: row grp, the odd one grp + 8)
            lane = np.arange(32)
            odd = (lane & 1).astype(bool)[None, :]
            qrow = i0 + 16 * np.arange(4)[:, None] + (lane >> 2)[None, :] + 8 * odd
            col0 = 2 * (lane & 2)[None, :]
            for n in range(0 if dq_bulk else 8):
                a0, a1, b0, b1 = (dqa[:, :, 4 * n + e] for e in range(4))
                r0, r1 = np.where(odd, a0, b0)[:, lane ^ 1], np.where(odd, a1, b1)[:, lane ^ 1]
                vals = np.stack([np.where(odd, r0, a0), np.where(odd, r1, a1), np.where(odd, b0, r0),
                                 np.where(odd, b1, r1)], axis=-1)
                for c in range(4):
                    qr, cc = np.broadcast_arrays(qrow, 8 * n + col0 + c)
                    ok = qr < L
                    np.add.at(dq, (b, qr[ok], h, cc[ok]), scale * vals[..., c][ok])
            qsum = qg.sum(axis=0).T  # (64, 3)
            dx[b, qi[inq]] += -2 * g * qsum[inq]
        # dK, dV; the key side of dcoords (sum over tig); dgamma
        krow = j0 + ROW
        okk = krow < L
        dk[b, krow[okk], h, COL[okk]] = scale * dka[okk]
        dv[b, krow[okk], h, COL[okk]] = dva[okk]
        for hh in (0, 1):
            s = cg[:, :, hh].reshape(4, 8, 4, 3).sum(axis=2)  # (warp, grp, 3)
            kj = j0 + 16 * np.arange(4)[:, None] + np.arange(8)[None, :] + 8 * hh
            okj = kj < L
            dx[b, kj[okj]] += -2 * g * s[okj]
        dg[h] += gacc
    return dq, dk, dv, dx, dg


@pytest.mark.parametrize("dq_mma,dq_bulk", [(False, False), (True, False), (False, True)],
                         ids=["dq-wgmma", "dq-mma", "dq-bulk"])
@pytest.mark.parametrize("cutoff", [None, 9.0])
def test_wgmma_backward_layout_reproduces_the_twin(cutoff, dq_mma, dq_bulk):
    # two key blocks and two query tiles, the second ones partial
    check_emulation_against_twin(emulate, 1, 2, 100, 2, 64, cutoff, dq_mma=dq_mma, dq_bulk=dq_bulk)
