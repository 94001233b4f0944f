"""Cascade as an LMCache storage plugin, driven by LMCache's own StorageManager on CPU."""
from __future__ import annotations

import asyncio
import os
import threading

import pytest

pytest.importorskip("lmcache", reason="LMCache is not installed (third_party/install.sh)")
torch = pytest.importorskip("torch")

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")  # LMCache reads it at import

from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.event_manager import EventManager, EventType  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend.storage_manager import StorageManager  # noqa: E402

from cascade import ConfigError  # noqa: E402
from cascade.integrations.lmcache_backend import CascadeBackend, chunk_block_id  # noqa: E402

CHUNK = 16
KV_SHAPE = (2, 2, CHUNK, 2, 8)  # layers, K/V, tokens, heads, head dim


@pytest.fixture(autouse=True)
def _quiet_lmcache(tmp_path, monkeypatch):
    # LMCache's metrics set PROMETHEUS_MULTIPROC_DIR process-wide when unset
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "prom"))
    os.makedirs(tmp_path / "prom", exist_ok=True)


def _manager(tmp_path, *, async_lookup_server=None, enable_async_loading=False, **cascade):
    extra = {"storage_plugin.cascade.module_path": "cascade.integrations.lmcache_backend",
             "storage_plugin.cascade.class_name": "CascadeBackend",
             "cascade.shm_bytes": "1M", "cascade.file_bytes": "4M",
             "cascade.file_dir": str(tmp_path / "cascade"), "cascade.shm_dir": str(tmp_path / "shm")}
    extra.update({f"cascade.{k}": v for k, v in cascade.items()})
    os.makedirs(tmp_path / "shm", exist_ok=True)
    cfg = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.01,
                                            storage_plugins=["cascade"], extra_config=extra,
                                            save_unfull_chunk=True, enable_async_loading=enable_async_loading)
    meta = LMCacheMetadata(model_name="tiny-test", world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=torch.float16, kv_shape=KV_SHAPE, role="worker",
                           chunk_size=CHUNK)
    sm = StorageManager(cfg, meta, EventManager(), async_lookup_server=async_lookup_server)
    assert isinstance(sm.storage_backends.get("cascade"), CascadeBackend), list(sm.storage_backends)
    return sm


def _key(h: int) -> CacheEngineKey:
    return CacheEngineKey("tiny-test", 1, 0, h, torch.float16)


def _put(sm, h: int, tokens: int = CHUNK) -> torch.Tensor:
    shape = torch.Size([2, KV_SHAPE[0], tokens, KV_SHAPE[3] * KV_SHAPE[4]])
    obj = sm.allocate(shape, torch.float16, MemoryFormat.KV_2LTD)
    data = torch.randn(shape, generator=torch.Generator().manual_seed(h)).to(torch.float16)
    obj.tensor.copy_(data)
    sm.batched_put([_key(h)], [obj])
    return data


def test_chunks_stored_through_lmcache_come_back_byte_exact_from_cascade(tmp_path):
    sm = _manager(tmp_path)
    try:
        backend = sm.storage_backends["cascade"]
        full = _put(sm, 0xABC)
        partial = _put(sm, 0xDEF, tokens=5)  # an unfull last chunk
        for h, data in ((0xABC, full), (0xDEF, partial)):
            assert backend.store.contains(chunk_block_id(_key(h)), namespace="lmcache")
            assert sm.contains(_key(h), search_range=["cascade"]) == "cascade"
            got = sm.batched_get([_key(h)], location="cascade")[0]
            assert got is not None and got.metadata.fmt == MemoryFormat.KV_2LTD
            assert got.tensor.shape == data.shape and got.tensor.dtype == torch.float16
            assert torch.equal(got.tensor.view(torch.uint8), data.view(torch.uint8))
            got.ref_count_down()
        # the miss path: an unknown key is absent everywhere and reads as None
        assert backend.contains(_key(0x123)) is False
        assert backend.get_blocking(_key(0x123)) is None
        assert sm.contains(_key(0x123)) is None
        assert backend.pin(_key(0xABC)) and backend.unpin(_key(0xABC)) and not backend.unpin(_key(0xABC))
        assert backend.remove(_key(0xABC)) and not backend.contains(_key(0xABC))
    finally:
        sm.close()


