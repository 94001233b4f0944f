"""Benchmark runner: ``python -m benchmark.run_benchmark --system S --workload W``.

``S`` is an adapter name, a comma list, or ``all`` (every system the workload runs; one
that cannot start here is recorded with its reason). Writes
``benchmark/results/{system}_{workload}_{nodes}n_{timestamp}.json`` (this process only:
multi-rank workloads launch their own ``mpiexec`` worlds and hand figures back) and
prints a summary table. Every run measures this machine's limits beside the systems.
Workloads and their result fields: ``benchmark/README.md``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from cascade.cli import count_arg

from .adapters import ADAPTER_NAMES
from .results import results_dir, write_results
from .workloads.common import OptionError
from .workloads.scaling import SYSTEMS as SCALING_SYSTEMS
from .workloads.trace_replay import SYSTEMS as TRACE_SYSTEMS

# workload name -> (module, systems it runs, description)
WORKLOADS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "tier_bandwidth": ("tier_bandwidth", ("cascade",), "put/get GB/s per Cascade tier, 64 KiB-64 MiB"),
    "write_throughput": ("write_throughput", ADAPTER_NAMES, "put GB/s of every system, shared data, 2/16 MiB"),
    "read_throughput": ("read_throughput", ADAPTER_NAMES, "get GB/s of every system, hot and cold"),
    "read_latency": ("read_latency", ADAPTER_NAMES, "per-get p50/p90/p99/max of every system, hot and cold"),
    "trace_replay": ("trace_replay", TRACE_SYSTEMS, "hit ratios on a trace vs LRU and Belady, every evicting system"),
    "scaling": ("scaling", SCALING_SYSTEMS, "aggregate put/get GB/s at 1, 2, 4 ranks (mpiexec)"),
    "queue_hints": ("queue_hints", ("cascade",), "hit ratio with scheduler hints at queue depths vs LRU/Belady"),
    "thread_scaling": ("thread_scaling", ("cascade",), "aggregate get GB/s at 1/2/4 threads vs raw reads at that depth"),
    "device_io": ("device_io", ("cascade",), "GPU buffers through every tier vs raw D2D, pinned and pageable copies"),
    "file_read_mode": ("file_read_mode", ("cascade",), "cold file-tier reads per read mode vs raw O_DIRECT and buffered reads"),
    "small_blocks": ("small_blocks", ("cascade",), "per-block cost vs a dict, batch vs loop, 4 KiB-16 MiB, hot and cold"),
    "read_stall": ("read_stall", ("cascade",), "hot SHM gets beside a cold file-tier scan, and a compaction, of the same store: p50/p99/max"),
    "cluster_serving": ("cluster_serving", ("cascade",), "engines attached to cascade serve ranks: attach cost per block; hit ratio through LMCache, shared vs private vs LMCache CPU+disk"),
}


def _counts(least: int) -> Callable[[str], list[int]]:
    """An argparse type: a comma list of integers >= ``least``, e.g. ``1,2,4``."""
    one = count_arg(least)
    return lambda text: [one(item.strip()) for item in text.split(",")]


def _size(text: str) -> int:
    """An argparse type: a size in bytes > 0, e.g. ``2M``."""
    from cascade.config import ConfigError, parse_size

    try:
        value = parse_size(text.strip())
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected a size such as 64K or 2M, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a size must be > 0, got {text!r}")
    return value


def _sizes(text: str) -> list[int]:
    """An argparse type: a comma list of sizes, e.g. ``2M,16M``."""
    return [_size(item) for item in text.split(",")]


def _seconds(text: str) -> float:
    """An argparse type: seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmark.run_benchmark", description=__doc__.splitlines()[0])
    p.add_argument("--system", required=True, help="a system name, or 'all'")
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--ranks", type=count_arg(1), default=1)
    p.add_argument("--sizes", type=_sizes, help="block sizes, e.g. 2M,16M (default per workload)")
    p.add_argument("--blocks", type=count_arg(1), help="measured blocks per size (throughput/latency/scaling: per rank)")
    p.add_argument("--warmup", type=count_arg(0), help="untimed warm-up blocks per size")
    p.add_argument("--rounds", type=count_arg(1), help="timed rounds per system and size (median reported)")
    p.add_argument("--ops", type=count_arg(1), help="hot gets timed one by one (read_latency)")
    p.add_argument("--data-dir", help="shared block data (python -m benchmark.data; generated if missing)")
    p.add_argument("--seed", type=count_arg(0), help="data and order seed (default 0)")
    p.add_argument("--rank-counts", type=_counts(1), help="rank counts for scaling (default 1,2,4)")
    p.add_argument("--threads", type=_counts(1), help="thread counts for thread_scaling (default 1,2,4)")
    p.add_argument("--time-limit", type=_seconds, help="seconds per replay before it stops (trace_replay)")
    p.add_argument("--total-bytes", type=_size, help="bytes moved per size and tier (tier_bandwidth); measured bytes per size (thread_scaling)")
    p.add_argument("--capacities", type=_counts(1), help="comma-separated capacities in blocks (trace_replay)")
    p.add_argument("--full-capacities", type=_counts(1), help="capacities of Cascade's whole-trace replays (trace_replay; default --capacities)")
    p.add_argument("--no-full-trace", action="store_true", help="trace_replay: only the common prefix, no whole-trace replays")
    p.add_argument("--trace", help="Mooncake-format trace (trace_replay; default: the shared trace)")
    p.add_argument("--requests", type=count_arg(1), help="trace_replay: requests every system replays for the comparison; queue_hints: prefix of each source")
    p.add_argument("--queue-depths", type=_counts(0), help="queue depths, e.g. 0,16,64,256 (queue_hints)")
    p.add_argument("--seeds", type=_counts(0), help="generator seeds, e.g. 0,1,2 (queue_hints)")
    p.add_argument("--file-dir", help="directory for file-backed tiers and systems")
    p.add_argument("--out", help="results directory (default benchmark/results)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    module_name, systems, _ = WORKLOADS[args.workload]
    unknown = [s for s in args.system.split(",") if s not in systems] if args.system != "all" else []
    if unknown:
        p.error(f"workload {args.workload} runs {', '.join(systems)}; got --system {args.system!r}")
    try:
        out = results_dir(args.out)
    except OSError as exc:
        p.error(f"--out {args.out}: cannot write results there ({exc.strerror or exc})")
    module = importlib.import_module(f".workloads.{module_name}", __package__)
    options: dict[str, Any] = {
        "sizes": args.sizes, "total_bytes": args.total_bytes, "capacities": args.capacities,
        "full_capacities": args.full_capacities, "full_trace": False if args.no_full_trace else None,
        "trace": args.trace, "requests": args.requests, "file_dir": args.file_dir, "ranks": args.ranks,
        "system": args.system, "blocks": args.blocks, "warmup": args.warmup, "rounds": args.rounds,
        "ops": args.ops, "data_dir": args.data_dir, "seed": args.seed, "time_limit": args.time_limit,
        "rank_counts": args.rank_counts, "threads": args.threads, "queue_depths": args.queue_depths,
        "seeds": args.seeds,
    }
    try:
        result = module.run(options)
    except OptionError as exc:
        p.error(str(exc))
    path = write_results(args.system.replace(",", "+"), args.workload, result, ranks=args.ranks,
                         config={k: v for k, v in options.items() if v is not None}, directory=out)
    print(module.table(result))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
