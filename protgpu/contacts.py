"""Residue contact maps, contact frequencies and fractions of native contacts.

Three layers, as everywhere in protgpu: :func:`contacts` (validates, builds the per-scheme atom lists,
picks the backend, converts back), :func:`residue_distances_numpy` (the NumPy twin: the specification
and the CPU path) and the CUDA path (``kernels/contacts.cu``), which computes every residue pair's
minimum over atom pairs in one fused pass without forming the (atoms x atoms) matrix.

Conventions (mdtraj's ``compute_contacts`` where it has one):

* Residue distance schemes, as ``mdtraj.compute_contacts`` defines them:

  ``"ca"``
      distance between the two CA atoms (a residue with no CA has no distance: +inf).
  ``"closest"``
      minimum over all atom pairs, hydrogens included.
  ``"closest-heavy"``
      minimum over pairs of non-hydrogen atoms (element not H or D).
  ``"sidechain"``
      minimum over side-chain atoms: every atom of an amino acid except N, CA, C, O, H and HA, as
      mdtraj's ``Atom.is_sidechain`` says after its PDB reader has renamed aliases (HN, H1, 1H, HN1,
      HT1 are H; O1, OT1, OCT1, OC1 are O). So OXT, the N-terminal H2/H3 and glycine's HA2/HA3 count
      as side chain, as in mdtraj.
  ``"sidechain-heavy"``
      the side-chain atoms that are not hydrogens, except for glycine, which has no heavy side-chain
      atom and uses its side-chain hydrogens (HA2/HA3) instead, as mdtraj does. Without hydrogens in
      the file a glycine has no such atoms, and its distances are +inf (mdtraj raises instead).

* Residues (``residues=None``): those with an atom named CA (case-insensitive) that is not a calcium
  ion, as mdtraj's ``ignore_nonprotein`` keeps residues "containing an alpha carbon".
* Exclusions: the diagonal, and pairs of the same chain whose residue-index difference is below
  ``min_separation`` (mdtraj's ``contacts="all"`` keeps j >= i + 3; the index is the residue's
  position in the structure, not its number in the file, exactly as mdtraj counts). Chains are told
  apart by (chain id, segment id). Pairs from different chains are kept (``inter_chain=True``), where
  mdtraj's ``contacts="all"`` leaves them out; ``inter_chain=False`` gives mdtraj's pair set.
  Excluded pairs have distance +inf and are never in contact, so ``distances`` is a plain float map
  that ``min``/``<`` handle without masks.
* A contact is a residue distance strictly below ``cutoff`` (Angstrom). mdtraj reports distances in
  nm and no booleans; the cutoff is protgpu's.
* Periodic boxes: with ``periodic=True`` and a box on the structure (trajectories; a PDB's CRYST1 is
  not read as a box) atom pairs use the minimum image, as mdtraj's ``periodic=True``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ._array import dispatch, get_namespace, is_cupy_array, to_numpy
from ._memory import check_host_fits, device_budget_bytes, rows_per_chunk
from ._threads import cpu_threads
from .errors import InputError

# The NumPy twin of the kernel (residue_distances_numpy) and its helpers (allowed_pairs, scheme_atoms,
# half_plane_spacing_sq) stay importable by name for tests and benchmarks but are not public API.
__all__ = [
    "SCHEMES",
    "ContactMap",
    "ContactPairs",
    "NativeContacts",
    "ResidueLabels",
    "contacts",
    "native_contacts",
]

SCHEMES = ("ca", "closest", "closest-heavy", "sidechain", "sidechain-heavy")

# Atom names mdtraj's Atom.is_sidechain rejects (C, CA, N, O, HA, H), plus the aliases its PDB reader
# renames to H or O before that test (mdtraj/formats/pdb/data/pdbNames.xml, "Protein" section).
_NOT_SIDECHAIN = ("C", "CA", "N", "O", "HA", "H", "HN", "H1", "1H", "HN1", "HT1", "O1", "OT1", "OCT1", "OC1")
_HYDROGEN = ("H", "D")


# --------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class ResidueLabels:
    """The residues of a contact map, in map order.

    Attributes
    ----------
    index : np.ndarray of int64, shape (R,)
        Residue index in the structure (0-based position, as ``Structure.residues``).
    chain, segid, icode, name : np.ndarray of str, shape (R,)
        Chain id, segment id, insertion code and residue name as in the file.
    number : np.ndarray of int32, shape (R,)
        Residue number (resid) as in the file.
    """

    index: np.ndarray
    chain: np.ndarray
    number: np.ndarray
    icode: np.ndarray
    name: np.ndarray
    segid: np.ndarray

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def labels(self) -> list[str]:
        """Readable labels such as ``"A:LYS12"`` (segment id when the chain id is blank)."""
        out = []
        for ch, seg, rn, num, ic in zip(self.chain.tolist(), self.segid.tolist(), self.name.tolist(),
                                        self.number.tolist(), self.icode.tolist(), strict=True):
            prefix = ch or seg
            out.append(f"{prefix}:{rn}{num}{ic}" if prefix else f"{rn}{num}{ic}")
        return out


class ContactPairs(NamedTuple):
    """Sparse contacts (``output="pairs"``): one record per (frame, i < j) pair in contact.

    Attributes
    ----------
    frame : array of int64, shape (K,)
    i, j : array of int32, shape (K,)
        Positions in the map (0..R-1), ``i < j``; ``ContactMap.residues`` names them.
    distance : array of float32 (float64 for float64 input), shape (K,)
        Residue distance in Angstrom.
    """

    frame: Any
    i: Any
    j: Any
    distance: Any


@dataclass
class ContactMap:
    """Result of :func:`contacts`.

    Attributes
    ----------
    residues : ResidueLabels
        The R residues of the map (chain, number, name), in map order.
    distances : array, shape (frames, R, R), or None
        Residue-pair distances under ``scheme``, Angstrom; float32 (float64 for float64 input).
        Symmetric; +inf on the diagonal, for excluded pairs and for residues with no atom under the
        scheme. None with ``frequency=True`` or ``output="pairs"``.
    contacts : array of bool, shape (frames, R, R), or None
        ``distances < cutoff``. None when ``distances`` is.
    frequency : array of float64, shape (R, R)
        Fraction of frames in which each pair is in contact (always computed).
    pairs : ContactPairs or None
        Sparse contacts, with ``output="pairs"``.
    scheme, cutoff, min_separation, inter_chain, n_frames, device
        The parameters and where the work ran (``"cpu"`` or ``"gpu"``).
    n_pairs : int
        Number of residue pairs (i < j) the map includes (not excluded by separation or chain).
    source : str or None
        The structure's file name.
    """

    residues: ResidueLabels
    distances: Any
    contacts: Any
    frequency: Any
    pairs: ContactPairs | None
    scheme: str
    cutoff: float
    min_separation: int
    inter_chain: bool
    n_frames: int
    device: str
    n_pairs: int = 0
    source: str | None = field(default=None)

    def __repr__(self) -> str:
        kept = "dense maps" if self.distances is not None else ("pairs" if self.pairs is not None else "frequency")
        return (f"<ContactMap {self.source or ''}: {self.n_residues} residues x {self.n_frames} frame"
                f"{'s' if self.n_frames != 1 else ''}, {self.scheme}, cutoff {self.cutoff:g} A, {kept}, "
                f"on {self.device}>")

    @property
    def n_residues(self) -> int:
        """Number of residues R in the map."""
        return len(self.residues)

    def n_contacts(self) -> np.ndarray | None:
        """Number of residue pairs (i < j) in contact in each frame, int64 shape (frames,); None with
        ``frequency=True`` (no per-frame data is kept).

        Examples
        --------
        >>> import protgpu as pg
        >>> traj = pg.load("datasets/adk_dims.dcd", top="datasets/adk_open.pdb")
        >>> cm = pg.contacts(traj.frames(slice(0, 98, 24)), residues="resid 1-50", device="cpu")
        >>> cm.n_contacts().tolist()
        [77, 73, 71, 77, 73]
        """
        if self.contacts is not None:
            c = to_numpy(self.contacts)
            return np.triu(c, 1).sum(axis=(1, 2)).astype(np.int64)
        if self.pairs is not None:
            return np.bincount(to_numpy(self.pairs.frame), minlength=self.n_frames).astype(np.int64)
        return None  # frequency=True keeps no per-frame data

    def summary(self) -> str:
        """One line: residues, scheme, pairs considered and contacts found.

        Examples
        --------
        >>> import protgpu as pg
        >>> pg.contacts(pg.load("datasets/adk_open.pdb"), device="cpu").summary()
        '214 residues, 1 frame, scheme closest-heavy, cutoff 4.5 A, |i-j| >= 3: 550 contacts among 22366 residue pairs'
        """
        r = self.n_residues
        freq = to_numpy(self.frequency)
        iu = np.triu_indices(r, 1)
        mean_contacts = float(freq[iu].sum())
        if self.n_frames > 1:
            found = f"{mean_contacts:.1f} contacts per frame (mean)"
        else:
            found = f"{mean_contacts:.0f} contacts"
        return (f"{r} residues, {self.n_frames} frame{'s' if self.n_frames != 1 else ''}, scheme {self.scheme}, "
                f"cutoff {self.cutoff:g} A, |i-j| >= {self.min_separation}: {found} among {self.n_pairs} residue pairs")

    def to_dict(self) -> dict:
        """Arrays for ``protgpu.io.save_array`` (``.npz``): maps, frequency and residue labels.

        Examples
        --------
        >>> import protgpu as pg
        >>> arrays = pg.contacts(pg.load("datasets/adk_open.pdb"), device="cpu").to_dict()
        >>> arrays["contacts"].shape, arrays["distances"].dtype
        ((1, 214, 214), dtype('float32'))
        >>> arrays["residue_label"][:3].tolist(), arrays["residue_number"][:3].tolist()
        (['4AKE:MET1', '4AKE:ARG2', '4AKE:ILE3'], [1, 2, 3])
        """
        out = {
            "frequency": to_numpy(self.frequency),
            "residue_index": self.residues.index,
            "residue_chain": self.residues.chain,
            "residue_number": self.residues.number,
            "residue_icode": self.residues.icode,
            "residue_name": self.residues.name,
            "residue_label": np.array(self.residues.labels(), dtype=str),
            "scheme": np.array(self.scheme),
            "cutoff": np.array(self.cutoff),
            "min_separation": np.array(self.min_separation),
        }
        if self.distances is not None:
            out["distances"] = to_numpy(self.distances)
            out["contacts"] = to_numpy(self.contacts)
        if self.pairs is not None:
            for k, v in self.pairs._asdict().items():
                out[f"pairs_{k}"] = to_numpy(v)
        return out


class NativeContacts(NamedTuple):
    """Result of :func:`native_contacts`.

    Attributes
    ----------
    q_soft : array of float64, shape (frames,)
        Best-Hummer-Eaton Q: mean over native pairs of ``1 / (1 + exp(beta (r - lambda r0)))``
        (MDAnalysis ``method="soft_cut"``).
    q_hard : array of float64, shape (frames,)
        Fraction of native pairs with ``r <= r0`` (MDAnalysis ``method="hard_cut"``).
    q_radius : array of float64, shape (frames,)
        Fraction of native pairs with ``r <= cutoff`` (MDAnalysis ``method="radius_cut"``).
    pairs : np.ndarray of int64, shape (K, 2)
        Native atom pairs, indices into the trajectory's atoms, ``i < j``.
    r0 : np.ndarray of float64, shape (K,)
        Their distances in the reference, Angstrom.
    """

    q_soft: Any
    q_hard: Any
    q_radius: Any
    pairs: np.ndarray
    r0: np.ndarray


# --------------------------------------------------------------------------------------------------
# Host side: which atoms each residue contributes under a scheme


def _as_structure(obj, what: str, top=None):
    if hasattr(obj, "coords") and hasattr(obj, "atoms") and hasattr(obj, "residues"):
        return obj
    from .io import load

    if isinstance(obj, np.ndarray) or is_cupy_array(obj):
        raise InputError(f"{what}: contacts need residues; give a Structure (protgpu.load) rather than a bare array")
    return load(obj, top=top)


def _upper(a: np.ndarray) -> np.ndarray:
    return np.char.upper(np.char.strip(np.asarray(a, dtype=str)))


def _select_residues(structure, residues, has_ca: np.ndarray) -> np.ndarray:
    n_res = structure.n_residues
    where = structure.source or "structure"
    if residues is None:
        sel = np.flatnonzero(has_ca)
    elif isinstance(residues, str) and residues.strip().lower() == "all":
        sel = np.arange(n_res)
    elif isinstance(residues, str):
        atoms = structure.select_indices(residues)
        sel = np.unique(structure.atoms.residue_index[atoms])
    else:
        arr = np.asarray(to_numpy(residues))
        if arr.dtype == bool:
            if arr.shape != (n_res,):
                raise InputError(f"{where}: residues mask has shape {arr.shape}, expected ({n_res},)")
            sel = np.flatnonzero(arr)
        elif arr.size == 0 or (arr.ndim == 1 and arr.dtype.kind in "iu"):
            sel = np.unique(arr.astype(np.int64))
            if sel.size and (sel[0] < 0 or sel[-1] >= n_res):
                raise InputError(f"{where}: residue index out of range 0..{n_res - 1}")
        else:
            raise InputError(f"{where}: residues must be None, 'all', a selection string, residue indices or a mask")
    if sel.size == 0:
        what = "no residue has a CA atom" if residues is None else f"residues={residues!r} selects no residue"
        raise InputError(f"{where}: {what}")
    return sel.astype(np.int64)


def scheme_atoms(structure, scheme: str = "closest-heavy", residues=None):
    """The atoms each residue contributes to its residue distance under ``scheme``.

    Parameters
    ----------
    structure : Structure
    scheme : {"ca", "closest", "closest-heavy", "sidechain", "sidechain-heavy"}
        See the module notes for the atoms of each scheme and the glycine case.
    residues : None, "all", str, array of int or bool mask, optional
        ``None``: residues with a CA atom (mdtraj's protein residues); ``"all"``: every residue; a
        selection string: the residues with at least one selected atom (all their atoms then count
        under the scheme); residue indices (sorted and made unique) or a mask over residues.

    Returns
    -------
    residue_index : np.ndarray of int64, shape (R,)
        Residues of the map (indices into ``structure.residues``), ascending.
    atom_idx : np.ndarray of int32, shape (A,)
        Atom indices, grouped by residue in map order.
    starts : np.ndarray of int32, shape (R + 1,)
        ``atom_idx[starts[r]:starts[r + 1]]`` are residue r's atoms (possibly none).

    Raises
    ------
    InputError
        Unknown scheme, empty residue selection, or (scheme ``"ca"``) a residue with two CA atoms.
    """
    if scheme not in SCHEMES:
        raise InputError(f"scheme must be one of {', '.join(SCHEMES)}, not {scheme!r}")
    atoms = structure.atoms
    ri = np.asarray(atoms.residue_index, dtype=np.int64)
    n_res = structure.n_residues
    names = _upper(atoms.name)
    element = _upper(atoms.element)
    is_ca = (names == "CA") & (element != "CA")  # a calcium ion named CA is not an alpha carbon
    has_ca = np.zeros(n_res, dtype=bool)
    has_ca[ri[is_ca]] = True
    res_sel = _select_residues(structure, residues, has_ca)
    is_h = np.isin(element, _HYDROGEN)
    if scheme == "ca":
        mask = is_ca
        n_ca = np.bincount(ri[is_ca], minlength=n_res)
        many = np.flatnonzero(n_ca[res_sel] > 1)
        if many.size:
            r = int(res_sel[many[0]])
            lab = structure.residues.labels()[r]
            raise InputError(f"{structure.source or 'structure'}: residue {lab} has {int(n_ca[r])} CA atoms")
    elif scheme == "closest":
        mask = np.ones(len(names), dtype=bool)
    elif scheme == "closest-heavy":
        mask = ~is_h
    else:
        # Side-chain atoms belong to amino acids only; "amino acid" here is "has a CA", the same test
        # that decides which residues are in the map.
        side = ~np.isin(names, _NOT_SIDECHAIN) & has_ca[ri]
        if scheme == "sidechain":
            mask = side
        else:
            gly = np.asarray(atoms.std_resname) == "GLY"
            mask = side & (~is_h | gly)
    in_sel = np.zeros(n_res, dtype=bool)
    in_sel[res_sel] = True
    atom_idx = np.flatnonzero(mask & in_sel[ri])  # file order = grouped by residue, residues ascending
    starts = np.searchsorted(ri[atom_idx], res_sel, side="left")
    starts = np.append(starts, atom_idx.size)
    return res_sel, atom_idx.astype(np.int32), starts.astype(np.int32)


def _residue_keys(structure, res_sel: np.ndarray):
    """Chain code (int32, one per distinct (chain, segid)) and labels of the selected residues."""
    table = structure.residues
    chain = np.asarray(table.chain)[res_sel]
    segid = np.asarray(table.segid)[res_sel]
    key = np.char.add(np.char.add(chain.astype(str), "\x1f"), segid.astype(str))
    _, code = np.unique(key, return_inverse=True)
    labels = ResidueLabels(
        index=res_sel.astype(np.int64),
        chain=chain,
        number=np.asarray(table.resid, dtype=np.int32)[res_sel],
        icode=np.asarray(table.icode)[res_sel],
        name=np.asarray(table.resname)[res_sel],
        segid=segid,
    )
    return code.reshape(-1).astype(np.int32), labels


def allowed_pairs(chain, seq, min_separation: int = 3, inter_chain: bool = True) -> np.ndarray:
    """Which residue pairs a map includes (the rule the kernel applies too).

    Parameters
    ----------
    chain : array_like of int, shape (R,)
        Chain code of each residue.
    seq : array_like of int, shape (R,)
        Residue index in the structure (the separation is measured on it).
    min_separation : int
        Same-chain pairs need ``|seq_i - seq_j| >= min_separation`` (and ``i != j`` always).
    inter_chain : bool
        Whether pairs of different chains are included.

    Returns
    -------
    np.ndarray of bool, shape (R, R)
        Symmetric, False on the diagonal.
    """
    chain = np.asarray(chain)
    seq = np.asarray(seq, dtype=np.int64)
    ok = _allowed_block(chain, seq, chain, seq, min_separation, inter_chain)
    np.fill_diagonal(ok, False)
    return ok


def _allowed_block(chain_a, seq_a, chain_b, seq_b, min_separation, inter_chain) -> np.ndarray:
    same = chain_a[:, None] == chain_b[None, :]
    sep = np.abs(seq_a[:, None] - seq_b[None, :]) >= min_separation
    return np.where(same, sep, bool(inter_chain))


# --------------------------------------------------------------------------------------------------
# NumPy twin


def _box_arrays(box, n_frames: int, dtype):
    """Box vectors (Fb, 3, 3), their inverses and the PBC mode (0 none, 1 orthorhombic, 2 triclinic).

    Accepts (3,) or (F, 3) edge lengths and (3, 3) or (F, 3, 3) vectors (rows a, b, c), Angstrom. A
    (3, 3) array is always one box's vectors (as ``Structure`` reads it), also when F is 3. Fb is 1
    for one box, else F. Validation and the mode come from :func:`protgpu.distances.normalize_box`.
    """
    from .distances import normalize_box

    if box is None:
        return None, None, 0
    b = np.asarray(to_numpy(box), dtype=np.float64)
    if b.shape == (3,):
        b = np.diag(b)[None]
    elif b.shape == (3, 3):
        b = b[None]
    elif b.shape == (n_frames, 3):
        b = b[:, None, :] * np.eye(3)
    elif b.shape != (n_frames, 3, 3):
        raise InputError(f"box must have shape (3,), ({n_frames}, 3), (3, 3) or ({n_frames}, 3, 3), got {b.shape}")
    one = b.shape[0] == 1 and n_frames != 1
    vec, inv, mode = normalize_box(np.broadcast_to(b, (n_frames, 3, 3)) if one else b, n_frames, dtype=dtype)
    if one:
        vec, inv = vec[:1], inv[:1]
    return vec, inv, mode


def half_plane_spacing_sq(vec: np.ndarray):
    """Square of half the smallest lattice-plane spacing of a box (rows a, b, c, Angstrom), for one
    box (3, 3) -> float, or a stack (..., 3, 3) -> array (...).

    Every non-zero lattice vector is at least the smallest plane spacing ``1 / max_k |inv[:, k]|``
    long, so a displacement shorter than half of it is its own minimum image: the 27-image search is
    needed only for longer ones. Both the NumPy twin and the kernel skip it below this bound.
    """
    inv = np.linalg.inv(np.asarray(vec, dtype=np.float64))
    spacing = 1.0 / np.max(np.linalg.norm(inv, axis=-2), axis=-1)
    out = (0.5 * spacing) ** 2
    return float(out) if out.ndim == 0 else out


def _min_image_triclinic(d: np.ndarray, vec: np.ndarray, inv: np.ndarray, near2: float) -> np.ndarray:
    """Squared minimum-image lengths of displacements ``d`` (..., 3), as the kernel computes them:
    wrap in fractional coordinates; if still longer than ``sqrt(near2)``, take the shortest of the 27
    neighbouring images (the rule of common.cuh's ``pg_minimum_image``)."""
    s = d @ inv
    s -= np.rint(s)
    w = s @ vec
    n2 = np.einsum("...k,...k->...", w, w)
    far = n2 > near2
    if far.any():
        wf = w[far]
        best = n2[far]
        for i in (-1, 0, 1):
            for j in (-1, 0, 1):
                for k in (-1, 0, 1):
                    e = wf + (i * vec[0] + j * vec[1] + k * vec[2])
                    np.minimum(best, np.einsum("...k,...k->...", e, e), out=best)
        n2[far] = best
    return n2


def _sq_dist_block(rows, cols, mode, vec, inv, out, tmp):
    """``out[f, a, b] = |cols[f, b] - rows[f, a]|^2`` (minimum image when a box is given).

    rows (fc, nr, 3), cols (fc, nc, 3); vec/inv (fc, 3, 3) or None; out/tmp (fc, nr, nc).
    """
    if mode == 2:
        for f in range(rows.shape[0]):
            d = cols[f][None, :, :] - rows[f][:, None, :]
            out[f] = _min_image_triclinic(d, vec[f], inv[f], half_plane_spacing_sq(vec[f]))
        return out
    # One component at a time into preallocated buffers: no (fc, nr, nc, 3) temporary.
    for c in range(3):
        t = out if c == 0 else tmp
        np.subtract(cols[:, None, :, c], rows[:, :, None, c], out=t)
        if mode == 1:
            length = vec[:, c, c][:, None, None]
            t -= length * np.rint(t * inv[:, c, c][:, None, None])
        np.multiply(t, t, out=t)
        if c:
            out += t
    return out


def _row_tiles(seg_starts: np.ndarray, tile: int):
    """Greedy groups of consecutive residues holding at most ``tile`` atoms (at least one residue)."""
    n = len(seg_starts) - 1
    i = 0
    while i < n:
        k = i + 1
        while k < n and seg_starts[k + 1] - seg_starts[i] <= tile:
            k += 1
        yield i, k
        i = k


def _min_sq_numpy(x: np.ndarray, seg: np.ndarray, tile: int, mode: int, vec, inv) -> np.ndarray:
    """Per-frame minimum squared distance between every two residue segments.

    Parameters
    ----------
    x : ndarray (fc, A, 3)
        The scheme's atoms, grouped by residue; every segment non-empty.
    seg : ndarray of int (S + 1,)
        Segment boundaries in ``x``.
    tile : int
        Row atoms per block (whole residues; a larger residue is a block of its own).

    Returns
    -------
    ndarray (fc, S, S), symmetric.
    """
    fc, n_atoms = x.shape[:2]
    n_seg = len(seg) - 1
    out = np.empty((fc, n_seg, n_seg), dtype=x.dtype)
    for i, k in _row_tiles(seg, tile):
        a0, a1 = int(seg[i]), int(seg[k])
        rows = x[:, a0:a1]
        cols = x[:, a0:]  # the upper part: residues >= i
        shape = (fc, a1 - a0, n_atoms - a0)
        d2 = _sq_dist_block(rows, cols, mode, vec, inv, np.empty(shape, x.dtype), np.empty(shape, x.dtype))
        # min over each row residue's atoms first (few segments of long contiguous rows: fast), then
        # over each column residue's atoms
        m = np.minimum.reduceat(d2, seg[i:k] - a0, axis=1)
        m = np.minimum.reduceat(m, seg[i:-1] - a0, axis=2)
        out[:, i:k, i:] = m
        out[:, i:, i:k] = m.transpose(0, 2, 1)
    return out


def residue_distances_numpy(coords, atom_idx, starts, allowed, *, box=None, tile: int = 128,
                            frame_chunk: int | None = None, threads: int | None = None, out=None):
    """The NumPy twin of the contact kernel: residue-pair minimum distances.

    For each frame and each residue pair (i, j): the minimum over atoms a of residue i and b of
    residue j of ``|x_b - x_a|`` (minimum image with a box), computed in row blocks of ``tile`` atoms
    against the residues at or after the block (the rest is the mirror), with ``np.minimum.reduceat``
    over residue ranges on both axes. Only one (frames chunk, tile, atoms) block is alive at a time.

    Parameters
    ----------
    coords : np.ndarray, shape (F, N, 3), float32 or float64
        Angstrom. Computed in its dtype.
    atom_idx : np.ndarray of int, shape (A,)
        Atoms grouped by residue (:func:`scheme_atoms`).
    starts : np.ndarray of int, shape (R + 1,)
        Residue boundaries in ``atom_idx``.
    allowed : np.ndarray of bool, shape (R, R)
        Pairs to report (:func:`allowed_pairs`); the rest are +inf.
    box : array_like, optional
        Periodic box: (3,) or (F, 3) edge lengths, or (3, 3) / (F, 3, 3) vectors (rows a, b, c),
        Angstrom; a (3, 3) array is one box's vectors.
    tile : int
        Row block size in atoms. Results do not depend on it (min is exact).
    frame_chunk : int, optional
        Frames per block; default keeps a block near 2**18 elements.
    threads : int, optional
        Worker threads over frame blocks (default: the usable CPU cores).
    out : np.ndarray, shape (F, R, R), optional
        Where to write.

    Returns
    -------
    np.ndarray, shape (F, R, R), coords' dtype
        Distances in Angstrom; +inf where ``allowed`` is False or a residue has no atom.
    """
    x_all = np.asarray(coords)
    n_frames = x_all.shape[0]
    dtype = x_all.dtype
    starts = np.asarray(starts, dtype=np.int64)
    atom_idx = np.asarray(atom_idx, dtype=np.int64)
    n_res = len(starts) - 1
    counts = np.diff(starts)
    nonempty = np.flatnonzero(counts > 0)
    seg = np.append(starts[:-1][nonempty], starts[-1])
    vec, inv, mode = _box_arrays(box, n_frames, dtype)
    res = out if out is not None else np.empty((n_frames, n_res, n_res), dtype=dtype)
    res.fill(np.inf)
    if nonempty.size:
        tile = max(int(tile), 1)
        n_atoms = int(atom_idx.size)
        if frame_chunk is None:
            # Blocks of about 2**18 elements (1 MiB in float32) stay in cache: NumPy's passes over
            # them are then not limited by memory bandwidth.
            frame_chunk = max(1, (1 << 18) // max(1, min(tile, n_atoms) * n_atoms))
        sub = np.ix_(nonempty, nonempty)

        def work(f0):
            f1 = min(n_frames, f0 + frame_chunk)
            x = x_all[f0:f1][:, atom_idx]
            fv = fi = None
            if mode:
                b = slice(f0, f1) if len(vec) > 1 else np.zeros(f1 - f0, dtype=np.int64)
                fv, fi = vec[b], inv[b]
            m = np.sqrt(_min_sq_numpy(x, seg, tile, mode, fv, fi))
            if nonempty.size == n_res:
                res[f0:f1] = m
            else:
                res[f0:f1][(slice(None), *sub)] = m

        starts_f = range(0, n_frames, frame_chunk)
        n_workers = min(len(starts_f), cpu_threads() if threads is None else max(1, int(threads)))
        if n_workers > 1:
            # NumPy's ufunc loops release the GIL: frame chunks run in parallel on the cores.
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(n_workers) as pool:
                list(pool.map(work, starts_f))
        else:
            for f0 in starts_f:
                work(f0)
    res[:, ~np.asarray(allowed, dtype=bool)] = np.inf
    return res


# --------------------------------------------------------------------------------------------------
# CUDA path

_RPT = 2          # row atoms per thread (kernel RPT default)
_RB = 32          # row residues per block (kernel RB default)
_MAX_THREADS = 256


def _row_blocks(starts: np.ndarray, rb: int = _RB, cap: int = _MAX_THREADS * _RPT) -> np.ndarray:
    """Row-block boundaries over residues: at most ``rb`` residues and ``cap`` atoms each (a residue
    larger than ``cap`` gets a block of its own; the kernel then loops over its atoms)."""
    n = len(starts) - 1
    bounds = [0]
    i = 0
    while i < n:
        k = i + 1
        while k < n and k - i < rb and starts[k + 1] - starts[i] <= cap:
            k += 1
        bounds.append(k)
        i = k
    return np.asarray(bounds, dtype=np.int32)


def _interleaved_rows(atom_idx: np.ndarray, starts: np.ndarray, bounds: np.ndarray):
    """Row atoms for the kernel: within each row block, ordered by (rank within residue, residue), so
    consecutive threads hold atoms of different residues. Returns (row_idx, row_res), int32 (A,)."""
    counts = np.diff(starts)
    res = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    rank = np.arange(len(res), dtype=np.int64) - np.repeat(starts[:-1].astype(np.int64), counts)
    block = np.repeat(np.arange(len(bounds) - 1, dtype=np.int64), np.diff(starts[bounds]))
    order = np.lexsort((res, rank, block))  # block is the primary key: ranges stay in place
    return (np.ascontiguousarray(np.asarray(atom_idx)[order], dtype=np.int32),
            np.ascontiguousarray(res[order], dtype=np.int32))


class _GPUPlan:
    """Device-side constants of one contact-map call (index lists, row blocks, box), built once."""

    def __init__(self, atom_idx, starts, chain, seq, box, n_frames, dtype, defines=None):
        import cupy

        from . import _cuda

        defines = dict(defines or {})
        rpt = int(defines.get("RPT", _RPT))
        rb = int(defines.get("RB", _RB))
        self.n_res = len(starts) - 1
        starts = np.asarray(starts, dtype=np.int32)
        bounds = _row_blocks(starts, rb=rb, cap=_MAX_THREADS * rpt)
        self.n_rb = len(bounds) - 1
        most = int(np.max(starts[bounds[1:]] - starts[bounds[:-1]])) if self.n_rb else 0
        # Enough threads for a block's row atoms at RPT each, in whole warps, at most 256.
        per_thread = -(-max(most, 1) // rpt)
        self.threads = int(min(_MAX_THREADS, max(32, (per_thread + 31) // 32 * 32)))
        row_idx, row_res = _interleaved_rows(atom_idx, starts, bounds)
        self.atom_idx = cupy.asarray(np.ascontiguousarray(atom_idx, dtype=np.int32))
        self.row_idx = cupy.asarray(row_idx)
        self.row_res = cupy.asarray(row_res)
        self.starts = cupy.asarray(starts)
        self.bounds = cupy.asarray(bounds)
        self.chain = cupy.asarray(np.ascontiguousarray(chain, dtype=np.int32))
        self.seq = cupy.asarray(np.ascontiguousarray(seq, dtype=np.int32))
        vec, inv, self.mode = _box_arrays(box, n_frames, dtype)
        # The triclinic shortcut bound; with a box per frame the smallest is safe for all of them.
        self.near2 = float(np.min(half_plane_spacing_sq(vec))) if self.mode == 2 else 0.0
        if self.mode:
            self.box = cupy.asarray(vec.reshape(-1, 9))
            self.inv = cupy.asarray(inv.reshape(-1, 9))
            self.box_step = 1 if len(vec) > 1 else 0
        else:
            self.box = self.inv = cupy.zeros((1, 9), dtype=dtype)
            self.box_step = 0
        suffix = "f64" if np.dtype(dtype) == np.float64 else "f32"
        self.kernel = _cuda.get_kernel("contacts", f"contact_map_{suffix}", defines or None)
        self.dtype = np.dtype(dtype)

    def launch(self, x, f0, nf, dist, contact, counts, min_sep, inter_chain, cutoff):
        """Run frames ``f0 .. f0 + nf`` of ``x`` (a CuPy (nf, N, 3) array holding exactly them)."""
        from . import _cuda

        box = self.box[f0:f0 + nf] if self.box_step else self.box
        inv = self.inv[f0:f0 + nf] if self.box_step else self.inv
        grid = nf * self.n_rb
        if grid == 0:
            return
        _cuda.launch(self.kernel, grid, self.threads, x, self.atom_idx, self.row_idx, self.row_res, self.starts,
                     self.bounds,
                     self.chain, self.seq, box, inv, dist, contact, counts, nf, x.shape[1], self.n_res, self.n_rb,
                     int(min_sep), int(bool(inter_chain)), self.dtype.type(cutoff), self.dtype.type(self.near2),
                     self.box_step, self.mode)


def _contacts_cuda(x, atom_idx, starts, chain, seq, box, *, cutoff, min_sep, inter_chain, keep, dense_on_host,
                   defines=None):
    """Contact maps on the GPU, frames in chunks under the device memory budget.

    ``x`` is a NumPy or CuPy (F, N, 3) array of the work dtype. ``keep`` is ``"dense"``, ``"pairs"`` or
    ``"frequency"``. Returns (distances, contacts, counts, pairs) where dense outputs are host arrays
    when ``dense_on_host`` else device arrays. ``counts`` is a CuPy (R, R) uint32 array, symmetric
    with a zero diagonal: per residue pair, the number of frames in contact (the kernel counts the
    upper triangle only; the transpose is added here, once), so ``counts / F`` is the frequency.
    """
    import cupy

    n_frames, n_atoms = x.shape[:2]
    dtype = np.dtype(x.dtype)
    plan = _GPUPlan(atom_idx, starts, chain, seq, box, n_frames, dtype, defines)
    r = plan.n_res
    per_frame = (r * r * (dtype.itemsize + 1) if keep != "frequency" else 0)
    if not is_cupy_array(x):
        per_frame += n_atoms * 3 * dtype.itemsize
    chunk = rows_per_chunk(per_frame, n_frames, device_budget_bytes())
    chunk = min(chunk, (2**31 - 1) // max(plan.n_rb, 1))  # grid.x limit
    counts = cupy.zeros((r, r), dtype=np.uint32)
    dist_all = cont_all = None
    if keep == "dense":
        if dense_on_host:
            dist_all = np.empty((n_frames, r, r), dtype=dtype)
            cont_all = np.empty((n_frames, r, r), dtype=bool)
        else:
            dist_all = cupy.empty((n_frames, r, r), dtype=dtype)
            cont_all = cupy.empty((n_frames, r, r), dtype=np.uint8)
    pieces = []
    iu = None
    for f0 in range(0, n_frames, chunk):
        f1 = min(n_frames, f0 + chunk)
        nf = f1 - f0
        xc = cupy.ascontiguousarray(cupy.asarray(x[f0:f1]))
        if keep == "dense" and not dense_on_host:
            d, c = dist_all[f0:f1], cont_all[f0:f1]
        elif keep != "frequency":
            d = cupy.empty((nf, r, r), dtype=dtype)
            c = cupy.empty((nf, r, r), dtype=np.uint8)
        else:
            d = c = None
        plan.launch(xc, f0, nf, d, c, counts, min_sep, inter_chain, cutoff)
        if keep == "dense" and dense_on_host:
            dist_all[f0:f1] = d.get()
            cont_all[f0:f1] = c.get().view(bool)
        elif keep == "pairs":
            if iu is None:
                iu = cupy.triu(cupy.ones((r, r), dtype=bool), 1)
            f, i, j = cupy.nonzero(c.view(bool) & iu[None])
            pieces.append(((f + f0).astype(np.int64), i.astype(np.int32), j.astype(np.int32), d[f, i, j]))
    if cont_all is not None and not dense_on_host:
        cont_all = cont_all.view(bool)
    pairs = None
    if keep == "pairs":
        if pieces:
            pairs = ContactPairs(*(cupy.concatenate([p[k] for p in pieces]) for k in range(4)))
        else:
            pairs = ContactPairs(cupy.zeros(0, np.int64), cupy.zeros(0, np.int32), cupy.zeros(0, np.int32),
                                 cupy.zeros(0, dtype))
    counts = counts + counts.T  # the kernel fills i < j only: mirror once, the result is complete
    return dist_all, cont_all, counts, pairs


# --------------------------------------------------------------------------------------------------
# CPU path (the twin, in frame chunks so that frequency/pairs output stays small)


def _contacts_cpu(x, atom_idx, starts, allowed, box, *, cutoff, keep, tile=128):
    n_frames = x.shape[0]
    r = len(starts) - 1
    dtype = x.dtype
    vec, _inv, _mode = _box_arrays(box, n_frames, np.float64)
    counts = np.zeros((r, r), dtype=np.int64)
    dist_all = cont_all = None
    if keep == "dense":
        dist_all = np.empty((n_frames, r, r), dtype=dtype)
        cont_all = np.empty((n_frames, r, r), dtype=bool)
        chunk = n_frames
    else:
        chunk = max(1, (1 << 24) // max(1, r * r * (dtype.itemsize + 1)))
    pieces = []
    iu = np.triu(np.ones((r, r), dtype=bool), 1)
    for f0 in range(0, n_frames, chunk):
        f1 = min(n_frames, f0 + chunk)
        b = None if vec is None else (vec[f0:f1] if len(vec) > 1 else vec[0])
        d = residue_distances_numpy(x[f0:f1], atom_idx, starts, allowed, box=b, tile=tile,
                                    out=None if dist_all is None else dist_all[f0:f1])
        c = d < cutoff
        counts += c.sum(axis=0)
        if cont_all is not None:
            cont_all[f0:f1] = c
        if keep == "pairs":
            f, i, j = np.nonzero(c & iu[None])
            pieces.append(((f + f0).astype(np.int64), i.astype(np.int32), j.astype(np.int32), d[f, i, j]))
    pairs = None
    if keep == "pairs":
        pairs = ContactPairs(*(np.concatenate([p[k] for p in pieces]) if pieces else np.zeros(0, t)
                               for k, t in enumerate((np.int64, np.int32, np.int32, dtype))))
    return dist_all, cont_all, counts, pairs


# --------------------------------------------------------------------------------------------------
# Public functions


def _work_coords(structure, coords, be, what):
    """The coordinates to use, float32 unless float64 came in, shape (F, N, 3).

    Device arrays (CuPy, CUDA tensors) stay on the device; host arrays stay on the host even when the
    work runs on the GPU, which then copies them over frame chunk by frame chunk (a trajectory need
    not fit in device memory).
    """
    src = structure.coords if coords is None else coords
    if be.on_gpu and be.kind in ("cupy", "torch-cuda"):
        a = be.asarray(src)
    else:
        a = np.asarray(to_numpy(src))
    xp = get_namespace(a)
    if a.dtype.kind not in "fiu":
        raise InputError(f"{what}: coords must be numeric, got dtype {a.dtype}")
    a = a.astype(xp.float64 if a.dtype == np.float64 else xp.float32, copy=False)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3 or a.shape[2] != 3 or a.shape[1] != structure.n_atoms:
        raise InputError(f"{what}: coords must have shape (frames, {structure.n_atoms}, 3), got {tuple(a.shape)}")
    if a.shape[0] == 0:
        raise InputError(f"{what}: no frames")
    if coords is not None and not bool(xp.isfinite(a).all()):
        raise InputError(f"{what}: NaN or infinite coordinates")
    return xp.ascontiguousarray(a)


def contacts(structure, *, scheme: str = "closest-heavy", cutoff: float = 4.5, min_separation: int = 3,
             residues=None, frequency: bool = False, output: str = "dense", inter_chain: bool = True,
             periodic: bool = True, coords=None, top=None, device: str = "auto") -> ContactMap:
    """Residue contact maps: residue-pair distances, contacts and contact frequencies.

    Parameters
    ----------
    structure : Structure, path or mdtraj.Trajectory
        Atoms and frames (anything :func:`protgpu.load` reads; ``top`` for trajectory files).
    scheme : {"closest-heavy", "ca", "closest", "sidechain", "sidechain-heavy"}
        How a residue distance is taken (mdtraj's schemes; see the module notes for the atoms each
        uses and the glycine case).
    cutoff : float
        Contact when the residue distance is strictly below it, Angstrom.
    min_separation : int
        Same-chain pairs closer than this in residue index are excluded (mdtraj's ``contacts="all"``
        uses 3).
    residues : None, "all", str, array of int or bool, optional
        Residues of the map; default those with a CA atom (see :func:`scheme_atoms`).
    frequency : bool
        Keep only the (R, R) frequency map: ``distances``, ``contacts`` and ``pairs`` are None and
        memory no longer grows with the number of frames (takes precedence over ``output``).
    output : {"dense", "pairs"}
        ``"pairs"`` returns the contacts as sparse (frame, i, j, distance) records
        (:class:`ContactPairs`) instead of dense maps, for large systems.
    inter_chain : bool
        Include pairs of residues from different chains (mdtraj's ``contacts="all"`` does not).
    periodic : bool
        Minimum-image distances when the structure has a box.
    coords : array, optional
        Coordinates to use instead of ``structure.coords``: (frames, atoms, 3) for the structure's
        atoms, NumPy, CuPy or torch (e.g. frames already on the GPU). The output follows its type.
    top : optional
        Topology for trajectory paths, as :func:`protgpu.load`.
    device : {"auto", "cpu", "gpu"}

    Returns
    -------
    ContactMap
        ``distances`` (frames, R, R) in Angstrom, ``contacts`` (frames, R, R) bool, ``frequency``
        (R, R) float64, ``residues`` (labels), or ``pairs`` with ``output="pairs"``.

    Raises
    ------
    InputError
        Unknown scheme or output, bad cutoff/separation, empty residue selection, wrong coords.

    Examples
    --------
    >>> import protgpu as pg
    >>> from pathlib import Path
    >>> from protgpu.contacts import contacts
    >>> s = pg.load(Path(pg.__file__).resolve().parents[1] / "datasets" / "adk_open.pdb")
    >>> cm = contacts(s, device="cpu")
    >>> cm.distances.shape, cm.contacts.dtype, len(cm.residues)
    ((1, 214, 214), dtype('bool'), 214)
    >>> bool((cm.distances[0] == cm.distances[0].T).all())
    True
    """
    if output not in ("dense", "pairs"):
        raise InputError(f"output must be 'dense' or 'pairs', not {output!r}")
    if not (isinstance(cutoff, (int, float, np.integer, np.floating)) and np.isfinite(cutoff) and cutoff > 0):
        raise InputError(f"cutoff must be a positive number of Angstrom, got {cutoff!r}")
    if isinstance(min_separation, bool) or not isinstance(min_separation, (int, np.integer)) or min_separation < 0:
        raise InputError(f"min_separation must be a non-negative integer, got {min_separation!r}")
    s = _as_structure(structure, "structure", top=top)
    what = s.source or "structure"
    res_sel, atom_idx, starts = scheme_atoms(s, scheme, residues)
    chain, labels = _residue_keys(s, res_sel)
    seq = res_sel.astype(np.int64)
    allowed = allowed_pairs(chain, seq, int(min_separation), inter_chain)
    be = dispatch(coords, device=device)
    x = _work_coords(s, coords, be, what)
    box = s.box if periodic else None
    keep = "frequency" if frequency else ("pairs" if output == "pairs" else "dense")
    n_frames, r = x.shape[0], len(res_sel)
    if keep == "dense" and be.kind in ("numpy", "torch-cpu"):
        check_host_fits(n_frames * r * r * (x.dtype.itemsize + 1), f"contact maps of {n_frames} frames x {r}^2")
    if be.on_gpu:
        dist, cont, counts, pairs = _contacts_cuda(
            x, atom_idx, starts, chain, seq, box, cutoff=float(cutoff), min_sep=int(min_separation),
            inter_chain=inter_chain, keep=keep, dense_on_host=be.kind in ("numpy", "torch-cpu"))
        xp = get_namespace(counts)
    else:
        dist, cont, counts, pairs = _contacts_cpu(x, atom_idx, starts, allowed, box, cutoff=float(cutoff), keep=keep)
        xp = np
    freq = counts.astype(xp.float64) / n_frames
    cm = ContactMap(
        residues=labels,
        distances=be.wrap(dist) if dist is not None else None,
        contacts=be.wrap(cont) if cont is not None else None,
        frequency=be.wrap(freq),
        pairs=be.wrap(pairs) if pairs is not None else None,
        scheme=scheme,
        cutoff=float(cutoff),
        min_separation=int(min_separation),
        inter_chain=bool(inter_chain),
        n_frames=n_frames,
        device=be.device,
        n_pairs=int(np.triu(allowed, 1).sum()),
        source=s.source,
    )
    return cm


def native_contacts(trajectory, reference, *, selection="heavy", cutoff: float = 4.5, min_separation: int = 4,
                    beta: float = 5.0, lambda_constant: float = 1.8, inter_chain: bool = True,
                    periodic: bool = True, coords=None, top=None, device: str = "auto") -> NativeContacts:
    """Fraction of native contacts Q(t), hard and soft (Best, Hummer and Eaton 2013).

    Native pairs are the atom pairs of ``selection`` that are within ``cutoff`` in the reference
    (``r0 <= cutoff``, as MDAnalysis' ``contact_matrix``), from residues at least ``min_separation``
    apart in the same chain (Best et al. use "more than three residues": 4), or from different chains
    (``inter_chain``). For each frame, over the K native pairs with current distance r:

    * ``q_soft`` = mean of ``1 / (1 + exp(beta (r - lambda_constant r0)))`` (MDAnalysis ``soft_cut_q``;
      beta = 5 per Angstrom, lambda = 1.8 for all-atom models, 1.5 for coarse-grained ones);
    * ``q_hard`` = fraction with ``r <= r0`` (MDAnalysis ``hard_cut_q`` as ``Contacts`` calls it);
    * ``q_radius`` = fraction with ``r <= cutoff`` (MDAnalysis ``radius_cut_q``).

    Parameters
    ----------
    trajectory : Structure, path or mdtraj.Trajectory
        Frames to score.
    reference : Structure, path or mdtraj.Trajectory
        The native state (its first frame), with the same atoms after ``selection`` (same count and
        names, in the same order).
    selection : str or index array
        Atoms that make contacts; default ``"heavy"``.
    cutoff : float
        Native-contact radius in the reference, Angstrom.
    min_separation : int
        Minimum residue-index separation of same-chain pairs.
    beta, lambda_constant : float
        Soft switching parameters (1/Angstrom, unitless).
    inter_chain : bool
        Count pairs of atoms from different chains.
    periodic : bool
        Minimum-image distances where the structures have boxes.
    coords : array, optional
        Trajectory coordinates to use instead of ``trajectory.coords`` (NumPy, CuPy or torch).
    top : optional
        Topology for trajectory paths.
    device : {"auto", "cpu", "gpu"}

    Returns
    -------
    NativeContacts
        ``q_soft``, ``q_hard``, ``q_radius`` (frames,) float64 of the coordinates' array type, and the
        native ``pairs`` (K, 2) with their reference distances ``r0`` (K,).

    Raises
    ------
    InputError
        Mismatched atoms between trajectory and reference, or no native contact.

    Examples
    --------
    Native CA contacts (8 Angstrom) of the closed form of adenylate kinase along a closed-to-open
    transition, every 24th frame:

    >>> import protgpu as pg
    >>> traj = pg.load("datasets/adk_dims.dcd", top="datasets/adk_open.pdb")
    >>> q = native_contacts(traj.frames(slice(0, 98, 24)), "datasets/adk_closed.pdb", selection="ca",
    ...                     cutoff=8.0, device="cpu")
    >>> len(q.pairs)
    448
    >>> q.q_radius.round(3).tolist()
    [0.92, 0.795, 0.826, 0.817, 0.833]
    >>> q.q_soft.round(2).tolist()
    [1.0, 0.99, 0.96, 0.94, 0.94]
    """
    from .distances import distances

    traj = _as_structure(trajectory, "trajectory", top=top)
    ref = _as_structure(reference, "reference", top=top)
    idx = traj.select_indices(selection)
    ridx = ref.select_indices(selection)
    tname, rname = traj.source or "trajectory", ref.source or "reference"
    if idx.size < 2:
        raise InputError(f"{tname}: selection {selection!r} matches fewer than two atoms")
    if idx.size != ridx.size:
        raise InputError(f"{tname}: selection {selection!r} gives {idx.size} atoms but {ridx.size} in {rname}")
    if not np.array_equal(_upper(traj.atoms.name[idx]), _upper(ref.atoms.name[ridx])):
        k = int(np.flatnonzero(_upper(traj.atoms.name[idx]) != _upper(ref.atoms.name[ridx]))[0])
        raise InputError(f"{tname}: atom {k} of the selection is {traj.atoms.name[idx][k]} but "
                         f"{ref.atoms.name[ridx][k]} in {rname}")
    # Native pairs from the reference, in float64 on the host, in row blocks (done once).
    x0 = np.asarray(ref.coords[0, ridx], dtype=np.float64)
    rbox = ref.box[0] if (periodic and ref.box is not None) else None
    ri = np.asarray(traj.atoms.residue_index, dtype=np.int64)[idx]
    tab = traj.residues
    key = np.char.add(np.char.add(np.asarray(tab.chain, dtype=str), "\x1f"), np.asarray(tab.segid, dtype=str))
    chain = np.unique(key, return_inverse=True)[1].reshape(-1)[ri]
    found_a, found_b = [], []
    n = idx.size
    step = max(1, (1 << 22) // n)
    for a0 in range(0, n, step):
        a1 = min(n, a0 + step)
        d = np.asarray(distances(x0[a0:a1], x0[a0:], box=rbox, device="cpu"))  # rows vs atoms >= a0
        ok = _allowed_block(chain[a0:a1], ri[a0:a1], chain[a0:], ri[a0:], int(min_separation), inter_chain)
        ok &= d <= cutoff
        ok &= np.arange(a0, a1)[:, None] < np.arange(a0, n)[None, :]
        ia, ib = np.nonzero(ok)
        found_a.append(ia + a0)
        found_b.append(ib + a0)
    ia, ib = (np.concatenate(v) for v in (found_a, found_b))
    if ia.size == 0:
        raise InputError(f"{rname}: no native contacts within {cutoff} A for selection {selection!r}")
    pairs = np.stack([idx[ia], idx[ib]], axis=1).astype(np.int64)

    be = dispatch(coords, device=device)
    x = _work_coords(traj, coords, be, tname)
    xp = get_namespace(x)
    box = traj.box if periodic else None
    # r and r0 in float64 through the same code on the same device (as MDAnalysis computes both with
    # distance_array): a frame equal to the reference then has r == r0 exactly, and q_hard = 1.
    used = np.unique(pairs)
    local = np.searchsorted(used, pairs)
    x_used = xp.ascontiguousarray(x[:, xp.asarray(used)].astype(xp.float64))
    x_ref = xp.asarray(np.asarray(ref.coords[:1], dtype=np.float64)[:, ridx[np.searchsorted(idx, used)]])
    r0_d = distances(x_ref, pairs=local, box=rbox, device=be.device)[0]
    r = distances(x_used, pairs=local, box=box, device=be.device)  # (F, K)
    r0 = to_numpy(r0_d).astype(np.float64)
    r0_d, r = xp.asarray(r0_d), xp.asarray(r)
    with np.errstate(over="ignore"):
        q_soft = (1.0 / (1.0 + xp.exp(beta * (r - lambda_constant * r0_d[None])))).mean(axis=1)
    q_hard = (r <= r0_d[None]).mean(axis=1)
    q_radius = (r <= cutoff).mean(axis=1)
    return NativeContacts(be.wrap(q_soft), be.wrap(q_hard), be.wrap(q_radius), pairs, r0)
