"""trace_replay: a Mooncake-format trace replayed through every system that evicts, at
fixed capacities (in blocks), beside the LRU and offline-optimal (Belady) references.

Same semantics everywhere (those of :mod:`benchmark.reference_policies`): requests in
order, each request's hash ids in order; every id is one reference; a reference hits when
the system returns the block (``get_into``), else the block is put right away. Every
system gets the same capacity in bytes, ``capacity_blocks x block_bytes`` (default 64 KiB
blocks: one reusable random payload, ids from the trace), and evicts by itself:

* Cascade (``cascade``: SHM tier; ``cascade_file``: file tier) is replayed through the
  real store with :func:`cascade.replay.replay`, its own API: parents (the previous block
  of the request) and pins for blocks of the request in flight, semantic policy.
  ``cascade_lru`` is the same store with ``policy="lru"``, a check against the reference.
* Peers through their adapters (``get_into`` / ``put``); a put the system refuses
  (full, nothing evictable) counts in ``rejected`` and the block stays uncached. A peer's
  variants that change only its transport or I/O path (``redis_unix``,
  ``lmcache_disk_odirect``: :func:`benchmark.adapters.family`) keep and evict the same
  blocks, so only the default variant replays (hit ratios are what this workload measures).

Every system replays the same prefix of the trace, ``compare_requests`` requests
(:data:`COMPARE_REQUESTS`, ``--requests N`` to change), at every capacity: those rows
(``scope: "compare"``) are the comparison, and ``vs_systems`` relates only rows of the same
capacity and the same replayed requests. Cascade (``cascade``, ``cascade_lru``) also
replays the whole trace (``scope: "full"``), for the policy study. Every replay stops at
``time_limit`` seconds (recorded as ``truncated``; a truncated row is left out of the
ratios). LRU and Belady are computed on exactly the requests each row replayed, so
``gap_closed = (hit - LRU) / (Belady - LRU)`` always compares like with like.

Result: ``rows`` (per capacity, the Cascade-only layout the paper reads: reference_lru,
reference_belady, cascade_semantic, cascade_lru), ``system_rows`` (one flat row per
system and capacity) and ``references``. Fields: ``benchmark/README.md``.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from tqdm import tqdm

from cascade import CascadeStore, Config
from cascade.models import BlockSpec
from cascade.replay import replay
from cascade.trace import DEFAULT_TRACE, TOKENS_PER_BLOCK, Request, block_chain, read_trace
from cascade.workload import WorkloadParams, generate

from ..reference_policies import simulate
from . import common

CAPACITIES = [1000, 5000, 20000]
BLOCK_BYTES = 64 << 10
TIME_LIMIT_S = 150.0
#: Systems replayed (every registered system with eviction, and Cascade's LRU check).
SYSTEMS: tuple[str, ...] = ("cascade", "cascade_lru", "cascade_file", "lmcache_cpu", "lmcache_disk",
                            "lmcache_cpu_disk", "redis", "mooncake")
#: Requests every system replays for the comparison (the slowest system, LMCache's disk
#: backend, sets it: its put scans every cached entry once the cache is full).
COMPARE_REQUESTS = 1000
#: Systems that also replay the whole trace (fast enough for it).
FULL_TRACE = ("cascade", "cascade_lru")
CASCADE_VIA_STORE = {"cascade": ("shm", "semantic"), "cascade_lru": ("shm", "lru"), "cascade_file": ("file", "semantic")}


def load_requests(options: dict[str, Any]) -> tuple[list[Request], str, int]:
    """(requests, source description, tokens per block): ``options['trace']``, else the
    shared trace when present, else the built-in generator."""
    path = options.get("trace") or DEFAULT_TRACE
    if path:
        return read_trace(path), str(path), TOKENS_PER_BLOCK
    seed = int(options.get("seed") or 0)
    params = WorkloadParams()
    return generate(params, seed=seed), f"cascade.workload.generate(seed={seed})", params.tokens_per_block


def _until(requests: Sequence[Request], deadline: float, counter: list[int]) -> Iterator[Request]:
    for r in requests:
        if time.monotonic() > deadline:
            return
        counter[0] += 1
        yield r


def replay_store(name: str, requests: Sequence[Request], capacity: int, block_bytes: int, tokens_per_block: int,
                 file_dir: str, deadline: float) -> dict[str, Any]:
    """Cascade through the real store: one tier (SHM or file) of ``capacity x block_bytes``."""
    tier, policy = CASCADE_VIA_STORE[name]
    nbytes = capacity * block_bytes
    workdir = tempfile.mkdtemp(prefix=f"replay_{name}_", dir=file_dir)
    cfg = Config(shm_bytes=nbytes if tier == "shm" else 0, file_bytes=nbytes if tier == "file" else 0,
                 file_dir=workdir, policy=policy)
    done = [0]
    try:
        with CascadeStore(cfg, block_spec=BlockSpec.flat(block_bytes)) as store:
            r = replay(store, _until(requests, deadline, done), tokens_per_block=tokens_per_block, pin_in_flight=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = {k: v for k, v in r.as_dict().items() if k != "store_stats"}
    out.update(requests=done[0], policy=policy, observed_via="CascadeStore.get_into (real store, parents + pins)",
               tier=tier, resident_blocks=r.store_stats.get("blocks"),
               resident_check={"method": "CascadeStore.stats()['blocks'] at the end"},
               store_evictions=sum(t.get("evictions", 0) for t in r.store_stats.get("tiers", {}).values()))
    return out


def _stamped(key: np.ndarray, block_id: str) -> np.ndarray:
    """A copy of ``key`` whose first bytes are ``block_id``'s (so every block differs)."""
    stamp = np.frombuffer(block_id.encode(), dtype=np.uint8)[:key.size]
    out = key.copy()
    out[:stamp.size] = stamp
    return out