def test_a_restarted_worker_reads_its_file_tier_back(tmp_path):
    sm = _manager(tmp_path, shm_bytes=0)  # file tier only: what survives a restart
    try:
        data = _put(sm, 0x77)
    finally:
        sm.close()
    sm = _manager(tmp_path, shm_bytes=0)
    try:
        got = sm.storage_backends["cascade"].get_blocking(_key(0x77))
        assert got is not None and torch.equal(got.tensor.view(torch.uint8), data.view(torch.uint8))
        got.ref_count_down()
    finally:
        sm.close()


class _SchedulerInbox:
    """Where LMCache's StorageManager sends the prefetch answer (in vLLM: its lookup
    server's socket to the scheduler): records ``(lookup_id, retrieved tokens)``."""

    def __init__(self) -> None:
        self.answers: dict[str, int] = {}
        self.arrived = threading.Event()

    def send_response_to_scheduler(self, lookup_id: str, retrieved_length: int) -> None:
        self.answers[lookup_id] = retrieved_length
        self.arrived.set()


def test_lmcache_async_lookup_and_prefetch_reads_chunks_from_cascade(tmp_path):
    """LMCache's enable_async_loading path: its StorageManager asks Cascade with
    batched_async_contains, prefetches with batched_get_non_blocking on its own event
    loop, and answers the scheduler with the retrieved length."""
    inbox = _SchedulerInbox()
    sm = _manager(tmp_path, async_lookup_server=inbox, enable_async_loading=True)
    try:
        hashes = [0x101, 0x102, 0x103]
        data = {h: _put(sm, h) for h in hashes}
        backend = sm.storage_backends["cascade"]
        keys = [_key(h) for h in hashes] + [_key(0x999)]  # the last chunk was never stored
        cum = [0, CHUNK, 2 * CHUNK, 3 * CHUNK, 4 * CHUNK]
        asyncio.run_coroutine_threadsafe(
            sm.async_lookup_and_prefetch("req-1", keys, cum, search_range=["cascade"], pin=True), sm.loop
        ).result(timeout=60)
        assert inbox.arrived.wait(timeout=60)
        assert inbox.answers == {"req-1": 3 * CHUNK}  # three chunks hit, the fourth missed
        tiers = sm.event_manager.get_event_future(EventType.LOADING, "req-1").result()  # done: it answered
        got = {key: obj for tier in tiers for key, obj in tier}
        assert set(got) == {_key(h) for h in hashes}
        for h in hashes:
            assert torch.equal(got[_key(h)].tensor.view(torch.uint8), data[h].view(torch.uint8))
            got[_key(h)].ref_count_down()
            assert backend.unpin(_key(h))  # pinned by the lookup, released by the engine
    finally:
        sm.close()


def test_batched_contains_counts_and_pins_only_the_cached_prefix(tmp_path):
    sm = _manager(tmp_path)
    try:
        backend = sm.storage_backends["cascade"]
        for h in (1, 2, 4):  # chunk 3 missing: the prefix is two chunks long
            _put(sm, h)
        keys = [_key(h) for h in (1, 2, 3, 4)]
        assert backend.batched_contains(keys) == 2
        assert backend.batched_contains(keys, pin=True) == 2
        assert not backend.remove(keys[0]) and not backend.remove(keys[1])  # pinned: kept
        assert backend.remove(keys[3])  # cached but past the prefix: not pinned
        assert backend.unpin(keys[0]) and backend.unpin(keys[1]) and backend.remove(keys[0])
    finally:
        sm.close()


def test_cascade_sizes_take_units_and_a_bad_namespace_is_a_configerror(tmp_path):
    sm = _manager(tmp_path, block_bytes="8K")  # a size as every cascade.* size takes it
    try:
        assert sm.storage_backends["cascade"].block_bytes == 8192
    finally:
        sm.close()
    cfg = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.01,
                                            extra_config={"cascade.namespace": "not a namespace!",
                                                          "cascade.file_dir": str(tmp_path / "c2")})
    with pytest.raises(ConfigError, match="cascade.namespace"):
        CascadeBackend(config=cfg, metadata=None, local_cpu_backend=object())
