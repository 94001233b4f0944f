"""The REMOTE tier at 1 and N ranks (see conftest.py for how to run)."""
from __future__ import annotations

import numpy as np
import pytest
import xxhash
from collective import raises

from cascade.distributed import DirectoryEntry, ShardedDirectory
from cascade.errors import BlockNotFound, CorruptBlock, InvalidBlock, TierFull
from cascade.distributed.remote_tier import RemoteTier
from cascade.metrics import aggregate

MPI = pytest.importorskip("mpi4py.MPI", reason="the mpi extra (mpi4py) is not installed")

NS = "tenant-a/llama"
CHUNK = 1 << 20
REMOTE = 2  # tier number used in directory entries here


def block(rank: int, k: int) -> np.ndarray:
    """Deterministic bytes any rank can regenerate; sizes from 0 to ~2.5 chunks."""
    rng = np.random.default_rng([rank, k])
    sizes = [0, 1, 63, 4096, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK // 2]
    return rng.integers(0, 256, size=sizes[k % len(sizes)], dtype=np.uint8)


def key(rank: int, k: int) -> tuple[str, str]:
    return NS, f"{rank:08x}{k:024x}"


NEEDS_PEERS = ("needs 2+ ranks: the REMOTE tier holds bytes only in other ranks' windows "
               "(run under mpiexec -n N; one rank is covered by test_a_one_rank_communicator_has_no_remote_space)")


def needs_peers(comm) -> None:
    if comm.size == 1:
        pytest.skip(NEEDS_PEERS)


@pytest.fixture
def tier(comm):
    with RemoteTier(comm, 32 * CHUNK, chunk_bytes=CHUNK, verify=True) as t:
        yield t


def test_a_one_rank_communicator_has_no_remote_space(comm, everywhere):
    with RemoteTier(exposed_bytes=16 * CHUNK, chunk_bytes=CHUNK) as alone:  # comm defaults to COMM_SELF
        sizes = (alone.capacity, alone.used, alone.free, len(alone))
        assert everywhere(sizes == (0, 0, 0, 0) and not alone.fits(1), sizes)
        assert everywhere(raises(TierFull, alone.put, key(0, 1), [b"x"]))
        assert everywhere(len(alone) == 0 and alone.stats()["targets"] == [])


def test_put_and_read_are_byte_exact_across_ranks(comm, tier, everywhere):
    needs_peers(comm)
    mine = {key(comm.rank, k): block(comm.rank, k) for k in range(16)}
    for k, data in mine.items():
        tier.put(k, [data[: len(data) // 3], data[len(data) // 3:]])  # parts, not concatenated
    assert everywhere(all(tier.length(k) == len(d) for k, d in mine.items()))
    assert everywhere(tier.used == sum(len(d) for d in mine.values()))
    ok = True
    for k, data in mine.items():
        out = np.empty_like(data)
        tier.read_into(k, out)
        ok &= bool((out == data).all()) and tier[k] == data.tobytes()
        rank, _, length = tier.location(k)
        ok &= rank != comm.rank and length == len(data)
    assert everywhere(ok)
    # Every rank reads every other rank's blocks from wherever they were put.
    where = comm.allgather({k: tier.location(k) for k in mine})
    for owner, blocks in enumerate(where):
        for (_, block_id), (rank, location, length) in blocks.items():
            out = bytearray(length)
            tier.read_remote(rank, location, out)
            ok &= bytes(out) == block(owner, int(block_id[8:], 16)).tobytes()
    assert everywhere(ok)


def test_blocks_found_through_the_directory(comm, tier, everywhere):
    """The intended flow: put, publish in the directory, others look up, pin, read, release."""
    needs_peers(comm)
    with ShardedDirectory(comm, slots_per_rank=1024) as directory:
        mine = [key(comm.rank, k) for k in (3, 6, 7)]
        for k in mine:
            data = block(comm.rank, int(k[1][8:], 16))
            tier.put(k, [data])
            rank, location, length = tier.location(k)
            directory.insert_if_absent(*k, DirectoryEntry(REMOTE, rank, location, length,
                                                          checksum=xxhash.xxh3_64_intdigest(data)))
        comm.Barrier()
        ok, checked = True, 0
        for other in range(comm.size):
            for k in [key(other, j) for j in (3, 6, 7)]:
                directory.add_ref(*k)
                entry = directory.lookup(*k)
                out = np.empty(entry.length, dtype=np.uint8)
                tier.read_remote(entry.rank, entry.location, out)
                ok &= xxhash.xxh3_64_intdigest(out) == entry.checksum
                ok &= out.tobytes() == block(other, int(k[1][8:], 16)).tobytes()
                directory.release(*k)
                checked += 1
        assert everywhere(ok and checked == 3 * comm.size)
        comm.Barrier()


def test_partial_reads_and_errors(comm, tier, everywhere):
    needs_peers(comm)
    data = block(comm.rank, 7)  # 2.5 chunks: spans a lease of 3 chunks
    tier.put(key(comm.rank, 7), [data])
    k = key(comm.rank, 7)
    head, tail = np.empty(100, np.uint8), np.empty(len(data) - 100, np.uint8)
    tier.read_parts_into(k, [head, tail])
    piece = bytearray(10)
    tier.read_into(k, piece, offset=len(data) - 10)
    ok = (head == data[:100]).all() and (tail == data[100:]).all() and bytes(piece) == data[-10:].tobytes()
    assert everywhere(raises(InvalidBlock, tier.read_into, k, bytearray(11), offset=len(data) - 10))
    assert everywhere(raises(InvalidBlock, tier.read_into, k, b"read-only"))
    assert everywhere(raises(InvalidBlock, tier.read_into, k, 12345))  # not a buffer
    wide = np.empty(len(data) // 4, np.uint32)  # any C-contiguous dtype is read as bytes
    tier.read_into(k, wide)
    ok &= wide.view(np.uint8).tobytes() == data[: wide.nbytes].tobytes()
    assert everywhere(ok)
    assert everywhere(raises(BlockNotFound, tier.read_into, key(comm.rank, 99), bytearray(1)))
    assert everywhere(raises(BlockNotFound, tier.__delitem__, key(comm.rank, 99)))
    holder = tier.location(k)[0]
    assert everywhere(raises(ValueError, tier.read_remote, holder, tier.windows.window_bytes(holder), bytearray(1)))
    for rank in (-1, comm.size):  # no such rank: an error, never another rank's bytes
        assert everywhere(raises(ValueError, tier.read_remote, rank, 0, bytearray(1)))
    # A block changed behind the tier's back is caught (verify=True), here and via the directory's checksum.
    rank, location, length = tier.location(k)
    tier.windows.put(rank, location + 5, [memoryview(bytes([data[5] ^ 0xFF]))])
    assert everywhere(raises(CorruptBlock, tier.read_into, k, np.empty(len(data), np.uint8)))
    assert everywhere(raises(CorruptBlock, tier.read_remote, rank, location, bytearray(length),
                             checksum=xxhash.xxh3_64_intdigest(data)))
    # Replacing a key keeps one copy of the new bytes.
    tier.put(k, [b"new bytes"])
    assert everywhere(tier[k] == b"new bytes" and len(tier) == 1 and tier.used == 9)
    comm.Barrier()


def test_a_job_report_counts_the_shared_pool_once(comm, tier, everywhere):
    """Each rank's capacity is the other ranks' lent windows; summed over ranks (the
    job's tier table, metrics.aggregate) the pool is what the ranks lend, each once."""
    needs_peers(comm)
    lent = tier.stats()["lent_bytes"]
    assert everywhere(lent == tier.windows.window_bytes(comm.rank) > 0)
    assert everywhere(tier.capacity == comm.allreduce(lent) - lent)
    total = aggregate(comm.allgather({"tiers": {"remote": tier.stats()}}))["tiers"]["remote"]
    assert everywhere(total["capacity"] == comm.allreduce(lent))


def test_full_tier_raises_and_stays_unchanged_then_space_returns(comm, tier, everywhere):
    needs_peers(comm)
    stored, full = [], False
    for k in range(10_000):
        try:
            tier.put(key(comm.rank, k), [np.full(CHUNK // 2, k % 251, np.uint8)])
        except TierFull:
            full = True
            break
        stored.append(key(comm.rank, k))
    assert everywhere(full) and comm.allreduce(len(stored)) > 0
    comm.Barrier()  # everybody is full now: the pool is exhausted
    used, count = tier.used, len(tier)
    assert everywhere(raises(TierFull, tier.put, key(comm.rank, 10_001), [np.zeros(CHUNK // 2, np.uint8)]))
    assert everywhere((tier.used, len(tier)) == (used, count))
    assert everywhere(comm.allreduce(tier.used) <= comm.allreduce(tier.capacity) // max(comm.size - 1, 1))
    ok = all(tier[k][:1] == bytes([i % 251]) for i, k in enumerate(stored))
    assert everywhere(ok)
    for k in stored:
        del tier[k]
    comm.Barrier()
    assert everywhere(tier.stats()["leases"] == 0 and tier.used == 0)
    assert everywhere(tier.free == tier.capacity)
