"""The ``kernels/qcp.cu`` entry points as :mod:`protgpu.superpose` launches them: the ``#define``s made
from :mod:`.qcp`'s constants (so the kernels and the NumPy twin take the same branches), kernel
handles, launches, and the launch geometry and output modes the kernels expect.

Internal API (tests and benchmarks use it): :func:`qcp_defines`, :func:`get`, :func:`launch`,
:func:`warp_grid`, the block sizes ``WARP_THREADS``, ``MOMENT_LANES``, ``MOMENT_THREADS``,
``QCP_THREADS``, ``PAIR_BLOCK``, and the pair-kernel modes ``MIRROR``, ``ZERO_DIAG``, ``UPPER_ONLY``,
``CONDENSED``. Callers read these as module attributes, so that a test can change them.
"""

from __future__ import annotations

import functools

from . import qcp

# Pair kernel output modes (bit flags; same values in qcp.cu).
MIRROR, ZERO_DIAG, UPPER_ONLY, CONDENSED = 1, 2, 4, 8

WARP_THREADS = 256  # blocks of the warp-per-frame kernels (8 warps per block)
MOMENT_LANES = 32  # lanes per frame in frame_moments_* (kernels/qcp.cu: MOMENT_LANES, measured)
MOMENT_THREADS = 128  # blocks of frame_moments_* (measured on the H200, see kernels/qcp.cu)
QCP_THREADS = 128
PAIR_BLOCK = (32, 8)  # qcp_pairs_* blocks: PAIR_BX (fixed: a warp) x PAIR_BY (a #define)


def qcp_defines():
    """qcp.cu's #defines from :mod:`.qcp`'s constants and this module's block sizes (read on every
    call: tests change them)."""
    return _qcp_defines_of(qcp.MAX_ITERS, qcp.SLOW_ITERS, qcp.NEWTON_RTOL, qcp.NEWTON_FLAT, qcp.ADJ_TINY,
                           qcp.JACOBI_SWEEPS, PAIR_BLOCK[1], MOMENT_LANES)


@functools.cache
def _qcp_defines_of(max_iters, slow_iters, rtol, flat, adj_tiny, sweeps, pair_by, lanes):
    # Built once per set of values: kernels are looked up on every call, and the repr()s are not free.
    return {"QCP_MAX_ITERS": max_iters, "QCP_SLOW_ITERS": slow_iters, "QCP_NEWTON_RTOL": repr(rtol),
            "QCP_NEWTON_FLAT": repr(flat), "QCP_ADJ_TINY": repr(adj_tiny), "QCP_JACOBI_SWEEPS": sweeps,
            "PAIR_BY": pair_by, "MOMENT_LANES": lanes}


def get(entry):
    """``qcp.cu``'s entry point with the QCP constants (the loader memoises the module per device)."""
    from .. import _cuda

    return _cuda.get_kernel("qcp", entry, qcp_defines())


def warp_grid(n_frames: int, frames_per_warp: int = 1, threads: int = WARP_THREADS) -> tuple:
    """Grid of the warp-per-frame kernels (they loop over frames, so the cap only bounds the grid);
    ``frames_per_warp`` for ``frame_moments_*``, whose warps take 32 / MOMENT_LANES frames at once."""
    per_block = threads // 32 * frames_per_warp
    return (int(max(1, min(-(-n_frames // per_block), 1 << 20))),)


def launch(h, grid, block, *args):
    """:func:`protgpu._cuda.launch` (looked up at call time: the fake device of the tests replaces it)."""
    from .. import _cuda

    _cuda.launch(h, grid, block, *args)
