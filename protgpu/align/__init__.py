"""Structure alignment: TM-align (sequence-independent alignment and superposition of two chains).

Three layers as elsewhere: :func:`tm_align` (inputs, pairs, backend; :mod:`.api`), the NumPy twin
stage by stage (:mod:`.numpy_twin`, :mod:`._dp`, :mod:`._search`; the specification and the CPU path)
and, next, the CUDA kernels. ``docs/design/tm-align.md`` describes the algorithm as implemented.
"""

from __future__ import annotations

from .api import TMAlignResult, tm_align
from .matrix import tm_align_matrix

__all__ = ["TMAlignResult", "tm_align", "tm_align_matrix"]
