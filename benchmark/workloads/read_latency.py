"""read_latency: per-``get_into`` latency (p50, p90, p99, max — never the mean) of every
system, hot and (file-backed systems) cold, 2 MiB and 16 MiB blocks.

Loaded as in :mod:`.read_throughput`, every system up while rounds run interleaved.
``hot``: ``ops`` gets in all (default ``max(200, blocks)``, split over the rounds) of
measured blocks drawn at random (seeded: the same sequence for every system), after
untimed warm-up gets. ``cold``: per round, after untimed warm-up gets and then the
eviction of the system's files from the page cache (last, right before the timed gets:
:func:`.read_throughput.prepare_pass`), every measured block once in a seeded random order. Ratios: ``vs_limit`` =
the limit's time for one block / p50 (memcpy of one block; one block at the raw O_DIRECT
or cold buffered read rate), ``vs_systems[other]`` = other's p50 / this p50; both > 1
mean faster. See ``benchmark/README.md``.
"""
from __future__ import annotations

import random
from typing import Any

from . import blockio, common, read_throughput


class Measure(blockio.Measure):
    """One loaded instance; per round a share of the hot gets and (file-backed) a cold pass."""

    def start(self) -> None:
        self.adapter = self.stack.enter_context(self.open_system())
        self.held = read_throughput.load(self.adapter, self.warm, self.meas)
        rng = random.Random(self.ctx.seed)
        self.ops = common.count_option(self.ctx.options, "ops", max(200, len(self.meas)))
        self.hot_order = [rng.randrange(len(self.meas)) for _ in range(self.ops)]
        self.cold_orders = [rng.sample(range(len(self.meas)), len(self.meas)) for _ in range(self.ctx.rounds)]
        self.cold = common.file_backed(self.name)
        self.samples: dict[str, list[float]] = {"hot": [], "cold": []}
        self.misses = {"hot": 0, "cold": 0}
        self.drops: list[dict[str, Any]] = []

    def round(self, r: int) -> None:
        share = self.hot_order[r * self.ops // self.ctx.rounds:(r + 1) * self.ops // self.ctx.rounds]
        blockio.get_all(self.adapter, self.warm, self.ctx.outs)
        _, samples, miss = blockio.get_all(self.adapter, [self.meas[i] for i in share], self.ctx.outs)
        self.samples["hot"] += samples
        self.misses["hot"] += miss
        if self.cold:
            self.drops.append(read_throughput.prepare_pass(self.adapter, self.warm, self.ctx.outs, cold=True))
            _, samples, miss = blockio.get_all(self.adapter, [self.meas[i] for i in self.cold_orders[r]], self.ctx.outs)
            self.samples["cold"] += samples
            self.misses["cold"] += miss

    def finish(self) -> list[dict[str, Any]]:
        blockio.check_bytes(self.adapter, self.meas, self.ctx.outs)
        rows = []
        for mode in ("hot", "cold") if self.cold else ("hot",):
            s = self.samples[mode]
            row = {"mode": mode, "latency_s": blockio.summary(s), "ops": len(s), "misses": self.misses[mode],
                   "samples_s": s, "stored_after_put": self.held}
            row["p50_s"] = row["latency_s"]["p50"]
            if mode == "cold":
                row.update(cold_method=self.drops[0]["method"],
                           resident_fraction_after_drop=max(d["resident_fraction_after"] for d in self.drops))
            rows.append(row)
        return rows


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Options as :func:`benchmark.workloads.write_throughput.run`, plus ``ops`` (hot gets);
    ``rounds`` default 3."""
    result = blockio.run(options, "read_latency", Measure, vs_metric="p50_s", higher_is_better=False, rounds=3)
    result["not_applicable"] = read_throughput.not_applicable(result["systems"])
    result["targets"] = []
    return result


def table(result: dict[str, Any]) -> str:
    ms = lambda q: lambda r: f"{r['latency_s'][q] * 1e3:.2f}"  # noqa: E731
    return blockio.format_table(result, [
        ("p50 ms", 8, ms("p50")), ("p90 ms", 8, ms("p90")), ("p99 ms", 8, ms("p99")), ("max ms", 8, ms("max")),
        ("/memcpy", 8, lambda r: f"{r['vs_limit']['memcpy']:.2f}"),
        ("/rawOD", 7, lambda r: f"{r['vs_limit']['raw_odirect_read']:.2f}"),
        ("ops", 5, lambda r: str(r["ops"])),
    ])
