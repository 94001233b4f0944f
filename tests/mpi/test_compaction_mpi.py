"""File-tier compaction on one rank while other ranks read its blocks: the directory
follows the moved records, so no reader misses a block that is still cached (compaction
used to leave every moved block's entry pointing into the unlinked file), and a corrupt
record it meets while another rank pins the block stays a miss everywhere."""
from __future__ import annotations

import pytest
from kv_blocks import block, same

from cascade import CascadeStore, Config

BLOCKS = 3 * 128  # three 1 MiB files of 128 records
RECORD = 8192  # one header page + the tiny model's 4 KiB payload


def test_blocks_moved_by_compaction_stay_readable_from_every_rank(comm, shared_dir, everywhere):
    # files roll every 128 records (1 MiB, the smallest segment), so deleting every other block seals files half dead
    cfg = Config(model="tiny", shm_bytes=0, remote_bytes=0, file_bytes=4 * BLOCKS * RECORD,
                 file_dir=shared_dir, file_segment_bytes=128 * RECORD, compact_dead_fraction=0.4,
                 directory_slots=1 << 12)
    with CascadeStore(cfg, comm=comm) as store:
        ids = [store.put(*block(store.spec, comm.rank * 1000 + i)) for i in range(BLOCKS)]
        for bid in ids[::2]:
            store.delete(bid)
        store.flush()  # compactions run in the background: flush waits for them
        compactions = store.stats()["tiers"]["file"]["compactions"]
        comm.Barrier()  # every rank's deletes (and compactions) are done
        everyone = comm.allgather(ids)
        missing = wrong = 0
        for rank, theirs in enumerate(everyone):
            for i, bid in enumerate(theirs):
                if i % 2 == 0:
                    continue  # deleted
                got = store.get(bid)
                missing += got is None
                wrong += got is not None and not same(got, block(store.spec, rank * 1000 + i))
    assert everywhere(compactions > 0), compactions
    assert everywhere(missing == 0 and wrong == 0), (missing, wrong)


def test_a_corrupt_record_compaction_drops_while_another_rank_pins_it_is_a_miss(comm, shared_dir, everywhere):
    """Rank 1 pins a block of rank 0's file tier; rank 0's compaction finds its record
    corrupt. Rank 0 must answer gets of it with a miss (it used to raise BlockNotFound
    for good: compaction had dropped the record while the index, held by the pin, kept
    the block), rank 1 must never get the bytes, and once rank 1 unpins, the block is
    gone everywhere, its directory entry included."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    cfg = Config(model="tiny", shm_bytes=0, remote_bytes=0, file_bytes=4 * BLOCKS * RECORD,
                 file_dir=shared_dir, file_segment_bytes=128 * RECORD, compact_dead_fraction=0.4,
                 directory_slots=1 << 12)
    with CascadeStore(cfg, comm=comm) as store:
        ids = [store.put(*block(store.spec, 7000 + i)) for i in range(128)] if comm.rank == 0 else None
        ids = comm.bcast(ids)
        target = ids[0]
        if comm.rank == 1:
            store.pin(target)
        comm.Barrier()
        ok = True
        if comm.rank == 0:
            tier = store.tiers[0]
            path = tier._files[tier._index[("default", target)].file_id].path
            with open(path, "r+b") as f:  # flip a payload byte of the target's record (the file's first)
                f.seek(RECORD // 2 + 100)
                byte = f.read(1)
                f.seek(RECORD // 2 + 100)
                f.write(bytes([byte[0] ^ 0xFF]))
            compactions = store.stats()["tiers"]["file"]["compactions"]
            for bid in ids[1:]:  # the rest of the file dies: it is compacted
                store.delete(bid)
            store.flush()
            stats = store.stats()["tiers"]["file"]
            ok = stats["compactions"] > compactions and stats["corruptions"] == 1
            # pinned by rank 1: its (corrupt) record stays where the index places it
            ok = ok and store.get(target) is None and ("default", target) in tier
        assert everywhere(ok)
        comm.Barrier()
        if comm.rank == 1:
            ok = store.get(target) is None  # its bytes are gone: never data
            store.unpin(target)
        assert everywhere(ok)
        comm.Barrier()
        if comm.rank == 0:
            ok = store.get(target) is None and len(store) == 0
        assert everywhere(ok)
        assert everywhere(store.cluster.lookup(("default", target)) is None)
        comm.Barrier()
