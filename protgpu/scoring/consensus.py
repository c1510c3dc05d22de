"""Ensemble consensus score: each model attends over the others by RMSD and scores its weighted similarity.

For an ensemble of M models (decoys of one protein, frames of a trajectory) with all-vs-all RMSDs
``r_ij`` after optimal superposition (:func:`protgpu.pairwise_rmsd`, QCP on the centred GEMM), model
``i`` attends over the others, ``j != i``, with weights and scores

    w_ij = softmax_j(-r_ij^2 / T)          (T: the temperature, Angstrom^2)
    score_i = sum_j w_ij / (1 + (r_ij / d0)^2)

where ``1 / (1 + (r / d0)^2)`` is the TM-score-style similarity of two superposed models at RMSD ``r``
and ``d0 = d0(L)`` is the TM-score's length scale (:func:`protgpu.scoring.tmscore.d0_tmscore`) for L
atoms per model (the CA count for Structures). A model in a tight, populated region of conformation
space scores near 1; an outlier scores low. Scores lie in (0, 1].

Three layers, as everywhere in protgpu: :func:`consensus_score` (inputs, backend, conversion back);
the NumPy twin :func:`consensus_numpy` (the specification and the CPU path: the RMSD matrix, or blocks
of its rows, then a stable softmax without the diagonal); and the CUDA path :func:`consensus_cuda`,
which never holds an M x M matrix. It walks the upper-triangular schedule of RMSD tiles (each pair
computed once, by ``pairwise_rmsd``'s GEMM + QCP on the device) and folds every tile, as soon as it is
made, into per-model online-softmax states (``kernels/consensus.cu``): the running maximum logit
``m_i``, ``s_i = sum exp(l_ij - m_i)`` and ``t_i = sum exp(l_ij - m_i) sim_ij``, all float64, for the
tile's rows and, through the transpose, its columns; ``score_i = t_i / s_i`` at the end. Device memory
is O(tile^2 + M). :func:`consensus_tiled_numpy` runs that same schedule and state algebra in NumPy
(:func:`tile_update_numpy` is the kernel's twin), so the GPU algorithm is checked on the CPU too.

The default temperature, ``T = 4 Angstrom^2`` (:data:`DEFAULT_TEMPERATURE`): relative to an identical
neighbour, a neighbour at RMSD r gets weight ``exp(-r^2 / T)``: 0.78 at 1 Angstrom, 0.37 at 2, 0.11 at
3, 0.018 at 4 and 1e-4 at 6. CA-RMSDs between models of the same fold (near-native decoys, conformations
within one MD basin) are typically 1-3 Angstrom, between wrong folds 6 Angstrom and more. At 4 A^2 a
model's score averages the similarity over its neighbours within ~2-3 Angstrom, its own basin, and
essentially ignores other basins; the softmax normalises, so a model with no near neighbour attends to
its nearest ones and scores their (low) similarity. Smaller temperatures (1 A^2) reduce the score to
the similarity of the single nearest neighbour, so that two near-duplicate wrong decoys look like a
consensus; larger ones approach the plain mean similarity (``T -> inf``, as classic 3D-Jury/Pcons-style
consensus), where a crowd of diverse wrong decoys drowns the signal.
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

import numpy as np

from .._array import dispatch, is_torch_tensor
from .._autograd import refuse_grad
from .._inputs import as_array, as_structure, check_finite, has_topology, host_view, is_structure, source_name
from .._memory import check_host_fits, device_budget_bytes, format_bytes, rows_per_chunk
from ..errors import InputError, MemoryBudgetError
from .tmscore import d0_tmscore

# The NumPy twins and the CUDA path (consensus_numpy, consensus_tiled_numpy, tile_update_numpy,
# consensus_cuda) stay importable by name for tests and benchmarks but are not public API.
__all__ = ["DEFAULT_TEMPERATURE", "ConsensusResult", "consensus_ranking_table", "consensus_score"]

#: Default softmax temperature of :func:`consensus_score`, Angstrom^2 (module notes say why).
DEFAULT_TEMPERATURE = 4.0

# Update modes of the tile kernel (same values as CS_ROWS / CS_COLS in kernels/consensus.cu).
ROWS, COLS = 1, 2
_THREADS = 256  # CS_THREADS of consensus.cu
_WARPS = _THREADS // 32

_GPU_MAX_TILE = 4096  # models per tile side on the GPU (a 64 MiB float32 tile; few, large GEMMs)
_CPU_MATRIX_BYTES = 256 << 20  # NumPy twin: the whole symmetric RMSD matrix up to this, else row blocks
_CPU_BLOCK_BYTES = 64 << 20  # NumPy twin: float64 temporaries of one block of rows


class ConsensusResult(NamedTuple):
    """What :func:`consensus_score` returns with ``return_weights=True``.

    Attributes
    ----------
    score : array, shape (M,), float64
        Consensus score of each model, in (0, 1].
    weights : array, shape (M, M), float64
        ``weights[i, j]`` = softmax weight of model j for model i; zero diagonal; rows sum to 1.
    """

    score: Any
    weights: Any


# ==================================================================================================
# Inputs


def _frame_names(structures) -> list[str]:
    """One name per model: the file name, with ``[i]`` for the frames of a multi-frame Structure (as
    ``protgpu score`` names its rows)."""
    out = []
    for k, s in enumerate(structures):
        base = source_name(s, f"model {k}")
        out += [base] if s.n_frames == 1 else [f"{base}[{i}]" for i in range(s.n_frames)]
    return out


def _ca_coords(s, k: int) -> np.ndarray:
    idx = s.select_indices("ca")
    if idx.size == 0:
        raise InputError(f"{source_name(s, f'model {k}')}: no CA atoms; consensus_score compares the CA atoms of "
                         "Structures (pass a coordinate array (models, atoms, 3) to use other atoms)")
    return s.coords[:, idx]


def _model_coords(models):
    """``(coords, names)``: the models as one (M, N, 3) array (NumPy for Structures and lists; CuPy or
    torch arrays as given) and their names (``None`` for arrays). Anything with atom tables (a
    Structure, path, mdtraj or Bio.PDB object) contributes its CA atoms, one model per frame."""
    if has_topology(models) and not isinstance(models, (list, tuple)):
        s = as_structure(models, "models")
        return _ca_coords(s, 0), _frame_names([s])
    if isinstance(models, (list, tuple)):
        if not models:
            raise InputError("models: empty list")
        is_s = [has_topology(m) for m in models]
        if all(is_s):
            structures = [as_structure(m, f"model_{k}") for k, m in enumerate(models)]
            cas = [_ca_coords(s, k) for k, s in enumerate(structures)]
            n0 = cas[0].shape[1]
            for k, c in enumerate(cas):
                if c.shape[1] != n0:
                    raise InputError(
                        f"models differ in CA atom count: {source_name(structures[0], 'model 0')} has {n0}, "
                        f"{source_name(structures[k], f'model {k}')} has {c.shape[1]}; consensus_score needs the "
                        "same atoms in every model (select a common set, e.g. select='chain A and resid 10-200')")
            return np.concatenate(cas), _frame_names(structures)
        if any(is_s):
            raise InputError("models: a list must hold only Structures (or paths, mdtraj or Bio.PDB objects) "
                             "or only coordinate arrays")
        arrs = [host_view(m, f"model_{k}") for k, m in enumerate(models)]
        shapes = {a.shape for a in arrs}
        if len(shapes) != 1:
            raise InputError(f"models: the arrays in the list have different shapes {sorted(shapes)}")
        return np.stack(arrs), None
    return as_array(models, "models"), None


def _check_coords(x) -> tuple[int, int]:
    """Validate the (M, N, 3) model array; returns ``(M, N)``. Host arrays are checked for NaN/inf
    (device arrays are not: that would synchronise; NaN there gives NaN scores)."""
    shape = tuple(getattr(x, "shape", None) or np.shape(x))
    if len(shape) != 3 or shape[-1] != 3:
        raise InputError(f"models: coordinates must have shape (models, atoms, 3), got {shape}")
    m, n = shape[0], shape[1]
    if n == 0:
        raise InputError("models: no atoms")
    if m < 2:
        raise InputError(f"models: a consensus needs at least 2 models, got {m}")
    check_finite(host_view(x, "models"), "models")
    return m, n


def _inv_temperature(temperature) -> float:
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        raise InputError(f"temperature must be a number (Angstrom^2), not {temperature!r}") from None
    if not t > 0:  # also NaN
        raise InputError(f"temperature must be positive (Angstrom^2), got {temperature!r}")
    return 0.0 if math.isinf(t) else 1.0 / t


def _d0(d0, n_atoms: int) -> float:
    if d0 is None:
        return float(d0_tmscore(n_atoms))
    try:
        v = float(d0)
    except (TypeError, ValueError):
        raise InputError(f"d0 must be a number (Angstrom), not {d0!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise InputError(f"d0 must be positive and finite (Angstrom), got {d0!r}")
    return v


# ==================================================================================================
# NumPy twin


def consensus_numpy(x: np.ndarray, temperature: float = DEFAULT_TEMPERATURE, d0: float | None = None, *,
                    return_weights: bool = False, block: int | None = None):
    """The NumPy twin of :func:`consensus_score` (its CPU path): the straightforward computation.

    Parameters
    ----------
    x : np.ndarray, shape (M, N, 3)
        Models, Angstrom, any float dtype; M >= 2.
    temperature : float
        Angstrom^2 (``np.inf``: uniform weights).
    d0 : float, optional
        Angstrom; default ``d0_tmscore(N)``.
    return_weights : bool
        Also return the (M, M) float64 weights.
    block : int, optional
        Rows per block (default from a 64 MiB working set); the result does not depend on it.

    Returns
    -------
    score : np.ndarray, shape (M,), float64
    weights : np.ndarray, shape (M, M), float64
        Only with ``return_weights``.

    Notes
    -----
    RMSDs come from :func:`protgpu.pairwise_rmsd` (float32 values): the whole symmetric matrix (each
    pair once) while it takes at most 256 MiB or when the weights are asked for, else blocks of rows
    ``pairwise_rmsd(x[i0:i1], x)`` (each pair twice, memory O(block M)). Per row: logits
    ``-r^2 / T`` with the diagonal at -inf, shifted by their maximum before ``exp``.
    """
    from ..superpose import pairwise_rmsd

    inv_t = _inv_temperature(temperature)
    d0 = _d0(d0, x.shape[1])
    inv_d0sq = 1.0 / (d0 * d0)
    m = x.shape[0]
    score = np.empty(m)
    weights = None
    if return_weights:
        check_host_fits(m * m * 8, "the consensus weights")
        weights = np.empty((m, m))
    if return_weights or m * m * 4 <= _CPU_MATRIX_BYTES:
        full = pairwise_rmsd(x, device="cpu")

        def rows(i0, i1):
            return full[i0:i1]
    else:
        def rows(i0, i1):
            return pairwise_rmsd(x[i0:i1], x, device="cpu")
    b = int(block) if block else rows_per_chunk(m * 8 * 4, m, _CPU_BLOCK_BYTES)
    for i0 in range(0, m, b):
        i1 = min(m, i0 + b)
        r = np.asarray(rows(i0, i1), dtype=np.float64)
        r2 = r * r
        logit = -r2 * inv_t
        k = np.arange(i1 - i0)
        logit[k, i0 + k] = -np.inf  # a model does not attend to itself
        e = np.exp(logit - logit.max(axis=1, keepdims=True))
        s = e.sum(axis=1)
        sim = 1.0 / (1.0 + r2 * inv_d0sq)
        score[i0:i1] = (e * sim).sum(axis=1) / s
        if weights is not None:
            weights[i0:i1] = e / s[:, None]
    return (score, weights) if return_weights else score


# ==================================================================================================
# The tiled online algorithm (the CUDA path's schedule and state algebra), with its NumPy twin


def _merge_states(m, s, t, m2, s2, t2):
    """Merge online-softmax states elementwise (as ``cs_merge`` in consensus.cu): ``s == 0`` marks an
    empty state; NaN stays NaN."""
    with np.errstate(invalid="ignore", over="ignore"):
        mn = np.fmax(m, m2)  # fmax, as the kernel: a NaN logit never becomes the max
        a = np.exp(m - mn)
        b = np.exp(m2 - mn)
        sn = s * a + s2 * b
        tn = t * a + t2 * b
    empty2, empty1 = s2 == 0, s == 0
    m_out = np.where(empty2, m, np.where(empty1, m2, mn))
    s_out = np.where(empty2, s, np.where(empty1, s2, sn))
    t_out = np.where(empty2, t, np.where(empty1, t2, tn))
    return m_out, s_out, t_out


def _partial_states(logit, sim, axis):
    """The state (max, sum exp, sum exp * sim) of every row (axis=1) or column (axis=0) of a tile."""
    lm = np.fmax.reduce(logit, axis=axis)  # NaN-ignoring, as the kernel's comparison; NaN still reaches s
    empty = np.isneginf(lm)  # every element excluded (a 1 x 1 diagonal tile)
    shift = np.where(empty, 0.0, lm)
    e = np.exp(logit - np.expand_dims(shift, axis))
    return lm, e.sum(axis=axis), (e * sim).sum(axis=axis)


def tile_update_numpy(r, row0: int, col0: int, state, inv_t: float, inv_d0sq: float, mode: int) -> None:
    """Twin of the ``consensus_tile_*`` kernel: fold an RMSD tile into the online-softmax states.

    Parameters
    ----------
    r : np.ndarray, shape (ti, tj)
        RMSDs (Angstrom) of models ``row0 .. row0 + ti`` against ``col0 .. col0 + tj``.
    row0, col0 : int
        Global model index of the tile's first row and column.
    state : tuple of three np.ndarray, shape (M,), float64
        ``(m, s, t)``: running max logit, sum of exp(logit - m), sum of exp(logit - m) * similarity;
        updated in place. Start from ``(-inf, 0, 0)``.
    inv_t, inv_d0sq : float
        ``1 / T`` (1 / Angstrom^2; 0 for an infinite temperature) and ``1 / d0^2``.
    mode : int
        ``ROWS`` (update the rows' states), ``COLS`` (the columns'), or both (an off-diagonal tile of the
        symmetric schedule). The pair of a model with itself is skipped.
    """
    m, s, t = state
    r = np.asarray(r, dtype=np.float64)
    ti, tj = r.shape
    r2 = r * r
    logit = -r2 * inv_t
    sim = 1.0 / (1.0 + r2 * inv_d0sq)
    self_pair = (row0 + np.arange(ti))[:, None] == (col0 + np.arange(tj))[None, :]
    logit = np.where(self_pair, -np.inf, logit)
    for flag, axis, lo, n in ((ROWS, 1, row0, ti), (COLS, 0, col0, tj)):
        if mode & flag:
            part = _partial_states(logit, sim, axis)
            sl = slice(lo, lo + n)
            m[sl], s[sl], t[sl] = _merge_states(m[sl], s[sl], t[sl], *part)


def _schedule(m: int, tile: int):
    """Tiles ``(i0, i1, j0, j1)`` of the symmetric schedule: the diagonal tile of each row band first,
    then the band's tiles right of it (``j0 >= i1``)."""
    for i0 in range(0, m, tile):
        i1 = min(m, i0 + tile)
        yield i0, i1, i0, i1
        for j0 in range(i1, m, tile):
            yield i0, i1, j0, min(m, j0 + tile)


