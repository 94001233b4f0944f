"""read_latency: per-``get_into`` latency (p50, p90, p99, max — never the mean) of every
system, hot and (file-backed systems) cold, 2 MiB and 16 MiB blocks.

Loading as in :mod:`.read_throughput`. ``hot``: after untimed warm-up gets, ``ops`` gets
(default ``max(200, blocks)``) of measured blocks drawn at random (seeded, the same
sequence for every system). ``cold``: ``rounds`` passes, each after evicting the system's
files from the page cache, reading every measured block once in a seeded random order.
Ratios: ``vs_limit`` = the limit's time for one block / p50 (memcpy of one block; one
block at the raw O_DIRECT read rate), ``vs_systems[other]`` = other's p50 / this p50;
both > 1 mean faster. See ``benchmark/README.md``.
"""
from __future__ import annotations

import random
from typing import Any

from ..adapters import StorageAdapter
from ..data import Block
from . import blockio, common, read_throughput


def measure(open_system: blockio.Opener, name: str, warm: list[Block], meas: list[Block],
            ctx: blockio.Context) -> list[dict[str, Any]]:
    with open_system() as adapter:
        return _measure(adapter, name, warm, meas, ctx)


def _measure(adapter: StorageAdapter, name: str, warm: list[Block], meas: list[Block],
             ctx: blockio.Context) -> list[dict[str, Any]]:
    held = read_throughput.load(adapter, warm, meas)
    rng = random.Random(ctx.seed)
    ops = int(ctx.options.get("ops") or max(200, len(meas)))
    hot_order = [rng.randrange(len(meas)) for _ in range(ops)]
    blockio.get_all(adapter, warm, ctx.outs)
    _, hot, misses = blockio.get_all(adapter, [meas[i] for i in hot_order], ctx.outs)
    rows = [{"mode": "hot", "latency_s": blockio.summary(hot), "ops": ops, "misses": misses,
             "samples_s": hot, "stored_after_put": held}]
    if name in common.FILE_BACKED:
        cold, drops, misses = [], [], 0
        for _ in range(ctx.rounds):
            order = list(meas)
            rng.shuffle(order)
            drops.append(read_throughput._drop(adapter))
            blockio.get_all(adapter, warm, ctx.outs)
            _, samples, miss = blockio.get_all(adapter, order, ctx.outs)
            cold.extend(samples)
            misses += miss
        rows.append({"mode": "cold", "latency_s": blockio.summary(cold), "ops": len(cold), "misses": misses,
                     "samples_s": cold, "stored_after_put": held, "cold_method": drops[0]["method"],
                     "resident_fraction_after_drop": max(d["resident_fraction_after"] for d in drops)})
    blockio.check_bytes(adapter, meas, ctx.outs)
    for row in rows:
        row["p50_s"] = row["latency_s"]["p50"]
    return rows


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Options as :func:`benchmark.workloads.write_throughput.run`, plus ``ops`` (hot gets)."""
    result = blockio.run(options, "read_latency", measure, vs_metric="p50_s", higher_is_better=False)
    result["not_applicable"] = read_throughput.not_applicable(result["systems"])
    result["targets"] = []
    return result


def table(result: dict[str, Any]) -> str:
    ms = lambda q: lambda r: f"{r['latency_s'][q] * 1e3:.2f}"  # noqa: E731
    return blockio.format_table(result, [
        ("p50 ms", 8, ms("p50")), ("p90 ms", 8, ms("p90")), ("p99 ms", 8, ms("p99")), ("max ms", 8, ms("max")),
        ("/memcpy", 8, lambda r: f"{r['vs_limit']['memcpy']:.2f}"),
        ("/rawrd", 7, lambda r: f"{r['vs_limit']['raw_odirect_read']:.2f}"),
        ("ops", 5, lambda r: str(r["ops"])),
    ])
