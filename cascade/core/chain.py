"""The tier chain: the store's tiers, fastest first, and every move between them.

The chain claims room (a :class:`~.guards.Claim`), makes it by demoting the index's
victims tier by tier, and runs each move in two phases: under the store's lock the
block's bytes are leased and room below is claimed, the copy runs outside the lock, and
under the lock again the directory is pointed at the new copy before the old one goes
(failure-atomic: a block leaves a tier only once a slower tier holds it; only the last
tier drops). Promotions commit through :meth:`TierChain.moved` the same way. Each step
that changes a tier and the index together runs whole even if Ctrl-C comes
(:func:`.interrupts.atomic`: the KeyboardInterrupt is raised at its end).

Thread-safety: methods marked "under the lock" expect the caller to hold the store's
lock; :meth:`claim_for_put` and :meth:`run_move` take it themselves, copying outside it
(a non-concurrent tier, e.g. REMOTE, is read under it).
"""
from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext

from ..buffers import staging_buffer
from ..distributed.store_layer import Solo
from ..errors import CorruptBlock, TierFull, UnreadableBlock
from ..identity import BlockKey
from ..policy import BlockMeta
from ..stats import StoreMetrics
from ..tiers.base import Memory, Tier
from .guards import Claim, Lease, Move
from .index import BlockIndex
from .interrupts import atomic

log = logging.getLogger(__name__)

_NOTHING = nullcontext()  # (reusable: one object for every put that needs no guard)


class Busy(Exception):
    """A chosen victim may not move or go now: another rank pins it or caches a child."""


class MoveFailed(Exception):
    """A move's copy failed (e.g. the slower tier's disk is full): the block stayed."""


