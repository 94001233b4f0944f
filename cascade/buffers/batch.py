"""One synchronisation per stream for a batch of copies into device outputs (or out of
device inputs into device room nobody reads yet).

Inside ``with one_sync(outputs) as batch:``, a copy into one of ``outputs`` that is in
device memory is only enqueued on its stream (the output's, per the CUDA Array
Interface); the batch synchronises each distinct stream once when the block ends,
exceptions included. With ``sources=True`` the buffers are a batch's device inputs: a
copy out of one of them into device memory is deferred the same way; its destination
must stay unread until the batch has ended without error (a put batch's reserved room,
committed only then). Worker threads join the batch by running their work through
:meth:`SyncBatch.bind`.

Deferring is safe because the bytes being read stay in place until the batch ends (a
put batch's inputs are the caller's, unchanged until its call returns): any
other copy (a put into a tier slab, a staging slice, an unregistration) first settles
every batch that still has copies in flight (:func:`settle_all`), and copies through the
pinned staging arena are never deferred (their slice is given back right after).
Copies with a host destination are never deferred either (their reader needs the bytes).
"""
from __future__ import annotations

import bisect
import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any


_current: ContextVar["SyncBatch | None"] = ContextVar("cascade_sync_batch", default=None)
_open: set["SyncBatch"] = set()
_open_lock = threading.Lock()


class SyncBatch:
    """Device outputs whose copies are synchronised once per stream. Thread-safe."""

    def __init__(self, ranges: list[tuple[int, int]], *, sources: bool = False) -> None:
        self._starts, self._ends = _disjoint(ranges)
        self.sources = sources  # the ranges are the copies' sources, not their destinations
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, int | None], None] = {}
        self._error: BaseException | None = None  # a failed synchronisation, whichever thread ran it
        self.synchronized = 0  # stream synchronisations this batch made

    def bind(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` run inside this batch, in whichever thread calls it."""
        def run(*args: Any, **kwargs: Any) -> Any:
            token = _current.set(self)
            try:
                return fn(*args, **kwargs)
            finally:
                _current.reset(token)
        return run

    @property
    def device(self) -> bool:
        """Whether any of its buffers is in device memory."""
        return bool(self._starts)

    def covers(self, ptr: int, nbytes: int) -> bool:
        i = bisect.bisect_right(self._starts, ptr) - 1
        return i >= 0 and ptr + nbytes <= self._ends[i]

    def enqueued(self, stream: int, device: int | None) -> None:
        with self._lock:
            self._pending[(stream, device)] = None

    def settle(self) -> None:
        """Synchronise each stream with copies in flight once (all of them, even when
        one fails; the first error is raised, here and by every later settle: a failure
        met by another thread's :func:`settle_all` still fails the batch)."""
        from .copy import device_copier

        with self._lock:
            streams, self._pending = list(self._pending), {}
        error = None
        for stream, device in streams:
            try:
                device_copier().synchronize(stream, device)
                self.synchronized += 1
            except Exception as exc:
                error = error or exc
        with self._lock:
            self._error = self._error or error
            error = self._error
        if error is not None:
            raise error

    @property
    def pending(self) -> bool:
        return bool(self._pending)


def _disjoint(ranges: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The union of ``[start, end)`` ranges as sorted disjoint runs: their starts, their ends."""
    starts: list[int] = []
    ends: list[int] = []
    for start, end in sorted(ranges):
        if ends and start <= ends[-1]:
            ends[-1] = max(ends[-1], end)
        else:
            starts.append(start)
            ends.append(end)
    return starts, ends


@contextlib.contextmanager
def one_sync(outputs: Sequence[Any], *, sources: bool = False) -> Iterator[SyncBatch]:
    """A batch over the device buffers among ``outputs`` (host ones are ignored), or
    with ``sources=True`` among a batch's inputs (copies out of them into device
    memory); synchronised once per stream when the block ends. Local."""
    from .views import DeviceView, view

    ranges = []
    for out in outputs:
        v = view(out, "input") if sources else view(out, "output buffer", writable=True)
        if isinstance(v, DeviceView):
            ranges.append((v.ptr, v.ptr + v.nbytes))
    batch = SyncBatch(ranges, sources=sources)
    with _open_lock:
        _open.add(batch)
    try:
        yield batch
    except BaseException:
        with contextlib.suppress(Exception):  # the body's error is the one to report
            batch.settle()
        raise
    else:
        batch.settle()
    finally:
        with _open_lock:
            _open.discard(batch)


def defers(dst: Any, src: Any) -> bool:
    """Whether a copy from ``src`` into ``dst`` (byte views) is deferred by the calling
    thread's batch."""
    batch = _current.get()
    if batch is None:
        return False
    from .views import DeviceView

    if batch.sources:
        return isinstance(dst, DeviceView) and isinstance(src, DeviceView) and batch.covers(src.ptr, src.nbytes)
    return isinstance(dst, DeviceView) and batch.covers(dst.ptr, dst.nbytes)


def enqueued(stream: int, device: int | None) -> None:
    """Record a deferred copy on ``stream`` in the calling thread's batch."""
    batch = _current.get()
    assert batch is not None, "enqueued() outside a batch"
    batch.enqueued(stream, device)


def batches_open() -> bool:
    """Whether any thread has a batch open (:func:`one_sync`)."""
    return bool(_open)


def settle_all() -> None:
    """Synchronise every open batch's copies in flight (cheap when there are none)."""
    if not _open:
        return
    with _open_lock:
        batches = [b for b in _open if b.pending]
    for batch in batches:
        batch.settle()
