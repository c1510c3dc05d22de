"""Stereochemistry checks before lDDT: the atoms OpenStructure's Scorer leaves out ("stereochecks").

OpenStructure's ``Scorer`` computes lDDT and the interface lDDT on stereochecked model and target
(``ost.mol.alg.stereochemistry.StereoCheck``): on protein residues it finds

- **bad bonds**: bonded atom pairs whose length is more than 12 standard deviations from its ideal
  value; the bonds of a residue (its template) and the peptide bond C(i)-N(i+1) where it exists;
- **bad angles**: bonded triples whose angle is more than 12 standard deviations off (within a residue,
  and the three or four angles across a peptide bond);
- **clashes**: non-bonded atom pairs (C, N, O, P, S) closer than the sum of their van der Waals radii
  less 1.5 A (two cysteine SG atoms of different residues: closer than 2.03 - 1.0 A);

and removes, for each residue with a problem atom, the whole residue when a backbone atom (N, CA, C, O)
is involved, else its side chain (every other atom). Removed model atoms count as missing; removed
target atoms take their pairs out of the reference. The backbone (CA) lDDT is computed without them.

A peptide bond exists, as in OpenStructure's processor (``conop.IsBondFeasible``), when residue i has no
OXT and the C-N distance lies within [0.25, sqrt(6)/4] times the summed atom radii of C and N (1.70 +
1.55 A: 0.81 to 1.99 A); a longer one is a chain break and checked for nothing. The link parameters
depend on residue i+1: glycine, proline (cis when |omega| < 1.57 rad, trans else) or any other.

The parameters are the data file ``stereo_params.txt`` next to this module (its header says where each
number comes from). protgpu's ideal values are Engh & Huber's (2001) table; OpenStructure 2.4 and later
read CCP4's monomer library (values derived from the same data, updated since): at 12 standard
deviations the two differ only for bonds and angles already far off. Nucleotides are not checked.

Per model the cost is a few vectorised NumPy passes over the template's bonds and angles and one
cell-list search for pairs closer than 2.1 A (:func:`protgpu.complexes._contacts.clash_candidates`);
what depends on the atom table only (:class:`StereoTopology`) is built once per table.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..scoring import _mapping as mp

__all__ = ["StereoTopology", "stereo_drop", "stereo_problems", "stereo_topology"]

#: Standard deviations beyond which a bond or angle is bad (OpenStructure's GetBadBonds/GetBadAngles).
TOLERANCE_SD = 12.0
#: Subtracted from the summed van der Waals radii for a clash, Angstrom (GetClashes' ``tolerance``).
CLASH_TOLERANCE = 1.5
#: Clash distance of two cysteine SG atoms (a possible disulfide), Angstrom: 2.03 less 1.0.
DISULFIDE_CLASH = 2.03 - 1.0
#: Backbone atoms: a problem here removes the whole residue.
BACKBONE = ("N", "CA", "C", "O")
#: Peptide-link kinds, by the residue after the bond (the data file's link_* rows).
LINK_KINDS = ("PEPTIDE", "GLY", "PRO_TRANS", "PRO_CIS")
# the link angles: (name in the data file, atom of residue i or i+1 for each corner)
_LINK_ANGLES = (("CA-C-N", ("ca_i", "c", "n")), ("O-C-N", ("o_i", "c", "n")), ("C-N-CA", ("c", "n", "ca_j")),
                ("C-N-CD", ("c", "n", "cd_j")))


@functools.lru_cache(maxsize=1)
def stereo_params() -> dict:
    """The parameters of ``stereo_params.txt``: ``bond`` {residue: [(a, b, mean, sd)]}, ``angle``
    {residue: [(a, b, c, mean, sd)]} (Angstrom, degrees), ``link_bond`` {kind: (mean, sd)},
    ``link_angle`` {kind: {"CA-C-N": (mean, sd), ...}} and ``radius`` {element: Angstrom}."""
    out: dict = {"bond": {}, "angle": {}, "link_bond": {}, "link_angle": {}, "radius": {}}
    text = (Path(__file__).with_name("stereo_params.txt")).read_text()
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, res, atoms, mean, sd = line.split()
        if kind == "radius":
            out["radius"][atoms] = float(mean)
        elif kind == "link_bond":
            out["link_bond"][res] = (float(mean), float(sd))
        elif kind == "link_angle":
            out["link_angle"].setdefault(res, {})[atoms] = (float(mean), float(sd))
        else:
            out[kind].setdefault(res, []).append((*atoms.split("-"), float(mean), float(sd)))
    return out


@dataclass(frozen=True)
class StereoTopology:
    """What the checks need of one atom table (atom indices into the Structure; built once per table).

    Attributes
    ----------
    n_atoms : int
    bonds : np.ndarray of int64, shape (B, 2)
        Template bonds within residues (the bond graph; OXT-C included).
    bond_mean, bond_tol : np.ndarray of float64, shape (B,)
        Ideal length and 12 standard deviations, Angstrom (tolerance inf: not checked).
    angles : np.ndarray of int64, shape (A, 3)
        Template angles within residues (a, vertex, c).
    angle_mean, angle_tol : np.ndarray of float64, shape (A,)
        Degrees.
    links : dict of str to np.ndarray of int64, shape (P,)
        Possible peptide bonds: atoms ``c``, ``n``, ``o_i``, ``ca_i``, ``ca_j``, ``cd_j`` (-1 where
        missing) and ``kind`` (0 peptide, 1 glycine, 2 proline) of residue i+1.
    bond_keys : np.ndarray of int64, shape (B,)
        Sorted ``min * n_atoms + max`` of the template bonds (clashes skip bonded pairs).
    clash_atoms : np.ndarray of int64, shape (K,)
        Protein atoms of an element with a radius.
    clash_radius : np.ndarray of float64, shape (K,)
    clash_res : np.ndarray of int64, shape (K,)
    clash_sg : np.ndarray of bool, shape (K,)
        Cysteine SG atoms.
    atom_res : np.ndarray of int64, shape (N,)
        Residue of each atom.
    backbone : np.ndarray of bool, shape (N,)
        Backbone atoms (N, CA, C, O) of protein residues.
    protein : np.ndarray of bool, shape (N,)
        Atoms of protein residues.
    """

    n_atoms: int
    bonds: np.ndarray
    bond_mean: np.ndarray
    bond_tol: np.ndarray
    angles: np.ndarray
    angle_mean: np.ndarray
    angle_tol: np.ndarray
    links: dict
    bond_keys: np.ndarray
    clash_atoms: np.ndarray
    clash_radius: np.ndarray
    clash_res: np.ndarray
    clash_sg: np.ndarray
    atom_res: np.ndarray
    backbone: np.ndarray
    protein: np.ndarray


def _build(s) -> StereoTopology:
    from .scores import atom_table  # (scores imports this module)

    p = stereo_params()
    info = mp.residue_info(s)
    n = s.n_atoms
    res = np.flatnonzero(info.protein)
    names = sorted({a for rows in p["bond"].values() for b in rows for a in b[:2]} | {"OXT"})
    col = {nm: k for k, nm in enumerate(names)}
    t = atom_table(info, res, names)  # (R, K) atom of each residue and name, -1 missing
    std = info.std_resname[res]
    bonds, bmean, bsd, angles, amean, asd = [], [], [], [], [], []
    for name in np.unique(std).tolist():
        rows = t[std == name]
        for a, b, mean, sd in p["bond"].get(name, []):
            ab = rows[:, [col[a], col[b]]]
            ab = ab[(ab >= 0).all(axis=1)]
            bonds.append(ab)
            bmean.append(np.full(len(ab), mean))
            bsd.append(np.full(len(ab), sd))
        for a, b, c, mean, sd in p["angle"].get(name, []):
            if not (a in col and b in col and c in col):
                continue
            abc = rows[:, [col[a], col[b], col[c]]]
            abc = abc[(abc >= 0).all(axis=1)]
            angles.append(abc)
            amean.append(np.full(len(abc), mean))
            asd.append(np.full(len(abc), sd))
    oxt = t[:, [col["C"], col["OXT"]]]
    oxt = oxt[(oxt >= 0).all(axis=1)]  # bonded (for clashes), never checked
    bonds.append(oxt)
    bmean.append(np.full(len(oxt), np.nan))
    bsd.append(np.full(len(oxt), np.inf))
    bonds_a = np.concatenate(bonds).reshape(-1, 2).astype(np.int64)
    angles_a = np.concatenate(angles).reshape(-1, 3).astype(np.int64) if angles else np.zeros((0, 3), np.int64)

    # peptide links: consecutive protein residues of one chain, residue i without OXT
    nxt = np.flatnonzero((np.diff(res) == 1) & (info.chain[res[:-1]] == info.chain[res[1:]]))
    ti, tj = t[nxt], t[nxt + 1]
    ok = (ti[:, col["C"]] >= 0) & (tj[:, col["N"]] >= 0) & (ti[:, col["OXT"]] < 0)
    ti, tj, nres = ti[ok], tj[ok], std[nxt[ok] + 1]
    kind = np.where(nres == "GLY", 1, np.where(nres == "PRO", 2, 0)).astype(np.int64)
    links = {"c": ti[:, col["C"]], "n": tj[:, col["N"]], "o_i": ti[:, col["O"]], "ca_i": ti[:, col["CA"]],
             "ca_j": tj[:, col["CA"]], "cd_j": np.where(kind == 2, tj[:, col["CD"]], -1), "kind": kind}

    lo, hi = np.minimum(bonds_a[:, 0], bonds_a[:, 1]), np.maximum(bonds_a[:, 0], bonds_a[:, 1])
    prot = info.protein[info.atom_residue]
    el = np.char.upper(s.atoms.element.astype(str))
    radius = np.array([p["radius"].get(e, np.nan) for e in el.tolist()]) if n else np.zeros(0)
    clash = np.flatnonzero(prot & ~np.isnan(radius))
    sg = (info.atom_name == "SG") & (info.std_resname[info.atom_residue] == "CYS")
    return StereoTopology(
        n_atoms=n, bonds=bonds_a, bond_mean=np.concatenate(bmean), bond_tol=TOLERANCE_SD * np.concatenate(bsd),
        angles=angles_a, angle_mean=np.concatenate(amean) if amean else np.zeros(0),
        angle_tol=TOLERANCE_SD * np.concatenate(asd) if asd else np.zeros(0), links=links,
        bond_keys=np.sort(lo * n + hi), clash_atoms=clash, clash_radius=radius[clash],
        clash_res=info.atom_residue[clash].astype(np.int64), clash_sg=sg[clash],
        atom_res=info.atom_residue.astype(np.int64), backbone=prot & np.isin(info.atom_name, BACKBONE),
        protein=prot)


_TOPOLOGIES: dict = {}
MAX_TOPOLOGIES = 64  # atom tables remembered (a campaign's designs of many lengths: the latest ones)


def stereo_topology(s, key: bytes | None = None) -> StereoTopology:
    """The :class:`StereoTopology` of a Structure's atom table, kept per table (``key``: a digest of the
    table when the caller has one, e.g. :func:`protgpu.complexes.scores.atoms_key`; else its
    residue-info key)."""
    key = key if key is not None else mp.residue_info(s).key
    top = _TOPOLOGIES.get(key) if key else None
    if top is None or top.n_atoms != s.n_atoms:
        top = _build(s)
        if key:
            if len(_TOPOLOGIES) >= MAX_TOPOLOGIES:
                _TOPOLOGIES.pop(next(iter(_TOPOLOGIES)))
            _TOPOLOGIES[key] = top
    return top


def _norm(v: np.ndarray) -> np.ndarray:
    return np.sqrt((v * v).sum(axis=-1))


def _angle_deg(x: np.ndarray, a, b, c) -> np.ndarray:
    """Angle a-b-c in degrees (OpenStructure's geom.Angle: the arc cosine of the clipped cosine)."""
    u, v = x[a] - x[b], x[c] - x[b]
    cos = (u * v).sum(axis=-1) / (_norm(u) * _norm(v))
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))


