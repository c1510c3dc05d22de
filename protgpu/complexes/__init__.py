"""Complexes: model confidence and design sanity metrics (chain mapping and complex scores are
another part of this package)."""

from __future__ import annotations

from .confidence import (
    Confidence,
    interface_confidence,
    ipsae,
    lis,
    pdockq,
    pdockq2,
    plddt_from_bfactors,
    read_confidence,
)
from .sanity import design_sanity

__all__ = [
    "Confidence",
    "design_sanity",
    "interface_confidence",
    "ipsae",
    "lis",
    "pdockq",
    "pdockq2",
    "plddt_from_bfactors",
    "read_confidence",
]
