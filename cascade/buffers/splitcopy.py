"""Big slab copies on two cores: :func:`split_copy` runs a :mod:`~.hostcopy` copy of
:data:`SPLIT_MIN` bytes or more as two halves at once, one on the caller's thread and
one on a helper thread, when the compiled copies release the interpreter lock and the
process may run on two cores. One core's copy does not reach the memory system's rate
on this project's 2-core VM: a 16 MiB block out of a ``/dev/shm`` mapping ran at
8.8-9.1 GB/s on one thread and 9.3-12.5 GB/s as two halves (11.5-12.5 in two of three
passes; a numpy copy: 8.4-9.3). Hot ``get_into`` of 2 MiB blocks against ``np.copyto``
of the same bytes, alternated (two runs each): the copy's time over the get's 0.92 and
0.95 whole, 1.28 and 1.18 split; 1 MiB 0.90 and 0.94 against 0.96 and 1.06; 512 KiB 0.86
and 0.86 against 0.74 and 0.70 (the hand-off costs more than the half saves), hence the
threshold (8 MiB until an earlier measurement at 2 MiB, 9.1-9.7 GB/s either way). Threads
that already share a batch's copies among the cores copy whole inside :func:`unsplit`
(16 MiB batch gets on two workers, 6 alternated passes: 9.3 GB/s splitting, 10.8 not).
A batch of small copies (:func:`split_copy_many`: the hot blocks of one batch get, each
under :data:`SPLIT_MIN`, gathered into one compiled call) is shared between the caller
and the helper once it adds up to :data:`BATCH_SPLIT_MIN` bytes, as pieces of whole jobs
that each thread takes in turn, so a helper that wakes late (or not at all) costs the
caller nothing. Ad hoc, on this project's VM, 300 alternated passes each: 64 copies of
64 KiB out of a slab in one C call ran at 0.64 and 0.73 of one thread's time as two
halves (ctypes ``memmove`` per copy, which takes the interpreter lock back between
copies: 0.96); 16 KiB copies (1 MiB in all) at 1.00, 4 KiB ones at 2.0.
Thread-safe; the helper thread is made on first use (again in a forked child).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from .hostcopy import COMPILED, MAX_BUFFERS

#: Copies of this many bytes and more are split in two (where :func:`split_copy` may).
SPLIT_MIN = 1 << 20
#: Batches of copies (:func:`split_copy_many`) adding up to this many bytes are shared with the helper.
BATCH_SPLIT_MIN = 2 << 20
#: Bytes of each piece of such a batch (whole jobs), taken by whichever thread asks first.
BATCH_PIECE = 512 << 10

_PAGE = 4096  # the halves meet on a page boundary of the range
_helper: ThreadPoolExecutor | None = None
_helper_lock = threading.Lock()
_local = threading.local()  # .unsplit: this thread copies whole (see unsplit())


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: Whether this process splits big copies at all (compiled copies, two cores or more).
ENABLED = COMPILED and usable_cores() >= 2


def _forget_helper() -> None:
    """In a forked child: the parent's helper thread is not there."""
    global _helper
    _helper = None


os.register_at_fork(after_in_child=_forget_helper)


@contextmanager
def unsplit() -> Iterator[None]:
    """Copies made by this thread meanwhile are not split (it is one of a batch's
    workers, which already keep every core busy)."""
    before = getattr(_local, "unsplit", False)
    _local.unsplit = True
    try:
        yield
    finally:
        _local.unsplit = before


def _helper_pool() -> ThreadPoolExecutor:
    global _helper
    with _helper_lock:
        if _helper is None:
            _helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cascade-copy")
        return _helper


def halves(pos: int, last: int, buffers: Sequence[Any], *, writable: bool) -> tuple[tuple[int, int, list], ...] | None:
    """``[pos, last)`` and ``buffers`` cut into two halves ``(pos, mid, first)`` and
    ``(mid, last, second)``, buffers as flat uint8 views (one may be cut in two), or
    None when the copy is not split: below :data:`SPLIT_MIN`, not :data:`ENABLED`, inside
    :func:`unsplit`, too many buffers, or buffers a copy might refuse (other than C-contiguous numpy arrays,
    writable when ``writable``, adding up to the range): those take the plain copy,
    whose refusal writes nothing."""
    if not ENABLED or last - pos < SPLIT_MIN or len(buffers) >= MAX_BUFFERS or getattr(_local, "unsplit", False):
        return None
    flat = []
    for b in buffers:
        if type(b) is not np.ndarray or not b.flags.c_contiguous or (writable and not b.flags.writeable):
            return None
        flat.append(b.reshape(-1).view(np.uint8))
    if sum(f.nbytes for f in flat) != last - pos:
        return None
    mid = (last - pos) // 2 // _PAGE * _PAGE
    first, second, at = [], [], 0
    for f in flat:
        if at + f.nbytes <= mid:
            first.append(f)
        elif at >= mid:
            second.append(f)
        else:
            first.append(f[:mid - at])
            second.append(f[mid - at:])
        at += f.nbytes
    return (pos, pos + mid, first), (pos + mid, last, second)


