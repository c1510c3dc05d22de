"""RMSD after optimal superposition, the superposition itself, and all-vs-all RMSD matrices (QCP).

Three layers, as everywhere in protgpu: the public functions :func:`rmsd`, :func:`superpose` and
:func:`pairwise_rmsd` (validate, pick the backend, convert back); the NumPy twins
(:func:`protgpu.superpose.to_reference.rmsd_numpy`, :func:`protgpu.superpose.pairwise_cpu.pairwise_numpy`:
the specification, and the CPU path); and the CUDA paths (``kernels/qcp.cu`` plus cuBLAS through
:func:`protgpu._cuda.blas.matmul`). The method is Theobald's quaternion characteristic polynomial (QCP;
Theobald 2005, Liu, Agrafiotis and Theobald 2010), in :mod:`protgpu.superpose.qcp`.

Modules: ``qcp`` (the NumPy QCP maths), ``_prepare`` (input resolution), ``to_reference`` (rmsd,
superpose), ``pairwise`` (pairwise_rmsd), ``pairwise_cpu``, ``pairwise_gpu``, ``streaming`` (tiles to
host destinations), ``multigpu``, ``kernels`` (qcp.cu's entry points). Design notes:
``docs/design/qcp.md`` (accuracy) and ``docs/design/pairwise-streaming.md`` (the GPU all-vs-all).

Conventions: Angstrom; a rotation ``R`` (frames, 3, 3) and translation ``t`` (frames, 3) map mobile
coordinates onto the reference as ``aligned = mobile @ R.T + t`` (``R @ x_i + t`` for each atom).
"""

from __future__ import annotations

from .pairwise import pairwise_rmsd
from .to_reference import SuperposeResult, rmsd, superpose

__all__ = ["SuperposeResult", "pairwise_rmsd", "rmsd", "superpose"]