class TierChain:
    """``tiers`` (fastest first) composed with ``index``: claims, demotions, drops."""

    def __init__(self, tiers: list[Tier], index: BlockIndex, metrics: StoreMetrics, lock: threading.RLock,
                 *, namespace_share: float, check_open: Callable[[], None]) -> None:
        self.tiers = tiers
        self.index = index
        self.metrics = metrics
        self.peers: Solo = Solo()  # the multi-rank layer, set by the store when it joins one
        self._lock = lock
        self.share = namespace_share  # a namespace's most of each tier (0: no quota)
        #: With shares: per tier, each namespace's bytes claimed and not committed yet
        #: (a batch claims all its room first: its share counts them, not only the committed)
        self._claimed: list[dict[str, int]] = [{} for _ in tiers]
        self._check_open = check_open
        for t, tier in enumerate(tiers):
            if tier.records_ttl:  # a block written there keeps its TTL across restarts (wall clock)
                tier.expiry_of = index.wall_expiry
            tier.on_relocate = functools.partial(self._relocated, t)
            tier.on_corrupt = functools.partial(self._found_corrupt, t)

    # -- claims ----------------------------------------------------------------------------
    def claim(self, t: int, key: BlockKey | None, nbytes: int, *, parent: str | None = None,
              namespace: str | None = None) -> Claim:
        """Under the lock: make room in tier ``t`` (demotions included) and claim it."""
        namespace = key[0] if key is not None else namespace
        self.make_room(t, nbytes, namespace)
        return self._new_claim(t, key, nbytes, parent, namespace)

    def _new_claim(self, t: int, key: BlockKey | None, nbytes: int, parent: str | None,
                   namespace: str | None) -> Claim:
        """Under the lock: room in tier ``t`` (made already), counted against ``namespace``'s
        share until it is committed or given back."""
        claim = Claim(self._lock, self.tiers[t], t, key, nbytes, parent)
        if self.share > 0 and namespace is not None:
            claimed = self._claimed[t]
            claimed[namespace] = claimed.get(namespace, 0) + nbytes
            claim.on_end = functools.partial(self._unclaimed, t, namespace, nbytes)
        return claim

    def _unclaimed(self, t: int, namespace: str, nbytes: int) -> None:
        claimed = self._claimed[t]
        claimed[namespace] -= nbytes
        if not claimed[namespace]:
            del claimed[namespace]

    def claim_fastest(self, key: BlockKey, nbytes: int, parent: str | None) -> Claim | None:
        """Under the lock: room in the fastest tier for a best-effort copy (promotion,
        private copy); None when none can be made."""
        try:
            return self.claim(0, key, nbytes, parent=parent)
        except (TierFull, OSError) as exc:
            log.debug("no room in %s for %s: %s", self.tiers[0].name, key[1], exc)
            return None

    def wait_for_compactions(self) -> None:
        """Outside the lock: back-pressure on writers. Wait (bounded) for the compaction
        under way in each tier that writes outran (``behind``: its files over their bound)."""
        for tier in self.tiers:
            if tier.behind:
                tier.wait_for_compaction()

    def claim_for_put(self, key: BlockKey, nbytes: int, parent: str | None) -> Claim:
        """Room for a new block in the fastest tier that can make it (one full of pinned
        blocks is passed over). The demotions that make room copy outside the lock, one
        at a time, between short locked steps. :class:`TierFull` when no tier can."""
        failed: dict[BlockKey, set[int]] = {}  # victims' tiers a move into failed: skipped next time
        set_aside: list[BlockMeta] = []  # victims another rank keeps in place
        try:
            while True:
                self.wait_for_compactions()
                with self._lock:
                    self._check_open()
                    step = self._next_step(key, nbytes, parent, failed)
                if isinstance(step, Claim):
                    return step
                try:
                    self.run_move(step)
                except MoveFailed:
                    failed.setdefault(step.meta.key, set()).add(step.dst.t)
                except Busy:
                    with self._lock:
                        self.index.set_aside(step.meta)
                    set_aside.append(step.meta)
        finally:
            if set_aside:
                with self._lock:
                    for meta in set_aside:
                        self.index.changed(meta)

    def _next_step(self, key: BlockKey, nbytes: int, parent: str | None,
                   failed: dict[BlockKey, set[int]]) -> Claim | Move:
        """Under the lock: a claim in the fastest tier that can make room, or the next
        demotion to run first."""
        reasons = []
        for t, tier in enumerate(self.tiers):
            if tier.capacity < nbytes:
                reasons.append(f"{tier.name}: the block exceeds its capacity of {tier.capacity}")
                continue
            try:
                with self._parent_kept(t, key, nbytes, parent):
                    move = self.make_room(t, nbytes, key[0], defer=True, failed=failed)
                return move or self._new_claim(t, key, nbytes, parent, key[0])
            except OSError as exc:  # TierFull included (ENOSPC and friends too)
                self.metrics.tiers[t].full_events += 1
                reasons.append(str(exc))
        raise TierFull(f"no tier can take a block of {nbytes} bytes: {'; '.join(reasons)}")

    def _parent_kept(self, t: int, key: BlockKey, nbytes: int, parent: str | None) -> AbstractContextManager:
        """Under the lock: while room is made in tier ``t`` for a put of ``key``, its cached
        ``parent`` counts as having a child there (as a promotion's block does,
        ``ReadPath.claim_promotion``), so the room is not made by moving the parent out: a
        drop would lose the prefix's head as its tail comes in. Nothing to do (no call
        into the index) when no room is to be made or the parent is not cached."""
        if parent is None or (self.share <= 0 and self.tiers[t].fits(nbytes)):
            return _NOTHING
        if self.index.get((key[0], parent)) is None:
            return _NOTHING
        return self.index.counted_in(BlockMeta(key, nbytes, t, parent=parent), t)  # the block to be

    # -- making room -----------------------------------------------------------------------
    def make_room(self, t: int, nbytes: int, namespace: str | None = None, *,
                  defer: bool = False, failed: dict[BlockKey, set[int]] | None = None) -> Move | None:
        """Under the lock: evict from tier ``t`` until ``nbytes`` (of ``namespace``) fit;
        with a namespace share, a namespace over its share first moves its own blocks
        down. :class:`TierFull` when it cannot. With ``defer``, the first demotion that
        needs a copy is started and returned instead (the caller runs it outside the
        lock and asks again); ``failed`` names the tiers each block's earlier moves
        failed into (skipped now)."""
        tier = self.tiers[t]
        if nbytes > tier.capacity:
            self.metrics.tiers[t].full_events += 1
            raise TierFull(f"{tier.name}: a block of {nbytes} bytes exceeds its capacity of {tier.capacity}")
        if namespace is not None and self.share > 0:
            self._keep_share(t, nbytes, namespace)
        set_aside: list[BlockMeta] = []
        try:
            while not tier.fits(nbytes):
                victim = self.index.victim(t)
                if victim is None:
                    self.metrics.tiers[t].full_events += 1
                    raise TierFull(f"{tier.name}: full and every block in it is pinned or holds cached children")
                try:
                    if not defer:
                        self.demote(victim)
                    elif (move := self.start_demotion(victim, skip=(failed or {}).get(victim.key, set()))):
                        return move
                except Busy:  # another rank pins it (or caches its child): not now
                    self.index.set_aside(victim)
                    set_aside.append(victim)
        finally:
            for meta in set_aside:
                self.index.changed(meta)
        return None

    def _keep_share(self, t: int, nbytes: int, namespace: str) -> None:
        """Move ``namespace``'s own blocks out of tier ``t`` until ``nbytes`` more stay
        within its share; :class:`TierFull` when its movable blocks do not suffice.
        O(log n) per victim (the policy keeps each namespace's victim order)."""
        share = self.share * self.tiers[t].capacity
        set_aside: list[BlockMeta] = []
        try:
            while self.index.ns_bytes[t].get(namespace, 0) + self._claimed[t].get(namespace, 0) + nbytes > share:
                victim = self.index.namespace_victim(t, namespace)
                if victim is None:
                    self.metrics.tiers[t].full_events += 1
                    raise TierFull(f"{self.tiers[t].name}: namespace {namespace!r} is at its share "
                                   f"({self.share:g} of the tier) and none of its blocks there can move")
                try:
                    self.demote(victim)
                except Busy:  # another rank pins it: not now
                    self.index.set_aside(victim)
                    set_aside.append(victim)
        finally:
            for meta in set_aside:
                self.index.changed(meta)

    def demote(self, meta: BlockMeta) -> None:
        """Under the lock: move ``meta`` to the next slower tier that takes it, or drop
        it when none does. :class:`Busy` when another rank keeps it in place."""
        skip: set[int] = set()
        while (move := self.start_demotion(meta, skip=skip)) is not None:
            try:
                self.run_move(move)
                return
            except MoveFailed:
                skip.add(move.dst.t)

    def start_demotion(self, meta: BlockMeta, *, skip: set[int] = frozenset()) -> Move | None:
        """Under the lock: start moving ``meta`` to the next slower tier that takes it
        (one without room or capacity, or in ``skip``, is passed over), or, when none
        does, drop it now (None). :class:`Busy` when another rank pins it or caches a
        child of it."""
        t = meta.tier
        for lower in self.slower_tiers(meta, skip):
            try:
                self.make_room(lower, meta.nbytes, meta.key[0])
                return self.begin_move(meta, lower)
            except (TierFull, OSError) as exc:
                log.debug("demotion of %s to %s failed (%s)", meta.key[1], self.tiers[lower].name, exc)
        if not self.peers.withdraw(meta, leaf_only=True):
            raise Busy(meta.key)
        with atomic():
            self.metrics.tiers[t].evictions += 1
            self.index.evicted(meta)
            self.drop(meta)
        return None

    def slower_tiers(self, meta: BlockMeta, skip: set[int] = frozenset()) -> list[int]:
        """The tiers below ``meta``'s, fastest first, that could hold it (its size within
        their capacity), less those in ``skip``."""
        return [lower for lower in range(meta.tier + 1, len(self.tiers))
                if lower not in skip and self.tiers[lower].capacity >= meta.nbytes]

    # -- moves -----------------------------------------------------------------------------
    def begin_move(self, meta: BlockMeta, dst: int) -> Move:
        """Under the lock: lease ``meta``'s bytes and claim room for it in tier ``dst``
        (:class:`TierFull` if none; nothing is then held)."""
        with ExitStack() as undo:
            lease = undo.enter_context(Lease(self._lock, self.index, meta, meta.tier, self.tiers[meta.tier]))
            claim = self._new_claim(dst, meta.key, meta.nbytes, meta.parent, meta.key[0])
            undo.pop_all()
        return Move(lease, claim, meta.tier)

    def run_move(self, move: Move, *, cancel_if: Callable[[BlockMeta], bool] | None = None) -> bool:
        """Copy a started move's block (outside the lock when the caller holds none),
        then, under the lock, point the directory at the new copy and free the old one.
        Whether the block moved: not when it was deleted or replaced meanwhile, or when
        ``cancel_if(meta)``, asked under the lock before the commit, says it stays (a
        background demotion of a block hinted meanwhile). A failed copy leaves the block
        where it was and raises :class:`MoveFailed`; :class:`Busy` when another rank
        pinned it meanwhile. Gives back the move."""
        with move, staging_buffer(move.meta.nbytes, device=_touches_device(move)) as buf:
            meta, lease, dst = move.meta, move.source, move.dst  # a demotion's source is a Lease
            error: Exception | None = None
            gone = False
            with nullcontext() if lease.tier.concurrent else self._lock:
                if not lease.tier.concurrent and not lease.current():
                    gone = True  # deleted or replaced since the move began (such a tier keeps no leased bytes)
                else:
                    try:
                        lease.read([buf])
                    except CorruptBlock as exc:
                        error = exc
            if error is None and not gone:
                try:
                    dst.fill([buf])
                except OSError as exc:  # TierFull included: ENOSPC and friends
                    error = exc
            with self._lock, atomic():
                here = lease.current()
                lease.release()
                if error is None and here and cancel_if is not None and cancel_if(meta):
                    dst.discard()
                    self.index.kept(meta)
                    return False
                if error is None and here:
                    try:
                        dst.commit(meta.key)  # a non-concurrent tier (REMOTE) copies only now
                    except OSError as exc:  # TierFull included
                        error = exc
                    else:
                        self.moved(meta, lease.t, dst.t)
                        self.metrics.tiers[lease.t].demotions += 1
                        self.metrics.tiers[dst.t].bytes_written += meta.nbytes
                        return True
                dst.discard()  # failed, or the block was deleted or replaced meanwhile
                if here:
                    self.index.kept(meta)
                if isinstance(error, UnreadableBlock):  # kept where it is: its bytes were not found bad
                    log.warning("%s", error)
                    self.metrics.tiers[lease.t].read_errors += 1
                    if here:
                        raise MoveFailed(meta.key) from error
                elif isinstance(error, CorruptBlock):
                    log.warning("%s", error)
                    self.metrics.tiers[lease.t].corruptions += 1
                    if here:
                        self.drop_corrupt(meta)
                elif error is not None:
                    self.metrics.tiers[dst.t].full_events += 1
                    if here:
                        raise MoveFailed(meta.key) from error
                return False

    def moved(self, meta: BlockMeta, src: int, dst: int) -> None:
        """Under the lock: the block now sits in ``src`` and ``dst``: repoint the
        directory, then free ``src``. If another rank pins it, undo the copy and raise
        :class:`Busy`."""
        with atomic():
            if not self.peers.republish(meta, dst):
                del self.tiers[dst][meta.key]
                raise Busy(meta.key)
            del self.tiers[src][meta.key]
            self.index.moved(meta, dst)

    def _relocated(self, t: int, keys: list[BlockKey]) -> None:
        """Under the lock (a tier compacts inside calls made under it): blocks tier ``t``
        moved within itself get their directory entries pointed at the new place."""
        for key in keys:
            meta = self.index.get(key)
            if meta is not None and meta.tier == t:
                self.peers.relocated(meta)

    def _found_corrupt(self, t: int, keys: list[BlockKey]) -> None:
        """Under the lock (as :meth:`_relocated`): blocks whose bytes tier ``t`` found
        corrupt by itself are counted as corruptions and dropped as a read that found
        them so would drop them (:meth:`drop_corrupt`: kept while another rank pins them)."""
        for key in keys:
            meta = self.index.get(key)
            if meta is not None and meta.tier == t:
                self.metrics.tiers[t].corruptions += 1
                self.drop_corrupt(meta)

    # -- drops -----------------------------------------------------------------------------
    def drop(self, meta: BlockMeta) -> None:
        """Under the lock: remove a block from its tier and from the index."""
        tier = self.tiers[meta.tier]
        with atomic():
            if meta.key in tier:
                del tier[meta.key]
            self.index.forget(meta)

    def withdraw_and_drop(self, meta: BlockMeta) -> bool:
        """Under the lock: drop a block unless another rank pins it (False)."""
        if not self.peers.withdraw(meta, leaf_only=False):
            return False
        self.drop(meta)
        return True

    def drop_corrupt(self, meta: BlockMeta) -> None:
        """Under the lock: drop a block whose bytes failed verification; while another
        rank pins it, the bytes stay (its reads verify the checksum), a later read retries."""
        self.withdraw_and_drop(meta)

    def persist_ttl(self, meta: BlockMeta, *, batched: bool = False) -> None:
        """Under the lock: record ``meta``'s expiry in its tier, if the tier keeps TTLs;
        ``batched`` (a read's refresh): written with others later (the tier's choice)."""
        tier = self.tiers[meta.tier]
        if tier.records_ttl:
            try:
                tier.set_expiry(meta.key, self.index.wall_expiry(meta.key), batched=batched)
            except OSError as exc:  # the block still expires in this process
                log.warning("cannot record the TTL of %s: %s", meta.key[1], exc)


def _touches_device(move: Move) -> bool:
    """Whether a move copies from or into device memory (its buffer is then pinned)."""
    return Memory.DEVICE in (move.source.tier.memory, move.dst.tier.memory)  # a demotion's source is a Lease
