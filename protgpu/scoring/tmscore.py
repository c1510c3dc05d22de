"""TM-score, GDT-TS/GDT-HA and MaxSub as the TMscore program computes them, batched over models.

The TMscore program (Zhang & Skolnick 2004; pylelab/USalign ``TMscore``) superposes a model on its
native structure by a search: for seed fragments of the aligned CA pairs (lengths n, n/2, n/4, ...,
at least 4; every start position) it superposes the fragment, keeps the pairs closer than
d0_search - 1 (relaxed by 0.5 A while fewer than 3 pass), then re-superposes on that subset and
re-selects with d0_search + 1 for up to 20 rounds, until the subset stops changing. The TM-score is
the best (1 / L) sum 1 / (1 + (d / d0)^2) over every superposition visited. The program runs that
search twice, and this module reproduces both, including the details that move the 4th decimal:

1. A first search with the program's search parameters: L = min(model length, native length),
   d0 = d0(L) + 0.8 (0.168 + 0.8 for L <= 19), d0_search = d0 clamped to [4.5, 8]. Its best
   superposition is not used for the TM-score, but every superposition it visits counts for GDT and
   MaxSub.
2. The final search, normalised by the native length L_N (or the model's, or a given length):
   d0 = 1.24 (L - 15)^(1/3) - 1.8 (0.5 for L <= 21, at least 0.5), d0_search = d0 clamped to
   [4.5, 8]; the score sums over all aligned pairs. Here GDT and MaxSub count only each seed's first
   superposition (the program's extension rounds call an overload that does not update them).

GDT P(c) is the largest number of pairs closer than c (strictly) under one superposition, over L_N;
GDT-TS = mean P(1, 2, 4, 8), GDT-HA = mean P(0.5, 1, 2, 4); MaxSub = max sum over pairs closer than
3.5 A of 1 / (1 + (d / 3.5)^2), over L_N. RMSD is the plain least-squares fit of all aligned pairs.

Three layers: :func:`tm_score` (inputs, mapping, backend), :func:`tm_search_numpy` (the NumPy twin:
the specification and the CPU path) and :func:`tm_search_cuda` (``kernels/tmscore.cu``: one warp per
(model, seed, stage), all in parallel).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._array import dispatch
from .._autograd import refuse_grad
from .._threads import blas_threads
from ..errors import InputError
from . import _batch, _fast
from ._kabsch import superpose, superpose_from_sums

# The search's layers (tm_inputs, search_parameters, seed_lengths, seed_fragments, tm_search_numpy,
# tm_search_cuda) stay importable by name for tests and benchmarks but are not public API.
__all__ = ["TMScoreResult", "d0_tmscore", "gdt", "tm_score"]

#: GDT distance cutoffs (Angstrom), in the order of :attr:`TMScoreResult.gdt_fractions`.
GDT_CUTOFFS = (0.5, 1.0, 2.0, 4.0, 8.0)
_GDT_CUTS2 = np.array([c * c for c in GDT_CUTOFFS])
_MAXSUB_D0SQ = 3.5 * 3.5
_MAX_ROUNDS = 20


class TMScoreResult(NamedTuple):
    """What :func:`tm_score` returns; arrays have a leading model axis M (dropped for one model).

    Attributes
    ----------
    tm : float64, shape (M,)
        TM-score, normalised as asked (default: by the reference's CA count L_N).
    rmsd : float64, shape (M,)
        RMSD of the aligned (common) CA pairs after their own least-squares fit, Angstrom.
    gdt_ts, gdt_ha : float64, shape (M,)
        GDT-TS and GDT-HA, fractions of L_N (0..1).
    maxsub : float64, shape (M,)
        MaxSub score over L_N (d0 = 3.5 A).
    n_aligned : int64, shape (M,)
        Aligned CA pairs (residues in common).
    rotation : float64, shape (M, 3, 3)
        Superposition of the TM-score: ``model @ rotation.T + translation`` lies on the reference.
    translation : float64, shape (M, 3)
        Angstrom.
    gdt_fractions : float64, shape (M, 5)
        P(c) for c = 0.5, 1, 2, 4, 8 Angstrom.
    d0 : float64, shape (M,)
        The TM-score's d0, Angstrom.
    n_skipped : int64, shape (M,)
        Model residues skipped for lack of a CA atom.
    """

    tm: object
    rmsd: object
    gdt_ts: object
    gdt_ha: object
    maxsub: object
    n_aligned: object
    rotation: object
    translation: object
    gdt_fractions: object
    d0: object
    n_skipped: object


# --------------------------------------------------------------------------------------------------
# Parameters of the search


def d0_tmscore(length) -> np.ndarray:
    """TM-score's d0(L) = 1.24 (L - 15)^(1/3) - 1.8 for L > 21, else 0.5; at least 0.5 (Angstrom).

    Examples
    --------
    >>> round(float(d0_tmscore(214)), 3)
    5.439
    >>> d0_tmscore([10, 100, 300]).round(3).tolist()
    [0.5, 3.652, 6.36]
    """
    L = np.asarray(length, dtype=np.float64)
    d0 = np.where(L > 21, 1.24 * np.cbrt(np.maximum(L - 15, 0)) - 1.8, 0.5)
    return np.maximum(d0, 0.5)


def _d0_search_stage1(n_model, n_ref) -> np.ndarray:
    # the program's parameter_set4search: L = min(lengths), d0 + 0.8, clamped to [4.5, 8]
    L = np.minimum(np.asarray(n_model, np.float64), np.asarray(n_ref, np.float64))
    d0 = np.where(L <= 19, 0.168, 1.24 * np.cbrt(np.maximum(L - 15, 0)) - 1.8) + 0.8
    return np.clip(d0, 4.5, 8.0)


def search_parameters(n_model, n_ref, l_norm) -> np.ndarray:
    """Per-model search parameters, shape (M, 4) float64: d0_search of the first search, d0_search and
    d0 of the final search, and 1 / L_norm."""
    l_norm = np.asarray(l_norm, np.float64)
    d0 = d0_tmscore(l_norm)
    return np.stack([_d0_search_stage1(n_model, n_ref), np.clip(d0, 4.5, 8.0), d0, 1.0 / l_norm], axis=1)


def seed_lengths(n: int) -> list[int]:
    """The program's seed fragment lengths for n aligned pairs: n, n/2, n/4, ... (integer halving,
    at least min(4, n)), at most six."""
    lmin = min(4, n)
    out = []
    for i in range(5):
        length = n >> i
        if length <= lmin:
            out.append(lmin)
            return out
        out.append(length)
    out.append(lmin)
    return out


def seed_fragments(n: int) -> np.ndarray:
    """Every seed of the search as (length, start) rows, shape (S, 2), in the program's order."""
    rows = [(length, s) for length in seed_lengths(n) for s in range(n - length + 1)]
    return np.asarray(rows, dtype=np.int64).reshape(-1, 2)


