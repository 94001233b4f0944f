"""The expiry sweeper: blocks past their TTL dropped in the background, not only when
their rank next reads them.

A read drops a block past its TTL (:meth:`~.reads.ReadPath.cached`), but until a read
comes, multi-rank, the block stayed listed in the cluster directory: other ranks read it
and counted a put of its id as a dedup onto it, which missed as soon as the holder read
it. So every block with a TTL is also entered here, at the time its TTL runs out as it
stood then (the index enters it when admitted or found at open, the store when
``set_ttl`` gives it one). One daemon thread of the store sleeps until the earliest
entry is due, then, under the store's lock, drops each due block that is still cached
and past its TTL, withdrawn from the directory first (counted in ``expired``, as a read's
drop is). A block whose TTL moved on meanwhile (a read under ``last_use``, a ``set_ttl``)
is entered again at its new time; a pinned one, or one another rank pins, is looked at
again after :data:`RECHECK_S`. A block that leaves the cache otherwise leaves the queue
too (:meth:`forget`), and the heap is rebuilt from the live entries when stale ones
outnumber them. A TTL counts the uses on the block's own rank: reads from other ranks
do not move it. The thread starts at the first entry; :meth:`stop` (``close()``) joins it.

Multi-rank, a drop first withdraws the block from the cluster directory, under the
store's lock; across nodes those atomics wait for their target rank to enter MPI unless
it runs a progress thread. The store therefore turns the sweep off (:meth:`stop`) where
the start-up self-test found such waits and no progress thread runs (``mpi_progress``):
blocks past their TTL then go at their rank's next read, as before. Thread-safe.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..identity import BlockKey
    from ..policy import BlockMeta
    from ..stats import StoreMetrics
    from .chain import TierChain
    from .guards import InFlight
    from .index import BlockIndex

log = logging.getLogger(__name__)

RECHECK_S = 1.0  # a pinned block past its TTL is looked at again this much later
LONGEST_WAIT_S = 3600.0  # the thread looks again at least this often (a TTL may be any finite length)
BATCH = 256  # most blocks dropped in one locked step (gets and puts go on between steps)
JOIN_S = 5.0  # stop(): most seconds to wait for the thread


class ExpirySweeper:
    """Drops the blocks of ``index`` whose TTL ran out, through ``chain`` (see the module
    docstring); ``lock`` is the store's."""

    def __init__(self, index: BlockIndex, chain: TierChain, metrics: StoreMetrics, inflight: InFlight,
                 lock: threading.RLock) -> None:
        self._index, self._chain, self._metrics, self._inflight, self._lock = index, chain, metrics, inflight, lock
        self._state = threading.Condition(threading.Lock())  # guards the fields below
        self._due: list[tuple[float, int, BlockKey]] = []  # heap of (monotonic due time, entry number, key)
        self._entry: dict[BlockKey, tuple[int, BlockMeta]] = {}  # each key's live entry (older ones are skipped)
        self._numbers = itertools.count()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def enter(self, meta: BlockMeta, due: float) -> None:
        """``meta``'s TTL runs out at ``due`` (``time.monotonic()`` seconds): drop it then,
        if it is still cached and past its TTL. Replaces the key's earlier entry."""
        with self._state:
            if self._stopped:
                return
            number = next(self._numbers)
            self._entry[meta.key] = (number, meta)
            heapq.heappush(self._due, (due, number, meta.key))
            if len(self._due) > 2 * len(self._entry) + 1024:  # mostly stale entries: keep the live ones
                self._due = [entry for entry in self._due if self._entry.get(entry[2], (None,))[0] == entry[1]]
                heapq.heapify(self._due)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cascade-expiry", daemon=True)
                self._thread.start()
            elif self._due[0][1] == number:  # the earliest now: wake the thread to sleep less
                self._state.notify()

    def forget(self, meta: BlockMeta) -> None:
        """``meta`` left the cache: its entry goes (a stale one is skipped when due)."""
        with self._state:
            live = self._entry.get(meta.key)
            if live is not None and live[1] is meta:
                del self._entry[meta.key]

    def stop(self) -> None:
        """Stop the thread and join it (a bounded wait); later entries are ignored."""
        with self._state:
            self._stopped = True
            self._state.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_S)

    def _run(self) -> None:
        while True:
            with self._state:
                while not self._stopped and (not self._due or self._due[0][0] > time.monotonic()):
                    self._state.wait(min(self._due[0][0] - time.monotonic(), LONGEST_WAIT_S) if self._due else None)
                if self._stopped:
                    return
                due = self._take_due(time.monotonic())
            try:
                self._sweep(due)
            except Exception:  # never fatal: the entries left are looked at on the next round
                log.exception("background expiry failed")

    def _take_due(self, now: float) -> list[BlockMeta]:
        """Under ``_state``: pop up to :data:`BATCH` live entries due by ``now``."""
        taken: list[BlockMeta] = []
        while self._due and self._due[0][0] <= now and len(taken) < BATCH:
            _, number, key = heapq.heappop(self._due)
            live = self._entry.get(key)
            if live is not None and live[0] == number:
                del self._entry[key]
                taken.append(live[1])
        return taken

    def _sweep(self, metas: list[BlockMeta]) -> None:
        """Under the store's lock: drop each block of ``metas`` still cached and past its
        TTL; enter again those not due yet or held."""
        with self._lock:
            if self._inflight.closing:
                return
            now = time.monotonic()
            for meta in metas:
                if not self._index.holds(meta) or meta.ttl <= 0:
                    continue  # gone, or its TTL taken away
                if self._index.expired(meta, now):
                    if self._chain.withdraw_and_drop(meta):
                        self._metrics.counters.expired += 1
                        continue
                    self.enter(meta, now + RECHECK_S)  # another rank pins it
                elif meta.pins:
                    self.enter(meta, now + RECHECK_S)
                else:  # its TTL moved on: looked at again when it runs out
                    self.enter(meta, max(self._index.expires_at(meta), now + 1e-3))
