"""Every documented error of the store's public API, on one rank: the documented type,
and nothing stored, counted or left behind by the refused call (public API only)."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from cascade import (BlockNotFound, BlockPinned, BlockSpec, CascadeStore, Config, ConfigError,
                     InvalidBlock, TierFull, block_id)
from cascade.core import batch_reads, reads
from cascade.errors import StoreClosed
from cascade.tiers import slab_tier
from cascade.tiers.file_tier import FileTier
from cascade.tiers.record_io import HEADER_KEY_FILE
from cascade.tiers.shm import ShmTier


def make_block(spec, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(spec.shape).astype(spec.dtype),
            rng.standard_normal(spec.shape).astype(spec.dtype))


def same(got, expected) -> bool:
    return got is not None and all(np.array_equal(a, b) for a, b in zip(got, expected))


def lock_free_to_another_thread(store) -> bool:
    """Whether another thread takes ``store``'s lock at once (nothing left it held)."""
    taken = []
    other = threading.Thread(target=lambda: taken.append(store._lock.acquire(timeout=5) and store._lock.release() is None))
    other.start()
    other.join()
    return taken == [True]


def entries(path: Path) -> list[str]:
    return sorted(os.listdir(path)) if path.exists() else []


@pytest.fixture
def config(tmp_path) -> Config:
    """Tiny blocks, SHM and file tiers in this test's own directories (so leaks show)."""
    (tmp_path / "shm").mkdir()
    return Config(model="tiny", shm_bytes=8 * 4096, file_bytes=64 * 8192, shm_dir=str(tmp_path / "shm"),
                  file_dir=str(tmp_path / "files"), file_segment_bytes=1 << 20)


@pytest.fixture
def store(config):
    with CascadeStore(config) as s:
        yield s


def counts(store) -> tuple[int, int, int, int]:
    """(blocks, puts, gets, hints): what a refused call must leave as it was."""
    st = store.stats()
    return len(store), st["puts"], st["gets"], st["hints"]


# -- construction ---------------------------------------------------------------------------
def test_given_tiers_are_used_fastest_first(config, tmp_path):
    spec = BlockSpec.for_model("tiny", config.block_tokens)
    shm = ShmTier(2 * spec.block_bytes, str(tmp_path / "shm"))
    files = FileTier(16 * spec.block_bytes, str(tmp_path / "given"), segment_bytes=1 << 20)
    with CascadeStore(config.replace(demote_high=1.0), tiers=[shm, files]) as s:  # no background demoter: counts
        ids = [s.put(*make_block(s.spec, i)) for i in range(5)]
        tiers = s.stats()["tiers"]
        assert (tiers["shm"]["blocks"], tiers["file"]["blocks"]) == (2, 3)  # two fit the fast tier
        assert all(same(s.get(b), make_block(s.spec, i)) for i, b in enumerate(ids))
    assert entries(tmp_path / "shm") == []  # the slab went with the store


@pytest.mark.parametrize("given", [True, False], ids=["tiers", "config"])
def test_no_tier_with_capacity_is_tierfull_and_leaves_no_data(config, tmp_path, given):
    empty = config.replace(shm_bytes=0, file_bytes=0, gpu_bytes=0)
    tiers = [ShmTier(0, str(tmp_path / "shm")), FileTier(0, str(tmp_path / "files"))] if given else None
    with pytest.raises(TierFull, match="no tier has capacity"):
        CascadeStore(empty, tiers=tiers)
    assert entries(tmp_path / "shm") == []  # no slab
    # (a file tier opens its directory, lock, header key and first segment even at
    # capacity 0: no block data)
    assert [p.name for p in (tmp_path / "files").rglob("*") if p.stat().st_size and p.name != HEADER_KEY_FILE] == []


def test_unknown_model_preset_and_hash_algorithm(config, tmp_path):
    with pytest.raises(ConfigError, match="unknown preset 'no-such-model'"):
        config.replace(model="no-such-model")
    with pytest.raises(ConfigError, match="hash_algo"):
        config.replace(hash_algo="md5")
    with pytest.raises(ConfigError, match="unknown model preset"):
        BlockSpec.for_model("no-such-model", 16)
    k, v = make_block(BlockSpec.for_model("tiny", 16), 1)
    with pytest.raises(InvalidBlock, match="unknown hash algorithm 'md5'"):
        block_id(k, v, algo="md5")
    assert entries(tmp_path / "shm") == [] and not (tmp_path / "files").exists()  # no store was started


