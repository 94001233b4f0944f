"""The suite's ``run`` workload: Cascade's main job, ``cascade run --ranks 4`` (as ``make run``).

The job itself (``cascade/app/main_job.py``) writes ``cascade_run_{nodes}n_{stamp}.json``
with every rank's ``CascadeStore.stats()`` (``per_rank_stats``: one power-of-two microsecond
latency histogram per serving tier, ``cluster_get_latency`` for gets another rank served).
:func:`figures` turns that file into the suite's summary figures: per serving tier the
histograms summed over ranks, plus the job's totals.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator, Sequence

from cascade.histogram import LatencyHistogram

Figure = tuple[dict[str, Any], str, float]
#: Per-tier counters of ``totals.tiers.<tier>`` (summed over ranks by the job) kept as figures.
TIER_COUNTERS = ("hits", "bytes_read", "bytes_written", "promotions", "demotions", "evictions")


def command(rep_dir: Path, opts: Sequence[str]) -> list[str]:
    """``cascade run --quiet --results REP_DIR OPTS`` with this interpreter (``--ranks`` in OPTS).
    The CLI gives the run a fresh file-tier directory and removes it afterwards."""
    return [sys.executable, "-m", "cascade.cli", "run", "--quiet", "--results", str(rep_dir), *opts]


def tier_histograms(per_rank: Sequence[dict[str, Any]]) -> dict[str, LatencyHistogram]:
    """Per serving tier (``cluster``: another rank), the get-latency histograms of every rank summed."""
    out: dict[str, LatencyHistogram] = {}
    for stats in per_rank:
        parts = [(t, s["get_latency"]) for t, s in stats["tiers"].items()]
        for name, hist in [*parts, ("cluster", stats["cluster_get_latency"])]:
            agg = out.setdefault(name, LatencyHistogram())
            agg.counts = [a + b for a, b in zip(agg.counts, hist["buckets"], strict=True)]
            agg.total_s += hist["sum_s"]
    return out


def figures(doc: dict[str, Any]) -> Iterator[Figure]:
    """Summary figures of one ``cascade_run_*.json``: per ``tier`` the gets it served, their
    share of gets and of get time, mean/p50/p99 latency (bucket upper bounds) and its
    counters; for the job its hit ratio, wall time, cross-rank hits and wrong blocks."""
    job = {"system": "cascade", "ranks": doc["ranks"]}
    hists = tier_histograms(doc["per_rank_stats"])
    gets = sum(h.count for h in hists.values())
    time_s = sum(h.total_s for h in hists.values())
    for name, h in hists.items():
        key = {**job, "tier": name}
        yield key, "gets", float(h.count)
        if h.count:
            yield key, "gets_share", h.count / gets
            yield key, "time_share", h.total_s / time_s
            yield key, "get_mean_s", h.total_s / h.count
            yield key, "get_p50_s", h.quantile(0.5)
            yield key, "get_p99_s", h.quantile(0.99)
        for counter in TIER_COUNTERS if name != "cluster" else ():
            yield key, counter, float(doc["totals"]["tiers"][name][counter])
    yield job, "block_hit_ratio", float(doc["replay"]["block_hit_ratio"])
    yield job, "elapsed_s", float(doc["elapsed_s"])
    yield job, "cluster_hits", float(doc["totals"]["cluster_hits"])
    yield job, "wrong_bytes_blocks", float(doc["wrong_bytes_blocks"])
