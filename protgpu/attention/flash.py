"""Kernel configuration of :func:`protgpu.attention`: which GPU path and which kernel run a call
(:func:`choose_method`, :func:`fused_kernel`), and the tiles of the tensor-core kernel
``kernels/attention_flash.cu`` (:func:`flash_config`, :func:`flash_entry`, :func:`flash_block_m`,
:func:`flash_smem_bytes`). ``docs/design/flash-attention.md`` explains the kernel.

Internal API (tests, benchmarks): the functions above, :func:`wgmma_device`, and ``FLASH_OVERRIDES``
(tuning knobs that override :func:`flash_config`; the benchmark sweeps them, tests rebind or patch it).
"""

from __future__ import annotations

from ..errors import InputError

METHODS = ("auto", "materialized", "fused")

# The tensor-core kernel keeps a 16-row slice of Q and of the output accumulator in registers: head
# dimensions above 128 would spill. The CUDA-core kernel keeps K, V and Q tiles in 48 KB of static
# shared memory: up to d = 128 in float32 and d = 64 in float64.
MMA_MAX_HEAD_DIM = 128
SIMT_MAX_HEAD_DIM = {"float32": 128, "float64": 64}
_STATIC_SMEM = 48 * 1024
# "auto" on CUDA cores: the materialised path while one (batch, head) score matrix is at most this big.
MATERIALIZED_MAX_SCORE_BYTES = 256 * 2**20

# Tuning knobs of the tensor-core kernel that override :func:`flash_config` (the benchmark sweeps them).
FLASH_OVERRIDES: dict = {}


def flash_config(d: int) -> dict:
    """Compile-time knobs of ``attention_flash.cu`` for head dimension ``d`` (a multiple of 16).

    The largest key tile whose double-buffered K and V tiles (rows padded by 8 elements) plus key
    coordinates fit the 48 KB of static shared memory; ``FLASH_OVERRIDES`` replaces any of them.

    Returns
    -------
    dict
        ``HEAD_DIM``, ``FA_BLOCK_N``, ``FA_STAGES``, ``FA_WARPS``, ``FA_MT``, ``FA_MIN_BLOCKS``, and
        ``FA_WGMMA``: 1 when the tile shape is the one the wgmma entry points take (``d = 64``, 64-key
        tiles, 2 stages, 4 warps) and the overrides do not set it to 0. The wgmma kernel then runs where
        the device has it (:func:`flash_entry`).
    """
    cfg = None
    for block_n, stages in ((64, 2), (32, 2), (64, 1), (32, 1), (16, 1)):
        if flash_smem_bytes(d, block_n, stages) <= _STATIC_SMEM:
            cfg = {"HEAD_DIM": d, "FA_BLOCK_N": block_n, "FA_STAGES": stages}
            break
    if cfg is None:
        raise InputError(f"head dimension {d} is too large for the tensor-core kernel")
    # 4 warps of 2 x 16 query rows (128 rows a block) for d <= 64: every K and V fragment read from shared
    # memory feeds two mma instructions, and the ~255 registers a thread allow 2 blocks per SM (L = 4096,
    # H = 8 is then one wave of 256 blocks on 132 SMs). Beyond d = 64 the second slice of O would spill.
    cfg.update({"FA_WARPS": 4, "FA_MT": 2 if d <= 64 else 1, "FA_MIN_BLOCKS": 2})
    cfg.update(FLASH_OVERRIDES)
    cfg["HEAD_DIM"] = d
    wg_shape = (d, int(cfg["FA_BLOCK_N"]), int(cfg["FA_STAGES"]), int(cfg["FA_WARPS"])) == (64, 64, 2, 4)
    cfg["FA_WGMMA"] = int(wg_shape and bool(int(FLASH_OVERRIDES.get("FA_WGMMA", 1))))
    return cfg


_WGMMA_DEVICES: dict = {}