# -- put ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [
    {"parent": "not-an-id"}, {"parent": "A" * 32}, {"parent": 42},
    {"namespace": ""}, {"namespace": "bad namespace!"}, {"namespace": None},
    {"block_id": "0" * 31}, {"priority": 1.5}, {"ttl": -1},
], ids=lambda b: f"{next(iter(b))}={next(iter(b.values()))!r}")
def test_a_malformed_put_argument_is_invalid_and_stores_nothing(store, bad):
    before = counts(store)
    with pytest.raises(InvalidBlock):
        store.put(*make_block(store.spec, 1), **bad)
    assert counts(store) == before == (0, 0, 0, 0)
    assert store.stats()["tiers"]["shm"]["bytes"] == 0
    assert not store.contains(block_id(*make_block(store.spec, 1)))


def test_put_many_with_the_wrong_number_of_ids_stores_nothing(store):
    pairs = [make_block(store.spec, i) for i in range(3)]
    with pytest.raises(InvalidBlock, match="3 blocks but 2 block_ids"):
        store.put_many(pairs, block_ids=["a" * 32, "b" * 32])
    with pytest.raises(InvalidBlock):
        store.put_many(pairs, block_ids=["a" * 32, "b" * 32, "not-an-id"])
    assert counts(store) == (0, 0, 0, 0)




@pytest.mark.parametrize("workers", [1, 4])
def test_put_many_stores_the_good_blocks_and_raises_the_bad_ones_error(store, workers):
    pairs = [make_block(store.spec, i) for i in range(4)]
    pairs.insert(2, (np.zeros((1, 2), store.spec.dtype), pairs[0][1]))  # the wrong shape
    with pytest.raises(InvalidBlock, match="shape"):
        store.put_many(pairs, max_workers=workers)
    good = [block_id(*p) for i, p in enumerate(pairs) if i != 2]
    assert store.contains_many(good) == [True] * 4  # each put is its own operation
    st = store.stats()
    assert len(store) == st["puts"] == st["stored"] == 4
    assert all(same(store.get(b), pairs[i if i < 2 else i + 1]) for i, b in enumerate(good))


NOT_PAIRS = {"three parts": lambda k, v: (k, v, k), "one part": lambda k, v: (k,), "a bare array": lambda k, v: k.reshape(-1),
             "None": lambda k, v: None}


@pytest.mark.parametrize("bad", NOT_PAIRS)
@pytest.mark.parametrize("workers", [None, 2])
def test_a_batch_element_that_is_not_a_pair_is_invalid_and_does_nothing(store, bad, workers):
    good = make_block(store.spec, 1)
    ids = ["1" * 32, "2" * 32]
    for call in (lambda: store.put_many([good, NOT_PAIRS[bad](*good)], block_ids=ids, max_workers=workers),
                 lambda: store.put_many_async([good, NOT_PAIRS[bad](*good)], block_ids=ids)):
        with pytest.raises(InvalidBlock, match="element 1 is not a \\(key, value\\) pair"):
            call()
    assert counts(store) == (0, 0, 0, 0)
    store.put(*good, block_id=ids[0])
    outs = store.spec.empty()
    for k in outs:
        k.fill(7)
    for call in (lambda: store.get_many_into(ids, [outs, NOT_PAIRS[bad](*store.spec.empty())], max_workers=workers),
                 lambda: store.get_many_into_async(ids, [outs, NOT_PAIRS[bad](*store.spec.empty())])):
        with pytest.raises(InvalidBlock, match="element 1 is not a \\(key, value\\) pair"):
            call()
    assert store.stats()["gets"] == 0 and all((k == 7).all() for k in outs)
    store.flush()
    assert counts(store) == (1, 1, 0, 0)


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "2"])
def test_a_batch_with_max_workers_not_a_positive_integer_is_refused_and_does_nothing(store, workers):
    good = make_block(store.spec, 1)
    ids = ["1" * 32]
    outs = store.spec.empty()
    for name, call in (("put_many", lambda: store.put_many([good], block_ids=ids, max_workers=workers)),
                       ("put_many_async", lambda: store.put_many_async([good], block_ids=ids, max_workers=workers)),
                       ("get_many", lambda: store.get_many(ids, max_workers=workers)),
                       ("get_many_into", lambda: store.get_many_into(ids, [outs], max_workers=workers)),
                       ("get_many_into_async", lambda: store.get_many_into_async(ids, [outs], max_workers=workers))):
        with pytest.raises(ConfigError, match=f"{name}: max_workers must be a positive integer or None"):
            call()
    store.flush()
    assert counts(store) == (0, 0, 0, 0) and store.stats()["gets"] == 0
    assert store.put_many([good], block_ids=ids, max_workers=1) == ids
    assert store.get_many_into(ids, [outs], max_workers=1) == [True]


