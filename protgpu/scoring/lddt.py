"""lDDT, the local distance difference test (Mariani et al. 2013), with OpenStructure's conventions.

Definition (SCORING.md): the reference decides which atom pairs count - atoms of different residues
closer than the inclusion radius in the reference (strictly closer within a chain; up to and including
the radius between chains, as OpenStructure's lDDTScorer). A pair is conserved at threshold t when
|d_model - d_ref| <= t. Global lDDT = conserved / (thresholds x pairs); per-residue lDDT is the same
ratio over the pairs with an atom in the residue. Atoms the model lacks keep their pairs in the
denominator and are never conserved. Symmetric side chains (ASP, GLU, LEU, VAL, ARG, PHE, TYR) have
their model names swapped, residue by residue, when that strictly raises the conserved count over the
distances from the symmetric atoms to every non-symmetric partner (OpenStructure's
``_ResolveSymmetries``); ``symmetry=False`` skips that and reproduces ``biotite.structure.lddt``.

Three layers: :func:`lddt` (inputs, mapping, backend), :func:`lddt_counts_numpy` (the NumPy twin) and
:func:`lddt_counts_cuda` (``kernels/lddt.cu``: one warp per (model, residue)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._array import dispatch, to_numpy
from .._autograd import refuse_grad, refuse_grad_of
from .._inputs import source_name
from ..errors import InputError
from ..structure import Structure
from . import _batch, _fast
from . import _mapping as mp
from . import _smooth_lddt as sl

# The layers under lddt() (lddt_inputs, lddt_reference, lddt_counts_numpy / lddt_counts_cuda,
# resolve_symmetry_numpy, lddt_scores, LDDTReference) stay importable by name for tests and
# benchmarks but are not public API.
__all__ = ["lddt", "lddt_residue_labels"]

_MAX_THRESHOLDS = 8


@dataclass
class LDDTReference:
    """Everything about the reference that lDDT needs, computed once per call (host arrays).

    Attributes
    ----------
    n_atoms : int
        Scored reference atoms N (model coordinates are laid out on these).
    atom_res : np.ndarray of int64, shape (N,)
        Residue (0..R-1, non-decreasing) of each scored atom.
    n_res : int
        Residues R of the per-residue output: the reference's polymer residues.
    labels : list of str
        ``"chain:resid[icode]"`` of each output residue.
    pairs : np.ndarray of int64, shape (P, 2)
        Unordered pairs (i < j) of scored atoms within the inclusion radius, different residues.
    dref : np.ndarray of float64, shape (P,)
        Their reference distances, Angstrom.
    n_exp : np.ndarray of int64, shape (R,)
        Pairs touching each residue (a pair within one residue would count twice; there are none).
    tuples : np.ndarray of int64, shape (K, 2)
        Symmetric atom pairs (scored-atom slots), e.g. OD1/OD2 of one ASP.
    tuple_group : np.ndarray of int64, shape (K,)
        Residue group (0..G-1) of each tuple; a group's tuples swap together.
    n_groups : int
    ent_atom, ent_swap, ent_partner : np.ndarray of int64, shape (E,)
        Symmetry test entries, sorted by group: symmetric atom, its tuple partner, and a
        non-symmetric atom within the inclusion radius of the symmetric atom.
    ent_dref : np.ndarray of float64, shape (E,)
    ent_group : np.ndarray of int64, shape (E,)
    """

    n_atoms: int
    atom_res: np.ndarray
    n_res: int
    labels: list
    pairs: np.ndarray
    dref: np.ndarray
    n_exp: np.ndarray
    tuples: np.ndarray
    tuple_group: np.ndarray
    n_groups: int
    ent_atom: np.ndarray
    ent_swap: np.ndarray
    ent_partner: np.ndarray
    ent_dref: np.ndarray
    ent_group: np.ndarray
    _device: dict = field(default_factory=dict, repr=False)


def _pairs_within(y: np.ndarray, radius: float) -> np.ndarray:
    """Unordered pairs (i < j) with |y_i - y_j| <= radius, sorted."""
    if _fast.enabled():  # a compiled cell list: the k-d tree and the sort were most of a one-model call
        pairs = _fast.pairs_within(y, radius)
        if pairs is not None:
            return pairs
    from scipy.spatial import cKDTree

    pairs = cKDTree(y).query_pairs(radius, output_type="ndarray").astype(np.int64)
    if pairs.size == 0:
        return pairs.reshape(0, 2)
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    return pairs[order]


def lddt_reference(y: np.ndarray, atom_res: np.ndarray, atom_chain: np.ndarray, n_res: int, labels: list, *,
                   inclusion_radius: float = 15.0, names: np.ndarray | None = None,
                   resnames: np.ndarray | None = None) -> LDDTReference:
    """Build the :class:`LDDTReference` from the scored reference atoms.

    Parameters
    ----------
    y : np.ndarray, shape (N, 3)
        Reference coordinates of the scored atoms, Angstrom (used in float64).
    atom_res : np.ndarray of int, shape (N,)
        Residue of each atom, 0..n_res-1, non-decreasing.
    atom_chain : np.ndarray of str, shape (N,)
        Chain of each atom (the radius is inclusive between chains, exclusive within one).
    n_res : int
    labels : list of str
    inclusion_radius : float
        Angstrom.
    names, resnames : np.ndarray of str, shape (N,), optional
        Atom names and standard residue names; without them no symmetry is resolved.
    """
    y = np.asarray(y, dtype=np.float64)
    atom_res = np.asarray(atom_res, dtype=np.int64)
    got = _fast.reference_pairs(y, inclusion_radius, atom_res, atom_chain) if _fast.enabled() else None
    if got is None:
        pairs = _pairs_within(y, inclusion_radius)
        d = np.sqrt(((y[pairs[:, 0]] - y[pairs[:, 1]]) ** 2).sum(axis=1))
        keep = (atom_res[pairs[:, 0]] != atom_res[pairs[:, 1]]) & (
            (d < inclusion_radius) | (atom_chain[pairs[:, 0]] != atom_chain[pairs[:, 1]]))
        pairs, d = pairs[keep], d[keep]
    else:  # the same pairs and distances, compiled (a third of a one-model call otherwise)
        pairs, d = got
    n_exp = np.bincount(atom_res[pairs[:, 0]], minlength=n_res) + np.bincount(atom_res[pairs[:, 1]], minlength=n_res)
    n = len(y)
    tuples = np.zeros((0, 2), np.int64)
    tuple_group = np.zeros(0, np.int64)
    symset = np.zeros(n, dtype=bool)
    if names is not None and resnames is not None:
        found = []
        for resname, tups in mp.SYMMETRIC_ATOMS.items():
            in_res = resnames == resname
            if not in_res.any():
                continue
            for a_name, b_name in tups:
                sa = np.flatnonzero(in_res & (names == a_name))
                sb = np.flatnonzero(in_res & (names == b_name))
                # OpenStructure excludes every symmetric atom the reference has from the partners,
                # even one whose twin is missing
                symset[sa] = True
                symset[sb] = True
                common, ia, ib = np.intersect1d(atom_res[sa], atom_res[sb], return_indices=True)
                found.append(np.stack([sa[ia], sb[ib]], axis=1))
        if found:
            tuples = np.concatenate(found)
            tuples = tuples[np.argsort(tuples[:, 0], kind="stable")]
            _, tuple_group = np.unique(atom_res[tuples[:, 0]], return_inverse=True)
            tuple_group = tuple_group.astype(np.int64)
    n_groups = int(tuple_group.max()) + 1 if tuple_group.size else 0
    swap_of = np.full(n, -1, dtype=np.int64)
    group_of = np.full(n, -1, dtype=np.int64)
    if tuples.size:
        swap_of[tuples[:, 0]], swap_of[tuples[:, 1]] = tuples[:, 1], tuples[:, 0]
        group_of[tuples[:, 0]] = group_of[tuples[:, 1]] = tuple_group
    # both orientations of each pair: (symmetric atom, non-symmetric partner); sorted below
    fwd = (swap_of[pairs[:, 0]] >= 0) & ~symset[pairs[:, 1]]
    rev = (swap_of[pairs[:, 1]] >= 0) & ~symset[pairs[:, 0]]
    ent_atom = np.concatenate([pairs[fwd, 0], pairs[rev, 1]])
    ent_partner = np.concatenate([pairs[fwd, 1], pairs[rev, 0]])
    ent_dref = np.concatenate([d[fwd], d[rev]])
    ent_group = group_of[ent_atom]
    order = np.lexsort((ent_partner, ent_atom, ent_group))
    return LDDTReference(
        n_atoms=n, atom_res=atom_res, n_res=int(n_res), labels=list(labels), pairs=pairs, dref=d,
        n_exp=n_exp.astype(np.int64), tuples=tuples, tuple_group=tuple_group, n_groups=n_groups,
        ent_atom=ent_atom[order], ent_swap=swap_of[ent_atom[order]], ent_partner=ent_partner[order],
        ent_dref=ent_dref[order], ent_group=ent_group[order],
    )


def _structure_reference(ref_s: Structure, atoms: str, inclusion_radius: float):
    info = mp.residue_info(ref_s)
    ref_atoms = mp.lddt_reference_atoms(info, ref_s, atoms)
    if ref_atoms.size == 0:
        raise InputError(f"{source_name(ref_s, 'reference')}: no atoms to score with atoms={atoms!r}")
    poly = np.flatnonzero(info.polymer)
    pos = np.full(len(info.resid), -1, dtype=np.int64)
    pos[poly] = np.arange(len(poly))
    res = ref_s.residues
    labels = [f"{c}:{r}{i}" for c, r, i in zip(info.chain[poly].tolist(), res.resid[poly].tolist(),
                                                 res.icode[poly].tolist(), strict=True)]
    ref_res = info.atom_residue[ref_atoms]
    ref = lddt_reference(ref_s.coords[0, ref_atoms], pos[ref_res], info.chain[ref_res], len(poly), labels,
                         inclusion_radius=inclusion_radius, names=info.atom_name[ref_atoms],
                         resnames=info.std_resname[ref_res])
    return ref, info, ref_atoms


# --------------------------------------------------------------------------------------------------
# NumPy twin


def _conserved(dm, dref, thresholds) -> np.ndarray:
    dev = np.abs(dm - dref)  # NaN (missing atom) fails every comparison
    c = np.zeros(dev.shape, dtype=np.int32)
    for t in thresholds:
        c += dev <= t
    return c


def _dist(x, a, b):
    diff = x[:, a] - x[:, b]
    return np.sqrt((diff * diff).sum(axis=-1))


def resolve_symmetry_numpy(coords: np.ndarray, ref: LDDTReference, thresholds) -> np.ndarray:
    """Swap symmetric side-chain atoms in place where that conserves strictly more (see module doc).

    Parameters
    ----------
    coords : np.ndarray, shape (M, N, 3)
        Model coordinates on the reference's scored atoms (NaN: missing); modified in place.
    ref : LDDTReference
    thresholds : sequence of float

    Returns
    -------
    np.ndarray of bool, shape (M, G)
        Which residue groups were swapped.
    """
    m_total = coords.shape[0]
    g = ref.n_groups
    if g == 0:
        return np.zeros((m_total, 0), dtype=bool)
    th = np.asarray(thresholds, dtype=coords.dtype)
    dref = ref.ent_dref.astype(coords.dtype)
    valid = ~np.isnan(coords[:, ref.ent_atom, 0]) & ~np.isnan(coords[:, ref.ent_swap, 0])
    c1 = _conserved(_dist(coords, ref.ent_atom, ref.ent_partner), dref, th) * valid
    c2 = _conserved(_dist(coords, ref.ent_swap, ref.ent_partner), dref, th) * valid
    flat = (np.arange(m_total)[:, None] * g + ref.ent_group[None, :]).ravel()
    s1 = np.bincount(flat, c1.ravel(), m_total * g).reshape(m_total, g)
    s2 = np.bincount(flat, c2.ravel(), m_total * g).reshape(m_total, g)
    swap = s2 > s1
    a, b = ref.tuples[:, 0], ref.tuples[:, 1]
    tv = ~np.isnan(coords[:, a, 0]) & ~np.isnan(coords[:, b, 0])
    mm, kk = np.nonzero(swap[:, ref.tuple_group] & tv)
    xa = coords[mm, a[kk]].copy()
    coords[mm, a[kk]] = coords[mm, b[kk]]
    coords[mm, b[kk]] = xa
    return swap


def lddt_counts_numpy(coords, ref: LDDTReference, thresholds=(0.5, 1.0, 2.0, 4.0), symmetry: bool = True,
                      *, max_elements: int = 2**24) -> np.ndarray:
    """Conserved-pair counts per (model, residue), the NumPy twin of the lDDT kernels.

    Parameters
    ----------
    coords : array_like, shape (M, N, 3)
        Model coordinates on the reference's scored atoms, NaN where missing, Angstrom. The arithmetic
        runs in this array's precision (float32 or float64).
    ref : LDDTReference
    thresholds : sequence of float
        Angstrom.
    symmetry : bool
        Resolve symmetric side chains first.
    max_elements : int
        Models are processed in chunks of about this many (model, pair) distances.

    Returns
    -------
    np.ndarray of int64, shape (M, R)
        Sum over the pairs touching each residue of the thresholds it passes; -1 for residues of which
        the model has no scored atom.
    """
    coords = np.asarray(coords)
    if coords.dtype not in (np.float32, np.float64):
        coords = coords.astype(np.float64)
    m_total, r = coords.shape[0], ref.n_res
    th = np.asarray(thresholds, dtype=coords.dtype)
    dref = ref.dref.astype(coords.dtype)
    i, j = ref.pairs[:, 0], ref.pairs[:, 1]
    ri, rj = ref.atom_res[i], ref.atom_res[j]
    out = np.zeros((m_total, r), dtype=np.int64)
    step = max(1, max_elements // max(1, len(dref)))
    for m0 in range(0, m_total, step):
        x = coords[m0:m0 + step].copy()
        mc = x.shape[0]
        if symmetry:
            resolve_symmetry_numpy(x, ref, th)
        c = _conserved(_dist(x, i, j), dref, th)
        base = (np.arange(mc) * r)[:, None]
        out[m0:m0 + mc] = (np.bincount((base + ri[None]).ravel(), c.ravel(), mc * r)
                           + np.bincount((base + rj[None]).ravel(), c.ravel(), mc * r)).reshape(mc, r)
        here = np.zeros((mc, r), dtype=bool)
        atom_here = ~np.isnan(x[:, :, 0])
        mm, aa = np.nonzero(atom_here)
        here[mm, ref.atom_res[aa]] = True
        out[m0:m0 + mc][~here] = -1
    return out


# --------------------------------------------------------------------------------------------------
# CUDA path


_WARPS = 8
_SMEM_LIMIT = 48 * 1024  # stage a model's coordinates in shared memory up to this (0: never)


def _device_arrays(ref: LDDTReference, dtype):
    """The reference's pair lists on the device, as the kernels read them (cached on ``ref``)."""
    key = np.dtype(dtype).str
    if key in ref._device:
        return ref._device[key]
    import cupy as cp

    n_pairs = len(ref.dref)
    if 2 * n_pairs >= 2**31 or ref.n_atoms >= 2**31 // 3:
        raise InputError("the reference is too large for the lDDT kernels (more than 2^31 ordered pairs)")
    # ordered pairs grouped by the residue of their first atom (CSR), each pair seen from both ends
    op = np.concatenate([ref.pairs, ref.pairs[:, ::-1]])
    od = np.concatenate([ref.dref, ref.dref])
    order = np.lexsort((op[:, 1], op[:, 0]))
    op, od = op[order], od[order]
    res_ptr = np.searchsorted(ref.atom_res[op[:, 0]], np.arange(ref.n_res + 1)).astype(np.int32)
    res_atom_ptr = np.searchsorted(ref.atom_res, np.arange(ref.n_res + 1)).astype(np.int32)
    grp_ptr = np.searchsorted(ref.ent_group, np.arange(ref.n_groups + 1)).astype(np.int32)
    tup_order = np.argsort(ref.tuple_group, kind="stable")
    tup_ptr = np.searchsorted(ref.tuple_group[tup_order], np.arange(ref.n_groups + 1)).astype(np.int32)
    i32 = lambda a: cp.asarray(np.ascontiguousarray(a), dtype=cp.int32)  # noqa: E731
    dev = {
        "res_ptr": cp.asarray(res_ptr), "res_atom_ptr": cp.asarray(res_atom_ptr),
        "pair_a": i32(op[:, 0]), "pair_b": i32(op[:, 1]), "dref": cp.asarray(od, dtype=dtype),
        "grp_ptr": cp.asarray(grp_ptr), "ent_atom": i32(ref.ent_atom), "ent_swap": i32(ref.ent_swap),
        "ent_partner": i32(ref.ent_partner), "ent_dref": cp.asarray(ref.ent_dref, dtype=dtype),
        "tup_ptr": cp.asarray(tup_ptr), "tup_a": i32(ref.tuples[tup_order, 0]),
        "tup_b": i32(ref.tuples[tup_order, 1]),
    }
    ref._device[key] = dev
    return dev


