"""MM-align's complex mode (US-align ``-mm 1``), on the CPU, from the TM-align twin's pieces.

The TM-score of a model complex as OpenStructure's Scorer reports it (``bindings.WrappedMMAlign(model,
target)``, US-align's MMalign code): the model's chains are assigned to the target's and their residues
aligned by structure, not by sequence, and the score is TM-score normalised by the target's total length.
Every step below is US-align's (``USalign.cpp`` ``MMalign``, ``MMalign.h``), read for its facts and
re-implemented from the twin's parts: the chain-pair alignments are :func:`numpy_twin.tm_align_pair`,
the re-alignments under a superposition are its DP (:func:`_dp.nw_align` on
:func:`_dp.tm_scores_matrix`), every superposition is its TM-score search (:func:`_search.tm_search`).
Design, parameters and what differs from US-align: ``docs/design/complexes.md`` ("TM-score").

1. Every model chain against every target chain: TM-align; the pair's weight is its TM-score
   normalised by ``L = min(model length, target length)`` (total protein residues) times ``L``.
2. Chains are assigned greedily by weight, then improved by pair swaps (``enhanced_greedy_search``);
   two protein chains against two: the swapped assignment is kept if its joint superposition scores
   higher (``adjust_dimer_assignment``).
3. Iterations (``MMalign_iter``, at least 2, ``5 - L // 200``): superpose the complex on the assigned
   pairs' alignments (TM-score search normalised by ``L``), re-align every chain pair by DP under that
   superposition (US-align's ``se_main``: pairs beyond score_d8 dropped), re-assign greedily; stop
   when the summed weight stops rising. If it never beats the best single chain pair, restart from
   that pair alone.
4. The cross-chain step (``MMalign_dimer``): the assigned chains end to end, TM-aligned as one pair
   with the DP masked to the assigned blocks (:mod:`._dimer`); its superposition replaces the
   iterations' if the re-aligned chain pairs weigh more under it.
5. Final score: the TM-score search (step 1, every pair scored) on the concatenated chain
   alignments, normalised by the target's total length.

One chain against one is plain TM-align (:func:`numpy_twin.tm_align_pair`, normalised by the target),
as MM-align and OpenStructure do.

With ``mapping`` the assignment is given (as OpenStructure's ``oum`` mode gives MM-align its chain
mapping): only the mapped pairs are aligned and weighted, so step 2 keeps them and the iterations only
re-align residues.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._threads import blas_threads
from ..scoring._kabsch import superpose
from ._dimer import dimer_align
from ._dp import nw_align, secondary_structure, tm_scores_matrix, transform
from .numpy_twin import d0_final, final_search, search_parameters, tm_align_pair

#: Shortest chain (CA residues) taking part: TM-align's own minimum (MM-align's is 3).
MIN_CHAIN = 5


class ComplexAlignment(NamedTuple):
    """MM-align's result for one model complex.

    Attributes
    ----------
    tm : float
        TM-score normalised by the target's total length (US-align's first TM-score; OpenStructure's
        ``tm_score``). 0 when no chain pair could be aligned.
    assignment : dict of int to int
        Model chain index -> target chain index, for the assigned pairs.
    aligned : ndarray of int64, shape (K, 2)
        (model residue, target residue) pairs, indices into the chains laid end to end in input order.
    rotation : ndarray, shape (3, 3)
    translation : ndarray, shape (3,)
        ``model @ rotation.T + translation`` is the superposition that gives ``tm``.
    """

    tm: float
    assignment: dict
    aligned: np.ndarray
    rotation: np.ndarray
    translation: np.ndarray


def greedy_assignment(weight: np.ndarray):
    """US-align's ``enhanced_greedy_search``: the highest-weight free pair first (pairs of weight <= 0
    never), then single swaps that raise the summed weight, at most ``5 min(n1, n2)`` of them.

    Parameters
    ----------
    weight : ndarray, shape (n1, n2)
        Weight of each (model chain, target chain) pair.

    Returns
    -------
    total : float
        Summed weight of the assigned pairs.
    assign : ndarray of int64, shape (n1,)
        Target chain of each model chain, -1 if none.
    """
    n1, n2 = weight.shape
    a1 = np.full(n1, -1, np.int64)
    a2 = np.full(n2, -1, np.int64)
    total = 0.0
    while True:
        best, bi, bj = -1.0, 0, 0
        for i in range(n1):
            if a1[i] >= 0:
                continue
            for j in range(n2):
                if a2[j] < 0 and weight[i, j] > 0 and weight[i, j] > best:
                    best, bi, bj = float(weight[i, j]), i, j
        if best <= 0:
            break
        a1[bi], a2[bj] = bj, bi
        total += best
    if total <= 0:
        return total, a1
    for _ in range(min(n1, n2) * 5):
        delta = -1.0
        for i in range(n1):
            old_j = int(a1[i])
            for j in range(n2):
                if j == a1[i] or weight[i, j] <= 0:
                    continue
                old_i = int(a2[j])
                delta = float(weight[i, j])
                if old_j >= 0:
                    delta -= weight[i, old_j]
                if old_i >= 0:
                    delta -= weight[old_i, j]
                if old_i >= 0 and old_j >= 0:
                    delta += weight[old_i, old_j]
                if delta > 0:  # swap (i, old_j) and (old_i, j) for (i, j) and (old_i, old_j)
                    a1[i], a2[j] = j, i
                    if old_i >= 0:
                        a1[old_i] = old_j
                    if old_j >= 0:
                        a2[old_j] = old_i
                    total += delta
                    break
            if delta > 0:
                break
        if delta <= 0:
            break
    return total, a1


def _pairs(xs, ys, alns, assign):
    """Aligned coordinates of the assigned chain pairs, model chains in order, and their residue indices
    in the chains laid end to end."""
    ox = np.concatenate([[0], np.cumsum([len(x) for x in xs])])
    oy = np.concatenate([[0], np.cumsum([len(y) for y in ys])])
    xa, ya, idx = [], [], []
    for i, j in enumerate(assign.tolist()):
        if j < 0:
            continue
        a = alns[i][j]
        xa.append(xs[i][a[:, 0]])
        ya.append(ys[j][a[:, 1]])
        idx.append(a + [ox[i], oy[j]])
    if not xa:
        return np.zeros((0, 3)), np.zeros((0, 3)), np.zeros((0, 2), np.int64)
    return np.concatenate(xa), np.concatenate(ya), np.concatenate(idx).astype(np.int64)


def _realign(x, y, rot, trans, length: float):
    """US-align's ``se_main`` as MM-align calls it (``-u`` mode 2) on one chain pair under a given
    superposition: DP on 1 / (1 + d^2 / d0^2) without gap penalty, pairs farther than score_d8 dropped,
    where d0 and score_d8 are the search parameters of ``length`` against itself (mode 2 resets them
    from the chain pair's to those). Returns the weight (sum of 1 / (1 + (d / d0_L)^2) over the kept
    pairs, d0_L the final d0 of ``length``) and the kept (i, j) pairs, shape (K, 2)."""
    p = search_parameters(int(length), int(length))
    y2x = nw_align(tm_scores_matrix(x, y, rot[None], trans[None], p.d0), 0.0)[0]
    j = np.flatnonzero(y2x >= 0)
    i = y2x[j]
    diff = transform(x[i], rot[None], trans[None])[0] - y[j]
    d = np.sqrt((diff[:, 0] * diff[:, 0] + diff[:, 1] * diff[:, 1]) + diff[:, 2] * diff[:, 2])
    keep = d <= p.score_d8
    q = d[keep] / d0_final(length)
    return float(np.sum(1.0 / (1.0 + q * q))), np.stack([i[keep], j[keep]], axis=1)


def _dimer_swap(xs, ys, alns, assign) -> np.ndarray:
    """US-align's ``adjust_dimer_assignment``: with two pairs assigned, superpose each assignment (both
    chain pairs' alignments at once) and keep the swapped one if it scores higher. US-align's score is
    sum 1 / (1 + d^2) (its ``dd/d0*d0`` is ``dd``), reproduced as is."""
    (i1, i2) = np.flatnonzero(assign >= 0)[:2]
    j1, j2 = assign[i1], assign[i2]

    def score(pairs):
        xa = np.concatenate([xs[i][alns[i][j][:, 0]] for i, j in pairs])
        ya = np.concatenate([ys[j][alns[i][j][:, 1]] for i, j in pairs])
        rot, trans, _ = superpose(xa[None], ya[None])
        d2 = np.sum((transform(xa, rot, trans)[0] - ya) ** 2, axis=1)
        return float(np.sum(1.0 / (1.0 + d2)))

    out = assign.copy()
    if score([(i1, j1), (i2, j2)]) < score([(i1, j2), (i2, j1)]):
        out[i1], out[i2] = j2, j1
    return out


def _cross(xs, ys, assign, _weight, alns, length: float):
    """US-align's ``MMalign_dimer``: the assigned chains end to end, TM-aligned as one pair with the DP
    masked to the assigned blocks (:func:`._dimer.dimer_align`), starting also from the current chain
    alignments. Returns its superposition, or None with 3 or fewer residues on a side."""
    pairs = [(i, j) for i, j in enumerate(assign.tolist()) if j >= 0]
    x = np.concatenate([xs[i] for i, _ in pairs])
    y = np.concatenate([ys[j] for _, j in pairs])
    if len(x) <= 3 or len(y) <= 3:
        return None
    mask = np.zeros((len(x), len(y)), dtype=bool)
    given = np.full(len(y), -1, dtype=np.int64)
    ox = oy = 0
    for i, j in pairs:
        mask[ox:ox + len(xs[i]), oy:oy + len(ys[j])] = True
        given[alns[i][j][:, 1] + oy] = alns[i][j][:, 0] + ox
        ox, oy = ox + len(xs[i]), oy + len(ys[j])
    sec_x = "".join(secondary_structure(xs[i]) for i, _ in pairs)
    sec_y = "".join(secondary_structure(ys[j]) for _, j in pairs)
    # US-align turns on its -fast search when the smaller complex has more than 500 residues
    return dimer_align(x, y, sec_x, sec_y, mask, given, length, fast=length > 500)


def mm_align(mobile, target, *, mapping=None) -> ComplexAlignment:
    """MM-align a model complex onto a target complex (US-align's complex mode, protein chains).

    Parameters
    ----------
    mobile : list of array_like, each shape (L_i, 3)
        CA coordinates (Angstrom) of the model's protein chains, in file order (the order MM-align
        reads them; it decides ties and the order of the concatenated alignment).
    target : list of array_like, each shape (L_j, 3)
        The target's chains likewise.
    mapping : dict of int to int, optional
        Model chain index -> target chain index. Given: the assignment is fixed (OpenStructure's ``oum``
        mode); None: MM-align's own (greedy on chain-pair TM-align scores, dimer swap test).

    Returns
    -------
    ComplexAlignment
    """
    xs = [np.asarray(x, np.float64).reshape(-1, 3) for x in mobile]
    ys = [np.asarray(y, np.float64).reshape(-1, 3) for y in target]
    n1, n2 = len(xs), len(ys)
    if n1 == 1 and n2 == 1 and (mapping is None or mapping == {0: 0}):
        if min(len(xs[0]), len(ys[0])) < MIN_CHAIN:
            return ComplexAlignment(0.0, {}, np.zeros((0, 2), np.int64), np.eye(3), np.zeros(3))
        # one chain each: MM-align (and OpenStructure) run plain TM-align
        r = tm_align_pair(xs[0], ys[0], "X" * len(xs[0]), "X" * len(ys[0]))
        return ComplexAlignment(float(r.tm_target), {0: 0}, r.aligned, r.rotation, r.translation)
    ly_total = float(sum(len(y) for y in ys))
    length = float(min(sum(len(x) for x in xs), ly_total))  # US-align's len_aa
    allowed = np.array([[len(x) >= MIN_CHAIN and len(y) >= MIN_CHAIN for y in ys] for x in xs], bool)
    if mapping is not None:
        fixed = np.zeros_like(allowed)
        for i, j in mapping.items():
            fixed[i, j] = True
        allowed &= fixed
    weight = np.full((n1, n2), -1.0)
    alns = [[np.zeros((0, 2), np.int64)] * n2 for _ in range(n1)]
    with blas_threads(1):
        best_mono, mono = -1.0, (-1, -1)
        for i, j in zip(*np.nonzero(allowed), strict=True):
            r = tm_align_pair(xs[i], ys[j], "X" * len(xs[i]), "X" * len(ys[j]), l_norm=length)
            weight[i, j], alns[i][j] = r.tm * length, r.aligned
            if weight[i, j] > best_mono:
                best_mono, mono = float(weight[i, j]), (int(i), int(j))
        total, assign = greedy_assignment(weight)
        if total <= 0:
            return ComplexAlignment(0.0, {}, np.zeros((0, 2), np.int64), np.eye(3), np.zeros(3))
        if mapping is None and n1 == 2 and n2 == 2 and np.count_nonzero(assign >= 0) == 2:
            assign = _dimer_swap(xs, ys, alns, assign)
        init = (assign, weight, alns)
        max_iter = max(2, 5 - int(length / 200))

        def realign_all(rot, trans):
            w = np.full((n1, n2), -1.0)
            al = [[np.zeros((0, 2), np.int64)] * n2 for _ in range(n1)]
            for i, j in zip(*np.nonzero(allowed), strict=True):
                w[i, j], al[i][j] = _realign(xs[i], ys[j], rot, trans, length)
            return w, al

        def iterate(best, state):
            for _ in range(max_iter):
                a, _, al = state
                w, al = realign_all(*final_search(*_pairs(xs, ys, al, a)[:2], length)[1:])
                tot, a = greedy_assignment(w)
                if tot <= best:
                    break
                best, state = tot, (a, w, al)
            return best, state

        best, state = iterate(0.0, init)
        if best < best_mono:  # the iterations did worse than one chain pair alone: start from it
            only = np.full(n1, -1, np.int64)
            only[mono[0]] = mono[1]
            best, state = iterate(best_mono, (only, weight, alns))
        # the cross-chain step: TM-align of the whole complex, inter-chain cells masked
        if np.count_nonzero(state[0] >= 0) >= np.count_nonzero(init[0] >= 0):
            init = state
        rt = _cross(xs, ys, *init, length) if length < 10000 else None  # US-align skips it from 10,000
        if rt is not None:
            w, al = realign_all(*rt)
            a = init[0].copy()
            tot = 0.0
            for i, j in enumerate(a.tolist()):
                if j >= 0 and w[i, j] <= 0:
                    a[i] = -1
                elif j >= 0:
                    tot += w[i, j]
            if tot > best:
                best, state = tot, (a, w, al)
        assign, _, alns = state
        xa, ya, idx = _pairs(xs, ys, alns, assign)
        tm, rot, trans = final_search(xa, ya, ly_total)
    return ComplexAlignment(max(float(tm), 0.0), {int(i): int(j) for i, j in enumerate(assign) if j >= 0},
                            idx, rot, trans)


def protein_chain_cas(structure) -> tuple[list, list]:
    """Chain ids and CA atom indices of a structure's protein chains as MM-align reads them: chains in
    file order, residues with a CA atom.

    Returns
    -------
    names : list of str
    cas : list of ndarray of int64
        Atom indices of each chain's CAs.
    """
    from ..complexes.mapping import protein_chains
    from ..scoring import _mapping as mp

    info = mp.residue_info(structure)
    names, cas = [], []
    for c, res in protein_chains(info).items():
        ca = info.ca_atom[res]
        names.append(c)
        cas.append(ca[ca >= 0])
    return names, cas


def complex_tm(coords, model_s, ref_s, chains: dict | None = None) -> np.ndarray:
    """MM-align TM-scores (:attr:`ComplexAlignment.tm`) of model frames against a reference complex.

    Parameters
    ----------
    coords : array_like, shape (M, N, 3)
        Coordinates (Angstrom) of M frames of ``model_s``'s N atoms.
    model_s, ref_s : Structure
        The model's atom table and the reference (its first frame); protein chains as
        :func:`protein_chain_cas` reads them.
    chains : dict of str to str, optional
        Reference chain -> model chain (a :class:`~protgpu.complexes.ChainMapping`'s ``chains``): the
        fixed assignment, as OpenStructure's ``oum`` mode; None: MM-align's own.

    Returns
    -------
    ndarray, shape (M,)
    """
    mn, mc = protein_chain_cas(model_s)
    rn, rc = protein_chain_cas(ref_s)
    ry = np.asarray(ref_s.coords[0], np.float64)
    target = [ry[c] for c in rc]
    fixed = None if chains is None else {mn.index(m): rn.index(r) for r, m in chains.items()
                                         if m in mn and r in rn}
    xs = np.asarray(coords, np.float64)
    return np.array([mm_align([x[c] for c in mc], target, mapping=fixed).tm for x in xs])