def test_a_batched_put_refused_as_its_own_ancestor_keeps_the_counts_adding_up(config):
    # The SHM tier full and no demoter to empty it: the batch takes the claimed path,
    # which checks its puts in order (so the third finds the cycle).
    with CascadeStore(config.replace(demote_high=1.0, demote_low=1.0)) as store:
        for i in range(8):
            store.put(*make_block(store.spec, i))
        a, b = make_block(store.spec, 10), make_block(store.spec, 11)
        with pytest.raises(InvalidBlock, match="own ancestor"):
            store.put_many([a, b, a], chain=True, block_ids=["a" * 32, "b" * 32, "a" * 32])
        st = store.stats()
        assert st["rejected"] == 1 and st["puts"] == st["stored"] + st["deduped"] + st["rejected"]


def test_a_chained_put_many_with_a_bad_block_stores_nothing(store):
    pairs = [make_block(store.spec, i) for i in range(4)]
    pairs[3] = (pairs[3][0].astype(np.float64), pairs[3][1])  # the wrong dtype
    with pytest.raises(InvalidBlock, match="dtype"):
        store.put_many(pairs, chain=True)  # parents are the ids before: all checked first
    assert counts(store) == (0, 0, 0, 0)


# -- get ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["shape", "dtype", "read-only", "layout", "not an array"])
def test_a_wrong_output_is_invalid_and_reads_nothing(store, bad):
    bid = store.put(*make_block(store.spec, 1))
    k, v = store.spec.empty()
    if bad == "shape":
        k = np.empty((1,) + k.shape, k.dtype)
    elif bad == "dtype":
        v = np.empty(v.shape, np.float64)
    elif bad == "read-only":
        v.flags.writeable = False
    elif bad == "layout":
        k = np.empty(k.shape[::-1], k.dtype).T
    else:
        k = bytearray(k.nbytes)
    with pytest.raises(InvalidBlock):
        store.get_into(bid, k, v)
    with pytest.raises(InvalidBlock):
        store.get_many_into([bid], [(k, v)])
    st = store.stats()
    assert (st["gets"], st["hits"], st["misses"]) == (0, 0, 0)
    assert same(store.get(bid), make_block(store.spec, 1))  # still there, intact


def test_get_many_into_with_the_wrong_number_of_outputs_reads_nothing(store):
    ids = [store.put(*make_block(store.spec, i)) for i in range(3)]
    outs = [store.spec.empty() for _ in range(2)]
    for k, v in outs:
        k.fill(7)
        v.fill(7)
    with pytest.raises(InvalidBlock, match="3 ids but 2 output pairs"):
        store.get_many_into(ids, outs)
    assert store.stats()["gets"] == 0
    assert all((k == 7).all() and (v == 7).all() for k, v in outs)  # untouched


def test_a_bad_output_among_good_ones_reads_nothing(store):
    ids = [store.put(*make_block(store.spec, i)) for i in range(3)]
    outs = [store.spec.empty() for _ in range(3)]
    for k, v in outs:
        k.fill(7)
        v.fill(7)
    outs[2] = (outs[2][0], np.empty(3, store.spec.dtype))
    with pytest.raises(InvalidBlock):
        store.get_many_into(ids, outs)  # every output is checked before any read
    assert store.stats()["gets"] == 0
    assert all((k == 7).all() and (v == 7).all() for k, v in outs[:2])


@pytest.mark.parametrize("workers", [1, 4])
def test_get_many_into_reads_the_good_ids_and_raises_the_bad_ones_error(store, workers):
    ids = [store.put(*make_block(store.spec, i)) for i in range(3)]
    asked = [ids[0], "not-an-id", ids[1], ids[2]]
    outs = [store.spec.empty() for _ in asked]
    with pytest.raises(InvalidBlock, match="malformed block id"):
        store.get_many_into(asked, outs, max_workers=workers)
    assert all(same(outs[j], make_block(store.spec, i)) for i, j in enumerate((0, 2, 3)))
    st = store.stats()
    assert (st["gets"], st["hits"], st["misses"]) == (3, 3, 0)  # the malformed id counted nothing