# --------------------------------------------------------------------------------------------------
# NumPy twin


def _select(d2: np.ndarray, dcut: float, n: int) -> np.ndarray:
    """Pairs with d < dcut, relaxed by 0.5 A per task while fewer than 3 pass (and n > 3).

    The relaxation is computed in one step per task rather than by the TMscore program's loop (which
    would take ~10^6 steps for distances of 10^6 A, and never end with NaN): the smallest ``inc`` with
    ``d2 < (dcut + 0.5 inc)^2`` for three pairs, found from the third smallest distance. A task with
    fewer than three finite distances takes all its finite pairs (where the loop's widening tends).
    """
    sel = d2 < dcut * dcut
    if n <= 3:
        return sel
    need = np.flatnonzero(sel.sum(axis=1) < 3)
    if need.size == 0:
        return sel
    third = np.partition(d2[need], 2, axis=1)[:, 2]  # NaN sorts last
    ok = np.isfinite(third)
    few = need[~ok]
    sel[few] = np.isfinite(d2[few])
    rows, third = need[ok], third[ok]
    inc = np.maximum(np.floor((np.sqrt(third) - dcut) / 0.5), 0.0) + 1.0
    # Settle the rounding of the closed form against the loop's own test, d2 < dd * dd.
    for _ in range(4):
        low = (dcut + inc * 0.5) ** 2 <= third
        inc[low] += 1.0
        high = (inc > 1.0) & ((dcut + (inc - 1.0) * 0.5) ** 2 > third)
        inc[high] -= 1.0
    dd = dcut + inc * 0.5
    sel[rows] = d2[rows] < (dd * dd)[:, None]
    return sel


