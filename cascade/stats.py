"""Counters the store keeps per tier and overall (read with ``CascadeStore.stats()``)."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


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
    cluster_hits: int = 0  # gets served from another rank's tiers (part of hits)
    cluster_deduped: int = 0  # puts of blocks another rank already held (part of deduped)
    cluster_corruptions: int = 0  # bytes read from another rank failed the entry's checksum (misses)
    hints: int = 0  # scheduler hints taken (store.hint)
    replaced_unconfirmed: int = 0  # puts whose bytes differed from a record found on disk
    kept_at_close: int = 0  # GPU/SHM/REMOTE blocks moved to the file tier by close()
    lost_at_close: int = 0  # blocks outside the file tier that close() could not keep
    dropped_at_restart: int = 0  # blocks found on disk that the global directory had no slot for

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def stats_path(directory: str | os.PathLike, rank: int) -> Path:
    return Path(directory) / f"stats_rank{rank:03d}.json"


def write_stats_file(directory: str | os.PathLike, rank: int, stats: dict[str, Any]) -> Path:
    """Atomically replace this rank's stats file (write a temp file, then rename)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = stats_path(directory, rank)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".stats_rank{rank:03d}.")
    with os.fdopen(fd, "w") as f:
        json.dump(stats, f, default=str)
    os.replace(tmp, path)
    return path


def read_stats_files(directory: str | os.PathLike) -> list[dict[str, Any]]:
    """Every rank's stats file in ``directory``, ordered by rank."""
    files = sorted(Path(directory).glob("stats_rank*.json"))
    return [json.loads(f.read_text()) for f in files]