# -- block operations on absent ids -----------------------------------------------------------
@pytest.mark.parametrize("op", ["set_ttl", "set_priority", "unpin", "pin", "delete"])
def test_an_absent_block_is_blocknotfound(store, op):
    present = store.put(*make_block(store.spec, 1))
    call = {"set_ttl": lambda b, ns: store.set_ttl(b, 5.0, namespace=ns),
            "set_priority": lambda b, ns: store.set_priority(b, 2, namespace=ns),
            "unpin": lambda b, ns: store.unpin(b, namespace=ns), "pin": lambda b, ns: store.pin(b, namespace=ns),
            "delete": lambda b, ns: store.delete(b, namespace=ns)}[op]
    absent = block_id(*make_block(store.spec, 2))
    with pytest.raises(BlockNotFound, match=absent):
        call(absent, "default")
    with pytest.raises(BlockNotFound):
        call(present, "other")  # the same id in another namespace is another block
    assert len(store) == 1 and not store.contains(absent) and store.stats()["deletes"] == 0
    store.delete(present)  # no pin or other hold was left on the present block
    assert len(store) == 0


@pytest.mark.parametrize("call", ["pin", "set_ttl", "set_priority", "delete"])
def test_an_expired_block_is_blocknotfound_and_stays_gone(store, call):
    import time

    bid = store.put(*make_block(store.spec, 1), ttl=0.05)
    time.sleep(0.1)
    with pytest.raises(BlockNotFound):
        {"pin": lambda: store.pin(bid), "set_ttl": lambda: store.set_ttl(bid, 100),
         "set_priority": lambda: store.set_priority(bid, 3), "delete": lambda: store.delete(bid)}[call]()
    assert store.hint([bid]) == 0 and store.stats()["hinted_bytes"] == 0  # nothing to hint either
    assert not store.contains(bid) and store.get(bid) is None
    assert store.stats()["deletes"] == 0


def test_hint_arguments_are_checked(store):
    bid = store.put(*make_block(store.spec, 1))
    for call in (store.hint, store.unhint, store.contains_many):
        with pytest.raises(InvalidBlock, match="wrap it in a list"):
            call(bid)  # one id where a list is due
    with pytest.raises(ConfigError, match="finite"):
        store.unhint([bid], position=float("nan"))
    with pytest.raises(InvalidBlock, match="namespace"):
        store.clear(namespace="")
    assert store.contains(bid) and store.stats()["hints"] == 0


def test_unpin_without_a_pin_is_refused_and_keeps_other_pins(store):
    bid = store.put(*make_block(store.spec, 1))
    with pytest.raises(BlockPinned, match="not pinned"):
        store.unpin(bid)
    store.pin(bid)
    store.unpin(bid)
    with pytest.raises(BlockPinned, match="not pinned"):
        store.unpin(bid)  # one pin, one unpin: the count never goes below zero
    store.delete(bid)


# -- hints ----------------------------------------------------------------------------------
def test_a_malformed_hint_id_takes_no_hint(store):
    bid = store.put(*make_block(store.spec, 1))
    with pytest.raises(InvalidBlock, match="malformed block id"):
        store.hint([bid, "not-an-id"])  # all ids checked before any hint is taken
    with pytest.raises(InvalidBlock, match="malformed namespace"):
        store.hint([bid], namespace="")
    st = store.stats()
    assert st["hints"] == 0 and st["hinted_bytes"] == 0
    assert store.hint([bid]) == 1
    with pytest.raises(InvalidBlock, match="malformed block id"):
        store.unhint([bid, "X" * 32])
    assert store.stats()["hinted_bytes"] == store.spec.block_bytes  # the hint still holds
    assert store.unhint([bid]) == 1 and store.stats()["hinted_bytes"] == 0


