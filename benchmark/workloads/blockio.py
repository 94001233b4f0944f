"""The shared driver of write_throughput, read_throughput and read_latency.

For each block size: take ``warmup + blocks`` blocks from the shared data directory
(:mod:`benchmark.data`, mmap, pre-faulted so no system pays for reading the source) and
measure this machine's limits (memcpy of one block; raw sequential write, O_DIRECT read
and cold buffered read on the file system the systems write to). Then every system gets
a :class:`Measure` (its own instance(s), same capacity for all) and the timed rounds are
**interleaved**: round r runs every system once, in an order rotated by r, so load from
other jobs on this shared machine falls on all systems alike and the ratios of one run
stay comparable. The limits are measured again after the last round (the better of the
two is the limit; both are stored). Every row then gets its ratios to the limits and to
the other systems of the same size and mode.

Capacity: ``2 x`` the bytes of the blocks used, the same for every system, so no system
evicts during these runs (Redis's allocator rounds each 2^k-byte half up by 25%,
Mooncake evicts past 90% of its segment); ``stored_after_put`` in each row proves it.
"""
from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from cascade import Config

from ..adapters import ADAPTER_NAMES, StorageAdapter
from ..data import Block, BlockData, default_dir, ensure, prefault
from ..machine import mpi_limits_via_mpiexec
from ..timing import gbps, summarize
from . import common
from .common import size_label

DEFAULT_SIZES = [2 << 20, 16 << 20]
MEASURED_BYTES = 384 << 20  # per size: 192 x 2 MiB, 24 x 16 MiB

Opener = Callable[[], contextlib.AbstractContextManager[StorageAdapter]]


@dataclass
class Context:
    """What a :class:`Measure` gets besides its system: the size, rounds, seed, the
    page-aligned read buffers (shared by all systems) and the runner's options."""

    block_bytes: int
    rounds: int
    seed: int
    outs: tuple[np.ndarray, np.ndarray]
    options: dict[str, Any] = field(default_factory=dict)


