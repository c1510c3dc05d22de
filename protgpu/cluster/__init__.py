"""Clustering of frames by pairwise distance at the scale of the matrices protgpu makes.

:func:`cluster` (GROMOS, k-medoids with FasterPAM, hierarchical) returns a :class:`Clustering`. The
distances come as row strips (:mod:`.source`) from the all-vs-all RMSD engine or from a precomputed
matrix, so GROMOS and k-medoids never hold F x F numbers. NumPy twins: :func:`.gromos.gromos_numpy`
(from the definition); hierarchical clustering is SciPy's own linkage. Design: ``docs/design/clustering.md``.

Modules: ``core`` (the public function), ``source`` (row strips), ``gromos``, ``kmedoids``, ``hierarchical``.
"""

from __future__ import annotations

from .core import Clustering, cluster

__all__ = ["Clustering", "cluster"]