# -- close ----------------------------------------------------------------------------------
def test_close_keep_false_drops_the_fast_tiers_and_leaves_no_slab(config, tmp_path):
    with CascadeStore(config) as s:  # a clean close keeps the hot blocks (the default)
        kept = [s.put(*make_block(s.spec, i)) for i in range(4)]
        assert s.stats()["tiers"]["shm"]["blocks"] == 4
    s = CascadeStore(config)
    assert s.contains_many(kept) == [True] * 4 and s.stats()["tiers"]["file"]["blocks"] == 4
    s.delete(kept[0])
    hot = [s.put(*make_block(s.spec, 100 + i)) for i in range(3)]  # in SHM only
    assert s.stats()["tiers"]["shm"]["blocks"] == 3
    assert s.close(keep=False) is None
    assert s.close() is None  # idempotent
    assert entries(tmp_path / "shm") == []  # the slab file is gone
    with CascadeStore(config) as again:
        assert again.contains_many(hot) == [False] * 3  # not moved down on the way out
        assert again.contains_many(kept[1:]) == [True] * 3 and not again.contains(kept[0])
        assert all(same(again.get(b), make_block(again.spec, i + 1)) for i, b in enumerate(kept[1:]))


@pytest.mark.parametrize("call", [
    lambda s, b, o: s.hint([b]), lambda s, b, o: s.unhint([b]), lambda s, b, o: s.contains_many([b]),
    lambda s, b, o: s.get_many_into([b], [o]),
    lambda s, b, o: s.get_many_into([b, b], [o, s.spec.empty()]),
    lambda s, b, o: s.get(b), lambda s, b, o: s.put(*make_block(s.spec, 9)), lambda s, b, o: s.pin(b),
    lambda s, b, o: s.stats(), lambda s, b, o: s.flush(), lambda s, b, o: s.clear(),
], ids=["hint", "unhint", "contains_many", "get_many_into", "get_many_into_2", "get", "put", "pin", "stats",
        "flush", "clear"])
def test_use_after_close_is_storeclosed_and_starts_nothing(config, tmp_path, call):
    s = CascadeStore(config)
    bid = s.put(*make_block(s.spec, 1))
    s.close()
    before = {t.ident for t in threading.enumerate()}
    out = s.spec.empty()
    with pytest.raises(StoreClosed):
        call(s, bid, out)
    started = [t.name for t in threading.enumerate() if t.ident not in before]
    assert started == []  # no worker pool was started for a closed store
    assert entries(tmp_path / "shm") == []
    assert len(s) == 0


# -- corruption -----------------------------------------------------------------------------
def flip_byte_on_disk(files: Path, target: bytes, fraction: float) -> None:
    """Flip one bit of the byte ``fraction`` of the way into the only copy of ``target``
    among the file tier's files under ``files``."""
    (path,) = [p for p in files.rglob("*.bin") if target in p.read_bytes()]
    at = path.read_bytes().index(target) + int(len(target) * fraction)
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x01]))


def test_a_corrupt_file_tier_record_is_a_counted_miss_never_data(config, tmp_path):
    cfg = config.replace(shm_bytes=0)  # every block lives in the file tier
    with CascadeStore(cfg) as s:
        blocks = [make_block(s.spec, i) for i in range(3)]
        ids = [s.put(*b) for b in blocks]
        s.flush()
        flip_byte_on_disk(tmp_path / "files", blocks[1][1].tobytes(), 1 / 2)  # in block 1's value
        out = s.spec.empty()
        assert s.get(ids[1]) is None and not s.get_into(ids[1], *out)
        st = s.stats()
        assert st["tiers"]["file"]["corruptions"] == 1  # counted once: then dropped
        assert st["hits"] == 0 and st["misses"] == 2
        assert not s.contains(ids[1]) and len(s) == 2
        assert same(s.get(ids[0]), blocks[0]) and same(s.get(ids[2]), blocks[2])
        assert s.put(*blocks[1]) == ids[1] and same(s.get(ids[1]), blocks[1])  # a fresh put heals it


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("step_blocks", [2, None])
def test_a_corrupt_record_in_a_file_tier_batch_is_a_counted_miss_and_the_rest_hit(config, tmp_path, monkeypatch,
                                                                                  workers, step_blocks):
    cfg = config.replace(shm_bytes=0)  # every block lives in the file tier: the batch leases them in steps
    with CascadeStore(cfg) as s:
        if step_blocks:
            monkeypatch.setattr(batch_reads, "LEASED_STEP_BYTES", step_blocks * s.spec.block_bytes)
        blocks = [make_block(s.spec, i) for i in range(5)]
        ids = [s.put(*b) for b in blocks]
        s.flush()
        flip_byte_on_disk(tmp_path / "files", blocks[2][1].tobytes(), 1 / 3)  # in block 2's value
        outs = [s.spec.empty() for _ in range(6)]
        hits = s.get_many_into(ids + ["f" * 32], outs, max_workers=workers)  # the last id is absent
        assert hits == [True, True, False, True, True, False]
        assert all(same(o, b) for i, (o, b) in enumerate(zip(outs, blocks)) if i != 2)
        st = s.stats()
        assert st["tiers"]["file"]["corruptions"] == 1 and not s.contains(ids[2]) and len(s) == 4
        assert st["gets"] == 6 and st["hits"] == 4 and st["misses"] == 2
        assert st["tiers"]["file"]["hits"] == 4 and st["tiers"]["file"]["bytes_read"] == 4 * s.spec.block_bytes
        assert s.get_many_into(ids, outs[:5]) == [True, True, False, True, True]  # dropped: a plain miss now


