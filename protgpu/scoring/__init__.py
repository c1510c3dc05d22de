"""Structure scores: lDDT, TM-score, GDT-TS/GDT-HA and MaxSub, batched over many models.

:func:`tm_score` and :func:`gdt` reproduce the TMscore program (SCORING.md); :func:`lddt` reproduces
OpenStructure's lDDT (and biotite's with ``symmetry=False``). Each has a NumPy twin that is the
specification and the CPU path, and a CUDA path (``kernels/tmscore.cu``, ``kernels/lddt.cu``).
:mod:`protgpu.scoring.attention` holds distance-biased multi-head attention (``kernels/attention*.cu``);
its function is exported as ``protgpu.attention`` (not here, so that the submodule keeps its name).
"""

from __future__ import annotations

from .lddt import lddt, lddt_residue_labels
from .tmscore import TMScoreResult, gdt, tm_score

__all__ = ["TMScoreResult", "gdt", "lddt", "lddt_residue_labels", "tm_score"]
