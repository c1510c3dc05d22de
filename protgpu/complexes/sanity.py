"""Design sanity metrics of one model: steric clashes, radius of gyration, residue counts per chain
and at the interface, and buried interface contacts (``pg.design_sanity``).

Clashes and interface contacts are the pairs a k-d tree finds within the cutoff (scipy; the searches
are in :mod:`._contacts`, the interface's shared with DockQ's contacts of the same model).
"""

from __future__ import annotations

import numpy as np

from .._autograd import refuse_grad
from .._inputs import as_structure
from ..errors import InputError
from ..structure import WATER_RESNAMES

# SanityTopology and sanity_of: for protgpu evaluate's job (one table per design), not public API
__all__ = ["design_sanity"]

#: Default clash distance, Angstrom. Non-bonded heavy atoms in real structures rarely come closer than
#: about 2.5 A (the shortest hydrogen bonds, O...O); 2.2 A leaves those out and counts real overlaps.
CLASH_CUTOFF = 2.2


def _clash_pairs(x: np.ndarray, res: np.ndarray, chain_code: np.ndarray, sg: np.ndarray, cutoff: float):
    """(i, j) heavy-atom pairs, i < j, closer than ``cutoff`` (strict ``<`` on NumPy's float64
    distances): not in the same residue, not in sequence-adjacent residues of one chain (their
    peptide-bond atoms are 1.3-2.5 A apart), and not two cysteine SG atoms (a disulfide bond is 2.05 A).
    A cell list or a k-d tree finds the candidates (:func:`._contacts.clash_candidates`: pairs within
    ``cutoff`` grown past rounding, the excluded ones left out; O(n) for a packed structure instead of
    all n^2 distances); the strict ``<`` is tested on their distances."""
    from ._contacts import clash_candidates

    i, j = clash_candidates(x, res, chain_code, sg, cutoff)
    keep = np.sqrt(((x[i] - x[j]) ** 2).sum(-1)) < cutoff
    return i[keep], j[keep]


def design_sanity(structure, *, clash_cutoff: float = CLASH_CUTOFF, interface_cutoff: float = 5.0,
                  frame: int = 0) -> dict:
    """Sanity metrics of a designed or predicted model.

    Parameters
    ----------
    structure : Structure or path
        The model (anything :func:`protgpu.load` reads); water is ignored, hydrogens are not used.
    clash_cutoff : float
        Heavy-atom pairs closer than this (Angstrom) are clashes, except atoms of one residue or of
        sequence-adjacent residues of one chain, and disulfide-bonded SG pairs.
    interface_cutoff : float
        Residues of different chains whose closest heavy atoms are closer than this (Angstrom) are in
        contact (any heavy-atom pair closer than it).
    frame : int
        Which frame of a multi-frame structure.

    Returns
    -------
    dict
        ``n_chains``; ``chain_residues`` (chain id -> residue count); ``n_residues``;
        ``clashes`` (total), ``clashes_intra`` (same chain), ``clashes_inter`` (between chains);
        ``radius_of_gyration`` (Angstrom, heavy atoms, unweighted) and ``chain_radius_of_gyration``;
        ``interface_residues`` (chain id -> residues in contact with another chain),
        ``n_interface_residues``; ``interface_contacts`` (inter-chain residue pairs in contact);
        ``buried_interface_contacts`` (those pairs with both residues buried: at least 20 other
        residues' CA atoms of the complex within 10 Angstrom of their CA).

    Raises
    ------
    InputError
        A non-positive cutoff, a frame out of range, or a structure with no heavy atoms.

    Examples
    --------
    >>> import protgpu as pg
    >>> from pathlib import Path
    >>> from protgpu.complexes import design_sanity
    >>> s = pg.load(Path(pg.__file__).resolve().parents[1] / "datasets" / "openstructure" / "1eud_ref.pdb")
    >>> m = design_sanity(s)
    >>> m["chain_residues"], m["clashes"], round(m["radius_of_gyration"], 1)
    ({'A': 306, 'B': 395, '_': 2}, 0, 27.6)
    """
    refuse_grad("pg.design_sanity", structure)
    s = as_structure(structure, "structure")
    where = s.source or "structure"
    if not clash_cutoff > 0 or not interface_cutoff > 0:
        raise InputError(f"{where}: clash_cutoff and interface_cutoff must be positive Angstrom, got "
                         f"{clash_cutoff} and {interface_cutoff}")
    if not -s.n_frames <= frame < s.n_frames:
        raise InputError(f"{where}: frame {frame} out of range ({s.n_frames} frames)")
    return sanity_of(SanityTopology(s.atoms, where), s.coords[frame], clash_cutoff, interface_cutoff)


