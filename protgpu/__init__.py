"""protgpu: GPU toolkit for protein structures and MD trajectories.

Distance matrices, contact maps, RMSD and superposition, structure scores, computed with CUDA kernels
compiled at run time by NVRTC (cuda.core) and cuBLAS (nvmath-python) when a GPU is usable, and with
NumPy otherwise. Functions return the array type they were given. Importing this package imports no
GPU library.
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import batch
from ._array import gpu_available
from .align import TMAlignResult, tm_align, tm_align_matrix
from .attention import attention
from .cluster import Clustering, cluster
from .complexes import ChainMapping, Confidence, design_sanity, map_chains, read_confidence, score_complex
from .contacts import ContactMap, NativeContacts, contacts, native_contacts
from .distances import distances
from .errors import GPUUnavailableError, InputError, KernelCompileError, MemoryBudgetError, ProtgpuError
from .io import load, save
from .scoring import TMScoreResult, gdt, lddt, tm_score
from .scoring.consensus import ConsensusResult, consensus_score
from .structure import Structure
from .superpose import SuperposeResult, pairwise_rmsd, rmsd, superpose

__all__ = [
    "ChainMapping",
    "Clustering",
    "Confidence",
    "cluster",
    "ConsensusResult",
    "ContactMap",
    "NativeContacts",
    "GPUUnavailableError",
    "InputError",
    "KernelCompileError",
    "MemoryBudgetError",
    "ProtgpuError",
    "Structure",
    "SuperposeResult",
    "TMAlignResult",
    "TMScoreResult",
    "__version__",
    "batch",
    "attention",
    "consensus_score",
    "contacts",
    "design_sanity",
    "distances",
    "gdt",
    "gpu_available",
    "lddt",
    "load",
    "map_chains",
    "native_contacts",
    "pairwise_rmsd",
    "read_confidence",
    "rmsd",
    "save",
    "score_complex",
    "superpose",
    "tm_align",
    "tm_align_matrix",
    "tm_score",
]