def _gdt_counts(d2: np.ndarray):
    counts = np.stack([(d2 < c2).sum(axis=1) for c2 in _GDT_CUTS2], axis=1)
    ms = np.where(d2 < _MAXSUB_D0SQ, 1.0 / (1.0 + d2 / _MAXSUB_D0SQ), 0.0).sum(axis=1)
    return counts, ms


def _search_one(x: np.ndarray, y: np.ndarray, params: np.ndarray, stage1: bool, chunk: int):
    """Both searches for one model (x, y: (n, 3) float64 aligned pairs)."""
    n = len(x)
    seeds = seed_fragments(n)
    # Work on centred copies (superpositions do not care; |x|^2 terms below stay small) and turn the
    # translation back at the end.
    cx, cy = x.mean(axis=0), y.mean(axis=0)
    x = x - cx
    y = y - cy
    pxy = (x[:, :, None] * y[:, None, :]).reshape(n, 9)
    pyx = (y[:, :, None] * x[:, None, :]).reshape(n, 9)
    xx = (x * x).sum(axis=1)
    yy = (y * y).sum(axis=1)
    dsearch1, dsearch2, d0, inv_l = params
    d0sq = d0 * d0
    best = (-1.0, np.eye(3), np.zeros(3))
    gdt = np.zeros(5, dtype=np.int64)
    maxsub = 0.0

    def fit(w):
        rot, trans = superpose_from_sums(w.sum(axis=1), w @ x, w @ y, (w @ pxy).reshape(-1, 3, 3))
        return rot, trans

    def d2_of(rot, trans):
        # |R x + t - y|^2 expanded into matrix products over all tasks at once:
        # |x|^2 + |y|^2 + |t|^2 - 2 t.y - 2 R:(y x^T) + 2 (R^T t).x
        d2 = xx[None, :] + yy[None, :] + (trans * trans).sum(axis=1)[:, None]
        d2 -= 2.0 * (trans @ y.T)
        d2 -= 2.0 * (rot.reshape(-1, 9) @ pyx.T)
        d2 += 2.0 * (np.einsum("tij,ti->tj", rot, trans) @ x.T)
        return np.maximum(d2, 0.0)

    stages = (2, 1) if stage1 else (2,)
    for stage in stages:
        dsr = dsearch2 if stage == 2 else dsearch1
        for c0 in range(0, len(seeds), chunk):
            sd = seeds[c0:c0 + chunk]
            t_n = len(sd)
            idx = np.arange(n)
            w = ((idx[None] >= sd[:, 1:2]) & (idx[None] < sd[:, 1:2] + sd[:, 0:1])).astype(np.float64)
            rot, trans = fit(w)
            d2 = d2_of(rot, trans)
            cur = _select(d2, dsr - 1.0, n)
            counts, ms = _gdt_counts(d2)
            gdt = np.maximum(gdt, counts.max(axis=0))
            maxsub = max(maxsub, float(ms.max()))
            bs = np.full(t_n, -1.0)
            brot = np.zeros((t_n, 3, 3))
            btr = np.zeros((t_n, 3))
            if stage == 2:
                sc = (1.0 / (1.0 + d2 / d0sq)).sum(axis=1) * inv_l
                bs, brot, btr = sc, rot, trans
            active = np.arange(t_n)
            for _ in range(_MAX_ROUNDS):
                if active.size == 0:
                    break
                rot, trans = fit(cur[active].astype(np.float64))
                d2 = d2_of(rot, trans)
                new = _select(d2, dsr + 1.0, n)
                if stage == 1:
                    counts, ms = _gdt_counts(d2)
                    gdt = np.maximum(gdt, counts.max(axis=0))
                    maxsub = max(maxsub, float(ms.max()))
                else:
                    # the final search counts GDT/MaxSub only at the seed (see the module docstring)
                    sc = (1.0 / (1.0 + d2 / d0sq)).sum(axis=1) * inv_l
                    up = sc > bs[active]
                    hit = active[up]
                    bs[hit], brot[hit], btr[hit] = sc[up], rot[up], trans[up]
                done = (new == cur[active]).all(axis=1)
                cur[active] = new
                active = active[~done]
            if stage == 2:
                k = int(np.argmax(bs))  # first occurrence: the program keeps the first strict maximum
                if bs[k] > best[0]:
                    best = (float(bs[k]), brot[k], btr[k])
    score, rot, trans = best
    return (score, rot, trans + cy - rot @ cx), gdt, maxsub


