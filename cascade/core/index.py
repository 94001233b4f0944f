"""The block index of one store: what it knows about every cached block, and the only
caller of the policy.

It holds one :class:`~cascade.policy.BlockMeta` per block, the cached children of each
parent (kept while the parent itself is not cached: a re-put of the head starts with
its true count), the bytes of each namespace in each tier (namespace quotas), the bytes
of hinted blocks, and the blocks found on disk at open that no put has confirmed yet.
It never touches a tier. Not thread-safe: called under the store's lock.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..errors import InvalidBlock
from ..policy import BlockMeta, Policy
from ..identity import BlockKey


class BlockIndex:
    """Metadata of ``num_tiers`` tiers' blocks, ordered for eviction by ``policy``."""

    def __init__(self, policy: Policy, num_tiers: int) -> None:
        self._policy = policy
        #: A hit at ``now`` (``time.monotonic()``): the policy's own method, passed through
        #: as it is (one call less per hit on the hot path than :meth:`touched`).
        self.touched_at = policy.touched
        self._num_tiers = num_tiers
        self.blocks: dict[BlockKey, BlockMeta] = {}
        self._kids: dict[BlockKey, list[int]] = {}
        #: Per parent key (a block not cached, or one whose depth is partial): its cached
        #: children whose depths were set without some ancestor (``depth_partial``), to
        #: raise when that ancestor is admitted (:meth:`_raise_depths`).
        self._waiting: dict[BlockKey, set[BlockMeta]] = {}
        self.ns_bytes: list[dict[str, int]] = [{} for _ in range(num_tiers)]
        self.hinted_bytes = 0  # bytes of blocks with hints > 0 (capped by the store)
        self.unconfirmed: set[BlockKey] = set()
        #: Told of each block entered with a TTL and when it runs out, and of each such
        #: block that leaves (the store's :class:`~.expiry.ExpirySweeper`); None: nobody.
        self.on_ttl: Callable[[BlockMeta, float], None] | None = None
        self.on_ttl_gone: Callable[[BlockMeta], None] | None = None

    @property
    def policy_kind(self) -> str:
        return self._policy.kind

    def get(self, key: BlockKey) -> BlockMeta | None:
        return self.blocks.get(key)

    def holds(self, meta: BlockMeta) -> bool:
        """Whether ``meta`` is still the cached block of its key."""
        return self.blocks.get(meta.key) is meta

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self) -> Iterator[BlockMeta]:
        return iter(list(self.blocks.values()))

    # -- structure -------------------------------------------------------------------------
    def check_parent(self, key: BlockKey, parent: str | None) -> None:
        """:class:`InvalidBlock` when naming ``parent`` would put ``key`` in a cycle of the
        prefix tree (the parent is the block itself, or one of its cached descendants):
        such a block could never be evicted. O(1) for a block with no cached child (a
        new one): only through a cached child can a walk up from ``parent`` reach it."""
        if parent == key[1]:
            raise InvalidBlock(f"block {key[1]} cannot be its own ancestor (parent {parent})")
        if not any(self._kids.get(key, ())):
            return
        seen, up = set(), parent
        while up is not None and up not in seen:
            if up == key[1]:
                raise InvalidBlock(f"block {key[1]} cannot be its own ancestor (parent {parent})")
            seen.add(up)
            above = self.blocks.get((key[0], up))
            up = None if above is None else above.parent

    def _set_depths(self, found: list[BlockMeta]) -> None:
        """The depth of each of ``found`` (all entered already), each chain walked once:
        from a block up to the first ancestor whose depth is known (or no cached one),
        then down again. A chain whose head's parent is missing waits for it (partial)."""
        known: set[BlockKey] = set()
        for meta in found:
            chain: list[BlockMeta] = []
            seen: set[BlockKey] = set()
            node: BlockMeta | None = meta
            while node is not None and node.key not in known and node.key not in seen:
                seen.add(node.key)
                chain.append(node)
                node = None if node.parent is None else self.blocks.get((node.key[0], node.parent))
            if node is not None and node.key in known:
                depth, partial = node.depth, node.depth_partial
            else:  # a head, a missing parent, or a cycle (from 0, and whole: it has no head to wait for)
                depth, partial = -1, node is None and chain[-1].parent is not None
            for m in reversed(chain):
                depth += 1
                m.depth = depth
                if partial:
                    self._wait(m)
                known.add(m.key)

    def _wait(self, meta: BlockMeta) -> None:
        """``meta``'s depth is partial (an ancestor is missing): it waits on its parent's key."""
        meta.depth_partial = True
        self._waiting.setdefault((meta.key[0], meta.parent), set()).add(meta)

    def _raise_depths(self, top: BlockMeta) -> None:
        """``top`` was just admitted over cached descendants whose depths were set without
        it: each gets the depth it has through ``top`` where that is more (a hinted one is
        pushed again: its depth is in its score). Where ``top``'s depth is whole (its chain
        reaches a head), theirs are too and they stop waiting, each walked once so; else
        only those whose depth rose are walked on (a chain put from its tail up costs
        O(n^2) steps in all; put head first, none)."""
        whole = not top.depth_partial
        stack = [top]
        while stack:
            up = stack.pop()
            below = self._waiting.pop(up.key, ()) if whole else self._waiting.get(up.key, ())
            for meta in below:
                if up.depth + 1 > meta.depth:
                    meta.depth = up.depth + 1
                    if meta.hint_uses:
                        self._policy.changed(meta)
                elif not whole:
                    continue  # neither raised nor made whole: nothing below it changes
                if whole:
                    meta.depth_partial = False
                stack.append(meta)

    def admit(self, meta: BlockMeta, now: float) -> None:
        """Enter a new block, with the children of it that are already cached. Its depth
        (cached ancestors: 0 for a head, or one whose parent is not cached) is its
        parent's and one, O(1) (a walk up every ancestor made a chain of n blocks cost
        O(n^2) puts). Set without a missing ancestor, it is partial and raised when that
        one is admitted, with the depths of the cached blocks below (a child put before
        its parent counts the blocks before it in its sequence, which a request reads
        first: the tie-break of hinted blocks). An ancestor that leaves lowers no depth:
        the block's place in its sequence, what that tie-break wants, is the same (and a
        drop walks nothing). (Per put: the calls a head needs not are skipped, and its
        namespace's bytes added inline.)"""
        key, tier = meta.key, meta.tier
        meta.child_tiers = self._kids.get(key, ())  # (none yet: its first child's count makes the list)
        up = None if meta.parent is None else self.blocks.get((key[0], meta.parent))
        meta.depth = 0 if up is None else up.depth + 1
        if meta.parent is not None and (up is None or up.depth_partial):
            self._wait(meta)
        self.blocks[key] = meta
        used = self.ns_bytes[tier]
        used[key[0]] = used.get(key[0], 0) + meta.nbytes  # _ns_add() of bytes > 0: never to zero
        self._policy.admitted(meta, now)
        if meta.parent is not None:
            self._count_child(meta, tier, +1)
        if meta.child_tiers and key in self._waiting:
            self._raise_depths(meta)
        if meta.ttl and self.on_ttl is not None:
            self.on_ttl(meta, self._policy.expires_at(meta))

    def adopt(self, found: list[BlockMeta], now: float) -> None:
        """Enter blocks found on disk at open (unconfirmed), all at once: their depths
        and child counts are computed once every one of them is in."""
        for meta in found:
            self.blocks[meta.key] = meta
            self._ns_add(meta, meta.tier, meta.nbytes)
            self.unconfirmed.add(meta.key)
        self._set_depths(found)
        for meta in found:
            meta.child_tiers = self._kids.get(meta.key, ())
            self._policy.admitted(meta, now)
        for meta in found:
            self._count_child(meta, meta.tier, +1)
            if meta.ttl and self.on_ttl is not None:
                self.on_ttl(meta, self._policy.expires_at(meta))

    def moved(self, meta: BlockMeta, tier: int) -> None:
        """``meta`` now sits in ``tier``."""
        old = meta.tier
        self._count_child(meta, old, -1)
        self._count_child(meta, tier, +1)
        self._ns_add(meta, old, -meta.nbytes)
        self._ns_add(meta, tier, meta.nbytes)
        meta.tier = tier
        self._policy.moved(meta, old)

    def forget(self, meta: BlockMeta) -> None:
        """``meta`` left the cache (its bytes are gone or going)."""
        if meta.ttl and self.on_ttl_gone is not None:
            self.on_ttl_gone(meta)
        if meta.hints:
            self.hinted_bytes -= meta.nbytes
            meta.hints = 0
        if self.blocks.pop(meta.key, None) is not None:
            self._ns_add(meta, meta.tier, -meta.nbytes)
        self.unconfirmed.discard(meta.key)
        if meta.depth_partial:
            self._unwait(meta)
        self._policy.removed(meta)
        if not any(self._kids.get(meta.key, ())):
            self._kids.pop(meta.key, None)
        self._count_child(meta, meta.tier, -1)

    def clear(self) -> None:
        """Forget every block (the store closed), the policy's references to them too."""
        self.blocks.clear()
        self._kids.clear()
        self._waiting.clear()
        for used in self.ns_bytes:
            used.clear()
        self.hinted_bytes = 0
        self.unconfirmed.clear()
        self._policy.clear()

    def _unwait(self, meta: BlockMeta) -> None:
        """``meta`` (partial) left: it waits no more (its children waiting on it still do)."""
        meta.depth_partial = False
        pkey = (meta.key[0], meta.parent)
        waiting = self._waiting[pkey]
        waiting.discard(meta)
        if not waiting:
            del self._waiting[pkey]

    def _ns_add(self, meta: BlockMeta, tier: int, nbytes: int) -> None:
        used = self.ns_bytes[tier]
        used[meta.key[0]] = used.get(meta.key[0], 0) + nbytes
        if not used[meta.key[0]]:
            del used[meta.key[0]]

    def _count_child(self, meta: BlockMeta, tier: int, delta: int) -> None:
        """Count ``meta`` in or out of its parent's children in ``tier`` (the count is
        kept even while the parent is not cached)."""
        if meta.parent is None:
            return
        pkey = (meta.key[0], meta.parent)
        counts = self._kids.get(pkey)
        if counts is None:
            counts = self._kids[pkey] = [0] * self._num_tiers
        counts[tier] += delta
        parent = self.blocks.get(pkey)
        if parent is not None:
            parent.child_tiers = counts  # (the same list already, unless this is its first child)
            self._policy.changed(parent)
        elif not any(counts):
            del self._kids[pkey]

    @contextmanager
    def counted_in(self, meta: BlockMeta, tier: int) -> Iterator[None]:
        """``meta`` counted among its parent's children in ``tier`` too while the ``with``
        block runs: room made there for it (a promotion) leaves its parent in place."""
        self._count_child(meta, tier, +1)
        try:
            yield
        finally:
            self._count_child(meta, tier, -1)

    # -- the policy ------------------------------------------------------------------------
    def victim(self, t: int) -> BlockMeta | None:
        """The block of tier ``t`` to move down or drop next (None: none may go)."""
        return self._policy.victim(t)

    def namespace_victim(self, t: int, namespace: str) -> BlockMeta | None:
        """The block of ``namespace`` in tier ``t`` to move down next (namespace quotas:
        the policy is a :class:`~cascade.namespace_victims.NamespaceVictims`)."""
        return self._policy.victim_in(t, namespace)

    def changed(self, meta: BlockMeta) -> None:
        """Pins, hints, readers, children, priority or TTL of ``meta`` changed (a block
        no longer cached is ignored)."""
        if self.blocks.get(meta.key) is meta:
            self._policy.changed(meta)

    def read_done(self, meta: BlockMeta) -> None:
        """A read of ``meta`` ended (a block no longer cached is ignored)."""
        if self.blocks.get(meta.key) is meta:
            self._policy.read_done(meta)

    def set_aside(self, meta: BlockMeta) -> None:
        """Not a candidate until its next change (it may not go now)."""
        self._policy.set_aside(meta)

    def touched(self, meta: BlockMeta) -> None:
        """A hit, or a put deduplicated onto it."""
        self._policy.touched(meta, time.monotonic())

    def kept(self, meta: BlockMeta) -> None:
        """A victim chosen for room stays in its tier (its move failed or was called off)."""
        self._policy.kept(meta)

    def evicted(self, meta: BlockMeta) -> None:
        """``meta`` is about to be dropped for room."""
        self._policy.evicted(meta)

    def expired(self, meta: BlockMeta, now: float) -> bool:
        return meta.pins == 0 and now > self._policy.expires_at(meta)

    def expires_at(self, meta: BlockMeta) -> float:
        """When ``meta``'s TTL runs out (``time.monotonic()`` seconds; inf without one)."""
        return self._policy.expires_at(meta)

    def wall_expiry(self, key: BlockKey) -> float:
        """Wall-clock expiry of a block, for persistent tiers (0 = none): TTLs run on the
        monotonic clock in the process, on disk they must survive a restart."""
        meta = self.blocks.get(key)
        if meta is None or meta.ttl <= 0:
            return 0.0
        return time.time() + (self._policy.expires_at(meta) - time.monotonic())

    # -- hints -----------------------------------------------------------------------------
    def hint_position(self, position: float | None) -> float:
        """The queue position a hint is taken at (:class:`ConfigError` if not finite)."""
        return self._policy.hint_position(position)

    def take_hint(self, meta: BlockMeta, cap: float, at: float) -> bool:
        """Count one hint on ``meta``, for a use at queue position ``at``, unless a first
        hint would pass ``cap`` bytes."""
        if meta.hints == 0:
            if self.hinted_bytes + meta.nbytes > cap:
                return False
            self.hinted_bytes += meta.nbytes
        meta.hints += 1
        self._policy.hinted(meta, at)
        return True

    def unhint(self, keys: list[BlockKey], position: float | None = None) -> int:
        """Withdraw one hint (the one at ``position``, else the soonest) of each hinted
        block of ``keys``; how many were withdrawn."""
        withdrawn = 0
        for key in keys:
            meta = self.blocks.get(key)
            if meta is not None and meta.hints:
                self.release_hint(meta, position)
                withdrawn += 1
        return withdrawn

    def release_hint(self, meta: BlockMeta, position: float | None = None) -> None:
        """Use up or withdraw one hint of ``meta`` (the soonest, or the one at ``position``)."""
        meta.hints -= 1
        if meta.hints == 0:
            self.hinted_bytes -= meta.nbytes
        self._policy.hint_released(meta, position)
