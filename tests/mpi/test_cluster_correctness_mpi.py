"""Cross-rank correctness: right rank, end-to-end checksums, all-or-nothing directory
changes, rejected puts, child counts, collective close, per-rank pins (issue 10, 1-6).

Same bodies at 1 rank and at N ranks (tests needing other ranks skip at one).
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from xxhash import xxh3_64_intdigest

from collective import raises
from kv_blocks import block, same

from cascade import BlockNotFound, BlockPinned, CascadeStore, Config, TierFull, block_id


def make_store(comm, shared_dir, **overrides) -> CascadeStore:
    settings = dict(model="tiny", shm_bytes=32 * 4096, remote_bytes=64 * 4096, file_bytes=1024 * 8192,
                    file_dir=shared_dir, directory_slots=1 << 12)
    settings.update(overrides)
    return CascadeStore(Config(**settings), comm=comm)


def needs_ranks(comm, n: int = 2) -> None:
    if comm.size < n:
        pytest.skip(f"needs {n} ranks")


def test_remote_tier_blocks_are_read_from_the_window_holding_them(comm, shared_dir, everywhere):
    # shm_bytes=0: every put lands in the REMOTE tier, in another rank's window
    store = make_store(comm, shared_dir, shm_bytes=0, remote_bytes=64 * 4096)
    try:
        mine = [store.put(*block(store.spec, 70000 + comm.rank * 100 + i)) for i in range(30)]
        comm.Barrier()
        wrong = hits = 0
        for rank, ids in enumerate(comm.allgather(mine)):
            for i, bid in enumerate(ids):
                got = store.get(bid)
                hits += got is not None
                wrong += got is not None and not same(got, block(store.spec, 70000 + rank * 100 + i))
        assert everywhere(wrong == 0, f"{wrong} wrong blocks")
        assert everywhere(hits == 30 * comm.size, f"{hits} hits")
        if comm.size > 1:  # published with the rank whose window holds the bytes
            entries = store.cluster.lookup_many([("default", bid) for bid in mine])
            placed = [(e.rank, e.tier) if e else None for e in entries]
            assert everywhere(all(p is not None and p[0] != comm.rank and p[1] == 2 for p in placed), placed)
        comm.Barrier()
    finally:
        store.close()


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "remote"])
def test_every_entry_carries_the_checksum_and_a_corrupt_copy_is_a_miss(comm, shared_dir, everywhere, shm):
    needs_ranks(comm)
    store = make_store(comm, shared_dir, shm_bytes=32 * 4096 if shm else 0, file_bytes=0)
    try:
        data = block(store.spec, 4242)
        bid = store.put(*data) if comm.rank == 0 else None
        bid = comm.bcast(bid)
        entry = store.cluster.lookup(("default", bid))
        assert everywhere(entry.checksum == xxh3_64_intdigest(data[0].tobytes() + data[1].tobytes()))
        comm.Barrier()
        if comm.rank == 0:  # flip one byte where the bytes live, behind the store's back
            tier = store.tiers[0]
            if shm:
                tier._bytes[entry.location + 5] ^= 0xFF
            else:
                one = np.empty(1, dtype=np.uint8)
                tier.windows.get_into(entry.rank, entry.location + 5, [memoryview(one)])
                one ^= 0xFF
                tier.windows.put(entry.rank, entry.location + 5, [memoryview(one)])
        comm.Barrier()
        readable = store.cluster.readable(entry)
        got = store.get(bid) if comm.rank else None
        assert everywhere(got is None)
        corruptions = store.stats()["cluster_corruptions"]
        # a reader that can reach the bytes counts the corruption; nobody else does
        assert everywhere(corruptions == (1 if comm.rank and readable else 0), f"{corruptions} corruptions")
        if not comm.allreduce(int(comm.rank > 0 and readable)):
            pytest.skip("no other rank can reach rank 0's copy (every one is on another node)")
        comm.Barrier()
    finally:
        store.close()


def test_a_failed_child_count_undoes_the_publish(comm, shared_dir, everywhere):
    needs_ranks(comm)
    store = make_store(comm, shared_dir)
    try:
        parent = store.put(*block(store.spec, 100 + comm.rank))
        directory = store.cluster.directory

        def broken(*args, **kwargs):
            raise OverflowError("injected: child count overflow")

        directory.add_child = broken  # fault injection on this rank's directory client
        failed = raises(OverflowError, store.put, *block(store.spec, 200 + comm.rank), parent=parent)
        del directory.add_child
        assert everywhere(failed)
        children = [block_id(*block(store.spec, 200 + r)) for r in range(comm.size)]
        assert everywhere(not any(store.contains_many(children)))  # not published, not stored
        assert everywhere(all(e is None for e in store.cluster.lookup_many([("default", c) for c in children])))
        stats = store.stats()
        assert everywhere(stats["rejected"] == 1 and stats["blocks"] == 1)
        assert everywhere(stats["puts"] == stats["stored"] + stats["deduped"] + stats["rejected"])
        assert everywhere(sum(t["blocks"] for t in stats["tiers"].values()) == 1)
        comm.Barrier()
    finally:
        store.close()


def test_a_publish_whose_undo_fails_too_keeps_the_block_stored_and_published(comm, shared_dir, everywhere):
    # the child count raises, then so does the removal meant to undo the insert: the
    # entry cannot be taken back, so the block stays with it (an entry naming bytes that
    # were dropped would turn every later put of the id elsewhere into a dedup onto nothing)
    needs_ranks(comm)
    store = make_store(comm, shared_dir)
    try:
        parent = store.put(*block(store.spec, 300 + comm.rank))
        directory = store.cluster.directory

        def broken_count(*args, **kwargs):
            raise OverflowError("injected: child count overflow")

        def broken_remove(*args, **kwargs):
            raise OSError("injected: the undo fails too")

        directory.add_child, directory.remove = broken_count, broken_remove
        try:
            child = store.put(*block(store.spec, 400 + comm.rank), parent=parent)
        finally:
            del directory.add_child, directory.remove
        data = [block(store.spec, 400 + r) for r in range(comm.size)]
        children = [block_id(*d) for d in data]
        assert everywhere(child == children[comm.rank])
        comm.Barrier()
        entries = store.cluster.lookup_many([("default", c) for c in children])
        assert everywhere(all(e is not None for e in entries), entries)
        got = [store.get(c) for c in children]  # every rank reads every child, its own and the others'
        assert everywhere(all(g is not None and same(g, d) for g, d in zip(got, data)))
        stats = store.stats()
        assert everywhere(stats["rejected"] == 0 and stats["puts"] == stats["stored"] + stats["deduped"])
        comm.Barrier()
        store.delete(child)  # withdrawn as any other block (its parent's count never taken, none given back)
        comm.Barrier()
        assert everywhere(store.cluster.lookup(("default", child)) is None)
        comm.Barrier()
    finally:
        store.close()


def test_a_child_published_before_its_parent_gives_back_no_count_it_never_took(comm, shared_dir, everywhere):
    needs_ranks(comm)
    store = make_store(comm, shared_dir)
    try:
        parent, early, late = "a1" * 16, "c1" * 16, "d1" * 16
        if comm.rank == 1:  # a child while no rank lists its parent: no child count taken
            store.put(*block(store.spec, 1), block_id=early, parent=parent)
        comm.Barrier()
        if comm.rank == 0:
            store.put(*block(store.spec, 7), block_id=parent)
        comm.Barrier()
        if comm.rank == 1:  # a child after it: counted
            store.put(*block(store.spec, 2), block_id=late, parent=parent)
        comm.Barrier()
        if comm.rank == 1:  # the first child goes: it must not take the second one's count
            store.delete(early)
        comm.Barrier()
        children = store.cluster.directory.lookup("default", parent).children
        comm.Barrier()
    finally:
        store.close()
    assert everywhere(children == 1, children)


def test_an_unpin_whose_directory_pin_is_gone_still_ends_the_local_pin(comm, shared_dir, everywhere):
    needs_ranks(comm)
    store = make_store(comm, shared_dir)
    try:
        mine = store.put(*block(store.spec, 300 + comm.rank))
        store.pin(mine)
        store.cluster.unpin(("default", mine))  # the directory's pin gone behind the store's back
        store.unpin(mine)  # raised PinUnderflow with the local pin already counted down
        store.delete(mine)  # not pinned any more: it goes
        gone = not store.contains(mine)
        comm.Barrier()
    finally:
        store.close()
    assert everywhere(gone)


def test_a_full_directory_rejects_the_put_and_stores_nothing(comm, shared_dir, everywhere):
    needs_ranks(comm)
    store = make_store(comm, shared_dir, directory_slots=8, shm_bytes=256 * 4096)
    try:
        rejected = 0
        for i in range(40):
            try:
                store.put(*block(store.spec, 300000 + comm.rank * 1000 + i))
            except TierFull:
                rejected += 1
        comm.Barrier()
        stats = store.stats()
        assert comm.allreduce(rejected) > 0
        assert everywhere(stats["rejected"] == rejected)
        assert everywhere(stats["puts"] == stats["stored"] + stats["deduped"] + stats["rejected"])
        assert everywhere(sum(t["blocks"] for t in stats["tiers"].values()) == stats["blocks"] == stats["stored"])
        comm.Barrier()
    finally:
        store.close()


def test_a_corrupt_local_block_is_withdrawn_before_its_bytes_go(comm, shared_dir, everywhere):
    needs_ranks(comm)
    store = make_store(comm, shared_dir, verify_dram_reads=True)
    try:
        bid = comm.bcast(store.put(*block(store.spec, 555)) if comm.rank == 0 else None)
        key = ("default", bid)
        if comm.rank == 1:
            store.pin(bid)
        comm.Barrier()
        ok = True
        if comm.rank == 0:
            entry = store.cluster.lookup(key)
            store.tiers[0]._bytes[entry.location] ^= 0xFF
            ok = store.get(bid) is None and store.stats()["tiers"]["shm"]["corruptions"] == 1  # a counted miss
            # pinned by rank 1: still published, so its bytes stay allocated
            ok = ok and key in store.tiers[0] and store.cluster.lookup(key) is not None
        assert everywhere(ok)
        if comm.rank == 1:
            ok = store.get(bid) is None  # unreadable (another node) or caught by the checksum
            store.unpin(bid)
        assert everywhere(ok)
        if comm.rank == 0:
            ok = store.get(bid) is None and key not in store.tiers[0] and len(store) == 0
        assert everywhere(ok)
        assert everywhere(store.cluster.lookup(key) is None)
        comm.Barrier()
    finally:
        store.close()


def test_a_reput_head_keeps_the_count_of_its_cached_children(comm, shared_dir, everywhere):
    """Local (no comm): a re-put head starts with the count of its cached children."""
    store = CascadeStore(Config(model="tiny", shm_bytes=2 * 4096, file_bytes=0, file_dir=shared_dir))
    try:
        head_data, tail_data = block(store.spec, 1), block(store.spec, 2)
        head = store.put(*head_data)
        tail = store.put(*tail_data, parent=head)
        store.set_priority(tail, 8)  # the tail is worth far more than the head
        store.delete(head)
        reput = store.put(*head_data)
        store.put(*block(store.spec, 3))  # the tier holds two: one of head/tail goes
        kept = (store.contains(head), store.contains(tail))
    finally:
        store.close()
    assert everywhere(reput == head)
    assert everywhere(kept == (True, False), f"(head, tail) cached: {kept}")  # leaf first, despite value


@pytest.mark.parametrize("how", ["delete", "clear", "ttl"])
def test_child_counts_survive_the_head_going_while_the_tail_is_cached_elsewhere(comm, shared_dir, everywhere, how):
    needs_ranks(comm)
    store = make_store(comm, shared_dir, shm_bytes=8 * 4096, remote_bytes=0, file_bytes=0)
    try:
        head_data = block(store.spec, 31)
        head = comm.bcast(store.put(*head_data, ttl=0.2 if how == "ttl" else None) if comm.rank == 0 else None)
        tail = comm.bcast(store.put(*block(store.spec, 32), parent=head) if comm.rank == 1 else None, root=1)
        comm.Barrier()
        ok = True
        if comm.rank == 0:
            if how == "delete":
                store.delete(head)
            elif how == "clear":
                ok = store.clear() == 1
            else:
                time.sleep(0.3)
            store.put(*head_data)  # the re-put takes the child count over
            ok = ok and store.cluster.directory.lookup("default", head).children == 1
            for i in range(40):  # five times the tier: the head must stay under its tail
                store.put(*block(store.spec, 8000 + i))
        assert everywhere(ok)
        # still published (whether this rank can read rank 0's SHM is another matter)
        assert everywhere(all(e is not None for e in store.cluster.lookup_many([("default", head), ("default", tail)])))
        comm.Barrier()
        if comm.rank == 1:
            store.delete(tail)
        comm.Barrier()
        if comm.rank == 0:
            ok = store.cluster.directory.lookup("default", head).children == 0
        assert everywhere(ok)
    finally:
        store.close()


def test_a_placeholder_goes_with_the_last_child(comm, shared_dir, everywhere):
    needs_ranks(comm)
    store = make_store(comm, shared_dir)
    try:
        head = comm.bcast(store.put(*block(store.spec, 41)) if comm.rank == 0 else None)
        tail = comm.bcast(store.put(*block(store.spec, 42), parent=head) if comm.rank == 1 else None, root=1)
        comm.Barrier()
        if comm.rank == 0:
            store.delete(head)
        comm.Barrier()
        assert everywhere(store.cluster.lookup(("default", head)) is None
                          and store.cluster.lookup(("default", tail)) is not None)
        ok = True
        if comm.rank == 1:
            ok = raises(BlockNotFound, store.pin, head)  # a placeholder is not a block
            store.delete(tail)
        assert everywhere(ok)
        assert everywhere(store.cluster.directory.local_stats()["valid"] == 0)
        comm.Barrier()
    finally:
        store.close()


def test_only_the_rank_that_pinned_can_unpin(comm, shared_dir, everywhere):
    needs_ranks(comm, 3)
    store = make_store(comm, shared_dir)
    try:
        bid = comm.bcast(store.put(*block(store.spec, 91)) if comm.rank == 0 else None)
        if comm.rank == 1:
            store.pin(bid)
        comm.Barrier()
        ok = True
        if comm.rank == 2:
            ok = raises(BlockPinned, store.unpin, bid, match="per rank")  # never pinned here
        assert everywhere(ok)
        if comm.rank == 0:  # rank 1's pin still holds
            ok = raises(BlockPinned, store.delete, bid) and store.cluster.lookup(("default", bid)).refs == 1
        assert everywhere(ok)
        if comm.rank == 1:
            store.unpin(bid)
            ok = raises(BlockPinned, store.unpin, bid)
        assert everywhere(ok)
        if comm.rank == 0:
            store.delete(bid)
        comm.Barrier()
    finally:
        store.close()


def test_close_waits_for_the_readers_of_its_slab(comm, shared_dir, everywhere):
    needs_ranks(comm)
    store = make_store(comm, shared_dir, remote_bytes=0, file_bytes=0)
    closed = False
    try:
        ids = comm.bcast([store.put(*block(store.spec, 600 + i)) for i in range(10)] if comm.rank == 0 else None)
        same_node = store.cluster.node_of[0] == store.cluster.node_of[comm.rank]
        comm.Barrier()
        wrong = hits = 0
        failed = None
        if comm.rank == 0:
            store.close()  # returns only after every rank entered close
            closed = True
        else:
            time.sleep(0.3)  # rank 0 is in close() by now
            try:
                for i, bid in enumerate(ids):
                    got = store.get(bid)
                    hits += got is not None
                    wrong += got is not None and not same(got, block(store.spec, 600 + i))
            except OSError as exc:  # the slab was unlinked under us
                failed = exc
            store.close()
            closed = True
        assert everywhere(failed is None and wrong == 0 and (hits == len(ids) or not same_node or comm.rank == 0),
                          f"error {failed!r}, {wrong} wrong, {hits} of {len(ids)} hits")
    finally:
        if not closed:
            store.close()


def test_a_clean_close_keeps_hot_blocks_in_the_file_tier(comm, shared_dir, everywhere):
    import os
    path = os.path.join(shared_dir, "keep")
    store = make_store(comm, path, remote_bytes=0)
    seeds = [700 + comm.rank * 100 + i for i in range(10)]
    ids = [store.put(*block(store.spec, s)) for s in seeds]
    in_shm = store.stats()["tiers"]["shm"]["blocks"]
    store.close()
    assert everywhere(in_shm == 10, f"{in_shm} blocks in SHM")
    again = make_store(comm, path, remote_bytes=0)
    try:
        wrong = sum(not same(again.get(b), block(again.spec, s)) for b, s in zip(ids, seeds))
        assert everywhere(wrong == 0, f"{wrong} of {len(ids)} blocks missing or wrong after the reopen")
        hits = again.stats()["tiers"]["file"]["hits"]
        assert everywhere(hits == len(ids), f"{hits} file-tier hits")
        comm.Barrier()
    finally:
        again.close()