def _rmsd_tiles(x, tile: int, device: str):
    """``(i0, i1, j0, j1, r)`` over :func:`_schedule`: ``r`` the (i1 - i0, j1 - j0) RMSD tile from
    :func:`protgpu.pairwise_rmsd` (the array type of ``x``; float32). A diagonal tile is a symmetric
    call (its pairs computed once, mirrored, zero diagonal); the others are rectangles."""
    from ..superpose import pairwise_rmsd

    for i0, i1, j0, j1 in _schedule(x.shape[0], tile):
        if i0 == j0:
            r = pairwise_rmsd(x[i0:i1], device=device)
        else:
            r = pairwise_rmsd(x[i0:i1], x[j0:j1], device=device)
        yield i0, i1, j0, j1, r


def _modes(i0: int, j0: int) -> int:
    # A diagonal tile holds both (i, j) and (j, i): its rows alone see every pair once per model.
    return ROWS if i0 == j0 else ROWS | COLS


def consensus_tiled_numpy(x: np.ndarray, temperature: float = DEFAULT_TEMPERATURE, d0: float | None = None, *,
                          tile: int = 64) -> np.ndarray:
    """The CUDA path's algorithm run in NumPy: the triangular tile schedule, each tile folded into
    online-softmax states of its rows and columns by :func:`tile_update_numpy`. Equal to
    :func:`consensus_numpy` up to rounding, for any ``tile``; used by the tests.

    Parameters
    ----------
    x : np.ndarray, shape (M, N, 3)
    temperature, d0
        As :func:`consensus_numpy`.
    tile : int
        Models per tile side.

    Returns
    -------
    np.ndarray, shape (M,), float64
    """
    inv_t = _inv_temperature(temperature)
    d0 = _d0(d0, x.shape[1])
    m = x.shape[0]
    state = (np.full(m, -np.inf), np.zeros(m), np.zeros(m))
    for i0, _i1, j0, _j1, r in _rmsd_tiles(x, max(1, int(tile)), "cpu"):
        tile_update_numpy(r, i0, j0, state, inv_t, 1.0 / (d0 * d0), _modes(i0, j0))
    return state[2] / state[1]