def _omega(x: np.ndarray, a, b, c, d) -> np.ndarray:
    """Dihedral a-b-c-d in radians, (-pi, pi]."""
    b0, b1, b2 = x[a] - x[b], x[c] - x[b], x[d] - x[c]
    b1n = b1 / _norm(b1)[:, None]
    v = b0 - (b0 * b1n).sum(-1)[:, None] * b1n
    w = b2 - (b2 * b1n).sum(-1)[:, None] * b1n
    return np.arctan2((np.cross(b1n, v) * w).sum(-1), (v * w).sum(-1))


def stereo_problems(s, x: np.ndarray | None = None, topology: StereoTopology | None = None) -> dict:
    """The stereochemical problems of one model frame (see the module doc).

    Parameters
    ----------
    s : Structure
        The (cleaned) structure; its first frame unless ``x`` is given.
    x : np.ndarray, shape (N, 3), optional
        Coordinates, Angstrom.
    topology : StereoTopology, optional
        ``s``'s, when the caller keeps it (else :func:`stereo_topology`).

    Returns
    -------
    dict
        ``bad_bonds`` int64 (K, 2), ``bad_angles`` int64 (K, 3), ``clashes`` int64 (K, 2): atom indices.
    """
    top = topology if topology is not None else stereo_topology(s)
    x = np.asarray(s.coords[0] if x is None else x, dtype=np.float64)
    p = stereo_params()
    b = top.bonds
    d = _norm(x[b[:, 0]] - x[b[:, 1]])
    bad_bonds = [b[np.abs(d - top.bond_mean) > top.bond_tol]]
    a = top.angles
    ang = _angle_deg(x, a[:, 0], a[:, 1], a[:, 2])
    bad_angles = [a[np.abs(ang - top.angle_mean) > top.angle_tol]]

    lk = top.links
    c, nn = lk["c"], lk["n"]
    d_cn = _norm(x[c] - x[nn])
    rcn = p["radius"]["C"] + p["radius"]["N"]
    lo2 = rcn * rcn * 0.0625
    exists = (d_cn * d_cn >= lo2) & (d_cn * d_cn <= 6.0 * lo2)  # IsBondFeasible, on squared lengths
    kind = lk["kind"].copy()
    pro = np.flatnonzero(kind == 2)
    ok = (lk["ca_i"][pro] >= 0) & (lk["ca_j"][pro] >= 0)
    omega = np.full(len(pro), np.nan)
    if ok.any():
        q = pro[ok]
        omega[ok] = _omega(x, lk["ca_i"][q], c[q], nn[q], lk["ca_j"][q])
    kind[pro] = np.where(np.abs(omega) < 1.57, 3, 2)
    kind[pro[~ok]] = -1  # proline without the atoms of omega: no parameters (as OpenStructure)
    for k, name in enumerate(LINK_KINDS):
        sel = exists & (kind == k)
        mean, sd = p["link_bond"][name]
        viol = sel & (np.abs(d_cn - mean) > TOLERANCE_SD * sd)
        bad_bonds.append(np.stack([c[viol], nn[viol]], axis=1))
        for aname, corners in _LINK_ANGLES:
            if aname not in p["link_angle"][name]:
                continue
            idx = [lk[w] for w in corners]
            m = np.flatnonzero(sel & (idx[0] >= 0) & (idx[2] >= 0))
            if not len(m):
                continue
            mean, sd = p["link_angle"][name][aname]
            th = _angle_deg(x, idx[0][m], idx[1][m], idx[2][m])
            v = m[np.abs(th - mean) > TOLERANCE_SD * sd]
            bad_angles.append(np.stack([idx[0][v], idx[1][v], idx[2][v]], axis=1))
    return {"bad_bonds": np.concatenate(bad_bonds).astype(np.int64),
            "bad_angles": np.concatenate(bad_angles).astype(np.int64),
            "clashes": _clashes(top, x, c[exists], nn[exists])}


