"""CascadeStore on one rank: API, dedup, namespaces, policy rules, errors."""
from __future__ import annotations

import numpy as np
import pytest

from cascade import (BlockNotFound, BlockPinned, BlockSpec, CascadeStore, Config, InvalidBlock, TierFull,
                     block_id)
from cascade.errors import StoreClosed
from cascade.identity import COMPILED_ID_CHECK, check_id, check_id_python


def make_block(spec, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(spec.shape).astype(spec.dtype),
            rng.standard_normal(spec.shape).astype(spec.dtype))


@pytest.fixture
def store(tiny_config):
    with CascadeStore(tiny_config) as s:
        yield s


def test_put_get_roundtrip_and_id_is_content_digest(store):
    k, v = make_block(store.spec, 1)
    bid = store.put(k, v)
    assert bid == block_id(k, v) and len(bid) == 32
    got_k, got_v = store.get(bid)
    assert np.array_equal(got_k, k) and np.array_equal(got_v, v)
    assert got_k.dtype == k.dtype and got_k.shape == k.shape


def test_sha256_ids_selectable(tiny_config):
    with CascadeStore(tiny_config.replace(hash_algo="sha256")) as s:
        k, v = make_block(s.spec, 2)
        assert s.put(k, v) == block_id(k, v, algo="sha256") != block_id(k, v)


def test_get_into_fills_caller_buffers(store):
    k, v = make_block(store.spec, 3)
    bid = store.put(k, v)
    ko, vo = store.spec.empty()
    assert store.get_into(bid, ko, vo)
    assert np.array_equal(ko, k) and np.array_equal(vo, v)
    assert not store.get_into("f" * 32, ko, vo)


def test_dedup_adds_a_reference_not_a_copy(store):
    k, v = make_block(store.spec, 4)
    first = store.put(k, v)
    second = store.put(k.copy(), v.copy())
    stats = store.stats()
    assert first == second and len(store) == 1
    assert stats["stored"] == 1 and stats["deduped"] == 1 and stats["puts"] == 2
    assert store.stats()["tiers"]["shm"]["blocks"] == 1


def test_a_put_of_a_cached_id_checks_its_layout_as_a_new_put_does(store):
    # a strided key of the right shape and dtype was settled as a dedup (counted, no error)
    # when its id was cached, though the same put of a new id is refused
    k, v = make_block(store.spec, 4)
    bid = store.put(k, v, block_id="a" * 32)
    strided = np.repeat(k, 2, axis=0)[::2]
    assert strided.shape == k.shape and not strided.flags.c_contiguous
    for put in (lambda: store.put(strided, v, block_id=bid),
                lambda: store.put_many([(strided, v)], block_ids=[bid]),
                lambda: store.put(strided, v, block_id="b" * 32)):
        with pytest.raises(InvalidBlock, match="C-contiguous"):
            put()
    stats = store.stats()
    assert stats["deduped"] == 0 and stats["stored"] == 1 and len(store) == 1


def test_namespaces_isolate_tenants(store):
    k, v = make_block(store.spec, 5)
    bid = store.put(k, v, namespace="tenant-a")
    assert store.get(bid, namespace="tenant-b") is None
    assert not store.contains(bid, namespace="tenant-b")
    assert store.longest_prefix([bid], namespace="tenant-b") == 0
    # the same content put by another tenant is stored again, not deduplicated
    store.put(k, v, namespace="tenant-b")
    assert store.stats()["deduped"] == 0 and len(store) == 2


def test_caller_id_and_verify(store):
    k, v = make_block(store.spec, 6)
    assert store.put(k, v, block_id="a" * 32) == "a" * 32
    with pytest.raises(InvalidBlock, match="does not match"):
        store.put(k, v, block_id="b" * 32, verify=True)
    assert store.put(k, v, block_id=block_id(k, v), verify=True) == block_id(k, v)


