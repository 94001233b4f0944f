"""The one copy routine between any two buffers, host or device.

host <- host is ``numpy.copyto`` (it releases the GIL). A copy with a device end goes
through the *device copier*: by default :class:`CupyCopier` (cupy is imported only when
such a copy happens). The copier is injectable (:func:`use_device_copier`): tests plug in
one that copies host memory behind ``__cuda_array_interface__``.

Host ends never reach the device as pageable memory (DESIGN.md 3a): memory that is
pinned already (the staging arena, a registered SHM slab: :mod:`.staging`) is copied
directly; pageable memory goes through slices of the pinned staging arena, large copies
in two halves that alternate so the CPU copy of one overlaps the DMA of the other.

Streams follow the CUDA Array Interface v3: a copy is enqueued on the stream of its
device end (of the output for device <- device, or of the input when the output names
none, as a tier slab does: :func:`~cascade.buffers.settled`), after synchronising the
stream of a device input that names another one, and returns once the bytes are in place, except
inside :func:`one_sync` (:mod:`.batch`), which synchronises each stream once at its end.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol

import numpy as np

from ..errors import ConfigError, InvalidBlock
from . import batch as _batch
from .staging import DEFAULT_ARENA_BYTES, PinnableRanges, StagingArena
from .views import ByteView, DeviceView, view

Direction = Literal["h2d", "d2h", "d2d"]
_PER_THREAD_STREAM = 2  # cudaStreamPerThread
_HOST_REGISTER_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every device's context
_EVENT_DISABLE_TIMING = 2  # cudaEventDisableTiming


class DeviceCopier(Protocol):
    """Moves bytes when at least one end is device memory (pointers are plain ints) and
    provides pinned host memory. ``device`` is the GPU the stream belongs to (None: the
    current one)."""

    def memcpy_async(self, dst: int, src: int, nbytes: int, direction: Direction, stream: int,
                     device: int | None) -> None:
        """Enqueue a copy of ``nbytes`` on the CUDA stream handle ``stream``."""

    def synchronize(self, stream: int, device: int | None) -> None:
        """Wait until everything enqueued on ``stream`` is done."""

    def record_event(self, stream: int, device: int | None) -> Any:
        """An event marking the work enqueued on ``stream`` so far."""

    def wait_event(self, event: Any) -> None:
        """Wait for ``event`` (from :meth:`record_event`), then free it."""

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of page-locked host memory as a ``uint8`` array (which keeps it)."""

    def register_host(self, ptr: int, nbytes: int) -> None:
        """Page-lock existing host memory (``cudaHostRegister``)."""

    def unregister_host(self, ptr: int) -> None:
        """Undo :meth:`register_host` of the range starting at ``ptr``."""


class CupyCopier:
    """The real device copier: ``cudaMemcpyAsync`` with ``cudaMemcpyDefault`` (unified
    addressing finds each end), events, ``cudaHostRegister`` and pinned allocations
    through cupy's runtime bindings."""

    def __init__(self) -> None:
        try:
            import cupy
            from cupy.cuda import runtime
        except ImportError:
            raise InvalidBlock("a device buffer needs cupy to be copied: pip install 'cascade-kv[gpu]'") from None

        self._cupy, self._runtime, self._device = cupy, runtime, cupy.cuda.Device

    def memcpy_async(self, dst: int, src: int, nbytes: int, direction: Direction, stream: int,
                     device: int | None) -> None:
        runtime = self._runtime
        if device is None or device == runtime.getDevice():  # a stream belongs to a device
            runtime.memcpyAsync(dst, src, nbytes, runtime.memcpyDefault, stream)
            return
        with self._device(device):
            runtime.memcpyAsync(dst, src, nbytes, runtime.memcpyDefault, stream)

    def synchronize(self, stream: int, device: int | None) -> None:
        runtime = self._runtime
        if device is None or device == runtime.getDevice():
            runtime.streamSynchronize(stream)
            return
        with self._device(device):
            runtime.streamSynchronize(stream)

    def record_event(self, stream: int, device: int | None) -> Any:
        with self._device(device):
            event = self._runtime.eventCreateWithFlags(_EVENT_DISABLE_TIMING)
            self._runtime.eventRecord(event, stream)
        return event

    def wait_event(self, event: Any) -> None:
        try:
            self._runtime.eventSynchronize(event)
        finally:
            self._runtime.eventDestroy(event)

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        import cupyx

        return cupyx.empty_pinned((nbytes,), dtype=np.uint8)

    def register_host(self, ptr: int, nbytes: int) -> None:
        self._runtime.hostRegister(ptr, nbytes, _HOST_REGISTER_PORTABLE)

    def unregister_host(self, ptr: int) -> None:
        self._runtime.hostUnregister(ptr)


