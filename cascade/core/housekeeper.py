"""The background housekeeper: the file tier's disk upkeep, without the store's lock
held while it writes, copies or frees.

A tier with upkeep due (the file tier: deletes to mark on disk, files to free,
dead space to reclaim: :mod:`cascade.tiers.compaction`) calls :meth:`Housekeeper.poke`
under the store's lock instead of doing that work inside the get, put or delete that
made it due. One daemon thread owned by the store then runs the tier's
:meth:`~cascade.tiers.base.Tier.housekeep`: each step takes the lock only to pick its
work and to record its end; the disk writes, the copying and the closing of freed files
run outside it (gets, puts and deletes go on meanwhile). Each round holds an in-flight
count (:class:`~.guards.InFlight`); ``close()`` stops a compaction's copying between two
records (the compaction is then undone: its target file goes, nothing is counted) and
joins the thread; ``flush()`` waits for the upkeep asked for before it. Thread-safe.
"""
from __future__ import annotations

import functools
import logging
import threading

from ..errors import StoreClosed
from ..tiers.base import Tier
from .guards import InFlight

log = logging.getLogger(__name__)

_JOIN_S = 5.0  # close(): most seconds to wait for the thread once its copying stopped


class Housekeeper:
    """Background upkeep of ``tiers`` (each asks through its ``on_housekeeping_due``)."""

    def __init__(self, tiers: list[Tier], inflight: InFlight, lock: threading.RLock) -> None:
        self._tiers, self._inflight, self._lock = tiers, inflight, lock
        self._state = threading.Condition(threading.Lock())  # guards _due, _asked, _done, _thread
        self._due: set[int] = set()  # tiers that asked since their last round
        self._asked = self._done = 0  # rounds asked for by pokes, and asked for before the last one ended
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for t, tier in enumerate(tiers):
            tier.on_housekeeping_due = functools.partial(self.poke, t)

    def poke(self, t: int) -> None:
        """Under the store's lock: tier ``t`` has upkeep due; run it soon."""
        with self._state:
            if self._stop.is_set():
                return
            self._due.add(t)
            self._asked += 1
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="cascade-housekeeper", daemon=True)
                thread.start()
                self._thread = thread
            self._state.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait (not holding the store's lock) until the upkeep asked for before this
        call has ended; False when ``timeout`` seconds passed first."""
        with self._state:
            asked = self._asked
            return self._state.wait_for(lambda: self._stop.is_set() or self._done >= asked, timeout)

    def stop(self) -> None:
        """Stop a compaction's copying between two records and end the thread
        (``close()``; not holding the store's lock): a bounded wait. Upkeep asked for
        later is left to the tier's own ``close()``."""
        with self._state:
            self._stop.set()
            self._state.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_JOIN_S)
            if thread.is_alive():
                log.warning("close: the background housekeeper did not stop within %.0f s", _JOIN_S)

    def _run(self) -> None:
        while True:
            with self._state:
                self._state.wait_for(lambda: self._done < self._asked or self._stop.is_set())
                if self._stop.is_set():
                    self._state.notify_all()
                    return
                asked, due, self._due = self._asked, self._due, set()
            try:
                for t in sorted(due):
                    tier = self._tiers[t]
                    with self._inflight.hold(f"upkeep of the {tier.name} tier"):
                        tier.housekeep(self._lock, self._stop)
            except StoreClosed:
                pass
            except BaseException:  # never fatal (the thread lives on): the next poke tries again
                log.exception("background upkeep failed")
            finally:
                with self._state:
                    self._done = asked
                    self._state.notify_all()