@pytest.mark.parametrize("bad", [
    lambda s: (np.zeros((1, 2, 3), s.spec.dtype), np.zeros(s.spec.shape, s.spec.dtype)),  # shape
    lambda s: (np.zeros(s.spec.shape, np.float32), np.zeros(s.spec.shape, np.float32)),  # dtype
    lambda s: (np.zeros(s.spec.shape[::-1], s.spec.dtype).T, np.zeros(s.spec.shape, s.spec.dtype)),  # layout
    lambda s: (b"bytes", b"bytes"),  # not an array
])
def test_bad_input_is_a_clear_error_and_loses_nothing(store, bad):
    k, v = make_block(store.spec, 7)
    bid = store.put(k, v)
    with pytest.raises(InvalidBlock):
        store.put(*bad(store))
    assert store.get(bid) is not None and len(store) == 1


@pytest.mark.parametrize("bad", ["0" * 31, "0" * 33, "A" * 32, "0" * 31 + "g", " " + "0" * 31, "0" * 31 + "\n",
                                 "0" * 15 + "\u00e9" + "0" * 16, "0" * 16 + "-" + "0" * 15, "", b"0" * 32, 0, None])
@pytest.mark.parametrize("check", [check_id, check_id_python], ids=["compiled", "python"])
def test_check_id_refuses_anything_but_32_lowercase_hex_characters(check, bad):
    with pytest.raises(InvalidBlock, match="malformed block id") as raised:
        check(bad)
    assert str(raised.value) == f"malformed block id {bad!r}: expected 32 lowercase hex characters"


class _Id(str):
    pass


@pytest.mark.parametrize("check", [check_id, check_id_python], ids=["compiled", "python"])
def test_check_id_returns_a_good_id_itself(check):
    for good in ("0123456789abcdef" * 2, "f" * 32, block_id(np.zeros(4, np.uint8), np.ones(4, np.uint8)),
                 _Id("a" * 32)):
        assert check(good) is good


def test_the_compiled_id_check_was_built():
    """`make install` builds cascade/_ids.c; without it every put checks its id in Python."""
    assert COMPILED_ID_CHECK, "cascade._ids was not built: run `make install` (needs a C compiler)"


def test_malformed_ids_and_namespaces(store):
    with pytest.raises(InvalidBlock, match="malformed block id"):
        store.get("not-an-id")
    with pytest.raises(InvalidBlock, match="malformed namespace"):
        store.get("0" * 32, namespace="")
    for trailing_newline in ("0" * 32 + "\n", "f" * 32 + "\n"):
        with pytest.raises(InvalidBlock, match="malformed block id"):
            store.put(*make_block(store.spec, 1), block_id=trailing_newline)
    with pytest.raises(InvalidBlock, match="malformed namespace"):
        store.get("0" * 32, namespace="tenant\n")
    with pytest.raises(BlockNotFound):
        store.delete("0" * 32)
    with pytest.raises(BlockNotFound):
        store.pin("0" * 32)


def test_longest_prefix_and_chains(store):
    blocks = [make_block(store.spec, 10 + i) for i in range(5)]
    ids = store.put_many(blocks, chain=True)
    assert store.longest_prefix(ids) == 5
    store.delete(ids[2])
    assert store.longest_prefix(ids) == 2
    assert store.contains_many(ids) == [True, True, False, True, True]


def test_pinned_blocks_are_never_evicted(tiny_config):
    cfg = tiny_config.replace(file_bytes=0)  # one tier: eviction drops
    with CascadeStore(cfg) as s:
        k, v = make_block(s.spec, 20)
        pinned = s.put(k, v)
        s.pin(pinned)
        for i in range(200):
            s.put(*make_block(s.spec, 100 + i))
        assert s.contains(pinned)
        with pytest.raises(BlockPinned):
            s.delete(pinned)
        s.unpin(pinned)
        s.delete(pinned)


def test_all_pinned_tier_refuses_put(tiny_config):
    cfg = tiny_config.replace(file_bytes=0, shm_bytes=4 * 4096)
    with CascadeStore(cfg) as s:
        ids = [s.put(*make_block(s.spec, i)) for i in range(4)]
        for b in ids:
            s.pin(b)
        with pytest.raises(TierFull, match="pinned"):
            s.put(*make_block(s.spec, 99))
        assert all(s.contains(b) for b in ids)
        assert s.stats()["rejected"] == 1


