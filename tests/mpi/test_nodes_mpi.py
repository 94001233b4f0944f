"""Across nodes: what a rank on another node can read, and what it must not rely on.

``make test`` runs this suite at 1 rank, at 4 ranks on one node and at 4 ranks as 2
emulated nodes (``MPIR_CVAR_NUM_CLIQUES=2``; MPICH then routes traffic between the two
halves through its network module, as between real nodes). ``CASCADE_TEST_NODES`` names
the node count the run must see, so a silently ignored emulation fails.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from kv_blocks import block, same

from cascade import CascadeStore, Config

MPI = pytest.importorskip("mpi4py.MPI", reason="the mpi extra (mpi4py) is not installed")



def node_of(comm) -> list[int]:
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return comm.allgather(local.allreduce(comm.rank, op=MPI.MIN))
    finally:
        local.Free()




def test_the_run_sees_the_node_count_it_was_started_for(comm, everywhere):
    nodes = node_of(comm)
    expected = os.environ.get("CASCADE_TEST_NODES")
    if expected is None:
        pytest.skip("CASCADE_TEST_NODES not set (make test sets it for the emulated-node run)")
    assert everywhere(len(set(nodes)) == int(expected))


def test_shm_blocks_of_other_nodes_are_read_through_the_window(comm, shared_dir, everywhere):
    """Each emulated node gets its own SHM directory (as real nodes have their own
    /dev/shm). Reads of other nodes' blocks must all go through the slab window: the
    same-node path (opening the holder's slab file) is counted, and must serve exactly
    the node's own peers."""
    nodes = node_of(comm)
    shm_dir = os.path.join(shared_dir, f"node{nodes[comm.rank]}")
    os.makedirs(shm_dir, exist_ok=True)
    store = CascadeStore(Config(model="tiny", shm_bytes=64 * 4096, remote_bytes=0, file_bytes=0,
                                shm_dir=shm_dir, file_dir=os.path.join(shared_dir, "files"),
                                directory_slots=1 << 12), comm=comm)
    try:
        mine = [store.put(*block(store.spec, 7000 + 100 * comm.rank + i)) for i in range(10)]
        comm.Barrier()
        wrong = 0
        for rank, ids in enumerate(comm.allgather(mine)):
            for i, bid in enumerate(ids):
                wrong += not same(store.get(bid), block(store.spec, 7000 + 100 * rank + i))
        comm.Barrier()
        assert everywhere(wrong == 0, f"{wrong} blocks missing or wrong")
        cluster = store.cluster
        if cluster is None:
            return
        others_here = sum(1 for r, n in enumerate(nodes) if n == nodes[comm.rank] and r != comm.rank)
        elsewhere = sum(1 for n in nodes if n != nodes[comm.rank])
        assert everywhere(cluster.same_node_reads == 10 * others_here)
        assert everywhere(cluster.window_reads == 10 * elsewhere)
        # (one machine: the other nodes' slab files do exist here, so the counters above
        # are the proof that none was opened; the node test above proves the split)
        assert everywhere(all(not cluster._same_node_shm(r) for r, n in enumerate(nodes) if n != nodes[comm.rank]))
    finally:
        store.close()


@pytest.mark.parametrize("shared", [True, False])
def test_file_tier_blocks_are_shared_only_through_a_shared_file_dir(comm, shared_dir, everywhere, shared):
    """Per-rank file_dir emulates node-local disks: no rank may acknowledge a put as a
    duplicate of a file-tier block it cannot read, nor read one."""
    file_dir = os.path.join(shared_dir, "files" if shared else f"rank{comm.rank}")
    store = CascadeStore(Config(model="tiny", shm_bytes=0, remote_bytes=0, file_bytes=256 * 8192,
                                file_dir=file_dir, directory_slots=1 << 12), comm=comm)
    try:
        common = [store.put(*block(store.spec, 500 + i)) for i in range(8)]  # every rank, same bytes
        own = store.put(*block(store.spec, 9000 + comm.rank))
        comm.Barrier()
        stats = store.stats()
        owners = comm.allgather(own)
        got = [store.get(bid) for bid in owners]
        # every rank reads its own and the common blocks back, byte-exact
        assert everywhere(all(same(store.get(bid), block(store.spec, 500 + i)) for i, bid in enumerate(common)))
        assert everywhere(same(got[comm.rank], block(store.spec, 9000 + comm.rank)))
        if comm.size == 1:
            return
        groups = store.cluster.file_groups
        if shared:
            assert everywhere(len(set(groups)) == 1 and groups[0] >= 0)
            assert comm.allreduce(stats["stored"]) == 8 + comm.size  # the common blocks once
            assert everywhere(all(same(g, block(store.spec, 9000 + r)) for r, g in enumerate(got)))
        else:
            assert everywhere(groups[comm.rank] < 0 or groups.count(groups[comm.rank]) == 1)
            assert everywhere(stats["stored"] == 9)  # nothing deduplicated onto unreadable copies
            assert everywhere(all(g is None for r, g in enumerate(got) if r != comm.rank))
            assert everywhere(store.cluster.unreadable > 0)
        comm.Barrier()
    finally:
        store.close()


def test_gpu_tier_blocks_of_other_ranks_are_counted_misses_never_dedup_targets(comm, shared_dir, everywhere):
    """The documented choice for GPU-resident blocks (no CUDA IPC / GPU RDMA here): other
    ranks cannot read them, so they count them (``cluster.unreadable``), never
    acknowledge a put as a duplicate of one, and keep their own copy."""
    if comm.size == 1:
        pytest.skip("needs a second rank")
    store = CascadeStore(Config(model="tiny", gpu_bytes=64 * 4096, shm_bytes=64 * 4096, remote_bytes=0,
                                file_bytes=0, file_dir=os.path.join(shared_dir, "files"),
                                directory_slots=1 << 12), comm=comm, array_module=np)
    try:
        first = store.put(*block(store.spec, 4242)) if comm.rank == 0 else None  # lands in rank 0's GPU tier
        first = comm.bcast(first)
        comm.Barrier()
        got = store.get(first)
        if comm.rank == 0:
            ok, why = same(got, block(store.spec, 4242)), "rank 0 misread its own GPU-tier block"
        else:
            unreadable = store.cluster.unreadable
            store.put(*block(store.spec, 4242))  # not a dedup onto rank 0's unreadable copy
            stats = store.stats()
            own = store.get(first)  # its own copy serves it
            ok = (got is None and unreadable == 1 and stats["stored"] == 1 and stats["cluster_deduped"] == 0
                  and same(own, block(store.spec, 4242)))
            why = (f"read rank 0's copy: {got is not None}, unreadable {unreadable}, stored {stats['stored']}, "
                   f"cluster_deduped {stats['cluster_deduped']}, own copy read back: {own is not None}")
        assert everywhere(ok, why)
        comm.Barrier()
    finally:
        store.close()


def test_cache_cluster_reads_keeps_hot_blocks_local(comm, shared_dir, everywhere):
    """With ``cache_cluster_reads`` the holder of a hot block serves each rank once."""
    store = CascadeStore(Config(model="tiny", shm_bytes=64 * 4096, remote_bytes=0, file_bytes=0,
                                file_dir=os.path.join(shared_dir, "files"), directory_slots=1 << 12,
                                cache_cluster_reads=True), comm=comm)
    try:
        hot = comm.bcast(store.put(*block(store.spec, 777)) if comm.rank == 0 else None)
        comm.Barrier()
        reads = [store.get(hot) for _ in range(5)]
        stats = store.stats()
        assert everywhere(all(same(r, block(store.spec, 777)) for r in reads))
        assert everywhere(stats["cluster_hits"] == (0 if comm.rank == 0 else 1))
        assert everywhere(stats["hits"] == 5)
        comm.Barrier()
    finally:
        store.close()
