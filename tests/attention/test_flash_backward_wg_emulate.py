"""The index arithmetic of the wgmma backward ``flash_bwd_wg_*`` (kernels/attention_flash_bwd_wg.cuh),
emulated on the CPU in float64 without 16-bit rounding: the kernel's cp.async chunk placement and dS^T
stores into 128-byte-swizzled shared memory, the wgmma operands as the kernel's descriptors address them
(K-major: k-step kk 16 columns along the rows; MN-major: k-step kc 16 rows down), the m64n64 accumulator
and register-A fragment layouts, the packing of P^T and dS^T, the shuffle reduce-scatter of the query
side of dcoords and the per-warp partials. It must reproduce the NumPy twin to rounding: a wrong lane
mapping, swizzle phase or transposition shows up as an O(1) error. (The model of a descriptor read is
the one the forward's wgmma kernel relies on for K and V; the GPU tests check the kernel itself.)

``keys=128`` replays the BWG_KEYS=128 variant: two warpgroups (8 warps, 256 threads) per block of 128 keys,
the 256 threads' copies, dS^T of 128 keys, and dQ split by columns on m64n32k16 (B = K 64 bytes into each
swizzled row, read through the address swizzle: :func:`desc_read`)."""

from __future__ import annotations

import numpy as np
import pytest

# (ldmatrix and mma.sync as the PTX manual defines their fragments: the mma kernel's emulation, beside this file)
from test_flash_backward_emulate import check_emulation_against_twin, ldmatrix, mma

T = 64  # BWG_TILE; HEAD_DIM = 64
LN = np.arange(32)[None, :, None]
GRP, TIG = LN >> 2, LN & 3


def acc_index(warps, regs):
    """(ROW, COL) of an accumulator (warp, lane, register) of ``regs`` registers (m64n64: 32, m64n32: 16):
    tile n = i >> 2, element e = i & 3; warps beyond 4 belong to the next warpgroup's 64 rows."""
    w, i = np.arange(warps)[:, None, None], np.arange(regs)[None, None, :]
    return np.broadcast_arrays(16 * w + GRP + 8 * ((i & 3) >> 1), 8 * (i >> 2) + 2 * TIG + (i & 1))


ROW, COL = acc_index(4, 32)


def swz(r, c):
    """Element offset of (row r, column c) in a 64 x 64 16-bit tile of 128-byte rows, 128-byte swizzle."""
    return r * 64 + (((c >> 3) ^ (r & 7)) << 3) + (c & 7)


R64, C64 = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")


def logical(tile):
    """The 64 x 64 matrix a descriptor sees in a swizzled tile (the hardware undoes the swizzle)."""
    return tile[swz(R64, C64)]