def _clashes(top: StereoTopology, x: np.ndarray, link_c: np.ndarray, link_n: np.ndarray) -> np.ndarray:
    """Clashing atom pairs (i < j), int64 (K, 2): not bonded (template bonds, the existing peptide
    bonds ``link_c``-``link_n``), closer than their radii less :data:`CLASH_TOLERANCE`."""
    from ._contacts import clash_candidates

    ca = top.clash_atoms
    if len(ca) < 2:
        return np.zeros((0, 2), np.int64)
    xc = np.ascontiguousarray(x[ca])
    cutoff = 2.0 * float(top.clash_radius.max()) - CLASH_TOLERANCE
    k = len(ca)
    # every pair within the cutoff: distinct chain codes exclude no pair by residue or chain
    i, j = clash_candidates(xc, np.zeros(k, np.int64), np.arange(k, dtype=np.int64), np.zeros(k, bool), cutoff)
    d = _norm(xc[i] - xc[j])
    thr = top.clash_radius[i] + top.clash_radius[j] - CLASH_TOLERANCE
    thr = np.where(top.clash_sg[i] & top.clash_sg[j] & (top.clash_res[i] != top.clash_res[j]), DISULFIDE_CLASH, thr)
    hit = d < thr
    gi, gj = ca[i[hit]], ca[j[hit]]
    lo, hi = np.minimum(gi, gj), np.maximum(gi, gj)
    keys = lo * top.n_atoms + hi
    pos = np.searchsorted(top.bond_keys, keys)
    bonded = (pos < len(top.bond_keys)) & (top.bond_keys[np.minimum(pos, len(top.bond_keys) - 1)] == keys)
    link = np.minimum(link_c, link_n) * top.n_atoms + np.maximum(link_c, link_n)
    bonded |= np.isin(keys, link)
    return np.stack([lo[~bonded], hi[~bonded]], axis=1).astype(np.int64)


