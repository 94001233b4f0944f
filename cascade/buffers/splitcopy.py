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
