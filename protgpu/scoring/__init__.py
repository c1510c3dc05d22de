"""Structure scores: lDDT, TM-score, GDT-TS/GDT-HA and MaxSub, batched over many models.

:func:`tm_score` and :func:`gdt` reproduce the TMscore program (SCORING.md); :func:`lddt` reproduces
OpenStructure's lDDT (and biotite's with ``symmetry=False``). Each has a NumPy twin that is the
specification and the CPU path, and a CUDA path (``kernels/tmscore.cu``, ``kernels/lddt.cu``).
Distance-biased attention is not a score: it lives in :mod:`protgpu.attention`.
"""

from __future__ import annotations

from .lddt import lddt, lddt_residue_labels
from .tmscore import TMScoreResult, gdt, tm_score

__all__ = ["TMScoreResult", "gdt", "lddt", "lddt_residue_labels", "tm_score"]
