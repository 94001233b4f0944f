"""The shared driver of write_throughput, read_throughput and read_latency.

For each block size: take ``warmup + blocks`` blocks from the shared data directory
(:mod:`benchmark.data`, mmap, pre-faulted so no system pays for reading the source),
measure this machine's limits (memcpy of one block; raw sequential write and O_DIRECT
read on the file system the systems write to), then start each system in turn with the
same capacity, let the workload's ``measure`` run it, close it, and measure the limits
again (the better of the two is the limit; both are stored). Every row then gets its
ratios to the limits and to the other systems of the same size and mode.

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

DEFAULT_SIZES = [2 << 20, 16 << 20]
MEASURED_BYTES = 384 << 20  # per size: 192 x 2 MiB, 24 x 16 MiB
ROUNDS = 3


@dataclass
class Context:
    """What a workload's ``measure`` gets besides the adapter and the blocks."""

    block_bytes: int
    rounds: int
    seed: int
    outs: tuple[np.ndarray, np.ndarray]
    options: dict[str, Any] = field(default_factory=dict)


Opener = Callable[[], contextlib.AbstractContextManager[StorageAdapter]]
#: ``measure(open_system, name, warm_blocks, measured_blocks, ctx) -> rows``; ``open_system()``
#: starts a fresh instance of the system (a context manager that stops it).
Measure = Callable[[Opener, str, list[Block], list[Block], Context], list[dict[str, Any]]]


def counts(block_bytes: int, options: dict[str, Any]) -> tuple[int, int]:
    """(warm-up blocks, measured blocks) for a size."""
    blocks = int(options.get("blocks") or max(8, MEASURED_BYTES // block_bytes))
    warmup = int(options["warmup"]) if options.get("warmup") is not None else max(2, min(8, (16 << 20) // block_bytes))
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


def run(options: dict[str, Any], workload: str, measure: Measure, *, vs_metric: str,
        higher_is_better: bool = True) -> dict[str, Any]:
    """Run ``measure`` for every selected system and size; the result document (see
    ``benchmark/README.md`` for its fields)."""
    sizes = options.get("sizes") or DEFAULT_SIZES
    systems = common.select(options.get("system") or "all", ADAPTER_NAMES)
    file_dir = options.get("file_dir") or Config().file_dir
    rounds = int(options.get("rounds") or ROUNDS)
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
            warm, meas = blocks[:warm_n], blocks[warm_n:]
            capacity = 2 * (warm_n + meas_n) * size
            raw_total = min(meas_n * size, 512 << 20)
            before = common.machine_limits(size, file_dir, raw_total)
            ctx = Context(size, rounds, seed, common.aligned_pair(size // 2), options)
            size_rows: list[dict[str, Any]] = []
            for name in tqdm(systems, desc=f"{workload} {size >> 20} MiB", unit="system"):
                def go(name: str = name) -> list[dict[str, Any]]:
                    info: dict[str, Any] = {}

                    @contextlib.contextmanager
                    def open_system():
                        with common.started(name, capacity, file_dir) as adapter:
                            yield adapter
                            info.update(versions=adapter.versions(), describe=adapter.describe())

                    got = measure(open_system, name, warm, meas, ctx)
                    for row in got:
                        row.update({"system": name, "block_bytes": size, "blocks": meas_n,
                                    "warmup_blocks": warm_n, "capacity_bytes": capacity, **info})
                    return got
                got, problem = common.run_system(name, go)
                size_rows.extend(got)
                if problem:
                    problems.append({**problem, "block_bytes": size})
            lim = common.merge_limits(before, common.machine_limits(size, file_dir, raw_total))
            limits[str(size)] = lim
            for row in size_rows:
                row["vs_limit"] = vs_limit(row, lim)
            rows.extend(size_rows)
    common.add_ratios(rows, vs_metric, ("block_bytes", "mode"), higher_is_better=higher_is_better)
    ranks = int(options.get("ranks") or 1)
    load.append(common.loadavg())
    return {
        "schema": f"cascade-bench/{workload}/1",
        "workload": workload,
        "systems": systems,
        "block_sizes": sizes,
        "rounds": rounds,
        "data": data_info,
        "file_dir": file_dir,
        "same_filesystem": os.stat(file_dir).st_dev == os.stat(data_dir).st_dev,
        "limits": limits,
        "mpi_limits": mpi_limits_via_mpiexec(ranks, sizes) if ranks > 1 else
        {"skipped": "single-process workload run with --ranks 1 (pass --ranks N to also measure raw MPI Get)"},
        "rows": rows,
        "not_run": problems,
        "loadavg_before_after": load,
    }


def vs_limit(row: dict[str, Any], lim: dict[str, Any]) -> dict[str, float]:
    """A row's figure as a fraction of the machine's limits (1.0 = at the limit)."""
    out: dict[str, float] = {}
    if "put_gbps" in row:
        out["memcpy"] = row["put_gbps"] / lim["memcpy_gbps"]
        out["raw_write"] = row["put_gbps"] / lim["raw_write_gbps"]
    if "get_gbps" in row:
        out["memcpy"] = row["get_gbps"] / lim["memcpy_gbps"]
        out["raw_odirect_read"] = row["get_gbps"] / lim["raw_odirect_read_gbps"]
    if "latency_s" in row:
        p50 = row["latency_s"]["p50"]
        out["memcpy"] = lim["memcpy_s_p50"] / p50
        out["raw_odirect_read"] = row["block_bytes"] / (lim["raw_odirect_read_gbps"] * 1e9) / p50
    return out


def summary(samples: list[float]) -> dict[str, float]:
    return summarize(samples) if samples else {}


def median_gbps(nbytes: int, round_s: list[float]) -> float:
    return gbps(nbytes, float(np.median(round_s)))


def format_table(result: dict[str, Any], columns: list[tuple[str, str, Callable[[dict], str]]]) -> str:
    """Rows grouped by size and mode, with the given (header, width, cell) columns."""
    lines = [f"data: {result['data']['dir']} (seed {result['data']['seed']}); file dir {result['file_dir']}"]
    for size, lim in result["limits"].items():
        lines.append(f"limits @ {int(size) >> 20} MiB: memcpy {lim['memcpy_gbps']:.2f} GB/s, raw O_DIRECT read "
                     f"{lim['raw_odirect_read_gbps']:.2f} GB/s, raw write {lim['raw_write_gbps']:.2f} GB/s")
    mpi = result.get("mpi_limits", {})
    for r in mpi.get("mpi_get", {}).get("rows", []):
        lines.append(f"raw MPI Get @ {r['block_bytes'] >> 20} MiB ({mpi['mpi_get']['ranks']} ranks): "
                     f"pair {r['pair_gbps']:.2f} GB/s, aggregate {r['aggregate_gbps']:.2f} GB/s")
    header = f"{'system':<17} {'size':>6} {'mode':>5} " + " ".join(f"{h:>{w}}" for h, w, _ in columns)
    lines.append(header)
    for row in result["rows"]:
        lines.append(f"{row['system']:<17} {row['block_bytes'] >> 20:>4}Mi {row.get('mode', ''):>5} "
                     + " ".join(f"{cell(row):>{w}}" for _, w, cell in columns))
    for p in result["not_run"]:
        lines.append(f"{p['system']:<17} {p.get('block_bytes', 0) >> 20:>4}Mi {p['status']}: {p['reason'][:150]}")
    lines.extend(common.format_targets(result.get("targets", [])))
    return "\n".join(lines)
