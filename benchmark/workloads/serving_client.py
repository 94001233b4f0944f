"""One serving engine of the cluster_serving workload: a real LMCache 0.5.x
``StorageManager`` (CPU torch, no vLLM) replays its share of a shared-prefix trace.

``python -m benchmark.workloads.serving_client MODE ARG CLIENT CLIENTS BLOCK_BYTES DIR SPEC``
prints one JSON line. ``SPEC`` is the JSON of the requests to replay (see
``cluster_serving._requests``). ``MODE``:

* ``attached``: the Cascade plugin attached to the ``cascade serve`` rank at socket ``ARG``
  (``cascade.endpoint``): every engine shares the cluster cache;
* ``private``: the Cascade plugin without an endpoint: an in-process store of ``ARG`` bytes
  (SHM tier, no file tier) private to this engine (today's behaviour);
* ``lmcache``: LMCache's own ``LocalCPUBackend`` + ``LocalDiskBackend`` (``ARG`` bytes
  each, the disk under ``DIR``), private to this engine as LMCache runs them.

In the Cascade modes LMCache's CPU backend is its allocator only (``local_cpu=False``), so
every hit is Cascade's. Per request, as LMCache's engine does: ``batched_contains`` gives
the cached prefix, ``batched_get`` reads it (per backend holding part of it), and the rest
(recomputed) is stored with ``batched_put``. A trace block is one LMCache chunk of
``BLOCK_BYTES - 4096`` bytes (fp16 ``[2, 1, 16, n]``; the plugin's 256-byte header and
padding fill the block); its first 16 bytes are the block id, so every read is checked.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any


from cascade.trace import block_chain

from ..adapters.lmcache_adapter import _import_lmcache
from ..timing import gbps, summarize

CHUNK_TOKENS = 16
MODEL = "cluster-serving"
_PLUGIN = {"storage_plugin.cascade.module_path": "cascade.integrations.lmcache_backend",
           "storage_plugin.cascade.class_name": "CascadeBackend"}
_GIB = float(1 << 30)


def chunk_hidden(block_bytes: int) -> int:
    """Hidden size ``n`` of the fp16 ``[2, 1, CHUNK_TOKENS, n]`` chunk stored in one block."""
    hidden = (block_bytes - 4096) // (2 * CHUNK_TOKENS * 2)
    if hidden < 1:
        raise ValueError(f"blocks of {block_bytes} bytes hold no chunk (at least 8 KiB)")
    return hidden


def storage_manager(mode: str, arg: str, block_bytes: int, workdir: str, lm: dict[str, Any]) -> Any:
    """The engine's LMCache ``StorageManager`` in ``mode`` (see the module docstring)."""
    torch = lm["torch"]
    staging_gb = max(64 << 20, 256 * block_bytes) / _GIB  # LMCache's allocator: one request's chunks
    if mode == "attached":
        cfg = dict(local_cpu=False, max_local_cpu_size=staging_gb, storage_plugins=["cascade"],
                   extra_config={**_PLUGIN, "cascade.endpoint": arg})
    elif mode == "private":
        cfg = dict(local_cpu=False, max_local_cpu_size=staging_gb, storage_plugins=["cascade"],
                   extra_config={**_PLUGIN, "cascade.shm_bytes": arg, "cascade.file_bytes": "0",
                                 "cascade.block_bytes": str(block_bytes), "cascade.file_dir": workdir})
    elif mode == "lmcache":
        cfg = dict(local_cpu=True, max_local_cpu_size=int(arg) / _GIB, local_disk=workdir + "/",
                   max_local_disk_size=int(arg) / _GIB, cache_policy="LRU")
    else:
        raise ValueError(f"unknown mode {mode!r}")
    config = lm["LMCacheEngineConfig"].from_defaults(chunk_size=CHUNK_TOKENS, save_unfull_chunk=True, **cfg)
    metadata = lm["LMCacheMetadata"](model_name=MODEL, world_size=1, local_world_size=1, worker_id=0,
                                     local_worker_id=0, kv_dtype=torch.float16,
                                     kv_shape=(1, 2, CHUNK_TOKENS, 1, chunk_hidden(block_bytes)), role="worker",
                                     chunk_size=CHUNK_TOKENS)
    return lm["StorageManager"](config, metadata, lm["EventManager"]())


