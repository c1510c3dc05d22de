"""Devices, contexts and streams for cuda.core launches: one cuda.core ``Stream`` wrapper per (device,
raw stream handle), made once, for CuPy streams and for raw handles (torch's ``cuda_stream``) alike.

cuda.core launches on its own ``Stream`` objects; CuPy and torch streams are wrapped through the
``__cuda_stream__`` protocol, without taking ownership of the stream. Building a wrapper costs more than
a launch, so :func:`core_stream` keeps one per (device, handle); every device's null stream has the
handle 0, hence the device in the key. Used by :func:`protgpu._cuda.launch` (CuPy's current stream) and
by prepared launch plans (:mod:`protgpu._cuda.plans`).
"""

from __future__ import annotations

import threading

_TLS = threading.local()
_STREAMS: dict = {}


def current_device():
    """The cuda.core ``Device`` of CuPy's current device, made current in this thread (its primary
    context)."""
    import cupy
    from cuda.core import Device

    dev = Device(cupy.cuda.runtime.getDevice())
    dev.set_current()
    _TLS.dev = dev.device_id
    return dev


def ensure_context(device_id: int) -> None:
    """Make device ``device_id``'s primary context current in this thread for cuda.core's launches (once
    per thread and device: a thread-local remembers the last one made current here)."""
    if getattr(_TLS, "dev", None) != device_id:
        from cuda.core import Device

        Device(device_id).set_current()
        _TLS.dev = device_id


class ForeignStream:
    """A raw CUDA stream handle (torch's, CuPy's ``ptr``) in the ``__cuda_stream__`` protocol that
    cuda.core accepts."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def core_stream(handle: int, device_id: int, owner=None):
    """The cuda.core ``Stream`` for the raw stream ``handle`` of device ``device_id`` (one wrapper each,
    made once).

    Parameters
    ----------
    handle : int
        The stream's ``cudaStream_t`` as an integer (0: the device's null stream).
    device_id : int
        The device the stream belongs to.
    owner : object, optional
        The library's stream object (a CuPy ``Stream``): wrapped itself and kept alive with the wrapper;
        a different owner of the same handle gets a new wrapper.

    Returns
    -------
    cuda.core.Stream
    """
    key = (device_id, handle)
    hit = _STREAMS.get(key)
    if hit is None or (owner is not None and hit[0] is not owner):
        from cuda.core import Device

        Device(device_id).set_current()
        _TLS.dev = device_id
        hit = (owner, Device(device_id).create_stream(ForeignStream(handle) if owner is None else owner))
        _STREAMS[key] = hit
    return hit[1]


def cupy_stream(stream):
    """The cuda.core ``Stream`` of a CuPy stream (its device: the stream's, else the current one)."""
    import cupy

    device_id = getattr(stream, "device_id", None)
    if device_id is None or device_id < 0:  # CuPy's null stream says -1: it is the current device's
        device_id = cupy.cuda.runtime.getDevice()
    return core_stream(stream.ptr, device_id, stream)
