"""Residue contact maps, contact frequencies and fractions of native contacts.

:func:`contacts` and :func:`native_contacts` (``pg.contacts``, ``pg.native_contacts``) live in
:mod:`~protgpu.contacts.api`, their result types in :mod:`~protgpu.contacts.maps`, the schemes in
:mod:`~protgpu.contacts.schemes`, the NumPy twin in :mod:`~protgpu.contacts.numpy_twin` and the CUDA
path (``kernels/contacts.cu``) in :mod:`~protgpu.contacts.cuda`. ``docs/design/contacts.md`` explains
the conventions (mdtraj's) and the GPU plan.

Internal API for tests and benchmarks, importable from here: :func:`scheme_atoms`,
:func:`residue_keys`, :func:`allowed_pairs`, :func:`residue_distances_numpy`, :func:`contacts_cuda`,
:class:`GPUPlan`, :func:`interleaved_rows`.
"""

from __future__ import annotations

from .api import contacts, native_contacts
from .cuda import GPUPlan as GPUPlan
from .cuda import contacts_cuda as contacts_cuda
from .cuda import interleaved_rows as interleaved_rows
from .maps import ContactMap, ContactPairs, NativeContacts, ResidueLabels
from .numpy_twin import residue_distances_numpy as residue_distances_numpy
from .schemes import SCHEMES
from .schemes import allowed_pairs as allowed_pairs
from .schemes import residue_keys as residue_keys
from .schemes import scheme_atoms as scheme_atoms

__all__ = [
    "SCHEMES",
    "ContactMap",
    "ContactPairs",
    "NativeContacts",
    "ResidueLabels",
    "contacts",
    "native_contacts",
]
