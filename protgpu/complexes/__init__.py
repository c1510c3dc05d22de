"""Complexes: chain mapping between a model and a reference complex, the scores of a complex (lDDT,
interface lDDT, TM-score, GDT, RMSD, QS-score, DockQ), model confidence (pLDDT, PAE, pTM/ipTM and the
interface confidences derived from them) and design sanity metrics. See docs/design/complexes.md and
docs/design/confidence.md."""

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
from .mapping import ChainMapping, map_chains
from .sanity import design_sanity
from .scores import METRICS, score_complex

__all__ = [
    "METRICS",
    "ChainMapping",
    "Confidence",
    "design_sanity",
    "interface_confidence",
    "ipsae",
    "lis",
    "map_chains",
    "pdockq",
    "pdockq2",
    "plddt_from_bfactors",
    "read_confidence",
    "score_complex",
]
