"""Reading structures and trajectories into :class:`~protgpu.structure.core.Structure`, and writing outputs
atomically.

:func:`load` (``protgpu.load``) reads PDB with protgpu's own fast reader, mmCIF through gemmi,
trajectories through mdtraj (nm converted to Angstrom), and converts mdtraj and Biopython objects;
:func:`save` (``protgpu.save``) writes PDB / mmCIF / DCD / XTC. One module per format, one
extension table (:mod:`protgpu.io.formats`), one atomic writer (:mod:`protgpu.io.write`).
mdtraj, Biopython and gemmi are imported only inside the functions that need them. Every failure is
an :class:`~protgpu.errors.InputError` whose one-line message names the file. See
``docs/design/io.md``.
"""

from __future__ import annotations

from .formats import MMCIF_EXTENSIONS, PDB_EXTENSIONS, TRAJECTORY_EXTENSIONS
from .load import load
from .write import atomic_path, remove_stale_temps, save, save_array, write_atomic

__all__ = [
    "PDB_EXTENSIONS",
    "MMCIF_EXTENSIONS",
    "TRAJECTORY_EXTENSIONS",
    "load",
    "save",
    "atomic_path",
    "remove_stale_temps",
    "write_atomic",
    "save_array",
]
