"""Cascade as an LMCache storage plugin, driven by LMCache's own StorageManager on CPU."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("lmcache", reason="LMCache is not installed (third_party/install.sh)")
torch = pytest.importorskip("torch")

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")  # LMCache reads it at import

from lmcache.utils import CacheEngineKey  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.event_manager import EventManager  # noqa: E402
from lmcache.v1.memory_management import MemoryFormat  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend.storage_manager import StorageManager  # noqa: E402

from cascade.integrations.lmcache_backend import CascadeBackend, chunk_block_id  # noqa: E402

CHUNK = 16
KV_SHAPE = (2, 2, CHUNK, 2, 8)  # layers, K/V, tokens, heads, head dim


@pytest.fixture(autouse=True)
def _quiet_lmcache(tmp_path, monkeypatch):
    # LMCache's metrics set PROMETHEUS_MULTIPROC_DIR process-wide when unset
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "prom"))
    os.makedirs(tmp_path / "prom", exist_ok=True)


def _manager(tmp_path, **cascade):
    extra = {"storage_plugin.cascade.module_path": "cascade.integrations.lmcache_backend",
             "storage_plugin.cascade.class_name": "CascadeBackend",
             "cascade.shm_bytes": "1M", "cascade.file_bytes": "4M",
             "cascade.file_dir": str(tmp_path / "cascade"), "cascade.shm_dir": str(tmp_path / "shm")}
    extra.update({f"cascade.{k}": v for k, v in cascade.items()})
    os.makedirs(tmp_path / "shm", exist_ok=True)
    cfg = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.01,
                                            storage_plugins=["cascade"], extra_config=extra,
                                            save_unfull_chunk=True)
    meta = LMCacheMetadata(model_name="tiny-test", world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=torch.float16, kv_shape=KV_SHAPE, role="worker",
                           chunk_size=CHUNK)
    sm = StorageManager(cfg, meta, EventManager())
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
