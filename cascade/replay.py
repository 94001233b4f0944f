"""Replay requests (a Mooncake trace or the built-in workload) against a store.

Semantics match :mod:`benchmark.reference_policies`: requests in order, each request's
blocks in order; a block that is cached is a hit (read with ``get_into``), one that is not
is put right away with its predecessor as parent. Blocks a request already touched stay
pinned until the request ends (they are in flight), so the policy cannot drop them mid-request.

With ``queue_depth=D`` the replay also plays a serving engine's scheduler: the next ``D``
requests are visible in a queue, and the blocks they will read are hinted
(:meth:`CascadeStore.hint`: kept from eviction until read, within the store's
``hint_fraction`` of the fastest tier), each with the position of the soonest queued request
that reads it (requests are numbered in arrival order), so the policy evicts, among hinted
blocks, the one needed last. A block is hinted once while any queued request wants it: when
it enters the queue (if cached), when it is put, and again after a get used the hint up
while other queued requests still want it (then at the next one's position).
``queue_depth=0`` is the online policy alone.

The block payload is one reusable random buffer: ids come from the trace, not from the
content (``put(..., block_id=...)``), so replays measure placement, not hashing.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from .errors import ConfigError, TierFull
from .store import CascadeStore
from .trace import Request, block_chain


@dataclass
class ReplayResult:
    """What a replay saw: references, hits and tokens, plus the store's final stats."""

    requests: int = 0
    references: int = 0
    hits: int = 0
    prefix_hits: int = 0  # hits inside each request's leading run of hits
    tokens: int = 0
    hit_tokens: int = 0
    rejected: int = 0  # puts refused because every block was pinned
    store_stats: dict[str, Any] = field(default_factory=dict)

    @property
    def block_hit_ratio(self) -> float:
        return self.hits / self.references if self.references else 0.0

    @property
    def token_hit_ratio(self) -> float:
        return self.hit_tokens / self.tokens if self.tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "block_hit_ratio": self.block_hit_ratio, "token_hit_ratio": self.token_hit_ratio}


def replay(
    store: CascadeStore,
    requests: Sequence[Request] | Iterable[Request],
    *,
    namespace: str = "default",
    tokens_per_block: int = 512,
    pin_in_flight: bool = True,
    progress: bool = False,
    seed: int = 0,
    queue_depth: int = 0,
) -> ReplayResult:
    """Replay ``requests`` against ``store``; returns the hit counts. Local."""
    if isinstance(queue_depth, bool) or not isinstance(queue_depth, int) or queue_depth < 0:
        raise ConfigError(f"queue_depth: expected an integer >= 0, got {queue_depth!r}")
    rng = np.random.default_rng(seed)
    key = rng.standard_normal(store.spec.shape).astype(store.spec.dtype)
    value = rng.standard_normal(store.spec.shape).astype(store.spec.dtype)
    key_out, value_out = store.spec.empty()
    result = ReplayResult()
    total = len(requests) if hasattr(requests, "__len__") else None
    queue = _Queue(store, iter(requests), namespace, queue_depth)
    for request, chain in tqdm(queue, total=total, desc="replay", unit="req", disable=not progress):
        result.requests += 1
        leading = True
        pinned: list[str] = []
        for (bid, parent), tokens in zip(chain, request.block_tokens(tokens_per_block)):
            result.references += 1
            result.tokens += tokens
            if store.get_into(bid, key_out, value_out, namespace=namespace):
                result.hits += 1
                result.hit_tokens += tokens
                result.prefix_hits += leading
            else:
                leading = False
                try:
                    store.put(key, value, block_id=bid, parent=parent, namespace=namespace)
                except TierFull:
                    result.rejected += 1
                    continue
            queue.still_wanted(bid)
            if pin_in_flight:
                store.pin(bid, namespace=namespace)
                pinned.append(bid)
        for bid in pinned:
            store.unpin(bid, namespace=namespace)
    result.store_stats = store.stats()
    return result


class _Queue:
    """The requests in order, with the next ``depth`` of them visible as a queue whose
    blocks are hinted to the store. Iterating yields (request, its block chain)."""

    def __init__(self, store: CascadeStore, requests: Iterator[Request], namespace: str, depth: int) -> None:
        self.store, self.requests, self.namespace, self.depth = store, requests, namespace, depth
        # (request, chain, whether its blocks were counted in ``wanted``)
        self.queued: deque[tuple[Request, list[tuple[str, str | None]], bool]] = deque()
        self.wanted: dict[str, deque[int]] = {}  # block id -> arrival numbers of queued requests reading it
        self.arrivals = 0

    def __iter__(self) -> Iterator[tuple[Request, list[tuple[str, str | None]]]]:
        while True:
            self._fill(self.depth + 1)
            if not self.queued:
                return
            request, chain, counted = self.queued.popleft()
            if counted:
                for bid, _ in chain:
                    positions = self.wanted[bid]
                    positions.popleft()  # requests leave in arrival order: this one is first
                    if not positions:
                        del self.wanted[bid]
            yield request, chain

    def _fill(self, size: int) -> None:
        while len(self.queued) < size:
            request = next(self.requests, None)
            if request is None:
                return
            chain = block_chain(request.hash_ids, self.namespace)
            counted = self.depth > 0 and bool(self.queued)  # the head is served now, not queued
            self.queued.append((request, chain, counted))
            if counted:
                self._want(chain, self.arrivals)
            self.arrivals += 1

    def _want(self, chain: list[tuple[str, str | None]], position: int) -> None:
        new = []
        for bid, _ in chain:
            positions = self.wanted.setdefault(bid, deque())
            if not positions:
                new.append(bid)
            positions.append(position)
        if new:
            self.store.hint(new, namespace=self.namespace, position=position)

    def still_wanted(self, bid: str) -> None:
        """``bid`` was just read or put: hint it again for the next queued request that
        wants it, if any."""
        positions = self.wanted.get(bid)
        if positions:
            self.store.hint([bid], namespace=self.namespace, position=positions[0])
