"""trace_replay: a Mooncake-format trace replayed at fixed capacities (in blocks).

Cascade is replayed through the real store (one DRAM tier of exactly ``capacity`` blocks,
tiny-model blocks so a full trace fits in seconds per capacity), once with its semantic
policy and once with its LRU policy; LRU and the offline optimum (Belady) from
:mod:`benchmark.reference_policies` are the references. Same semantics everywhere: every
hash id is one reference, a missed block is cached right after its reference.

Reported per capacity: block and token hit ratios, and how much of the LRU-to-Belady gap
each policy closes, ``(hit - lru) / (belady - lru)``. A modelled prefill-time saving is
the token hit ratio (prefill time is roughly linear in uncached prompt tokens for these
prompt lengths): the fraction of prompt tokens that need no recompute.
"""
from __future__ import annotations

import time
from typing import Any

from tqdm import tqdm

from cascade import CascadeStore, Config
from cascade.replay import replay
from cascade.trace import DEFAULT_TRACE, TOKENS_PER_BLOCK, read_trace
from cascade.workload import WorkloadParams, generate

from ..reference_policies import simulate

CAPACITIES = [1000, 5000, 20000]


def load_requests(options: dict[str, Any]):
    """The requests to replay: ``options['trace']``, else the shared trace when present,
    else the built-in generator. Returns (requests, source description)."""
    path = options.get("trace") or DEFAULT_TRACE
    limit = options.get("requests")
    if path:
        return read_trace(path, limit=limit), str(path)
    seed = int(options.get("seed", 0))
    reqs = generate(WorkloadParams(), seed=seed)
    return (reqs[:limit] if limit else reqs), f"cascade.workload.generate(seed={seed})"


def cascade_hits(requests, capacity: int, policy: str) -> dict[str, Any]:
    """Replay through a CascadeStore whose only tier holds exactly ``capacity`` blocks."""
    cfg = Config(model="tiny", block_tokens=16, shm_bytes=capacity * 4096, file_bytes=0, policy=policy)
    t0 = time.perf_counter()
    with CascadeStore(cfg) as store:
        result = replay(store, requests, tokens_per_block=TOKENS_PER_BLOCK, pin_in_flight=True)
    out = result.as_dict()
    out["elapsed_s"] = time.perf_counter() - t0
    return out


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Options: ``capacities`` (blocks), ``trace`` (path), ``requests`` (limit), ``seed``."""
    requests, source = load_requests(options)
    capacities = options.get("capacities") or CAPACITIES
    rows = []
    for capacity in tqdm(capacities, desc="trace_replay", unit="capacity"):
        row: dict[str, Any] = {"capacity_blocks": capacity}
        for ref in ("lru", "belady"):
            s = simulate(requests, ref, capacity)
            row[f"reference_{ref}"] = {"block_hit_ratio": s.block_hit_ratio, "token_hit_ratio": s.token_hit_ratio,
                                       "hits": s.hits, "references": s.references}
        for policy in ("semantic", "lru"):
            r = cascade_hits(requests, capacity, policy)
            r.pop("store_stats", None)
            row[f"cascade_{policy}"] = r
        lru = row["reference_lru"]["block_hit_ratio"]
        gap = row["reference_belady"]["block_hit_ratio"] - lru
        for policy in ("semantic", "lru"):
            hit = row[f"cascade_{policy}"]["block_hit_ratio"]
            row[f"cascade_{policy}"]["gap_closed"] = (hit - lru) / gap if gap > 0 else 0.0
            row[f"cascade_{policy}"]["prefill_saving"] = row[f"cascade_{policy}"]["token_hit_ratio"]
        rows.append(row)
    return {"source": source, "requests": len(requests), "rows": rows}


def table(result: dict[str, Any]) -> str:
    lines = [f"trace: {result['source']} ({result['requests']} requests)",
             f"{'capacity':>9} {'LRU(ref)':>9} {'Belady':>8} {'cascade-lru':>12} {'semantic':>9} {'gap closed':>10}"]
    for r in result["rows"]:
        lines.append(f"{r['capacity_blocks']:>9} {r['reference_lru']['block_hit_ratio']:>9.2%} "
                     f"{r['reference_belady']['block_hit_ratio']:>8.2%} {r['cascade_lru']['block_hit_ratio']:>12.2%} "
                     f"{r['cascade_semantic']['block_hit_ratio']:>9.2%} {r['cascade_semantic']['gap_closed']:>10.1%}")
    return "\n".join(lines)
