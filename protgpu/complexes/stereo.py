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
number comes from): the CCP4 Monomer Library's ideal values, the source OpenStructure 2.4+ derives its
stereo data from (Engh & Huber's values updated since; on 1eud only those give OpenStructure's
numbers). Nucleotides are not checked.

Per model the cost is one compiled pass over the template's bonds, angles and peptide links and one
cell-list search for pairs closer than the largest clash distance (:func:`_clash_loop`; numba), with
vectorised NumPy code and the k-d tree of :func:`protgpu.complexes._contacts.clash_candidates` as
their twin; what depends on the atom table only (:class:`StereoTopology`) is built once per table.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..scoring import _mapping as mp
from ..scoring._fast import cell_sort
from ._contacts import _bounds

# helpers of pg.score_complex and protgpu evaluate, importable by name; the public API is
# score_complex(stereochecks=...)
__all__: list[str] = []

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
    link_atoms : np.ndarray of int64, shape (P, 4)
        ``c``, ``n``, ``ca_i``, ``ca_j`` of each link (the compiled loop's view of ``links``).
    link_corners : np.ndarray of int64, shape (P, 4, 3)
        The atoms of the link angles CA-C-N, O-C-N, C-N-CA, C-N-CD (-1: missing).
    bond_keys : np.ndarray of int64, shape (B,)
        Sorted ``min * n_atoms + max`` of the template bonds (clashes skip bonded pairs).
    clash_atoms : np.ndarray of int64, shape (K,)
        Protein atoms of an element with a radius.
    clash_radius : np.ndarray of float64, shape (K,)
    clash_res : np.ndarray of int64, shape (K,)
    clash_sg : np.ndarray of bool, shape (K,)
        Cysteine SG atoms.
    clash_pos : np.ndarray of int64, shape (N,)
        Position of each atom among ``clash_atoms``, -1 for none.
    clash_nbr : np.ndarray of int64, shape (K, D)
        Template bond partners of each clash atom (positions among ``clash_atoms``), -1 padded.
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
    link_atoms: np.ndarray
    link_corners: np.ndarray
    bond_keys: np.ndarray
    clash_atoms: np.ndarray
    clash_radius: np.ndarray
    clash_res: np.ndarray
    clash_sg: np.ndarray
    clash_pos: np.ndarray
    clash_nbr: np.ndarray
    atom_res: np.ndarray
    backbone: np.ndarray
    protein: np.ndarray


def _build(s) -> StereoTopology:
    from ._atoms import atom_table

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
    # OXT takes no part in clashes (OpenStructure's Molck removed it before the checks)
    clash = np.flatnonzero(prot & ~np.isnan(radius) & (info.atom_name != "OXT"))
    sg = (info.atom_name == "SG") & (info.std_resname[info.atom_residue] == "CYS")
    pos = np.full(n, -1, np.int64)
    pos[clash] = np.arange(len(clash))
    nbr = _neighbours(pos[bonds_a[:, 0]], pos[bonds_a[:, 1]], len(clash))
    return StereoTopology(
        n_atoms=n, bonds=bonds_a, bond_mean=np.concatenate(bmean), bond_tol=TOLERANCE_SD * np.concatenate(bsd),
        angles=angles_a, angle_mean=np.concatenate(amean) if amean else np.zeros(0),
        angle_tol=TOLERANCE_SD * np.concatenate(asd) if asd else np.zeros(0), links=links,
        link_atoms=np.stack([links[w] for w in ("c", "n", "ca_i", "ca_j")], axis=1).reshape(-1, 4),
        link_corners=_link_corners(links).reshape(-1, len(_LINK_ANGLES), 3),
        bond_keys=np.sort(lo * n + hi), clash_atoms=clash, clash_radius=radius[clash],
        clash_res=info.atom_residue[clash].astype(np.int64), clash_sg=sg[clash], clash_pos=pos, clash_nbr=nbr,
        atom_res=info.atom_residue.astype(np.int64), backbone=prot & np.isin(info.atom_name, BACKBONE),
        protein=prot)


def _neighbours(a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """Bond partners (K, D) of K atoms from the bonds ``a``-``b`` (positions, -1: not among them)."""
    ok = (a >= 0) & (b >= 0)
    a, b = np.concatenate([a[ok], b[ok]]), np.concatenate([b[ok], a[ok]])
    order = np.argsort(a, kind="stable")
    a, b = a[order], b[order]
    deg = np.bincount(a, minlength=k)
    out = np.full((k, max(int(deg.max(initial=0)), 1)), -1, np.int64)
    col = np.arange(len(a)) - np.concatenate([[0], np.cumsum(deg)])[a]
    out[a, col] = b
    return out


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


@functools.lru_cache(maxsize=1)
def _link_table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Peptide-link parameters by kind (:data:`LINK_KINDS`): bond mean and tolerance (4,), angle means
    and tolerances (4, 4) in the order of ``_LINK_ANGLES`` (NaN mean: no such angle for that kind)."""
    p = stereo_params()
    bm = np.array([p["link_bond"][k][0] for k in LINK_KINDS])
    bt = np.array([TOLERANCE_SD * p["link_bond"][k][1] for k in LINK_KINDS])
    am = np.full((len(LINK_KINDS), len(_LINK_ANGLES)), np.nan)
    at = np.full_like(am, np.inf)
    for k, kind in enumerate(LINK_KINDS):
        for j, (name, _) in enumerate(_LINK_ANGLES):
            if name in p["link_angle"][kind]:
                am[k, j], at[k, j] = p["link_angle"][kind][name][0], TOLERANCE_SD * p["link_angle"][kind][name][1]
    return bm, bt, am, at


def _link_corners(lk: dict) -> np.ndarray:
    """The link angles' atoms, int64 (P, 4, 3) in the order of ``_LINK_ANGLES`` (-1: missing)."""
    return np.stack([np.stack([lk[w] for w in corners], axis=1) for _, corners in _LINK_ANGLES], axis=1)


def _feasible_range() -> tuple[float, float]:
    """Squared C-N distances between which a peptide bond exists (conop IsBondFeasible), Angstrom^2."""
    r = stereo_params()["radius"]["C"] + stereo_params()["radius"]["N"]
    return r * r * 0.0625, r * r * 0.0625 * 6.0


def _geometry_numpy(top: StereoTopology, x: np.ndarray) -> tuple:
    """The NumPy twin of :func:`_geometry_loop`: (bad template bonds (B,), bad template angles (A,),
    existing links (P,), bad link bonds (P,), bad link angles (P, 4)), bool."""
    b, a, lk = top.bonds, top.angles, top.links
    bad_b = np.abs(_norm(x[b[:, 0]] - x[b[:, 1]]) - top.bond_mean) > top.bond_tol
    bad_a = np.abs(_angle_deg(x, a[:, 0], a[:, 1], a[:, 2]) - top.angle_mean) > top.angle_tol
    c, n = lk["c"], lk["n"]
    v = x[c] - x[n]
    d2 = (v * v).sum(-1)
    lo2, hi2 = _feasible_range()
    exists = (d2 >= lo2) & (d2 <= hi2)
    kind = lk["kind"].copy()
    pro = np.flatnonzero(kind == 2)
    ok = (lk["ca_i"][pro] >= 0) & (lk["ca_j"][pro] >= 0)
    omega = np.zeros(len(pro))
    q = pro[ok]
    omega[ok] = _omega(x, lk["ca_i"][q], c[q], n[q], lk["ca_j"][q])
    kind[pro] = np.where(ok, np.where(np.abs(omega) < 1.57, 3, 2), -1)  # no omega: no parameters
    bm, bt, am, at = _link_table()
    has = exists & (kind >= 0)
    k = np.maximum(kind, 0)
    bad_lb = has & (np.abs(np.sqrt(d2) - bm[k]) > bt[k])
    corners = _link_corners(lk)
    bad_la = np.zeros((len(c), len(_LINK_ANGLES)), bool)
    for j in range(len(_LINK_ANGLES)):
        cj = corners[:, j]
        m = np.flatnonzero(has & (cj >= 0).all(axis=1) & ~np.isnan(am[k, j]))
        ang = _angle_deg(x, cj[m, 0], cj[m, 1], cj[m, 2])
        bad_la[m, j] = np.abs(ang - am[k[m], j]) > at[k[m], j]
    return bad_b, bad_a, exists, bad_lb, bad_la


def _angle_at(x, a, b, c):
    """:func:`_angle_deg` of one triple (compiled by numba with the loops below)."""
    u0, u1, u2 = x[a, 0] - x[b, 0], x[a, 1] - x[b, 1], x[a, 2] - x[b, 2]
    v0, v1, v2 = x[c, 0] - x[b, 0], x[c, 1] - x[b, 1], x[c, 2] - x[b, 2]
    cos = (u0 * v0 + u1 * v1 + u2 * v2) / (math.sqrt(u0 * u0 + u1 * u1 + u2 * u2)
                                           * math.sqrt(v0 * v0 + v1 * v1 + v2 * v2))
    return math.degrees(math.acos(min(max(cos, -1.0), 1.0)))


def _geometry_loop(x, bonds, bmean, btol, angles, amean, atol, links, kind0, corners, bm, bt, am, at, lo2, hi2):
    """:func:`_geometry_numpy` in one pass over bonds, angles and links (compiled by numba, ``_LOOPS``);
    ``links`` int64 (P, 4): c, n, ca_i, ca_j."""
    nb, na, npl = bonds.shape[0], angles.shape[0], links.shape[0]
    bad_b = np.zeros(nb, np.bool_)
    for k in range(nb):
        i, j = bonds[k, 0], bonds[k, 1]
        v0, v1, v2 = x[i, 0] - x[j, 0], x[i, 1] - x[j, 1], x[i, 2] - x[j, 2]
        bad_b[k] = abs(math.sqrt(v0 * v0 + v1 * v1 + v2 * v2) - bmean[k]) > btol[k]
    bad_a = np.zeros(na, np.bool_)
    for k in range(na):
        bad_a[k] = abs(_angle_at(x, angles[k, 0], angles[k, 1], angles[k, 2]) - amean[k]) > atol[k]
    exists = np.zeros(npl, np.bool_)
    bad_lb = np.zeros(npl, np.bool_)
    bad_la = np.zeros((npl, corners.shape[1]), np.bool_)
    for k in range(npl):
        c, n = links[k, 0], links[k, 1]
        v0, v1, v2 = x[c, 0] - x[n, 0], x[c, 1] - x[n, 1], x[c, 2] - x[n, 2]
        d2 = v0 * v0 + v1 * v1 + v2 * v2
        exists[k] = d2 >= lo2 and d2 <= hi2
        kind = kind0[k]
        if kind == 2:
            if links[k, 2] < 0 or links[k, 3] < 0:
                kind = -1
            elif abs(_dihedral(x, links[k, 2], c, n, links[k, 3])) < 1.57:
                kind = 3
        if not exists[k] or kind < 0:
            continue
        bad_lb[k] = abs(math.sqrt(d2) - bm[kind]) > bt[kind]
        for j in range(corners.shape[1]):
            a, b, e = corners[k, j, 0], corners[k, j, 1], corners[k, j, 2]
            if a >= 0 and b >= 0 and e >= 0 and not math.isnan(am[kind, j]):
                bad_la[k, j] = abs(_angle_at(x, a, b, e) - am[kind, j]) > at[kind, j]
    return bad_b, bad_a, exists, bad_lb, bad_la


def _dihedral(x, a, b, c, d):
    """:func:`_omega` of one quadruple (compiled by numba with the loops)."""
    b00, b01, b02 = x[a, 0] - x[b, 0], x[a, 1] - x[b, 1], x[a, 2] - x[b, 2]
    b10, b11, b12 = x[c, 0] - x[b, 0], x[c, 1] - x[b, 1], x[c, 2] - x[b, 2]
    b20, b21, b22 = x[d, 0] - x[c, 0], x[d, 1] - x[c, 1], x[d, 2] - x[c, 2]
    ln = math.sqrt(b10 * b10 + b11 * b11 + b12 * b12)
    n0, n1, n2 = b10 / ln, b11 / ln, b12 / ln
    p = b00 * n0 + b01 * n1 + b02 * n2
    v0, v1, v2 = b00 - p * n0, b01 - p * n1, b02 - p * n2
    q = b20 * n0 + b21 * n1 + b22 * n2
    w0, w1, w2 = b20 - q * n0, b21 - q * n1, b22 - q * n2
    c0, c1, c2 = n1 * v2 - n2 * v1, n2 * v0 - n0 * v2, n0 * v1 - n1 * v0
    return math.atan2(c0 * w0 + c1 * w1 + c2 * w2, v0 * w0 + v1 * w1 + v2 * w2)


#: The cell itself and its 13 following neighbours (dx, dy, dz) in lexicographic order: each pair of
#: neighbouring cells once.
_HALF_SHELL = np.array([(dx, dy, dz) for dx in (0, 1) for dy in (-1, 0, 1) for dz in (-1, 0, 1)
                        if (dx, dy, dz) >= (0, 0, 0)], dtype=np.int64)


def _clash_loop(xc, radius, res, sg, nbr, link, cutoff, edge, lo, dims):
    """Clashing pairs (i < j) of the clash atoms ``xc`` (K, 3), int64 (C,) each, by a cell list of edge
    ``edge`` (at least ``cutoff``, the largest clash distance, Angstrom;
    :func:`protgpu.scoring._fast.cell_sort`; compiled by numba, ``_LOOPS``): not bonded (``nbr`` (K, D)
    template neighbours, ``link`` (K,) the peptide-bond partner, -1 none), closer than their radii less
    the tolerance (two SG of different residues: the disulfide distance). Cell by cell, each cell
    against itself and its 13 following neighbours (every pair once; cheaper than atom by atom, where
    the many empty cells of a 2 A grid are visited 14 times per atom)."""
    nx, ny, nz = dims[0], dims[1], dims[2]
    _, start, order, xs = cell_sort(xc, lo, edge, dims)
    cut2 = cutoff * cutoff * (1.0 + 1e-9)  # a hair above: the exact test is on the distance below
    out = np.empty((16, 2), dtype=np.int64)
    k_out = 0
    for cx in range(nx):
        for cy in range(ny):
            for cz in range(nz):
                c = (cx * ny + cy) * nz + cz
                s0, s1 = start[c], start[c + 1]
                if s0 == s1:
                    continue
                for o in range(_HALF_SHELL.shape[0]):
                    ax, ay, az = cx + _HALF_SHELL[o, 0], cy + _HALF_SHELL[o, 1], cz + _HALF_SHELL[o, 2]
                    if ax >= nx or ay < 0 or ay >= ny or az < 0 or az >= nz:
                        continue
                    d_cell = (ax * ny + ay) * nz + az
                    t1 = start[d_cell + 1]
                    for p in range(s0, s1):
                        i = order[p]
                        for t in range(p + 1 if o == 0 else start[d_cell], t1):
                            v0, v1, v2 = xs[p, 0] - xs[t, 0], xs[p, 1] - xs[t, 1], xs[p, 2] - xs[t, 2]
                            d2 = v0 * v0 + v1 * v1 + v2 * v2
                            if d2 >= cut2:  # beyond every clash distance (most pairs)
                                continue
                            j = order[t]
                            thr = radius[i] + radius[j] - CLASH_TOLERANCE
                            if sg[i] and sg[j] and res[i] != res[j]:
                                thr = DISULFIDE_CLASH
                            if math.sqrt(d2) < thr and link[i] != j and link[j] != i and not _bonded(nbr, i, j):
                                out = _append(out, k_out, min(i, j), max(i, j))
                                k_out += 1
    return out[:k_out, 0].copy(), out[:k_out, 1].copy()


def _bonded(nbr, i, j):
    """Whether ``j`` is among the template bond partners ``nbr[i]`` (compiled with the loops)."""
    for m in range(nbr.shape[1]):
        if nbr[i, m] == j:
            return True
    return False


def _append(out, k, i, j):
    """``out`` (cap, 2) with row ``k`` set to (i, j), doubled first when full (compiled with the loops)."""
    if k == out.shape[0]:
        grown = np.empty((2 * k, 2), dtype=np.int64)
        grown[:k] = out[:k]
        out = grown
    out[k, 0] = i
    out[k, 1] = j
    return out


def _make_loops():
    from ..scoring._fast import Loops

    loops = Loops(globals())
    # (cell_sort and _bounds, compiled in their own modules, are compiled here too: numba takes a
    # callee from this module's globals)
    for fn in (cell_sort, _bounds, _angle_at, _dihedral, _geometry_loop, _clash_loop, _bonded, _append):
        loops.jit(fn)
    return loops


_LOOPS = _make_loops()


def stereo_problems(s, x: np.ndarray | None = None, topology: StereoTopology | None = None,
                    compiled: bool | None = None) -> dict:
    """The stereochemical problems of one model frame (see the module doc).

    Parameters
    ----------
    s : Structure
        The (cleaned) structure; its first frame unless ``x`` is given.
    x : np.ndarray, shape (N, 3), optional
        Coordinates, Angstrom.
    topology : StereoTopology, optional
        ``s``'s, when the caller keeps it (else :func:`stereo_topology`).
    compiled : bool, optional
        The compiled loops (numba) or the NumPy twin; default: compiled when numba is enabled.

    Returns
    -------
    dict
        ``bad_bonds`` int64 (K, 2), ``bad_angles`` int64 (K, 3), ``clashes`` int64 (K, 2): atom indices.
    """
    from ..scoring import _fast

    top = topology if topology is not None else stereo_topology(s)
    x = np.ascontiguousarray(s.coords[0] if x is None else x, dtype=np.float64)
    lk = top.links
    if compiled is None:
        compiled = _fast.enabled()
    if compiled:
        _LOOPS.compile()
        bad_b, bad_a, exists, bad_lb, bad_la = _geometry_loop(
            x, top.bonds, top.bond_mean, top.bond_tol, top.angles, top.angle_mean, top.angle_tol,
            top.link_atoms, lk["kind"], top.link_corners, *_link_table(), *_feasible_range())
    else:
        bad_b, bad_a, exists, bad_lb, bad_la = _geometry_numpy(top, x)
    corners = top.link_corners
    rows, cols = np.nonzero(bad_la)
    bonds = np.concatenate([top.bonds[bad_b], np.stack([lk["c"][bad_lb], lk["n"][bad_lb]], axis=1)])
    angles = np.concatenate([top.angles[bad_a], corners[rows, cols]])
    return {"bad_bonds": bonds.astype(np.int64), "bad_angles": angles.astype(np.int64),
            "clashes": _clashes(top, x, lk["c"][exists], lk["n"][exists], compiled)}


def _clashes(top: StereoTopology, x: np.ndarray, link_c: np.ndarray, link_n: np.ndarray,
             compiled: bool = False) -> np.ndarray:
    """Clashing atom pairs (i < j), int64 (K, 2): not bonded (template bonds, the existing peptide
    bonds ``link_c``-``link_n``), closer than their radii less :data:`CLASH_TOLERANCE`; by
    :func:`_clash_loop` (``compiled``, where the cell grid is not too sparse) or the NumPy-and-scipy
    twin below."""
    from ._contacts import clash_candidates

    ca = top.clash_atoms
    if len(ca) < 2:
        return np.zeros((0, 2), np.int64)
    xc = np.ascontiguousarray(x[ca])
    cutoff = 2.0 * float(top.clash_radius.max()) - CLASH_TOLERANCE
    k = len(ca)
    if compiled:
        from ..scoring._fast import cell_grid

        lo, hi = _bounds(xc)
        # cells of the cutoff (the 27 around an atom hold its partners; measured fastest), grown until
        # the grid is no sparser than the atoms allow
        edge, dims = cutoff, None
        for _ in range(4):
            dims = cell_grid(lo, hi, k, edge)
            if dims is not None:
                break
            edge *= 2.0
        if dims is not None:
            link = np.full(k, -1, np.int64)
            pc, pn = top.clash_pos[link_c], top.clash_pos[link_n]
            ok = (pc >= 0) & (pn >= 0)
            link[pc[ok]] = pn[ok]
            i, j = _clash_loop(xc, top.clash_radius, top.clash_res, top.clash_sg, top.clash_nbr, link,
                               cutoff, edge, lo, dims)
            order = np.lexsort((j, i))
            return np.stack([ca[i[order]], ca[j[order]]], axis=1).astype(np.int64)
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
    out = np.stack([lo[~bonded], hi[~bonded]], axis=1).astype(np.int64)
    return out[np.lexsort((out[:, 1], out[:, 0]))]


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

