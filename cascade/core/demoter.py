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

from ..errors import StoreClosed
from ..policy import BlockMeta
from .chain import Busy, MoveFailed, TierChain
from .guards import InFlight

log = logging.getLogger(__name__)

_JOIN_S = 5.0  # close(): most seconds to wait for the thread to end once no move is in flight


def _hinted(meta: BlockMeta) -> bool:
    """Whether a block is wanted soon (hinted): a background demotion leaves it in place."""
    return bool(meta.hints)


class Demoter:
    """Background demotions out of ``chain``'s fastest tier, from ``high`` down to ``low``
    (fractions of its capacity). Off (nothing starts) with one tier or ``high`` = 1."""

    def __init__(self, chain: TierChain, inflight: InFlight, lock: threading.RLock, *,
                 high: float, low: float) -> None:
        self._chain, self._inflight, self._lock = chain, inflight, lock
        tier = chain.tiers[0]
        self._high, self._low = high * tier.capacity, low * tier.capacity
        self.enabled = len(chain.tiers) > 1 and high < 1.0
        self._state = threading.Condition(threading.Lock())  # guards _asked, _done, _stopped
        self._asked = self._done = 0  # rounds asked for by pokes, and asked for before the last one ended
        self._stopped = False
        self._paused_at: int | None = None  # the fastest tier's demotion count when a move failed (paused)
        self._thread: threading.Thread | None = None

    def poke(self) -> None:
        """Under the store's lock, after a commit: start a round when the fastest tier is
        above the high watermark."""
        if not self.enabled or self._taken() <= self._high or self._paused():
            return
        with self._state:
            if self._stopped:
                return
            self._asked += 1
            if self._thread is None:  # recorded once started (stop() cannot join one that never started)
                thread = threading.Thread(target=self._run, name="cascade-demoter", daemon=True)
                thread.start()
                self._thread = thread
            self._state.notify_all()

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

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait (not holding the store's lock) until every round asked for before this
        call has ended; False when ``timeout`` seconds passed first."""
        with self._state:
            asked = self._asked
            return self._state.wait_for(lambda: self._stopped or self._done >= asked, timeout)

    def stop(self) -> None:
        """Stop the thread after the move under way (``close()``; not holding the
        store's lock): a bounded wait."""
        with self._state:
            self._stopped = True
            self._state.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_JOIN_S)
            if thread.is_alive():
                log.warning("close: the background demoter did not stop within %.0f s", _JOIN_S)

    def _run(self) -> None:
        while True:
            with self._state:
                self._state.wait_for(lambda: self._done < self._asked or self._stopped)
                if self._stopped:
                    self._state.notify_all()
                    return
                asked = self._asked
            try:
                self._round()
            except StoreClosed:
                pass
            except BaseException:  # never lost, never fatal (the thread lives on): the next poke tries again
                log.exception("background demotion failed")
                with self._lock:
                    self._chain.metrics.counters.background_demotion_errors += 1
            finally:
                with self._state:
                    self._done = asked
                    self._state.notify_all()

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
                        if (self._stopped or self._taken() <= self._low
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