@pytest.mark.parametrize("method", ["will_read", "read_leased", "read_leased_run", "start_leased_run",
                                    "finish_leased_run"])
def test_an_error_in_a_file_tier_batch_ends_every_lease_and_counts_the_misses(config, monkeypatch, method):
    with CascadeStore(config.replace(shm_bytes=0)) as s:
        ids = [s.put(*make_block(s.spec, i)) for i in range(4)]
        s.flush()
        tier = s.tiers[0]
        read = getattr(tier, method)
        if method.startswith("read_"):  # runs read in the batch's thread (no compiled reader, O_DIRECT)
            monkeypatch.setattr(tier, "reads_queued", False)
        if method == "read_leased":  # blocks read alone, not as runs of back-to-back records
            monkeypatch.setattr(tier, "read_runs", lambda leases, streams=None: [range(i, i + 1) for i in range(len(leases))])

        def failing(*args):  # an I/O layer failing in an unexpected way on one block (or run)
            leases = {"read_leased": lambda: [args[0]], "finish_leased_run": lambda: args[0][0]}.get(method,
                                                                                                  lambda: args[0])()
            if ids[1] in [one.key[1] for one in leases]:
                raise RuntimeError("injected")
            return read(*args)

        monkeypatch.setattr(tier, method, failing)
        with pytest.raises(RuntimeError, match="injected"):
            s.get_many_into(ids, [s.spec.empty() for _ in ids])
        st = s.stats()
        assert st["gets"] == 4 and st["hits"] + st["misses"] == 4 and st["misses"] >= 1
        assert all(f.users == 0 for f in tier._files.values())  # every lease ended: compaction and close may go on
        assert all(s._index.get(("default", b)).readers == 0 for b in ids)
        monkeypatch.undo()
        assert s.get_many_into(ids, [s.spec.empty() for _ in ids]) == [True] * 4


def test_an_error_counting_a_file_tier_run_ends_every_lease_and_counts_each_get_once(config, monkeypatch):
    with CascadeStore(config.replace(shm_bytes=0)) as s:
        ids = [s.put(*make_block(s.spec, i)) for i in range(4)]
        s.flush()
        index = s._index
        touched = index.touched_at
        calls = []

        def failing(meta, at):  # the policy failing on the third hit counted in the run
            calls.append(meta.key)
            if len(calls) == 3:
                raise RuntimeError("injected")
            return touched(meta, at)

        monkeypatch.setattr(index, "touched_at", failing)
        with pytest.raises(RuntimeError, match="injected"):
            s.get_many_into(ids, [s.spec.empty() for _ in ids])
        st = s.stats()
        assert st["gets"] == 4 and st["hits"] == 3 and st["misses"] == 1  # counted before the error, or missed
        assert st["tiers"]["file"]["hits"] == 3
        assert all(f.users == 0 for f in s.tiers[0]._files.values())
        assert all(index.get(("default", b)).readers == 0 for b in ids)
        monkeypatch.undo()
        assert s.get_many_into(ids, [s.spec.empty() for _ in ids]) == [True] * 4


def test_an_error_in_a_file_tier_get_ends_its_lease_and_counts_a_miss(config, monkeypatch):
    """A file-tier get (leased and read outside the store's lock, from the page cache
    too): an error of the read ends what the get holds, counts a miss and is raised;
    another thread then gets the lock at once."""
    with CascadeStore(config.replace(shm_bytes=0)) as s:  # every block lives in the file tier
        bid = s.put(*make_block(s.spec, 1))
        s.flush()
        tier = s.tiers[0]
        monkeypatch.setattr(tier, "read_leased", lambda lease, outs: (_ for _ in ()).throw(RuntimeError("injected")))
        with pytest.raises(RuntimeError, match="injected"):
            s.get_into(bid, *s.spec.empty())
        st = s.stats()
        assert st["gets"] == 1 and st["hits"] == 0 and st["misses"] == 1
        assert all(f.users == 0 for f in tier._files.values()) and s._index.get(("default", bid)).readers == 0
        assert len(s._inflight) == 0
        assert lock_free_to_another_thread(s)
        monkeypatch.undo()
        assert same(s.get(bid), make_block(s.spec, 1))


