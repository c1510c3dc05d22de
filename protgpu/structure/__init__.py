"""The :class:`Structure` container, its atom and residue tables, atom selections and chemistry tables.

A :class:`Structure` holds ``coords`` of shape ``(frames, atoms, 3)`` as C-contiguous float32 in
Angstrom, an :class:`AtomTable` describing the atoms, and optional periodic box vectors and times.
Every loader in :mod:`protgpu.io` produces one. See ``docs/design/io.md``.
"""

from __future__ import annotations

from .chemistry import (
    AMINO_ACIDS,
    NONSTANDARD_RESNAMES,
    VIRTUAL_SITE_ELEMENTS,
    WATER_RESNAMES,
    guess_elements,
    is_virtual_site,
    standardize_resnames,
)
from .core import Structure
from .tables import AtomTable, ResidueTable

__all__ = [
    "AMINO_ACIDS",
    "NONSTANDARD_RESNAMES",
    "VIRTUAL_SITE_ELEMENTS",
    "WATER_RESNAMES",
    "AtomTable",
    "ResidueTable",
    "Structure",
    "guess_elements",
    "is_virtual_site",
    "standardize_resnames",
]