_installed: tuple[DeviceCopier, StagingArena] | None = None  # replaced whole: read without the lock
_arena_bytes = DEFAULT_ARENA_BYTES
_copier_lock = threading.Lock()
_pinnable = PinnableRanges()


def _state() -> tuple[DeviceCopier, StagingArena]:
    global _installed
    installed = _installed
    if installed is not None:
        return installed
    with _copier_lock:
        if _installed is None:
            copier = CupyCopier()
            _installed = copier, StagingArena(copier, _arena_bytes)
        return _installed


def device_copier() -> DeviceCopier:
    """The copier in use (a :class:`CupyCopier` made on first use). Thread-safe."""
    return _state()[0]


def staging_arena() -> StagingArena:
    """The pinned staging arena of the copier in use (pinned on its first lease)."""
    return _state()[1]


def set_staging_bytes(nbytes: int) -> None:
    """Size of the pinned staging arena (default 64 MiB) for copiers set up from now on
    (call at start-up, before the first device copy). Size it above the largest block:
    larger copies are chunked through it, but a host stand-in for a whole block falls
    back to pageable memory."""
    global _arena_bytes
    if nbytes <= 0:
        raise ConfigError(f"the staging arena needs a positive size, got {nbytes}")
    _arena_bytes = int(nbytes)


@contextlib.contextmanager
def use_device_copier(copier: DeviceCopier, *, staging_bytes: int | None = None) -> Iterator[DeviceCopier]:
    """Make ``copier`` the one every device copy goes through, for the ``with`` block,
    with a staging arena of its own (``staging_bytes``, default the configured size).
    Process-wide: meant for tests and for plugging in another copier at start-up."""
    global _installed
    with _copier_lock:
        saved = _installed
        _installed = copier, StagingArena(copier, staging_bytes or _arena_bytes)
    try:
        yield copier
    finally:
        with _copier_lock:
            _installed = saved


def register_pinnable(array: np.ndarray) -> Any:
    """Note host memory (e.g. the SHM slab) to be registered with the CUDA driver on the
    first device copy that touches it, so such copies DMA straight from and to it. Costs
    nothing until then; registering pins (and so commits) the whole range once. Returns
    the token for :func:`forget_pinnable`. Thread-safe."""
    return _pinnable.add(array)


def forget_pinnable(token: Any) -> None:
    """Unregister memory of :func:`register_pinnable` (before unmapping it); copies still
    in flight in :func:`one_sync` batches are waited for first. Thread-safe."""
    _batch.settle_all()
    _pinnable.forget(token)


def copy(dst: Any, src: Any, *, what: str = "output buffer") -> int:
    """Copy all of ``src`` into ``dst`` (equal sizes; either may be host or device memory,
    any object :func:`~cascade.buffers.view` accepts). Returns the bytes copied once they
    are in place (inside :func:`one_sync`, a copy into one of its device outputs is only
    enqueued). :class:`InvalidBlock` for unusable buffers or a size mismatch. Local;
    thread-safe for distinct ``dst``."""
    d, s = view(dst, what, writable=True), view(src, "input")
    if d.nbytes != s.nbytes:
        raise InvalidBlock(f"{what} holds {d.nbytes} bytes, the data {s.nbytes}")
    deferred = _batch.defers(d, s)
    if not deferred:
        _batch.settle_all()  # memory a batch still reads from may be rewritten by this copy
    if isinstance(d, np.ndarray) and isinstance(s, np.ndarray):
        np.copyto(d, s)
        return int(d.nbytes)
    return _device_copy(d, s, defer=deferred)


def copy_each(pairs: Sequence[tuple[Any, Any]], *, what: str = "output buffer") -> None:
    """:func:`copy` of each ``(dst, src)`` of ``pairs``, returning once all are in place
    with one synchronisation per stream for the set (the parts of one block): the
    copies with a device end are enqueued first, then each stream they went on is
    synchronised, also when one of them raised. Inside :func:`one_sync`, copies into
    its device outputs are only enqueued, as :func:`copy`'s. Local; thread-safe for
    distinct destinations."""
    views = []
    for dst, src in pairs:
        d, s = view(dst, what, writable=True), view(src, "input")
        if d.nbytes != s.nbytes:
            raise InvalidBlock(f"{what} holds {d.nbytes} bytes, the data {s.nbytes}")
        views.append((d, s))
    settled = False
    pending: dict[tuple[int, int | None], None] = {}
    try:
        for d, s in views:
            deferred = _batch.defers(d, s)
            if not (deferred or settled):
                _batch.settle_all()  # memory a batch still reads from may be rewritten by these copies
                settled = True
            if isinstance(d, np.ndarray) and isinstance(s, np.ndarray):
                np.copyto(d, s)
            else:
                _device_copy(d, s, defer=deferred, pending=pending)
    except BaseException:
        with contextlib.suppress(Exception):  # the copy's error is the one to report
            _synchronize_each(pending)
        raise
    _synchronize_each(pending)