def test_leaf_first_never_orphans_a_prefix(tiny_config):
    """Semantic eviction drops a chain's tail before its head."""
    capacity = 8
    cfg = tiny_config.replace(file_bytes=0, shm_bytes=capacity * 4096)
    with CascadeStore(cfg) as s:
        chain = s.put_many([make_block(s.spec, 200 + i) for i in range(6)], chain=True)
        for b in chain[:1]:  # the head is also the most used block
            s.get(b)
        others = [s.put(*make_block(s.spec, 300 + i)) for i in range(6)]
        cached = s.contains_many(chain)
        # 12 blocks in a tier of 8: four went, and the one-time blocks are worth no more
        # than the chain's tail, so eviction reached into the chain
        assert len(s) == capacity and s.stats()["tiers"]["shm"]["evictions"] == 12 - capacity
        assert 0 < sum(cached) < len(chain), cached
        # whatever survived is a prefix: no cached block after an evicted one
        assert cached == sorted(cached, reverse=True), cached
        assert sum(cached) + sum(s.contains_many(others)) == capacity


def test_lru_selectable_evicts_least_recent(tiny_config):
    cfg = tiny_config.replace(file_bytes=0, shm_bytes=4 * 4096, policy="lru")
    with CascadeStore(cfg) as s:
        ids = [s.put(*make_block(s.spec, 400 + i)) for i in range(4)]
        s.get(ids[0])
        s.put(*make_block(s.spec, 500))
        assert s.contains(ids[0]) and not s.contains(ids[1])


def test_frequency_beats_recency_in_semantic_policy(tiny_config):
    cfg = tiny_config.replace(file_bytes=0, shm_bytes=4 * 4096)
    with CascadeStore(cfg) as s:
        hot = s.put(*make_block(s.spec, 600))
        for _ in range(5):
            s.get(hot)
        for i in range(10):  # a scan of one-time blocks
            s.put(*make_block(s.spec, 700 + i))
        assert s.contains(hot)


def in_tier(tier) -> set[str]:
    return {b for _, b in tier}


def test_eviction_demotes_to_file_tier_and_hits_promote(store):
    shm_blocks = store.tiers[0].capacity // store.spec.block_bytes  # 64 (tiny_config)
    ids = [store.put(*make_block(store.spec, 800 + i)) for i in range(100)]
    stats = store.stats()["tiers"]
    assert stats["shm"]["demotions"] == stats["file"]["blocks"] == 100 - shm_blocks
    assert all(store.contains(b) for b in ids)  # nothing dropped: the file tier had room
    lustre = in_tier(store.tiers[1])
    victim = next(i for i, b in enumerate(ids) if b in lustre)
    got = store.get(ids[victim])
    k, v = make_block(store.spec, 800 + victim)
    assert got is not None and np.array_equal(got[0], k) and np.array_equal(got[1], v)  # the bytes it was given
    assert store.stats()["tiers"]["file"]["promotions"] == 1
    assert ids[victim] in in_tier(store.tiers[0]) and ids[victim] not in in_tier(store.tiers[1])
    again = store.get(ids[victim])  # now served by the fast tier, still the same bytes
    assert np.array_equal(again[0], k) and np.array_equal(again[1], v)
    assert store.stats()["tiers"]["shm"]["hits"] == 1


def test_ttl_expires_blocks(tiny_config, monkeypatch):
    import time  # the clock every layer of the store reads

    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    with CascadeStore(tiny_config) as s:
        bid = s.put(*make_block(s.spec, 900), ttl=10)
        clock[0] += 5
        assert s.get(bid) is not None  # last-use TTL: this use restarts the clock
        clock[0] += 9
        assert s.contains(bid)
        clock[0] += 2
        assert s.get(bid) is None and s.stats()["expired"] == 1
        pinned = s.put(*make_block(s.spec, 901), ttl=1)
        s.pin(pinned)
        clock[0] += 100
        assert s.contains(pinned)  # a pinned block never expires


