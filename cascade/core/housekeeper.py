"""The background housekeeper: the file tier's disk upkeep, without the store's lock
held while it writes, copies or frees.

A tier with upkeep due (the file tier: deletes to mark on disk, files to free,
empty files to make ahead, dead space to reclaim: :mod:`cascade.tiers.compaction`) calls :meth:`Housekeeper.poke`
under the store's lock instead of doing that work inside the get, put or delete that
made it due. One daemon thread owned by the store then runs the tier's
:meth:`~cascade.tiers.base.Tier.housekeep`: each step takes the lock only to pick its
work and to record its end; the disk writes, the copying and the closing of freed files
run outside it (gets, puts and deletes go on meanwhile). Each round holds an in-flight
count (:class:`~.guards.InFlight`); ``close()`` stops a compaction's copying between two
records (the compaction is then undone: its target file goes, nothing is counted) and
joins the thread; ``flush()`` waits for the upkeep asked for before it (the thread
and its rounds: :class:`~.background.BackgroundWorker`). Thread-safe.
"""
from __future__ import annotations

import functools
import threading

from ..tiers.base import Tier
from .background import BackgroundWorker
from .guards import InFlight


class Housekeeper(BackgroundWorker):
    """Background upkeep of ``tiers`` (each asks through its ``on_housekeeping_due``)."""

    def __init__(self, tiers: list[Tier], inflight: InFlight, lock: threading.RLock) -> None:
        super().__init__("cascade-housekeeper", "upkeep")
        self._tiers, self._inflight, self._lock = tiers, inflight, lock
        self._due: set[int] = set()  # tiers that asked since their last round (guarded by _state)
        for t, tier in enumerate(tiers):
            tier.on_housekeeping_due = functools.partial(self.poke, t)

    def poke(self, t: int) -> None:
        """Under the store's lock: tier ``t`` has upkeep due; run it soon."""
        with self._state:
            self._due.add(t)
            self._ask()

    def _round(self) -> None:
        with self._state:
            due, self._due = self._due, set()
        for t in sorted(due):
            tier = self._tiers[t]
            with self._inflight.hold(f"upkeep of the {tier.name} tier"):
                tier.housekeep(self._lock, self._stop)
