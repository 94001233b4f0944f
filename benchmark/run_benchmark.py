"""Benchmark runner: ``python -m benchmark.run_benchmark --system S --workload W``.

Writes ``benchmark/results/{system}_{workload}_{nodes}n_{timestamp}.json`` (rank 0 only)
and prints a summary table. Every run measures this machine's limits beside the systems.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, Sequence

from .results import write_results

# workload name -> (module, systems it runs, description)
WORKLOADS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "tier_bandwidth": ("tier_bandwidth", ("cascade",), "put/get GB/s per Cascade tier, 64 KiB-64 MiB"),
    "trace_replay": ("trace_replay", ("cascade",), "hit ratios on a trace vs LRU and Belady"),
}


def _parse_sizes(text: str | None) -> list[int] | None:
    if not text:
        return None
    from cascade.config import parse_size

    return [parse_size(s.strip(), "--sizes") for s in text.split(",")]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmark.run_benchmark", description=__doc__.splitlines()[0])
    p.add_argument("--system", required=True, help="a system name, or 'all'")
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--sizes", help="block sizes, e.g. 64K,1M,16M (tier_bandwidth)")
    p.add_argument("--total-bytes", help="bytes moved per size and tier (tier_bandwidth)")
    p.add_argument("--capacities", help="comma-separated capacities in blocks (trace_replay)")
    p.add_argument("--trace", help="Mooncake-format trace (trace_replay; default: the shared trace)")
    p.add_argument("--requests", type=int, help="replay only the first N requests")
    p.add_argument("--file-dir", help="directory for file-backed tiers and systems")
    p.add_argument("--out", help="results directory (default benchmark/results)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module_name, systems, _ = WORKLOADS[args.workload]
    if args.system != "all" and args.system not in systems:
        print(f"workload {args.workload} runs {', '.join(systems)}; got --system {args.system}", file=sys.stderr)
        return 2
    module = importlib.import_module(f".workloads.{module_name}", __package__)
    options: dict[str, Any] = {
        "sizes": _parse_sizes(args.sizes),
        "total_bytes": _parse_sizes(args.total_bytes)[0] if args.total_bytes else None,
        "capacities": [int(c) for c in args.capacities.split(",")] if args.capacities else None,
        "trace": args.trace, "requests": args.requests, "file_dir": args.file_dir, "ranks": args.ranks,
    }
    result = module.run(options)
    path = write_results(args.system, args.workload, result, ranks=args.ranks,
                         config={k: v for k, v in options.items() if v is not None}, directory=args.out)
    print(module.table(result))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
