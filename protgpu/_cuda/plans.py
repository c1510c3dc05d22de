"""Prepared launch plans: a kernel, its launch configuration and its fixed scalar arguments, put
together once, then launched with pointers on a stream at the cost of the launch alone.

:func:`protgpu._cuda.launch` converts and type-checks every argument on every call, which is right for
most callers and too slow for a call whose whole budget is a few microseconds of host time (the
attention fast path). A plan moves that work to :func:`build_plan`: the scalars are checked against the
entry point's C signature and converted to NumPy scalars there, and :meth:`LaunchPlan.launch` only
appends them to the pointers it is given::

    plan = build_plan(get_kernel("attention_flash", entry, cfg), grid, block, tail=(L, H, ...))
    plan.launch(stream_handle, device_id, q_ptr, k_ptr, ...)   # raw integers, nothing checked

:func:`launch_config` is the one place that makes cuda.core ``LaunchConfig`` objects (memoised), for
plans and for :func:`protgpu._cuda.launch`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .streams import core_stream, ensure_context

if TYPE_CHECKING:
    from .loader import KernelHandle

_configs: dict = {}
# Dynamic shared memory a launch gets without opting in; above it build_plan raises the kernel's maximum.
DEFAULT_DYNAMIC_SMEM = 48 * 1024


def launch_config(grid, block, shared_mem: int = 0):
    """One cuda.core ``LaunchConfig`` per (grid, block, shared memory): building one validates its fields
    in Python, a measurable part of a launch, and the same few shapes recur call after call.

    Parameters
    ----------
    grid, block : int or tuple of int
        Blocks in the grid and threads in a block (up to 3 dimensions).
    shared_mem : int
        Dynamic shared memory in bytes.
    """
    key = (grid if isinstance(grid, int) else tuple(grid), block if isinstance(block, int) else tuple(block),
           int(shared_mem))
    cfg = _configs.get(key)
    if cfg is None:
        from cuda.core import LaunchConfig

        if len(_configs) > 4096:  # (grids that follow the input size would otherwise pile up)
            _configs.clear()
        cfg = _configs[key] = LaunchConfig(grid=key[0], block=key[1], shmem_size=key[2])
    return cfg


class LaunchPlan:
    """A kernel with its launch configuration and trailing scalar arguments (see :func:`build_plan`).

    Attributes
    ----------
    name : str
        ``"<file>.<entry>"``, for messages.
    n_pointers : int
        How many leading arguments :meth:`launch` takes.
    tail : tuple
        The fixed scalar arguments, as NumPy scalars of their C types.
    """

    __slots__ = ("_launch", "config", "kernel", "n_pointers", "name", "tail")

    def __init__(self, kernel, config, tail: tuple, n_pointers: int, name: str):
        from cuda.core import launch

        self._launch = launch
        self.kernel = kernel
        self.config = config
        self.tail = tail
        self.n_pointers = n_pointers
        self.name = name

    def launch(self, stream: int, device_id: int, *pointers) -> None:
        """Launch on the raw stream handle ``stream`` of device ``device_id``.

        ``pointers`` are the leading arguments as device addresses (``int``; 0 for NULL), in the entry
        point's order. Nothing is checked: the caller guarantees count, types and lifetimes (the memory
        must stay allocated until the launch is enqueued; the stream orders the rest).
        """
        ensure_context(device_id)
        self._launch(core_stream(stream, device_id), self.config, self.kernel, *pointers, *self.tail)


def opt_in_shared_memory(kernel, nbytes: int, device_id: int) -> None:
    """Let ``kernel`` (a cuda.core Kernel) launch with ``nbytes`` of dynamic shared memory on device
    ``device_id``: above ``DEFAULT_DYNAMIC_SMEM`` the driver wants the kernel's maximum set first.

    Raises
    ------
    RuntimeError
        When the driver refuses (more than the device's opt-in maximum).
    """
    from cuda.bindings import driver

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    h = kernel.handle
    if not isinstance(h, (driver.CUkernel, driver.CUfunction)):  # (a bare address)
        h = driver.CUkernel(int(h))
    if isinstance(h, driver.CUkernel):  # (cuda.core loads cubins as libraries)
        err, cudev = driver.cuDeviceGet(device_id)
        if err == driver.CUresult.CUDA_SUCCESS:
            (err,) = driver.cuKernelSetAttribute(attr, int(nbytes), h, cudev)
    else:
        (err,) = driver.cuFuncSetAttribute(h, attr, int(nbytes))
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"the driver refuses {nbytes} bytes of dynamic shared memory: {err}")


def build_plan(handle: KernelHandle, grid, block, tail: tuple = (), *, shared_mem: int = 0) -> LaunchPlan:
    """A :class:`LaunchPlan` for ``handle`` (from :func:`protgpu._cuda.get_kernel`).

    Parameters
    ----------
    handle : KernelHandle
    grid, block : int or tuple of int
    tail : tuple
        The values of the entry point's last ``len(tail)`` parameters, which must be scalars: checked
        and converted here, as :func:`protgpu._cuda.launch` would.
    shared_mem : int
        Dynamic shared memory in bytes; above ``DEFAULT_DYNAMIC_SMEM``, the kernel is opted in to it on
        the current device (:func:`opt_in_shared_memory`), the one the handle was loaded for.

    Raises
    ------
    TypeError, OverflowError
        When ``tail`` does not fit the entry point's trailing scalar parameters.
    """
    from .loader import _convert_arg

    params = handle.params
    n_pointers = len(params) - len(tail)
    if n_pointers < 0:
        raise TypeError(f"{handle.name} takes {len(params)} arguments, got a tail of {len(tail)}")
    scalars = params[n_pointers:]
    if any(p.pointer for p in scalars):
        raise TypeError(f"{handle.name}: a plan's tail holds scalars only, not {[p.name for p in scalars]}")
    converted = tuple(_convert_arg(handle, p, v) for p, v in zip(scalars, tail, strict=True))
    if shared_mem > DEFAULT_DYNAMIC_SMEM:
        from .streams import current_device

        opt_in_shared_memory(handle.kernel, shared_mem, current_device().device_id)
    return LaunchPlan(handle.kernel, launch_config(grid, block, shared_mem), converted, n_pointers, handle.name)
