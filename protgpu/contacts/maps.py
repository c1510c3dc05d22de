"""Result types of :func:`protgpu.contacts` and :func:`protgpu.native_contacts`: :class:`ResidueLabels`,
:class:`ContactPairs`, :class:`ContactMap` and :class:`NativeContacts`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .._array import to_numpy

__all__ = ["ContactMap", "ContactPairs", "NativeContacts", "ResidueLabels"]


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
    """Result of :func:`~protgpu.contacts.api.contacts`.

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
    """Result of :func:`~protgpu.contacts.api.native_contacts`.

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