def cp_async_tile(rows, threads=128):
    """The kernel's copy of n rows x 64 values by ``threads`` threads: thread tid, chunk tid % 8 of rows
    tid / 8 + (threads / 8) p, to byte soff + 16 threads p with soff = lr 128 + ((lc ^ (lr & 7)) << 4)."""
    tile = np.full(rows.shape[0] * 64, np.nan)
    for tid in range(threads):
        lr, lc = tid >> 3, tid & 7
        soff = lr * 128 + ((lc ^ (lr & 7)) << 4)
        for p in range(rows.shape[0] * 8 // threads):
            e = (soff + p * 16 * threads) // 2
            tile[e:e + 8] = rows[lr + threads // 8 * p, lc * 8:lc * 8 + 8]
    return tile


def desc_read(tile, start, rows, cols):
    """The rows x cols matrix an MN-major 128-byte-swizzled descriptor starting at byte ``start`` of
    ``tile`` (1024-byte aligned) reads: element (r, c) at byte start + 128 r + 2 c before the swizzle, which
    the hardware applies to the address (16-byte chunk bits 4..6 ^= row bits 7..9)."""
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    a = start + 128 * r + 2 * c
    return tile[(a ^ (((a >> 7) & 7) << 4)) // 2]


def wgmma(a, b):
    """m64n64k16: a (64, 16), b (16, 64)."""
    return a @ b


def a_from_regs(regs):
    """The m64k16 A operand from registers (warp, lane, 4 registers, 2 values), the mma.sync A layout per
    warp: register r = row grp + 8 (r & 1), columns 2 tig + 8 (r >> 1) + (0, 1) (8 warps: two warpgroups'
    operands stacked, 128 rows)."""
    nw = regs.shape[0]
    a = np.zeros((16 * nw, 16))
    for r in range(4):
        rows = 16 * np.arange(nw)[:, None] + GRP[:, :, 0] + 8 * (r & 1)
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


def dq_by_mma(dst, ks, wgs=1):
    """BWG_DQ_MMA: dQ = dS K per warp on mma.sync, A^T = dS^T and B = K by ldmatrix.trans from the swizzled
    tiles, as the kernel addresses them (``wgs`` warpgroups: warp w takes queries 16 (w & 3) .. and the
    4 / wgs column pairs of its warpgroup). Returns the accumulator (warp, lane, 32 / wgs)."""
    lane = np.arange(32)
    mrow, mcol = ((lane >> 3) & 1) * 8 + (lane & 7), (lane >> 4) & 1
    nfp = 4 // wgs
    acc = np.zeros((4 * wgs, 32, 8 * nfp))
    for w in range(4 * wgs):
        tiles = np.zeros((2 * nfp, 32, 4))
        for kc in range(4 * wgs):
            row = 16 * kc + mrow
            r = ldmatrix(dst, (row * 128 + (((2 * (w & 3) + mcol) ^ (lane & 7)) << 4)) // 2, True)
            a = r[:, [0, 2, 1, 3]]
            for f in range(nfp):
                fp = nfp * (w >> 2) + f
                bk = ldmatrix(ks, (row * 128 + (((2 * fp + mcol) ^ (lane & 7)) << 4)) // 2, True)
                mma(tiles[2 * f], a, bk[:, 0], bk[:, 1])
                mma(tiles[2 * f + 1], a, bk[:, 2], bk[:, 3])
        acc[w] = tiles.transpose(1, 0, 2).reshape(32, 8 * nfp)
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


def emulate(q, k, v, x, gamma, cutoff, mask, scale, out, lse, dout, dq_mma=False, dq_bulk=False, keys=64):
    B, L, H, d = q.shape
    assert d == 64 and keys in (64, 128) and not (dq_bulk and keys != 64)
    G = keys // 64  # warpgroups per block
    nw, threads = 4 * G, 128 * G
    row_, col_ = acc_index(nw, 32)  # phases 1, 2: warp w's accumulator rows are keys 16 w .. of the block
    dq_row, dq_col = acc_index(4, 32 // G)  # phase 3 per warpgroup: rows queries 16 (w & 3) .., its columns
    dq, dk, dv = (np.zeros_like(q) for _ in range(3))
    dx, dg = np.zeros((B, L, 3)), np.zeros(H)
    delta = np.einsum("bihc,bihc->bhi", dout, out)
    c2 = -1.0 if cutoff is None else cutoff**2

    def rows_of(a, b, h, r0, n=T):
        m = np.zeros((n, d))
        got = max(0, min(n, L - r0))
        m[:got] = a[b, r0:r0 + got, h]
        return m

    for b, h, j0 in ((b, h, j0) for b in range(B) for h in range(H) for j0 in range(0, L, keys)):
        g = gamma[h]
        kt, vt = rows_of(k, b, h, j0, keys), rows_of(v, b, h, j0, keys)  # (the register A fragments: kf, vf)
        ks = cp_async_tile(kt, threads)
        key = j0 + np.arange(keys)
        pad = np.zeros(keys, bool)
        kok = (key < L) & (True if mask is None else np.concatenate([mask[b], pad])[key])
        xk = np.where(kok[:, None], np.concatenate([x[b], np.zeros((keys, 3))])[np.minimum(key, L + keys - 1)], 0.0)
        if c2 >= 0:  # (flash_bwd_wg_cut_*: keys without finite coordinates are in no pair)
            kok &= np.isfinite(xk).all(axis=1)
            xk = np.where(kok[:, None], xk, 0.0)
        o = x[b, j0] if np.isfinite(x[b, j0]).all() else np.zeros(3)  # sm.org: dgamma's origin
        dva, dka = np.zeros((nw, 32, 32)), np.zeros((nw, 32, 32))
        cg = np.zeros((nw, 32, 2, 3))  # keys grp (+ 8): sum dS (x_j - x_i)
        gacc = 0.0
        for i0 in range(0, L, T):
            qs = cp_async_tile(rows_of(q, b, h, i0), threads)
            dos = cp_async_tile(rows_of(dout, b, h, i0), threads)
            qi = i0 + np.arange(T)
            inq = qi < L
            # rows in no pair (past the end, lse = -inf): coordinates 0, lse +inf, Dlt 0
            lq = np.where(inq, np.concatenate([lse[b, h], np.zeros(T)])[np.minimum(qi, L + T - 1)], -np.inf)
            inq &= lq != -np.inf
            lq = np.where(inq, lq, np.inf)
            xq = np.where(inq[:, None], np.concatenate([x[b], np.zeros((T, 3))])[np.minimum(qi, L + T - 1)], 0.0)
            dl = np.where(inq, np.concatenate([delta[b, h], np.zeros(T)])[np.minimum(qi, L + T - 1)], 0.0)
            # 1. S^T, dP^T: B = Q, dO K-major (B^T[n][k] = row n, column 16 kk + k); each warpgroup its 64
            # rows of K, V (stacked here: the same products)
            qlog, dolog = logical(qs), logical(dos)
            st = sum(wgmma(kt[:, 16 * kk:16 * kk + 16], qlog[:, 16 * kk:16 * kk + 16].T) for kk in range(4))
            dpt = sum(wgmma(vt[:, 16 * kk:16 * kk + 16], dolog[:, 16 * kk:16 * kk + 16].T) for kk in range(4))
            st, dpt = st[row_, col_], dpt[row_, col_]  # accumulator registers
            xqe, kxe = xq[col_], xk[row_]
            dxyz = xqe - kxe
            d2 = np.sum(dxyz**2, axis=-1)
            ok = kok[row_] & ((c2 < 0) | (d2 <= c2))
            with np.errstate(invalid="ignore", over="ignore"):
                p = np.where(ok, np.exp(scale * st - g * d2 - lq[col_]), 0.0)
            ds = p * (dpt - dl[col_])  # (no test of dS: every staged coordinate is finite)
            f = ds[..., None] * dxyz  # (warp, lane, 32, 3)
            for hh in (0, 1):
                cg[:, :, hh] -= f[:, :, (np.arange(32) & 3) >> 1 == hh].sum(axis=2)
            qg = np.full((nw, 3, T), np.nan)
            for hf in (0, 1):
                qp = np.zeros((nw, 32, 3, 8))
                for nn in range(4):
                    for e in range(4):
                        qp[:, :, :, 2 * nn + (e & 1)] += f[:, :, 4 * (4 * hf + nn) + e]
                r = halve(halve(halve(qp, 16, 16), 8, 8), 4, 4)[..., 0]  # (nw, 32, 3)
                lane = np.arange(32)
                col = 32 * hf + 8 * ((lane >> 2) >> 1) + 2 * (lane & 3) + ((lane >> 2) & 1)
                for w in range(nw):
                    qg[w][:, col] = r[w].T
            # 2. dV += P^T dO, dK += dS^T Q: A from registers, B = dO, Q MN-major (rows 16 kc + k)
            for kc in range(4):
                dv_add = wgmma(a_from_regs(pack(p, kc)), dolog[16 * kc:16 * kc + 16])
                dk_add = wgmma(a_from_regs(pack(ds, kc)), qlog[16 * kc:16 * kc + 16])
                dva += dv_add[row_, col_]
                dka += dk_add[row_, col_]
            # dS^T stores: row = 16 w + grp + 8 hh, bytes row 128 + ((n ^ (row & 7)) << 4) + 4 tig
            dst = np.full(keys * T, np.nan)
            sa = [pack(ds, kc) for kc in range(4)]
            for n in range(8):
                for hh in (0, 1):
                    row = 16 * np.arange(nw)[:, None] + GRP[:, :, 0] + 8 * hh
                    e = (row * 128 + ((n ^ (row & 7)) << 4) + 4 * TIG[:, :, 0]) // 2
                    vals = sa[n >> 1][:, :, (n & 1) * 2 + hh]
                    dst[e], dst[e + 1] = vals[..., 0], vals[..., 1]
            # 3. dQ = dS K: A = dS^T MN-major (A[m][k] = row 16 kc + k, column m), B = K MN-major; warpgroup
            # wg: B from byte 64 wg of the rows, 64 / G columns (m64n32 for two warpgroups)
            if dq_mma:
                dqa = dq_by_mma(dst, ks, G)
            else:
                dslog = desc_read(dst, 0, keys, T)
                dqa = np.concatenate([(dslog.T @ desc_read(ks, 64 * wg, keys, 64 // G))[dq_row, dq_col]
                                      for wg in range(G)])  # (nw, 32, 32 / G)
            if dq_bulk:
                dq_by_bulk(dq, dqa, b, h, i0, scale)
            # 16-byte reductions: lanes tig, tig ^ 1 swap halves (the even one: row grp, the odd one grp + 8)
            lane = np.arange(32)
            odd = (lane & 1).astype(bool)[None, :]
            wq = np.arange(nw)[:, None]
            qrow = i0 + 16 * (wq & 3) + (lane >> 2)[None, :] + 8 * odd
            col0 = 32 * (wq >> 2) + 2 * (lane & 2)[None, :]
            for n in range(0 if dq_bulk else 8 // G):
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
            gacc -= float(np.sum((xq - o) * qsum))  # dgamma's query side
        # dK, dV; the key side of dcoords (sum over tig); dgamma
        krow = j0 + row_
        okk = krow < L
        dk[b, krow[okk], h, col_[okk]] = scale * dka[okk]
        dv[b, krow[okk], h, col_[okk]] = dva[okk]
        for hh in (0, 1):
            s = cg[:, :, hh].reshape(nw, 8, 4, 3).sum(axis=2)  # (warp, grp, 3)
            kj = j0 + 16 * np.arange(nw)[:, None] + np.arange(8)[None, :] + 8 * hh
            okj = kj < L
            dx[b, kj[okj]] += -2 * g * s[okj]
            gacc -= float(np.sum((xk[kj - j0] - o) * s))  # dgamma's key side
        dg[h] += gacc
    return dq, dk, dv, dx, dg


@pytest.mark.parametrize("dq_mma,dq_bulk", [(False, False), (True, False), (False, True)],
                         ids=["dq-wgmma", "dq-mma", "dq-bulk"])
@pytest.mark.parametrize("cutoff", [None, 9.0])
def test_wgmma_backward_layout_reproduces_the_twin(cutoff, dq_mma, dq_bulk):
    # two key blocks and two query tiles, the second ones partial
    check_emulation_against_twin(emulate, 1, 2, 100, 2, 64, cutoff, dq_mma=dq_mma, dq_bulk=dq_bulk)


@pytest.mark.parametrize("dq_mma", [False, True], ids=["dq-wgmma", "dq-mma"])
@pytest.mark.parametrize("cutoff", [None, 9.0])
def test_wgmma_backward_128_keys_layout_reproduces_the_twin(cutoff, dq_mma):
    # BWG_KEYS=128: two key blocks (the second partial) and three query tiles (the last partial)
    check_emulation_against_twin(emulate, 3, 1, 150, 2, 64, cutoff, dq_mma=dq_mma, keys=128)


@pytest.mark.parametrize("keys", [64, 128])
@pytest.mark.parametrize("cutoff", [None, 9.0])
def test_wgmma_backward_layout_with_nan_padding(cutoff, keys):
    # a padded batch entry (every residue masked, coordinates NaN): its pairs have dS = 0 and every
    # gradient stays finite (the twin sees the padding as 0)
    check_emulation_against_twin(emulate, 4, 2, 100, 2, 64, cutoff, nan_padding=True, keys=keys)


def test_desc_read_at_offset_zero_is_the_swizzled_tile():
    # the address-swizzle model of a descriptor read agrees with the chunk-swizzle model for 64 rows
    tile = np.random.default_rng(0).normal(size=T * T)
    assert np.array_equal(desc_read(tile, 0, T, T), logical(tile))


def test_the_128_key_shared_memory_matches_the_host():
    # the host's dynamic shared memory (flash_backward._WG128_SMEM) is the kernel's BWG_DYN_SMEM, which a
    # static_assert checks against the tiles
    import re
    from pathlib import Path

    from protgpu.attention import flash_backward as fb

    text = (Path(__file__).resolve().parents[2] / "kernels" / "attention_flash_bwd_wg.cuh").read_text()
    m = re.search(r"#define BWG_DYN_SMEM \((\d+) \* 1024\)", text)
    assert m is not None and int(m.group(1)) * 1024 == fb._WG128_SMEM
    assert fb.bwd_block({"BWG_KEYS": 128}, "wg") == (128, 256, fb._WG128_SMEM)
    assert fb.bwd_block({"BWG_KEYS": 128}, "mma") == (64, 128, 0)  # (off Hopper: the mma.sync kernel)
    assert fb.bwd_block({}, "wg") == (64, 128, 0)
