"""GDT-TS and GDT-HA as OpenStructure's ``Scorer`` computes them (``ost.mol.alg.GDT``), batched over
models and seed windows.

OpenStructure does not run the TMscore program's search (:mod:`protgpu.scoring.tmscore`) for GDT. For
each distance cutoff c (0.5, 1, 2, 4, 8 Angstrom) and each window size w in 7, 9, 12, 24, 48 and n
(n: the mapped CA pairs, in mapping order), it seeds superpositions from windows of w consecutive
pairs: every start if there are at most 1,000, else 1,000 starts spread evenly. Each seed is refined
by iterative superposition: superpose on the current subset (first the window), take every pair closer
than c (strictly) as the next subset, for at most 10 rounds, until the subset repeats or has fewer than
3 pairs. A seed counts the largest subset any of its rounds selected; P(c) is the best count over all
seeds and window sizes divided by the reference's CA count L_N (mapped plus unmapped residues).
GDT-TS = mean P(1, 2, 4, 8), GDT-HA = mean P(0.5, 1, 2, 4). Details and what differs from
OpenStructure (float64 everywhere, windows larger than n skipped): ``docs/design/complexes.md``.

Three paths, one specification: :func:`gdt_windows_numpy` (the NumPy twin, batched over seeds),
:func:`gdt_windows_fast` (numba, one model per thread; ``protgpu.scoring._fast``'s fits) and
:func:`gdt_windows_cuda` (``kernels/gdt_windows.cu``: one warp per (model, window)).
:func:`gdt_windows` is the front end (inputs, mapping, device).
"""

from __future__ import annotations

import contextlib
from functools import lru_cache

import numpy as np

from .._array import dispatch
from .._autograd import refuse_grad
from . import _batch
from . import _fast as _sf
from ._kabsch import superpose_from_sums
from .tmscore import _SMEM_HARD, subset_search_shared

__all__ = ["gdt_windows"]

#: Window sizes of OpenStructure's Scorer (``_gdt_window_sizes``); n, the number of pairs, is added.
WINDOW_SIZES = (7, 9, 12, 24, 48)
#: At most this many windows of one size (``GDT(..., max_windows=1000, ...)``).
MAX_WINDOWS = 1000
#: Rounds of iterative superposition per seed (``SuperposeIterative(..., 10, ...)``).
MAX_ROUNDS = 10
#: Distance cutoffs, Angstrom, in the order of the counts (as ``tmscore.GDT_CUTOFFS``).
CUTOFFS = (0.5, 1.0, 2.0, 4.0, 8.0)
_CUTS2 = np.array([c * c for c in CUTOFFS])


# --------------------------------------------------------------------------------------------------
# Seeds


@lru_cache(maxsize=64)
def _starts(n: int, w: int) -> tuple:
    last = n - w
    if last + 1 <= MAX_WINDOWS:
        return tuple(range(last + 1))
    # OpenStructure steps a float ("Real", single precision in its default build) by
    # last / (max_windows - 1) and rounds each value half away from zero
    delta = np.float32(np.float32(last) / np.float32(MAX_WINDOWS - 1))
    tmp, out = np.float32(0.0), []
    for _ in range(MAX_WINDOWS):
        out.append(int(np.floor(float(tmp) + 0.5)))
        tmp = np.float32(tmp + delta)
    return tuple(out)


@lru_cache(maxsize=64)
def window_seeds(n: int) -> np.ndarray:
    """The seed windows for n pairs as (start, length) rows, shape (S, 2) int64, read-only.

    Window sizes :data:`WINDOW_SIZES` and n, each once; sizes above n (OpenStructure raises there)
    and below 3 (no superposition) are left out.

    Examples
    --------
    >>> window_seeds(8).tolist()
    [[0, 7], [1, 7], [0, 8]]
    >>> len(window_seeds(455))
    2181
    """
    sizes = sorted({w for w in (*WINDOW_SIZES, n) if 3 <= w <= n})
    rows = [(s, w) for w in sizes for s in _starts(n, w)]
    out = np.asarray(rows, dtype=np.int64).reshape(-1, 2)
    out.flags.writeable = False
    return out