def replay(sm: Any, requests: list, block_bytes: int, lm: dict[str, Any]) -> dict[str, Any]:
    """Replay ``requests`` through ``sm`` as LMCache's engine would; hit counts, per-block
    get/put seconds and whether every chunk read back carried its own id."""
    torch = lm["torch"]
    shape = torch.Size([2, 1, CHUNK_TOKENS, chunk_hidden(block_bytes)])
    payload = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(torch.float16)
    chunk_bytes = payload.numel() * 2
    fmt = lm["MemoryFormat"].KV_2LTD
    references = hits = wrong = 0
    lookup, get, put = [], [], []
    get_s = put_s = 0.0
    gets = puts = 0
    for request in requests:
        chain = [bid for bid, _ in block_chain(request.hash_ids)]
        keys = [lm["CacheEngineKey"](MODEL, 1, 0, int(bid, 16), torch.float16) for bid in chain]
        references += len(keys)
        t0 = time.perf_counter()
        hit, mapping = sm.batched_contains(keys)
        lookup.append(time.perf_counter() - t0)
        hits += hit
        if hit:
            t0 = time.perf_counter()
            objs = [obj for location, ks in mapping.items() for obj in sm.batched_get(list(ks), location=location)]
            seconds = time.perf_counter() - t0
            get.append(seconds / hit)
            get_s, gets = get_s + seconds, gets + hit
            for bid, obj in zip(chain, objs):
                raw = None if obj is None else obj.tensor.view(torch.uint8).reshape(-1)
                wrong += raw is None or raw.numel() != chunk_bytes or bytes(raw[:16].numpy()) != bytes.fromhex(bid)
                if obj is not None:
                    obj.ref_count_down()
            wrong += hit - len(objs)
        if hit < len(keys):
            t0 = time.perf_counter()
            objs = []
            for bid in chain[hit:]:
                obj = sm.allocate(shape, torch.float16, fmt)
                obj.tensor.copy_(payload)
                obj.tensor.view(torch.uint8).reshape(-1)[:16] = torch.frombuffer(bytearray.fromhex(bid), dtype=torch.uint8)
                objs.append(obj)
            sm.batched_put(keys[hit:], objs)
            seconds = time.perf_counter() - t0
            put.append(seconds / (len(keys) - hit))
            put_s, puts = put_s + seconds, puts + len(keys) - hit
    return {"requests": len(requests), "references": references, "hits": hits, "wrong": wrong,
            "block_hit_ratio": hits / references if references else 0.0,
            "lookup_per_request": summarize(lookup) if lookup else None,
            "get_per_block": summarize(get) if get else None, "put_per_block": summarize(put) if put else None,
            "get_gbps": gbps(gets * chunk_bytes, get_s), "put_gbps": gbps(puts * chunk_bytes, put_s),
            "chunk_bytes": chunk_bytes}


def _drain(sm: Any, timeout: float = 120.0) -> None:
    """Wait (bounded) for LMCache's disk backend to finish its queued writes: closing the
    CPU pool under them crashes LMCache 0.5.6."""
    disk = sm.storage_backends.get("LocalDiskBackend")
    deadline = time.monotonic() + timeout
    while disk is not None and disk.disk_worker.put_tasks and time.monotonic() < deadline:
        time.sleep(0.01)


def main(argv: list[str]) -> None:
    mode, arg, client, clients, block_bytes, workdir, spec = argv
    from .cluster_serving import requests_of

    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="prom-", dir=workdir))
    lm = _import_lmcache()
    lm["torch"].set_num_threads(1)
    requests = requests_of(json.loads(spec))[int(client)::int(clients)]
    sm = storage_manager(mode, arg, int(block_bytes), workdir, lm)
    try:
        if mode != "lmcache" and "cascade" not in sm.storage_backends:
            raise SystemExit("LMCache did not load the Cascade plugin (its log says why)")
        t0 = time.perf_counter()
        result = replay(sm, requests, int(block_bytes), lm)
        result["seconds"] = time.perf_counter() - t0
        result["backends"] = sorted(sm.storage_backends)
    finally:
        _drain(sm)
        sm.close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