class Measure:
    """One system under one workload: ``start`` (untimed set-up), ``round(r)`` (one timed
    round), ``finish() -> rows``, ``close()``. Subclasses override what they need."""

    def __init__(self, open_system: Opener, name: str, warm: list[Block], meas: list[Block], ctx: Context) -> None:
        self.open_system, self.name, self.warm, self.meas, self.ctx = open_system, name, warm, meas, ctx
        self.stack = contextlib.ExitStack()

    def start(self) -> None:
        """Untimed set-up (default: nothing)."""

    def round(self, r: int) -> None:
        raise NotImplementedError

    def finish(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        self.stack.close()


def counts(block_bytes: int, options: dict[str, Any]) -> tuple[int, int]:
    """(warm-up blocks, measured blocks) for a size."""
    blocks = common.count_option(options, "blocks", max(8, MEASURED_BYTES // block_bytes))
    warmup = common.count_option(options, "warmup", max(2, min(8, (16 << 20) // block_bytes)), least=0)
    return warmup, blocks


def put_all(adapter: StorageAdapter, blocks: Sequence[Block]) -> tuple[float, list[float], float]:
    """Put ``blocks`` then ``flush``; returns (total seconds incl. flush, per-put seconds, flush seconds)."""
    samples = []
    t0 = time.perf_counter()
    for b in blocks:
        t = time.perf_counter()
        adapter.put(b.id, b.key, b.value)
        samples.append(time.perf_counter() - t)
    t = time.perf_counter()
    adapter.flush()
    end = time.perf_counter()
    return end - t0, samples, end - t


def get_all(adapter: StorageAdapter, blocks: Sequence[Block], outs) -> tuple[float, list[float], int]:
    """``get_into`` each block into ``outs``; returns (total seconds, per-get seconds, misses)."""
    key_out, value_out = outs
    samples, misses = [], 0
    t0 = time.perf_counter()
    for b in blocks:
        t = time.perf_counter()
        misses += not adapter.get_into(b.id, key_out, value_out)
        samples.append(time.perf_counter() - t)
    return time.perf_counter() - t0, samples, misses


def check_bytes(adapter: StorageAdapter, blocks: Sequence[Block], outs, sample: int = 3, seed: int = 0) -> int:
    """Read back a few blocks and compare with the source (untimed). Raises on wrong bytes."""
    key_out, value_out = outs
    chosen = random.Random(seed).sample(list(blocks), min(sample, len(blocks)))
    for b in chosen:
        if not adapter.get_into(b.id, key_out, value_out):
            raise RuntimeError(f"{adapter.name}: block {b.id} missing on read-back")
        if not (np.array_equal(key_out, b.key) and np.array_equal(value_out, b.value)):
            raise RuntimeError(f"{adapter.name}: block {b.id} read back with wrong bytes")
    return len(chosen)


def stored(adapter: StorageAdapter, blocks: Sequence[Block]) -> int:
    return sum(adapter.contains(b.id) for b in blocks)


def _rotated(names: list[str], r: int) -> list[str]:
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def run(options: dict[str, Any], workload: str, make: type[Measure], *, vs_metric: str,
        higher_is_better: bool = True, rounds: int = 3) -> dict[str, Any]:
    """Run ``make`` for every selected system and size, rounds interleaved across systems;
    the result document (fields: ``benchmark/README.md``)."""
    sizes = options.get("sizes") or DEFAULT_SIZES
    systems = common.select(options.get("system") or "all", ADAPTER_NAMES)
    file_dir = options.get("file_dir") or Config().file_dir
    rounds = common.count_option(options, "rounds", rounds)
    seed = int(options.get("seed") or 0)
    need = max(sum(counts(s, options)) for s in sizes)
    data_dir = ensure(options.get("data_dir") or default_dir(), sizes, need, seed=seed)
    load = [common.loadavg()]
    rows: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    limits: dict[str, Any] = {}
    with BlockData(data_dir) as data:
        data_info = data.describe()
        for size in sizes:
            warm_n, meas_n = counts(size, options)
            blocks = data.blocks(size, warm_n + meas_n)
            prefault(blocks)
            capacity = 2 * (warm_n + meas_n) * size
            raw_total = min(meas_n * size, 512 << 20)
            before = common.machine_limits(size, file_dir, raw_total)
            ctx = Context(size, rounds, seed, common.aligned_pair(size // 2), options)
            got = _run_size(make, systems, blocks[:warm_n], blocks[warm_n:], ctx, capacity, file_dir, workload)
            size_rows, size_problems = got
            lim = common.merge_limits(before, common.machine_limits(size, file_dir, raw_total))
            limits[str(size)] = lim
            for row in size_rows:
                row.update(block_bytes=size, blocks=meas_n, warmup_blocks=warm_n, capacity_bytes=capacity)
                mode = row.get("describe", {}).get("read_mode")
                if mode and row.get("mode") != "put":
                    row["read_mode"] = mode  # the file read path that ran: buffered or direct
                row["vs_limit"] = vs_limit(row, lim)
                row.update(limit_noise(row, lim))
            rows.extend(size_rows)
            problems.extend({**p, "block_bytes": size} for p in size_problems)
    common.add_ratios(rows, vs_metric, ("block_bytes", "mode"), higher_is_better=higher_is_better)
    best = common.add_best_variants(rows, vs_metric, ("block_bytes", "mode"), higher_is_better=higher_is_better)
    ranks = int(options.get("ranks") or 1)
    load.append(common.loadavg())
    return {
        "schema": f"cascade-bench/{workload}/1",
        "workload": workload,
        "systems": systems,
        "block_sizes": sizes,
        "rounds": rounds,
        "interleaved_rounds": True,
        "data": data_info,
        "file_dir": file_dir,
        "same_filesystem": os.stat(file_dir).st_dev == os.stat(data_dir).st_dev,
        "limits": limits,
        "mpi_limits": mpi_limits_via_mpiexec(ranks, sizes) if ranks > 1 else
        {"skipped": "single-process workload run with --ranks 1 (pass --ranks N to also measure raw MPI Get)"},
        "rows": rows,
        "best_variants": best,
        "not_run": problems,
        "loadavg_before_after": load,
    }


def _run_size(make: type[Measure], systems: list[str], warm: list[Block], meas: list[Block], ctx: Context,
              capacity: int, file_dir: str, workload: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Start a Measure per system, interleave the rounds, collect rows; every system is
    closed at the end whatever happened."""
    infos: dict[str, dict[str, Any]] = {name: {} for name in systems}

    def opener(name: str) -> Opener:
        @contextlib.contextmanager
        def open_system():
            with common.started(name, capacity, file_dir, block_bytes=ctx.block_bytes) as adapter:
                infos[name].update(versions=adapter.versions())
                yield adapter
                infos[name].update(describe=adapter.describe())
        return open_system

    active: dict[str, Measure] = {}
    problems: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    label = f"{workload} {size_label(ctx.block_bytes)}"
    try:
        for name in tqdm(systems, desc=f"{label} start", unit="system"):
            m = make(opener(name), name, warm, meas, ctx)
            _, problem = common.run_system(name, lambda: (m.start(), [])[1])
            if problem:
                m.close()
                problems.append(problem)
            else:
                active[name] = m
        for r in tqdm(range(ctx.rounds), desc=f"{label} rounds", unit="round"):
            for name in _rotated(list(active), r):
                _, problem = common.run_system(name, lambda: (active[name].round(r), [])[1])
                if problem:
                    active.pop(name).close()
                    problems.append(problem)
        for name, m in list(active.items()):
            got, problem = common.run_system(name, m.finish)
            m.close()
            if problem:
                problems.append(problem)
            for row in got:
                rows.append({"system": name, **row, **infos[name]})
    finally:
        for m in active.values():
            m.close()
    order = {n: i for i, n in enumerate(systems)}
    modes = {"put": 0, "hot": 1, "cold": 2}
    rows.sort(key=lambda row: (order[row["system"]], modes.get(row.get("mode"), 3)))
    return rows, problems


def same_mode_limit(row: dict[str, Any]) -> str | None:
    """The raw read limit in the read mode a cold row ran (``read_mode``), or None."""
    if row.get("mode") != "cold" or row.get("read_mode") not in ("buffered", "direct"):
        return None
    return "raw_odirect_read_gbps" if row["read_mode"] == "direct" else "raw_buffered_cold_read_gbps"


def vs_limit(row: dict[str, Any], lim: dict[str, Any]) -> dict[str, float]:
    """A row's figure as a fraction of the machine's limits (1.0 = at the limit); a cold
    row that knows its read mode also against the raw read of that mode
    (``raw_read_same_mode``)."""
    out: dict[str, float] = {}
    same = same_mode_limit(row)
    streamed = lim.get("streamed_copy_gbps")
    if "put_gbps" in row:
        out["memcpy"] = row["put_gbps"] / lim["memcpy_gbps"]
        if streamed:
            out["streamed_copy"] = row["put_gbps"] / streamed
        out["raw_write"] = row["put_gbps"] / lim["raw_write_gbps"]
    if "get_gbps" in row:
        out["memcpy"] = row["get_gbps"] / lim["memcpy_gbps"]
        if streamed:
            out["streamed_copy"] = row["get_gbps"] / streamed
        out["raw_odirect_read"] = row["get_gbps"] / lim["raw_odirect_read_gbps"]
        out["raw_buffered_cold_read"] = row["get_gbps"] / lim["raw_buffered_cold_read_gbps"]
        if same:
            out["raw_read_same_mode"] = row["get_gbps"] / lim[same]
    if "latency_s" in row:
        p50 = row["latency_s"]["p50"]
        out["memcpy"] = lim["memcpy_s_p50"] / p50
        out["raw_odirect_read"] = row["block_bytes"] / (lim["raw_odirect_read_gbps"] * 1e9) / p50
        out["raw_buffered_cold_read"] = row["block_bytes"] / (lim["raw_buffered_cold_read_gbps"] * 1e9) / p50
        if same:
            out["raw_read_same_mode"] = row["block_bytes"] / (lim[same] * 1e9) / p50
    return out


_LIMIT_KEYS = {"memcpy": "memcpy_gbps", "streamed_copy": "streamed_copy_gbps", "raw_write": "raw_write_gbps", "raw_odirect_read": "raw_odirect_read_gbps",
               "raw_buffered_cold_read": "raw_buffered_cold_read_gbps"}


def limit_noise(row: dict[str, Any], lim: dict[str, Any]) -> dict[str, Any]:
    """How much a ratio to a limit moves with the limit's own noise: ``vs_limit_range``
    = the ratio against the better and the worse of the limit's two measurements, and
    ``above_noisy_limit`` names the ratios above 1 (the system beat a limit measured in
    the same run: read it as "at the limit, within its noise", not as a ceiling broken)."""
    ranges: dict[str, list[float]] = {}
    for name, ratio in row.get("vs_limit", {}).items():
        key = same_mode_limit(row) if name == "raw_read_same_mode" else _LIMIT_KEYS.get(name)
        b, a = lim.get("before", {}).get(key), lim.get("after", {}).get(key)
        if name == "memcpy" and "latency_s" in row:  # a time-based limit: use memcpy_s_p50
            b, a = lim.get("before", {}).get("memcpy_s_p50"), lim.get("after", {}).get("memcpy_s_p50")
            if b and a:
                p50 = row["latency_s"]["p50"]
                ranges[name] = sorted([b / p50, a / p50])
            continue
        if b and a and lim.get(key):
            ranges[name] = sorted([ratio * lim[key] / b, ratio * lim[key] / a])
    above = sorted(n for n, r in row.get("vs_limit", {}).items() if r > 1)
    out: dict[str, Any] = {"vs_limit_range": ranges}
    if above:
        out["above_noisy_limit"] = above
    return out


def summary(samples: list[float]) -> dict[str, float]:
    return summarize(samples) if samples else {}


def median_gbps(nbytes: int, round_s: list[float]) -> float:
    return gbps(nbytes, float(np.median(round_s)))


def format_table(result: dict[str, Any], columns: list[tuple[str, int, Callable[[dict], str]]]) -> str:
    """Rows grouped by size and mode, with the given (header, width, cell) columns."""
    lines = [f"data: {result['data']['dir']} (seed {result['data']['seed']}); file dir {result['file_dir']}"]
    for size, lim in result["limits"].items():
        lines.append(f"limits @ {size_label(int(size))}: memcpy {lim['memcpy_gbps']:.2f} GB/s, raw O_DIRECT read "
                     f"{lim['raw_odirect_read_gbps']:.2f}, raw cold buffered read {lim['raw_buffered_cold_read_gbps']:.2f}, "
                     f"raw write {lim['raw_write_gbps']:.2f} GB/s")
    mpi = result.get("mpi_limits", {})
    for r in mpi.get("mpi_get", {}).get("rows", []):
        lines.append(f"raw MPI Get @ {size_label(r['block_bytes'])} ({mpi['mpi_get']['ranks']} ranks): "
                     f"pair {r['pair_gbps']:.2f} GB/s, aggregate {r['aggregate_gbps']:.2f} GB/s")
    header = f"{'system':<17} {'size':>7} {'mode':>5} " + " ".join(f"{h:>{w}}" for h, w, _ in columns)
    lines.append(header)
    for row in result["rows"]:
        lines.append(f"{row['system']:<17} {size_label(row['block_bytes']):>7} {row.get('mode', ''):>5} "
                     + " ".join(f"{cell(row):>{w}}" for _, w, cell in columns))
    for p in result["not_run"]:
        lines.append(f"{p['system']:<17} {size_label(p.get('block_bytes', 0)):>7} {p['status']}: {p['reason'][:150]}")
    lines.extend(common.format_targets(result.get("targets", [])))
    return "\n".join(lines)