def _seed_table(n_ali: np.ndarray):
    """Seeds of every model: one :func:`window_seeds` table per distinct length (models of one mapping
    share theirs), concatenated, shape (S, 2) int64; each model's first row and row count, (M,) int64."""
    lengths, which = np.unique(np.asarray(n_ali, np.int64), return_inverse=True)
    parts = [window_seeds(int(n)) for n in lengths]
    cnt = np.asarray([len(p) for p in parts], np.int64)
    off = np.concatenate([[0], np.cumsum(cnt)[:-1]]).astype(np.int64)
    seeds = np.ascontiguousarray(np.concatenate(parts)) if parts else np.zeros((0, 2), np.int64)
    return seeds, off[which.reshape(-1)], cnt[which.reshape(-1)]


def _centred(x, y, n_ali, xp):
    """x, y (M or 1, L, 3) as float64, zero past n_ali, each model's pairs moved to their centroid
    (superpositions do not care; the fits' sums then cancel nothing)."""
    x = xp.asarray(x, dtype=xp.float64)
    y = xp.asarray(y, dtype=xp.float64)
    m, lmax = x.shape[0], x.shape[1]
    n = xp.asarray(np.asarray(n_ali, np.int64))
    valid = (xp.arange(lmax)[None, :] < n[:, None])[:, :, None]
    inv = 1.0 / xp.maximum(n, 1).astype(xp.float64)[:, None]
    yb = xp.broadcast_to(y, (m, lmax, 3))
    xc = xp.where(valid, x - (xp.where(valid, x, 0.0).sum(axis=1) * inv)[:, None, :], 0.0)
    yc = xp.where(valid, yb - (xp.where(valid, yb, 0.0).sum(axis=1) * inv)[:, None, :], 0.0)
    return xp.ascontiguousarray(xc), xp.ascontiguousarray(yc)


# --------------------------------------------------------------------------------------------------
# NumPy twin


def gdt_windows_numpy(x, y, n_ali, *, chunk: int = 2048) -> np.ndarray:
    """Best counts of pairs within each cutoff, OpenStructure's window search (the specification).

    Parameters
    ----------
    x : np.ndarray, shape (M, L, 3)
        Model CAs in mapping order, Angstrom (rows past ``n_ali`` ignored).
    y : np.ndarray, shape (M, L, 3) or (1, L, 3)
        The matched reference CAs.
    n_ali : array_like of int, shape (M,)
        Pairs per model.
    chunk : int
        Seeds per vectorised batch (memory: ~chunk x n x 80 bytes).

    Returns
    -------
    np.ndarray, shape (M, 5), int64
        For each cutoff of :data:`CUTOFFS`, the largest subset any seed's rounds selected.
    """
    n_ali = np.asarray(n_ali, np.int64)
    xc, yc = _centred(x, y, n_ali, np)
    out = np.zeros((len(n_ali), len(CUTOFFS)), np.int64)
    for m, n in enumerate(n_ali.tolist()):
        seeds = window_seeds(n)
        if len(seeds) == 0:
            continue
        xm, ym = xc[m, :n], yc[m, :n]
        pxy = (xm[:, :, None] * ym[:, None, :]).reshape(n, 9)
        cols = np.arange(n)
        for k, c2 in enumerate(_CUTS2):
            for s0 in range(0, len(seeds), chunk):
                s = seeds[s0:s0 + chunk]
                cur = (cols[None, :] >= s[:, :1]) & (cols[None, :] < s[:, :1] + s[:, 1:])
                best = np.zeros(len(s), np.int64)
                live = np.ones(len(s), bool)
                for _ in range(MAX_ROUNDS):
                    live &= cur.sum(axis=1) >= 3  # OpenStructure stops a subset of fewer than 3 pairs
                    idx = np.flatnonzero(live)
                    if idx.size == 0:
                        break
                    w = cur[idx].astype(np.float64)
                    rot, trans = superpose_from_sums(w.sum(axis=1), w @ xm, w @ ym, (w @ pxy).reshape(-1, 3, 3))
                    d = np.einsum("tij,nj->tni", rot, xm) + trans[:, None, :] - ym[None]
                    new = np.einsum("tni,tni->tn", d, d) < c2
                    best[idx] = np.maximum(best[idx], new.sum(axis=1))
                    same = (new == cur[idx]).all(axis=1)
                    cur[idx] = new
                    live[idx[same]] = False
                out[m, k] = max(out[m, k], int(best.max()))
    return out


# --------------------------------------------------------------------------------------------------
# numba path (protgpu.scoring._fast's pattern and fits)

_LOOPS = _sf.Loops(globals(), after=_sf._compile)
_jit = _LOOPS.jit
_MAX_ROUNDS = MAX_ROUNDS  # a compile-time constant in the loops


