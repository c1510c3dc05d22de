"""The public TM-align function: inputs, pairs, normalisation, backend, the result table."""

from __future__ import annotations

from numbers import Real
from typing import NamedTuple

import numpy as np

from .._array import DEVICES, resolve_device
from .._autograd import refuse_grad
from ..errors import InputError
from .chains import chains_of
from .gpu import AlignmentBatch, tm_align_gpu
from .numpy_twin import tm_align_pair

NORMALIZATIONS = ("target", "mobile", "average", "shorter", "longer")


class TMAlignResult(NamedTuple):
    """What :func:`tm_align` returns; every field has a leading pair axis P (kept for one pair).

    Attributes
    ----------
    tm_mobile : float64, shape (P,)
        TM-score normalised by the mobile chain's length L1 (TM-align's "normalized by Chain_1").
    tm_target : float64, shape (P,)
        TM-score normalised by the target chain's length L2 (TM-align's first-reported score).
    tm : float64, shape (P,)
        TM-score normalised as ``normalize_by`` asked (the target's length by default).
    rmsd : float64, shape (P,)
        RMSD of the aligned pairs after their own least-squares fit, Angstrom.
    n_aligned : int64, shape (P,)
        Aligned pairs (TM-align's "Aligned length": pairs within its score_d8 cutoff).
    seq_identity : float64, shape (P,)
        Identical aligned letters / n_aligned (TM-align's Seq_ID; unknown residues are 'X', and X
        against X counts as identical there too).
    rotation : float64, shape (P, 3, 3)
    translation : float64, shape (P, 3)
        ``mobile @ rotation.T + translation`` is superposed on the target: the superposition of the
        search that gave ``tm``.
    aligned : object array, shape (P,)
        Per pair an int64 array (n_aligned, 2) of (mobile residue, target residue) indices, 0-based
        among the chain's CA residues.
    mobile_aligned, target_aligned, match : object arrays of str, shape (P,)
        The alignment as TM-align prints it: gapped sequences and the match line (``:`` pairs closer
        than 5 A under ``rotation``, ``.`` other aligned pairs, blank for gaps).
    lengths : int64, shape (P, 2)
        CA residues of the mobile and target chains (L1, L2).
    n_skipped : int64, shape (P, 2)
        Protein residues skipped for lack of a CA atom, mobile and target.
    """

    tm_mobile: np.ndarray
    tm_target: np.ndarray
    tm: np.ndarray
    rmsd: np.ndarray
    n_aligned: np.ndarray
    seq_identity: np.ndarray
    rotation: np.ndarray
    translation: np.ndarray
    aligned: np.ndarray
    mobile_aligned: np.ndarray
    target_aligned: np.ndarray
    match: np.ndarray
    lengths: np.ndarray
    n_skipped: np.ndarray


def _pairs(n_mobile: int, n_target: int, pairs) -> np.ndarray:
    if pairs is not None:
        p = np.asarray(pairs)
        if p.ndim != 2 or p.shape[1] != 2 or (p.size and p.dtype.kind not in "iu"):
            raise InputError(f"pairs must be an (P, 2) array of (mobile, target) indices, got shape {p.shape}")
        p = p.astype(np.int64)
        bad = (p[:, 0] < 0) | (p[:, 0] >= n_mobile) | (p[:, 1] < 0) | (p[:, 1] >= n_target)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise InputError(f"pairs[{k}] = {p[k].tolist()} is out of range for {n_mobile} mobile and "
                             f"{n_target} target chains")
        return p
    if n_mobile == 1 or n_target == 1 or n_mobile == n_target:
        n = max(n_mobile, n_target)
        idx = np.arange(n)
        return np.stack([idx if n_mobile > 1 else np.zeros(n, np.int64),
                         idx if n_target > 1 else np.zeros(n, np.int64)], axis=1)
    raise InputError(f"{n_mobile} mobile and {n_target} target chains: give lists of equal length "
                     "(one-to-one), one chain on either side (one against many), or pairs=")


def _norm_length(normalize_by, l1, l2):
    """The ``tm`` normalisation length of each pair: float64 like ``l1`` and ``l2`` (int arrays (P,) of
    the mobile and target lengths)."""
    l1 = np.asarray(l1, dtype=np.int64)
    l2 = np.asarray(l2, dtype=np.int64)
    if normalize_by is None or (isinstance(normalize_by, str) and normalize_by == "target"):
        return l2.astype(np.float64)
    if isinstance(normalize_by, str):
        if normalize_by == "mobile":
            return l1.astype(np.float64)
        if normalize_by == "average":
            return (l1 + l2) * 0.5
        if normalize_by == "shorter":
            return np.minimum(l1, l2).astype(np.float64)
        if normalize_by == "longer":
            return np.maximum(l1, l2).astype(np.float64)
        raise InputError(f"normalize_by must be one of {', '.join(NORMALIZATIONS)} or a length, "
                         f"not {normalize_by!r}")
    if isinstance(normalize_by, Real) and not isinstance(normalize_by, bool) and normalize_by > 0:
        return np.full(l1.shape, float(normalize_by))
    raise InputError(f"normalize_by must be one of {', '.join(NORMALIZATIONS)} or a positive length, "
                     f"not {normalize_by!r}")


