"""Replay requests (a Mooncake trace or the built-in workload) against a store.

Semantics match :mod:`benchmark.reference_policies`: requests in order, each request's
blocks in order; a block that is cached is a hit (read with ``get_into``), one that is not
is put right away with its predecessor as parent. Blocks a request already touched stay
pinned until the request ends (they are in flight), so the policy cannot drop them mid-request.

The block payload is one reusable random buffer: ids come from the trace, not from the
content (``put(..., block_id=...)``), so replays measure placement, not hashing.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from .errors import TierFull
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
) -> ReplayResult:
    """Replay ``requests`` against ``store``; returns the hit counts. Local."""
    rng = np.random.default_rng(seed)
    key = rng.standard_normal(store.spec.shape).astype(store.spec.dtype)
    value = rng.standard_normal(store.spec.shape).astype(store.spec.dtype)
    key_out, value_out = store.spec.empty()
    result = ReplayResult()
    total = len(requests) if hasattr(requests, "__len__") else None
    for request in tqdm(requests, total=total, desc="replay", unit="req", disable=not progress):
        result.requests += 1
        chain = block_chain(request.hash_ids, namespace)
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
            if pin_in_flight:
                store.pin(bid, namespace=namespace)
                pinned.append(bid)
        for bid in pinned:
            store.unpin(bid, namespace=namespace)
    result.store_stats = store.stats()
    return result
