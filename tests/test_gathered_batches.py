"""Batches of SHM blocks above the hot size, gathered into one compiled copy: ``put_many``
with ids fills every claim of the SHM tier in one ``copy_in_many`` call
(:meth:`~cascade.core.writes.WritePath.put_host_many`), ``get_many_into`` reads its
leased SHM blocks as one run in one ``copy_out_many`` call. Each put keeps its own
errors, an interrupted copy leaves nothing claimed, counted or held, and a buffer the
compiled call refuses is copied on its own."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from cascade import CascadeStore, Config, InvalidBlock, TierFull
from cascade.buffers import hostcopy
from cascade.core import batch_reads
from cascade.core.reads import HOT_COPY_MAX
from cascade.models import BlockSpec
from cascade.tiers import slab_tier
from cascade.tiers.shm import ShmTier

SPEC = BlockSpec.flat(4 * HOT_COPY_MAX)  # above the hot size: claimed, filled outside the lock, committed


def block(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    return tuple(rng.integers(0, 256, SPEC.block_bytes // 2, dtype=np.uint8).view(SPEC.dtype).reshape(SPEC.shape)
                 for _ in range(2))


def bid(n: int) -> str:
    return f"{n + 1:032x}"


def open_store(tmp_path, blocks: int = 16, **extra) -> CascadeStore:
    return CascadeStore(Config(shm_bytes=blocks * (SPEC.block_bytes + 4096), file_bytes=0, remote_bytes=0,
                               shm_dir=str(tmp_path), promote_on_hit=False, **extra), block_spec=SPEC)


def spy(monkeypatch, name: str) -> list[int]:
    """The number of jobs of each call to ``slab_tier.<name>`` from now on."""
    calls: list[int] = []
    real = getattr(slab_tier, name)
    monkeypatch.setattr(slab_tier, name, lambda slab, jobs, *flags: (calls.append(len(jobs)), real(slab, jobs, *flags))[1])
    return calls


def same(got, want) -> bool:
    return np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_a_batch_put_and_get_of_big_shm_blocks_copy_in_one_call_each(tmp_path, monkeypatch):
    with open_store(tmp_path, blocks=32) as store:  # claims of up to a quarter of the tier at once: 8 blocks
        puts, gets = spy(monkeypatch, "copy_in_many"), spy(monkeypatch, "copy_out_many")
        assert store.put_many([block(n) for n in range(6)], block_ids=[bid(n) for n in range(6)]) == \
            [bid(n) for n in range(6)]
        assert puts == [6]
        outs = [SPEC.empty() for _ in range(6)]
        assert store.get_many_into([bid(n) for n in range(6)], outs) == [True] * 6
        assert gets == [6]
        assert all(same(out, block(n)) for n, out in enumerate(outs))
        st = store.stats()
        assert (st["puts"], st["gets"], st["hits"], st["misses"]) == (6, 6, 6, 0)
        assert store.tiers[0].used == 6 * SPEC.block_bytes


def test_a_get_of_more_blocks_than_its_first_lease_chunk_still_copies_in_one_call(tmp_path, monkeypatch):
    """The chunks a batch leases in turn (8, then 16: batch_reads._lease_chunks) are
    joined into one run again: one compiled copy on the caller's thread, shared with the
    copy helper, not a run per chunk on the batch's worker threads."""
    count = batch_reads.FIRST_LEASE_CHUNK + 5
    ids = [bid(n) for n in range(count)]
    with open_store(tmp_path, blocks=32) as store:
        store.put_many([block(n) for n in range(count)], block_ids=ids)
        gets = spy(monkeypatch, "copy_out_many")
        outs = [SPEC.empty() for _ in ids]
        assert store.get_many_into(ids, outs) == [True] * count
        assert gets == [count]
        assert all(same(out, block(n)) for n, out in enumerate(outs))
        st = store.stats()
        assert (st["gets"], st["hits"], st["misses"]) == (count, count, 0)


