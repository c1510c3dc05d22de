"""Smooth lDDT: :func:`protgpu.lddt` with ``smooth=True``, differentiable with respect to the model
coordinates when they are a torch tensor that requires grad.

The pairs, reference distances, residues and symmetric side chains are those of the exact lDDT
(:class:`~protgpu.scoring.lddt.LDDTReference`). Each hard test ``|d_model - d_ref| <= t`` becomes a
sigmoid, ``sigma((t - |d_model - d_ref|) / T)``, as in AlphaFold 3's smooth lDDT loss (Abramson et al.
2024, supplement Algorithm 27, where T = 1 Angstrom; AlphaFold 2 trains no lDDT loss: it uses the hard
lDDT-Calpha only as the target of its pLDDT head). As T -> 0 each sigmoid tends to the step, and the
score to the exact lDDT (a pair exactly at a threshold counts 1/2 instead of 1).

The arithmetic is written once for NumPy, CuPy and torch (``xp`` is the input's module): the CPU path,
the GPU path and the differentiable path are the same expressions. Symmetric side chains are swapped
where the *exact* counts say so (:func:`~protgpu.scoring.lddt.resolve_symmetry_numpy`, on a host copy):
a discrete choice, constant almost everywhere, through which the gradient flows by the permutation.
"""

from __future__ import annotations

import sys

import numpy as np

from .._array import to_numpy
from .._autograd import single_tensor
from ..errors import InputError


def _is_torch(a) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def _index(idx, like):
    """An index array for ``like``'s library and device."""
    if _is_torch(like):
        import torch

        return torch.as_tensor(np.array(idx), device=like.device)
    if type(like).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy.asarray(idx)
    return np.asarray(idx)


def _residue_sums(vals, ri, rj, n_res: int):
    """Per (model, residue) sums of pair values ``vals`` (M, P) over the pairs touching the residue."""
    m = vals.shape[0]
    if _is_torch(vals):
        out = vals.new_zeros((m, n_res))
        return out.index_add(1, _index(ri, vals), vals).index_add(1, _index(rj, vals), vals)
    xp = sys.modules[type(vals).__module__.split(".")[0]]
    base = (xp.arange(m) * n_res)[:, None]
    flat = xp.concatenate([(base + _index(ri, vals)[None]).ravel(), (base + _index(rj, vals)[None]).ravel()])
    return xp.bincount(flat, xp.concatenate([vals.ravel(), vals.ravel()]), minlength=m * n_res).reshape(m, n_res)


def smooth_scores(coords, ref, thresholds, temperature: float):
    """Smooth global and per-residue lDDT of models on the reference's scored atoms.

    Parameters
    ----------
    coords : array, shape (M, N, 3)
        NumPy, CuPy or torch; NaN where a model lacks an atom (then its pairs count 0, as in lDDT).
    ref : LDDTReference
    thresholds : sequence of float
    temperature : float
        T of ``sigma((t - delta) / T)``, Angstrom.

    Returns
    -------
    global_ (M,), per_residue (M, R): in ``coords``' library and dtype; NaN as :func:`lddt_scores`.
    """
    torch_in = _is_torch(coords)
    xp = sys.modules["torch" if torch_in else type(coords).__module__.split(".")[0]]
    i, j = _index(ref.pairs[:, 0], coords), _index(ref.pairs[:, 1], coords)
    missing = xp.isnan(coords[..., 0])
    # NaN never reaches an arithmetic op (its zero gradient would still become NaN in the backward)
    x = xp.where(missing[..., None], 0.0, coords) if bool(missing.any()) else coords
    diff = x[:, i] - x[:, j]
    d2 = (diff * diff).sum(-1)
    pos = d2 > 0
    dist = xp.where(pos, xp.sqrt(xp.where(pos, d2, 1.0)), 0.0)
    dref = _index(ref.dref, coords)
    dref = dref.to(coords.dtype) if torch_in else dref.astype(coords.dtype)
    delta = xp.abs(dist - dref[None])
    eps = 0.0
    for t in thresholds:  # sigma(z) = (1 + tanh(z / 2)) / 2: one expression in all three libraries
        eps = eps + 0.5 * (1.0 + xp.tanh((t - delta) * (0.5 / temperature)))
    eps = eps / len(thresholds)
    present = ~(missing[:, i] | missing[:, j])
    eps = xp.where(present, eps, 0.0)
    n_pairs = len(ref.dref)
    glob = eps.sum(-1) / n_pairs if n_pairs else xp.full((coords.shape[0],), float("nan"), dtype=coords.dtype)
    sums = _residue_sums(eps, ref.atom_res[ref.pairs[:, 0]], ref.atom_res[ref.pairs[:, 1]], ref.n_res)
    n_exp = _index(ref.n_exp, coords)
    n_exp = n_exp.to(coords.dtype) if torch_in else n_exp.astype(coords.dtype)
    here = _residue_sums((~missing).to(coords.dtype) if torch_in else (~missing).astype(coords.dtype),
                         ref.atom_res, ref.atom_res, ref.n_res) > 0
    ok = here & (n_exp[None] > 0)
    per = xp.where(ok, sums / xp.where(n_exp > 0, n_exp, 1.0)[None], float("nan"))
    return glob, per


def symmetry_permutation(coords, ref, thresholds):
    """Atom order (M, N) int64 that swaps the symmetric side chains the exact lDDT swaps (host)."""
    from .lddt import resolve_symmetry_numpy

    host = np.array(to_numpy(coords), dtype=np.float64)
    swap = resolve_symmetry_numpy(host, ref, thresholds)
    m, n = host.shape[:2]
    perm = np.broadcast_to(np.arange(n), (m, n)).copy()
    if ref.n_groups:
        a, b = ref.tuples[:, 0], ref.tuples[:, 1]
        tv = ~np.isnan(host[:, a, 0]) & ~np.isnan(host[:, b, 0])  # (swapped above: NaN-ness is symmetric)
        mm, kk = np.nonzero(swap[:, ref.tuple_group] & tv)
        perm[mm, a[kk]], perm[mm, b[kk]] = b[kk], a[kk]
    return perm


def check_temperature(temperature) -> float:
    """``temperature`` as a positive float, else InputError."""
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        raise InputError(f"temperature must be a positive number (Angstrom), got {temperature!r}") from None
    if not t > 0 or not np.isfinite(t):
        raise InputError(f"temperature must be a positive number (Angstrom), got {temperature!r}")
    return t


def torch_layout(models, ref_s, ref_atoms, info, mapping):
    """The torch model tensor (graph kept) on the reference's scored atoms: (M, N, 3)."""
    import torch

    single_tensor(models, "models", "pg.lddt")
    x = models if models.ndim == 3 else models[None]
    if ref_s is None:
        return x
    from ._batch import checked_atom_match, group_mapping

    matoms, slots = checked_atom_match(info, info, ref_atoms, group_mapping(mapping, 1, 0), "model", ref_s)
    out = x.new_full((x.shape[0], len(ref_atoms), 3), float("nan"))
    out[:, torch.as_tensor(np.array(slots), device=x.device)] = x[:, torch.as_tensor(np.array(matoms), device=x.device)]
    return out


def gather_atoms(coords, perm):
    """``coords`` (M, N, 3) with atoms reordered per model by ``perm`` (M, N)."""
    if _is_torch(coords):
        import torch

        idx = torch.as_tensor(perm, device=coords.device)[..., None].expand(-1, -1, 3)
        return torch.gather(coords, 1, idx)
    xp = sys.modules[type(coords).__module__.split(".")[0]]
    return xp.take_along_axis(coords, _index(perm, coords)[..., None], axis=1)