@pytest.mark.parametrize("tier", ["shm", "file"])
def test_blocks_past_their_ttl_go_without_a_read(tiny_config, tier):
    import time

    def gone(store, bid, within=10.0) -> bool:  # polled: the sweep runs on its own thread
        end = time.monotonic() + within
        while time.monotonic() < end:
            if ("default", bid) not in store._meta:
                return True
            time.sleep(0.02)
        return False

    with CascadeStore(tiny_config.replace(shm_bytes=0) if tier == "file" else tiny_config) as s:
        put = s.put(*make_block(s.spec, 910), ttl=0.3)
        later = s.put(*make_block(s.spec, 912))
        s.set_ttl(later, 0.3)  # a TTL given after the put
        pinned = s.put(*make_block(s.spec, 913), ttl=0.3)
        s.pin(pinned)
        kept = s.put(*make_block(s.spec, 914), ttl=3600)
        assert gone(s, put) and gone(s, later)
        assert s.stats()["expired"] == 2 and s.stats()["tiers"][tier]["blocks"] == 2
        assert s.contains(pinned) and s.contains(kept)  # pinned: never expires; not due yet
        s.unpin(pinned)
        assert gone(s, pinned) and s.stats()["expired"] == 3 and s.contains(kept)
    if tier == "file":  # the records went too
        with CascadeStore(tiny_config.replace(shm_bytes=0)) as s:
            assert len(s) == 1 and s.contains(kept)


def test_background_expiry_survives_any_ttl_and_forgets_blocks_that_leave(tiny_config):
    import time

    with CascadeStore(tiny_config.replace(default_ttl=3600)) as s:
        s.put(*make_block(s.spec, 920), ttl=1e10)  # first due: the thread's wait was past what a lock takes
        short = s.put(*make_block(s.spec, 921), ttl=0.2)
        end = time.monotonic() + 10
        while ("default", short) in s._meta and time.monotonic() < end:
            time.sleep(0.02)
        assert ("default", short) not in s._meta and s.stats()["expired"] == 1
        churn = make_block(s.spec, 922)
        for _ in range(3000):  # blocks that leave take their entries with them
            s.delete(s.put(*churn))
        for _ in range(3000):
            s.set_ttl(s.put(*churn), 3600)
        live = len(s._expiry._entry)
        assert live <= len(s) and len(s._expiry._due) <= 2 * live + 1025


def test_first_use_ttl(tiny_config, monkeypatch):
    import time  # the clock every layer of the store reads

    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    with CascadeStore(tiny_config.replace(ttl_mode="first_use")) as s:
        bid = s.put(*make_block(s.spec, 902), ttl=10)
        clock[0] = 8
        assert s.get(bid) is not None
        clock[0] = 11
        assert not s.contains(bid)


def test_priority_protects_a_block(tiny_config):
    cfg = tiny_config.replace(file_bytes=0, shm_bytes=4 * 4096)
    with CascadeStore(cfg) as s:
        keep = s.put(*make_block(s.spec, 1000), priority=4)
        for i in range(10):
            s.put(*make_block(s.spec, 1100 + i))
        assert s.contains(keep)


def test_stats_add_up(store):
    for i in range(80):
        store.put(*make_block(store.spec, 1200 + i % 60))
    st = store.stats()
    assert st["puts"] == st["stored"] + st["deduped"] + st["rejected"] == 80
    assert st["deduped"] == 20
    tiers = st["tiers"]
    assert tiers["shm"]["blocks"] + tiers["file"]["blocks"] == st["blocks"] == 60


def test_concurrent_threads_keep_invariants(store):
    import threading

    errors = []

    def worker(seed):
        try:
            for i in range(40):
                k, v = make_block(store.spec, seed * 1000 + i % 25)
                bid = store.put(k, v)
                got = store.get(bid)
                if got is not None and not (np.array_equal(got[0], k) and np.array_equal(got[1], v)):
                    errors.append(bid)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    st = store.stats()
    assert errors == []
    assert st["puts"] == st["stored"] + st["deduped"] + st["rejected"] == 160


