"""Chain mapping between a model complex and a reference complex.

Chains are matched by sequence, residues by a global alignment within matched chains, as
OpenStructure's chain mapper does (Bertoni et al. 2017; OpenStructure ``mol.alg.chain_mapping``):

1. The reference's protein chains are grouped into *equivalence groups*: chains whose sequences are at
   least ``group_identity`` (95 %) identical over their aligned columns are interchangeable copies
   (the chains of a homomer).
2. Each model chain is assigned to the group whose representative it resembles most; identity below
   ``min_identity`` leaves it unmapped.
3. Within a group, model chains and reference chains can be paired in several ways. Every assignment
   is tried while there are at most ``max_naive`` of them (OpenStructure's naive strategy, 8! by
   default) and the one with the highest global CA lDDT over the whole complex is kept; beyond that,
   chains are paired greedily by that score, one pair at a time.

Sequence alignments are Biopython's ``PairwiseAligner`` with the scores of protgpu's
``mapping="sequence"`` (BLOSUM62, gap open -11, extend -1) but semi-global - end gaps free - as
OpenStructure's chain mapper aligns (``seq.alg.SemiGlobalAlign``): a model that starts inside the
reference's sequence is not pulled onto its first residue by a cheaper mismatch plus an inner gap.
Identity is identical columns over aligned columns, in percent as OpenStructure reports it.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from .._array import to_numpy
from .._autograd import refuse_grad
from .._inputs import as_array, as_structure, has_topology, is_array, source_name
from ..errors import InputError
from ..scoring import _mapping as mp
from ..structure import Structure

__all__ = ["ChainMapping", "map_chains"]

#: Reference chains at least this identical (percent) are copies of one chain (OpenStructure's
#: ``pep_seqid_thr``).
GROUP_IDENTITY = 95.0
#: Largest number of assignments tried one by one (OpenStructure's ``n_max_naive``, 8!).
MAX_NAIVE = 40320


@dataclass
class ChainMapping:
    """How a model complex maps onto a reference complex.

    Attributes
    ----------
    model_source, reference_source : str
        Names of the inputs (file base names where known).
    chains : dict of str to str
        Reference chain -> model chain, for every mapped pair (reference chains without a partner are
        absent).
    residues : dict of str to ndarray
        Reference chain -> integer array of shape (K, 2): (model residue index, reference residue index)
        pairs, 0-based into ``Structure.residues`` of each, for the aligned columns of that chain pair.
    identity : dict of str to float
        Reference chain -> sequence identity of the pair, percent of aligned columns.
    groups : list of list of str
        The reference's equivalence groups (chains of one group are interchangeable).
    unmapped_model : list of str
        Model chains mapped to no reference chain.
    score : float
        The global CA lDDT of the chosen assignment (NaN when nothing had to be chosen).
    """

    model_source: str
    reference_source: str
    chains: dict
    residues: dict
    identity: dict
    groups: list
    unmapped_model: list = field(default_factory=list)
    score: float = float("nan")

    def residue_pairs(self) -> np.ndarray:
        """All residue pairs, shape (K, 2), sorted by reference residue: the explicit ``mapping=`` that
        :func:`protgpu.lddt`, :func:`protgpu.tm_score` and :func:`protgpu.gdt` take.

        Examples
        --------
        >>> m = ChainMapping("m.pdb", "r.pdb", {"A": "B"}, {"A": np.array([[6, 1], [5, 0]])}, {"A": 100.0}, [["A"]])
        >>> m.residue_pairs().tolist()
        [[5, 0], [6, 1]]
        """
        if not self.residues:
            return np.zeros((0, 2), np.int64)
        pairs = np.concatenate(list(self.residues.values())).astype(np.int64)
        return pairs[np.argsort(pairs[:, 1], kind="stable")]

    def model_chain_of(self) -> dict:
        """Model chain -> reference chain.

        Examples
        --------
        >>> ChainMapping("m.pdb", "r.pdb", {"A": "B"}, {}, {}, [["A"]]).model_chain_of()
        {'B': 'A'}
        """
        return {m: r for r, m in self.chains.items()}


# --------------------------------------------------------------------------------------------------
# Chains and alignments


def protein_chains(info: mp.ResidueInfo) -> dict:
    """Chain id -> residue indices of its protein residues, chains in file order (no empty chain)."""
    out = {}
    for c in mp._chain_order(info.chain, info.protein):
        out[c] = np.flatnonzero(info.protein & (info.chain == c))
    return out


@functools.lru_cache(maxsize=256)
def align(seq_a: str, seq_b: str) -> tuple[np.ndarray, np.ndarray, float]:
    """Semi-globally align two sequences: aligned positions of each and the identity (percent of
    aligned columns; 0 with none). Cached: the many models of one design share their sequences (the
    arrays returned are read-only)."""
    aln = mp.aligner(free_end_gaps=True).align(seq_a, seq_b)[0]
    ia, ib = [], []
    for (a0, a1), (b0, b1) in zip(*aln.aligned, strict=True):
        ia.append(np.arange(a0, a1))
        ib.append(np.arange(b0, b1))
    ia = np.concatenate(ia) if ia else np.zeros(0, np.int64)
    ib = np.concatenate(ib) if ib else np.zeros(0, np.int64)
    if not len(ia):
        return ia, ib, 0.0
    same = np.frombuffer(seq_a.encode(), "S1")[ia] == np.frombuffer(seq_b.encode(), "S1")[ib]
    ia, ib = ia.astype(np.int64), ib.astype(np.int64)
    ia.flags.writeable = ib.flags.writeable = False
    return ia, ib, 100.0 * float(same.mean())


#: A model chain maps only with this many aligned residues (or half the shorter chain, for peptides).
MIN_ALIGNED = 10


def _enough(aligned: np.ndarray, seq_a: str, seq_b: str) -> bool:
    """Whether an alignment has enough aligned columns for its identity to mean anything."""
    return len(aligned) >= min(MIN_ALIGNED, -(-min(len(seq_a), len(seq_b)) // 2))


def _groups(seqs: dict) -> list[list[str]]:
    """Reference chains grouped by sequence identity >= GROUP_IDENTITY (first chain of a group is its
    representative)."""
    groups: list[list[str]] = []
    for c, s in seqs.items():
        for g in groups:
            if align(s, seqs[g[0]])[2] >= GROUP_IDENTITY:
                g.append(c)
                break
        else:
            groups.append([c])
    return groups


# --------------------------------------------------------------------------------------------------
# Inputs


def model_structure(model, reference: Structure, what: str = "model") -> Structure:
    """A Structure for a model: Structures and paths as loaded; a bare coordinate array of the
    reference's atoms takes the reference's atom table (as :func:`protgpu.lddt` reads it)."""
    if is_array(model) and not has_topology(model):
        a = np.asarray(to_numpy(as_array(model, what)), dtype=np.float32)
        if a.ndim == 2:
            a = a[None]
        if a.ndim == 3 and a.shape[2] == 3 and a.shape[1] != reference.n_atoms:  # scoring's wording
            raise InputError(f"{what}: a coordinate array scored against a Structure must have its "
                             f"{reference.n_atoms} atoms, got {a.shape[1]}")
        if a.ndim != 3 or a.shape[2] != 3:
            raise InputError(f"{what}: a coordinate array must have shape (atoms, 3) or (models, atoms, 3); "
                             f"got {a.shape}")
        return Structure(a, reference.atoms, source=None)
    return as_structure(model, what)


def reference_structure(reference) -> Structure:
    """The reference as a one-frame Structure."""
    s = as_structure(reference, "reference")
    return s.frames(0) if s.n_frames > 1 else s


# --------------------------------------------------------------------------------------------------
# The mapping


def map_chains(model, reference, *, min_identity: float = 30.0, chain_mapping="auto",
               max_naive: int = MAX_NAIVE) -> ChainMapping:
    """Map the chains and residues of a model complex onto a reference complex.

    Parameters
    ----------
    model : Structure, path, Bio.PDB/mdtraj object, or coordinate array of the reference's atoms
        The model complex (its first frame's atom table is what is mapped).
    reference : Structure, path, Bio.PDB/mdtraj object
        The reference complex.
    min_identity : float
        Least sequence identity (percent of aligned columns) for a model chain to map to a reference
        chain; OpenStructure's Scorer maps from 0 (``mdl_map_pep_seqid_thr``), protgpu refuses
        unrelated chains.
    chain_mapping : "auto" or dict
        ``"auto"``: chains by sequence, equivalent chains by the best global CA lDDT (module docstring).
        A dict ``{reference chain: model chain}`` fixes the chain pairs; residues are still aligned.
    max_naive : int
        Most assignments of equivalent chains tried one by one; above it, greedy.

    Returns
    -------
    ChainMapping

    Raises
    ------
    InputError
        No model chain maps to any reference chain (one line naming the model file and the chains of
        both), an unknown chain in an explicit ``chain_mapping``, or a bad argument.

    Examples
    --------
    >>> m = map_chains("datasets/openstructure/1eud_mdl_partial-dimer.pdb", "datasets/openstructure/1eud_ref.pdb")
    >>> m.chains, {c: len(p) for c, p in m.residues.items()}
    ({'A': 'A', 'B': 'B'}, {'A': 290, 'B': 241})
    """
    refuse_grad("pg.map_chains", model, reference)
    ref_s = reference_structure(reference)
    mdl_s = model_structure(model, ref_s)
    return _map(mdl_s, ref_s, min_identity=min_identity, chain_mapping=chain_mapping, max_naive=max_naive)


def _map(mdl_s: Structure, ref_s: Structure, *, min_identity, chain_mapping, max_naive) -> ChainMapping:
    if not 0 <= float(min_identity) <= 100:
        raise InputError(f"min_identity is a percentage from 0 to 100, got {min_identity}")
    msrc, rsrc = source_name(mdl_s, "model"), source_name(ref_s, "reference")
    minfo, rinfo = mp.residue_info(mdl_s), mp.residue_info(ref_s)
    mch, rch = protein_chains(minfo), protein_chains(rinfo)
    if not rch:
        raise InputError(f"{rsrc}: the reference has no protein chain to map")
    if not mch:
        raise InputError(f"{msrc}: the model has no protein chain to map")
    mseq = {c: mp._sequence(minfo.std_resname[i]) for c, i in mch.items()}
    rseq = {c: mp._sequence(rinfo.std_resname[i]) for c, i in rch.items()}
    groups = _groups(rseq)
    alns: dict = {}

    def aln(rc, mc):
        if (rc, mc) not in alns:
            alns[(rc, mc)] = align(mseq[mc], rseq[rc])
        return alns[(rc, mc)]

    if isinstance(chain_mapping, dict):
        for rc, mc in chain_mapping.items():
            if rc not in rch:
                raise InputError(f"{rsrc}: chain_mapping names reference chain {rc!r}; the reference's "
                                 f"protein chains are {list(rch)}")
            if mc not in mch:
                raise InputError(f"{msrc}: chain_mapping names model chain {mc!r}; the model's protein "
                                 f"chains are {list(mch)}")
        if len(set(chain_mapping.values())) != len(chain_mapping):
            raise InputError(f"{msrc}: chain_mapping maps one model chain to several reference chains")
        pairs = dict(chain_mapping)
        score = float("nan")
    elif chain_mapping == "auto":
        # each model chain joins the group whose representative it resembles most
        members: dict = {i: [] for i in range(len(groups))}
        for mc in mch:
            # identity over aligned columns counts only with enough of them: semi-global alignment
            # of unrelated chains can align a handful of residues at 40 %
            ids = [aln(g[0], mc)[2] if _enough(aln(g[0], mc)[0], mseq[mc], rseq[g[0]]) else 0.0
                   for g in groups]
            best = int(np.argmax(ids))
            if ids[best] >= min_identity and ids[best] > 0:
                members[best].append(mc)
        if not any(members.values()):
            raise InputError(f"{msrc}: no model chain maps to the reference {rsrc} (model chains "
                             f"{list(mch)}, reference chains {list(rch)}; sequence identity below "
                             f"{min_identity:g}% or fewer than {MIN_ALIGNED} aligned residues)")
        pairs, score = _assign(groups, members, mch, rch, aln, mdl_s, ref_s, max_naive)
    else:
        raise InputError(f"chain_mapping must be 'auto' or a dict {{reference chain: model chain}}, "
                         f"not {chain_mapping!r}")
    residues, identity = {}, {}
    for rc, mc in pairs.items():
        ia, ib, ident = aln(rc, mc)
        residues[rc] = np.stack([mch[mc][ia], rch[rc][ib]], axis=1).astype(np.int64)
        identity[rc] = ident
    mapped = set(pairs.values())
    return ChainMapping(msrc, rsrc, pairs, residues, identity, groups,
                        [c for c in mch if c not in mapped], score)


def _residue_pairs(pairs: dict, mch, rch, aln) -> np.ndarray:
    out = [np.stack([mch[mc][aln(rc, mc)[0]], rch[rc][aln(rc, mc)[1]]], axis=1) for rc, mc in pairs.items()]
    return np.concatenate(out).astype(np.int64) if out else np.zeros((0, 2), np.int64)


def _assign(groups, members, mch, rch, aln, mdl_s, ref_s, max_naive):
    """Pair model chains with the reference chains of their groups, maximising the global CA lDDT."""
    from ..scoring.lddt import lddt

    def score(pairs: dict) -> float:
        rp = _residue_pairs(pairs, mch, rch, aln)
        if not len(rp):
            return 0.0
        return float(lddt(mdl_s.frames(0), ref_s, atoms="ca", mapping=rp, symmetry=False, device="cpu"))

    choices = []  # per group: every way of pairing its model chains with its reference chains
    n_total = 1
    for gi, g in enumerate(groups):
        ms = members[gi]
        k = min(len(ms), len(g))
        n = math.perm(len(g), k) * math.comb(len(ms), k)
        n_total *= max(n, 1)
        choices.append((g, ms, k))
    ambiguous = n_total > 1
    if not ambiguous:
        pairs = {}
        for g, ms, k in choices:
            pairs.update(dict(zip(g[:k], ms[:k], strict=True)))
        return pairs, float("nan")
    if n_total <= max_naive:
        per_group = []
        for g, ms, k in choices:
            opts = []
            for msub in itertools.combinations(ms, k):
                for rperm in itertools.permutations(g, k):
                    opts.append(dict(zip(rperm, msub, strict=True)))
            per_group.append(opts or [{}])
        best, best_score = None, -1.0
        for combo in itertools.product(*per_group):
            pairs = {}
            for d in combo:
                pairs.update(d)
            s = score(pairs)
            if s > best_score:  # first best wins: deterministic in file order
                best, best_score = pairs, s
        return best, best_score
    # greedy from every seed pair (OpenStructure's "greedy_full"): a seed alone cannot tell copies
    # apart (each chain's own lDDT is the same whichever copy it sits on), the extension can
    group_of = {c: gi for gi, (g, _, _) in enumerate(choices) for c in g}
    mgroup = {c: gi for gi, (_, ms, _) in enumerate(choices) for c in ms}
    seeds = [(rc, mc) for rc in group_of for mc in mgroup if mgroup[mc] == group_of[rc]]
    best, best_score = None, -1.0
    for seed in seeds:
        pairs = dict([seed])
        while True:
            used = set(pairs.values())
            cands = [(rc, mc) for rc in group_of if rc not in pairs for mc in mgroup
                     if mc not in used and mgroup[mc] == group_of[rc]]
            if not cands:
                break
            _, rc, mc = max(((score({**pairs, rc: mc}), rc, mc) for rc, mc in cands), key=lambda t: t[0])
            pairs[rc] = mc
        s = score(pairs)
        if s > best_score:
            best, best_score = pairs, s
    return best, best_score
