"""The index arithmetic of the tensor-core backward ``flash_bwd_mma_*`` (kernels/attention_flash_bwd_mma.cuh),
emulated on the CPU: ldmatrix (plain and .trans) and mma.sync m16n8k16 as the PTX manual defines their
fragments, and the kernel's own lane addresses, fragment packing, shared-memory layout and loops,
transcribed in float64 without 16-bit rounding. It must reproduce the NumPy twin to rounding: a wrong
lane offset, fragment order or transposition shows up as an O(1) error. (The GPU tests check the kernel
itself; this one runs everywhere and pins the layout reasoning.)"""

from __future__ import annotations

import numpy as np
import pytest

from protgpu.attention.reference import attention_backward_numpy, attention_lse_numpy

BM = BN = 64  # BWM_BM, BWM_BN
LANE = np.arange(32)
GRP, TIG = LANE >> 2, LANE & 3


def ldmatrix(smem, addr, trans):
    """ldmatrix.x4(.trans): ``addr[l]`` is the element offset of the 8-value row that lane l points at
    (lanes 8m..8m+7: the rows of matrix m). Returns [lane, register m, 2 values]."""
    out = np.zeros((32, 4, 2))
    for m in range(4):
        mat = np.array([smem[addr[8 * m + r]:addr[8 * m + r] + 8] for r in range(8)])
        for t in range(32):
            r0 = 2 * (t % 4)
            out[t, m] = mat[t // 4, r0:r0 + 2] if not trans else mat[r0:r0 + 2, t // 4]
    return out


def mma(c, a, b0, b1):
    """c[lane, 4] += A B for one m16n8k16 (A: [lane, 4, 2], b0, b1: [lane, 2]), fragments as in the manual."""
    am, bm = np.zeros((16, 16)), np.zeros((16, 8))
    for t in range(32):
        g, q = t >> 2, t & 3
        am[g, 2 * q:2 * q + 2], am[g + 8, 2 * q:2 * q + 2] = a[t, 0], a[t, 1]
        am[g, 2 * q + 8:2 * q + 10], am[g + 8, 2 * q + 8:2 * q + 10] = a[t, 2], a[t, 3]
        bm[2 * q:2 * q + 2, g], bm[2 * q + 8:2 * q + 10, g] = b0[t], b1[t]
    dd = am @ bm
    for t in range(32):
        g, q = t >> 2, t & 3
        c[t] += (dd[g, 2 * q], dd[g, 2 * q + 1], dd[g + 8, 2 * q], dd[g + 8, 2 * q + 1])


def pack(s, kc):
    """The A fragment of k-step kc from an accumulator [n tile, lane, 4] (the kernel's fa_pack order)."""
    return np.stack([s[2 * kc][:, 0:2], s[2 * kc][:, 2:4], s[2 * kc + 1][:, 0:2], s[2 * kc + 1][:, 2:4]], 1)


def emulate(q, k, v, x, gamma, cutoff, mask, scale, out, lse, dout):
    B, L, H, d = q.shape
    lds, kd, nd, nq, dld = d + 8, d // 16, d // 8, BM // 8, BN + 1
    dq, dk, dv = (np.zeros_like(q) for _ in range(3))
    dx, dg = np.zeros((B, L, 3)), np.zeros(H)
    delta = np.einsum("bihc,bihc->bhi", dout, out)
    c2 = -1.0 if cutoff is None else cutoff**2
    boff = (((LANE >> 4) & 1) * 8 + (LANE & 7)) * lds + ((LANE >> 3) & 1) * 8  # as the kernel's boff, toff
    toff = (((LANE >> 3) & 1) * 8 + (LANE & 7)) * lds + ((LANE >> 4) & 1) * 8
    for b, h, j0 in ((b, h, j0) for b in range(B) for h in range(H) for j0 in range(0, L, BN)):
        g = gamma[h]
        ks = np.zeros(BN * lds)
        xk = np.zeros((BN, 4))
        for r in range(min(BN, L - j0)):
            ks[r * lds:r * lds + d] = k[b, j0 + r, h]
            if mask is None or mask[b, j0 + r]:
                xk[r] = [*x[b, j0 + r], 1]
        warps = []
        for w in range(4):
            key = np.stack([j0 + w * 16 + GRP, j0 + w * 16 + GRP + 8])
            kf, vf = np.zeros((kd, 32, 4, 2)), np.zeros((kd, 32, 4, 2))
            for kk, r, t in ((kk, r, t) for kk in range(kd) for r in range(4) for t in range(32)):
                kr, c0 = key[r & 1, t], kk * 16 + TIG[t] * 2 + (r >> 1) * 8
                if kr < L:
                    kf[kk, t, r], vf[kk, t, r] = k[b, kr, h, c0:c0 + 2], v[b, kr, h, c0:c0 + 2]
            warps.append({"key": key, "kf": kf, "vf": vf, "xk": np.array([xk[w * 16 + GRP + 8 * hh] for hh in (0, 1)]),
                          "dva": np.zeros((nd, 32, 4)), "dka": np.zeros((nd, 32, 4))})
        gacc, cg = 0.0, np.zeros((128, 3))
        for i0 in range(0, L, BM):
            qs, dos, xq, dl = np.zeros(BM * lds), np.zeros(BM * lds), np.zeros((BM, 4)), np.zeros(BM)
            xq[:, 3] = -np.inf
            for r in range(min(BM, L - i0)):
                qs[r * lds:r * lds + d], dos[r * lds:r * lds + d] = q[b, i0 + r, h], dout[b, i0 + r, h]
                xq[r], dl[r] = [*x[b, i0 + r], lse[b, h, i0 + r]], delta[b, h, i0 + r]
            ds_s = np.zeros(BM * dld)
            for w, wd in enumerate(warps):  # phases 1 and 2
                st, dpt = np.zeros((nq, 32, 4)), np.zeros((nq, 32, 4))
                for kk in range(kd):
                    for npp in range(nq // 2):
                        bq = ldmatrix(qs, boff + npp * 16 * lds + kk * 16, False)
                        bd = ldmatrix(dos, boff + npp * 16 * lds + kk * 16, False)
                        mma(st[2 * npp], wd["kf"][kk], bq[:, 0], bq[:, 1])
                        mma(st[2 * npp + 1], wd["kf"][kk], bq[:, 2], bq[:, 3])
                        mma(dpt[2 * npp], wd["vf"][kk], bd[:, 0], bd[:, 1])
                        mma(dpt[2 * npp + 1], wd["vf"][kk], bd[:, 2], bd[:, 3])
                for n, e, t in ((n, e, t) for n in range(nq) for e in range(4) for t in range(32)):
                    hh, qc = e >> 1, 8 * n + 2 * TIG[t] + (e & 1)
                    ke = wd["xk"][hh, t]
                    d2 = float(np.sum((xq[qc, :3] - ke[:3]) ** 2))
                    p = ds = 0.0
                    if ke[3] != 0 and xq[qc, 3] != -np.inf and (c2 < 0 or d2 <= c2):
                        p = np.exp(scale * st[n, t, e] - g * d2 - xq[qc, 3])
                        ds = p * (dpt[n, t, e] - dl[qc])
                        gacc -= ds * d2
                    st[n, t, e], dpt[n, t, e] = p, ds
                    ds_s[qc * dld + w * 16 + GRP[t] + 8 * hh] = ds
                for kc in range(BM // 16):
                    for fp in range(d // 16):
                        bd = ldmatrix(dos, toff + kc * 16 * lds + fp * 16, True)
                        bq = ldmatrix(qs, toff + kc * 16 * lds + fp * 16, True)
                        mma(wd["dva"][2 * fp], pack(st, kc), bd[:, 0], bd[:, 1])
                        mma(wd["dva"][2 * fp + 1], pack(st, kc), bd[:, 2], bd[:, 3])
                        mma(wd["dka"][2 * fp], pack(dpt, kc), bq[:, 0], bq[:, 1])
                        mma(wd["dka"][2 * fp + 1], pack(dpt, kc), bq[:, 2], bq[:, 3])
            for w in range(4):  # phase 3: dQ
                dqa = np.zeros((nd, 32, 4))
                for kc in range(BN // 16):
                    a = np.zeros((32, 4, 2))
                    for t in range(32):
                        d0 = (w * 16 + GRP[t]) * dld + 2 * TIG[t] + 16 * kc
                        d1 = d0 + 8 * dld
                        a[t] = (ds_s[d0:d0 + 2], ds_s[d1:d1 + 2], ds_s[d0 + 8:d0 + 10], ds_s[d1 + 8:d1 + 10])
                    for fp in range(d // 16):
                        bk = ldmatrix(ks, toff + kc * 16 * lds + fp * 16, True)
                        mma(dqa[2 * fp], a, bk[:, 0], bk[:, 1])
                        mma(dqa[2 * fp + 1], a, bk[:, 2], bk[:, 3])
                for hh, t in ((hh, t) for hh in (0, 1) for t in range(32)):
                    qi = i0 + w * 16 + GRP[t] + 8 * hh
                    for n in range(nd) if qi < L else ():
                        c = 8 * n + 2 * TIG[t]
                        dq[b, qi, h, c:c + 2] += scale * dqa[n, t, 2 * hh:2 * hh + 2]
            for tid in range(128):  # phase 3: coordinates (the thread pair's sum: both halves added)
                who, half = tid >> 1, tid & 1
                for j in range(half * BN // 2, (half + 1) * BN // 2):
                    ds = ds_s[who * dld + j]
                    if ds != 0 and i0 + who < L:
                        dx[b, i0 + who] += -2 * g * ds * (xq[who, :3] - xk[j, :3])
                for i in range(half * BM // 2, (half + 1) * BM // 2):
                    ds = ds_s[i * dld + who]
                    if ds != 0:
                        cg[tid] += ds * (xk[who, :3] - xq[i, :3])
        for wd, hh, t in ((wd, hh, t) for wd in warps for hh in (0, 1) for t in range(32)):
            kr = wd["key"][hh, t]
            for n in range(nd) if kr < L else ():
                c = 8 * n + 2 * TIG[t]
                dk[b, kr, h, c:c + 2] = scale * wd["dka"][n, t, 2 * hh:2 * hh + 2]
                dv[b, kr, h, c:c + 2] = wd["dva"][n, t, 2 * hh:2 * hh + 2]
        for tid in range(128):
            if j0 + (tid >> 1) < L:
                dx[b, j0 + (tid >> 1)] += -2 * g * cg[tid]
        dg[h] += gacc
    return dq, dk, dv, dx, dg


def check_emulation_against_twin(emulate_fn, seed, B, L, H, d, cutoff, nan_padding=False, **knobs):
    """A kernel's emulation (``emulate_fn``, this file's or the wgmma kernel's) on a random problem of
    two heads gives the twin's five gradients to 1e-12 (relative to the largest). ``nan_padding``: the
    last batch entry is padding, every residue masked and its coordinates NaN; the twin (which lets the
    NaN through) sees them as 0, where its gradients are 0 and the kernel's must be."""
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.normal(size=(B, L, H, d)) for _ in range(4))
    x = np.cumsum(1.9 * rng.normal(size=(B, L, 3)), axis=1)
    gamma, mask, scale = np.array([0.05, 0.2]), rng.random((B, L)) < 0.8, 1 / np.sqrt(d)
    x_twin = x
    if nan_padding:
        mask[-1] = False
        x_twin = x.copy()
        x[-1], x_twin[-1] = np.nan, 0.0
    out, lse = attention_lse_numpy(q, k, v, x_twin, gamma, cutoff, mask)
    ref = attention_backward_numpy(q, k, v, x_twin, gamma, cutoff, mask, scale, out, lse, do)
    got = emulate_fn(q, k, v, x, gamma, cutoff, mask, scale, out, lse, do, **knobs)
    for name, a, r in zip(("dq", "dk", "dv", "dcoords", "dgamma"), got, ref, strict=True):
        assert np.max(np.abs(a - r)) <= 1e-12 * max(1.0, np.max(np.abs(r))), name


@pytest.mark.parametrize("cutoff", [None, 9.0])
def test_mma_backward_layout_reproduces_the_twin(cutoff):
    # two key tiles and two query tiles, the second ones partial
    check_emulation_against_twin(emulate, 0, 1, 70, 2, 32, cutoff)