def test_clear_drops_unpinned_blocks_of_a_namespace(store):
    a = [store.put(*make_block(store.spec, 1300 + i), namespace="a") for i in range(3)]
    b = store.put(*make_block(store.spec, 1400), namespace="b")
    store.pin(a[0], namespace="a")
    assert store.clear(namespace="a") == 2
    assert store.contains(a[0], namespace="a") and not store.contains(a[1], namespace="a")
    assert store.contains(b, namespace="b")


def test_a_put_goes_to_a_slower_tier_when_the_fastest_is_all_pinned(store):
    pinned = [store.put(*make_block(store.spec, 1500 + i)) for i in range(64)]  # fills SHM
    for b in pinned:
        store.pin(b)
    extra = store.put(*make_block(store.spec, 1600))
    assert extra in in_tier(store.tiers[1])
    assert in_tier(store.tiers[0]) == set(pinned)
    assert store.stats()["rejected"] == 0


def test_use_counts_outlive_eviction(tiny_config):
    """A block used often, dropped, then put again starts from its old count."""
    cfg = tiny_config.replace(file_bytes=0, shm_bytes=4 * 4096)
    with CascadeStore(cfg) as s:
        hot_block = make_block(s.spec, 1700)
        hot = s.put(*hot_block)
        for _ in range(6):
            s.get(hot)
        scanned = 0
        while s.contains(hot):  # a long scan pushes it out in the end
            s.put(*make_block(s.spec, 1800 + scanned))
            scanned += 1
            assert scanned < 500
        assert scanned > 4  # it outlived a whole tier's worth of one-time blocks
        s.put(*hot_block)
        assert s._meta[("default", hot)].hits == 7
        fresh = s.put(*make_block(s.spec, 2900))
        assert s._meta[("default", fresh)].hits == 0


def test_hint_promotes_and_protects_until_read(tmp_path):
    from cascade import Config

    cfg = Config(model="tiny", shm_bytes=8 * 4096, file_bytes=64 * 4096, file_dir=str(tmp_path / "f"),
                 file_segment_bytes=1 << 20, hint_fraction=0.5)
    with CascadeStore(cfg) as s:
        blocks = [make_block(s.spec, 100 + i) for i in range(12)]
        ids = [s.put(k, v) for k, v in blocks]
        shm, lustre = s.tiers[0], s.tiers[-1]
        assert ids[0] in [b for _, b in lustre] and ids[0] not in [b for _, b in shm]
        assert s.hint(ids[:2]) == 2
        s.flush()  # promotions run in the background; flush waits for them
        assert {ids[0], ids[1]} <= {b for _, b in shm}  # promoted to the fastest tier
        for k, v in (make_block(s.spec, 200 + i) for i in range(20)):  # churn SHM
            s.put(k, v)
        assert {ids[0], ids[1]} <= {b for _, b in shm}  # still there: protected
        # the cap: 4 of the 8 SHM blocks may be hinted; further hints are refused
        assert s.hint(ids[2:8]) == 2 and s.stats()["hinted_bytes"] == 4 * s.spec.block_bytes
        got = s.get(ids[0])  # uses up the hint
        assert got is not None and np.array_equal(got[0], blocks[0][0])
        assert s.unhint(ids[1:4]) == 3 and s.unhint([ids[1]]) == 0
        assert s.stats()["hinted_bytes"] == 0
        for k, v in (make_block(s.spec, 300 + i) for i in range(20)):
            s.put(k, v)
        assert ids[0] not in {b for _, b in shm}  # unprotected again: evicted from SHM
        assert s.hint(["f" * 32]) == 0  # not cached: ignored


