"""Client processes for the ``cascade serve`` tests (tests/test_serve.py): each runs in
its own process, attaches to one rank's socket, and prints one JSON line of results.

``python -m cascade.testing.serve_client MODE SOCKET ...``

* ``lmcache-store SOCKET N`` / ``lmcache-fetch SOCKET N``: a real LMCache 0.5.x
  ``StorageManager`` (CPU torch) with the Cascade plugin attached to SOCKET stores /
  reads back the N chunks of one prompt; fetch reports hits and whether every chunk
  came back byte-exact. ``lmcache-wait SOCKET N`` attaches, prints ``attached``, waits
  for a line on stdin, then fetches (to see a lost rank served as misses).
* ``put-forever SOCKET``: pins :data:`PINNED` blocks of its own, prints ``pinned``,
  then puts batches of known blocks until it is killed (printing each batch's end).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import blake3
import numpy as np

PINNED = 3
BATCH = 16


def block_of(index: int, spec) -> tuple[str, np.ndarray, np.ndarray]:
    """Block number ``index`` of ``put-forever``: its id and its (key, value) bytes."""
    rng = np.random.default_rng(index)
    key = rng.integers(0, 256, spec.shape, dtype=np.uint8).view(spec.np_dtype)
    value = rng.integers(0, 256, spec.shape, dtype=np.uint8).view(spec.np_dtype)
    return blake3.blake3(b"put-forever/%d" % index).hexdigest()[:32], key, value


def put_forever(path: str) -> None:
    from cascade.serve import connect

    client = connect(path)
    ids = []
    for i in range(PINNED):
        block_id, key, value = block_of(1_000_000 + i, client.spec)
        client.put(key, value, block_id=block_id)
        client.pin(block_id)
        ids.append(block_id)
    print(json.dumps({"pinned": ids}), flush=True)
    start = 0
    while True:
        blocks = [block_of(i, client.spec) for i in range(start, start + BATCH)]
        client.put_many([(k, v) for _, k, v in blocks], block_ids=[b for b, _, _ in blocks])
        start += BATCH
        print(json.dumps({"done": start}), flush=True)


CHUNK = 16
KV_SHAPE = (2, 2, CHUNK, 2, 8)  # layers, K/V, tokens, heads, head dim


def _lmcache(path: str):
    os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
    prom = tempfile.mkdtemp(prefix="prom-")
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", prom)
    import torch
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.event_manager import EventManager
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    extra = {"storage_plugin.cascade.module_path": "cascade.integrations.lmcache_backend",
             "storage_plugin.cascade.class_name": "CascadeBackend", "cascade.endpoint": path}
    cfg = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.05,
                                            storage_plugins=["cascade"], extra_config=extra, save_unfull_chunk=True)
    meta = LMCacheMetadata(model_name="tiny-test", world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=torch.float16, kv_shape=KV_SHAPE, role="worker",
                           chunk_size=CHUNK)
    return StorageManager(cfg, meta, EventManager())


def _prompt(n: int):
    """Keys and KV of the n chunks of one prompt (chained chunk hashes, seeded KV)."""
    import torch
    from lmcache.utils import CacheEngineKey

    keys, kvs, prev = [], [], b""
    for i in range(n):
        prev = blake3.blake3(prev + b"chunk %d" % i).digest()
        keys.append(CacheEngineKey("tiny-test", 1, 0, int.from_bytes(prev[:8], "little"), torch.float16))
        shape = torch.Size([2, KV_SHAPE[0], CHUNK, KV_SHAPE[3] * KV_SHAPE[4]])
        kvs.append(torch.randn(shape, generator=torch.Generator().manual_seed(i)).to(torch.float16))
    return keys, kvs


def lmcache_store(path: str, n: int) -> dict:
    from lmcache.v1.memory_management import MemoryFormat

    sm = _lmcache(path)
    try:
        keys, kvs = _prompt(n)
        for key, kv in zip(keys, kvs):
            obj = sm.allocate(kv.shape, kv.dtype, MemoryFormat.KV_2LTD)
            obj.tensor.copy_(kv)
            sm.batched_put([key], [obj])
        backend = sm.storage_backends["cascade"]
        stored = sum(backend.contains(k) for k in keys)
        return {"stored": stored, "rank": backend.store.stats().get("rank")}
    finally:
        sm.close()


def lmcache_fetch(path: str, n: int, sm=None) -> dict:
    import torch

    sm = sm or _lmcache(path)
    try:
        keys, kvs = _prompt(n)
        hits = exact = 0
        for key, kv in zip(keys, kvs):
            if sm.contains(key) != "cascade":
                continue
            got = sm.batched_get([key], location="cascade")[0]
            if got is None:
                continue
            hits += 1
            exact += bool(torch.equal(got.tensor.view(torch.uint8), kv.view(torch.uint8)))
            got.ref_count_down()
        return {"hits": hits, "misses": n - hits, "exact": exact,
                "rank_stats": sm.storage_backends["cascade"].store.stats()}
    finally:
        sm.close()


def main(argv: list[str]) -> None:
    mode, path = argv[0], argv[1]
    if mode == "put-forever":
        put_forever(path)
    elif mode == "lmcache-store":
        print(json.dumps(lmcache_store(path, int(argv[2]))), flush=True)
    elif mode == "lmcache-fetch":
        print(json.dumps(lmcache_fetch(path, int(argv[2])), default=str), flush=True)
    elif mode == "lmcache-wait":
        sm = _lmcache(path)
        print("attached", flush=True)
        sys.stdin.readline()
        print(json.dumps(lmcache_fetch(path, int(argv[2]), sm), default=str), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
