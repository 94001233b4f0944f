"""Big slab copies on two cores: whether a :mod:`~.hostcopy` copy is shared with its
helper thread (``share``: :func:`shared`). A shared copy is cut into pieces of 256 KiB
that the calling thread and the helper, a C thread that never takes the interpreter lock,
take in turn; the helper joins when it wakes, the caller never waits for a helper that
has not started, and after a copy the helper stays awake for 100 us (yielding its core
to any thread that wants it), so a loop of big gets finds it running.

One core's copy does not reach the memory system's rate on this project's 2-core VM: a
16 MiB block out of a ``/dev/shm`` mapping ran at 8.8-9.1 GB/s on one thread and 9.3-12.5
GB/s as two halves. Until this version the halves went to a Python pool thread, which
started 31 us (median) after the caller's half and handed its result back through a
future: hot ``get_into`` of 2 MiB blocks, 16 a pass into the same outputs (as benchmark
read_throughput), waited 66 us (median) per get for the helper's half. Those gets and the
shared pieces, alternated in one process (30 passes each, shuffled order): 11.2 GB/s
against 7.2 (per-pass ratio 1.52, median), a get's median 185 us against 282, one thread
alone 6.3; 16 MiB blocks (20 passes): 12.4 against 11.9 GB/s (ratio 1.07). A copy under
:data:`SPLIT_MIN` (256 KiB: the compiled copies release the interpreter lock from there
on) is not shared. With the pool thread the threshold was 1 MiB (at 512 KiB its halves
cost more than they saved: a get at 0.74x of a numpy copy's rate split, 0.86x whole);
with the C helper, one thread and shared pieces alternated (20 passes of hot gets, 12 of
puts, 32 MiB each): gets 1.37x faster shared at 256 KiB, 1.63x at 512 KiB, 2.0x at 1 MiB;
puts 1.30x at 256 KiB, 1.67x at 1 MiB, 1.64x at 16 MiB. Threads that already share a
batch's copies among the cores copy alone inside :func:`unsplit` (16 MiB batch gets on
two workers: 9.3 GB/s splitting, 10.8 not). A batch get's hot copies are gathered into
one call and shared once they add up to :data:`BATCH_SPLIT_MIN`. It was 2 MiB (64
copies of 64 KiB out of a slab took 0.64 and 0.73 of one thread's time in halves) until
copies streamed (:mod:`~.hostcopy`); since, hot batches of 64 KiB blocks into outputs
just zeroed (as benchmark small_blocks; six interleaved rounds a run, two to six runs
each, the batch's time over the same gets in a loop) ran at 0.92-1.00 of the loop
shared, 64 a call (4 MiB), against 0.88-0.90 copied one by one and 0.89-0.91 gathered on
one thread; at 128 a call (8 MiB), 0.73-0.82 shared against 0.84-0.87 one by one; 8 MiB
of 16 KiB or 4 KiB blocks ran alike either way (0.57-0.72). Thread-safe; a forked child
starts a helper of its own.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .hostcopy import COMPILED

#: Copies of one block of this many bytes and more are shared (where :func:`shared` says so).
SPLIT_MIN = 256 << 10
#: A batch's hot copies adding up to this many bytes are gathered into one call and shared.
BATCH_SPLIT_MIN = 8 << 20

_local = threading.local()  # .unsplit: this thread copies alone (see unsplit())


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: Whether this process shares big copies at all (compiled copies, two cores or more).
ENABLED = COMPILED and usable_cores() >= 2


@contextmanager
def unsplit() -> Iterator[None]:
    """Copies made by this thread meanwhile are not shared (it is one of a batch's
    workers, which already keep every core busy)."""
    before = getattr(_local, "unsplit", False)
    _local.unsplit = True
    try:
        yield
    finally:
        _local.unsplit = before


def shared(nbytes: int, allowed: bool, least: int = SPLIT_MIN) -> bool:
    """Whether a copy of ``nbytes`` is shared with the helper thread: ``allowed`` (the
    store's ``split_copies``), :data:`ENABLED`, at least ``least`` bytes, and not inside
    :func:`unsplit`."""
    return allowed and ENABLED and nbytes >= least and not getattr(_local, "unsplit", False)
