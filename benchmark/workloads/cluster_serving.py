"""cluster_serving: engines attached to ``cascade serve`` ranks share one cache.

Two parts (``sizes``: block bytes, default 64 KiB and 2 MiB):

* attach cost, per size: one rank of ``cascade serve`` and, beside it, the same store
  in this process (same config, SHM tier in /dev/shm). ``blocks`` blocks are put one by one, then read one by one
  hot (after an untimed pass), the two taking turns block by block, then read as one batch (``get_many_into``, one request per
  staging-full), then put again under new ids as one batch (``put_many``). Reported:
  per-block put and get latency (p50/p90/p99/max) and batch get / put GB/s of each,
  ``attached / in-process`` of the p50s (the price of the extra copy through the
  staging region and the socket round trip), the channel's round trip alone (a one-id
  lookup) and the machine's load average: on a loaded machine each round trip also
  waits for the scheduler to run the rank's thread and then the client again.
* serving, at the first size (``--ranks`` ranks, default 2): one client process per rank
  replays its share (request ``i`` goes to client ``i mod N``) of the built-in
  shared-prefix workload (or ``--trace``; ``requests`` of it) through its rank with
  :func:`cascade.replay.replay`; then the same shares are replayed by private
  per-worker in-process stores of the same capacity (today's LMCache plugin without an
  endpoint). Reported: per-client and global block hit ratio, shared vs private, and the
  bytes served from other ranks (the ranks' ``cluster_hits`` x block bytes).

The replay goes through :class:`cascade.serve.CascadeClient`, not through LMCache (that
path is tested with a real LMCache StorageManager in tests/test_serve.py; LMCache's own
CPU and disk backends are not part of this workload yet).
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
from cascade.replay import replay
from cascade.serve import connect
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
    in_process, attached = result["in_process"], result["attached"]
    ratio = {op: attached[op]["p50"] / in_process[op]["p50"] for op in ("put", "get")}
    return {"block_bytes": size, "blocks": blocks, "load_average": os.getloadavg(),
            "in_process": in_process, "attached": attached,
            "attached_over_in_process_p50": ratio,
            "attach_cost_us_p50": {op: 1e6 * (attached[op]["p50"] - in_process[op]["p50"]) for op in ("put", "get")}}


def _requests(options: dict[str, Any]) -> list:
    limit = options.get("requests") or REQUESTS
    if options.get("trace"):
        return read_trace(options["trace"], limit)
    return generate(WorkloadParams(), seed=options.get("seed") or 0)[:limit]


def serving(size: int, ranks: int, options: dict[str, Any], workdir: str) -> dict[str, Any]:
    requests = _requests(options)
    tpb = 512 if options.get("trace") else WorkloadParams().tokens_per_block
    shm = SERVING_CAPACITY * size
    clients = []
    with ServeJob(os.path.join(workdir, "serving"), ranks, block_bytes=size, shm=str(shm), shm_dir="/dev/shm") as job:
        env = {**os.environ, "PYTHONPATH": ROOT}
        procs = [subprocess.Popen([sys.executable, "-m", "benchmark.workloads.cluster_serving", job.socket(r),
                                   str(r), str(ranks), str(len(requests)), options.get("trace") or "", str(tpb),
                                   str(options.get("seed") or 0)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
                 for r in range(ranks)]
        for proc in procs:
            out, err = proc.communicate(timeout=1800)
            if proc.returncode:
                raise RuntimeError(f"serving client failed: {err[-2000:]}")
            clients.append(json.loads(out.strip().splitlines()[-1]))
        rank_stats = []
        for r in range(ranks):
            with connect(job.socket(r)) as c:
                rank_stats.append(c.stats())
    private = []
    for r in range(ranks):
        pdir = tempfile.mkdtemp(dir=workdir)
        with CascadeStore(Config(shm_bytes=shm, file_bytes=0, file_dir=pdir),
                          block_spec=BlockSpec.flat(size)) as store:
            private.append(replay(store, requests[r::ranks], tokens_per_block=tpb).as_dict() | {"store_stats": None})

    def ratio(results: list[dict]) -> float:
        return sum(x["hits"] for x in results) / max(1, sum(x["references"] for x in results))
    return {"block_bytes": size, "ranks": ranks, "requests": len(requests), "capacity_blocks_per_rank": SERVING_CAPACITY,
            "shared": {"per_client": [c["block_hit_ratio"] for c in clients], "global": ratio(clients),
                       "seconds_per_client": [c["seconds"] for c in clients],
                       "bytes_from_other_ranks": size * sum(s["cluster_hits"] for s in rank_stats)},
            "private": {"per_client": [p["block_hit_ratio"] for p in private], "global": ratio(private)}}


def run(options: dict[str, Any]) -> dict[str, Any]:
    sizes = options.get("sizes") or SIZES
    blocks = options.get("blocks") or BLOCKS
    seed = options.get("seed") or 0
    ranks = options.get("ranks") if (options.get("ranks") or 1) > 1 else 2
    workdir = tempfile.mkdtemp(prefix="cluster_serving_", dir=options.get("file_dir"))
    try:
        return {"attach": [attach_cost(size, blocks, tempfile.mkdtemp(dir=workdir), seed) for size in sizes],
                "serving": serving(sizes[0], ranks, options, workdir),
                "note": "attached = a client process through cascade serve (one extra copy through its staging "
                        "region + a Unix-socket round trip per request); in_process = the same store in the caller"}
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
    lines.append(f"serving ({s['ranks']} clients over {s['ranks']} ranks, {s['requests']} requests, "
                 f"{s['block_bytes'] >> 10} KiB blocks): hit ratio shared {s['shared']['global']:.1%} "
                 f"(per client {', '.join(f'{x:.1%}' for x in s['shared']['per_client'])}), private "
                 f"{s['private']['global']:.1%}; {s['shared']['bytes_from_other_ranks'] / 2**20:.1f} MiB from other ranks")
    return "\n".join(lines)


def _client(argv: list[str]) -> None:
    """One serving client process: replay requests ``i::n`` through the rank at SOCKET."""
    path, i, n, limit, trace, tpb, seed = argv
    requests = (read_trace(trace, int(limit)) if trace else generate(WorkloadParams(), seed=int(seed))[:int(limit)])
    with connect(path) as client:
        t0 = time.perf_counter()
        result = replay(client, requests[int(i)::int(n)], tokens_per_block=int(tpb))
        seconds = time.perf_counter() - t0
    print(json.dumps(result.as_dict() | {"store_stats": None, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    _client(sys.argv[1:])
