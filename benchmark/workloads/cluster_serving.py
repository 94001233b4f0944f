"""cluster_serving: engines attached to ``cascade serve`` ranks share one cache.

Two parts (``sizes``: block bytes, default 64 KiB and 2 MiB):

* attach cost, per size: one rank of ``cascade serve`` and, beside it, the same store
  in this process (same config, SHM tier in /dev/shm). ``blocks`` blocks are put one by one, then read one by one
  hot (after an untimed pass), the two taking turns block by block, then read as one batch (``get_many_into``, one request per
  staging-full), then put again under new ids as one batch (``put_many``). Reported:
  per-block put and get latency (p50/p90/p99/max) and batch get / put GB/s of each,
  ``attached / in-process`` of the p50s (the price of the socket round trip, of the
  lease a read takes on the rank's slab, and of a put's extra copy through the staging
  region), the channel's round trip alone (a one-id
  lookup) and the machine's load average: on a loaded machine each round trip also
  waits for the scheduler to run the rank's thread and then the client again.
  ``put_breakdown_us_p50`` splits the attached put's p50 into the client's staging copy
  (timed alone), one round trip, the store's put (the in-process p50) and the rest (that
  waiting).
* serving, at the first size (``--ranks`` ranks, default 2): one engine process per rank,
  each a real LMCache 0.5.x ``StorageManager`` (CPU torch; :mod:`.serving_client`),
  replays its share (request ``i`` goes to engine ``i mod N``) of the built-in
  shared-prefix workload (or ``--trace``; ``requests`` of it) as LMCache's engine does
  (cached prefix looked up and read, the rest stored), three ways, the engines of one way
  running at once: ``shared`` (the Cascade plugin attached to its rank with
  ``cascade.endpoint``), ``private`` (the Cascade plugin without an endpoint: a store
  private to each engine, today's behaviour) and ``lmcache_cpu_disk`` (LMCache's own
  ``LocalCPUBackend`` + ``LocalDiskBackend``, private to each engine as LMCache runs them),
  each with ``SERVING_CAPACITY`` blocks per engine (per rank when shared; LMCache gets that
  much CPU and that much disk). Reported per way: per-engine and global block hit ratio
  (a hit is a chunk of the request's cached prefix), chunks read back wrong (must be 0),
  the engines' per-block get / put latency (p50 per engine) and GB/s, lookup per request;
  for ``shared`` also the bytes served from other ranks (the ranks' ``cluster_hits`` x
  block bytes), and ``attached_over_private_p50``: the engines' per-block get and put
  latency attached over in-process (through LMCache; an in-process put returns before
  the store has it, an attached one after).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from cascade import CascadeStore, Config
from cascade.models import BlockSpec
from cascade.serve import connect
from cascade.testing.children import die_with_parent
from cascade.testing.serve_job import ROOT, ServeJob
from cascade.trace import read_trace
from cascade.workload import WorkloadParams, generate

from ..timing import gbps, summarize

SIZES = [64 << 10, 2 << 20]
BLOCKS = 64
REQUESTS = 300
SERVING_CAPACITY = 4096  # blocks per rank (and per private store) in the serving part


def _interleaved(stores: dict[str, Any], op, n: int) -> dict[str, list[float]]:
    """Seconds of ``op(name, store, i)`` for ``i`` in ``range(n)``, the stores taking turns
    block by block (so a change of the machine's load hits both alike)."""
    samples: dict[str, list[float]] = {name: [] for name in stores}
    for i in range(n):
        for name, store in stores.items():
            t0 = time.perf_counter()
            op(name, store, i)
            samples[name].append(time.perf_counter() - t0)
    return samples


def _batch(store: Any, pairs: list, ids: list[str]) -> dict[str, Any]:
    """Batch get and put GB/s of one store (after an untimed batch get), and whether the
    batch read back every block byte-exact."""
    spec = store.spec
    outs = [spec.empty() for _ in ids]
    store.get_many_into(ids, outs)  # untimed: the reader threads start
    t0 = time.perf_counter()
    hits = store.get_many_into(ids, outs)
    batch_get_s = time.perf_counter() - t0
    exact = all(np.array_equal(o[0], p[0]) and np.array_equal(o[1], p[1]) for o, p in zip(outs, pairs))
    fresh = [f"{'f' * 8}{block_id[8:]}" for block_id in ids]  # same bytes, new ids: stored again
    t0 = time.perf_counter()
    store.put_many(pairs, block_ids=fresh)
    batch_put_s = time.perf_counter() - t0
    nbytes = spec.block_bytes * len(ids)
    return {"batch_get_gbps": gbps(nbytes, batch_get_s), "batch_put_gbps": gbps(nbytes, batch_put_s),
            "hits": sum(hits), "exact": exact}


def attach_cost(size: int, blocks: int, workdir: str, seed: int) -> dict[str, Any]:
    spec = BlockSpec.flat(size)
    rng = np.random.default_rng(seed)
    pairs = [(rng.integers(0, 256, spec.shape, dtype=np.uint8), rng.integers(0, 256, spec.shape, dtype=np.uint8))
             for _ in range(blocks)]
    ids = [f"{seed:08x}{i:024x}" for i in range(blocks)]
    shm = 3 * blocks * size + (16 << 20)  # every block twice (single and batch puts), no eviction
    local_dir = os.path.join(workdir, "local")
    os.makedirs(local_dir)
    with CascadeStore(Config(shm_bytes=shm, file_bytes=0, file_dir=local_dir), block_spec=spec) as store, \
            ServeJob(os.path.join(workdir, "served"), 1, block_bytes=size, shm=str(shm), shm_dir="/dev/shm") as job, \
            connect(job.socket(0), staging_bytes=max(64 << 20, 8 * size)) as client:
        stores = {"in_process": store, "attached": client}
        outs = {name: s.spec.empty() for name, s in stores.items()}
        put = _interleaved(stores, lambda name, s, i: s.put(*pairs[i], block_id=ids[i]), blocks)
        _interleaved(stores, lambda name, s, i: s.get_into(ids[i], *outs[name]), blocks)  # untimed: first reads
        get = _interleaved(stores, lambda name, s, i: s.get_into(ids[i], *outs[name]), blocks)
        result = {name: {"put": summarize(put[name]), "get": summarize(get[name]), **_batch(s, pairs, ids)}
                  for name, s in stores.items()}
        # the channel alone: a one-id lookup (no block bytes) per round trip
        lookups = _interleaved({"attached": client}, lambda name, s, i: s.contains(ids[i]), blocks)
        result["attached"]["lookup_rtt"] = summarize(lookups["attached"])
        # the client's copy into its staging slot alone (the first step of every attached put)
        copies = _interleaved({"attached": client}, lambda name, s, i: s._fill(0, *pairs[i]), blocks)
        result["attached"]["staging_copy"] = summarize(copies["attached"])
    in_process, attached = result["in_process"], result["attached"]
    ratio = {op: attached[op]["p50"] / in_process[op]["p50"] for op in ("put", "get")}
    return {"block_bytes": size, "blocks": blocks, "load_average": os.getloadavg(),
            "in_process": in_process, "attached": attached,
            "attached_over_in_process_p50": ratio,
            "attach_cost_us_p50": {op: 1e6 * (attached[op]["p50"] - in_process[op]["p50"]) for op in ("put", "get")},
            "put_breakdown_us_p50": _put_breakdown(in_process, attached)}


def _put_breakdown(in_process: dict[str, Any], attached: dict[str, Any]) -> dict[str, float]:
    """An attached put's p50, in parts: the staging copy, one channel round trip, the
    store's own put (the in-process p50: the rank runs the same store), and the rest
    (waiting for a CPU for the rank's thread and the client's wake-up: grows with load;
    p50s do not add exactly, so near zero it may come out negative)."""
    parts = {"staging_copy": attached["staging_copy"]["p50"], "round_trip": attached["lookup_rtt"]["p50"],
             "store_put": in_process["put"]["p50"]}
    parts["rest"] = attached["put"]["p50"] - sum(parts.values())
    return {name: 1e6 * seconds for name, seconds in parts.items()}


def requests_of(spec: dict[str, Any]) -> list:
    """The requests of the serving part: ``spec["requests"]`` of ``spec["trace"]`` or of
    the built-in workload (seed ``spec["seed"]``)."""
    if spec.get("trace"):
        return read_trace(spec["trace"], spec["requests"])
    return generate(WorkloadParams(), seed=spec.get("seed") or 0)[:spec["requests"]]


def _engines(mode: str, args: list[str], spec: dict[str, Any], size: int, workdir: str) -> list[dict[str, Any]]:
    """Run one engine process per entry of ``args`` at once (``serving_client``), each
    replaying its share of the requests in ``mode``; their results."""
    env = {**os.environ, "PYTHONPATH": ROOT, "LMCACHE_TRACK_USAGE": "false",
           "LMCACHE_LOG_LEVEL": os.environ.get("LMCACHE_LOG_LEVEL", "ERROR")}
    procs = []
    for i, arg in enumerate(args):
        engine_dir = tempfile.mkdtemp(prefix=f"{mode}{i}_", dir=workdir)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "benchmark.workloads.serving_client", mode, arg, str(i), str(len(args)), str(size),
             engine_dir, json.dumps(spec)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
            preexec_fn=die_with_parent))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        if proc.returncode:
            raise RuntimeError(f"{mode} serving engine failed: {err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _side(engines: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-engine (lists) and global (numbers) figures of one way of serving; a latency's
    global figure is the median over engines of each engine's p50."""
    refs = sum(e["references"] for e in engines)

    def us(op: str) -> list[float | None]:
        return [1e6 * e[op]["p50"] if e[op] else None for e in engines]

    def median(xs: list[float | None]) -> float | None:
        xs = [x for x in xs if x is not None]
        return float(np.median(xs)) if xs else None
    side = {"per_client": [e["block_hit_ratio"] for e in engines],
            "global": sum(e["hits"] for e in engines) / max(1, refs),
            "references": refs, "wrong_chunks": sum(e["wrong"] for e in engines),
            "seconds_per_client": [e["seconds"] for e in engines],
            "get_us_per_block_p50": us("get_per_block"), "put_us_per_block_p50": us("put_per_block"),
            "lookup_us_per_request_p50": us("lookup_per_request"),
            "get_gbps_per_client": [e["get_gbps"] for e in engines],
            "put_gbps_per_client": [e["put_gbps"] for e in engines], "backends": engines[0]["backends"]}
    side |= {"get_us_p50": median(side["get_us_per_block_p50"]), "put_us_p50": median(side["put_us_per_block_p50"]),
             "lookup_us_p50": median(side["lookup_us_per_request_p50"]),
             "get_gbps": median(side["get_gbps_per_client"]), "put_gbps": median(side["put_gbps_per_client"])}
    return side


def serving(size: int, ranks: int, options: dict[str, Any], workdir: str) -> dict[str, Any]:
    spec = {"requests": options.get("requests") or REQUESTS, "trace": options.get("trace") or "",
            "seed": options.get("seed") or 0}
    capacity = SERVING_CAPACITY * size
    with ServeJob(os.path.join(workdir, "serving"), ranks, block_bytes=size, shm=str(capacity),
                  shm_dir="/dev/shm") as job:
        shared = _engines("attached", [job.socket(r) for r in range(ranks)], spec, size, workdir)
        rank_stats = []
        for r in range(ranks):
            with connect(job.socket(r)) as c:
                rank_stats.append(c.stats())
    private = _engines("private", [str(capacity)] * ranks, spec, size, workdir)
    lmcache = _engines("lmcache", [str(capacity)] * ranks, spec, size, workdir)
    result = {"block_bytes": size, "ranks": ranks, "requests": len(requests_of(spec)),
              "capacity_blocks_per_rank": SERVING_CAPACITY, "chunk_bytes": shared[0]["chunk_bytes"],
              "shared": _side(shared) | {"bytes_from_other_ranks": size * sum(s["cluster_hits"] for s in rank_stats)},
              "private": _side(private), "lmcache_cpu_disk": _side(lmcache)}
    result["attached_over_private_p50"] = {
        op: result["shared"][f"{op}_us_p50"] / result["private"][f"{op}_us_p50"]
        if result["shared"][f"{op}_us_p50"] and result["private"][f"{op}_us_p50"] else None for op in ("get", "put")}
    return result


def run(options: dict[str, Any]) -> dict[str, Any]:
    sizes = options.get("sizes") or SIZES
    blocks = options.get("blocks") or BLOCKS
    seed = options.get("seed") or 0
    ranks = options.get("ranks") if (options.get("ranks") or 1) > 1 else 2
    workdir = tempfile.mkdtemp(prefix="cluster_serving_", dir=options.get("file_dir"))
    try:
        return {"attach": [attach_cost(size, blocks, tempfile.mkdtemp(dir=workdir), seed) for size in sizes],
                "serving": serving(sizes[0], ranks, options, workdir),
                "note": "attached = a client process through cascade serve (a Unix-socket round trip per request; "
                        "reads copied straight from the rank's SHM slab under a lease, puts through the client's "
                        "staging region: one copy more); in_process = the same store in the caller"}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def table(result: dict[str, Any]) -> str:
    lines = ["size      op   in-process p50/p99 us   attached p50/p99 us   ratio  batch GB/s in-process/attached"]
    for a in result["attach"]:
        for op in ("put", "get"):
            i, t = a["in_process"][op], a["attached"][op]
            lines.append(f"{a['block_bytes'] >> 10:>6} KiB {op:4} {1e6 * i['p50']:>9.1f} /{1e6 * i['p99']:>9.1f}   "
                         f"{1e6 * t['p50']:>9.1f} /{1e6 * t['p99']:>9.1f}   {a['attached_over_in_process_p50'][op]:5.2f}"
                         + f"  {a['in_process'][f'batch_{op}_gbps']:.2f} / {a['attached'][f'batch_{op}_gbps']:.2f}")
    s = result["serving"]
    lines.append("channel round trip (one-id lookup) p50: " + ", ".join(
        f"{1e6 * a['attached']['lookup_rtt']['p50']:.0f} us" for a in result["attach"])
        + f"; load average {result['attach'][0]['load_average'][0]:.1f}")
    lines.append("attached put p50 = staging copy + round trip + store put + rest (us): " + "; ".join(
        f"{a['block_bytes'] >> 10} KiB " + " + ".join(f"{us:.0f}" for us in a["put_breakdown_us_p50"].values())
        for a in result["attach"]))
    lines.append(f"serving through LMCache ({s['ranks']} engines, {s['requests']} requests, "
                 f"{s['block_bytes'] >> 10} KiB blocks): hit ratio / per engine / get, put us per block p50 / wrong")
    for way in ("shared", "private", "lmcache_cpu_disk"):
        w = s[way]
        lines.append(f"  {way:17} {w['global']:6.1%}  " + ", ".join(f"{x:.1%}" for x in w["per_client"])
                     + "  " + ", ".join(f"{_us(g)}/{_us(p)}" for g, p in zip(w["get_us_per_block_p50"],
                                                                         w["put_us_per_block_p50"]))
                     + f"  {w['wrong_chunks']}")
    lines.append(f"  {s['shared']['bytes_from_other_ranks'] / 2**20:.1f} MiB served from other ranks; attached over "
                 f"in-process per block p50: get {_fmt(s['attached_over_private_p50']['get'])}, "
                 f"put {_fmt(s['attached_over_private_p50']['put'])}")
    return "\n".join(lines)


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