def test_a_hints_promotion_that_meets_an_io_error_keeps_the_block(tmp_path, monkeypatch):
    # an EIO is no evidence against the bytes: a get keeps such a block, and so does a
    # promotion now (it dropped the block and counted a corruption)
    import errno

    import cascade.tiers.file_reads as file_reads
    from cascade import Config

    cfg = Config(model="tiny", shm_bytes=8 * 4096, file_bytes=64 * 4096, file_dir=str(tmp_path / "f"),
                 file_segment_bytes=1 << 20, hint_fraction=0.5)
    with CascadeStore(cfg) as s:
        blocks = [make_block(s.spec, 500 + i) for i in range(12)]
        ids = [s.put(k, v) for k, v in blocks]
        assert ids[0] in [b for _, b in s.tiers[-1]]
        read, fails = file_reads.read_hashed, [1]

        def flaky(*args, **kwargs):
            if fails[0]:
                fails[0] -= 1
                raise OSError(errno.EIO, "injected: Input/output error")
            return read(*args, **kwargs)

        monkeypatch.setattr(file_reads, "read_hashed", flaky)
        assert s.hint([ids[0]]) == 1
        s.flush()
        assert fails == [0]  # the promotion met the error
        file_tier = s.stats()["tiers"][s.tiers[-1].name]
        assert file_tier["read_errors"] == 1 and file_tier["corruptions"] == 0
        got = s.get(ids[0])  # still cached, and the bytes are right
        assert got is not None and np.array_equal(got[1], blocks[0][1])


def test_a_hint_that_a_close_overtakes_returns_its_count(tmp_path):
    # a close() that began after the hints were taken, before their promotions were handed
    # to the workers, made hint() raise StoreClosed though it had taken (and counted) them
    import threading
    import time

    from cascade import Config

    cfg = Config(model="tiny", shm_bytes=8 * 4096, file_bytes=64 * 4096, file_dir=str(tmp_path / "f"),
                 file_segment_bytes=1 << 20, hint_fraction=0.5)
    s = CascadeStore(cfg)
    ids = [s.put(*make_block(s.spec, 600 + i)) for i in range(12)]
    assert ids[0] in [b for _, b in s.tiers[-1]]
    closer = threading.Thread(target=s.close)
    hint = s._reads.hint

    def hint_then_close(*args, **kwargs):  # the locked step, then a close() from another thread
        taken = hint(*args, **kwargs)
        closer.start()
        deadline = time.monotonic() + 30
        while not s._async._closed and time.monotonic() < deadline:  # its first step: no new calls
            time.sleep(0.001)
        return taken

    s._reads.hint = hint_then_close
    assert s.hint([ids[0]]) == 1
    closer.join(60)
    assert not closer.is_alive()
    with pytest.raises(StoreClosed):
        s.hint([ids[0]])


def test_unhint_at_a_position_leaves_the_default_position_of_later_hints(tmp_path):
    from cascade import Config

    cfg = Config(model="tiny", shm_bytes=8 * 4096, file_bytes=0, remote_bytes=0)
    with CascadeStore(cfg) as s:
        ids = [s.put(*make_block(s.spec, 600 + i)) for i in range(3)]
        assert s.hint([ids[0]], position=5) == 1
        assert s.unhint([ids[2]], position=1e9) == 0  # no such hint: nothing changes
        assert s.hint([ids[1]]) == 1  # default: right after every earlier hint
        assert s._index.get(("default", ids[1])).hint_uses == [6.0]


def test_hints_count_and_deleted_blocks_release_their_bytes(store):
    k, v = make_block(store.spec, 7)
    bid = store.put(k, v)
    assert store.hint([bid, bid]) == 2
    assert store.get(bid) is not None and store.stats()["hinted_bytes"] == store.spec.block_bytes
    assert store.get(bid) is not None and store.stats()["hinted_bytes"] == 0
    store.hint([bid])
    store.delete(bid)
    assert store.stats()["hinted_bytes"] == 0


