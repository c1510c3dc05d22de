"""The :class:`Structure` container: coordinates of one or more frames plus an atom table."""

from __future__ import annotations

import os

import numpy as np

from .._inputs import check_finite
from ..errors import InputError
from .selection import select_mask
from .tables import AtomTable, ResidueTable, residue_table

__all__ = ["Structure"]


class Structure:
    """Coordinates of one or more frames of the same atoms, with their atom table.

    Parameters
    ----------
    coords : array_like, shape (frames, atoms, 3) or (atoms, 3)
        Cartesian coordinates in Angstrom. Stored as C-contiguous float32 (no copy when already so).
    atoms : AtomTable
        Annotation of the ``atoms`` atoms.
    source : str, optional
        File name or description, used in error messages and ``repr``.
    box : array_like, optional
        Periodic box vectors in Angstrom, rows a, b, c: shape (frames, 3, 3) or (3, 3) (same box for
        every frame); (3,) or (frames, 3) give the edge lengths of a rectangular box.
    time : array_like, optional
        Time of each frame in ps, shape (frames,).
    box_source : {None, "simulation", "crystal"}, optional
        Where ``box`` comes from: ``"crystal"`` for a unit cell read from a PDB ``CRYST1`` record or
        an mmCIF ``_cell``, which functions apply only when asked (``periodic=True``); anything
        else (a trajectory's box, one passed here) is a simulation box, applied by default. See
        :meth:`periodic_box`.

    Raises
    ------
    InputError
        Wrong shapes, atom count differing from the table, a non-finite coordinate (the message
        names the source, the first bad frame and atom), or a box with a non-positive edge length
        or volume.

    Examples
    --------
    >>> import numpy as np
    >>> s = Structure.from_coords(np.zeros((5, 3)), source="demo")
    >>> s
    <Structure demo: 1 frame, 5 atoms, 5 residues>
    >>> s.coords.shape, s.coords.dtype
    ((1, 5, 3), dtype('float32'))
    """

    __slots__ = ("coords", "atoms", "source", "box", "time", "box_source")

    def __init__(self, coords, atoms: AtomTable, source: str | None = None, box=None, time=None,
                 box_source: str | None = None):
        where = source or "coordinates"
        if not isinstance(atoms, AtomTable):
            raise InputError(f"{where}: atoms must be an AtomTable, got {type(atoms).__name__}")
        try:
            xyz = np.asarray(coords)
            if xyz.dtype.kind not in "fiub":
                raise TypeError(xyz.dtype)
            if xyz.dtype != np.float32 or not xyz.flags.c_contiguous:
                # (the loaders hand over C-contiguous float32: no cast, and no errstate to enter)
                with np.errstate(over="ignore"):  # overflow gives inf, reported just below
                    xyz = np.ascontiguousarray(xyz, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: coordinates must be a numeric array ({exc})") from None
        if xyz.ndim == 2:
            xyz = xyz[None]
        if xyz.ndim != 3 or xyz.shape[2] != 3:
            raise InputError(f"{where}: coordinates must have shape (frames, atoms, 3), got {np.shape(coords)}")
        if xyz.shape[1] != len(atoms):
            raise InputError(f"{where}: {xyz.shape[1]} atoms in the coordinates but {len(atoms)} in the atom table")
        check_finite(xyz, where)  # the front door's one check and wording
        n_frames = xyz.shape[0]
        if box is not None:
            b = np.asarray(box, dtype=np.float32)
            if b.shape == (3,) or (b.ndim == 2 and b.shape[1] == 3 and b.shape != (3, 3)):
                if not (b > 0).all():  # (also catches NaN)
                    raise InputError(f"{where}: box edge lengths must be positive, got {b.tolist()}")
                # edge lengths of a rectangular box -> diagonal box vectors
                b = b[..., :, None] * np.eye(3, dtype=np.float32)
            if b.shape == (3, 3):
                b = np.broadcast_to(b, (n_frames, 3, 3))
            if b.shape != (n_frames, 3, 3):
                raise InputError(f"{where}: box must have shape ({n_frames}, 3, 3), got {np.shape(box)}")
            if not np.isfinite(b).all():
                raise InputError(f"{where}: non-finite box vectors")
            check_box(b, where)
            box = np.ascontiguousarray(b)
        if time is not None:
            t = np.asarray(time, dtype=np.float64).reshape(-1)
            if t.shape != (n_frames,):
                raise InputError(f"{where}: time must have shape ({n_frames},), got {np.shape(time)}")
            time = t
        self.coords = xyz
        self.atoms = atoms
        self.source = source
        self.box = box
        self.time = time
        self.box_source = None if box is None else (box_source or "simulation")

    def periodic_box(self, periodic: bool | None = None):
        """The box a periodic computation should use, or None.

        Parameters
        ----------
        periodic : bool or None
            ``None`` (the default of the functions that take it): a simulation box, but not a
            crystal unit cell (``box_source == "crystal"``: a PDB ``CRYST1`` or mmCIF ``_cell``
            describes the crystal's lattice, not periodic boundaries of this model); ``True``: the
            box whatever its source; ``False``: none.

        Returns
        -------
        np.ndarray of float32, shape (frames, 3, 3), or None

        Examples
        --------
        >>> import protgpu as pg
        >>> s = pg.load("datasets/adk_open.pdb")
        >>> s.box_source, s.periodic_box() is None, s.periodic_box(True).shape
        ('crystal', True, (1, 3, 3))
        """
        if periodic is False or self.box is None:
            return None
        if periodic is None and self.box_source == "crystal":
            return None
        return self.box

    @classmethod
    def _from_parts(cls, coords: np.ndarray, atoms: AtomTable, source: str | None) -> Structure:
        """A Structure from parts that already pass every check of ``__init__`` (internal, for loaders).

        ``coords`` must be C-contiguous float32 of shape (frames, len(atoms), 3) and finite; no box,
        no time. The PDB reader knows this of what it decoded, and the checks (a pass over every
        coordinate for finiteness among them) cost a measurable part of loading a small file.
        """
        s = object.__new__(cls)
        s.coords, s.atoms, s.source, s.box, s.time, s.box_source = coords, atoms, source, None, None, None
        return s

    @classmethod
    def from_coords(cls, coords, source: str | None = None) -> Structure:
        """Wrap a bare coordinate array with a placeholder atom table.

        Every atom becomes its own residue ``UNK`` (resid 1..n) in chain ``"A"``, with name and
        element ``"X"``; so selections other than ``all``/``index``/``resid`` match nothing useful.

        Parameters
        ----------
        coords : array_like, shape (frames, atoms, 3) or (atoms, 3)
            Angstrom.
        source : str, optional
            Description for error messages.

        Returns
        -------
        Structure

        Examples
        --------
        >>> import numpy as np
        >>> s = Structure.from_coords(np.zeros((2, 5, 3)))
        >>> s.n_frames, s.n_atoms, s.coords.dtype
        (2, 5, dtype('float32'))
        >>> s.select("resid 2-3").n_atoms
        2
        """
        shape = np.shape(coords)
        if len(shape) not in (2, 3):
            raise InputError(f"{source or 'coordinates'}: coordinates must have shape (frames, atoms, 3), got {shape}")
        n = shape[-2]
        atoms = AtomTable(
            name=np.full(n, "X"),
            element=np.full(n, "X"),
            resname=np.full(n, "UNK"),
            resid=np.arange(1, n + 1, dtype=np.int32),
            icode=np.full(n, ""),
            chain=np.full(n, "A"),
            segid=np.full(n, ""),
            hetero=np.zeros(n, dtype=bool),
            residue_index=np.arange(n, dtype=np.int32),
        )
        return cls(coords, atoms, source=source)

    # -- sizes -----------------------------------------------------------------------------------------
    @property
    def n_frames(self) -> int:
        """Number of frames."""
        return int(self.coords.shape[0])

    @property
    def n_atoms(self) -> int:
        """Number of atoms."""
        return int(self.coords.shape[1])

    @property
    def n_residues(self) -> int:
        """Number of residues."""
        return self.atoms.n_residues

    @property
    def atom_residue(self) -> np.ndarray:
        """Residue index (0..R-1) of each atom, int32 shape (atoms,); same as ``atoms.residue_index``."""
        return self.atoms.residue_index

    @property
    def residues(self) -> ResidueTable:
        """Per-residue table (chain, resid, icode, resname, std_resname, segid, atom_start, atom_count)."""
        return residue_table(self.atoms)

    def __repr__(self) -> str:
        f = self.n_frames
        # the file name, not its whole path, keeps the repr one short line
        label = os.path.basename(self.source) if self.source else "(no source)"
        return (
            f"<Structure {label}: {f} frame{'s' if f != 1 else ''}, "
            f"{self.n_atoms} atoms, {self.n_residues} residues>"
        )

    # -- selection -------------------------------------------------------------------------------------
    def select_indices(self, selection) -> np.ndarray:
        """Indices of the atoms a selection matches.

        Parameters
        ----------
        selection : str or array_like
            A selection string (grammar in :meth:`select`), an integer index array or a boolean mask
            of shape (atoms,).

        Returns
        -------
        np.ndarray of int64, shape (m,)
            Sorted, unique atom indices; empty when nothing matches (a range that holds no atom).

        Raises
        ------
        InputError
            A bad selection, or a named value that no atom has (``chain Z``: the message lists the
            chains there are).

        Examples
        --------
        >>> import protgpu as pg
        >>> s = pg.load("datasets/adk_open.pdb")
        >>> idx = s.select_indices("resid 1 and backbone")
        >>> idx.tolist(), s.atoms.name[idx].tolist()
        ([0, 4, 17, 18], ['N', 'CA', 'C', 'O'])
        """
        return np.flatnonzero(select_mask(self.atoms, selection, self.source)).astype(np.int64)

    def select(self, selection) -> Structure:
        """New Structure with the selected atoms, all frames.

        Selection strings combine, case-insensitively:

        ``all``, ``none``; ``protein`` (amino acids, including the MD and modified names of
        :data:`NONSTANDARD_RESNAMES`; caps such as ACE/NME are not protein); ``ca`` (name CA, element
        C, protein or UNK, an amino acid of unknown type); ``backbone`` (N, CA, C, O of protein);
        ``heavy`` (element not H or D);
        ``hydrogen``; ``water``; ``hetero`` (HETATM); ``chain A B`` and ``segid X`` (case-sensitive);
        ``resid 10-50`` / ``resid 10:50`` / ``resid 5 7 9`` / ``resid 10 to 50``; ``index 0-9``
        (0-based, inclusive ranges); ``resname ALA GLY``, ``name CA CB``, ``element C N``
        (case-insensitive); joined with ``and``, ``or``, ``not`` and parentheses (``not`` binds
        tightest, then ``and``, then ``or``).

        Parameters
        ----------
        selection : str or array_like
            Selection string, integer index array or boolean mask of shape (atoms,). Atoms keep
            their original order.

        Returns
        -------
        Structure
            Same frames, box and time; atom table restricted, residues renumbered from 0.

        Raises
        ------
        InputError
            Unknown keyword (the message lists the valid ones), malformed expression, or a selection
            matching no atom (the message names the source and the expression).

        Examples
        --------
        >>> import numpy as np
        >>> s = Structure.from_coords(np.zeros((4, 3)), source="demo")
        >>> s.select("index 1-2").n_atoms
        2
        """
        idx = self.select_indices(selection)
        if idx.size == 0:
            what = repr(selection) if isinstance(selection, str) else "the given index/mask"
            raise InputError(f"{self.source or 'structure'}: selection {what} matches no atoms")
        return Structure(
            np.ascontiguousarray(self.coords[:, idx]), self.atoms.take(idx), source=self.source,
            box=self.box, time=self.time, box_source=self.box_source,
        )

    # -- frames ----------------------------------------------------------------------------------------
    def frames(self, idx) -> Structure:
        """New Structure with a subset of frames (same atoms).

        Parameters
        ----------
        idx : int, slice, array_like of int or bool
            Frame index (negative counts from the end), slice, index array or boolean mask.

        Returns
        -------
        Structure
            An int gives a single-frame Structure (coords shape (1, atoms, 3)).

        Examples
        --------
        >>> import protgpu as pg
        >>> traj = pg.load("datasets/adk_dims.dcd", top="datasets/adk_open.pdb")
        >>> traj.n_frames, traj.frames(slice(0, 10, 2)).n_frames
        (98, 5)
        >>> traj.frames(-1).coords.shape
        (1, 3341, 3)
        """
        f = self.n_frames
        where = self.source or "structure"
        if isinstance(idx, (int, np.integer)) and not isinstance(idx, bool):
            i = int(idx)
            if not -f <= i < f:
                raise InputError(f"{where}: frame {i} out of range ({f} frame{'s' if f != 1 else ''})")
            sel = slice(i % f, i % f + 1)
        elif isinstance(idx, slice):
            sel = idx
        else:
            arr = np.asarray(idx)
            if arr.dtype == bool:
                if arr.shape != (f,):
                    raise InputError(f"{where}: frame mask has shape {arr.shape}, expected ({f},)")
                sel = np.flatnonzero(arr)
            elif arr.size == 0 or arr.dtype.kind in "iu":
                sel = arr.astype(np.int64).reshape(-1)
                if sel.size and (sel.min() < -f or sel.max() >= f):
                    raise InputError(f"{where}: frame index out of range ({f} frames)")
            else:
                raise InputError(f"{where}: frames must be an int, slice, index array or boolean mask")
        coords = np.ascontiguousarray(self.coords[sel])
        if coords.shape[0] == 0:
            raise InputError(f"{where}: frame selection {idx!r} selects no frames")
        return Structure(
            coords, self.atoms, source=self.source,
            box=None if self.box is None else self.box[sel],
            time=None if self.time is None else self.time[sel], box_source=self.box_source,
        )

    def __getitem__(self, idx) -> Structure:
        """Frame slicing, same as :meth:`frames`."""
        return self.frames(idx)

    def copy(self) -> Structure:
        """Deep copy of coordinates, box and time; the (immutable) atom table is shared.

        Examples
        --------
        >>> import protgpu as pg
        >>> s = pg.load("datasets/adk_open.pdb")
        >>> moved = s.copy()
        >>> moved.coords += 10.0
        >>> round(float(moved.coords[0, 0, 0] - s.coords[0, 0, 0]), 3), moved.atoms is s.atoms
        (10.0, True)
        """
        return Structure(
            self.coords.copy(), self.atoms, source=self.source,
            box=None if self.box is None else self.box.copy(),
            time=None if self.time is None else self.time.copy(), box_source=self.box_source,
        )


def check_box(box: np.ndarray, where: str) -> None:
    """Raise InputError unless every (3, 3) box of ``box`` (frames, 3, 3) has edges of positive length
    and spans a positive volume (right-handed, as every MD code writes them)."""
    edges = np.linalg.norm(box.astype(np.float64), axis=-1)
    volume = np.linalg.det(box.astype(np.float64))
    bad = ~((edges > 0).all(axis=-1) & (volume > 0))
    if bad.any():
        f = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"{where}: box of frame {f} has a non-positive edge length or volume (edges "
            f"{np.round(edges[f], 3).tolist()} A, volume {volume[f]:.6g} A^3)"
        )
