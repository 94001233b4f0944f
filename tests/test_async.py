"""Non-blocking store calls: futures, ordering with later reads, errors on the future,
flush and close waiting for what was submitted before them."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import cascade.store
from cascade import BlockSpec, CascadeStore, Config, InvalidBlock, TierFull
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


def big_block_store(tmp_path, **options) -> CascadeStore:
    """A store of 256 KiB blocks (above the hot-read size: every get takes the leased path,
    where a read waits for the puts of its id) in its SHM tier alone."""
    spec = BlockSpec.flat(256 << 10)
    return CascadeStore(Config(shm_bytes=16 * spec.block_bytes, file_bytes=0, remote_bytes=0, shm_dir=str(tmp_path),
                               **options), block_spec=spec)


def test_a_non_blocking_read_waits_only_for_the_puts_issued_before_it(tmp_path):
    # One worker runs the calls in order: a read that waited for a put of its id queued
    # behind it would hold the only worker for ever (flush() and the futures hung).
    with big_block_store(tmp_path, io_threads=1) as store:
        first = [np.random.default_rng(1).integers(0, 256, store.spec.shape, dtype=np.uint8) for _ in range(2)]
        early = [store.spec.empty() for _ in range(2)]
        before = [store.get_into_async(ident(1), *early[0]), store.get_many_into_async([ident(1)], [early[1]])]
        put = store.put_async(*first, block_id=ident(1))
        outs = [store.spec.empty() for _ in range(2)]
        after = [store.get_into_async(ident(1), *outs[0]), store.get_many_into_async([ident(1)], [outs[1]])]
        again = store.put_async(*first, block_id=ident(1))  # the same block put again, queued behind the reads
        assert [f.result(timeout=30) for f in before] == [False, [False]]  # issued before any put of the id
        assert [f.result(timeout=30) for f in after] == [True, [True]]
        assert put.result(timeout=30) == again.result(timeout=30) == ident(1)
        assert all(np.array_equal(k, first[0]) and np.array_equal(v, first[1]) for k, v in outs)
        store.flush()


def test_close_cancels_calls_not_started_and_wakes_the_reads_waiting_for_them(tmp_path, monkeypatch):
    monkeypatch.setattr(cascade.store, "ASYNC_CLOSE_SECONDS", 0.5)
    store = big_block_store(tmp_path, io_threads=1)
    gate = threading.Event()
    holder = store._async.submit(gate.wait)  # holds the only worker past close()'s wait
    queued = store.put_async(*store.spec.empty(), block_id=ident(1))
    waiting = store.get_into_async(ident(1), *store.spec.empty())  # queued behind the put
    read: list = []

    def reader() -> None:  # a blocking read issued after the put: it waits for it
        try:
            read.append(store.get_into(ident(1), *store.spec.empty()))
        except StoreClosed as exc:
            read.append(exc)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        store.close()
        thread.join(30)
        assert not thread.is_alive(), "a read waiting for a put that close() cancelled never woke"
        assert queued.cancelled() and waiting.cancelled()
        assert len(read) == 1 and (read[0] is False or isinstance(read[0], StoreClosed))
    finally:
        gate.set()
    assert holder.result(timeout=30) is True


def test_a_batch_get_issued_before_a_put_async_of_its_ids_does_not_wait_for_it(tmp_path):
    # the batch's per-block reads run on I/O helper threads (max_workers=2); they waited
    # for every pending put of their ids, the later one included, which was queued behind
    # the batch itself: nothing moved again (flush hung, close waited its 60 s)
    with CascadeStore(Config(model="tiny", shm_bytes=64 * 4096, file_bytes=1 << 20, io_threads=1,
                             file_dir=str(tmp_path / "files"), shm_dir=str(tmp_path))) as store:
        ids = [ident(i) for i in range(8)]
        outs = [store.spec.empty() for _ in ids]
        submitted = threading.Event()
        hot_many = store._reads.read_hot_many

        def after_the_put(keys, outputs):  # the batch reads on once the later put_async is queued
            assert submitted.wait(30)
            return hot_many(keys, outputs)

        store._reads.read_hot_many = after_the_put
        got = store.get_many_into_async(ids, outs, max_workers=2)
        put = store.put_async(*block(store.spec, 7), block_id=ids[7])
        submitted.set()
        assert got.result(timeout=30) == [False] * 8  # issued before the put: it does not see it
        assert put.result(timeout=30) == ids[7]
        store.flush()


def test_calls_on_an_id_after_its_put_async_see_the_put(tmp_path):
    # each call is issued while the put still waits behind a slow call on the only worker
    with CascadeStore(Config(model="tiny", shm_bytes=64 * 4096, file_bytes=1 << 20, io_threads=1,
                             file_dir=str(tmp_path / "files"), shm_dir=str(tmp_path))) as store:
        release = threading.Event()

        def put_later(i: int):
            store._async.submit(lambda: release.wait(30))  # the worker busy: the put queued behind it
            future = store.put_async(*block(store.spec, i), block_id=ident(i))
            threading.Timer(0.2, release.set).start()
            return future

        put_later(1)
        store.pin(ident(1))  # not BlockNotFound
        store.unpin(ident(1))
        release.clear()
        put_later(2)
        assert store.hint([ident(2)]) == 1
        release.clear()
        put_later(3)
        store.set_ttl(ident(3), 3600)
        release.clear()
        put_later(4)
        store.set_priority(ident(4), 2)
        release.clear()
        put_later(5)
        store.delete(ident(5))  # not BlockNotFound, and the block is gone after it
        assert not store.contains(ident(5))


def test_a_get_into_after_a_put_async_sees_it_over_a_block_found_at_a_restart(tmp_path):
    # a block found on disk at a warm restart (not confirmed yet) is replaced by a put of
    # other bytes: the hot path returned the old bytes while the put waited behind others
    config = Config(model="tiny", shm_bytes=64 * 4096, file_bytes=1 << 20, io_threads=1,
                    file_dir=str(tmp_path / "files"), shm_dir=str(tmp_path))
    with CascadeStore(config) as store:
        store.put(*block(store.spec, 1), block_id=ident(9))
    with CascadeStore(config) as store:
        key_out, value_out = store.spec.empty()
        assert store.get_into(ident(9), key_out, value_out) and key_out.flat[0] == 1  # promoted into SHM
        release = threading.Event()
        store._async.submit(lambda: release.wait(30))  # the only worker busy: the put waits behind it
        put = store.put_async(*block(store.spec, 2), block_id=ident(9))
        threading.Timer(0.2, release.set).start()
        assert store.get_into(ident(9), key_out, value_out) and key_out.flat[0] == 2
        assert put.result(timeout=30) == ident(9)


def test_bad_put_many_async_options_raise_at_once(store):
    pairs = [block(store.spec, 1)]
    with pytest.raises(InvalidBlock):
        store.put_many_async(pairs, namespace="no/slashes here")
    with pytest.raises(InvalidBlock):
        store.put_many_async(pairs, parent="not-an-id")
    with pytest.raises(TypeError, match="block_idz"):
        store.put_many_async(pairs, block_idz=[ident(1)])
    store.flush()
    assert len(store) == 0