def lddt_counts_cuda(coords, ref: LDDTReference, thresholds=(0.5, 1.0, 2.0, 4.0), symmetry: bool = True):
    """The conserved-pair counts of :func:`lddt_counts_numpy`, on the GPU (``kernels/lddt.cu``).

    ``coords`` is a CuPy float32/float64 array of shape (M, N, 3) (not modified); returns a CuPy int32
    array of shape (M, R). Models are processed in chunks under the device memory budget.
    """
    import cupy as cp

    from .._cuda import get_kernel, launch
    from .._memory import device_budget_bytes, rows_per_chunk

    dtype = np.dtype(coords.dtype)
    if dtype not in (np.float32, np.float64):
        raise InputError(f"coordinates must be float32 or float64, got {dtype}")
    if len(thresholds) > _MAX_THRESHOLDS:
        raise InputError(f"at most {_MAX_THRESHOLDS} thresholds, got {len(thresholds)}")
    suffix = "f32" if dtype == np.float32 else "f64"
    dev = _device_arrays(ref, dtype)
    th = cp.asarray(np.asarray(thresholds, dtype=dtype))
    m_total, n, r = coords.shape[0], ref.n_atoms, ref.n_res
    out = cp.empty((m_total, r), dtype=cp.int32)
    smem = 3 * n * dtype.itemsize
    use_smem = smem <= _SMEM_LIMIT
    sm_count = cp.cuda.Device().attributes["MultiProcessorCount"]
    k_pairs = get_kernel("lddt", f"lddt_pairs_{suffix}", defines={"LDDT_WARPS": _WARPS})
    do_sym = symmetry and ref.n_groups > 0
    if do_sym:
        k_sym = get_kernel("lddt", f"lddt_symmetry_{suffix}", defines={"LDDT_WARPS": _WARPS})
    step = rows_per_chunk(3 * n * dtype.itemsize + 4 * r, m_total, device_budget_bytes())
    for m0 in range(0, m_total, step):
        m1 = min(m_total, m0 + step)
        mc = m1 - m0
        x = coords[m0:m1]
        if do_sym:
            x = cp.array(x, dtype=dtype, order="C", copy=True)  # the symmetry kernel swaps in place
            launch(k_sym, (mc, -(-ref.n_groups // _WARPS)), (_WARPS * 32,), x, dev["grp_ptr"], dev["ent_atom"],
                   dev["ent_swap"], dev["ent_partner"], dev["ent_dref"], dev["tup_ptr"], dev["tup_a"], dev["tup_b"],
                   th, np.int32(len(thresholds)), np.int32(ref.n_groups), np.int32(n), None)
        else:
            x = cp.ascontiguousarray(x, dtype=dtype)
        tiles = int(max(1, min(-(-r // _WARPS), -(-4 * sm_count // mc), 65535)))
        launch(k_pairs, (mc, tiles), (_WARPS * 32,), x, dev["res_ptr"], dev["res_atom_ptr"], dev["pair_a"],
               dev["pair_b"], dev["dref"], th, np.int32(len(thresholds)), np.int32(r), np.int32(n),
               np.int32(1 if use_smem else 0), out[m0:m1], shared_mem=smem if use_smem else 0)
    return out


def lddt_scores(counts, ref: LDDTReference, n_thresholds: int, xp=np):
    """Global and per-residue lDDT from conserved counts.

    Parameters
    ----------
    counts : array, shape (M, R)
        From :func:`lddt_counts_numpy` / :func:`lddt_counts_cuda` (-1: residue absent).
    ref : LDDTReference
    n_thresholds : int
    xp : module
        numpy or cupy (the module ``counts`` lives in).

    Returns
    -------
    global_ : array of float64, shape (M,)
        NaN when the reference has no pair at all.
    per_residue : array of float64, shape (M, R)
        NaN for residues absent from the model and residues without any pair.
    """
    counts = xp.asarray(counts)
    n_exp = xp.asarray(ref.n_exp, dtype=xp.float64)
    total = float(ref.n_exp.sum())
    kept = xp.maximum(counts, 0).astype(xp.float64)
    glob = kept.sum(axis=1) / (n_thresholds * total) if total > 0 else xp.full(counts.shape[0], xp.nan)
    ok = (counts >= 0) & (n_exp[None, :] > 0)
    per = xp.where(ok, kept / (n_thresholds * xp.maximum(n_exp, 1.0))[None, :], xp.nan)
    return glob, per


# --------------------------------------------------------------------------------------------------
# Public function


def lddt(models, reference, *, atoms: str = "heavy", per_residue: bool = False, inclusion_radius: float = 15.0,
         thresholds=(0.5, 1.0, 2.0, 4.0), symmetry: bool = True, mapping="resnum", device: str = "auto",
         smooth: bool = False, temperature: float = 1.0):
    """lDDT of models against a reference (OpenStructure's conventions; biotite's with symmetry=False).

    Parameters
    ----------
    models : Structure, path, array_like, or list of these
        One model or many: a Structure (every frame a model), a PDB/mmCIF path, coordinates (NumPy,
        CuPy or torch) of shape (N, 3) or (M, N, 3), or a list of these (files of different lengths and
        numbering). With a reference Structure, arrays must hold all of its atoms in its order; with an
        array reference, arrays are matched atom by atom and every atom is its own residue.
    reference : Structure, path or array_like
        The reference (one frame); it decides which pairs count.
    atoms : {"heavy", "ca"}
        Score all heavy atoms of the reference's polymer residues, or only their CA atoms.
    per_residue : bool
        Also return per-residue lDDT.
    inclusion_radius : float
        Reference distance below which a pair counts, Angstrom.
    thresholds : sequence of float
        Distance-difference thresholds, Angstrom (at most 8).
    symmetry : bool
        Resolve symmetric side-chain atom names (OpenStructure). False reproduces biotite.
    mapping : {"resnum", "sequence"} or array_like
        How model residues are matched to the reference's (see :func:`protgpu.scoring.tm_score`).
        Atoms match by name within matched residues (CHARMM/GROMOS names are translated).
    device : {"auto", "cpu", "gpu"}
    smooth : bool
        The smooth lDDT (AlphaFold 3's training loss, Abramson et al. 2024, supplement Algorithm 27):
        each test ``|d_model - d_ref| <= t`` becomes ``sigmoid((t - |d_model - d_ref|) / temperature)``,
        averaged over the thresholds and the pairs (per residue: the pairs touching it) exactly as the
        counts are. Differentiable with respect to ``models`` when it is one torch tensor that requires
        grad (not with respect to ``reference``). Symmetric side chains are swapped as the exact lDDT
        swaps them. As ``temperature`` -> 0 the value tends to the exact lDDT (a pair exactly at a
        threshold counts 1/2). The default ``smooth=False`` is the exact, non-differentiable lDDT.
    temperature : float
        T of the sigmoids, Angstrom (AlphaFold 3 uses 1; only with ``smooth=True``). At T = 1 even a
        perfect model scores about 0.80: the loss is 1 - smooth lDDT, its optimum is the reference.

    Returns
    -------
    lddt : float64 array of shape (M,), or a float for one model
    per_residue : float64 array of shape (M, R) (or (R,)), only with ``per_residue=True``
        R: the reference's polymer residues in file order (labels: :func:`lddt_residue_labels`). NaN for
        residues absent from the model and residues with no pair.

    With ``smooth=True`` and one torch tensor of models, the results are torch tensors of its dtype (a
    0-d tensor for one model), with a ``grad_fn`` when it requires grad; otherwise as above.

    Raises
    ------
    InputError
        A model with no residue in common with the reference (named), unmatched chains, bad options.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.cumsum(np.random.default_rng(0).normal(size=(50, 3)) * 2.2, axis=0)
    >>> float(lddt(x, x, device="cpu"))
    1.0
    """
    if atoms not in ("heavy", "ca"):
        raise InputError(f"atoms must be 'heavy' or 'ca', not {atoms!r}")
    thresholds = tuple(float(t) for t in thresholds)
    if not thresholds or len(thresholds) > _MAX_THRESHOLDS or min(thresholds) < 0:
        raise InputError(f"thresholds: 1 to {_MAX_THRESHOLDS} non-negative distances, got {thresholds}")
    if not inclusion_radius > 0:
        raise InputError(f"inclusion_radius must be positive, got {inclusion_radius}")
    if smooth:
        return _lddt_smooth(models, reference, atoms, per_residue, inclusion_radius, thresholds, symmetry, mapping,
                            device, temperature)
    refuse_grad("pg.lddt (smooth=False)", models, reference)
    items = models if isinstance(models, (list, tuple)) else [models]
    be = dispatch(*items, reference, device=device)
    ref, batch, single, _ = _prepare(models, reference, atoms, inclusion_radius, mapping, be,
                                     _batch.work_dtype(models, reference))
    if be.on_gpu:
        counts = lddt_counts_cuda(batch.coords, ref, thresholds, symmetry)
    elif _fast.enabled():  # compiled twin of lddt_counts_numpy (docs/design/cpu-speed.md)
        counts = _fast.lddt_counts(batch.coords.astype(np.float64), ref, thresholds, symmetry)
    else:
        counts = lddt_counts_numpy(batch.coords.astype(np.float64), ref, thresholds, symmetry)
    glob, per = lddt_scores(counts, ref, len(thresholds), be.xp)
    glob, per = be.wrap((glob, per))
    if single:
        glob, per = _batch.first_model(glob), per[0]
    return (glob, per) if per_residue else glob


def lddt_inputs(models, reference, *, atoms: str = "heavy", inclusion_radius: float = 15.0, mapping="resnum",
                dtype=np.float64):
    """The reference pair data and the models' coordinates on its atoms, as :func:`lddt` prepares them.

    For tests, benchmarks and callers that score the same inputs repeatedly with
    :func:`lddt_counts_numpy` / :func:`lddt_counts_cuda`.

    Returns
    -------
    ref : LDDTReference
    coords : np.ndarray, shape (M, N, 3), ``dtype``
        NaN where a model lacks an atom.
    names : list of str
    """
    ref, batch, _, _ = _prepare(models, reference, atoms, inclusion_radius, mapping, dispatch(device="cpu"),
                                np.dtype(dtype))
    return ref, batch.coords, batch.names


def _prepare(models, reference, atoms, inclusion_radius, mapping, be, dtype):
    if atoms not in ("heavy", "ca"):
        raise InputError(f"atoms must be 'heavy' or 'ca', not {atoms!r}")
    ref_s, ref_arr = _batch.reference_of(reference)
    if ref_s is None:
        y = np.asarray(to_numpy(ref_arr), dtype=np.float64)
        n = len(y)
        ref = lddt_reference(y, np.arange(n), np.zeros(n, dtype="<U1"), n, [str(i) for i in range(n)],
                             inclusion_radius=inclusion_radius)
        info, ref_atoms = None, np.arange(n)
    else:
        ref, info, ref_atoms = _structure_reference(ref_s, atoms, inclusion_radius)
    groups, single = _batch.collect_models(models, ref_s)
    batch = _batch.atom_batch(groups, ref_s, info, ref_atoms, mapping, be, dtype)
    return ref, batch, single, (ref_s, info, ref_atoms)


def _lddt_smooth(models, reference, atoms, per_residue, inclusion_radius, thresholds, symmetry, mapping, device,
                 temperature):
    """:func:`lddt` with ``smooth=True`` (see :mod:`._smooth_lddt`)."""
    temperature = sl.check_temperature(temperature)
    refuse_grad_of("pg.lddt", "reference", reference)
    items = models if isinstance(models, (list, tuple)) else [models]
    be = dispatch(*items, reference, device=device)
    ref, batch, single, (ref_s, info, ref_atoms) = _prepare(models, reference, atoms, inclusion_radius, mapping, be,
                                                            _batch.work_dtype(models, reference))
    torch_in = be.kind.startswith("torch") and not isinstance(models, (list, tuple))
    if torch_in:  # the caller's tensor, graph kept, on the scored atoms
        x = sl.torch_layout(models, ref_s, ref_atoms, info, mapping)
        if not x.is_floating_point():
            x = x.double()
    else:
        x = batch.coords if be.on_gpu else batch.coords.astype(np.float64)
    if symmetry and ref.n_groups:
        x = sl.gather_atoms(x, sl.symmetry_permutation(batch.coords, ref, thresholds))
    glob, per = sl.smooth_scores(x, ref, thresholds, temperature)
    if torch_in:
        if single:
            glob, per = glob[0], per[0]
    else:
        glob, per = be.wrap((glob, per))
        if single:
            glob, per = _batch.first_model(glob), per[0]
    return (glob, per) if per_residue else glob


def lddt_residue_labels(reference) -> list[str]:
    """Labels ``"chain:resid[icode]"`` of the residues of :func:`lddt`'s per-residue output.

    Examples
    --------
    >>> labels = lddt_residue_labels("datasets/adk_open.pdb")
    >>> len(labels), labels[:3]
    (214, ['4AKE:1', '4AKE:2', '4AKE:3'])
    """
    ref_s, ref_arr = _batch.reference_of(reference)
    if ref_s is None:
        return [str(i) for i in range(ref_arr.shape[0])]
    info = mp.residue_info(ref_s)
    poly = np.flatnonzero(info.polymer)
    res = ref_s.residues
    return [f"{c}:{r}{i}" for c, r, i in zip(info.chain[poly].tolist(), res.resid[poly].tolist(),
                                             res.icode[poly].tolist(), strict=True)]
