"""The background demoter: keeps the fastest tier below a high watermark so a put finds
room there and lands without demoting on its own thread.

When a put's commit leaves the fastest tier above ``high`` (a fraction of its capacity),
:meth:`Demoter.poke` wakes one daemon thread owned by the store, which demotes the
index's victims (the same two-phase moves as the put path: :mod:`.chain`) until the tier
is at or below ``low``. Each step holds an in-flight count (:class:`~.guards.InFlight`);
``close()`` stops the thread after the move under way (a bounded wait, not holding the
store's lock); the copies run outside the store's lock. ``flush()`` waits for the rounds
asked for before it. A failed move (e.g. a full disk below) leaves its block where it
was, in its place in the eviction order (:meth:`~cascade.policy.Policy.changed` is not a
use). The round then passes over that tier and tries the next one down (the REMOTE tier
can run out of room on every lending rank while this rank's accounting still shows
room: the file tier takes the block). When no tier below is left, the failure is
logged and counted (``background_demotion_errors``), never reaches a caller, and
pauses the demoter until a put's own demotion out of the fastest tier succeeds (the tier
below has room again): while the tier below is full, retrying would only shield its
victim (leased by the failing move) from the puts' evictions, so that they dropped
younger blocks in its place, and write to a full disk again and again. Hinted blocks are
never demoted in the background: a round ends when only they are left above ``low``, and
a block hinted while its move copied stays where it was. A put that finds the tier truly full still makes
room itself, as before. Thread-safe.
"""
from __future__ import annotations

import logging
import threading
import time

from ..policy import BlockMeta
from .background import BackgroundWorker
from .chain import Busy, MoveFailed, TierChain
from .guards import InFlight

log = logging.getLogger(__name__)


def _hinted(meta: BlockMeta) -> bool:
    """Whether a block is wanted soon (hinted): a background demotion leaves it in place."""
    return bool(meta.hints)


class Demoter(BackgroundWorker):
    """Background demotions out of ``chain``'s fastest tier, from ``high`` down to ``low``
    (fractions of its capacity). Off (nothing starts) with one tier or ``high`` = 1."""

    def __init__(self, chain: TierChain, inflight: InFlight, lock: threading.RLock, *,
                 high: float, low: float) -> None:
        super().__init__("cascade-demoter", "demotion")
        self._chain, self._inflight, self._lock = chain, inflight, lock
        tier = chain.tiers[0]
        self._high, self._low = high * tier.capacity, low * tier.capacity
        self.enabled = len(chain.tiers) > 1 and high < 1.0
        self._paused_at: int | None = None  # the fastest tier's demotion count when a move failed (paused)

    def poke(self) -> None:
        """Under the store's lock, after a commit: start a round when the fastest tier is
        above the high watermark."""
        if not self.enabled or self._taken() <= self._high or self._paused():
            return
        with self._state:
            self._ask()

    def _paused(self) -> bool:
        """Under the store's lock: whether a failed move paused the demoter and no
        demotion out of the fastest tier has succeeded since."""
        if self._paused_at is None:
            return False
        if self._chain.metrics.tiers[0].demotions == self._paused_at:
            return True
        self._paused_at = None
        return False

    def _taken(self) -> int:
        """Bytes of the fastest tier allocated (what decides whether a block fits)."""
        tier = self._chain.tiers[0]
        return tier.capacity - tier.free

    def _failed(self) -> None:
        with self._lock:
            self._chain.metrics.counters.background_demotion_errors += 1

    def _round(self) -> None:
        """Demote victims of the fastest tier until it is at or below ``low``."""
        chain = self._chain
        set_aside: list[BlockMeta] = []  # victims another rank keeps in place
        failed: set[int] = set()  # tiers below that failed a move this round: passed over until the next
        try:
            while True:
                chain.wait_for_compactions()  # the tier below may be over its disk bound
                with self._inflight.hold("a background demotion"):
                    with self._lock:
                        if (self._stop.is_set() or self._taken() <= self._low
                                or (victim := chain.index.victim(0)) is None or victim.hints):
                            return  # done, or only hinted blocks (wanted soon, here) are left to move
                        try:
                            move = chain.start_demotion(victim, skip=failed)
                        except Busy:
                            chain.index.set_aside(victim)
                            set_aside.append(victim)
                            continue
                        if move is None:  # no slower tier took it: dropped (counted an eviction)
                            continue
                    try:
                        if not chain.run_move(move, cancel_if=_hinted):
                            return  # hinted (or deleted) while it was copied: it stays; the round ends
                    except MoveFailed as exc:
                        failed.add(move.dst.t)
                        with self._lock:
                            if chain.slower_tiers(victim, failed):  # a tier further down may take it
                                log.debug("background demotion of %s into %s failed (%s): trying below",
                                          victim.key[1], move.dst.tier.name, exc.__cause__)
                                continue
                            chain.metrics.counters.background_demotion_errors += 1
                            self._paused_at = chain.metrics.tiers[0].demotions
                        log.warning("background demotion of %s failed: %s", victim.key[1], exc.__cause__)
                        return
                    except Busy:
                        with self._lock:
                            chain.index.set_aside(victim)
                        set_aside.append(victim)
                        continue
                    with self._lock:
                        if chain.index.get(victim.key) is victim and victim.tier > 0:  # not deleted meanwhile
                            chain.metrics.counters.background_demotions += 1
                time.sleep(0)  # hand the GIL to a put woken by the lock just released (else it waits a switch interval)
        finally:
            if set_aside:
                with self._lock:
                    for meta in set_aside:
                        chain.index.changed(meta)
