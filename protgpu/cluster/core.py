"""The public :func:`cluster` and its result :class:`Clustering`: validates, builds the row source
(:mod:`.source`), runs the method (:mod:`.gromos`, :mod:`.kmedoids`, :mod:`.hierarchical`) and converts back."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._array import dispatch, is_cupy_array, to_numpy
from .._autograd import refuse_grad
from .._inputs import check_finite, check_shape, coordinates, host_view, is_array
from ..errors import InputError, MemoryBudgetError
from . import gromos, hierarchical, kmedoids
from .source import MatrixRows, RmsdRows, TmRows

METHODS = ("gromos", "kmedoids", "hierarchical")
LINKAGES = ("single", "complete", "average")

class Clustering(NamedTuple):
    """What :func:`cluster` returns.

    Attributes
    ----------
    labels : array (F,) int64
        Cluster of each frame, 0-based (GROMOS: in the order found, largest first; k-medoids: the medoid's
        slot; hierarchical: SciPy's ``fcluster`` label minus 1). The input's array type (NumPy for
        structures, paths and NumPy; CuPy, torch as given; a precomputed matrix's type).
    medoids : array (clusters,) int64
        The representative frame of each cluster: GROMOS's central frame (the one with the most
        neighbours when the cluster was taken), the k-medoids medoid, or for hierarchical clusters the
        member with the smallest sum of distances to the other members (the first of them on a tie).
    sizes : array (clusters,) int64
        Frames per cluster.
    linkage : np.ndarray (F - 1, 4) float64 or None
        SciPy's linkage matrix for hierarchical runs, else None.
    objective : float
        k-medoids: the sum of distances to the nearest medoid; GROMOS and hierarchical: the same sum for
        their medoids (a figure to compare runs by), Angstrom for RMSD.
    """

    labels: Any
    medoids: Any
    sizes: Any
    linkage: Any
    objective: float


def _is_matrix(m) -> bool:
    return is_array(m) or (hasattr(m, "shape") and hasattr(m, "dtype") and hasattr(m, "__getitem__")
                           and len(getattr(m, "shape", ())) == 2)


def _source(x, metric, fit, weights, device, precision):
    """The row source and the Backend for the call."""
    if isinstance(metric, str) and metric == "precomputed":
        metric, x = x, None
    if not isinstance(metric, str):
        if not _is_matrix(metric):
            raise InputError(f"metric: expected 'rmsd', 'tm', 'precomputed' or an (F, F) distance matrix (NumPy, "
                             f"CuPy, np.memmap, Zarr); got {type(metric).__name__}")
        be = dispatch(metric if is_cupy_array(metric) else None, device=device)
        src = MatrixRows(metric, on_gpu=be.on_gpu)
        if x is not None:
            xa, _, xname = coordinates(x, "x")
            nx = tuple(getattr(xa, "shape", None) or np.shape(xa))
            frames = nx[0] if len(nx) == 3 else 1
            if frames != src.n:
                raise InputError(f"metric: the matrix is {src.n} x {src.n} but {xname} has {frames} frames")
        return src, be
    if metric not in ("rmsd", "tm"):
        raise InputError(f"metric {metric!r}: use 'rmsd', 'tm', 'precomputed' or an (F, F) matrix")
    if x is None:
        raise InputError(f"x: coordinates are needed for metric={metric!r}")
    from ..superpose._prepare import resolve_selection, resolve_weights

    xa, xs, xname = coordinates(x, "x")
    be = dispatch(xa, device=device)
    shape = tuple(getattr(xa, "shape", None) or np.shape(xa))
    check_shape(shape, xname)
    fit_idx = resolve_selection(fit, xs, shape[-2], xname, "fit", other=None)
    w = resolve_weights(weights, shape[-2], fit_idx, xname)
    host = host_view(xa, xname)
    check_finite(host, xname, fit_idx)
    arr = host if host is not None else xa
    if be.kind.startswith("torch") and host is None:
        import cupy as cp

        arr = cp.asarray(arr)
    if isinstance(arr, np.ndarray) and arr.dtype.kind != "f":
        arr = arr.astype(np.float64)
    if arr.ndim == 2:
        arr = arr[None]
    if metric == "tm":
        if fit_idx is None and xs is not None:
            fit_idx = resolve_selection("ca", xs, shape[-2], xname, "fit", other=None)
        ca = arr if fit_idx is None else arr[:, fit_idx]
        if ca.shape[1] < 5:
            raise InputError(f"{xname}: metric='tm' needs at least 5 residues (one CA each), got {ca.shape[1]}")
        return TmRows(ca, on_gpu=be.on_gpu, name=xname), be
    return RmsdRows(arr, fit=fit_idx, weights=w, on_gpu=be.on_gpu, precision=precision, name=xname), be


def cluster(x=None, *, method: str = "gromos", metric="rmsd", cutoff=None, k=None, linkage: str = "average",
            fit=None, weights=None, seed=0, max_iter: int = 100, precision: str = "float64",
            device: str = "auto") -> Clustering:
    """Cluster frames by their pairwise distances without holding the F x F matrix (where the method allows).

    Parameters
    ----------
    x : array (frames, atoms, 3), Structure, path, list, ...; or None with a precomputed ``metric``
        Any input form of :func:`protgpu.pairwise_rmsd`, Angstrom.
    method : {"gromos", "kmedoids", "hierarchical"}
        ``"gromos"``: Daura et al. (1999), ``gmx cluster -method gromos`` (needs ``cutoff``);
        ``"kmedoids"``: FasterPAM from k-means++ seeding (needs ``k``); ``"hierarchical"``: SciPy's
        linkage (``linkage=``), cut at height ``cutoff`` or into ``k`` clusters.
    metric : "rmsd", "tm", "precomputed" or array (F, F)
        ``"rmsd"``: RMSD after superposition on ``fit`` atoms (rows from the all-vs-all RMSD engine);
        an (F, F) matrix (NumPy, CuPy, np.memmap, Zarr) is read row strip by row strip;
        ``"precomputed"`` takes ``x`` as that matrix. ``"tm"``: 1 - TM-score between frames with the
        same residues (a trajectory, an ensemble), the TMscore program's search (:func:`protgpu.tm_score`;
        one CA per residue: the ``fit`` atoms, else the CA atoms of a Structure, else every row of the
        array), each row one call of all F frames against one frame, so O(F^2) searches (~18,000 a
        second on an H200 at 214 residues): for thousands of frames, not 100,000. Structures of different
        sequences: pass ``1 - protgpu.tm_align_matrix(...)`` (symmetrised as you see fit) as the matrix.
    cutoff : float
        Angstrom for RMSD, 1 - TM-score for ``"tm"`` (0.5: TM-score above 0.5). GROMOS: neighbours are
        frames at a distance < cutoff; hierarchical: the height ``fcluster`` cuts at (criterion "distance").
    k : int
        Clusters for k-medoids, or for hierarchical (``fcluster`` criterion "maxclust").
    linkage : {"single", "complete", "average"}
        Hierarchical only. The matrix goes to SciPy when its condensed form fits in memory; single linkage
        of a larger one is built from row strips (a minimum spanning tree, equal to SciPy's).
    fit, weights
        As :func:`protgpu.pairwise_rmsd`.
    seed : int or None
        k-medoids seeding (``numpy.random.default_rng(seed)``).
    max_iter : int
        k-medoids: most FasterPAM passes.
    precision : {"float64", "float32"}
        GEMM precision of the RMSD rows, as :func:`protgpu.pairwise_rmsd`.
    device : {"auto", "cpu", "gpu"}

    Returns
    -------
    Clustering

    Raises
    ------
    InputError
        Unknown method or linkage, a missing or non-positive ``cutoff``, ``k`` not in 1..F, fewer than 2
        frames, NaN coordinates or distances, a matrix that is not square, fewer than 5 residues for
        ``metric="tm"``.

    Examples
    --------
    >>> import numpy as np
    >>> d = np.array([[0, 1, 5, 5], [1, 0, 5, 5], [5, 5, 0, 1], [5, 5, 1, 0]], dtype=float)
    >>> c = cluster(metric=d, method="gromos", cutoff=2.0)
    >>> c.labels.tolist(), c.medoids.tolist(), c.sizes.tolist()
    ([0, 0, 1, 1], [0, 2], [2, 2])
    """
    refuse_grad("pg.cluster", x, metric)
    if method not in METHODS:
        raise InputError(f"method {method!r}: use one of {', '.join(METHODS)}")
    if method == "hierarchical" and linkage not in LINKAGES:
        raise InputError(f"linkage {linkage!r}: use one of {', '.join(LINKAGES)}")
    if precision not in ("float32", "float64"):
        raise InputError(f"precision must be 'float32' or 'float64', not {precision!r}")
    cutoff, k = _check_params(method, cutoff, k)
    src, be = _source(x, metric, fit, weights, device, precision)
    n = src.n
    if n < 2:
        raise InputError(f"{src.name}: clustering needs at least 2 frames, got {n}")
    if k is not None and k > n:
        raise InputError(f"k={k}: more clusters than the {n} frames")
    z = None
    if method == "gromos":
        labels, medoids, objective = gromos.gromos_rows(src, cutoff)
    elif method == "kmedoids":
        meds, drows = kmedoids.kmeanspp_seed(src, k, seed)
        labels, medoids, objective, _ = kmedoids.fasterpam_rows(src, meds, drows, max_iter=int(max_iter))
    else:
        z = _linkage(src, linkage)
        labels = hierarchical.cut(z, cutoff=cutoff, k=k)
        medoids, objective = within_medoids(src, labels)
    sizes = np.bincount(labels, minlength=len(medoids)).astype(np.int64)
    # Labels, medoids and sizes in the input's array type (NumPy, CuPy, torch); the linkage stays NumPy,
    # SciPy's format.
    labels, medoids, sizes = be.wrap((labels, np.asarray(medoids, dtype=np.int64), sizes))
    return Clustering(labels, medoids, sizes, z, objective)


def _check_params(method, cutoff, k):
    if method in ("gromos",) and cutoff is None:
        raise InputError("cutoff: GROMOS clustering needs cutoff= (Angstrom for RMSD)")
    if method == "kmedoids" and k is None:
        raise InputError("k: k-medoids needs k= (the number of clusters)")
    if method == "hierarchical" and (cutoff is None) == (k is None):
        raise InputError("hierarchical clustering needs exactly one of cutoff= (a height) or k= (clusters)")
    if cutoff is not None:
        try:
            cutoff = float(cutoff)
        except (TypeError, ValueError):
            raise InputError(f"cutoff {cutoff!r}: must be a number") from None
        if not (cutoff > 0 and np.isfinite(cutoff)):
            raise InputError(f"cutoff {cutoff}: must be a positive finite number")
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise InputError(f"k {k!r}: must be a positive integer")
        k = int(k)
    return cutoff, k


def _linkage(src, method: str) -> np.ndarray:
    """SciPy on the condensed matrix when it fits in host memory; single linkage from strips otherwise."""
    try:
        cond = src.condensed()
    except MemoryBudgetError:
        if method != "single":
            raise MemoryBudgetError(f"{method} linkage of {src.n} frames needs the condensed matrix in memory "
                                    "and it does not fit; single linkage does not need it") from None
        return hierarchical.single_linkage_rows(src)
    return hierarchical.linkage_scipy(cond, method)


def within_medoids(src, labels: np.ndarray) -> np.ndarray:
    """Per cluster, the member with the smallest sum of distances to its cluster (the first on a tie),
    from row strips: each row's sum over its own cluster's columns, through the columns sorted by label.
    Returns the medoids (NumPy int64) and the sum of the members' distances to their medoid."""
    xp = src.xp
    order = np.argsort(labels, kind="stable")
    n_cl = int(labels.max()) + 1
    bounds = np.searchsorted(labels[order], np.arange(n_cl + 1))
    sums = np.empty(src.n)
    lo_d, hi_d = xp.asarray(bounds[labels]), xp.asarray(bounds[labels + 1])
    ord_d = xp.asarray(order)
    for i0, i1, s in src.strips():
        cs = xp.concatenate([xp.zeros((i1 - i0, 1)), xp.cumsum(s[:, ord_d], axis=1)], axis=1)
        r = xp.arange(i1 - i0)
        sums[i0:i1] = to_numpy(cs[r, hi_d[i0:i1]] - cs[r, lo_d[i0:i1]])
    med = np.empty(n_cl, dtype=np.int64)
    for c in range(n_cl):
        members = order[bounds[c]:bounds[c + 1]]
        med[c] = members[np.argmin(sums[members])]  # members ascending: the first on a tie
    return med, float(sums[med].sum())