def tm_align(mobile, target, *, pairs=None, normalize_by=None, chain=None, device: str = "auto") -> TMAlignResult:
    """Sequence-independent structural alignment, as TM-align computes it (Zhang & Skolnick 2005).

    Finds the residue alignment and superposition of the mobile chain onto the target that maximise
    the TM-score, with TM-align's algorithm and numbers (initial alignments from gapless threading,
    secondary structure, local fragment superpositions and their combination, each refined by
    iterated DP and TM-score superposition search; see ``docs/design/tm-align.md``).

    Parameters
    ----------
    mobile, target : Structure, path, Bio.PDB / mdtraj object, array, or a list of these
        One chain each: the first chain with a protein residue that has a CA atom (chains without
        one are skipped with a warning), or ``chain``. Each frame of a multi-frame input (models of
        a multi-model file, a trajectory) is one chain, as frames are models everywhere in protgpu
        (TM-align reads only the first model: pass ``s.frames(0)`` for that). An (L, 3) array is a
        CA trace (sequence unknown, 'X'); an (N, L, 3) array is N traces. Two
        single inputs give one pair; a single input against a list, one against each; two lists of
        equal length, one-to-one.
    pairs : array_like of int, shape (P, 2), optional
        Explicit (mobile index, target index) pairs into the two lists.
    normalize_by : {"target", "mobile", "average", "shorter", "longer"} or float, optional
        The length the ``tm`` field is normalised by, and whose search gives ``rotation``: the
        target's (None, the default, as TM-align), the mobile's, (L1 + L2) / 2 (TM-align's ``-a``),
        the shorter or longer chain's, or a given length (TM-align's ``-L``/``-u``).
        ``tm_mobile`` and ``tm_target`` are always returned.
    chain : str, optional
        Chain identifier to align in every structure input (default: the first protein chain).
    device : {"auto", "cpu", "gpu"}
        ``"gpu"`` runs ``kernels/tmalign.cu`` (one thread block per pair, the same numbers), ``"cpu"``
        the CPU path; ``"auto"`` the GPU when one is usable, else the CPU.

    Returns
    -------
    TMAlignResult
        Arrays with a leading pair axis, also for one pair.

    Raises
    ------
    InputError
        A chain with fewer than 5 CA residues, bad arrays, unknown chain, bad ``pairs`` or
        ``normalize_by``.
    GPUUnavailableError
        ``device="gpu"`` without a usable GPU.

    Examples
    --------
    >>> import numpy as np, protgpu as pg
    >>> t = np.linspace(0, 6 * np.pi, 40)
    >>> helix = np.stack([2.3 * np.cos(t), 2.3 * np.sin(t), 1.5 * t], axis=1)
    >>> r = pg.tm_align(helix, helix)
    >>> round(float(r.tm_target[0]), 4), int(r.n_aligned[0])
    (1.0, 40)
    """
    refuse_grad("pg.tm_align", mobile, target)
    if device not in DEVICES:
        raise InputError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
    mob = chains_of(mobile, "mobile", chain)
    tgt = chains_of(target, "target", chain)
    pp = _pairs(len(mob), len(tgt), pairs)
    l1 = np.array([len(c.ca) for c in mob], dtype=np.int64)[pp[:, 0]]
    l2 = np.array([len(c.ca) for c in tgt], dtype=np.int64)[pp[:, 1]]
    # (no pairs: nothing is normalised, as when each pair's length was worked out in turn)
    l_norms = _norm_length(normalize_by, l1, l2) if len(pp) else np.zeros(0)
    if resolve_device(device) == "gpu":
        batch = tm_align_gpu([c.ca for c in mob], [c.ca for c in tgt], [c.sequence for c in mob],
                             [c.sequence for c in tgt], pp, l_norms)
    else:
        batch = AlignmentBatch.from_rows(
            tm_align_pair(mob[a].ca, tgt[b].ca, mob[a].sequence, tgt[b].sequence, l_norm=ln)
            for (a, b), ln in zip(pp.tolist(), l_norms.tolist(), strict=True))
    return TMAlignResult(
        tm_mobile=batch.tm_mobile, tm_target=batch.tm_target, tm=batch.tm, rmsd=batch.rmsd,
        n_aligned=batch.n_aligned, seq_identity=batch.seq_identity, rotation=batch.rotation,
        translation=batch.translation, aligned=batch.aligned, mobile_aligned=batch.mobile_aligned,
        target_aligned=batch.target_aligned, match=batch.match, lengths=np.stack([l1, l2], axis=1),
        n_skipped=np.stack([np.array([c.n_skipped for c in mob], dtype=np.int64)[pp[:, 0]],
                            np.array([c.n_skipped for c in tgt], dtype=np.int64)[pp[:, 1]]], axis=1),
    )