def replay_adapter(name: str, requests: Sequence[Request], capacity: int, block_bytes: int, tokens_per_block: int,
                   file_dir: str, deadline: float) -> dict[str, Any]:
    """A peer through its adapter: ``get_into`` observes a hit, a miss is ``put``. Each
    block's key starts with its own id (:func:`_stamped`) and every hit is checked whole:
    a block returned with other bytes counts in ``wrong``, not as a hit."""
    half = block_bytes // 2
    rng = np.random.default_rng(0)
    key = rng.integers(0, 256, half, dtype=np.uint8)
    value = rng.integers(0, 256, half, dtype=np.uint8)
    outs = common.aligned_pair(half)
    res = {"requests": 0, "references": 0, "hits": 0, "prefix_hits": 0, "tokens": 0, "hit_tokens": 0, "rejected": 0,
           "wrong": 0}
    recent: dict[str, None] = {}  # ids by last reference, oldest first
    with common.started(name, capacity * block_bytes, file_dir) as adapter:
        for request in requests:
            if time.monotonic() > deadline:
                break
            res["requests"] += 1
            leading = True
            for i, (bid, _) in enumerate(block_chain(request.hash_ids, "default")):
                tokens = min(tokens_per_block, max(request.input_length - i * tokens_per_block, 0)) or tokens_per_block
                res["references"] += 1
                res["tokens"] += tokens
                recent.pop(bid, None)
                recent[bid] = None
                if adapter.get_into(bid, *outs):
                    if np.array_equal(outs[0], _stamped(key, bid)) and np.array_equal(outs[1], value):
                        res["hits"] += 1
                        res["hit_tokens"] += tokens
                        res["prefix_hits"] += leading
                        continue
                    res["wrong"] += 1  # returned, but not this block's bytes: a miss
                leading = False
                try:
                    adapter.put(bid, _stamped(key, bid), value)
                except (OSError, MemoryError):
                    res["rejected"] += 1
        adapter.flush()
        versions = adapter.versions()
        t0 = time.perf_counter()
        window = list(recent)[-(3 * capacity) // 2:]
        res["resident_blocks"] = sum(adapter.contains(b) for b in window)
        res["resident_check"] = {"method": "contains() of the 1.5 x capacity most recently referenced ids",
                                 "ids_checked": len(window), "seconds": time.perf_counter() - t0}
    res["block_hit_ratio"] = res["hits"] / res["references"] if res["references"] else 0.0
    res["token_hit_ratio"] = res["hit_tokens"] / res["tokens"] if res["tokens"] else 0.0
    res.update(policy="internal", observed_via="adapter get_into", versions=versions)
    return res


def run(options: dict[str, Any]) -> dict[str, Any]:
    """Options: ``system``, ``capacities`` (blocks), ``trace``, ``requests`` (the prefix
    every system replays for the comparison), ``full_trace`` (default True: Cascade also
    replays the whole trace) at ``full_capacities`` (default: ``capacities``), ``sizes`` (one block size), ``time_limit`` (s per
    replay), ``file_dir``."""
    block_bytes = common.one_size(options, BLOCK_BYTES, "trace_replay")
    requests, source, tpb = load_requests(options)
    capacities = options.get("capacities") or CAPACITIES
    systems = common.select(options.get("system") or "all", SYSTEMS)
    limit = float(options.get("time_limit") or TIME_LIMIT_S)
    file_dir = options.get("file_dir") or Config().file_dir
    os.makedirs(file_dir, exist_ok=True)
    refs: dict[tuple[int, int], dict[str, Any]] = {}

    def reference(n: int, capacity: int) -> dict[str, Any]:
        if (n, capacity) not in refs:
            refs[(n, capacity)] = {"requests": n, "capacity_blocks": capacity, **{
                p: _stats(simulate(requests[:n], p, capacity, tpb)) for p in ("lru", "belady")}}
        return refs[(n, capacity)]

    system_rows: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    load = [common.loadavg()]
    compare = min(int(options.get("requests") or COMPARE_REQUESTS), len(requests))
    full = len(requests)
    full_caps = options.get("full_capacities") or capacities
    plan = [(name, "compare", compare, capacities) for name in systems]
    if options.get("full_trace") is not False and full > compare:
        plan += [(name, "full", full, full_caps) for name in systems if name in FULL_TRACE]
    for name, scope, n, caps in tqdm(plan, desc="trace_replay", unit="replay"):
        prefix = requests[:n]
        for capacity in caps:
            def go() -> list[dict[str, Any]]:
                fn = replay_store if name in CASCADE_VIA_STORE else replay_adapter
                t0 = time.perf_counter()
                got = fn(name, prefix, capacity, block_bytes, tpb, file_dir, time.monotonic() + limit)
                got["elapsed_s"] = time.perf_counter() - t0
                return [got]
            got, problem = common.run_system(name, go)
            if problem:
                problems.append({**problem, "capacity_blocks": capacity, "scope": scope})
                continue
            row = got[0]
            ref = reference(row["requests"], capacity)
            lru, belady = ref["lru"]["block_hit_ratio"], ref["belady"]["block_hit_ratio"]
            gap = belady - lru
            row.update({"system": name, "scope": scope, "capacity_blocks": capacity,
                        "capacity_bytes": capacity * block_bytes,
                        "block_bytes": block_bytes, "prefix_requests": len(prefix),
                        "truncated": row["requests"] < len(prefix),
                        "lru_block_hit_ratio": lru, "belady_block_hit_ratio": belady,
                        "gap_closed": (row["block_hit_ratio"] - lru) / gap if gap > 0 else 0.0,
                        "vs_lru": row["block_hit_ratio"] / lru if lru else None,
                        "vs_belady": row["block_hit_ratio"] / belady if belady else None,
                        "us_per_reference": 1e6 * row["elapsed_s"] / max(row["references"], 1)})
            system_rows.append(row)
    load.append(common.loadavg())
    # Ratios only between complete replays of the same requests at the same capacity.
    common.add_ratios([r for r in system_rows if r["scope"] == "compare" and not r["truncated"]],
                      "block_hit_ratio", ("capacity_blocks", "requests"))
    for r in system_rows:
        r.setdefault("vs_systems", {})
    rows = []
    for capacity in sorted(set(capacities) | set(full_caps if any(r["scope"] == "full" for r in system_rows) else [])):
        has_full = any(r["scope"] == "full" and r["capacity_blocks"] == capacity for r in system_rows)
        ref = reference(full if has_full else compare, capacity)
        row: dict[str, Any] = {"capacity_blocks": capacity, "reference_lru": ref["lru"], "reference_belady": ref["belady"]}
        for name, key in (("cascade", "cascade_semantic"), ("cascade_lru", "cascade_lru")):
            r = common.find(system_rows, system=name, capacity_blocks=capacity, requests=ref["requests"])
            if r is not None:
                row[key] = {**r, "prefill_saving": r["token_hit_ratio"]}
        rows.append(row)
    targets = [_gap_target(system_rows, 5000)]
    return {"schema": "cascade-bench/trace_replay/3", "source": source, "requests": full,
            "compare_requests": compare, "full_trace_systems": [n for n, sc, _, _ in plan if sc == "full"],
            "full_capacities": full_caps if any(sc == "full" for _, sc, _, _ in plan) else [],
            "tokens_per_block": tpb, "block_bytes": block_bytes, "capacities": capacities, "systems": systems,
            "time_limit_s": limit,
            "rows": rows, "system_rows": system_rows, "references": list(refs.values()),
            "not_run": problems, "targets": targets, "loadavg_before_after": load}


def _stats(s) -> dict[str, Any]:
    return {"block_hit_ratio": s.block_hit_ratio, "token_hit_ratio": s.token_hit_ratio,
            "hits": s.hits, "references": s.references}


def _gap_target(rows: list[dict[str, Any]], capacity: int) -> dict[str, Any]:
    r = common.find(rows, system="cascade", capacity_blocks=capacity, scope="full") or \
        common.find(rows, system="cascade", capacity_blocks=capacity)
    out = {"name": "cascade semantic policy closes >= 40% of the LRU-to-Belady gap", "system": "cascade",
           "metric": "gap_closed", "threshold": 0.4, "capacity_blocks": capacity}
    if r is None:
        return {**out, "value": None, "met": None, "note": "not measured in this run"}
    return {**out, "value": r["gap_closed"], "met": r["gap_closed"] >= 0.4, "requests": r["requests"]}


def table(result: dict[str, Any]) -> str:
    lines = [f"trace: {result['source']} ({result['requests']} requests), {result['block_bytes'] >> 10} KiB blocks",
             f"{'system':<17} {'scope':<7} {'capacity':>8} {'requests':>8} {'refs':>7} {'hit':>7} {'token':>7} {'LRU':>7} "
             f"{'Belady':>7} {'gap':>7} {'held':>6} {'rej':>5} {'us/ref':>7}"]
    for r in result["system_rows"]:
        lines.append(f"{r['system']:<17} {r['scope']:<7} {r['capacity_blocks']:>8} {r['requests']:>8}{'*' if r['truncated'] else ' '}"
                     f"{r['references']:>6} {r['block_hit_ratio']:>7.2%} {r['token_hit_ratio']:>7.2%} "
                     f"{r['lru_block_hit_ratio']:>7.2%} {r['belady_block_hit_ratio']:>7.2%} {r['gap_closed']:>7.1%} "
                     f"{r.get('resident_blocks') if r.get('resident_blocks') is not None else '-':>6} "
                     f"{r['rejected']:>5} {r['us_per_reference']:>7.0f}")
    for p in result["not_run"]:
        lines.append(f"{p['system']:<17} {p['capacity_blocks']:>8} {p['status']}: {p['reason'][:150]}")
    for t in result["targets"]:
        v = "n/a" if t["value"] is None else f"{t['value']:.1%}"
        lines.append(f"target {t['name']} @ {t['capacity_blocks']} blocks: {v} "
                     f"{ {True: 'MET', False: 'MISSED', None: 'not measured'}[t['met']]}")
    return "\n".join(lines)