def drop_of(top: StereoTopology, problems: dict) -> np.ndarray:
    """Atoms to leave out, int64 (D,) sorted, for ``problems`` (:func:`stereo_problems`): the residue of
    a problem backbone atom whole, else the side chain (all but N, CA, C, O) of a residue with one."""
    bad = np.concatenate([problems[k].reshape(-1) for k in ("bad_bonds", "bad_angles", "clashes")])
    if not len(bad):
        return np.zeros(0, np.int64)
    n_res = int(top.atom_res.max()) + 1
    res_bad = np.zeros(n_res, bool)
    res_bad[top.atom_res[bad]] = True
    res_bb = np.zeros(n_res, bool)
    res_bb[top.atom_res[bad[top.backbone[bad]]]] = True
    r = top.atom_res
    return np.flatnonzero(top.protein & (res_bb[r] | (res_bad[r] & ~top.backbone)))


def stereo_drop(s, x: np.ndarray | None = None, key: bytes | None = None) -> np.ndarray:
    """The atoms of ``s`` (first frame, or coordinates ``x`` (N, 3)) that OpenStructure's stereochecks
    remove: int64 (D,) sorted atom indices (see the module doc). ``key`` as :func:`stereo_topology`."""
    top = stereo_topology(s, key)
    return drop_of(top, stereo_problems(s, x, top))