@_jit
def _model_counts(x, y, seeds, cuts2, out):
    """One model: x, y (3, n) centred rows; seeds (S, 2); writes the (5,) best counts to ``out``."""
    n = x.shape[1]
    # _fast._fit_subset's work arrays: rotation, translation, key matrix, quaternion, adjugate rows, sums
    rot, trans, kbuf, q = np.empty((3, 3)), np.empty(3), np.empty(10), np.empty(4)
    rows, wk = np.empty((4, 4)), np.empty(15)
    d2, first = np.empty(n), np.empty(n)  # distances of this round, of the window's fit
    cur, new = np.zeros(n, np.bool_), np.zeros(n, np.bool_)
    for k in range(cuts2.shape[0]):
        out[k] = 0
    for si in range(seeds.shape[0]):
        start, length = seeds[si, 0], seeds[si, 1]
        # the window's superposition is the same for every cutoff: fit it once
        _sf._fit_subset(x, y, cur, start, length, rot, trans, kbuf, q, rows, wk)
        _sf._dist2(x, y, rot, trans, first)
        for k in range(cuts2.shape[0]):
            c2 = cuts2[k]
            for p in range(n):
                cur[p] = start <= p < start + length
            for p in range(n):
                d2[p] = first[p]
            for _r in range(_MAX_ROUNDS):
                if _r > 0:
                    _sf._fit_subset(x, y, cur, 0, -1, rot, trans, kbuf, q, rows, wk)
                    _sf._dist2(x, y, rot, trans, d2)
                cnt = 0
                same = True
                for p in range(n):
                    v = d2[p] < c2
                    new[p] = v
                    cnt += v
                    if v != cur[p]:
                        same = False
                if cnt > out[k]:
                    out[k] = cnt
                if same or cnt < 3:
                    break
                for p in range(n):
                    cur[p] = new[p]


@_jit
def _models_counts(xc, yc, n_ali, seeds, off, cnt, cuts2, m0, m1, out):
    for m in range(m0, m1):
        n = n_ali[m]
        if cnt[m] == 0:
            continue
        x = np.ascontiguousarray(xc[m, :n].T)
        y = np.ascontiguousarray(yc[m, :n].T)
        _model_counts(x, y, seeds[off[m]:off[m] + cnt[m]], cuts2, out[m])


def gdt_windows_fast(x, y, n_ali) -> np.ndarray:
    """:func:`gdt_windows_numpy`, compiled with numba (same arguments and result), models spread over
    the process's threads (``protgpu.scoring._fast``'s pool)."""
    _LOOPS.compile()
    n_ali = np.ascontiguousarray(n_ali, dtype=np.int64)
    xc, yc = _centred(x, y, n_ali, np)
    m_total = len(n_ali)
    seeds, off, cnt = _seed_table(n_ali)
    out = np.zeros((m_total, len(CUTOFFS)), np.int64)
    _sf._pool_run(m_total, lambda m0, m1: _models_counts(xc, yc, n_ali, seeds, off, cnt, _CUTS2, m0, m1, out),
                  per_task=1)
    return out


# --------------------------------------------------------------------------------------------------
# CUDA path

_WARPS = 4  # warps per block (GW_WARPS in kernels/gdt_windows.cu)
_SMEM_LIMIT = _SMEM_HARD  # coordinates staged in shared memory up to this (tests set 0: global reads)


