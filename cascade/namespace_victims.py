"""Victim order per namespace, for namespace quotas (``namespace_share``).

:class:`NamespaceVictims` is the store's :class:`~cascade.policy.Policy` when a share is
set: besides each tier's victim heap it keeps one heap per (tier, namespace), with the
same scores and the same lazy invalidation, so the next block a namespace at its share
must move out of a tier costs O(log n) amortised instead of a scan of every block.
Not thread-safe: the store serialises calls.
"""
from __future__ import annotations

import heapq
from collections import Counter

from .policy import BlockMeta, Policy


class NamespaceVictims(Policy):
    """A :class:`Policy` that also answers :meth:`victim_in` (one namespace's victim)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._ns_heaps: dict[tuple[int, str], list[tuple[float, int, int, BlockMeta]]] = {}
        self._ns_live: Counter[tuple[int, str]] = Counter()
        self._lazy_touch = False  # victim_in's heaps need every use pushed

    def admitted(self, meta: BlockMeta, now: float) -> None:
        self._ns_live[(meta.tier, meta.key[0])] += 1
        super().admitted(meta, now)

    def moved(self, meta: BlockMeta, old_tier: int) -> None:
        self._count_out(old_tier, meta.key[0])
        self._ns_live[(meta.tier, meta.key[0])] += 1
        super().moved(meta, old_tier)

    def removed(self, meta: BlockMeta) -> None:
        self._count_out(meta.tier, meta.key[0])
        super().removed(meta)

    def clear(self) -> None:
        super().clear()
        self._ns_heaps.clear()
        self._ns_live.clear()

    def victim_in(self, tier: int, namespace: str) -> BlockMeta | None:
        """The block of ``namespace`` in ``tier`` to move down next (the lowest score
        among those that may leave now), or None. Does not age the clock."""
        if self._fresh[tier]:
            self._push_fresh(tier)
        slot = (tier, namespace)
        heap = self._ns_heaps.get(slot)
        while heap:
            _, _, version, meta = heap[0]
            if version != meta.version or meta.tier != tier:
                heapq.heappop(heap)  # stale
                continue
            if not self.eligible(meta):
                heapq.heappop(heap)  # pushed again by changed() or read_done()
                meta.unlisted = True
                continue
            return meta
        self._ns_heaps.pop(slot, None)
        return None

    def _push(self, meta: BlockMeta, seq: int = 0) -> None:
        super()._push(meta, seq)
        slot = (meta.tier, meta.key[0])
        heap = self._ns_heaps.setdefault(slot, [])
        heapq.heappush(heap, (self.score(meta), meta.order, meta.version, meta))
        if len(heap) > 4 * self._ns_live[slot] + 64:
            heap[:] = [e for e in heap if e[2] == e[3].version and e[3].tier == meta.tier]
            heapq.heapify(heap)

    def _count_out(self, tier: int, namespace: str) -> None:
        slot = (tier, namespace)
        self._ns_live[slot] -= 1
        if self._ns_live[slot] <= 0:
            del self._ns_live[slot]
