"""The one copy routine between any two buffers, host or device.

host <- host is ``numpy.copyto`` (it releases the GIL). A copy with a device end goes
through the *device copier*: by default :class:`CupyCopier` (cupy is imported only when
such a copy happens). The copier is injectable (:func:`use_device_copier`): tests plug in
one that copies host memory behind ``__cuda_array_interface__``, and a pinned staging
arena for host <-> device copies (issue 24 item 2) plugs in as a copier whose ``h2d`` /
``d2h`` copies stage through it; callers of :func:`copy` do not change.

Streams follow the CUDA Array Interface v3: a copy is enqueued on the stream of its
device output (so it runs after the caller's pending work there), after synchronising
the stream of a device input that names another one, and :func:`copy` returns once the
bytes are in place.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol

import numpy as np

from ..errors import InvalidBlock
from .views import ByteView, DeviceView, view

Direction = Literal["h2d", "d2h", "d2d"]
_PER_THREAD_STREAM = 2  # cudaStreamPerThread


class DeviceCopier(Protocol):
    """Moves bytes when at least one end is device memory (pointers are plain ints).
    ``device`` is the GPU the stream belongs to (None: the current one)."""

    def memcpy_async(self, dst: int, src: int, nbytes: int, direction: Direction, stream: int,
                     device: int | None) -> None:
        """Enqueue a copy of ``nbytes`` on the CUDA stream handle ``stream``."""

    def synchronize(self, stream: int, device: int | None) -> None:
        """Wait until everything enqueued on ``stream`` is done."""


class CupyCopier:
    """The real device copier: ``cudaMemcpyAsync`` with ``cudaMemcpyDefault`` (unified
    addressing finds each end) through cupy's runtime bindings. Host ends are used as
    given: pageable host memory runs at pageable speed until a pinned arena is plugged in."""

    def __init__(self) -> None:
        try:
            from cupy.cuda import runtime
        except ImportError:
            raise InvalidBlock("a device buffer needs cupy to be copied: pip install 'cascade-kv[gpu]'") from None
        from cupy.cuda import Device

        self._runtime, self._device = runtime, Device

    def memcpy_async(self, dst: int, src: int, nbytes: int, direction: Direction, stream: int,
                     device: int | None) -> None:
        with self._device(device):  # a stream, the default one included, belongs to a device
            self._runtime.memcpyAsync(dst, src, nbytes, self._runtime.memcpyDefault, stream)

    def synchronize(self, stream: int, device: int | None) -> None:
        with self._device(device):
            self._runtime.streamSynchronize(stream)


_copier: DeviceCopier | None = None
_copier_lock = threading.Lock()


def device_copier() -> DeviceCopier:
    """The copier in use (a :class:`CupyCopier` made on first use). Thread-safe."""
    global _copier
    with _copier_lock:
        if _copier is None:
            _copier = CupyCopier()
        return _copier


@contextlib.contextmanager
def use_device_copier(copier: DeviceCopier) -> Iterator[DeviceCopier]:
    """Make ``copier`` the one every device copy goes through, for the ``with`` block
    (process-wide: meant for tests and for plugging in a staging arena at start-up)."""
    global _copier
    with _copier_lock:
        saved, _copier = _copier, copier
    try:
        yield copier
    finally:
        with _copier_lock:
            _copier = saved


def copy(dst: Any, src: Any, *, what: str = "output buffer") -> int:
    """Copy all of ``src`` into ``dst`` (equal sizes; either may be host or device memory,
    any object :func:`~cascade.buffers.view` accepts). Returns the bytes copied once they
    are in place. :class:`InvalidBlock` for unusable buffers or a size mismatch. Local;
    thread-safe for distinct ``dst``."""
    d, s = view(dst, what, writable=True), view(src, "input")
    if d.nbytes != s.nbytes:
        raise InvalidBlock(f"{what} holds {d.nbytes} bytes, the data {s.nbytes}")
    if isinstance(d, np.ndarray) and isinstance(s, np.ndarray):
        np.copyto(d, s)
        return int(d.nbytes)
    return _device_copy(d, s)


def _device_copy(d: ByteView, s: ByteView) -> int:
    n = int(d.nbytes)
    if not n:
        return 0
    copier = device_copier()
    if isinstance(d, DeviceView):
        stream, device = _handle(d.stream), d.device
        if isinstance(s, DeviceView) and s.stream is not None and (_handle(s.stream), s.device) != (stream, device):
            copier.synchronize(_handle(s.stream), s.device)  # the input is ready on its own stream
        copier.memcpy_async(d.ptr, _ptr(s), n, "d2d" if isinstance(s, DeviceView) else "h2d", stream, device)
    else:
        stream, device = _handle(s.stream), s.device
        copier.memcpy_async(_ptr(d), s.ptr, n, "d2h", stream, device)
    copier.synchronize(stream, device)
    return n


def host_bytes(obj: Any, what: str = "buffer") -> np.ndarray:
    """``obj``'s bytes in host memory: a view when they are there, else a fresh (pageable)
    host copy, for hashing, checksums, file and MPI writes of device buffers."""
    v = view(obj, what)
    if isinstance(v, np.ndarray):
        return v
    out = np.empty(v.nbytes, dtype=np.uint8)
    _device_copy(out, v)
    return out


@contextlib.contextmanager
def host_outputs(outs: Sequence[Any], what: str = "output buffer") -> Iterator[list[np.ndarray]]:
    """Writable host views of ``outs`` for a reader that fills host memory (MPI, files,
    mapped slabs). A device output gets a fresh (pageable) host stand-in, copied to it
    when the block ends without an exception. Host outputs cost nothing extra."""
    views = [view(o, what, writable=True) for o in outs]
    hosts = [v if isinstance(v, np.ndarray) else np.empty(v.nbytes, dtype=np.uint8) for v in views]
    yield hosts
    for v, h in zip(views, hosts):
        if v is not h:
            _device_copy(v, h)


def _ptr(v: ByteView) -> int:
    return v.ptr if isinstance(v, DeviceView) else int(v.ctypes.data)


def _handle(stream: int | None) -> int:
    """A CUDA Array Interface stream value as a runtime stream handle."""
    if stream is None or stream == 1:
        return 0  # the legacy default stream
    return _PER_THREAD_STREAM if stream == 2 else stream