def split_copy(copy: Callable[[memoryview, int, int, Sequence[Any]], bool], slab: memoryview, pos: int, last: int,
               buffers: Sequence[Any], *, writable: bool, allowed: bool = True) -> bool:
    """``copy(slab, pos, last, buffers)`` (:func:`~.hostcopy.copy_out` with ``writable``
    outputs, or :func:`~.hostcopy.copy_in`), as two halves at once where :func:`halves`
    splits it and ``allowed`` (the store's ``split_copies``); what the copy returns.
    Returns only once both halves have ended, whatever either raised (the caller's lease
    on the slab outlasts every byte moved); the caller's half's error wins, else the
    helper's is raised."""
    split = halves(pos, last, buffers, writable=writable) if allowed else None
    if split is None:
        return copy(slab, pos, last, buffers)
    (p0, m0, first), (p1, m1, second) = split
    helper = _helper_pool().submit(copy, slab, p0, m0, first)
    try:
        took = copy(slab, p1, m1, second)
    except BaseException:
        wait([helper])  # the helper's half ends before this error leaves
        raise
    took = helper.result() and took
    if not took:  # cannot happen to checked buffers; never report a half-made copy as done
        raise ValueError(f"a split slab copy of [{pos}, {last}) refused buffers it had checked")
    return True


def split_copy_many(copy_many: Callable[[memoryview, Sequence[tuple[int, int, Sequence[Any]]]], list[bool]],
                    slab: memoryview, jobs: Sequence[tuple[int, int, Sequence[Any]]], *,
                    allowed: bool = True) -> list[bool]:
    """``copy_many(slab, jobs)`` (:func:`~.hostcopy.copy_out_many`: one copy per job
    ``(pos, last, buffers)``); each job's verdict, in order. When the jobs add up to
    :data:`BATCH_SPLIT_MIN` bytes or more and splitting is :data:`ENABLED`, ``allowed``
    and not :func:`unsplit`, they are cut into pieces of about :data:`BATCH_PIECE` bytes
    (whole jobs) that this thread and the helper thread take in turn (:class:`_Pieces`):
    the helper joins when it wakes, and this thread does not wait for a helper that has
    not started. Returns only once no piece is being copied; the first error raised is
    raised."""
    total = sum(last - pos for pos, last, _ in jobs)
    if not (allowed and ENABLED and len(jobs) >= 2 and total >= BATCH_SPLIT_MIN) or getattr(_local, "unsplit", False):
        return copy_many(slab, jobs)
    per_piece = max(1, len(jobs) * BATCH_PIECE // total)
    pieces = _Pieces(copy_many, slab, [jobs[i:i + per_piece] for i in range(0, len(jobs), per_piece)])
    _helper_pool().submit(pieces.drain)
    pieces.drain()
    return pieces.finish()


class _Pieces:
    """The pieces of one :func:`split_copy_many`, taken one at a time by whichever thread
    asks first (:meth:`drain`); :meth:`finish` ends the taking and waits for any piece
    still being copied."""

    def __init__(self, copy_many: Callable[..., list[bool]], slab: memoryview, pieces: list[Sequence[Any]]) -> None:
        self._copy_many, self._slab, self._pieces = copy_many, slab, pieces
        self._verdicts: list[list[bool] | None] = [None] * len(pieces)
        self._next = 0
        self._copying = 0
        self._error: BaseException | None = None
        self._cond = threading.Condition(threading.Lock())

    def drain(self) -> None:
        """Copy pieces until none is left (or one has failed)."""
        while True:
            with self._cond:
                if self._next >= len(self._pieces) or self._error is not None:
                    return
                i = self._next
                self._next += 1
                self._copying += 1
            try:
                verdicts = self._copy_many(self._slab, self._pieces[i])
            except BaseException as exc:
                with self._cond:
                    self._error = self._error or exc
            else:
                self._verdicts[i] = verdicts
            finally:
                with self._cond:
                    self._copying -= 1
                    self._cond.notify_all()

    def finish(self) -> list[bool]:
        """Every piece's verdicts in order, once no piece is being copied and no more can
        be taken; the first error raised by a piece instead."""
        with self._cond:
            self._next = len(self._pieces)  # a helper waking up now takes nothing
            while self._copying:
                self._cond.wait()
        if self._error is not None:
            raise self._error
        return [took for verdicts in self._verdicts for took in verdicts]
