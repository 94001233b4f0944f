"""Collective steps end together: open, warm restart and close of a multi-rank store.

A rank returns from the constructor only when every rank's warm-restart republish is
visible (no read misses another rank's recovered block), and a step that fails on one
rank fails on every rank with a message instead of leaving the others waiting. Same
bodies at every world size (at one rank the store is local and these are plain checks).
"""
from __future__ import annotations

import os

import pytest

from kv_blocks import block, same

from cascade import CascadeError, CascadeStore, Config, RankFailure
from cascade.tiers.file_tier import FileTier

BLOCKS_ON_RANK_0 = 300  # rank 0 republishes many more blocks than the others: the slowest
BLOCKS_ELSEWHERE = 5


def file_only(shared_dir: str, **overrides) -> Config:
    settings = dict(model="tiny", shm_bytes=0, remote_bytes=0, file_bytes=64 << 20, file_dir=shared_dir,
                    directory_slots=1 << 12)
    settings.update(overrides)
    return Config(**settings)


def test_no_rank_reads_before_every_rank_republished(comm, shared_dir, everywhere):
    count = BLOCKS_ON_RANK_0 if comm.rank == 0 else BLOCKS_ELSEWHERE
    with CascadeStore(file_only(shared_dir), comm=comm) as store:
        mine = [store.put(*block(store.spec, comm.rank * 10_000 + i)) for i in range(count)]
    everyone = comm.allgather(mine)
    with CascadeStore(file_only(shared_dir), comm=comm) as store:
        # straight after the constructor: no barrier of the test's own
        missing = wrong = 0
        for rank, ids in enumerate(everyone):
            for i, bid in enumerate(ids):
                got = store.get(bid)
                missing += got is None
                wrong += got is not None and not same(got, block(store.spec, rank * 10_000 + i))
        recovered = comm.allreduce(store.stats()["tiers"]["file"]["recovered"])
    expected = BLOCKS_ON_RANK_0 + BLOCKS_ELSEWHERE * (comm.size - 1)
    assert everywhere(recovered == expected), recovered
    assert everywhere(missing == 0 and wrong == 0), (missing, wrong)


def test_open_failing_on_one_rank_fails_on_every_rank(comm, shared_dir, everywhere):
    culprit = comm.size - 1
    squatter = FileTier(1 << 20, shared_dir, rank=culprit) if comm.rank == culprit else None  # holds its lock
    try:
        with pytest.raises(CascadeError) as failure:
            CascadeStore(file_only(shared_dir), comm=comm)
    finally:
        if squatter is not None:
            squatter.close()
    if comm.rank == culprit:
        ok = "held by another process" in str(failure.value)
    else:  # the others learn which rank failed instead of waiting for it
        ok = isinstance(failure.value, RankFailure) and f"[{culprit}]" in str(failure.value)
    assert everywhere(ok), str(failure.value)
    # nothing was left held: the same job opens the store on every rank now
    with CascadeStore(file_only(shared_dir), comm=comm) as store:
        bid = store.put(*block(store.spec, comm.rank))
        assert everywhere(same(store.get(bid), block(store.spec, comm.rank)))


def test_close_failing_on_one_rank_fails_on_every_rank(comm, shared_dir, everywhere):
    culprit = 0
    store = CascadeStore(file_only(shared_dir, shm_bytes=64 * 4096), comm=comm)
    mine = store.put(*block(store.spec, comm.rank))  # in SHM: close moves it to the file tier
    if comm.rank == culprit:
        def disk_gone() -> None:
            raise OSError(5, os.strerror(5))

        store.tiers[-1].sync = disk_gone  # the file tier's fsync at close fails here only
    with pytest.raises((OSError, RankFailure)) as failure:
        store.close()
    if comm.rank == culprit:
        ok = failure.value.errno == 5
    else:
        ok = isinstance(failure.value, RankFailure) and f"[{culprit}]" in str(failure.value)
    assert everywhere(ok), str(failure.value)
    store.close()  # idempotent after a failed close
    everyone = comm.allgather(mine)
    with CascadeStore(file_only(shared_dir), comm=comm) as again:  # windows and locks were released
        # the ranks whose close went well kept their block in the file tier
        kept = [same(again.get(everyone[r]), block(again.spec, r)) for r in range(comm.size) if r != culprit]
        assert everywhere(all(kept)), kept


