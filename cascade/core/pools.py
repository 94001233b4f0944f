"""The worker threads of one store: a hashing thread (a put hashes while it copies) and
the I/O pool that runs batch calls (get_many, put_many). Created on first use, shut
down by :meth:`Pools.shutdown`. Thread-safe."""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


#: Data a batch call hands each worker thread at least (below it the batch runs inline).
BYTES_PER_WORKER = 8 << 20


def spare_cores() -> int:
    """CPU cores this process may run on, less one for the caller's own thread (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


class Pools:
    """Thread pools; batch calls use up to ``io_threads`` workers unless told otherwise.

    ``cores`` caps a batch's default workers (None: no cap). The store passes
    :func:`spare_cores` unless a tier waits on the network (Lustre): on a machine with
    two cores, 2-16 MiB batches on four threads ran slower per block than the same calls
    in a loop (cold file reads 1.16-1.55x, threads breaking the sequential readahead;
    hot copies, which are memory-bound, no faster), and 0.54-0.97x on one thread
    (small_blocks rows at 2 and 16 MiB, threads and no threads alternating in one run,
    three rounds; a loaded machine, so only the direction is firm)."""

    def __init__(self, io_threads: int, check_open: Callable[[], None], *, cores: int | None = None) -> None:
        self._io_threads = io_threads
        self._cores = cores
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
                 item_bytes: int = 0) -> list[Any]:
        """``[fn(x) for x in items]`` on up to ``max_workers`` threads (items are taken in
        order, so file reads stay a near-sequential stream); the first error is raised
        after every item finished. :class:`StoreClosed` on a closed store. Without
        ``max_workers``, a batch of items of ``item_bytes`` each gets one worker per
        :data:`BYTES_PER_WORKER` (at most ``io_threads``, and at most ``cores``): handing
        small blocks to threads costs more than it overlaps (benchmark small_blocks)."""
        self._check_open()
        items = list(items)
        workers = min(max_workers or self._io_threads, len(items))
        if max_workers is None and item_bytes:
            workers = min(workers, max(1, item_bytes * len(items) // BYTES_PER_WORKER))
        if max_workers is None and self._cores is not None:
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
        else:
            pool = self._io_pool(workers)
            for fut in [pool.submit(drain) for _ in range(workers)]:
                fut.result()
        if errors:
            raise errors[0]
        return results

    def shutdown(self) -> None:
        with self._lock:
            for pool in (self._hasher, self._io):
                if pool is not None:
                    pool.shutdown(wait=False)
            self._hasher = self._io = None
