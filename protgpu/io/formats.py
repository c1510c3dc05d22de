"""The one extension table: which file suffixes protgpu reads and writes, and through what.

:func:`protgpu.io.load` dispatches on it, and the CLI's input expansion
(``protgpu.batch.inputs``) lists the files of a directory with :func:`readable_suffixes`, so a
file that a directory expands to is one that ``load`` reads. Matching is case-insensitive.
"""

from __future__ import annotations

import os

__all__ = [
    "COMPRESSION_SUFFIXES",
    "MDTRAJ_ALIASES",
    "MDTRAJ_SELF_CONTAINED",
    "MMCIF_EXTENSIONS",
    "PDB_EXTENSIONS",
    "TRAJECTORY_EXTENSIONS",
    "WRITABLE_EXTENSIONS",
    "is_structure_path",
    "readable_suffixes",
    "split_ext",
]

#: PDB text, read by protgpu's own reader (:mod:`protgpu.io.pdb`).
PDB_EXTENSIONS = (".pdb", ".ent")
#: mmCIF text, read through gemmi (:mod:`protgpu.io.mmcif`).
MMCIF_EXTENSIONS = (".cif", ".mmcif")
#: Files that hold only coordinates and need ``top=`` for their atoms (read through mdtraj).
TRAJECTORY_EXTENSIONS = (
    ".xtc", ".trr", ".dcd", ".nc", ".netcdf", ".ncdf", ".binpos", ".mdcrd", ".crd", ".lammpstrj",
    ".xyz", ".dtr", ".stk", ".ncrst", ".rst7", ".restrt", ".inpcrd", ".tng", ".trj",
)
#: Suffixes mdtraj reads under another name: the file is handed to mdtraj as the second (Amber
#: writes its ASCII trajectories as ``.trj`` as often as ``.mdcrd``).
MDTRAJ_ALIASES = {".trj": ".mdcrd"}
#: Files that mdtraj reads with their own topology (no ``top=`` needed).
MDTRAJ_SELF_CONTAINED = (".h5", ".hdf5", ".lh5", ".gro", ".mol2", ".arc", ".hoomdxml", ".gsd")
#: Compression suffixes, allowed after any readable extension (``model.pdb.gz``, ``run.gro.bz2``,
#: ``traj.xtc.xz``); :func:`split_ext` peels them. What is decompressed is decided by the content's
#: magic bytes (a ``.gz`` that holds plain text is read as it is); formats read through mdtraj are
#: decompressed to a temporary file first.
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz")
#: What :func:`protgpu.io.save` writes: PDB and mmCIF through gemmi (optionally gzipped), DCD and
#: XTC through mdtraj.
WRITABLE_EXTENSIONS = (".pdb", ".ent", ".cif", ".mmcif", ".dcd", ".xtc")


def split_ext(path) -> tuple[str, bool]:
    """Lower-case extension of the file with a compression suffix (``.gz``, ``.bz2``, ``.xz``) peeled
    off, and whether there was one.

    ``path`` is a str or path-like; the suffixes are those of ``pathlib.PurePath.suffixes`` (none
    for a name ending in '.', leading dots belong to the stem), found without building a Path.

    Examples
    --------
    >>> split_ext("dir/Model.PDB.gz"), split_ext("traj.xtc"), split_ext(".hidden"), split_ext("a.gro.xz")
    (('.pdb', True), ('.xtc', False), ('', False), ('.gro', True))
    """
    name = os.path.basename(os.fspath(path))
    if name.endswith("."):
        return "", False
    suffixes = name.lstrip(".").lower().split(".")[1:]
    gz = bool(suffixes) and suffixes[-1] in ("gz", "bz2", "xz")  # (COMPRESSION_SUFFIXES: a hot path)
    if gz:
        suffixes = suffixes[:-1]
    return ("." + suffixes[-1] if suffixes else ""), gz


def readable_suffixes() -> tuple[str, ...]:
    """Every file suffix :func:`protgpu.io.load` reads, lower-case, compressed forms included.

    Returns
    -------
    tuple of str
        PDB and mmCIF extensions, trajectory and self-contained mdtraj extensions, then all of
        them with each compression suffix.

    Examples
    --------
    >>> ".pdb.gz" in readable_suffixes() and ".gro" in readable_suffixes()
    True
    """
    plain = PDB_EXTENSIONS + MMCIF_EXTENSIONS + TRAJECTORY_EXTENSIONS + MDTRAJ_SELF_CONTAINED
    return plain + tuple(e + z for z in COMPRESSION_SUFFIXES for e in plain)


def is_structure_path(path) -> bool:
    """Whether ``load`` reads a file of this name by its suffix (the table above, not mdtraj's extras).

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    bool

    Examples
    --------
    >>> is_structure_path("a/b.cif.gz"), is_structure_path("x.gro.bz2"), is_structure_path("x.zip")
    (True, True, False)
    """
    ext, _ = split_ext(path)
    return ext in _PLAIN


_PLAIN = frozenset(PDB_EXTENSIONS + MMCIF_EXTENSIONS + TRAJECTORY_EXTENSIONS + MDTRAJ_SELF_CONTAINED)


def supported_text() -> str:
    """The readable suffixes as one comma-separated line, for error messages (internal)."""
    plain = PDB_EXTENSIONS + MMCIF_EXTENSIONS + TRAJECTORY_EXTENSIONS + MDTRAJ_SELF_CONTAINED
    return ", ".join(plain) + " (each optionally " + "/".join(COMPRESSION_SUFFIXES) + ")"


def mdtraj_suffixes() -> tuple[str, ...]:
    """Whatever else the installed mdtraj registers (internal).

    Only consulted for extensions the table does not know, so the common paths never import mdtraj.
    """
    try:
        from mdtraj.formats.registry import FormatRegistry
    except ImportError:  # pragma: no cover - mdtraj is a dependency
        return ()
    return tuple(k for k in FormatRegistry.loaders if not k.endswith(".gz"))