def tm_search_numpy(x, y, n_ali, params, *, stage1: bool = True, chunk: int = 2048) -> dict:
    """The TMscore program's two searches for each model, in NumPy (float64).

    Parameters
    ----------
    x : array_like, shape (M, Lmax, 3)
        Model CA coordinates of the aligned pairs, in reference order, Angstrom.
    y : array_like, shape (M, Lmax, 3) or (1, Lmax, 3)
        The matched reference CA coordinates.
    n_ali : array_like of int, shape (M,)
        Aligned pairs of each model (the first ``n_ali[m]`` rows count).
    params : array_like, shape (M, 4)
        From :func:`search_parameters`.
    stage1 : bool
        Run the first search too (needed for GDT and MaxSub; the TM-score does not depend on it).
    chunk : int
        Seeds superposed at once (memory: about ``chunk * Lmax * 100`` bytes).

    Returns
    -------
    dict
        ``score`` (M,) TM-score; ``rotation`` (M, 3, 3); ``translation`` (M, 3) (x @ R.T + t fits y);
        ``gdt_counts`` (M, 5) int64 pairs within 0.5, 1, 2, 4, 8 A; ``maxsub_sum`` (M,).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    params = np.asarray(params, dtype=np.float64)
    m_total = x.shape[0]
    out = {"score": np.zeros(m_total), "rotation": np.zeros((m_total, 3, 3)), "translation": np.zeros((m_total, 3)),
           "gdt_counts": np.zeros((m_total, 5), np.int64), "maxsub_sum": np.zeros(m_total)}
    # BLAS on one thread: the fits' products are small (seeds x pairs), so threads cost more than they
    # give (2.4x slower on 2 cores), and one thread makes the numbers independent of the thread count
    # (a resume under another BLAS setting gives the same bytes).
    with blas_threads(1):
        for m in range(m_total):
            n = int(n_ali[m])
            ym = y[m if y.shape[0] > 1 else 0, :n]
            (score, rot, trans), counts, ms = _search_one(x[m, :n], ym, params[m], stage1, chunk)
            out["score"][m] = score
            out["rotation"][m] = rot
            out["translation"][m] = trans
            out["gdt_counts"][m] = counts
            out["maxsub_sum"][m] = ms
    return out


# --------------------------------------------------------------------------------------------------
# CUDA path


_TM_WARPS = 4
# 1: evaluate distances in float32 for float32 input (faster; a pair may cross a cutoff that float64
# would not). 0, the default: float64 arithmetic on float32 storage, the NumPy twin's numbers.
_TM_EVAL_STORAGE = 0
_SMEM_LIMIT = 48 * 1024  # stage coordinates in shared memory up to this (0: never; tests use it)
_SMEM_HARD = 48 * 1024  # dynamic shared memory a launch may ask for without an opt-in attribute


def subset_search_shared(warps: int, lmax: int, itemsize: int, limit: int) -> tuple[bool, int]:
    """Dynamic shared memory of a subset-search launch (``tmscore.cu``, ``gdt_windows.cu``).

    The layout is ``pg_stage_subset_search``'s (``kernels/common.cuh``): each warp's two subset bit
    masks (``lmax`` bits each, in 32-bit words), then, 16-byte aligned and when they fit in ``limit``
    bytes with the masks, the model's and the reference's ``3 lmax`` coordinates of ``itemsize`` bytes.

    Returns
    -------
    use_smem : bool
        Whether the coordinates are staged (else the kernel reads them from global memory).
    shared : int
        Bytes to launch with.

    Raises
    ------
    InputError
        If even the masks exceed what a launch may ask for without an opt-in (``_SMEM_HARD``).
    """
    nwords = (lmax + 31) // 32
    mask_bytes = ((warps * 2 * nwords * 4 + 15) // 16) * 16
    coord_bytes = 6 * lmax * itemsize
    use_smem = mask_bytes + coord_bytes <= limit
    shared = mask_bytes + (coord_bytes if use_smem else 0)
    if shared > _SMEM_HARD:
        raise InputError(f"{lmax} aligned residues exceed what one GPU block can hold; use device='cpu'")
    return use_smem, shared


def tm_search_cuda(x, y, n_ali, params, *, stage1: bool = True) -> dict:
    """The same searches as :func:`tm_search_numpy`, on the GPU (``kernels/tmscore.cu``).

    ``x``, ``y`` are CuPy float32 or float64 arrays (the kernel's precision follows them; superpositions
    are float64 QCP either way); returns the same dict with CuPy arrays. Work is split into chunks of
    models under the device memory budget, launched on the current stream.
    """
    import cupy as cp

    from .._cuda import get_kernel, launch
    from .._memory import device_budget_bytes, rows_per_chunk

    dtype = np.dtype(x.dtype)
    if dtype not in (np.float32, np.float64):
        raise InputError(f"coordinates must be float32 or float64, got {dtype}")
    m_total, lmax, _ = x.shape
    y_step = 1 if y.shape[0] > 1 else 0
    # The coordinates go to the kernel exactly as given (no centring here: rounding a centred copy
    # back to float32 would move atoms by ~1e-6 A, enough to flip a pair across a cutoff); the kernel
    # does its arithmetic in float64. Pairs past n_ali are zeroed, so padding never matters.
    n_ali_d = cp.asarray(n_ali, dtype=cp.int32)
    valid = (cp.arange(lmax)[None, :] < n_ali_d[:, None])[:, :, None]
    xc = cp.ascontiguousarray(cp.where(valid, x, 0).astype(dtype, copy=False))
    if y_step:
        yc = cp.ascontiguousarray(cp.where(valid, y, 0).astype(dtype, copy=False))
    else:
        yc = cp.ascontiguousarray(y.astype(dtype, copy=False))
    params_d = cp.asarray(params, dtype=cp.float64)

    use_smem, shared = subset_search_shared(_TM_WARPS, lmax, dtype.itemsize, _SMEM_LIMIT)
    n_hi = int(np.max(n_ali))
    n_tasks_max = sum(n_hi - length + 1 for length in seed_lengths(n_hi)) * (2 if stage1 else 1)
    sm_count = cp.cuda.Device().attributes["MultiProcessorCount"]
    kernel = get_kernel("tmscore", "tm_search_f32" if dtype == np.float32 else "tm_search_f64",
                        defines={"TM_WARPS": _TM_WARPS, "TM_EVAL_STORAGE": _TM_EVAL_STORAGE})

    per_model = 2 * lmax * 3 * dtype.itemsize + 4096
    step = rows_per_chunk(per_model, m_total, device_budget_bytes())
    score = cp.empty(m_total)
    rt = cp.empty((m_total, 12))
    gdt_c = cp.empty((m_total, 5), dtype=cp.int64)
    maxsub = cp.empty(m_total)
    for m0 in range(0, m_total, step):
        m1 = min(m_total, m0 + step)
        mc = m1 - m0
        # enough blocks to fill the GPU (about 8 resident per SM), never more than there are tasks
        cols = int(max(1, min((n_tasks_max + _TM_WARPS - 1) // _TM_WARPS, -(-8 * sm_count // mc), 65535)))
        o_score = cp.empty((mc, cols))
        o_task = cp.empty((mc, cols), dtype=cp.int32)
        o_rt = cp.empty((mc, cols, 12))
        o_gdt = cp.empty((mc, cols, 5), dtype=cp.int32)
        o_ms = cp.empty((mc, cols))
        launch(kernel, (mc, cols), (_TM_WARPS * 32,), xc[m0:m1], yc[m0:m1] if y_step else yc, np.int32(y_step),
               n_ali_d[m0:m1], params_d[m0:m1], np.int32(lmax), np.int32(1 if stage1 else 0),
               np.int32(1 if use_smem else 0), o_score, o_task, o_rt, o_gdt, o_ms, shared_mem=shared)
        best = o_score.max(axis=1)
        # ties: the lowest task index, as the program keeps the first strict maximum it meets
        cand = cp.where(o_score == best[:, None], o_task, np.iinfo(np.int32).max)
        col = cand.argmin(axis=1)
        score[m0:m1] = best
        rt[m0:m1] = o_rt[cp.arange(mc), col]
        gdt_c[m0:m1] = o_gdt.max(axis=1)
        maxsub[m0:m1] = o_ms.max(axis=1)
    rot = cp.ascontiguousarray(rt[:, :9].reshape(m_total, 3, 3))
    trans = cp.ascontiguousarray(rt[:, 9:])
    return {"score": score, "rotation": rot, "translation": trans, "gdt_counts": gdt_c, "maxsub_sum": maxsub}


# --------------------------------------------------------------------------------------------------
# Public functions


def _norm_lengths(normalize_by, batch) -> np.ndarray:
    if isinstance(normalize_by, str):
        if normalize_by == "reference":
            return np.full(len(batch.names), float(batch.n_ref))
        if normalize_by == "model":
            return batch.n_model.astype(np.float64)
        raise InputError(f"normalize_by must be 'reference', 'model' or a length, not {normalize_by!r}")
    try:
        length = float(normalize_by)
    except (TypeError, ValueError):
        raise InputError(f"normalize_by must be 'reference', 'model' or a length, not {normalize_by!r}") from None
    if not np.isfinite(length) or length <= 0:
        raise InputError(f"normalize_by: a length must be positive, got {normalize_by!r}")
    return np.full(len(batch.names), length)


def _common_rmsd(x, y, n_ali, xp):
    """RMSD of all aligned pairs after their least-squares fit (float64), shape (M,).

    On the GPU this is ``qcp.cu``'s ``aligned_rmsd_*`` (one warp per model, so a model's value never
    depends on the other models of the batch or on its padded length); on the CPU the batched float64
    Kabsch of :mod:`._kabsch` over the padded arrays with zero weights past each model's pairs. A model
    with ``n_ali == 0`` gets NaN on both (an RMSD over no pairs is undefined; its TM-score is 0).
    """
    if xp is not np:
        return _common_rmsd_cuda(x, y, n_ali)
    lmax = x.shape[1]
    w = (xp.arange(lmax)[None, :] < xp.asarray(n_ali)[:, None]).astype(xp.float64)
    yb = y if y.shape[0] == x.shape[0] else xp.broadcast_to(y, x.shape)
    return superpose(x, yb, w, xp=xp)[2]


def _common_rmsd_cuda(x, y, n_ali):
    """CUDA path of :func:`_common_rmsd`: ``x`` (M, Lmax, 3) and ``y`` (M or 1, Lmax, 3) CuPy arrays of
    one float dtype, ``n_ali`` (M,) aligned pairs per model; returns (M,) float64 CuPy."""
    import cupy as cp

    from .._cuda import launch
    from ..superpose.kernels import get as _kernel
    from ..superpose.qcp import DIRECT_TAU as _DIRECT_TAU

    dtype = np.float32 if x.dtype == np.float32 and y.dtype == np.float32 else np.float64
    xs = cp.ascontiguousarray(x, dtype=dtype)
    ys = cp.ascontiguousarray(y, dtype=dtype)
    m, lmax = xs.shape[:2]
    out = cp.empty(m)
    if m == 0:
        return out
    n_d = cp.asarray(n_ali, dtype=cp.int32)
    warps_per_block = 8
    grid = (int(min(-(-m // warps_per_block), 1 << 20)),)
    launch(_kernel("aligned_rmsd_f32" if dtype == np.float32 else "aligned_rmsd_f64"), grid,
           (32 * warps_per_block,), xs, ys, np.int32(1 if ys.shape[0] == m and m > 1 else 0), n_d,
           np.int32(lmax), np.int64(m), float(_DIRECT_TAU), out)
    return out


def tm_score(models, reference, *, normalize_by="reference", mapping="resnum", device: str = "auto"):
    """TM-score, GDT-TS, GDT-HA, MaxSub and RMSD of models against a reference, as the TMscore program.

    Parameters
    ----------
    models : Structure, path, array_like, or list of these
        One model or many: a Structure (every frame a model), a PDB/mmCIF path, coordinates of shape
        (L, 3) or (M, L, 3) (NumPy, CuPy or torch), or a list of any of these (files of different
        lengths and numbering). Arrays scored against an array reference hold one CA per residue and
        are matched by index; arrays with a reference Structure must have all its atoms.
    reference : Structure, path or array_like
        The native structure (one frame). Its residues with a CA atom set L_N.
    normalize_by : {"reference", "model"} or float
        Length L of the TM-score's 1 / L and d0(L): the reference's CA count (the TMscore program's
        default), the model's, or a given length. GDT and MaxSub are always fractions of L_N.
    mapping : {"resnum", "sequence"} or array_like
        How model residues are matched to reference residues: equal (chain, residue number,
        insertion code); a global sequence alignment; or explicit (model residue, reference residue)
        index pairs, shape (K, 2), or a list of those, one per model (see
        :mod:`protgpu.scoring._mapping`). Residues without a CA atom are skipped, as the TMscore
        program does, and counted in ``n_skipped``.
    device : {"auto", "cpu", "gpu"}
        Where to compute; the GPU runs every model and every seed fragment in parallel.

    Returns
    -------
    TMScoreResult
        Named tuple of arrays with a leading model axis (scalars and (3, 3) / (3,) arrays for one
        model); arrays come back as the input's type (NumPy in, NumPy out).

    Raises
    ------
    InputError
        A model with no (or fewer than 3) residues in common with the reference (the message names
        the file), chains that cannot be matched, bad ``normalize_by`` or ``mapping``.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.cumsum(np.random.default_rng(0).normal(size=(60, 3)) * 2.2, axis=0)
    >>> r = tm_score(x, x, device="cpu")
    >>> round(r.tm, 6), round(r.gdt_ts, 6), r.n_aligned
    (1.0, 1.0, 60)
    """
    refuse_grad("pg.tm_score", models, reference)
    be = dispatch(*[m for m in (models if isinstance(models, (list, tuple)) else [models])],
                  reference, device=device)
    dtype = _batch.work_dtype(models, reference)
    batch, single = _batch.tm_batch(models, reference, mapping, be, dtype)
    l_norm = _norm_lengths(normalize_by, batch)
    params = search_parameters(batch.n_model, batch.n_ref, l_norm)
    xp = be.xp
    x, y, bad = batch.x, batch.y, None
    if be.on_gpu:
        x, y, bad = _without_bad_models(x, y, xp)
        raw = tm_search_cuda(x, y, batch.n_ali, params)
    elif _fast.enabled():  # compiled twin of tm_search_numpy (docs/design/cpu-speed.md)
        raw = _fast.tm_search(x, y, batch.n_ali, params)
    else:
        raw = tm_search_numpy(x, y, batch.n_ali, params)
    n_ref = float(batch.n_ref)
    counts = xp.asarray(raw["gdt_counts"]).astype(xp.float64)
    frac = counts / n_ref
    result = TMScoreResult(
        tm=raw["score"],
        rmsd=_common_rmsd(x, y, batch.n_ali, xp),
        gdt_ts=counts[:, 1:5].sum(axis=1) / (4 * n_ref),
        gdt_ha=counts[:, 0:4].sum(axis=1) / (4 * n_ref),
        maxsub=xp.asarray(raw["maxsub_sum"]) / n_ref,
        n_aligned=batch.n_ali.copy(),
        rotation=raw["rotation"],
        translation=raw["translation"],
        gdt_fractions=frac,
        d0=params[:, 2].copy(),
        n_skipped=batch.n_skipped.copy(),
    )
    if bad is not None:  # models whose device coordinates were not finite or out of range score NaN
        result = result._replace(**{f: _nan_where(getattr(result, f), bad, xp) for f in _FLOAT_FIELDS})
    result = be.wrap(result)
    if single:
        result = TMScoreResult(*(_batch.first_model(v) for v in result))
    return result


_FLOAT_FIELDS = ("tm", "rmsd", "gdt_ts", "gdt_ha", "maxsub", "rotation", "translation", "gdt_fractions")


def _without_bad_models(x, y, xp):
    """Device coordinates with NaN, infinite or out-of-range models zeroed, and the (M,) mask of those.

    Host input was checked by the front door; device input is not scanned there (it would synchronise
    the caller's stream), so it is cleaned here, on the device, in two elementwise passes: the search's
    cutoff widening would otherwise never end for a model without three finite distances (NaN) or
    take ~10^6 steps per subset (coordinates of 10^6 A). Those models score NaN.
    """
    from .._inputs import MAX_ABS_COORD

    x_ok = (xp.abs(x) <= MAX_ABS_COORD).all(axis=(1, 2))
    y_ok = (xp.abs(y) <= MAX_ABS_COORD).all(axis=(1, 2))  # (1,) for a reference shared by every model
    ok = x_ok & y_ok
    x = xp.where(ok[:, None, None], x, 0).astype(x.dtype, copy=False)
    y = xp.where(y_ok[:, None, None], y, 0).astype(y.dtype, copy=False)
    return x, y, ~ok


def _nan_where(v, bad, xp):
    v = xp.asarray(v, dtype=xp.float64) if not hasattr(v, "dtype") or v.dtype.kind != "f" else v.copy()
    v[bad] = xp.nan
    return v


def tm_inputs(models, reference, *, normalize_by="reference", mapping="resnum", dtype=np.float64):
    """The aligned CA pairs and search parameters, as :func:`tm_score` prepares them (NumPy arrays).

    For tests, benchmarks and callers that run :func:`tm_search_numpy` / :func:`tm_search_cuda`
    directly.

    Returns
    -------
    batch : protgpu.scoring._batch.TMBatch
    params : np.ndarray, shape (M, 4)
    """
    batch, _ = _batch.tm_batch(models, reference, mapping, dispatch(device="cpu"), np.dtype(dtype))
    return batch, search_parameters(batch.n_model, batch.n_ref, _norm_lengths(normalize_by, batch))


def gdt(models, reference, *, mapping="resnum", device: str = "auto"):
    """GDT-TS and GDT-HA of models against a reference, by the TMscore program's search.

    Parameters
    ----------
    models, reference, mapping, device
        As for :func:`tm_score`.

    Returns
    -------
    gdt_ts, gdt_ha : float64 arrays of shape (M,), or floats for one model
        Fractions of the reference's CA count (0..1).

    Examples
    --------
    >>> ts, ha = gdt("datasets/adk_closed.pdb", "datasets/adk_open.pdb", device="cpu")
    >>> round(ts, 3), round(ha, 3)
    (0.577, 0.415)
    """
    refuse_grad("pg.gdt", models, reference)
    r = tm_score(models, reference, mapping=mapping, device=device)
    return r.gdt_ts, r.gdt_ha