# ==================================================================================================
# CUDA path


def _tile_update_cuda(r, row0: int, col0: int, state, inv_t: float, inv_d0sq: float, mode: int) -> None:
    """Launch ``consensus_tile_*`` on CuPy's current stream: :func:`tile_update_numpy` on the device.
    ``r`` is a CuPy (ti, tj) float32 or float64 tile; ``state`` three CuPy float64 arrays (M,)."""
    import cupy as cp

    from .. import _cuda

    if r.dtype not in (np.float32, np.float64):
        r = r.astype(np.float64)
    if not r.flags.c_contiguous:
        r = cp.ascontiguousarray(r)
    ti, tj = r.shape
    sfx = "f32" if r.dtype == np.float32 else "f64"
    h = _cuda.get_kernel("consensus", f"consensus_tile_{sfx}")
    n_row_blocks = -(-ti // _WARPS) if mode & ROWS else 0
    n_col_blocks = -(-tj // 32) if mode & COLS else 0
    grid = n_row_blocks + n_col_blocks
    if grid == 0 or ti == 0 or tj == 0:
        return
    m, s, t = state
    _cuda.launch(h, (grid,), (_THREADS,), r, tj, ti, tj, row0, col0, m, s, t, float(inv_t), float(inv_d0sq),
                 mode, n_row_blocks)


def _gpu_tile(m: int, tile: int | None) -> int:
    if tile:
        return max(1, min(int(tile), m))
    # pairwise_rmsd of a T x T tile holds ~9 T^2 float64 GEMM blocks and its float32 result; keep one
    # tile's working set within a quarter of the budget (pairwise_rmsd sub-tiles further if it must).
    t = int(math.sqrt(device_budget_bytes() / 4 / (9 * 8 + 8)))
    t = min(m, _GPU_MAX_TILE, max(t, 32))
    return max(1, t)


def consensus_cuda(x, temperature: float = DEFAULT_TEMPERATURE, d0: float | None = None, *,
                   return_weights: bool = False, tile: int | None = None):
    """CUDA path of :func:`consensus_score`; results are CuPy arrays on the current stream.

    Parameters
    ----------
    x : np.ndarray or cupy.ndarray, shape (M, N, 3)
        Models, Angstrom (host input is uploaded once, in its dtype).
    temperature, d0
        As :func:`consensus_numpy`.
    return_weights : bool
        Materialise the (M, M) float64 weights: then the whole float32 RMSD matrix is made by one
        symmetric :func:`protgpu.pairwise_rmsd` call, folded row by row, and turned into weights by
        ``consensus_weights_*`` (device memory 12 M^2 bytes).
    tile : int, optional
        Models per tile side of the fused path (default: up to 4096, within the memory budget);
        the result does not depend on it beyond rounding.

    Returns
    -------
    score : cupy.ndarray (M,) float64, or ``(score, weights)`` with ``return_weights``.

    Raises
    ------
    MemoryBudgetError
        ``return_weights`` with matrices larger than the device memory budget.
    """
    import cupy as cp

    from .. import _cuda
    from ..superpose import pairwise_rmsd

    inv_t = _inv_temperature(temperature)
    xd = cp.asarray(x)
    if xd.dtype.kind != "f":
        xd = xd.astype(cp.float64)
    xd = cp.ascontiguousarray(xd)
    m = xd.shape[0]
    d0 = _d0(d0, xd.shape[1])
    inv_d0sq = 1.0 / (d0 * d0)
    state = (cp.full(m, -cp.inf), cp.zeros(m), cp.zeros(m))
    if return_weights:
        need = m * m * (4 + 8)
        budget = device_budget_bytes()
        if need > budget:
            raise MemoryBudgetError(
                f"consensus_score(return_weights=True): the ({m}, {m}) RMSD and weight matrices need "
                f"{format_bytes(need)} of device memory, over the budget of {format_bytes(budget)}; call it "
                "without return_weights (memory O(tile^2)) or raise PROTGPU_GPU_MEMORY_BUDGET")
        r = pairwise_rmsd(xd, device="gpu")
        _tile_update_cuda(r, 0, 0, state, inv_t, inv_d0sq, ROWS)
        w = cp.empty((m, m))
        sfx = "f32" if r.dtype == np.float32 else "f64"
        h = _cuda.get_kernel("consensus", f"consensus_weights_{sfx}")
        grid = int(max(1, min(-(-(m * m) // _THREADS), 1 << 20)))
        _cuda.launch(h, (grid,), (_THREADS,), cp.ascontiguousarray(r), w, state[0], state[1], m, float(inv_t))
        return state[2] / state[1], w
    t = _gpu_tile(m, tile)
    for i0, _i1, j0, _j1, r in _rmsd_tiles(xd, t, "gpu"):
        _tile_update_cuda(r, i0, j0, state, inv_t, inv_d0sq, _modes(i0, j0))
    return state[2] / state[1]


# ==================================================================================================
# Public


def consensus_score(models, *, temperature: float = DEFAULT_TEMPERATURE, d0: float | None = None,
                    return_weights: bool = False, device: str = "auto"):
    """Consensus score of every model of an ensemble: its softmax-weighted similarity to the others.

    Model ``i`` attends over the other models ``j != i`` with weights
    ``w_ij = softmax_j(-RMSD_ij^2 / temperature)`` and scores
    ``score_i = sum_j w_ij / (1 + (RMSD_ij / d0)^2)``. RMSDs are after optimal superposition
    (:func:`protgpu.pairwise_rmsd`: QCP on the centred GEMM, float64 inside, float32 values). On the GPU
    the softmax and the score are one fused pass over each RMSD tile as it is made (online softmax,
    float64 states): no M x M matrix, each pair computed once.

    Parameters
    ----------
    models : array (M, N, 3), Structure, or list of Structures
        Angstrom; NumPy, CuPy or torch arrays use all N atoms. A Structure's frames are the models; a
        list of Structures contributes every frame of each. Structures are compared on their CA atoms
        (the same count in every model). At least 2 models.
    temperature : float
        Softmax temperature T in Angstrom^2 (default :data:`DEFAULT_TEMPERATURE` = 4): a neighbour at
        RMSD r weighs ``exp(-r^2 / T)`` relative to an identical one (see the module notes for why 4).
        ``np.inf`` gives uniform weights: the plain mean similarity to the others.
    d0 : float, optional
        Similarity length scale, Angstrom; default the TM-score's ``d0(L)`` with L = N, the atoms (CA)
        per model (``1.24 (L - 15)^(1/3) - 1.8``, at least 0.5).
    return_weights : bool
        Also return the (M, M) float64 weights. This materialises M x M matrices: O(M^2) memory
        (12 M^2 bytes on the device, 8 M^2 on the host; 4.8 GB for 20,000 models).
    device : {"auto", "cpu", "gpu"}

    Returns
    -------
    array, shape (M,), float64
        Scores in (0, 1], same array type as ``models`` (NumPy for Structures and lists). With
        ``return_weights``: :class:`ConsensusResult` ``(score, weights)``, ``weights`` (M, M) with a
        zero diagonal and rows summing to 1.

    Raises
    ------
    InputError
        Fewer than 2 models, a bad shape, NaN coordinates (host input), Structures without CA atoms or
        with different CA counts, a non-positive temperature or d0.
    MemoryBudgetError
        ``return_weights`` with matrices larger than the memory budget.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> base = rng.normal(scale=10, size=(50, 3))
    >>> models = np.stack([base, base, base + rng.normal(size=(50, 3)), rng.normal(scale=10, size=(50, 3))])
    >>> s = consensus_score(models, device="cpu")
    >>> s.shape, bool(np.isclose(s[0], s[1])), int(np.argmin(s))
    ((4,), True, 3)
    """
    refuse_grad("pg.consensus_score", models)
    x, _names = _model_coords(models)
    be = dispatch(x, device=device)
    _m, n = _check_coords(x)
    _inv_temperature(temperature)  # validate before any work
    _d0(d0, n)
    if be.on_gpu:
        if is_torch_tensor(x):
            x = be.asarray(x)
        res = consensus_cuda(x, temperature, d0, return_weights=return_weights)
    else:
        xh = np.asarray(be.asarray(x))
        if xh.dtype.kind != "f":
            xh = xh.astype(np.float64)
        res = consensus_numpy(xh, temperature, d0, return_weights=return_weights)
    if return_weights:
        return be.wrap(ConsensusResult(*res))
    return be.wrap(res)


def consensus_ranking_table(models, *, temperature: float = DEFAULT_TEMPERATURE, d0: float | None = None,
                            top=None, select: str | None = None, names=None, device: str = "auto",
                            sort: bool = True) -> list[dict]:
    """Rank an ensemble by consensus score: the rows ``protgpu score MODELS... --consensus`` prints and
    writes.

    Parameters
    ----------
    models : sequence of paths (str, os.PathLike) and/or Structures
        Every frame of every input is one model (a multi-model PDB or a trajectory gives several).
        Paths are read with :func:`protgpu.load`.
    temperature, d0, device
        As :func:`consensus_score`.
    top : str, optional
        Topology for trajectory paths.
    select : str, optional
        Selection applied to every input before its CA atoms are taken (e.g. ``"chain A"``).
    names : sequence of str, optional
        One name per model (default: the file name, with ``[i]`` for frames of a multi-frame input).
    sort : bool
        Rows in rank order (default) or in input order.

    Returns
    -------
    list of dict
        ``{"model": str, "consensus": float, "rank": int}`` per model; rank 1 is the highest score
        (ties keep input order; NaN scores rank last).

    Raises
    ------
    InputError
        As :func:`consensus_score`, unreadable inputs, or ``names`` of the wrong length.

    Examples
    --------
    >>> import protgpu as pg
    >>> middle = pg.load("datasets/adk_dims.dcd", top="datasets/adk_open.pdb").frames(49)
    >>> rows = consensus_ranking_table(["datasets/adk_closed.pdb", "datasets/adk_open.pdb", middle],
    ...                                names=["closed", "open", "frame 49"], device="cpu")
    >>> for row in rows:
    ...     print(row["rank"], row["model"], round(row["consensus"], 3))
    1 open 0.781
    2 frame 49 0.776
    3 closed 0.56
    """
    from ..io import load

    if isinstance(models, (str, os.PathLike)) or is_structure(models):
        models = [models]
    structs = []
    for item in models:
        s = item if is_structure(item) else load(item, top=top)
        structs.append(s.select(select) if select else s)
    if not structs:
        raise InputError("no models given")
    score = np.asarray(consensus_score(structs, temperature=temperature, d0=d0, device=device), dtype=np.float64)
    labels = _frame_names(structs) if names is None else [str(n) for n in names]
    if len(labels) != len(score):
        raise InputError(f"names: {len(labels)} names for {len(score)} models")
    key = np.where(np.isnan(score), np.inf, -score)
    order = np.argsort(key, kind="stable")
    rank = np.empty(len(score), dtype=np.int64)
    rank[order] = np.arange(1, len(score) + 1)
    rows = [{"model": labels[i], "consensus": float(score[i]), "rank": int(rank[i])} for i in range(len(score))]
    return [rows[i] for i in order] if sort else rows
