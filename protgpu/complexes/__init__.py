"""Complexes: chain mapping between a model and a reference complex, and the scores of a complex
(lDDT, interface lDDT, TM-score, GDT, RMSD, QS-score, DockQ). See docs/design/complexes.md."""

from .mapping import ChainMapping, map_chains
from .scores import METRICS, score_complex

__all__ = ["ChainMapping", "METRICS", "map_chains", "score_complex"]
