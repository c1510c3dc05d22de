"""The load dispatch: :func:`load` turns a path, a Structure, an mdtraj or Biopython object, an array
or a list of them into a :class:`~protgpu.structure.core.Structure`; path handling and file reading.

Internal API (tests): :func:`read_bytes`, :func:`path_name`, :func:`check_file` (from
:mod:`protgpu.io._files`), :func:`module_of`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..structure import Structure
from ._files import check_file, read_bytes
from .biopython import from_biopython
from .formats import (
    MDTRAJ_SELF_CONTAINED,
    MMCIF_EXTENSIONS,
    PDB_EXTENSIONS,
    TRAJECTORY_EXTENSIONS,
    mdtraj_suffixes,
    split_ext,
    supported_text,
)
from .mmcif import read_mmcif
from .pdb import parse_pdb
from .trajectory import from_mdtraj, load_trajectory

__all__ = ["load"]

#: Largest coordinate magnitude a file may hold, Angstrom: beyond it a value is a corrupt field or
#: an overflow (float32 keeps about 0.01 A of precision there), not a position.
MAX_COORD = 1e5

_ALTLOC_MODES = ("first", "occupancy")


def load(source, *, top=None, frames=None, altloc: str = "first", model: int | None = None) -> Structure:
    """Load a structure or trajectory as a :class:`Structure` (coordinates in Angstrom).

    Parameters
    ----------
    source : str, os.PathLike, Structure, mdtraj.Trajectory, Bio.PDB entity, array or sequence
        * path to a PDB/mmCIF file (``.pdb .ent .cif .mmcif``): every model becomes a frame; all
          models must have the same atoms in the same order;
        * path to a trajectory mdtraj reads (``.xtc .dcd .trr .nc .netcdf .h5 .gro .mdcrd .trj``
          ...): coordinates and box vectors converted from nm to Angstrom, time in ps;
        * any of these compressed with gzip, bzip2 or xz (``.gz .bz2 .xz``; recognised by content,
          so a ``.gz`` holding plain text is read as it is; mdtraj formats are decompressed to a
          temporary file, removed afterwards). Only regular files are read (a pipe or device
          is refused), at most ``$PROTGPU_MAX_INPUT_BYTES`` (default 1 GiB) after decompression;
        * a ``Structure``: returned as is (or its ``frames`` subset);
        * an ``mdtraj.Trajectory`` (nm, converted) or a Biopython ``Structure``/``Model``/``Chain``
          (Angstrom; each Bio model a frame; disordered atoms as Biopython selects them);
        * a NumPy array of shape (frames, atoms, 3) or (atoms, 3): wrapped by
          :meth:`Structure.from_coords`;
        * a list/tuple of any of these: loaded one by one and stacked as frames; their atom
          tables must be equal.
    top : str, os.PathLike, Structure or mdtraj.Topology, optional
        Topology for trajectory files that carry none (xtc, dcd, trr, nc, ...): a PDB/mmCIF/PSF path
        or a Structure gives the atom table (its atoms must match the trajectory's count; atom
        names as the file writes them); a ``.prmtop``/``.gro``/``.h5`` path is read by mdtraj.
        Ignored for PDB/mmCIF sources.
    frames : int, slice or array_like, optional
        Keep only these frames (models for PDB/mmCIF), as :meth:`Structure.frames`.
    altloc : {"first", "occupancy"}
        Alternate locations (PDB/mmCIF): for each atom (same residue and atom name) keep its first
        record in the file ("first", the default, as mdtraj and gemmi do) or the record with the
        highest occupancy, the first one on ties ("occupancy", as Biopython does). Atoms without an
        altloc are always kept.
    model : int, optional
        Keep only the model with this number (the MODEL serial in PDB, ``pdbx_PDB_model_num`` in
        mmCIF; a file without MODEL records has model 1). Must be an int.

    Returns
    -------
    Structure
        ``coords`` (frames, atoms, 3) float32 Angstrom. Hydrogens, waters and ligands are kept;
        virtual sites (TIP4P ``MW``, lone pairs) have element ``""`` and are not heavy atoms.
        The chain id is kept as written (blank -> ``""``; the segid is stored separately).

        Boxes: a trajectory's box is a simulation box (``box_source == "simulation"``). A PDB
        ``CRYST1`` or mmCIF ``_cell`` is read into ``box`` as mdtraj and MDAnalysis read it (each
        model's own when every model has a CRYST1; none for the ``1 1 1`` placeholder or an
        all-zero cell) with ``box_source == "crystal"``: a crystal lattice, not periodic
        boundaries of the model. Which functions apply a box by default: ``contacts`` and
        ``native_contacts`` (``periodic=None``) apply a simulation box and not a crystal cell;
        ``periodic=True`` applies either, ``periodic=False`` none. ``distances`` applies only the
        ``box=`` it is given; ``protgpu distances --periodic`` passes the input's box whatever its
        source (see :meth:`Structure.periodic_box`).

    Raises
    ------
    InputError
        Missing file, directory, pipe or device, empty file, a file or decompressed stream over the
        size cap, corrupt compressed data, unreadable content or no atoms, truncated PDB record
        (with its line number), models with different atoms (with the model number and both atom
        counts), coordinates that are not plain decimal numbers or reach 1e5 Angstrom in
        magnitude (a corrupt field or overflow), NaN/inf coordinates, a cell or box with a
        non-positive edge or volume, unknown extension (the supported ones are listed), trajectory
        without ``top``, a frame out of range (with the frame count), a truncated trajectory.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "two.pdb")
    >>> with open(path, "w") as fh:
    ...     _ = fh.write("ATOM      1  N   GLY A   1      11.104   6.134  -6.504  1.00  0.00           N\\n"
    ...                  "ATOM      2  CA  GLY A   1      11.639   6.071  -5.147  1.00  0.00           C\\n")
    >>> s = load(path)
    >>> s.n_frames, s.n_atoms, s.n_residues
    (1, 2, 1)
    >>> s.coords[0, 1].tolist()
    [11.638999938964844, 6.071000099182129, -5.146999835968018]
    >>> s.select("ca").atoms.name.tolist()
    ['CA']
    """
    if altloc not in _ALTLOC_MODES:
        raise InputError(f"altloc must be one of {_ALTLOC_MODES}, got {altloc!r}")
    if model is not None and (not isinstance(model, (int, np.integer)) or isinstance(model, bool)):
        raise InputError(f"model must be an int (the model number), got {type(model).__name__} {model!r}")
    if isinstance(source, Structure):
        s = source
    elif isinstance(source, (str, os.PathLike)):
        s, frames_done = _load_path(path_name(source), top=top, altloc=altloc, model=model, frames=frames)
        if frames_done:
            frames = None
    elif isinstance(source, np.ndarray):
        if source.ndim in (2, 3) and source.shape[-2] == 0:
            raise InputError(f"array: coordinates have no atoms (shape {source.shape})")
        s = Structure.from_coords(source, source="array")
    elif isinstance(source, (list, tuple)):
        s = _load_many(source, top=top, altloc=altloc, model=model)
    elif module_of(source).startswith("mdtraj") and hasattr(source, "xyz"):
        s = from_mdtraj(source, "mdtraj.Trajectory")
    elif module_of(source).startswith("Bio.PDB"):
        s = from_biopython(source)
    else:
        raise InputError(
            f"cannot load an object of type {type(source).__name__}: expected a path, a Structure, an "
            "mdtraj.Trajectory, a Bio.PDB Structure/Model/Chain, an array or a list of these"
        )
    if frames is not None:
        s = s.frames(frames)
    return s


def module_of(obj) -> str:
    """The module name of ``obj``'s type (``''`` when unknown): how mdtraj and Bio.PDB objects are recognised
    without importing those packages."""
    return type(obj).__module__ or ""


def _load_many(items: Sequence, *, top, altloc: str, model) -> Structure:
    if not items:
        raise InputError("load: empty list of inputs")
    structures = [load(x, top=top, altloc=altloc, model=model) for x in items]
    first = structures[0]
    for item, s in zip(items, structures, strict=True):
        if s.atoms != first.atoms:
            name = s.source or str(item)
            raise InputError(
                f"{name}: atoms differ from {first.source} ({s.n_atoms} vs {first.n_atoms} atoms, or "
                "different names/residues); files stacked as frames must have identical atoms"
            )
    boxes = [s.box for s in structures]
    sources = {s.box_source for s in structures}
    times = [s.time for s in structures]
    return Structure(
        np.concatenate([s.coords for s in structures]),
        first.atoms,
        source=f"{first.source} (+{len(structures) - 1} more)" if len(structures) > 1 else first.source,
        box=np.concatenate(boxes) if all(b is not None for b in boxes) else None,
        time=np.concatenate(times) if all(t is not None for t in times) else None,
        box_source="crystal" if sources == {"crystal"} else None,
    )


def path_name(source) -> str:
    """``str(Path(source))``, without building the Path when ``source`` is a string already in that
    form (no empty or '.' component, no trailing slash): pathlib's parsing costs several
    microseconds, a noticeable part of loading a small PDB file."""
    if (
        type(source) is str
        and os.sep == "/"
        and source not in ("", ".")
        and "//" not in source
        and "/./" not in source
        and not source.startswith("./")
        and not source.endswith(("/", "/."))
    ):
        return source
    return str(Path(source))


def _load_path(name: str, *, top, altloc: str, model, frames):
    """Load the file ``name`` (``str(Path(source))``); returns (structure, whether ``frames`` was applied)."""
    ext, _ = split_ext(name)
    if ext in PDB_EXTENSIONS:
        data = read_bytes(name)  # checks the file as check_file does; decompresses by content
        return parse_pdb(data, name, altloc=altloc, model=model, path=name), False
    if ext in MMCIF_EXTENSIONS:
        return read_mmcif(name, name, altloc=altloc, model=model), False
    if ext in TRAJECTORY_EXTENSIONS or ext in MDTRAJ_SELF_CONTAINED or ext in mdtraj_suffixes():
        check_file(name)
        # trajectory loading applies ``frames`` itself (reading one frame is cheaper than all)
        s = load_trajectory(Path(name), ext, top=top, frames=frames)
        check_range(s.coords, name)
        return s, True
    raise InputError(f"{name}: unknown file extension {ext or '(none)'!r}; supported: {supported_text()}")


def check_range(coords: np.ndarray, name: str) -> None:
    """Raise InputError when a coordinate's magnitude reaches :data:`MAX_COORD` (1e5 Angstrom)."""
    big = np.abs(coords) >= MAX_COORD
    if big.any():
        f, a, _ = np.argwhere(big)[0]
        raise InputError(
            f"{name}: frame {f}, atom {a}: coordinate {float(coords[f, a][big[f, a]][0]):g} A out of range "
            f"(|x| must be below {MAX_COORD:g} A; a corrupt file?)"
        )
