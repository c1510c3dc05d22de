"""Trajectories and ``mdtraj.Trajectory`` objects through mdtraj, converted from nm to Angstrom.

mdtraj is imported inside the functions, so that ``import protgpu`` stays light.
Internal API: :func:`load_trajectory` (a path) and :func:`from_mdtraj` (a Trajectory).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..structure import AMINO_ACIDS, WATER_RESNAMES, AtomTable, Structure, guess_elements, standardize_resnames
from ._common import one_line
from ._files import decompressed_copy, quiet_reader
from .formats import MDTRAJ_ALIASES, MMCIF_EXTENSIONS, PDB_EXTENSIONS, TRAJECTORY_EXTENSIONS, split_ext
from .psf import read_psf

# Formats whose reader (HDF5) prints to the C-level stderr as well as stdout.
_NOISY_STDERR = (".h5", ".hdf5", ".lh5")


def _chain_letters(k: int) -> str:
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    out = ""
    k += 1
    while k:
        k, r = divmod(k - 1, 26)
        out = letters[r] + out
    return out


def _table_from_mdtraj_topology(top) -> AtomTable:
    names, elements, resnames, resids, chains, segids, hetero, counts = [], [], [], [], [], [], [], []
    for chain in top.chains:
        cid = (getattr(chain, "chain_id", None) or "").strip() or _chain_letters(chain.index)
        for res in chain.residues:
            atoms = list(res.atoms)
            counts.append(len(atoms))
            resnames.append(res.name)
            resids.append(res.resSeq)
            chains.append(cid)
            segids.append((getattr(res, "segment_id", "") or "").strip())
            # mdtraj does not keep the HETATM flag: everything that is not polymer counts as hetero.
            hetero.append(not (res.is_protein or res.is_nucleic))
            names.extend(a.name for a in atoms)
            elements.extend(
                (a.element.symbol if a.element is not None and a.element.symbol not in ("VS", "") else "")
                for a in atoms
            )
    counts = np.asarray(counts, dtype=np.int64)
    rep = np.repeat(np.arange(counts.size), counts)
    resname = np.asarray(resnames, dtype=str)[rep] if rep.size else np.zeros(0, "<U1")
    element = np.char.upper(np.asarray(elements, dtype=str)) if elements else np.zeros(0, "<U1")
    name_arr = np.asarray(names, dtype=str) if names else np.zeros(0, "<U1")
    # mdtraj guesses elements from names when a PDB has no element column, and reads the CHARMM
    # left-justified "CA  " as calcium; an amino-acid or water atom is never a two-letter element
    # (selenium excepted), so those get the name-based guess.
    std = standardize_resnames(resname)
    polymer = np.isin(std, list(AMINO_ACIDS)) | np.isin(resname, list(WATER_RESNAMES))
    missing = (element == "") | (polymer & (np.char.str_len(element) == 2) & (element != "SE"))
    if missing.any():
        element = element.astype("<U2")
        element[missing] = guess_elements(name_arr[missing], resname[missing])
    return AtomTable(
        name=name_arr,
        element=element,
        resname=resname,
        resid=np.asarray(resids, dtype=np.int32)[rep] if rep.size else np.zeros(0, np.int32),
        icode=np.full(rep.size, "", dtype="<U1"),
        chain=np.asarray(chains, dtype=str)[rep] if rep.size else np.zeros(0, "<U1"),
        segid=np.asarray(segids, dtype=str)[rep] if rep.size else np.zeros(0, "<U1"),
        hetero=np.asarray(hetero, dtype=bool)[rep] if rep.size else np.zeros(0, bool),
        # mdtraj residues are residues: keep its grouping (two residues with equal ids stay apart).
        residue_index=rep.astype(np.int32),
    )


def from_mdtraj(traj, source: str, atoms: AtomTable | None = None) -> Structure:
    """A Structure from an ``mdtraj.Trajectory`` (coordinates and box nm -> Angstrom, time ps); ``atoms``
    replaces the table built from its topology."""
    xyz = np.asarray(traj.xyz, dtype=np.float32) * np.float32(10.0)
    box = traj.unitcell_vectors
    box = None if box is None else np.asarray(box, dtype=np.float32) * np.float32(10.0)
    if box is not None and not box.any():  # an all-zero cell (a GRO or XTC without a box) is no box
        box = None
    time = None if traj.time is None else np.asarray(traj.time, dtype=np.float64)
    if atoms is None:
        atoms = _table_from_mdtraj_topology(traj.topology)
    return Structure(xyz, atoms, source=source, box=box, time=time)


def _placeholder_topology(n_atoms: int):
    """An mdtraj Topology with n atoms and nothing else: enough for mdtraj to read coordinates, and
    far cheaper than having mdtraj parse the topology file a second time."""
    import mdtraj

    top = mdtraj.Topology()
    res = top.add_residue("UNK", top.add_chain())
    for _ in range(n_atoms):
        top.add_atom("X", None, res)
    return top


def load_trajectory(path: Path, ext: str, *, top, frames) -> Structure:
    """Read a trajectory file through mdtraj, with ``top`` (path, Structure or mdtraj Topology) for
    formats that hold no topology; ``frames`` as :meth:`Structure.frames` (one int reads one frame)."""
    import mdtraj

    from .load import check_file, load, module_of  # (load imports this module)

    name = str(path)
    atoms = None
    md_top = None
    if top is None:
        if ext in TRAJECTORY_EXTENSIONS:
            raise InputError(
                f"{name}: a {ext} trajectory holds no topology; pass top= (a PDB/mmCIF file or a Structure)"
            )
    elif isinstance(top, Structure):
        atoms = top.atoms
    elif module_of(top).startswith("mdtraj"):
        md_top = top.topology if hasattr(top, "xyz") else top
    elif isinstance(top, (str, os.PathLike)):
        tpath = Path(top)
        t_ext, _ = split_ext(tpath)
        if t_ext in PDB_EXTENSIONS + MMCIF_EXTENSIONS:
            atoms = load(tpath).atoms
        elif t_ext == ".psf":
            atoms = read_psf(str(tpath))
        else:
            check_file(tpath)
            try:
                with quiet_reader(str(tpath), _fds(t_ext)), _mdtraj_path(str(tpath), t_ext) as md_path:
                    md_top = mdtraj.load_topology(md_path)
            except InputError:
                raise
            except Exception as exc:  # mdtraj raises many types; report them all the same way
                raise InputError(f"{tpath}: cannot read topology: {one_line(exc)}") from None
    else:
        raise InputError(f"{name}: top must be a path, a Structure or an mdtraj Topology, not {type(top).__name__}")
    if atoms is not None:
        md_top = _placeholder_topology(len(atoms))
    kwargs = {} if md_top is None else {"top": md_top}
    one = isinstance(frames, (int, np.integer)) and not isinstance(frames, bool) and frames >= 0
    try:
        with quiet_reader(name, _fds(ext)), _mdtraj_path(name, ext) as md_path:
            if one:
                traj = mdtraj.load_frame(md_path, int(frames), **kwargs)
                frames_left = None
                if traj.n_frames == 0:  # mdtraj's answer to a frame past the end
                    total = mdtraj.load(md_path, **kwargs).n_frames
                    raise InputError(f"{name}: frame {frames} out of range (the trajectory has {total} frames)")
            else:
                traj = mdtraj.load(md_path, **kwargs)
                frames_left = frames
    except InputError:
        raise
    except IndexError as exc:
        raise InputError(f"{name}: frame {frames} out of range ({one_line(exc)})") from None
    except Exception as exc:  # wrap whatever mdtraj/netCDF/HDF5 raise with the file name
        msg = one_line(exc)
        if "could not open" in msg.lower() or isinstance(exc, (EOFError, OSError, ValueError)):
            msg = f"truncated or corrupt {ext} file? ({msg})"
        if md_top is not None:
            msg += f" (topology has {md_top.n_atoms} atoms)"
        raise InputError(f"{name}: cannot read trajectory: {msg}") from None
    if traj.n_frames == 0:
        raise InputError(f"{name}: trajectory has no frames")
    if traj.n_atoms == 0:
        raise InputError(f"{name}: no atoms")
    if atoms is None:
        atoms = _table_from_mdtraj_topology(traj.topology)
    s = from_mdtraj(traj, name, atoms=atoms)
    return s.frames(frames_left) if frames_left is not None else s


def _fds(ext: str) -> tuple[int, ...]:
    """The C-level descriptors a reader of ``ext`` writes to (see :func:`quiet_reader`)."""
    return (1, 2) if ext in _NOISY_STDERR else (1,)


@contextlib.contextmanager
def _mdtraj_path(name: str, ext: str):
    """A path mdtraj reads as ``ext``: the file itself, a decompressed temporary copy, or (a suffix
    mdtraj knows under another name, :data:`MDTRAJ_ALIASES`) a temporary link named as mdtraj wants."""
    with decompressed_copy(name, MDTRAJ_ALIASES.get(ext, ext)) as path:
        alias = MDTRAJ_ALIASES.get(ext)
        if alias is None or path != name:
            yield path
            return
        with tempfile.TemporaryDirectory(prefix="protgpu-") as folder:
            link = os.path.join(folder, "input" + alias)
            os.symlink(os.path.abspath(name), link)
            yield link