def test_warm_restart_with_a_small_directory_serves_what_fits(comm, shared_dir, everywhere):
    blocks = 60
    with CascadeStore(file_only(shared_dir), comm=comm) as store:
        mine = [store.put(*block(store.spec, comm.rank * 10_000 + i)) for i in range(blocks)]
    everyone = comm.allgather(mine)
    small = 16  # slots per rank: fewer than the blocks the job kept
    with CascadeStore(file_only(shared_dir, directory_slots=small), comm=comm) as store:
        dropped = comm.allreduce(store.stats()["dropped_at_restart"])
        held = comm.allreduce(len(store))
        found = wrong = 0
        for rank, ids in enumerate(everyone):
            for i, bid in enumerate(ids):
                got = store.get(bid)
                found += got is not None
                wrong += got is not None and not same(got, block(store.spec, rank * 10_000 + i))
    total = blocks * comm.size
    if comm.size > 1:  # one rank has no directory: everything fits
        assert everywhere(dropped > 0 and held + dropped == total), (dropped, held)
        assert everywhere(held <= small * comm.size), held
    else:
        assert everywhere(dropped == 0 and held == total), (dropped, held)
    assert everywhere(wrong == 0 and comm.allreduce(found) == comm.size * held), (found, wrong)


def test_a_warm_restart_keeps_a_block_whose_read_fails_once_with_an_io_error(comm, shared_dir, everywhere,
                                                                                monkeypatch):
    import errno

    from cascade.tiers import record_io

    blocks = 4
    with CascadeStore(file_only(shared_dir), comm=comm) as store:
        mine = [store.put(*block(store.spec, comm.rank * 10_000 + i)) for i in range(blocks)]
    read, once = record_io.preadv_hashed, [comm.rank == 0]

    def preadv_hashed(fd, offset, iov, spans):  # rank 0's first read at the restart fails
        if once and once.pop():
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return read(fd, offset, iov, spans)

    monkeypatch.setattr(record_io, "preadv_hashed", preadv_hashed)
    monkeypatch.setattr(record_io, "submit", record_io.submit_python)
    with CascadeStore(file_only(shared_dir), comm=comm) as store:
        held = len(store)
        served = sum(same(store.get(b), block(store.spec, comm.rank * 10_000 + i)) for i, b in enumerate(mine))
        file = store.stats()["tiers"]["file"]
        errors = (file["read_errors"], file["corruptions"])
    # multi-rank, the failed read is the one for the block's checksum at open (the block is
    # kept, unpublished); one rank reads nothing at open, so it is the first get's (a miss)
    alone = comm.size == 1
    want = ((1, 0), blocks - alone) if comm.rank == 0 else ((0, 0), blocks)
    assert everywhere(held == blocks and (errors, served) == want), (errors, held, served)
    monkeypatch.undo()
    with CascadeStore(file_only(shared_dir), comm=comm) as store:  # and the next restart still has it
        served = sum(same(store.get(b), block(store.spec, comm.rank * 10_000 + i)) for i, b in enumerate(mine))
    assert everywhere(served == blocks), served


def test_a_warm_restart_counts_a_tail_on_another_rank_whatever_rank_republishes_first(comm, shared_dir, everywhere,
                                                                                        monkeypatch):
    if comm.size < 2:
        pytest.skip("a head and its tail on two ranks")
    import time

    from cascade.core import lifecycle

    with CascadeStore(file_only(shared_dir), comm=comm) as store:
        head = comm.bcast(store.put(*block(store.spec, 1)) if comm.rank == 0 else None)
        tail = comm.bcast(store.put(*block(store.spec, 2), parent=head) if comm.rank == 1 else None, root=1)
    if comm.rank == 0:  # the head's rank republishes last (a slower scan): the tail's found no parent listed
        adopt = lifecycle.adopt_found_blocks

        def late(*args, **kwargs):
            time.sleep(1.0)
            return adopt(*args, **kwargs)

        monkeypatch.setattr(lifecycle, "adopt_found_blocks", late)
    with CascadeStore(file_only(shared_dir), comm=comm) as store:
        children = store.cluster.lookup(("default", head)).children
        comm.Barrier()
        if comm.rank == 1:
            store.delete(tail)  # gives back the count it took
        comm.Barrier()
        after = store.cluster.lookup(("default", head)).children
        comm.Barrier()
    assert everywhere((children, after) == (1, 0), (children, after))
