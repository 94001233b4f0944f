"""Non-blocking store calls: futures, ordering with later reads, errors on the future,
flush and close waiting for what was submitted before them."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from cascade import CascadeStore, Config, InvalidBlock, TierFull
from cascade.errors import StoreClosed


def block(spec, i: int):
    key, value = spec.empty()
    key[...], value[...] = i, -i
    return key, value


def ident(i: int) -> str:
    return f"{i:032x}"


@pytest.fixture
def store(tmp_path):
    with CascadeStore(Config(model="tiny", shm_bytes=64 * 4096, file_bytes=1 << 20,
                             file_dir=str(tmp_path / "files"), shm_dir=str(tmp_path))) as s:
        yield s


def test_a_read_after_put_async_of_the_same_id_sees_the_put(store):
    for i in range(200):
        future = store.put_async(*block(store.spec, i), block_id=ident(i))
        got = store.get(ident(i))  # issued right after, without waiting for the future
        assert got is not None and np.array_equal(got[0], block(store.spec, i)[0]), i
        assert future.result(timeout=30) == ident(i)


def test_get_into_async_after_put_async_and_batches(store):
    puts = [store.put_async(*block(store.spec, i), block_id=ident(i)) for i in range(20)]
    outs = [store.spec.empty() for _ in range(20)]
    gets = [store.get_into_async(ident(i), *outs[i]) for i in range(20)]
    assert [g.result(timeout=30) for g in gets] == [True] * 20
    assert [p.result(timeout=30) for p in puts] == [ident(i) for i in range(20)]
    assert all(np.array_equal(outs[i][1], block(store.spec, i)[1]) for i in range(20))
    ids = [ident(100 + i) for i in range(10)]
    assert store.put_many_async([block(store.spec, 100 + i) for i in range(10)], block_ids=ids).result(30) == ids
    outs = [store.spec.empty() for _ in ids]
    assert store.get_many_into_async(ids, outs).result(timeout=30) == [True] * 10
    assert all(np.array_equal(outs[i][0], block(store.spec, 100 + i)[0]) for i in range(10))


def test_calls_return_before_the_work_runs(store):
    gate = threading.Event()
    try:  # every worker waits on the gate: the puts queued behind them cannot have run
        blockers = [store._async.submit(gate.wait) for _ in range(store.config.io_threads)]
        futures = [store.put_async(*block(store.spec, i), block_id=ident(i))
                   for i in range(store.config.io_threads * 2)]
        assert not any(f.done() for f in futures)  # the caller was not blocked by the puts
    finally:
        gate.set()
    assert all(b.result(timeout=30) is True for b in blockers)
    assert [f.result(timeout=30) for f in futures] == [ident(i) for i in range(len(futures))]


def test_bad_input_raises_at_once_and_queues_nothing(store):
    with pytest.raises(InvalidBlock):
        store.put_async(np.zeros(3, np.float16), np.zeros(3, np.float16), block_id=ident(1))
    with pytest.raises(InvalidBlock):
        store.put_async(*block(store.spec, 1), block_id="not-an-id")
    with pytest.raises(InvalidBlock):
        store.get_into_async(ident(1), np.zeros(3), np.zeros(3))
    with pytest.raises(InvalidBlock):
        store.put_many_async([block(store.spec, 1)], block_ids=[ident(1), ident(2)])
    assert not store.put_pending(ident(1))
    store.flush()
    assert len(store) == 0 and store.stats()["puts"] == 0


def test_errors_of_the_call_surface_on_the_future(tmp_path):
    with CascadeStore(Config(model="tiny", shm_bytes=4096, file_bytes=0, shm_dir=str(tmp_path))) as store:
        store.put(*block(store.spec, 0), block_id=ident(0))
        store.pin(ident(0))  # the only slot is pinned: no room for another block
        future = store.put_async(*block(store.spec, 1), block_id=ident(1))
        with pytest.raises(TierFull):
            future.result(timeout=30)
        assert isinstance(future.exception(), TierFull)
        assert store.get_into_async(ident(9), *store.spec.empty()).result(timeout=30) is False  # a miss
        store.unpin(ident(0))
        assert store.get(ident(1)) is None and store.stats()["rejected"] == 1


def test_flush_and_close_wait_for_submitted_calls(tmp_path):
    cfg = Config(model="tiny", shm_bytes=8 * 4096, file_bytes=1 << 20, file_dir=str(tmp_path / "f"),
                 shm_dir=str(tmp_path))
    store = CascadeStore(cfg)
    futures = [store.put_async(*block(store.spec, i), block_id=ident(i)) for i in range(40)]
    store.flush()
    assert all(f.done() for f in futures)
    assert not any(store.put_pending(ident(i)) for i in range(40))
    more = [store.put_async(*block(store.spec, i), block_id=ident(i)) for i in range(40, 80)]
    store.close()
    assert all(f.done() and f.exception() is None for f in more)
    with pytest.raises(StoreClosed):
        store.put_async(*block(store.spec, 1), block_id=ident(1))
    with CascadeStore(cfg) as again:  # everything submitted before close was stored and kept
        assert all(again.contains(ident(i)) for i in range(80))
