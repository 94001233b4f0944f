"""Counters the store keeps per tier and overall (read with ``CascadeStore.stats()``),
and the stats files ``cascade stats`` reads."""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import CascadeError
from .histogram import _BUCKETS, LatencyHistogram

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TierCounters:
    """Events of one tier. A get served by tier ``s`` is a hit of ``s`` and a miss of
    every faster tier; a get served by no tier is a miss of all of them."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0  # blocks dropped from the cache out of this tier
    promotions: int = 0  # blocks moved up into a faster tier out of this one
    demotions: int = 0  # blocks moved down out of this tier
    corruptions: int = 0  # reads that failed verification (served as misses)
    read_errors: int = 0  # reads that failed with an I/O error (served as misses, the block kept)
    full_events: int = 0  # writes refused for lack of space (TierFull, ENOSPC)
    bytes_read: int = 0
    bytes_written: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(slots=True)
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
    background_demotions: int = 0  # blocks the background demoter moved out of the fastest tier
    background_demotion_errors: int = 0  # its moves that failed (logged; the block stayed)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class StoreMetrics:
    """Everything one store counts: operations overall, events per tier, latencies of
    gets per serving tier, of puts, and of gets served by another rank. Not
    thread-safe: updated under the store's lock."""

    def __init__(self, num_tiers: int) -> None:
        self.counters = StoreCounters()
        self.tiers = [TierCounters() for _ in range(num_tiers)]
        self.get_latency = [LatencyHistogram() for _ in range(num_tiers)]
        self.put_latency = LatencyHistogram()
        self.cluster_latency = LatencyHistogram()
        self._written = 0.0

    def hits(self, t: int, nbytes: int, seconds: float, count: int) -> None:
        """``count`` gets of ``nbytes`` in all served by tier ``t``, each taking
        ``seconds`` (a batch's equal shares; ``count`` 1: one get), each a miss of
        every faster tier, in one call."""
        self.counters.hits += count
        tier = self.tiers[t]
        tier.hits += count
        tier.bytes_read += nbytes
        latency = self.get_latency[t]  # its record_ns() written out: per get
        i = int(seconds * 1e6).bit_length()
        latency.counts[i if i < _BUCKETS else _BUCKETS - 1] += count
        latency.total_s += seconds * count
        if t:
            for faster in self.tiers[:t]:
                faster.misses += count

    def hot_hit(self, t: int, nbytes: int, elapsed_ns: int, count: int = 1) -> None:
        """A get (or ``count`` gets of ``nbytes`` in all: a batch) served by tier ``t`` on
        the small-block hot path, each taking ``elapsed_ns`` nanoseconds: the gets and
        their :meth:`hit` in one call."""
        counters, tier = self.counters, self.tiers[t]
        counters.gets += count
        counters.hits += count
        tier.hits += count
        tier.bytes_read += nbytes
        latency = self.get_latency[t]  # its record_ns() written out: per get
        i = (elapsed_ns // 1000).bit_length()
        latency.counts[i if i < _BUCKETS else _BUCKETS - 1] += count
        latency.total_s += elapsed_ns * count * 1e-9
        if t:
            for faster in self.tiers[:t]:
                faster.misses += count

    def cluster_hit(self, started: float) -> None:
        """A get served by another rank (a miss of every local tier)."""
        self.counters.hits += 1
        self.counters.cluster_hits += 1
        self.cluster_latency.record(time.perf_counter() - started)
        for counters in self.tiers:
            counters.misses += 1

    def miss(self, *, tiers: bool = True) -> bool:
        """A get served by nobody (with ``tiers``, a miss of every tier too). False."""
        self.counters.misses += 1
        if tiers:
            for counters in self.tiers:
                counters.misses += 1
        return False

    def stored(self, t: int, nbytes: int, started: float) -> None:
        self.counters.stored += 1
        self.tiers[t].bytes_written += nbytes
        self.put_latency.record(time.perf_counter() - started)

    def hot_stored(self, nbytes: int, elapsed_ns: int, count: int = 1) -> None:
        """A put (or ``count`` puts of ``nbytes`` in all: a batch) stored into the fastest
        tier on the small-block hot path, each taking ``elapsed_ns`` nanoseconds: the puts
        and their :meth:`stored` in one call."""
        counters = self.counters
        counters.puts += count
        counters.stored += count
        self.tiers[0].bytes_written += nbytes
        latency = self.put_latency  # its record_ns() written out: per put
        i = (elapsed_ns // 1000).bit_length()
        latency.counts[i if i < _BUCKETS else _BUCKETS - 1] += count
        latency.total_s += elapsed_ns * count * 1e-9

    def rejected(self, t: int | None = None) -> None:
        """A put that stored nothing (with ``t``: tier ``t`` refused it for room)."""
        self.counters.rejected += 1
        if t is not None:
            self.tiers[t].full_events += 1

    def as_dict(self, tier_stats: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """Counters overall (top level) and per tier (``tiers``: name -> the tier's own
        facts in ``tier_stats``, its counters and get latency)."""
        tiers = {name: {**facts, **counters.as_dict(), "get_latency": hist.as_dict()}
                 for (name, facts), counters, hist in zip(tier_stats, self.tiers, self.get_latency)}
        return {**self.counters.as_dict(), "tiers": tiers, "put_latency": self.put_latency.as_dict(),
                "cluster_get_latency": self.cluster_latency.as_dict()}

    def maybe_write(self, directory: str | None, interval: float, rank: int,
                    snapshot: Callable[[], dict[str, Any]], *, force: bool = False) -> None:
        """Refresh this rank's stats file in ``directory`` (if set) every ``interval``
        seconds, so ``cascade stats`` can watch a running job."""
        if not directory:
            return
        now = time.monotonic()
        if force or now - self._written >= interval:
            self._written = now
            try:
                write_stats_file(directory, rank, snapshot())
            except OSError as exc:
                log.warning("cannot write stats file in %s: %s", directory, exc)


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
    """Every rank's stats file in ``directory``, ordered by rank. :class:`CascadeError`
    naming the first file that cannot be read or is not a rank's stats."""
    stats = []
    for f in sorted(Path(directory).glob("stats_rank*.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError) as exc:  # unreadable, not UTF-8 or not JSON
            raise CascadeError(f"cannot read stats file {f}: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("tiers"), dict):
            raise CascadeError(f"{f} is not a rank's stats (a JSON object with 'tiers'); remove it or pass "
                               f"another directory")
        stats.append(doc)
    return stats
