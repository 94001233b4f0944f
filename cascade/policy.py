"""Placement and eviction policy, separate from the tiers (DESIGN.md section 4).

The store keeps one :class:`BlockMeta` per cached block and tells the policy about every
change; the policy answers one question: which block of tier ``t`` goes next.

Semantic policy (default):

1. leaf-first: a block is not moved out of tier ``t`` while one of its children sits in
   ``t`` or a faster tier (a prefix's head outlives its tail);
2. pinned blocks (ref-count > 0) and ones being read right now are never chosen;
3. hinted blocks (wanted by a queued request, ``store.hint``) go only when no unhinted
   block may, and among them the one whose next hinted use comes last (Belady within the
   queue: the hint's position, e.g. the request's place in the queue; within one
   position the deeper block, which its request reads later);
4. among the unhinted blocks the lowest value goes first, value = frequency x sharing x
   2**priority, aged GreedyDual-style: a block's score is ``clock + value`` with the clock
   read at its last use, and the clock rises to each victim's score once that victim
   leaves its tier (moved down or dropped, not when it is only chosen: the caller may
   keep it), so recency counts too. Changes that are not uses (a child added or
   dropped, a pin) keep the clock reading.

Frequency outlives eviction: the policy remembers the use counts of the last ``history``
blocks it dropped, and a block put again starts from its old count (on the Mooncake
conversation trace this lifts the hit ratio at 5,000 blocks from 12.9% to 14.7%).

Why hinted blocks may go at all: when they could not, a deep queue's hints had to be
capped (``hint_fraction``) so they could not starve puts, and the cap went to whichever
hints came first, often blocks wanted hundreds of requests later, while the blocks the next
requests read were refused; at 1,000 blocks depth 256 then hit less than depth 64. Ranked
by next use, a deeper queue only adds knowledge (benchmark ``queue_hints``, beside the
lookahead oracle of :mod:`benchmark.reference_policies`).

LRU (``policy="lru"``) keeps rules 2 and 3 and orders the rest by last use, for comparison.
Each tier has a heap of candidate entries with lazy invalidation: O(log n) per change. A
new block costs O(1): it waits in its tier's list of fresh blocks until the next victim
of that tier is asked for, and only then gets its heap entry.
Not thread-safe: the store serialises calls.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
import itertools
import math
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .identity import BlockKey


def check_position(position: object) -> float:
    """A hint's queue position as a float; :class:`ConfigError` unless it is a finite number."""
    if isinstance(position, bool) or not isinstance(position, (int, float)) or not math.isfinite(position):
        raise ConfigError(f"hint position: expected a finite number, got {position!r}")
    return float(position)


@dataclass(slots=True, eq=False)
class BlockMeta:
    """What the store knows about one cached block (exactly one tier holds it)."""

    key: BlockKey
    nbytes: int
    tier: int
    parent: str | None = None
    depth: int = 0  # blocks before it in its sequence, as far as cached ancestors tell (BlockIndex.admit)
    depth_partial: bool = False  # an ancestor was missing when its depth was set: raised when that one comes
    hits: int = 0
    shares: int = 1  # puts of this content (dedup) in this namespace
    pins: int = 0
    readers: int = 0  # reads copying it out outside the store's lock: not moved meanwhile
    hints: int = 0  # queued requests that will read it (store.hint): evicted last meanwhile
    hint_uses: list[float] | tuple[()] = ()  # heap: queue position of each hint (a list once hinted)
    priority: int = 0
    ttl: float = 0.0
    first_use: float = 0.0
    last_use: float = 0.0
    child_tiers: list[int] | tuple[()] = ()  # cached children per tier (empty: none yet)
    base: float = 0.0  # policy clock at the last use (semantic score = base + value)
    entry: Any = None  # the directory entry this rank published for it (multi-rank runs)
    checksum: int = 0  # XXH3-64 of the block's bytes, published with it (multi-rank runs)
    version: int = 0  # bumps on every change; stale heap entries are skipped
    touch_seq: int = 0  # a use not yet in the heap: its order there (Policy.touched)
    order: int = 0  # its place among equal scores: the sequence number of its last use
    unlisted: bool = False  # no heap entry (skipped by a victim search, or set aside): pushed at its next change

    def children_at_or_above(self, tier: int) -> int:
        return sum(self.child_tiers[: tier + 1])

    def children(self) -> int:
        return sum(self.child_tiers)