def test_only_adjacent_runs_of_one_tier_that_copies_without_the_lock_are_joined():
    slab, other_slab, files = (SimpleNamespace(copies_without_gil=flag) for flag in (True, True, False))
    leased = [(i, SimpleNamespace(tier=tier)) for i, tier in
              enumerate([slab, slab, slab, other_slab, files, files, slab, slab])]
    runs = [range(0, 1), range(1, 3), range(3, 4), range(4, 5), range(5, 6), range(6, 7), range(7, 8)]
    assert batch_reads._joined_in_memory(runs, leased) == [range(0, 3), range(3, 4), range(4, 5), range(5, 6),
                                                           range(6, 8)]
    assert batch_reads._joined_in_memory([range(0, 1), range(2, 3)], leased) == [range(0, 1), range(2, 3)]
    assert batch_reads._joined_in_memory([], leased) == []


@pytest.mark.parametrize("tiers", ["shm", "shm+file"])
def test_a_batch_bigger_than_the_shm_tier_stores_as_the_same_puts_one_by_one(tmp_path, monkeypatch, tiers):
    """The claims of a gathered batch are taken a chunk at a time (a quarter of the tier),
    so a batch of 3x the tier's room evicts (or demotes) its own first blocks for its
    last ones, without an error, as a loop of puts does."""
    puts = spy(monkeypatch, "copy_in_many")
    file_bytes = 64 * (SPEC.block_bytes + 8192) if "file" in tiers else 0
    config = Config(shm_bytes=8 * (SPEC.block_bytes + 4096), file_bytes=file_bytes, remote_bytes=0,
                    shm_dir=str(tmp_path), file_dir=str(tmp_path / "files"), promote_on_hit=False)
    ids = [bid(n) for n in range(24)]
    with CascadeStore(config, block_spec=SPEC) as store:
        assert store.put_many([block(n) for n in range(24)], block_ids=ids) == ids
        assert puts and max(puts) <= 2  # 8 blocks of room: claims of 2 at a time
        assert all(store.contains(b) for b in ids[-8:])  # the last ones are cached (in SHM)
        assert all(same(store.get(b), block(n)) for n, b in enumerate(ids) if store.contains(b))
        if file_bytes:
            assert all(store.contains(b) for b in ids)  # the first ones demoted, none lost
        assert len(store._inflight) == 0


def test_each_put_of_a_gathered_batch_keeps_its_own_error(tmp_path):
    with open_store(tmp_path) as store:
        store.put(*block(0), block_id=bid(0))
        pairs = [block(0), block(1), (block(2)[0][:1], block(2)[1]), block(3), block(1)]  # a dedup, a bad shape, twice
        with pytest.raises(InvalidBlock):
            store.put_many(pairs, block_ids=[bid(0), bid(1), bid(2), bid(3), bid(1)])
        for n in (0, 1, 3):
            assert same(store.get(bid(n)), block(n))
        assert not store.contains(bid(2))
        assert store.tiers[0].used == 3 * SPEC.block_bytes and len(store._inflight) == 0


def test_a_fill_that_fails_in_a_gathered_put_fails_that_put_alone(tmp_path, monkeypatch):
    with open_store(tmp_path) as store:
        tier = store.tiers[0]
        real = tier.fill_many

        def one_failing(slots, parts):
            errors = real(slots, parts)
            errors[1] = OSError(28, "No space left on device")  # its bytes landed: the room must still go back
            return errors

        monkeypatch.setattr(tier, "fill_many", one_failing)
        with pytest.raises(TierFull, match="No space left"):
            store.put_many([block(n) for n in range(3)], block_ids=[bid(n) for n in range(3)])
        assert same(store.get(bid(0)), block(0)) and same(store.get(bid(2)), block(2)) and not store.contains(bid(1))
        assert tier.used == 2 * SPEC.block_bytes and tier.free == tier.capacity - 2 * SPEC.block_bytes
        st = store.stats()
        assert (st["puts"], st["rejected"]) == (3, 1) and len(store._inflight) == 0


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError, MemoryError])
def test_an_interrupted_gathered_put_commits_nothing_and_holds_nothing(tmp_path, monkeypatch, exc):
    with open_store(tmp_path) as store:
        store.put(*block(9), block_id=bid(9))
        free = store.tiers[0].free

        def failing(*args):
            raise exc("injected")

        monkeypatch.setattr(slab_tier, "copy_in_many", failing)
        with pytest.raises(exc, match="injected"):
            store.put_many([block(n) for n in range(3)], block_ids=[bid(n) for n in range(3)])
        monkeypatch.undo()
        assert store.tiers[0].free == free and len(store._inflight) == 0
        assert not any(store.contains(bid(n)) for n in range(3))
        st = store.stats()
        assert st["puts"] == 4 and st["rejected"] == 3
        assert store.put_many([block(n) for n in range(3)], block_ids=[bid(n) for n in range(3)])
        assert all(same(store.get(bid(n)), block(n)) for n in range(3))
    # close() above did not wait for anything the failed batch held