def _synchronize_each(streams: dict[tuple[int, int | None], None]) -> None:
    """Synchronise every ``(stream, device)`` of ``streams``, all of them even when one
    fails; the first error is raised."""
    if not streams:
        return
    copier, error = _state()[0], None
    for stream, device in streams:
        try:
            copier.synchronize(stream, device)
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise error


def _device_copy(d: ByteView, s: ByteView, *, defer: bool = False,
                 pending: dict[tuple[int, int | None], None] | None = None) -> int:
    """Copy ``s`` into ``d`` (at least one in device memory). Returns once the bytes are
    in place, except with ``defer`` (recorded in the calling thread's batch) or with
    ``pending`` (its stream is added there for the caller to synchronise)."""
    n = int(d.nbytes)
    if not n:
        return 0
    copier, arena = _state()
    if isinstance(d, DeviceView):
        stream, device = _handle(d.stream), d.device
        if isinstance(s, DeviceView):
            if d.stream is None and s.stream is not None:  # an output with nothing pending: the input's stream
                stream, device = _handle(s.stream), s.device
            elif s.stream is not None and (_handle(s.stream), s.device) != (stream, device):
                copier.synchronize(_handle(s.stream), s.device)  # the input is ready on its own stream
            copier.memcpy_async(d.ptr, s.ptr, n, "d2d", stream, device)
        elif arena.contains(src := _ptr(s), n):
            copier.memcpy_async(d.ptr, src, n, "h2d", stream, device)
            defer = False  # the arena slice goes back right after: never left in flight
        elif _pinnable.pinned(src, n, copier):
            copier.memcpy_async(d.ptr, src, n, "h2d", stream, device)
        else:
            _staged(copier, arena, d, s, to_device=True)
            return n
    else:
        stream, device = _handle(s.stream), s.device
        dst = int(d.ctypes.data)
        if not (arena.contains(dst, n) or _pinnable.pinned(dst, n, copier)):
            _staged(copier, arena, s, d, to_device=False)
            return n
        copier.memcpy_async(dst, s.ptr, n, "d2h", stream, device)
    if defer:
        _batch.enqueued(stream, device)
    elif pending is not None:
        pending[(stream, device)] = None
    else:
        copier.synchronize(stream, device)
    return n


def _staged(copier: DeviceCopier, arena: StagingArena, dev: DeviceView, host: np.ndarray, *,
            to_device: bool) -> None:
    """Copy between ``dev`` and pageable ``host`` through a pinned arena slice: whole when
    it takes at most a quarter of the arena, else in chunks alternating between two
    halves of a slice (events order the reuse of each half). Returns once done."""
    n, stream, device = int(host.nbytes), _handle(dev.stream), dev.device
    chunk = n if n <= arena.nbytes // 4 else max(arena.nbytes // 8, 1)
    with arena.lease(min(n, 2 * chunk)) as slot:
        if slot is None:  # no room: the pageable copy the driver stages itself (counted as a fallback)
            copier.memcpy_async(dev.ptr if to_device else _ptr(host), _ptr(host) if to_device else dev.ptr, n,
                                "h2d" if to_device else "d2h", stream, device)
            copier.synchronize(stream, device)
            return
        events: list[Any] = [None, None]
        spans = [(off, min(chunk, n - off)) for off in range(0, n, chunk)]
        base = _ptr(slot)
        try:
            if to_device:
                for i, (off, k) in enumerate(spans):
                    half = i % 2
                    if events[half] is not None:
                        ev, events[half] = events[half], None
                        copier.wait_event(ev)  # the DMA out of this half is done
                    np.copyto(slot[half * chunk:half * chunk + k], host[off:off + k])
                    copier.memcpy_async(dev.ptr + off, base + half * chunk, k, "h2d", stream, device)
                    events[half] = copier.record_event(stream, device)
            else:
                def enqueue(i: int) -> None:
                    off, k = spans[i]
                    copier.memcpy_async(base + (i % 2) * chunk, dev.ptr + off, k, "d2h", stream, device)
                    events[i % 2] = copier.record_event(stream, device)

                for i in range(min(2, len(spans))):
                    enqueue(i)
                for i, (off, k) in enumerate(spans):
                    half = i % 2
                    ev, events[half] = events[half], None
                    copier.wait_event(ev)
                    np.copyto(host[off:off + k], slot[half * chunk:half * chunk + k])
                    if i + 2 < len(spans):
                        enqueue(i + 2)
            copier.synchronize(stream, device)
        except BaseException:
            with contextlib.suppress(Exception):  # no DMA may still touch the slice once it is given back
                copier.synchronize(stream, device)
            raise
        finally:
            for ev in events:
                if ev is not None:
                    with contextlib.suppress(Exception):
                        copier.wait_event(ev)