def gdt_windows_cuda(x, y, n_ali):
    """:func:`gdt_windows_numpy` on the GPU (``kernels/gdt_windows.cu``), CuPy in and out.

    ``x``, ``y``: CuPy arrays as for the twin (any float dtype: the kernel works in float64). Returns
    the (M, 5) int64 counts on the device. One warp per (model, window), the five cutoffs in turn.
    """
    import cupy as cp

    from .._cuda import get_kernel, launch
    from .._memory import device_budget_bytes, rows_per_chunk

    n_ali = np.asarray(n_ali, np.int64)
    m_total, lmax = int(x.shape[0]), int(x.shape[1])
    out = cp.zeros((m_total, len(CUTOFFS)), dtype=cp.int32)
    if m_total == 0 or int(n_ali.max(initial=0)) < 3:
        return out.astype(cp.int64)
    xc, yc = _centred(x, y, n_ali, cp)
    use_smem, shared = subset_search_shared(_WARPS, lmax, 8, _SMEM_LIMIT)
    seeds, off, cnt = _seed_table(n_ali)
    seeds_d, off_d, cnt_d = (cp.asarray(v.astype(np.int32)) for v in (seeds, off, cnt))
    n_d = cp.asarray(n_ali.astype(np.int32))
    s_max = int(cnt.max())
    kernel = get_kernel("gdt_windows", "gdt_windows_f64", defines={"GW_WARPS": _WARPS})
    sm_count = cp.cuda.Device().attributes["MultiProcessorCount"]
    step = rows_per_chunk(2 * lmax * 3 * 8 + 4096, m_total, device_budget_bytes())
    for m0 in range(0, m_total, step):
        m1 = min(m_total, m0 + step)
        mc = m1 - m0
        cols = int(max(1, min(-(-s_max // _WARPS), -(-8 * sm_count // mc), 65535)))
        launch(kernel, (mc, cols), (_WARPS * 32,), xc[m0:m1], yc[m0:m1], n_d[m0:m1], seeds_d, off_d[m0:m1],
               cnt_d[m0:m1], np.int32(lmax), np.int32(1 if use_smem else 0), out[m0:m1], shared_mem=shared)
    return out.astype(cp.int64)


# --------------------------------------------------------------------------------------------------
# Front end


def gdt_counts(x, y, n_ali, *, device: str = "cpu"):
    """The (M, 5) counts by the path for ``device`` ("gpu": CuPy arrays in and out; "cpu": numba when
    available, else the NumPy twin)."""
    if device == "gpu":
        return gdt_windows_cuda(x, y, n_ali)
    if _sf.enabled():
        return gdt_windows_fast(x, y, n_ali)
    return gdt_windows_numpy(x, y, n_ali)


def gdt_windows(models, reference, *, mapping="resnum", device: str = "auto"):
    """GDT-TS and GDT-HA as OpenStructure's Scorer computes them (window-seeded iterative superposition).

    Parameters
    ----------
    models, reference, mapping, device
        As for :func:`protgpu.tm_score` (CA pairs in the mapping's order, which sets the windows).

    Returns
    -------
    gdt_ts, gdt_ha : float64 arrays of shape (M,), or floats for one model
        Fractions of the reference's CA count L_N (0..1).

    Raises
    ------
    InputError
        As :func:`protgpu.tm_score` (no or too few residues in common, bad mapping).

    Examples
    --------
    >>> ts, ha = gdt_windows("datasets/adk_closed.pdb", "datasets/adk_open.pdb", device="cpu")
    >>> 0.0 < ha < ts < 1.0
    True
    """
    return gdt_windows_started(models, reference, mapping=mapping, device=device)()


_side_streams: dict = {}  # device id -> the stream started GPU searches run on (one per device, kept)


def gdt_windows_started(models, reference, *, mapping="resnum", device: str = "auto"):
    """Start :func:`gdt_windows` and return a function that waits for it and returns its result.

    On the GPU the search (its batch gathered on the device, the kernel) runs on a non-blocking
    stream of its own, after the work already queued on the caller's stream: the caller goes on
    queueing other scores meanwhile (``score_complex`` does: the GDT kernel is its longest).
    On the CPU the work is done before returning.
    """
    refuse_grad("gdt_windows", models, reference)
    be = dispatch(*[m for m in (models if isinstance(models, (list, tuple)) else [models])],
                  reference, device=device)
    stream, scope = None, contextlib.nullcontext()
    if be.on_gpu:
        import cupy as cp

        dev = cp.cuda.Device().id
        if dev not in _side_streams:
            _side_streams[dev] = cp.cuda.Stream(non_blocking=True)
        stream = _side_streams[dev]
        stream.wait_event(cp.cuda.get_current_stream().record())
        scope = stream
    with scope:
        batch, single = _batch.tm_batch(models, reference, mapping, be, np.dtype(np.float64))
        counts = gdt_counts(batch.x, batch.y, batch.n_ali, device="gpu" if be.on_gpu else "cpu")

    def result():
        if stream is not None:
            stream.synchronize()
        c = np.asarray(counts.get() if hasattr(counts, "get") else counts, np.float64)
        ts = c[:, 1:5].sum(axis=1) / (4.0 * batch.n_ref)
        ha = c[:, 0:4].sum(axis=1) / (4.0 * batch.n_ref)
        if single:
            return float(ts[0]), float(ha[0])
        return ts, ha

    return result