def test_a_fill_the_compiled_call_refuses_is_made_on_its_own(tmp_path):
    tier = ShmTier(4 * SPEC.block_bytes, str(tmp_path))
    try:
        half = SPEC.block_bytes // 2
        slots = [tier.reserve(("ns", bid(n)), SPEC.block_bytes) for n in range(3)]
        parts = [[np.full(half, 1, np.uint8), np.full(half, 2, np.uint8)],
                 [bytearray(b"\x03" * half), np.full(half, 4, np.uint8)],  # not numpy: refused, filled alone
                 [np.full(half, 5, np.uint8), np.full(half - 1, 6, np.uint8)]]  # short: its own error
        errors = tier.fill_many(slots, parts)
        assert errors[0] is None and errors[1] is None and isinstance(errors[2], ValueError)
        for n, want in ((0, (1, 2)), (1, (3, 4))):
            tier.commit(("ns", bid(n)), slots[n])
            key, value = np.empty(half, np.uint8), np.empty(half, np.uint8)
            tier.read_parts_into(("ns", bid(n)), [key, value])
            assert (key == want[0]).all() and (value == want[1]).all()
        tier.discard(slots[2])
    finally:
        tier.close()


def test_a_gathered_get_reads_outputs_it_cannot_take_on_their_own(tmp_path, monkeypatch):
    with open_store(tmp_path) as store:
        store.put_many([block(n) for n in range(3)], block_ids=[bid(n) for n in range(3)])
        tier = store.tiers[0]
        slots = [tier._index[("default", bid(n))] for n in range(3)]
        half = SPEC.block_bytes // 2
        outs = [SPEC.empty(), [bytearray(half), bytearray(half)], SPEC.empty()]
        assert tier.read_leased_run(slots, outs) == [None] * 3
        assert same(outs[0], block(0)) and same(outs[2], block(2))
        assert bytes(outs[1][0]) == block(1)[0].tobytes() and bytes(outs[1][1]) == block(1)[1].tobytes()


@pytest.mark.parametrize("gathered", [True, False])
def test_gathered_and_one_by_one_batches_store_and_read_the_same(tmp_path, gathered):
    """``max_workers`` given keeps a batch on the workers, one put or read each."""
    with open_store(tmp_path) as store:
        workers = None if gathered else 2
        ids = [bid(n) for n in range(8)]
        assert store.put_many([block(n) for n in range(8)], block_ids=ids, max_workers=workers) == ids
        outs = [SPEC.empty() for _ in ids]
        assert store.get_many_into(ids, outs, max_workers=workers) == [True] * 8
        assert all(same(out, block(n)) for n, out in enumerate(outs))


def test_the_python_fallback_copies_every_job_in(tmp_path):
    slab = memoryview(bytearray(64))
    jobs = [(0, 8, [np.full(8, 1, np.uint8)]), (8, 24, [np.full(6, 2, np.uint8), np.full(10, 3, np.uint8)]),
            (24, 30, [np.full(7, 4, np.uint8)])]  # the last is short: refused, nothing written
    assert hostcopy.copy_in_many_python(slab, jobs, True, True) == [True, True, False]
    assert bytes(slab[:24]) == b"\x01" * 8 + b"\x02" * 6 + b"\x03" * 10 and bytes(slab[24:]) == bytes(40)
    with pytest.raises(ValueError, match="outside a slab"):
        hostcopy.copy_in_many_python(slab, [(60, 70, [np.zeros(10, np.uint8)])])
    if hostcopy.COMPILED:
        other = memoryview(bytearray(64))
        assert hostcopy.copy_in_many(other, jobs, True, True) == [True, True, False]
        assert bytes(other) == bytes(slab)
        with pytest.raises(ValueError, match="outside a slab"):
            hostcopy.copy_in_many(other, [(0, 8, [np.zeros(8, np.uint8)]), (60, 70, [np.zeros(10, np.uint8)])])
        assert bytes(other) == bytes(slab)  # checked before a byte moved
