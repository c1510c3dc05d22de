"""Distance-biased multi-head attention over residues (``pg.attention``).

The logit of residue ``i`` attending to residue ``j`` in head ``h`` is
``scale * q[i, h] . k[j, h] - gamma[h] * |x_i - x_j|^2`` (``x``: coordinates in Angstrom, usually CA),
minus infinity where key ``j`` is padding or farther than the cutoff; the output is the softmax-weighted
sum of ``v``. :func:`attention` lives in :mod:`~protgpu.attention.api`, its NumPy twin
:func:`attention_numpy` in :mod:`~protgpu.attention.reference`, the choice of GPU path and kernel tiles in
:mod:`~protgpu.attention.flash`, the general CUDA paths in :mod:`~protgpu.attention.cuda` and the
fast path for 16-bit torch / CuPy arrays in :mod:`~protgpu.attention.fast`. The kernels and their
measurements are described in ``docs/design/flash-attention.md``.

Internal API for tests and benchmarks, importable from here: :func:`choose_method`,
:func:`fused_kernel`, :func:`flash_config`, :func:`flash_smem_bytes`, :func:`bf16_bits_to_float32`,
:func:`float32_to_bf16_bits` (``FLASH_OVERRIDES`` and :func:`wgmma_device` are patched on
:mod:`protgpu.attention.flash` itself).
"""

from __future__ import annotations

from .api import attention
from .flash import choose_method as choose_method
from .flash import flash_config as flash_config
from .flash import flash_smem_bytes as flash_smem_bytes
from .flash import fused_kernel as fused_kernel
from .reference import attention_numpy
from .reference import bf16_bits_to_float32 as bf16_bits_to_float32
from .reference import float32_to_bf16_bits as float32_to_bf16_bits

__all__ = ["attention", "attention_numpy"]
