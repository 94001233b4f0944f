"""queue_hints: hit ratio of Cascade with scheduler hints at queue depths 0/16/64/256,
beside the LRU, Belady and lookahead-oracle references, on several request sources and
capacities.

Each source — the shared Mooncake trace (when present, or ``--trace``) and the built-in
generator at several seeds — is replayed through the real store (one SHM tier of
``capacity x block_bytes``, semantic policy) with :func:`cascade.replay.replay` and
``queue_depth=D``: the next ``D`` requests are visible and their cached blocks hinted
(:meth:`CascadeStore.hint`). Depth 0 is the online policy alone; the check
``depth0_ge_lru`` says whether it is at least the reference LRU's hit ratio for every
source and capacity. LRU and Belady do not use the queue (Belady sees the whole future);
the lookahead oracle at each depth sees what the queue shows and nothing more (it evicts by
the queued requests' references alone, LRU among the rest:
:func:`benchmark.reference_policies.lookahead_hits`). Checks per row: ``vs_lookahead_ge_095``
(Cascade at every depth reaches at least 0.95x the oracle at that depth) and
``monotonic_in_depth`` (Cascade's hit ratio never falls as the depth grows).

Options: ``capacities`` (blocks), ``queue_depths``, ``seeds`` (generator seeds; default
0,1,2), ``trace``, ``requests`` (prefix of each source), ``sizes`` (one block size,
default 4 KiB: hit ratios do not depend on it), ``hint_fraction``.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

from tqdm import tqdm

from cascade import CascadeStore, Config
from cascade.models import BlockSpec
from cascade.replay import replay
from cascade.trace import DEFAULT_TRACE, TOKENS_PER_BLOCK, read_trace
from cascade.workload import WorkloadParams, generate

from ..reference_policies import simulate
from . import common

CAPACITIES = [1000, 5000, 20000]
QUEUE_DEPTHS = [0, 16, 64, 256]
SEEDS = [0, 1, 2]
BLOCK_BYTES = 4 << 10
ORACLE_SHARE = 0.95  # the least hit ratio, as a share of the lookahead oracle's, at each depth


def sources(options: dict[str, Any]) -> list[tuple[str, list, int]]:
    """(name, requests, tokens per block) of every source replayed."""
    out = []
    limit = options.get("requests")
    path = options.get("trace") or DEFAULT_TRACE
    if path:
        out.append((f"trace:{path}", read_trace(path, limit), TOKENS_PER_BLOCK))
    params = WorkloadParams()
    for seed in options.get("seeds") or SEEDS:
        reqs = generate(params, seed=seed)
        out.append((f"cascade.workload.generate(seed={seed})", reqs[:limit] if limit else reqs, params.tokens_per_block))
    return out


def replay_depth(requests: list, capacity: int, depth: int, tpb: int, block_bytes: int,
                 hint_fraction: float) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="queue_hints_")
    cfg = Config(shm_bytes=capacity * block_bytes, file_bytes=0, file_dir=workdir, hint_fraction=hint_fraction)
    t0 = time.perf_counter()
    try:
        with CascadeStore(cfg, block_spec=BlockSpec.flat(block_bytes)) as store:
            r = replay(store, requests, tokens_per_block=tpb, queue_depth=depth)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"queue_depth": depth, "block_hit_ratio": r.block_hit_ratio, "token_hit_ratio": r.token_hit_ratio,
            "hits": r.hits, "references": r.references, "rejected": r.rejected,
            "hints": r.store_stats.get("hints"), "elapsed_s": time.perf_counter() - t0}


def run(options: dict[str, Any]) -> dict[str, Any]:
    capacities = options.get("capacities") or CAPACITIES
    depths = sorted(options.get("queue_depths") or QUEUE_DEPTHS)
    block_bytes = common.one_size(options, BLOCK_BYTES, "queue_hints")
    hint_fraction = float(options.get("hint_fraction") or Config().hint_fraction)
    rows = []
    for name, requests, tpb in sources(options):
        for capacity in tqdm(capacities, desc=name[:40], unit="capacity"):
            lru = simulate(requests, "lru", capacity, tpb)
            belady = simulate(requests, "belady", capacity, tpb)
            cascade = []
            for d in depths:
                c = replay_depth(requests, capacity, d, tpb, block_bytes, hint_fraction)
                oracle = simulate(requests, "lookahead", capacity, tpb, depth=d).block_hit_ratio
                c["reference_lookahead"] = oracle
                c["vs_lookahead"] = c["block_hit_ratio"] / oracle if oracle else None
                cascade.append(c)
            online = next((c for c in cascade if c["queue_depth"] == 0), None)
            ratios = [c["block_hit_ratio"] for c in cascade]
            rows.append({"source": name, "requests": len(requests), "capacity_blocks": capacity,
                         "reference_lru": lru.block_hit_ratio, "reference_belady": belady.block_hit_ratio,
                         "references": lru.references, "cascade": cascade,
                         "depth0_ge_lru": None if online is None else online["block_hit_ratio"] >= lru.block_hit_ratio,
                         "vs_lookahead_ge_095": all(c["block_hit_ratio"] >= ORACLE_SHARE * c["reference_lookahead"]
                                                    for c in cascade),
                         "monotonic_in_depth": all(a <= b for a, b in zip(ratios, ratios[1:]))})

    def target(name: str, field: str) -> dict[str, Any]:
        checks = [r[field] for r in rows if r[field] is not None]
        return {"name": name, "met": all(checks) if checks else None, "checked": len(checks)}

    return {"schema": "cascade-bench/queue_hints/2", "capacities": capacities, "queue_depths": depths,
            "block_bytes": block_bytes, "hint_fraction": hint_fraction, "policy": "semantic", "rows": rows,
            "targets": [target("depth-0 online policy >= reference LRU on every source and capacity", "depth0_ge_lru"),
                        target(f"every depth >= {ORACLE_SHARE}x the lookahead oracle at that depth, on every source "
                               "and capacity", "vs_lookahead_ge_095"),
                        target("hit ratio never falls as the queue depth grows, on every source and capacity",
                               "monotonic_in_depth")]}


def table(result: dict[str, Any]) -> str:
    depths = result["queue_depths"]
    lines = [f"{'source':<44} {'capacity':>8} {'LRU':>7} {'Belady':>7} "
             + " ".join(f"{'d=' + str(d):>21}" for d in depths) + "  d0>=LRU  >=0.95x  monotonic",
             f"{'':<44} {'':>8} {'':>7} {'':>7} " + " ".join(f"{'cascade/oracle=ratio':>21}" for _ in depths)]
    for r in result["rows"]:
        by = {c["queue_depth"]: c for c in r["cascade"]}
        cells = " ".join(f"{by[d]['block_hit_ratio']:>6.2%}/{by[d]['reference_lookahead']:>6.2%}="
                         + (f"{by[d]['vs_lookahead']:.3f}" if by[d]["vs_lookahead"] is not None else "  -  ")
                         for d in depths)
        lines.append(f"{r['source'][-44:]:<44} {r['capacity_blocks']:>8} {r['reference_lru']:>7.2%} "
                     f"{r['reference_belady']:>7.2%} {cells}  {str(r['depth0_ge_lru']):<7}  "
                     f"{str(r['vs_lookahead_ge_095']):<7}  {r['monotonic_in_depth']}")
    for t in result["targets"]:
        lines.append(f"target {t['name']}: {t['met']} ({t['checked']} checked)")
    return "\n".join(lines)
