"""The one extension table: which file suffixes protgpu reads and writes, and through what.

:func:`protgpu.io.load` dispatches on it, and the CLI's input expansion
(``protgpu.batch.inputs``) lists the files of a directory with :func:`readable_suffixes`, so a
file that a directory expands to is one that ``load`` reads. Matching is case-insensitive.
"""

from __future__ import annotations

import os

__all__ = [
    "COMPRESSION_SUFFIXES",
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
    ".xyz", ".dtr", ".stk", ".ncrst", ".rst7", ".restrt", ".inpcrd", ".tng",
)
#: Files that mdtraj reads with their own topology (no ``top=`` needed).
MDTRAJ_SELF_CONTAINED = (".h5", ".hdf5", ".lh5", ".gro", ".mol2", ".arc", ".hoomdxml", ".gsd")
#: Compression suffixes, allowed after a PDB or mmCIF extension (``model.pdb.gz``). Only gzip;
#: :func:`split_ext` peels it.
COMPRESSION_SUFFIXES = (".gz",)
#: What :func:`protgpu.io.save` writes: PDB and mmCIF through gemmi (optionally gzipped), DCD and
#: XTC through mdtraj.
WRITABLE_EXTENSIONS = (".pdb", ".ent", ".cif", ".mmcif", ".dcd", ".xtc")


def split_ext(path) -> tuple[str, bool]:
    """Lower-case extension of the file with ``.gz`` peeled off, and whether it was gzipped.

    ``path`` is a str or path-like; the suffixes are those of ``pathlib.PurePath.suffixes`` (none
    for a name ending in '.', leading dots belong to the stem), found without building a Path.

    Examples
    --------
    >>> split_ext("dir/Model.PDB.gz"), split_ext("traj.xtc"), split_ext(".hidden")
    (('.pdb', True), ('.xtc', False), ('', False))
    """
    name = os.path.basename(os.fspath(path))
    if name.endswith("."):
        return "", False
    suffixes = name.lstrip(".").lower().split(".")[1:]
    gz = bool(suffixes) and suffixes[-1] == "gz"  # (COMPRESSION_SUFFIXES, spelled out: a hot path)
    if gz:
        suffixes = suffixes[:-1]
    return ("." + suffixes[-1] if suffixes else ""), gz


def readable_suffixes() -> tuple[str, ...]:
    """Every file suffix :func:`protgpu.io.load` reads, lower-case, compressed forms included.

    Returns
    -------
    tuple of str
        PDB and mmCIF extensions, the same with each compression suffix, trajectory and
        self-contained mdtraj extensions, in that order.

    Examples
    --------
    >>> ".pdb.gz" in readable_suffixes() and ".gro" in readable_suffixes()
    True
    """
    text = PDB_EXTENSIONS + MMCIF_EXTENSIONS
    return (
        text + tuple(e + z for z in COMPRESSION_SUFFIXES for e in text) + TRAJECTORY_EXTENSIONS
        + MDTRAJ_SELF_CONTAINED
    )


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
    >>> is_structure_path("a/b.cif.gz"), is_structure_path("x.gro"), is_structure_path("x.xtc.gz")
    (True, True, False)
    """
    ext, gz = split_ext(path)
    if gz:
        return ext in PDB_EXTENSIONS or ext in MMCIF_EXTENSIONS
    return ext in readable_suffixes()


def supported_text() -> str:
    """The readable suffixes as one comma-separated line, for error messages (internal)."""
    return ", ".join(readable_suffixes())


def mdtraj_suffixes() -> tuple[str, ...]:
    """Whatever else the installed mdtraj registers (internal).

    Only consulted for extensions the table does not know, so the common paths never import mdtraj.
    """
    try:
        from mdtraj.formats.registry import FormatRegistry
    except ImportError:  # pragma: no cover - mdtraj is a dependency
        return ()
    return tuple(k for k in FormatRegistry.loaders if not k.endswith(".gz"))
