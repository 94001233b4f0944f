"""The LMCache plugin chooses its store: attached to a rank with ``cascade.endpoint``,
in-process without it, and says which in its log (a rank served in this process here;
the multi-process, multi-rank runs are in tests/test_serve.py)."""
from __future__ import annotations

import logging
import os
import tempfile
import threading

import pytest

pytest.importorskip("lmcache", reason="LMCache is not installed (third_party/install.sh)")
torch = pytest.importorskip("torch")
os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")

from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.event_manager import EventManager  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from lmcache.v1.storage_backend.storage_manager import StorageManager  # noqa: E402

from cascade import CascadeStore, Config  # noqa: E402
from cascade.models import BlockSpec  # noqa: E402
from cascade.serve.attached import AttachedStore  # noqa: E402
from cascade.serve.server import RankServer  # noqa: E402
from cascade.testing.serve_client import CHUNK, KV_SHAPE, _prompt  # noqa: E402


@pytest.fixture
def rank(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    socket_dir = tempfile.mkdtemp(prefix="cs-", dir="/tmp")
    store = CascadeStore(Config(shm_bytes=1 << 20, file_bytes=0, shm_dir=str(tmp_path)), block_spec=BlockSpec.flat(8192))
    server = RankServer(store, socket_dir, 0)
    yield server
    server.close()
    store.close()
    os.rmdir(socket_dir)


def _manager(**cascade):
    extra = {"storage_plugin.cascade.module_path": "cascade.integrations.lmcache_backend",
             "storage_plugin.cascade.class_name": "CascadeBackend", **{f"cascade.{k}": v for k, v in cascade.items()}}
    cfg = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=0.01,
                                            storage_plugins=["cascade"], extra_config=extra, save_unfull_chunk=True)
    meta = LMCacheMetadata(model_name="tiny-test", world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                           kv_dtype=torch.float16, kv_shape=KV_SHAPE, role="worker", chunk_size=CHUNK)
    return StorageManager(cfg, meta, EventManager())


def test_with_an_endpoint_the_plugin_attaches_to_the_rank_and_says_so(rank, caplog):
    caplog.set_level(logging.INFO, logger="cascade.integrations.lmcache_backend")
    sm = _manager(endpoint=rank.path, shm_bytes="1G")  # shm_bytes: the rank's business, ignored
    try:
        backend = sm.storage_backends["cascade"]
        assert isinstance(backend.store, AttachedStore) and backend.block_bytes == 8192
        assert "attached to the Cascade rank at" in caplog.text and "ignoring ['shm_bytes']" in caplog.text
        (key,), (kv,) = _prompt(1)
        obj = sm.allocate(kv.shape, kv.dtype)
        obj.tensor.copy_(kv)
        sm.batched_put([key], [obj])
        assert rank.store.stats()["blocks"] == 1  # it went to the rank's store
        got = backend.get_blocking(key)
        assert got is not None and torch.equal(got.tensor.view(torch.uint8), kv.view(torch.uint8))
        got.ref_count_down()
        keys, kvs = _prompt(4)  # three new chunks after the first: one put request (the first lands as a dedup)
        objs = [sm.allocate(kv.shape, kv.dtype) for kv in kvs]
        for obj, kv in zip(objs, kvs):
            obj.tensor.copy_(kv)
        before = rank.serve_stats()["requests"]
        sm.batched_put(keys, objs)
        assert rank.serve_stats()["requests"] - before == 1 and rank.store.stats()["blocks"] == 4
        assert backend.batched_contains(keys) == 4
    finally:
        sm.close()


def test_without_an_endpoint_the_plugin_keeps_its_own_store_and_says_so(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    caplog.set_level(logging.INFO, logger="cascade.integrations.lmcache_backend")
    sm = _manager(shm_bytes="1M", file_bytes="0", shm_dir=str(tmp_path))
    try:
        assert isinstance(sm.storage_backends["cascade"].store, CascadeStore)
        assert "in-process store private to this worker" in caplog.text
    finally:
        sm.close()


def test_a_block_size_other_than_the_ranks_is_refused(rank, caplog):
    sm = _manager(endpoint=rank.path, block_bytes="16384")  # LMCache logs a backend's error, goes on without it
    try:
        assert "cascade" not in sm.storage_backends
        assert "cascade.block_bytes=16384 but the rank at" in caplog.text and "serves 8192-byte blocks" in caplog.text
        assert _eventually(lambda: rank.serve_stats()["clients"] == 0)  # its connection was closed again
    finally:
        sm.close()


def test_the_plugins_timeout_reaches_its_connection_to_the_rank(rank, caplog):
    caplog.set_level(logging.INFO, logger="cascade.integrations.lmcache_backend")
    sm = _manager(endpoint=rank.path, timeout="5")  # how long a rank that does not answer may take
    try:
        assert sm.storage_backends["cascade"].store._current().timeout == 5.0
        assert "ignoring" not in caplog.text
    finally:
        sm.close()
    sm = _manager(endpoint=rank.path, timeout="0")
    try:
        assert "cascade" not in sm.storage_backends and "cascade.timeout" in caplog.text
    finally:
        sm.close()


def _eventually(check, tries: int = 1000) -> bool:
    for _ in range(tries):
        if check():
            return True
        threading.Event().wait(0.01)
    return False