class Policy:
    """Chooses victims per tier. ``kind`` is ``"semantic"`` or ``"lru"``."""

    def __init__(self, num_tiers: int, kind: str = "semantic", *, ttl_mode: str = "last_use",
                 history: int = 0) -> None:
        if kind not in ("semantic", "lru"):
            raise ValueError(f"unknown policy {kind!r}")
        self.kind = kind
        self.ttl_mode = ttl_mode
        self.num_tiers = num_tiers
        self._heaps: list[list[tuple[tuple[int, float, int], int, int, BlockMeta]]] = [[] for _ in range(num_tiers)]
        self._clock = 0.0  # GreedyDual inflation value, shared by all tiers
        self._live = [0] * num_tiers
        self._seq = itertools.count(1)  # from 1: a touch_seq of 0 means none
        self._history = history if kind == "semantic" else 0
        self._ghosts: OrderedDict[BlockKey, int] = OrderedDict()  # dropped key -> its uses
        self._last_position = 0.0  # the latest hint position given or assigned
        self._lazy_touch = True  # touched() defers its push to victim() (see there)
        #: Per tier, blocks admitted since its last victim() -> their version then: each is
        #: pushed by _push_fresh() unless it changed (was pushed, removed, set aside) since.
        self._fresh: list[dict[BlockMeta, int]] = [{} for _ in range(num_tiers)]
        #: Unhinted blocks victim() chose (semantic) -> their score then: the clock rises to
        #: it when the block leaves its tier for room (:meth:`_left`), not when it is chosen.
        self._chosen: dict[BlockMeta, float] = {}

    # -- notifications from the store ---------------------------------------------------
    def admitted(self, meta: BlockMeta, now: float) -> None:
        """A new block entered ``meta.tier``. O(1): its heap entry waits for the next
        :meth:`victim` of the tier (:meth:`_push_fresh`), which pushes it with the order
        of this use and the score it has then: the same as pushing now, since whatever
        changes a score pushes the block (a change) or defers a push (a touch)."""
        meta.first_use = meta.last_use = now
        meta.base = self._clock
        if self._ghosts:
            meta.hits = max(meta.hits, self._ghosts.pop(meta.key, 0))
        tier = meta.tier
        live = self._live[tier] = self._live[tier] + 1
        meta.order = next(self._seq)
        meta.touch_seq = 0
        fresh = self._fresh[tier]
        fresh[meta] = meta.version
        if len(fresh) > live + 64:  # mostly removed already: push the rest, let the others go
            self._push_fresh(tier)

    def touched(self, meta: BlockMeta, now: float) -> None:
        """A hit (or a dedup put) on ``meta``. A use only raises a block's score (later
        last use; a higher clock reading and value), so its heap entry is left as it is
        and fixed when it reaches the top (:meth:`victim`), in the place this push would
        have given it: the same order as pushing now, without a push per hit."""
        meta.hits += 1
        meta.last_use = now
        meta.base = self._clock
        if self._lazy_touch:
            meta.touch_seq = next(self._seq)
        else:
            self._push(meta, next(self._seq))

    def moved(self, meta: BlockMeta, old_tier: int) -> None:
        """``meta`` moved from ``old_tier`` to ``meta.tier`` (down: a victim demoted)."""
        if self._chosen:
            self._left(meta, meta.tier > old_tier)
        self._live[old_tier] -= 1
        self._live[meta.tier] += 1
        self._push(meta)

    def changed(self, meta: BlockMeta) -> None:
        """Pins, children, priority or TTL of ``meta`` changed."""
        self._push(meta)

    def read_done(self, meta: BlockMeta) -> None:
        """A read of ``meta`` ended: it is a candidate again. Its heap entry stays valid
        unless a victim search skipped it meanwhile (it was being read) or it was set
        aside: only then is it pushed (a push per read cost about a seventh of a warm
        4 KiB file-tier get)."""
        if meta.unlisted:
            self._push(meta)

    def hint_position(self, position: float | None) -> float:
        """The queue position of one hint call: ``position`` as given (the request's place
        in the queue, e.g. its arrival number), or, without one, just after the latest."""
        position = self._last_position + 1 if position is None else check_position(position)
        self._last_position = max(self._last_position, position)
        return position

    def hinted(self, meta: BlockMeta, position: float) -> None:
        """One more hint of ``meta``, for a request at queue ``position``
        (:meth:`hint_position`); the store counted it in ``meta.hints``."""
        if not meta.hint_uses:
            meta.hint_uses = []
        heapq.heappush(meta.hint_uses, position)
        self._push(meta)

    def hint_released(self, meta: BlockMeta, position: float | None = None) -> None:
        """One hint of ``meta`` is gone (used up by a read, or withdrawn): the one at
        ``position`` if it has one there, else the soonest."""
        uses = meta.hint_uses
        if uses:
            if position is not None and position in uses:
                uses.remove(position)
                heapq.heapify(uses)
            else:
                heapq.heappop(uses)
        self._push(meta)

    def set_aside(self, meta: BlockMeta) -> None:
        """Take ``meta`` out of the candidates until the next :meth:`changed` (it was
        chosen but may not go now, e.g. another rank pins it)."""
        self._chosen.pop(meta, None)
        meta.version += 1
        meta.unlisted = True

    def kept(self, meta: BlockMeta) -> None:
        """``meta``, which :meth:`victim` may have chosen, stays in its tier (its move down
        failed or was called off): the score recorded for it goes, so the clock does not
        rise to it if the block leaves later without being chosen again (a namespace
        share's victim, :meth:`~cascade.namespace_victims.NamespaceVictims.victim_in`)."""
        self._chosen.pop(meta, None)

    def evicted(self, meta: BlockMeta) -> None:
        """``meta`` is about to be dropped for room: remember how much it was used."""
        if self._chosen:
            self._left(meta, True)
        if self._history:
            self._ghosts[meta.key] = meta.hits + 1
            self._ghosts.move_to_end(meta.key)
            if len(self._ghosts) > self._history:
                self._ghosts.popitem(last=False)

    def removed(self, meta: BlockMeta) -> None:
        """``meta`` left the cache."""
        if self._chosen:
            self._left(meta, False)
        self._live[meta.tier] -= 1
        meta.hint_uses = ()
        meta.version += 1

    def clear(self) -> None:
        """Forget every block (the store closed): no reference to their metadata stays,
        so it goes as soon as the store's index drops it, not at a later full collection
        of the garbage collector (whose pass over it a put or get elsewhere would pay)."""
        for heap, fresh in zip(self._heaps, self._fresh):
            heap.clear()
            fresh.clear()
        self._chosen.clear()
        self._live = [0] * self.num_tiers
        self._ghosts.clear()

    # -- decisions ----------------------------------------------------------------------
    def eligible(self, meta: BlockMeta) -> bool:
        """Whether ``meta`` may leave its tier now."""
        if meta.pins > 0 or meta.readers > 0:
            return False
        return self.kind == "lru" or meta.children_at_or_above(meta.tier) == 0

    def victim(self, tier: int) -> BlockMeta | None:
        """The block of ``tier`` to move down (or drop) next, or None if none may go.
        Does not remove the block, nor age the clock yet: that waits until the block
        leaves (:meth:`moved` down, :meth:`evicted`), as the caller may keep it (another
        rank pins it, its copy down fails, it is hinted meanwhile)."""
        if self._fresh[tier]:
            self._push_fresh(tier)
        heap = self._heaps[tier]
        while heap:
            score, _, version, meta = heap[0]
            if version != meta.version or meta.tier != tier:
                heapq.heappop(heap)
                continue
            if meta.touch_seq:  # used since this entry was pushed: where that use puts it
                heapq.heappop(heap)
                self._push(meta, meta.touch_seq)
                heap = self._heaps[tier]  # _push may have compacted it into a new list
                continue
            if not self.eligible(meta):
                heapq.heappop(heap)  # pushed again when it becomes eligible (changed(), read_done())
                meta.unlisted = True
                continue
            if self.kind == "semantic" and not score[0]:
                self._chosen[meta] = score[1]
            return meta
        return None

    def expires_at(self, meta: BlockMeta) -> float:
        """Time after which ``meta`` is stale (inf without a TTL)."""
        if meta.ttl <= 0:
            return math.inf
        return (meta.last_use if self.ttl_mode == "last_use" else meta.first_use) + meta.ttl

    def value(self, meta: BlockMeta) -> float:
        """Worth of keeping ``meta`` (semantic): frequency x sharing x 2**priority.

        No depth term: a depth prior fitted to the Mooncake conversation trace (deeper
        blocks are reused less there) fell 0.02 points below LRU on the built-in
        generator at 5,000 blocks (seeds 0 and 1). Without it the policy is at or above
        LRU on the trace and on generator seeds 0-2 at 1,000-20,000 blocks
        (benchmark/results/cascade_queue_hints_*.json, depth 0).
        """
        frequency = 1 + meta.hits
        sharing = max(meta.shares, sum(meta.child_tiers), 1)  # (meta.children(), one call less per push)
        return frequency * sharing * 2.0 ** meta.priority

    def score(self, meta: BlockMeta) -> tuple[int, float, int]:
        """Eviction order: the lowest score goes first. Unhinted blocks ``(0, last use)``
        (LRU) or ``(0, clock + value)`` (semantic); hinted ones after them all,
        ``(1, -next hinted use, -depth)``."""
        if meta.hint_uses:
            return (1, -meta.hint_uses[0], -meta.depth)
        return (0, meta.last_use if self.kind == "lru" else meta.base + self.value(meta), 0)

    # -- internals ----------------------------------------------------------------------
    def _left(self, meta: BlockMeta, for_room: bool) -> None:
        """``meta`` leaves its tier: if :meth:`victim` chose it and it goes ``for_room``
        (GreedyDual: an eviction), the clock rises to its score then."""
        score = self._chosen.pop(meta, None)
        if score is not None and for_room:
            self._clock = max(self._clock, score)

    def _push_fresh(self, tier: int) -> None:
        """Heap entries for the blocks admitted to ``tier`` since the last call that are
        still as they were admitted (the others have an entry already, or left)."""
        fresh, self._fresh[tier] = self._fresh[tier], {}
        for meta, version in fresh.items():
            if meta.version == version and meta.tier == tier:
                self._push(meta)

    def _push(self, meta: BlockMeta, seq: int = 0) -> None:
        """A fresh heap entry for ``meta``; its older entries go stale. Among equal scores
        it is ordered by ``seq``, a use now, or else by its last use (a pending touch, or
        ``meta.order``): a change that is not a use (a reader done, a move, a pin) keeps
        its place, so a block whose demotion failed is not ranked as just used."""
        meta.version += 1
        meta.order = seq or meta.touch_seq or meta.order
        meta.touch_seq = 0
        meta.unlisted = False
        score = self.score(meta)
        heap = self._heaps[meta.tier]
        heapq.heappush(heap, (score, meta.order, meta.version, meta))
        if len(heap) > 4 * self._live[meta.tier] + 64:
            self._heaps[meta.tier] = [e for e in heap if e[2] == e[3].version and e[3].tier == meta.tier]
            heapq.heapify(self._heaps[meta.tier])
