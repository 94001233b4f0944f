"""Non-blocking store calls: ``put_async``, ``get_into_async`` and their batch forms.

Each call checks its arguments at once (bad input raises in the caller's thread, before
anything is queued), then runs the store's blocking call on this module's own worker
threads and returns a :class:`concurrent.futures.Future` (``done()``, ``result(timeout)``,
``exception()``, ``add_done_callback``; ``asyncio.wrap_future`` makes it awaitable). An
error of the call is raised by ``result()``, never lost.

Ordering: a read of an id (async or not) issued after a ``put_async`` of the same id in
the same namespace sees that put: it first waits for the put to finish; so do the store's
other calls on an id (``pin``, ``delete``, ``hint``, ``set_ttl``, ``set_priority``). (A content-hashed
put has no id until it finishes, so nothing can be issued after it for that id.) Puts of
one id are not reordered among themselves either: the later waits for the earlier. A
non-blocking call waits only for the puts issued before it: a read issued before a
``put_async`` of its id does not wait for that put (on the workers, a wait for a put
queued behind the call itself would never end).

Buffers: a ``put_async`` reads the caller's arrays in the background and a
``get_into_async`` writes into the caller's outputs in the background; neither may be
changed or read until its future is done.

``flush()`` and ``close()`` of the store first wait for every call submitted before them;
a call submitted after ``close()`` began fails with :class:`~cascade.errors.StoreClosed`.
Calls that have not started when ``close()`` gives up waiting are cancelled: their
futures say so (``cancelled()``), and a read that was waiting for such a put goes on
without it.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from .errors import StoreClosed

Key = tuple[str, str]  # (namespace, block id)


class AsyncCalls:
    """The worker pool and the ordering table behind a store's ``*_async`` calls.
    Thread-safe. ``workers``: calls that run at once (their reads and writes overlap)."""

    def __init__(self, workers: int) -> None:
        self._workers = max(1, workers)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._puts: dict[Key, Future] = {}  # the latest unfinished put of each id
        self._unfinished: set[Future] = set()
        self._closed = False
        self._worker = threading.local()  # .ordered: this worker's call waited for the puts before it

    def submit(self, call: Callable[[], Any], *, after: Sequence[Key] = (), puts: Sequence[Key] = ()) -> Future:
        """Run ``call`` on a worker once the unfinished puts of the ids in ``after`` and
        ``puts`` have finished; ``puts``: the ids this call puts (later reads wait for it)."""
        with self._lock:
            if self._closed:
                raise StoreClosed("this CascadeStore is closed")
            earlier = [f for k in (*after, *puts) if (f := self._puts.get(k)) is not None]
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="cascade-async")
            future = self._pool.submit(self._after(earlier, call))
            self._unfinished.add(future)
            for key in puts:
                self._puts[key] = future
        future.add_done_callback(lambda done: self._finished(done, puts))
        return future

    def pending(self, key: Key) -> bool:
        """Whether a put of ``key`` has not finished yet."""
        with self._lock:
            return key in self._puts

    def wait_for_puts(self, keys: Sequence[Key]) -> None:
        """Block until the unfinished puts of ``keys`` (if any) have finished (their
        errors stay on their futures). Costs a dict lookup per id when none is pending.
        Returns at once inside a call running on the workers: it already waited for the
        puts submitted before it, and a later put may be queued behind it."""
        if not self._puts or getattr(self._worker, "ordered", False):
            return
        with self._lock:
            earlier = [f for k in keys if (f := self._puts.get(k)) is not None]
        if earlier:
            wait(earlier)

    def wait_all(self, timeout: float | None = None) -> int:
        """Block until every call submitted so far has finished (at most ``timeout``
        seconds); returns how many are still unfinished."""
        with self._lock:
            pending = list(self._unfinished)
        _, not_done = wait(pending, timeout=timeout)
        return len(not_done)

    def close(self, timeout: float) -> int:
        """Refuse new calls, let the submitted ones finish (at most ``timeout`` seconds),
        then cancel those that have not started. Returns how many did not finish."""
        with self._lock:
            self._closed = True
        left = self.wait_all(timeout)
        with self._lock:
            pool, self._pool = self._pool, None
            queued = list(self._unfinished)
        if pool is not None:
            pool.shutdown(wait=left == 0, cancel_futures=True)
        for future in queued:  # wait() does not see a future cancelled by shutdown() as done until told
            if future.cancelled():
                try:
                    future.set_running_or_notify_cancel()
                except RuntimeError:  # already told
                    pass
        return left

    def _finished(self, future: Future, puts: Sequence[Key]) -> None:
        with self._lock:
            self._unfinished.discard(future)
            for key in puts:
                if self._puts.get(key) is future:
                    del self._puts[key]

    def _after(self, earlier: list[Future], call: Callable[[], Any]) -> Callable[[], Any]:
        """``call`` once ``earlier`` are done (they were submitted first to a FIFO pool, so
        they are running or done by the time this runs: no worker waits on a queued one),
        marked as ordered meanwhile (:meth:`wait_for_puts` inside it waits for nothing)."""
        def run() -> Any:
            if earlier:
                wait(earlier)
            self._worker.ordered = True
            try:
                return call()
            finally:
                self._worker.ordered = False
        return run
