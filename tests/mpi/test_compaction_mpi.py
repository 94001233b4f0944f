"""File-tier compaction on one rank while other ranks read its blocks: the directory
follows the moved records, so no reader misses a block that is still cached (compaction
used to leave every moved block's entry pointing into the unlinked file)."""
from __future__ import annotations

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
