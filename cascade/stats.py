"""Counters the store keeps per tier and overall (read with ``CascadeStore.stats()``)."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class TierCounters:
    """Events of one tier. A get served by tier ``s`` is a hit of ``s`` and a miss of
    every faster tier; a get served by no tier is a miss of all of them."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0  # blocks dropped from the cache out of this tier
    promotions: int = 0  # blocks moved up into a faster tier out of this one
    demotions: int = 0  # blocks moved down out of this tier
    corruptions: int = 0  # reads that failed verification (served as misses)
    full_events: int = 0  # writes refused for lack of space (TierFull, ENOSPC)
    bytes_read: int = 0
    bytes_written: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class StoreCounters:
    """Store-wide operation counts. Invariant: ``puts == stored + deduped + rejected``."""

    puts: int = 0
    stored: int = 0
    deduped: int = 0
    rejected: int = 0
    gets: int = 0
    hits: int = 0
    misses: int = 0
    expired: int = 0
    deletes: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
