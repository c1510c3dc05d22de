"""All-vs-all TM-align, :func:`tm_align_matrix`: one alignment per unordered pair, tile by tile into a
host destination (the tile schedule and :class:`~protgpu.superpose.streaming.Sink` of
``pairwise_rmsd``'s streaming), each tile one batched :func:`~protgpu.align.tm_align` call.
"""

from __future__ import annotations

import numpy as np

from .._autograd import refuse_grad
from .._memory import check_host_fits
from ..errors import InputError
from ..superpose.streaming import Sink, tiles
from .api import tm_align
from .chains import chains_of

#: Chains per tile side: a tile is at most TILE^2 / 2 pairs in one ``tm_align`` call, so that the
#: call's per-pair results (alignments included) stay a few hundred MB whatever N is.
TILE = 256


def _check_out(out, n: int):
    if not (hasattr(out, "shape") and hasattr(out, "dtype") and hasattr(out, "__setitem__")):
        raise InputError("out= must be an array-like with shape, dtype and item assignment "
                         "(np.ndarray, np.memmap, Zarr array)")
    if tuple(out.shape) != (n, n):
        raise InputError(f"out= has shape {tuple(out.shape)}, the TM-score matrix of {n} chains needs {(n, n)}")
    if np.dtype(out.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise InputError(f"out= must be float32 or float64, not {out.dtype}")


def tm_align_matrix(structures, *, out=None, device: str = "auto", chain=None, tile: int = TILE):
    """All-vs-all TM-align: the (N, N) TM-scores of every pair of chains, both normalisations.

    ``M[i, j]`` is the TM-score of chains i and j normalised by the length of chain **j** (the
    column): ``M[i, j]`` is TM-align's first score with i as Chain_1 and j as Chain_2, and ``M.T``
    holds the scores normalised by the row chain. Each unordered pair is aligned once, with the
    lower index as the mobile chain: ``M[i, j]`` (i < j) is its ``tm_target`` and ``M[j, i]`` its
    ``tm_mobile``. (TM-align is not exactly symmetric: aligning j onto i may find a slightly
    different alignment; this matrix is that of the i < j runs.) The diagonal is 1.

    The pairs go tile by tile (``tile`` chains a side, upper-triangle tiles), each tile one
    :func:`~protgpu.align.tm_align` call with ``pairs=`` (batched on the GPU when ``device`` picks
    it), and each finished tile and its mirror are written into ``out``: memory is bounded by the
    tile, not by N.

    Parameters
    ----------
    structures : list of (Structure, path, Bio.PDB / mdtraj object, (L, 3) array, Chain), or (N, L, 3)
        The chains, read once (the first protein chain of each, or ``chain``; each frame of a
        multi-frame input is one chain, as in :func:`~protgpu.align.tm_align`).
    out : np.ndarray, np.memmap or Zarr array, optional
        Destination of shape (N, N), float32 or float64, filled tile by tile and returned. Default:
        a new float32 array.
    device : {"auto", "cpu", "gpu"}
        Passed to :func:`~protgpu.align.tm_align`.
    chain : str, optional
        Chain identifier to align in every structure input.
    tile : int
        Chains per tile side (results do not depend on it).

    Returns
    -------
    array, shape (N, N)
        ``out`` (or the new float32 array): ``M[i, j]`` = TM-score normalised by chain j's length.

    Raises
    ------
    InputError
        A bad chain (see :func:`~protgpu.align.tm_align`), bad ``out`` or ``tile``.
    MemoryBudgetError
        No ``out`` and the matrix does not fit in free host memory.

    Examples
    --------
    >>> import numpy as np, protgpu as pg
    >>> t = np.linspace(0, 6 * np.pi, 40)
    >>> helix = np.stack([2.3 * np.cos(t), 2.3 * np.sin(t), 1.5 * t], axis=1)
    >>> m = pg.tm_align_matrix([helix, helix[:30]], device="cpu")
    >>> m.shape, float(m[0, 0]), round(float(m[1, 0]), 2), round(float(m[0, 1]), 2)
    ((2, 2), 1.0, 0.75, 1.0)
    """
    refuse_grad("pg.tm_align_matrix", structures)
    if isinstance(tile, bool) or not isinstance(tile, (int, np.integer)) or tile < 1:
        raise InputError(f"tile must be a positive integer, not {tile!r}")
    chains = chains_of(structures, "structures", chain)
    n = len(chains)
    if out is None:
        check_host_fits(n * n * 4, f"the {n} x {n} TM-score matrix")
        out = np.empty((n, n), dtype=np.float32)
    else:
        _check_out(out, n)
    sink = Sink(out, n, symmetric=False, condensed=False)
    for i0, i1, j0, j1 in tiles(n, n, int(tile), symmetric=True):
        ii, jj = np.meshgrid(np.arange(i0, i1), np.arange(j0, j1), indexing="ij")
        keep = jj > ii
        pi, pj = ii[keep], jj[keep]
        block = np.ones((i1 - i0, j1 - j0))  # the diagonal (only in diagonal tiles) is 1
        mirror = np.empty((j1 - j0, i1 - i0))
        if len(pi):
            r = tm_align(chains[i0:i1], chains[j0:j1], pairs=np.stack([pi - i0, pj - j0], axis=1),
                         device=device)
            block[pi - i0, pj - j0] = r.tm_target
            mirror[pj - j0, pi - i0] = r.tm_mobile
        if i0 == j0:  # the tile holds both halves: its lower triangle is the mirror's
            low = np.tril_indices(i1 - i0, -1)
            block[low] = mirror[low]
            sink.write(i0, i1, j0, j1, block)
        else:
            sink.write(i0, i1, j0, j1, block)
            sink.write(j0, j1, i0, i1, mirror)
    return out