def wgmma_device() -> bool:
    """Whether the current device runs the sm_90a wgmma kernel (compute capability 9.0 exactly: the
    arch-specific instructions are not in later architectures)."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    hit = _WGMMA_DEVICES.get(dev)
    if hit is None:
        hit = _WGMMA_DEVICES[dev] = cupy.cuda.Device(dev).compute_capability == "90"
    return hit


def flash_entry(precision: str, cfg: dict, cutoff2: float, lse: bool = False) -> tuple[str, bool]:
    """The entry point of ``attention_flash.cu`` for one launch, and whether it is compiled for the
    device's arch-specific target (``sm_90a``): the wgmma kernel when ``cfg`` allows it
    (``FA_WGMMA``), there is no cutoff (the cutoff's tile skipping is decided per warp, and a
    warpgroup's instructions need all four warps) and the device is compute capability 9.0; else the
    mma.sync kernel. ``lse=True``: the entry that also writes the log-sum-exp (``*_lse_*``, compiled with
    ``FA_WRITE_LSE=1`` in ``cfg``)."""
    wg = bool(int(cfg.get("FA_WGMMA", 0))) and cutoff2 < 0 and wgmma_device()
    suffix = ("lse_" if lse else "") + ("bf16" if precision == "bfloat16" else "f16")
    return (f"flash_attention_wg_{suffix}" if wg else f"flash_attention_{suffix}"), wg


def flash_block_m(cfg: dict) -> int:
    """Query rows per block of ``attention_flash.cu`` under the knobs ``cfg`` (16 x FA_MT x FA_WARPS)."""
    return 16 * int(cfg.get("FA_MT", 2)) * int(cfg.get("FA_WARPS", 4))


def flash_smem_bytes(d: int, block_n: int, stages: int) -> int:
    """Static shared memory of ``attention_flash.cu``: per stage K and V tiles (16-bit, rows of d + 8)
    and 32 bytes per key for the bias (a float4 of coordinates, or 16 float16 bias channels for the
    tensor cores)."""
    return stages * (2 * block_n * (d + 8) * 2 + block_n * 32)


def fused_kernel(precision: str, d: int) -> str | None:
    """Which fused kernel runs ``precision`` / head dimension ``d``: ``"mma"`` (tensor cores),
    ``"simt32"``, ``"simt64"``, or ``None`` (no fused kernel; the materialised path is used)."""
    if precision in ("float16", "bfloat16") and d % 16 == 0 and d <= MMA_MAX_HEAD_DIM:
        return "mma"
    if precision in ("float16", "bfloat16", "float32") and d <= SIMT_MAX_HEAD_DIM["float32"]:
        return "simt32"
    if precision == "float64" and d <= SIMT_MAX_HEAD_DIM["float64"]:
        return "simt64"
    return None


def choose_method(method: str, precision: str, d: int, L: int, return_weights: bool) -> str:
    """Resolve ``method`` to ``"materialized"`` or ``"fused"``, by dtype and size.

    ``"auto"``: 16-bit inputs whose head dimension the tensor-core kernel takes run fused (fast and
    O(L) in memory at every length). Other inputs run on CUDA cores either way; there cuBLAS's products
    beat the fused kernel while one (batch, head) score matrix is small (up to
    ``MATERIALIZED_MAX_SCORE_BYTES``, L = 8192 in float32), and the fused kernel keeps longer sequences
    in O(L) memory. ``return_weights=True`` always takes the materialised path.
    """
    if method == "materialised":
        method = "materialized"
    if method not in METHODS:
        raise InputError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    if return_weights:
        if method == "fused":
            raise InputError("return_weights=True needs the materialised path (the fused path never "
                             "stores the L x L weights); use method='materialized' or 'auto'")
        return "materialized"
    fk = fused_kernel(precision, d)
    if method == "fused" and fk is None:
        raise InputError(f"no fused kernel for {precision} with head dimension {d} (tensor cores: 16-bit, "
                         f"d a multiple of 16 up to {MMA_MAX_HEAD_DIM}; CUDA cores: d up to "
                         f"{SIMT_MAX_HEAD_DIM['float32']} in float32, {SIMT_MAX_HEAD_DIM['float64']} in float64)")
    if method != "auto":
        return method
    if fk == "mma":
        return "fused"
    score_bytes = L * L * (8 if precision == "float64" else 4)
    if fk is None or score_bytes <= MATERIALIZED_MAX_SCORE_BYTES:
        return "materialized"
    return "fused"
