"""Aggregate per-rank stats and export them in the Prometheus text format."""
from __future__ import annotations

from typing import Any

from .histogram import LatencyHistogram

_TIER_COUNTERS = ("hits", "misses", "evictions", "promotions", "demotions", "corruptions",
                  "full_events", "bytes_read", "bytes_written")
_STORE_COUNTERS = ("puts", "stored", "deduped", "rejected", "gets", "hits", "misses", "expired", "deletes",
                   "cluster_hits", "cluster_deduped", "cluster_corruptions")


def aggregate(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum the stats of several ranks into one dict shaped like ``CascadeStore.stats()``.
    A tier that draws on a pool the ranks share (REMOTE: each rank's capacity is every
    other rank's lent window) has the pool as its capacity: each rank's ``lent_bytes`` once."""
    if not per_rank:
        raise ValueError("no stats to aggregate")
    total: dict[str, Any] = {k: sum(r.get(k, 0) for r in per_rank) for k in (*_STORE_COUNTERS, "blocks")}
    total["ranks"] = len(per_rank)
    total["policy"] = per_rank[0].get("policy", "?")
    tiers: dict[str, dict[str, Any]] = {}
    for r in per_rank:
        for name, t in r["tiers"].items():
            agg = tiers.setdefault(name, {"blocks": 0, "bytes": 0, "capacity": 0, **{c: 0 for c in _TIER_COUNTERS}})
            for key in ("blocks", "bytes", *_TIER_COUNTERS):
                agg[key] += t.get(key, 0)
            agg["capacity"] += t.get("lent_bytes", t.get("capacity", 0))
    total["tiers"] = tiers
    return total


def prometheus_text(per_rank: list[dict[str, Any]]) -> str:
    """Prometheus exposition text of every rank's counters and latency histograms."""
    try:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
    except ImportError as exc:
        raise ImportError("Prometheus export needs prometheus-client: pip install prometheus-client") from exc

    class _Collector:
        def collect(self):
            ops = CounterMetricFamily("cascade_operations", "Store operations by kind", labels=["rank", "op"])
            blocks = GaugeMetricFamily("cascade_tier_blocks", "Blocks held per tier", labels=["rank", "tier"])
            used = GaugeMetricFamily("cascade_tier_bytes", "Bytes held per tier", labels=["rank", "tier"])
            events = CounterMetricFamily("cascade_tier_events", "Per-tier events", labels=["rank", "tier", "event"])
            latency = HistogramMetricFamily("cascade_get_latency_seconds", "get latency by serving tier",
                                            labels=["rank", "tier"])
            bounds = LatencyHistogram.bucket_bounds_s()
            for r in per_rank:
                rank = str(r.get("rank", 0))
                for op in _STORE_COUNTERS:
                    ops.add_metric([rank, op], r.get(op, 0))
                for name, t in r["tiers"].items():
                    blocks.add_metric([rank, name], t.get("blocks", 0))
                    used.add_metric([rank, name], t.get("bytes", 0))
                    for ev in _TIER_COUNTERS:
                        events.add_metric([rank, name, ev], t.get(ev, 0))
                    hist = t.get("get_latency")
                    if hist:
                        cumulative, buckets = 0, []
                        for bound, count in zip(bounds, hist["buckets"]):
                            cumulative += count
                            buckets.append((f"{bound:.6g}", cumulative))
                        buckets.append(("+Inf", cumulative))
                        latency.add_metric([rank, name], buckets, hist["sum_s"])
            yield from (ops, blocks, used, events, latency)

    registry = CollectorRegistry()
    registry.register(_Collector())
    return generate_latest(registry).decode()