@pytest.mark.parametrize("batch", [False, True], ids=["get_into", "get_many_into"])
def test_an_error_copying_a_big_shm_block_ends_its_lease_and_counts_a_miss(tmp_path, monkeypatch, batch):
    """SHM blocks above HOT_COPY_MAX are leased and copied outside the lock, one get or a
    batch: a copy that fails ends the lease (the slot and the block's reader count), the
    in-flight count, counts a miss and is raised; close() then does not wait."""
    spec = BlockSpec.flat(2 * reads.HOT_COPY_MAX)
    with CascadeStore(Config(shm_bytes=8 * spec.block_bytes, file_bytes=0, remote_bytes=0,
                             shm_dir=str(tmp_path)), block_spec=spec) as s:
        ids = [s.put(*make_block(s.spec, i)) for i in range(3)]
        tier = s.tiers[0]
        read = tier.read_leased

        def failing(slot, outs):
            if slot.offset == tier.offset(("default", ids[1])):
                raise RuntimeError("injected")
            read(slot, outs)

        def failing_gathered(slab, jobs, *flags):  # a batch's leased copies: one call for the run
            if any(pos == tier.offset(("default", ids[1])) for pos, _, _ in jobs):
                raise RuntimeError("injected")
            return gathered(slab, jobs, *flags)

        gathered = slab_tier.copy_out_many
        monkeypatch.setattr(tier, "read_leased", failing)
        monkeypatch.setattr(slab_tier, "copy_out_many", failing_gathered)
        outs = [s.spec.empty() for _ in ids]
        with pytest.raises(RuntimeError, match="injected"):
            if batch:
                s.get_many_into(ids, outs)
            else:
                for bid, out in zip(ids, outs):
                    s.get_into(bid, *out)
        st = s.stats()
        assert st["gets"] == (3 if batch else 2) and st["misses"] >= 1 and st["hits"] + st["misses"] == st["gets"]
        assert all(tier._index[("default", b)].readers == 0 for b in ids)
        assert all(s._index.get(("default", b)).readers == 0 for b in ids) and len(s._inflight) == 0
        monkeypatch.undo()
        assert same(s.get(ids[1]), make_block(s.spec, 1))


def test_an_error_opening_a_view_gives_back_its_lease_and_count(config, monkeypatch):
    with CascadeStore(config) as s:
        bid = s.put(*make_block(s.spec, 2))
        tier = s.tiers[0]  # SHM: a zero-copy view
        monkeypatch.setattr(tier, "leased_view", lambda handle: (_ for _ in ()).throw(RuntimeError("injected")))
        with pytest.raises(RuntimeError, match="injected"):
            with s.view(bid):
                pass
        assert s._index.get(("default", bid)).readers == 0 and len(s._inflight) == 0
        monkeypatch.undo()
        with s.view(bid) as got:
            assert same(got, make_block(s.spec, 2))
        s.delete(bid)  # nothing holds it
        assert len(s) == 0


def test_corrupt_records_found_at_reopen_are_never_served(config, tmp_path):
    cfg = config.replace(shm_bytes=0)
    with CascadeStore(cfg) as s:
        blocks = [make_block(s.spec, i) for i in range(3)]
        ids = [s.put(*b) for b in blocks]
    target = blocks[2][0].tobytes()
    (path,) = [p for p in (tmp_path / "files").rglob("*.bin") if target in p.read_bytes()]
    data = bytearray(path.read_bytes())
    data[data.index(target) + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    with CascadeStore(cfg) as s:  # the index rebuild checks each record: this one is dropped, counted
        assert s.stats()["tiers"]["file"]["torn_records"] == 1
        assert len(s) == 2 and not s.contains(ids[2])
        assert s.get(ids[2]) is None and s.stats()["hits"] == 0
        assert same(s.get(ids[0]), blocks[0]) and same(s.get(ids[1]), blocks[1])