def test_a_hint_returns_at_once_and_its_promotion_runs_outside_the_lock(tmp_path):
    """hint() only takes the hints; the copies up run on the I/O workers, and a get of a
    hinted block in the meantime reads it where it is (and cancels its promotion)."""
    import threading

    from cascade import Config

    cfg = Config(model="tiny", shm_bytes=8 * 4096, file_bytes=64 * 4096, file_dir=str(tmp_path / "f"))
    with CascadeStore(cfg) as s:
        blocks = [make_block(s.spec, 500 + i) for i in range(12)]
        ids = [s.put(k, v) for k, v in blocks]
        shm = s.tiers[0]
        gate = threading.Event()
        blockers = [s._async.submit(gate.wait) for _ in range(s.config.io_threads)]  # every worker busy
        assert s.hint(ids[:3]) == 3  # returns although no promotion could run yet
        assert not {ids[0], ids[1], ids[2]} & {b for _, b in shm}
        got = s.get(ids[2])  # read where it is: uses up its hint, so its promotion is cancelled
        assert got is not None and np.array_equal(got[1], blocks[2][1])
        s.unhint([ids[1]])  # withdrawn before its promotion ran: cancelled too
        gate.set()
        assert all(b.result(timeout=30) for b in blockers)
        s.flush()
        in_shm = {b for _, b in shm}
        assert ids[0] in in_shm and ids[1] not in in_shm
        assert s.stats()["tiers"]["file"]["promotions"] >= 2  # ids[0] by its hint, ids[2] by its get
        got = s.get(ids[0])
        assert got is not None and np.array_equal(got[0], blocks[0][0])


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e5m2", "float8_e4m3fn"])
def test_an_ml_dtypes_block_in_the_file_tier_reads_back_one_by_one_and_in_a_batch(tmp_path, dtype):
    # numpy arrays whose dtype memoryview does not take (ml_dtypes') are read through byte views
    cfg = Config(shm_bytes=0, remote_bytes=0, file_bytes=1 << 20, file_dir=str(tmp_path))
    with CascadeStore(cfg, block_spec=BlockSpec(shape=(4, 16), dtype=dtype)) as s:
        key, value = s.spec.empty()
        key[...], value[...] = 1.5, -2.25
        bid = s.put(key, value)
        out = s.spec.empty()
        assert s.get_into(bid, *out) and np.array_equal(out[0], key) and np.array_equal(out[1], value)
        outs = [s.spec.empty()]
        assert s.get_many_into([bid], outs) == [True] and np.array_equal(outs[0][1], value)
        assert s.stats()["hits"] == 2


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "file"])
def test_outputs_that_overlap_are_refused_and_the_block_stays(tmp_path, shm):
    # a file-tier record read into overlapping outputs failed its checksum and was dropped
    # as corrupt; an SHM hit returned mixed bytes; a batch's pairs sharing memory let one
    # block's read land in another's outputs
    from cascade import Config, InvalidBlock

    cfg = Config(model="tiny", shm_bytes=64 * 4096 if shm else 0, file_bytes=1 << 20, remote_bytes=0,
                 file_dir=str(tmp_path / "f"), shm_dir=str(tmp_path))
    with CascadeStore(cfg) as s:
        blocks = [make_block(s.spec, 700 + i) for i in range(3)]
        ids = [s.put(k, v) for k, v in blocks]
        flat = np.zeros(3 * s.spec.half_bytes // s.spec.np_dtype.itemsize, s.spec.np_dtype)
        n = flat.size // 3
        key_out = flat[:n].reshape(s.spec.shape)
        value_out = flat[n // 2:n // 2 + n].reshape(s.spec.shape)  # shares key_out's second half
        for _ in range(2):  # the hot path's copy refuses them too
            with pytest.raises(InvalidBlock, match="overlap"):
                s.get_into(ids[0], key_out, value_out)
        pair = tuple(np.zeros(s.spec.shape, s.spec.np_dtype) for _ in range(2))
        with pytest.raises(InvalidBlock, match="overlap"):
            s.get_many_into(ids[:2], [pair, pair])
        assert not flat.any() and not pair[0].any()  # nothing written
        stats = s.stats()
        assert stats["gets"] == 0 and all(t["corruptions"] == 0 for t in stats["tiers"].values())
        got = s.get(ids[0])
        assert got is not None and np.array_equal(got[0], blocks[0][0])