def host_bytes(obj: Any, what: str = "buffer") -> np.ndarray:
    """``obj``'s bytes in host memory: a view when they are there, else a fresh host
    array filled through the pinned staging arena. Prefer :func:`host_views` (no
    allocation) where the bytes are needed only for a while."""
    v = view(obj, what)
    if isinstance(v, np.ndarray):
        return v
    out = np.empty(v.nbytes, dtype=np.uint8)
    _device_copy(out, v)
    return out


@contextlib.contextmanager
def host_views(objs: Sequence[Any], what: str = "buffer") -> Iterator[list[np.ndarray]]:
    """Host byte views of ``objs`` for the ``with`` block (hashing, checksums, writes):
    host memory as it is, device memory copied into one pinned arena slice (a fresh host
    array when the arena has no room). Thread-safe."""
    views = [view(o, what) for o in objs]
    device = [v for v in views if isinstance(v, DeviceView)]
    if not device:
        yield views
        return
    with _stand_ins(views) as hosts:
        for v, h in zip(views, hosts):
            if v is not h:
                _device_copy(h, v)
        yield hosts


@contextlib.contextmanager
def host_outputs(outs: Sequence[Any], what: str = "output buffer") -> Iterator[list[np.ndarray]]:
    """Writable host views of ``outs`` for a reader that fills host memory (MPI, files,
    mapped slabs). Device outputs get stand-ins in one pinned arena slice (fresh host
    arrays when it has no room), copied to them when the block ends without an
    exception, with one synchronisation per stream. Host outputs cost nothing extra."""
    views = [view(o, what, writable=True) for o in outs]
    if all(isinstance(v, np.ndarray) for v in views):
        yield views
        return
    with _stand_ins(views) as hosts:
        yield hosts
        # synchronised before the stand-ins go back to the arena (an arena copy is never deferred)
        copy_each([(v, h) for v, h in zip(views, hosts) if v is not h], what=what)


@contextlib.contextmanager
def staging_buffer(nbytes: int, *, device: bool) -> Iterator[np.ndarray]:
    """A host buffer of ``nbytes`` for moving a block between tiers (a demotion, a
    promotion): a pinned arena slice when ``device`` (one end is device memory) and this
    process copies to devices already, else (or without room) a fresh array."""
    installed = _installed
    arena = installed[1] if device and installed is not None else None
    if arena is None:
        yield np.empty(nbytes, dtype=np.uint8)
        return
    with arena.lease(nbytes) as slot:
        yield slot if slot is not None else np.empty(nbytes, dtype=np.uint8)


@contextlib.contextmanager
def _stand_ins(views: Sequence[ByteView]) -> Iterator[list[np.ndarray]]:
    """Host arrays standing in for the device views among ``views`` (host ones as they
    are): one arena lease for all of them, or fresh arrays without room."""
    sizes = [int(v.nbytes) for v in views if isinstance(v, DeviceView)]
    with staging_arena().lease(sum(sizes)) as slot:
        hosts, pos = [], 0
        for v in views:
            if isinstance(v, np.ndarray):
                hosts.append(v)
            elif slot is None:
                hosts.append(np.empty(v.nbytes, dtype=np.uint8))
            else:
                hosts.append(slot[pos:pos + v.nbytes])
                pos += v.nbytes
        yield hosts


def _ptr(v: ByteView) -> int:
    return v.ptr if isinstance(v, DeviceView) else int(v.ctypes.data)


def _handle(stream: int | None) -> int:
    """A CUDA Array Interface stream value as a runtime stream handle."""
    if stream is None or stream == 1:
        return 0  # the legacy default stream
    return _PER_THREAD_STREAM if stream == 2 else stream
