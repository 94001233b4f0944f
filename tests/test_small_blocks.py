"""The hot path of small blocks: a get_into hit or a put with a known id of a block up to
HOT_COPY_MAX in the SHM tier runs in one locked step, with the same answers, counts and
checks as the leased path; the policy's deferred push of a hit keeps its victim order."""
from __future__ import annotations

import gc
import random

import numpy as np
import pytest

from cascade import CascadeStore, Config
from cascade.core.reads import HOT_COPY_MAX, ReadPath
from cascade.core.writes import WritePath
from cascade.errors import InvalidBlock, TierFull
from cascade.histogram import LatencyHistogram
from cascade.identity import check_namespace
from cascade.models import BlockSpec
from cascade.policy import BlockMeta, Policy
from cascade.stats import StoreMetrics
from cascade.tiers import slab_tier
from cascade.tiers.shm import ShmTier
from cascade.validate import check_priority


def ident(i: int) -> str:
    return f"{i:032x}"


def pair(spec: BlockSpec, i: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(i)
    return rng.standard_normal(spec.shape).astype(spec.np_dtype), rng.standard_normal(spec.shape).astype(spec.np_dtype)


@pytest.fixture
def store(tmp_path):
    spec = BlockSpec(shape=(2, 4, 64), dtype="float16")  # 1 KiB halves: a small block
    cfg = Config(shm_bytes=64 * spec.block_bytes, file_bytes=0, shm_dir=str(tmp_path))
    with CascadeStore(cfg, block_spec=spec) as s:
        yield s


def _no_slow_path(monkeypatch) -> None:
    """Fail any put or get that leaves the hot path."""
    def refuse(*args, **kwargs):
        raise AssertionError("took the leased path")
    monkeypatch.setattr(ReadPath, "read", refuse)
    monkeypatch.setattr(WritePath, "put", refuse)


def test_hot_puts_and_gets_never_take_the_leased_path_and_count_the_same(store, monkeypatch):
    _no_slow_path(monkeypatch)
    blocks = [pair(store.spec, i) for i in range(8)]
    assert store.put_many(blocks[:4], block_ids=[ident(i) for i in range(4)]) == [ident(i) for i in range(4)]
    for i in range(4, 8):
        assert store.put(*blocks[i], block_id=ident(i)) == ident(i)
    assert store.put(*blocks[0], block_id=ident(0)) == ident(0)  # a dedup
    outs = [store.spec.empty() for _ in range(8)]
    for i in range(4):
        assert store.get_into(ident(i), *outs[i]) is True
    assert store.get_many_into([ident(i) for i in range(4, 8)], outs[4:]) == [True] * 4
    for (k, v), (ko, vo) in zip(blocks, outs):
        assert np.array_equal(k, ko) and np.array_equal(v, vo)
    stats = store.stats()
    assert (stats["puts"], stats["stored"], stats["deduped"]) == (9, 8, 1)
    assert (stats["gets"], stats["hits"], stats["misses"]) == (8, 8, 0)
    assert all(m.readers == 0 for m in store._meta.values())


def test_bad_outputs_on_the_hot_path_raise_like_the_leased_path_and_hold_nothing(store):
    store.put(*pair(store.spec, 1), block_id=ident(1))
    key_out, value_out = store.spec.empty()
    read_only = value_out.copy()
    read_only.flags.writeable = False
    strided = np.empty((2, 4, 128), store.spec.np_dtype)[:, :, ::2]  # right shape, not contiguous
    for bad in (read_only, strided):
        with pytest.raises(InvalidBlock):
            store.get_into(ident(1), key_out, bad)
        with pytest.raises(InvalidBlock):
            store.get_many_into([ident(1)], [(key_out, bad)])
    assert store.stats()["gets"] == 0 and all(m.readers == 0 for m in store._meta.values())
    assert store.get_into(ident(2), key_out, value_out) is False  # a miss still answers


def test_a_batch_checks_every_output_before_it_reads_any(store):
    """A bad pair after good ones: nothing is read into the good ones, nothing counted;
    CPU torch tensors after plain arrays are taken as the arrays are."""
    ids = [ident(i) for i in range(4)]
    blocks = [pair(store.spec, i) for i in range(4)]
    store.put_many(blocks, block_ids=ids)
    outs = [tuple(np.zeros(store.spec.shape, store.spec.np_dtype) for _ in range(2)) for _ in ids]
    read_only = outs[2][1].copy()
    read_only.flags.writeable = False
    with pytest.raises(InvalidBlock):
        store.get_many_into(ids, outs[:2] + [(outs[2][0], read_only)] + outs[3:])
    assert not any(o.any() for p in outs for o in p) and store.stats()["gets"] == 0
    torch = pytest.importorskip("torch")
    mixed = outs[:3] + [(torch.from_numpy(outs[3][0]), torch.from_numpy(outs[3][1]))]
    assert store.get_many_into(ids, mixed) == [True] * 4
    assert all(np.array_equal(o[0], b[0]) and np.array_equal(o[1], b[1]) for o, b in zip(outs, blocks))


def test_bad_parts_on_the_hot_path_raise_and_store_nothing(store):
    key, value = pair(store.spec, 3)
    strided = np.empty((2, 4, 128), store.spec.np_dtype)[:, :, ::2]
    with pytest.raises(InvalidBlock):
        store.put(key, strided, block_id=ident(3))
    with pytest.raises(InvalidBlock):
        store.put(key, value, block_id="not-an-id")
    assert len(store) == 0 and store.stats()["puts"] == 0


def test_one_failing_put_of_a_hot_batch_leaves_the_others_stored(store):
    blocks = [pair(store.spec, i) for i in range(3)]
    with pytest.raises(InvalidBlock, match="own ancestor"):  # the second names itself as parent
        store.put_many(blocks, block_ids=[ident(1), ident(1), ident(2)], chain=True)
    assert store.contains(ident(1)) and store.contains(ident(2))


def test_a_get_after_put_async_of_the_same_id_sees_it_on_the_hot_path(store):
    key, value = pair(store.spec, 5)
    store.put_async(key, value, block_id=ident(5))
    key_out, value_out = store.spec.empty()
    assert store.get_into(ident(5), key_out, value_out) is True
    assert np.array_equal(value_out, value)


def test_blocks_over_the_hot_size_take_the_leased_path(tmp_path, monkeypatch):
    spec = BlockSpec.flat(2 * HOT_COPY_MAX)
    cfg = Config(shm_bytes=8 * spec.block_bytes, file_bytes=0, shm_dir=str(tmp_path))
    with CascadeStore(cfg, block_spec=spec) as store:
        def refuse(*args, **kwargs):
            raise AssertionError("a big block copied under the lock")
        monkeypatch.setattr(ShmTier, "read_hot", refuse)
        monkeypatch.setattr(ShmTier, "store_hot", refuse)
        key, value = pair(spec, 7)
        store.put(key, value, block_id=ident(7))
        key_out, value_out = spec.empty()
        assert store.get_into(ident(7), key_out, value_out) is True
        assert np.array_equal(key_out, key)


def _counts(store) -> tuple:
    st = store.stats()
    metas = [store._meta[("default", ident(i))] for i in range(6)]
    return (st["gets"], st["hits"], st["misses"], store.tier_counters[0].bytes_read,
            store.metrics.get_latency[0].count, [m.hits for m in metas],
            sorted(range(6), key=lambda i: metas[i].touch_seq))


def test_a_hot_batch_counts_and_orders_its_hits_as_the_same_gets_in_a_loop(tmp_path):
    """get_many_into counts its hot hits in one call per tier and times each as a share
    of its locked step: the counts, bytes, timings and the policy's order of uses are
    those of get_into in a loop (ids asked out of order, one twice, one absent)."""
    asked = [ident(i) for i in (4, 1, 5, 1, 0, 9, 3, 2)]
    found = []
    for form in ("loop", "batch"):
        spec = BlockSpec(shape=(2, 4, 64), dtype="float16")
        cfg = Config(shm_bytes=64 * spec.block_bytes, file_bytes=0, shm_dir=str(tmp_path / form))
        with CascadeStore(cfg, block_spec=spec) as store:
            store.put_many([pair(spec, i) for i in range(6)], block_ids=[ident(i) for i in range(6)])
            outs = [spec.empty() for _ in asked]
            if form == "loop":
                hits = [store.get_into(b, *o) for b, o in zip(asked, outs)]
            else:
                hits = store.get_many_into(asked, outs)
            assert hits == [True] * 5 + [False] + [True] * 2
            for b, (k, v) in zip(asked, outs):
                if b != ident(9):
                    assert np.array_equal(k, pair(spec, int(b, 16))[0]) and np.array_equal(v, pair(spec, int(b, 16))[1])
            found.append(_counts(store))
    assert found[0] == found[1]
    assert found[1][:5] == (8, 7, 1, 7 * spec.block_bytes, 7)


def test_a_hot_put_batch_counts_and_orders_its_puts_as_the_same_puts_in_a_loop(tmp_path):
    """put_many counts its hot puts in one call and times each as a share of its locked
    step: puts, stored blocks, dedups, bytes written, timed puts and the order of
    admission are those of put in a loop (one id put twice: a dedup)."""
    ids = [ident(i) for i in (3, 1, 4, 1, 5, 0)]
    found = []
    for form in ("loop", "batch"):
        spec = BlockSpec(shape=(2, 4, 64), dtype="float16")
        cfg = Config(shm_bytes=64 * spec.block_bytes, file_bytes=0, shm_dir=str(tmp_path / form))
        with CascadeStore(cfg, block_spec=spec) as store:
            blocks = [pair(spec, int(b, 16)) for b in ids]
            if form == "loop":
                got = [store.put(k, v, block_id=b) for b, (k, v) in zip(ids, blocks)]
            else:
                got = store.put_many(blocks, block_ids=ids)
            assert got == ids
            st = store.stats()
            metas = [store._meta[("default", b)] for b in ids]
            found.append((st["puts"], st["stored"], st["deduped"], store.tier_counters[0].bytes_written,
                          store.metrics.put_latency.count, [m.order for m in metas], [m.shares for m in metas]))
            assert all(np.array_equal(store.get(b)[0], k) for b, (k, _) in zip(ids, blocks))
    assert found[0] == found[1]
    assert found[1][:5] == (6, 5, 1, 5 * spec.block_bytes, 5)


def test_a_hot_put_batch_that_ends_in_an_interrupt_counts_what_it_stored(store, monkeypatch):
    calls = []
    real = ShmTier.store_hot

    def third_interrupted(self, key, parts, nbytes):
        calls.append(key)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, key, parts, nbytes)

    monkeypatch.setattr(ShmTier, "store_hot", third_interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.put_many([pair(store.spec, i) for i in range(5)], block_ids=[ident(i) for i in range(5)])
    st = store.stats()
    assert (st["puts"], st["stored"], st["rejected"], len(store)) == (3, 2, 1, 2)
    assert store.metrics.put_latency.count == 2 and store.tier_counters[0].bytes_written == 2 * store.spec.block_bytes
    monkeypatch.undo()
    assert store.put_many([pair(store.spec, 4)], block_ids=[ident(4)]) == [ident(4)]  # the lock was given back


def test_a_copy_that_raises_in_a_hot_batch_leaves_the_copies_before_it_counted(store, monkeypatch):
    store.put_many([pair(store.spec, i) for i in range(6)], block_ids=[ident(i) for i in range(6)])
    calls = []
    real = ShmTier.read_hot

    def third_fails(self, key, outs):
        calls.append(key)
        if len(calls) == 3:
            raise OSError("copy failed")
        return real(self, key, outs)

    monkeypatch.setattr(ShmTier, "read_hot", third_fails)
    with pytest.raises(OSError, match="copy failed"):
        store.get_many_into([ident(i) for i in range(5)], [store.spec.empty() for _ in range(5)])
    gets, hits, misses, nbytes, timed, uses, _ = _counts(store)
    assert (gets, hits, misses, nbytes, timed) == (3, 2, 1, 2 * store.spec.block_bytes, 2)
    assert uses == [1, 1, 0, 0, 0, 0]
    assert store.get_many_into([ident(2)], [store.spec.empty()]) == [True]  # the lock was given back


@pytest.mark.parametrize("kind", ["semantic", "lru"])
@pytest.mark.parametrize("seed", range(5))
def test_deferred_hit_pushes_keep_the_victim_order_of_pushing_at_once(kind, seed):
    """The same random run of admits, hits, pins and evictions on a policy that pushes
    each hit at once and one that defers it: the same victims in the same order."""
    rng = random.Random(seed)
    policies = [Policy(1, kind), Policy(1, kind)]
    policies[1]._lazy_touch = False
    metas: list[list[BlockMeta]] = [[], []]
    live: list[int] = []
    now, victims = 0.0, ([], [])
    for step in range(3000):
        now += 1.0
        op = rng.random()
        if op < 0.2 or len(live) < 4:
            hits = rng.randrange(3)
            for p, ms in zip(policies, metas):
                meta = BlockMeta(("ns", f"b{len(ms)}"), 4096, 0, hits=hits)
                ms.append(meta)
                p.admitted(meta, now)
            live.append(len(metas[0]) - 1)
        elif op < 0.75:  # hits, often on the same few blocks (equal scores are common)
            i = live[min(int(rng.expovariate(0.5)), len(live) - 1)]
            for p, ms in zip(policies, metas):
                p.touched(ms[i], now)
        elif op < 0.85:  # a pin or unpin
            i = rng.choice(live)
            delta = 1 if metas[0][i].pins == 0 else -1
            for p, ms in zip(policies, metas):
                ms[i].pins += delta
                p.changed(ms[i])
        else:  # evict one
            for p, out in zip(policies, victims):
                meta = p.victim(0)
                out.append(None if meta is None else meta.key[1])
                if meta is not None:
                    p.evicted(meta)
                    p.removed(meta)
            if victims[0][-1] is not None:
                live.remove(int(victims[0][-1][1:]))
        assert victims[0] == victims[1], f"step {step}"
    assert sum(v is not None for v in victims[0]) > 100


def test_a_batch_capped_at_one_core_runs_in_the_callers_thread():
    """cores=1 (a two-core machine): a batch big enough for four workers runs inline."""
    import threading

    from cascade.core.pools import BYTES_PER_WORKER, Pools

    capped, free = Pools(4, lambda: None, cores=1), Pools(4, lambda: None)
    try:
        me = threading.get_ident()
        ran = capped.parallel(lambda _: threading.get_ident(), range(8), None, item_bytes=BYTES_PER_WORKER)
        assert set(ran) == {me}
        gate = threading.Barrier(2, timeout=30)  # uncapped: two workers must meet here
        free.parallel(lambda i: gate.wait() if i < 2 else None, range(8), None, item_bytes=BYTES_PER_WORKER)
    finally:
        capped.shutdown()
        free.shutdown()


def test_a_batch_of_memory_copies_uses_every_core_and_the_callers_thread():
    """in_memory: the cap is every core (the caller's included), not the spare ones."""
    import threading

    from cascade.core.pools import BYTES_PER_WORKER, Pools

    capped = Pools(4, lambda: None, cores=1)
    capped._memory_cores = 2  # this machine kind
    try:
        gate = threading.Barrier(2, timeout=30)  # two workers must meet here
        ran = capped.parallel(lambda i: (gate.wait() if i < 2 else None, threading.get_ident())[1], range(8), None,
                              item_bytes=BYTES_PER_WORKER, in_memory=True)
        assert len(set(ran)) == 2 and threading.get_ident() in ran
    finally:
        capped.shutdown()


def test_a_batch_raises_only_once_every_worker_ended():
    """An item failing in the caller's thread: the error leaves only after the items
    already running on the other workers ended (nothing writes into the caller's buffers
    after the call returned)."""
    import threading
    import time

    from cascade.core.pools import BYTES_PER_WORKER, Pools

    pools, me, ended = Pools(2, lambda: None), threading.get_ident(), []
    started = threading.Event()

    def item(i: int) -> None:
        if threading.get_ident() == me:
            started.wait(30)  # a helper holds an item now
            raise RuntimeError("injected")
        started.set()
        time.sleep(0.3)
        ended.append(i)

    try:
        with pytest.raises(RuntimeError, match="injected"):
            pools.parallel(item, range(2), None, item_bytes=BYTES_PER_WORKER)
        assert len(ended) == 1
    finally:
        pools.shutdown()


def test_hot_gets_and_puts_fill_the_latency_histograms(store):
    """Each hot put stored and each hot hit is timed (integer nanoseconds on the hot path)."""
    blocks = [pair(store.spec, i) for i in range(6)]
    for i, (k, v) in enumerate(blocks):
        store.put(k, v, block_id=ident(i))
    store.put(*blocks[0], block_id=ident(0))  # a dedup: counted, not timed as a store
    key_out, value_out = store.spec.empty()
    for _ in range(3):
        for i in range(6):
            assert store.get_into(ident(i), key_out, value_out)
    assert store.metrics.put_latency.count == 6
    assert store.metrics.get_latency[0].count == 18 and store.metrics.get_latency[0].total_s > 0


@pytest.mark.parametrize("ns", [0, 1, 999, 1000, 1001, 1999, 2000, 65_535_000, 10**12, 10**16])
def test_record_ns_uses_the_buckets_of_record(ns):
    seconds, nanos, hot = LatencyHistogram(), LatencyHistogram(), StoreMetrics(1)
    seconds.record(ns * 1e-9)
    nanos.record_ns(ns)
    hot.hot_hit(0, 1, ns)
    assert seconds.counts == nanos.counts == hot.get_latency[0].counts
    assert nanos.total_s == pytest.approx(seconds.total_s)
    batch = StoreMetrics(2)  # a batch of 3 hits in tier 1: each counted, timed, and a miss of tier 0
    batch.hot_hit(1, 3 * 7, ns, 3)
    assert batch.get_latency[1].counts == [3 * c for c in seconds.counts]
    assert batch.get_latency[1].total_s == pytest.approx(3 * seconds.total_s)
    assert (batch.counters.gets, batch.counters.hits, batch.tiers[1].hits, batch.tiers[1].bytes_read,
            batch.tiers[0].misses) == (3, 3, 3, 21, 3)


def test_namespace_and_priority_fast_checks_refuse_what_the_full_checks_refuse():
    assert check_namespace("tenant.a") == "tenant.a" and check_namespace("tenant.a") == "tenant.a"
    for bad in ("", "a b", "x" * 201, 7, None):
        with pytest.raises(InvalidBlock):
            check_namespace(bad)
    assert check_priority(3) == 3 and check_priority(np.int64(-2)) == -2
    for bad in (True, 65, -65, 1.0, "1"):
        with pytest.raises(InvalidBlock):
            check_priority(bad)


def _state(store) -> dict:
    """What the index, the policy and the counters hold, for comparing two stores."""
    index = store._index
    metas = {key: (m.tier, m.parent, m.depth, m.hits, m.shares, m.priority, m.ttl, list(m.child_tiers), m.nbytes)
             for key, m in index.blocks.items()}
    victims = []
    while (meta := index.victim(0)) is not None:  # leaves first: each set aside once chosen
        victims.append(meta.key[1])
        index.set_aside(meta)
    stats = store.stats()
    counts = {k: stats[k] for k in ("puts", "stored", "deduped", "rejected", "blocks")}
    return {"metas": metas, "ns_bytes": index.ns_bytes, "victims": victims, "counts": counts,
            "tier": {k: stats["tiers"]["shm"][k] for k in ("bytes_written", "full_events", "bytes")},
            "timed": store.metrics.put_latency.count}


def test_the_hot_put_leaves_the_state_of_the_full_put(tmp_path, monkeypatch):
    """The same puts (heads, chains, priorities, TTLs, two namespaces, dedups, a refused
    parent) through put_hot and through WritePath.put: the same index, policy order,
    namespace bytes and counts."""
    spec = BlockSpec.flat(2048)
    rng = random.Random(7)
    ops = []
    for i in range(60):
        parent = ident(i - 1) if i % 5 and rng.random() < 0.8 else None
        ops.append((i, parent, rng.choice([0, 0, 1, -2]), rng.choice([None, None, 30.0]), rng.choice(["default", "b"])))
    ops += [(rng.randrange(60), None, 0, None, "default") for _ in range(20)]  # dedups (or new in "default")
    states = []
    for hot in (True, False):
        cfg = Config(shm_bytes=128 * spec.block_bytes, file_bytes=0, shm_dir=str(tmp_path / str(hot)))
        with CascadeStore(cfg, block_spec=spec) as store:
            with monkeypatch.context() as m:
                if not hot:
                    m.setattr(store._writes, "put_hot", lambda *a: None)
                else:
                    m.setattr(WritePath, "put", lambda *a, **k: pytest.fail("left the hot path"))
                for i, parent, priority, ttl, ns in ops:
                    store.put(*pair(spec, i), block_id=ident(i), parent=parent, priority=priority, ttl=ttl, namespace=ns)
                with pytest.raises(InvalidBlock, match="own ancestor"):
                    store.put(*pair(spec, 1), block_id=ident(1), parent=ident(1))
            states.append(_state(store))
    assert states[0]["counts"]["stored"] > 50 and states[0]["counts"]["deduped"] > 0
    assert states[0] == states[1]


def test_store_hot_gives_the_room_back_when_the_copy_fails_or_is_refused(tmp_path, monkeypatch):
    tier = ShmTier(1 << 20, str(tmp_path))
    try:
        part = np.arange(2048, dtype=np.uint8)

        def failing(*args):
            raise OSError(5, "injected EIO")

        with monkeypatch.context() as m:
            m.setattr(slab_tier, "copy_in", failing)
            with pytest.raises(OSError, match="EIO"):
                tier.store_hot(("default", ident(1)), [part, part], 4096)
        assert tier.free == tier.capacity and ("default", ident(1)) not in tier
        assert not tier.store_hot(("default", ident(2)), [part, object()], 4096)  # no buffer: refused
        assert not tier.store_hot(("default", ident(3)), [part, part], 8192)  # parts of another size
        assert tier.free == tier.capacity and len(tier) == 0
        assert tier.store_hot(("default", ident(4)), [part, part], 4096)
        assert tier.free == tier.capacity - 4096 and tier.used == 4096
    finally:
        tier.close()


def test_store_hot_refuses_room_it_cannot_back_and_gives_it_back(tmp_path, monkeypatch):
    tier = ShmTier(1 << 20, str(tmp_path))  # backed lazily, as puts need it
    try:
        def no_memory(end):
            raise TierFull("injected: nothing left to back")
        monkeypatch.setattr(tier, "_back", no_memory)
        part = np.arange(2048, dtype=np.uint8)
        assert not tier.store_hot(("default", ident(1)), [part, part], 4096)
        assert tier.free == tier.capacity and len(tier) == 0 and tier.used == 0
    finally:
        tier.close()


@pytest.mark.parametrize("bad", [{"priority": True}, {"priority": 65}, {"priority": 1.0}, {"ttl": -1.0},
                                 {"ttl": "1"}, {"namespace": "a b"}, {"namespace": 7}, {"parent": "xyz"}])
def test_a_hot_put_with_a_bad_option_is_refused_before_anything_is_stored(store, bad):
    with pytest.raises(InvalidBlock):
        store.put(*pair(store.spec, 1), block_id=ident(1), **bad)
    assert len(store) == 0 and store.counters.puts == 0


@pytest.mark.parametrize("share", [0.0, 0.5])  # Policy, NamespaceVictims
def test_close_frees_the_block_metadata_without_the_garbage_collector(tmp_path, share):
    """A closed store's metadata goes at once, not at a later full collection whose pass
    over it a put or get elsewhere in the process would pay."""
    def metas() -> int:
        return sum(type(o) is BlockMeta for o in gc.get_objects())
    spec = BlockSpec.flat(4096)
    gc.collect()
    gc.disable()
    try:
        before = metas()
        cfg = Config(shm_bytes=64 * spec.block_bytes, file_bytes=0, shm_dir=str(tmp_path), namespace_share=share)
        with CascadeStore(cfg, block_spec=spec) as store:
            for i in range(16):
                store.put(*pair(spec, i), block_id=ident(i), parent=ident(i - 1) if i % 4 else None)
            store.get_into(ident(3), *spec.empty())
            assert store._index.victim(0) is not None
            assert metas() == before + 16
        assert metas() == before
    finally:
        gc.enable()
