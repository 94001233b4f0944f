"""The worker threads of one store: a hashing thread (a put hashes while it copies) and
the I/O pool that runs batch calls (get_many, put_many). Created on first use, shut
down by :meth:`Pools.shutdown`. Thread-safe."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from ..buffers.splitcopy import unsplit, usable_cores
from ..errors import ConfigError


#: Data a batch call hands each worker thread at least (below it the batch runs inline).
BYTES_PER_WORKER = 8 << 20


def spare_cores() -> int:
    """CPU cores this process may run on, less one for the caller's own thread (at least 1)."""
    return max(1, usable_cores() - 1)


def check_workers(max_workers: Any, call: str) -> None:
    """Refuse a batch call's ``max_workers`` unless it is None (the default) or a
    positive integer (:class:`ConfigError`, before anything is read or stored)."""
    if max_workers is not None and (not isinstance(max_workers, int) or isinstance(max_workers, bool)
                                    or max_workers < 1):
        raise ConfigError(f"{call}: max_workers must be a positive integer or None, not {max_workers!r}")


def _on_a_share_of_the_cores(fn: Callable[[], None]) -> None:
    """``fn()`` on one of several workers of a batch: its copies are not split over two
    cores (:func:`cascade.buffers.splitcopy.unsplit`), the batch spreads them already."""
    with unsplit():
        fn()


class Pools:
    """Thread pools; batch calls use up to ``io_threads`` workers unless told otherwise.

    ``cores`` caps a batch's default workers (None: no cap). The store passes
    :func:`spare_cores` unless a tier waits on the network (Lustre): on a machine with
    two cores, 2-16 MiB batches on four threads ran slower per block than the same calls
    in a loop (cold file reads 1.16-1.55x, threads breaking the sequential readahead;
    hot copies, which are memory-bound, no faster), and 0.54-0.97x on one thread
    (small_blocks rows at 2 and 16 MiB, threads and no threads alternating in one run,
    three rounds; a loaded machine, so only the direction is firm). Batches of copies
    between memory buffers that release the interpreter lock (``in_memory``) use every
    core instead: they break no readahead, and the caller's core is idle while it waits
    (16 MiB blocks copied out of a ``/dev/shm`` mapping on this project's 2-core VM,
    later passes: 9.4 GB/s on one thread, 12.6-13.6 GB/s on two)."""

    def __init__(self, io_threads: int, check_open: Callable[[], None], *, cores: int | None = None) -> None:
        self._io_threads = io_threads
        self._cores = cores
        self._memory_cores = usable_cores()
        self._check_open = check_open  # a closed store starts no pool (close shut the last one down)
        self._lock = threading.Lock()
        self._hasher: ThreadPoolExecutor | None = None
        self._io: ThreadPoolExecutor | None = None
        self._io_workers = 0

    def hasher(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._hasher is None:
                self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cascade-hash")
            return self._hasher

    def _io_pool(self, workers: int) -> ThreadPoolExecutor:
        with self._lock:
            self._check_open()
            if self._io is None or self._io_workers < workers:
                if self._io is not None:
                    self._io.shutdown(wait=False)
                self._io_workers = max(workers, self._io_threads)
                self._io = ThreadPoolExecutor(max_workers=self._io_workers, thread_name_prefix="cascade-io")
            return self._io

    def parallel(self, fn: Callable[[Any], Any], items: Iterable[Any], max_workers: int | None, *,
                 item_bytes: int = 0, in_memory: bool = False) -> list[Any]:
        """``[fn(x) for x in items]`` on up to ``max_workers`` threads, the caller's one of
        them (items are taken in order, so file reads stay a near-sequential stream; an I/O
        thread woken for a batch joined it 3 ms late at times on this project's VM); the first error is raised
        after every item finished. :class:`StoreClosed` on a closed store. Without
        ``max_workers``, a batch of items of ``item_bytes`` each gets one worker per
        :data:`BYTES_PER_WORKER` (at most ``io_threads``, and at most ``cores``): handing
        small blocks to threads costs more than it overlaps (benchmark small_blocks).
        ``in_memory``: the items are memory-to-memory copies that run without the
        interpreter lock; the cap is then every core (see the class docstring)."""
        self._check_open()
        items = list(items)
        workers = min(max_workers or self._io_threads, len(items))
        if max_workers is None and item_bytes:
            workers = min(workers, max(1, item_bytes * len(items) // BYTES_PER_WORKER))
        if max_workers is None and in_memory:
            workers = min(workers, self._memory_cores)
        elif max_workers is None and self._cores is not None:
            workers = min(workers, self._cores)
        results: list[Any] = [None] * len(items)
        errors: list[BaseException] = []
        order = iter(range(len(items)))  # next() on a range iterator is atomic under the GIL

        def drain() -> None:
            for i in order:
                try:
                    results[i] = fn(items[i])
                except BaseException as exc:  # raised in the caller's thread below
                    errors.append(exc)

        if workers <= 1:
            drain()
        else:  # the caller's thread is one of the workers: it starts at once, woken threads join
            pool = self._io_pool(workers - 1)
            helpers = [pool.submit(_on_a_share_of_the_cores, drain) for _ in range(workers - 1)]
            try:
                _on_a_share_of_the_cores(drain)
            finally:
                wait(helpers)  # no item is left running when this returns or raises
        if errors:
            raise errors[0]
        return results

    def shutdown(self) -> None:
        with self._lock:
            for pool in (self._hasher, self._io):
                if pool is not None:
                    pool.shutdown(wait=False)
            self._hasher = self._io = None