class SanityTopology:
    """What :func:`design_sanity` reads from an atom table, computed once per table (the models of one
    design share theirs): the heavy atoms, their chains and residues, the residue table of the heavy
    atoms and the atoms that stand for each residue in the burial count.

    Parameters
    ----------
    atoms : AtomTable
    where : str
        The structure's name, for the error.

    Raises
    ------
    InputError
        A table with no heavy atoms.
    """

    def __init__(self, atoms, where: str = "structure"):
        from ..structure.tables import residue_table

        a = atoms
        heavy = (a.element != "H") & (a.element != "D") & ~np.isin(a.resname, list(WATER_RESNAMES))
        self.idx = idx = np.flatnonzero(heavy)
        if idx.size == 0:
            raise InputError(f"{where}: no heavy atoms")
        self.chain = chain = a.chain[idx]
        self.ids = ids = list(dict.fromkeys(chain.tolist()))
        self.code = np.searchsorted(np.array(sorted(ids)), chain)
        self.res = res = a.residue_index[idx].astype(np.int64)
        self.sg = a.name[idx] == "SG"
        sel_res = np.unique(res)
        chain_of_res = residue_table(a).chain[sel_res]
        self.chain_residues = {c: int((chain_of_res == c).sum()) for c in ids}
        self.n_residues = int(sel_res.size)
        self.chain_atoms = {c: np.flatnonzero(chain == c) for c in ids}
        self.chain_raw = {c: idx[a] for c, a in self.chain_atoms.items()}  # (the same, in the table)
        # the heavy-atom sub-table: its residues (renumbered from 0) are what the interface counts
        sub = a.take(idx)
        self.sres = sub.residue_index
        rt = residue_table(sub)
        self.rchain = rt.chain
        # burial: each residue's CA (its first atom without one), in the sub-table's atoms
        centre = rt.atom_start.copy()
        ca = np.flatnonzero(sub.name == "CA")
        centre[sub.residue_index[ca]] = ca
        self.centre = centre


def sanity_of(topo: SanityTopology, xyz, clash_cutoff: float = CLASH_CUTOFF,
              interface_cutoff: float = 5.0, found: dict | None = None) -> dict:
    """:func:`design_sanity` of one frame's coordinates ``xyz`` (N, 3), Angstrom, on a prepared table.

    ``found``: a dict that receives the interface search's atom contacts, for the DockQ contacts of the
    same model (``host_scores(..., found=)``: one search, not two): ``"cutoff"``; ``"atoms"``, chain id
    -> its heavy atoms (indices into ``xyz``, ascending); ``"pairs"``, (chain p, chain q) -> (i, j),
    the pairs within the cutoff (<=) as positions in those two lists."""
    x = np.asarray(xyz)[topo.idx].astype(np.float64)
    ids = topo.ids
    ci, cj = _clash_pairs(x, topo.res, topo.code, topo.sg, float(clash_cutoff))
    inter = topo.code[ci] != topo.code[cj]

    def rg(p):
        return float(np.sqrt(((p - p.mean(axis=0)) ** 2).sum(axis=1).mean()))

    out = {
        "n_chains": len(ids),
        "chain_residues": dict(topo.chain_residues),
        "n_residues": topo.n_residues,
        "clashes": int(ci.size),
        "clashes_intra": int((~inter).sum()),
        "clashes_inter": int(inter.sum()),
        "clash_cutoff": float(clash_cutoff),
        "radius_of_gyration": rg(x),
        "chain_radius_of_gyration": {c: rg(x[topo.chain_atoms[c]]) for c in ids},
    }
    # interface: residue pairs of different chains with heavy atoms closer than the cutoff (the k-d tree
    # residue contacts DockQ counts, chain pair by chain pair: the inter-chain pairs alone, not the
    # whole residue matrix protgpu.contacts would build)
    iface = {c: 0 for c in ids}
    n_contacts = n_buried = 0
    if len(ids) > 1:
        from itertools import combinations

        from ._contacts import _contact_atoms, _residue_pairs

        per_pair = {}
        for p, q in combinations(ids, 2):
            per_pair[p, q] = _contact_atoms(x, topo.chain_atoms[p], topo.chain_atoms[q], float(interface_cutoff))
        if found is not None:
            found.update(cutoff=float(interface_cutoff), pairs=per_pair,
                         atoms=topo.chain_raw)
        res = [_residue_pairs(topo.sres[topo.chain_atoms[p][i]], topo.sres[topo.chain_atoms[q][j]])
               for (p, q), (i, j) in per_pair.items()]
        # (one chain pair: distinct and sorted already)
        pairs = res[0] if len(res) == 1 else np.unique(np.concatenate(res), axis=0)
        ri, rj = pairs[:, 0], pairs[:, 1]
        n_contacts = int(ri.size)
        for r in np.unique(np.concatenate([ri, rj])):
            iface[str(topo.rchain[r])] += 1
        if n_contacts:
            rows = np.unique(pairs)
            buried = np.zeros(len(topo.centre), bool)
            buried[rows] = _buried(x[topo.centre], rows)
            n_buried = int((buried[ri] & buried[rj]).sum())
    out.update(interface_residues=iface, n_interface_residues=int(sum(iface.values())),
               interface_contacts=n_contacts, buried_interface_contacts=n_buried,
               interface_cutoff=float(interface_cutoff))
    return out


def _buried(x: np.ndarray, rows: np.ndarray, radius: float = 10.0, min_neighbours: int = 20) -> np.ndarray:
    """Per residue of ``rows``: at least ``min_neighbours`` other residues' CA atoms within ``radius``
    of its CA (``x`` (R, 3): each residue's CA, its first atom when there is no CA), the complex's
    chains together: a neighbour count that is high in a protein's core and low at its surface. Only
    the rows asked for are computed (the interface residues), with :func:`protgpu.distances`'
    arithmetic (float64 squared distances, square root in float32)."""
    from .._pbc import PBC_NONE
    from ..distances import _frame_matrix_numpy

    x = x.astype(np.float32)
    d = np.empty((len(rows), len(x)), np.float32)
    _frame_matrix_numpy(x[rows], x, None, None, PBC_NONE, d)
    return (d < radius).sum(axis=1) - 1 >= min_neighbours
