"""Bucket locks and slot claims of a rank that stopped mid-insert are reclaimed.

A real dead rank ends the job under mpiexec, so the stopped rank is emulated: the last
rank abandons an insert half way (cascade.testing.abandoned_claim) and keeps its lock,
as if it had died there. The key is owned by rank 0 (another emulated node under
MPIR_CVAR_NUM_CLIQUES=2); rank 1 (or 0 at 2 ranks) then places the same block.
"""
from __future__ import annotations

import random
import time

import pytest
from collective import raises

from cascade.distributed import ClaimReclaimed, DirectoryEntry
from cascade.identity import id_owner
from cascade.testing.abandoned_claim import Abandoned, AbandoningDirectory

pytest.importorskip("mpi4py.MPI", reason="the mpi extra (mpi4py) is not installed")

NS = "tenant-a/llama"
LEASE = 0.5


def key_owned_by(owner: int, size: int, seed: int) -> str:
    rng = random.Random(seed)
    while id_owner(key := rng.randbytes(16).hex(), size) != owner:
        pass
    return key


@pytest.fixture
def parts(comm):
    if comm.size < 2:
        pytest.skip("needs a second rank to stop")
    return comm.size - 1, 1 % (comm.size - 1)  # victim, placer


@pytest.mark.parametrize("step", ["locked", "claimed", "written"])
def test_a_failed_ranks_lock_and_claim_are_taken_over_at_once(comm, everywhere, parts, step):
    victim, placer = parts
    block = key_owned_by(0, comm.size, 1000)
    with AbandoningDirectory(comm, slots_per_rank=256, claim_lease=3600.0) as d:  # no lease here
        ok = True
        if comm.rank == victim:
            d.abandon_at(step)
            ok = raises(Abandoned, d.insert_if_absent, NS, block, DirectoryEntry(1, victim, 7, 64))
        comm.Barrier()
        if comm.rank != victim:
            d.mark_failed([victim])
        if comm.rank == placer:
            inserted, entry = d.insert_if_absent(NS, block, DirectoryEntry(1, placer, 9, 64))
            ok = inserted and entry.rank == placer and d.reclaimed["locks"] == 1 and (
                d.reclaimed["deleted"] == (step == "written"))
        comm.Barrier()
        found = d.lookup(NS, block)
        ok = ok and found is not None and (found.rank, found.location) == (placer, 9)
        assert everywhere(ok, f"{step}: reclaimed {d.reclaimed}, found {found}")
        if step == "written":  # the stopped rank wakes up: it cannot commit over the reclaim
            ok = raises(ClaimReclaimed, d.resume) if comm.rank == victim else True
            comm.Barrier()
            found = d.lookup(NS, block)
            ok = ok and found is not None and found.rank == placer
            assert everywhere(ok, f"after resume: {found}")
        # the bucket lock is free again: remove and re-insert through it
        ok = True
        if comm.rank == placer:
            ok = d.remove(NS, block).value == "removed" and d.insert_if_absent(
                NS, block, DirectoryEntry(1, placer, 11, 64))[0]
        comm.Barrier()
        assert everywhere(ok)


def test_a_stalled_inserters_finished_claim_is_committed_after_the_lease(comm, everywhere, parts):
    victim, placer = parts
    block = key_owned_by(0, comm.size, 2000)
    with AbandoningDirectory(comm, slots_per_rank=256, claim_lease=LEASE) as d:
        ok = True
        if comm.rank == victim:
            d.abandon_at("written")
            ok = raises(Abandoned, d.insert_if_absent, NS, block, DirectoryEntry(1, victim, 7, 64))
        comm.Barrier()
        if comm.rank == placer:  # not declared failed: its complete entry is committed for it
            inserted, entry = d.insert_if_absent(NS, block, DirectoryEntry(1, placer, 9, 64))
            ok = (not inserted and entry.rank == victim and entry.shares == 2
                  and d.reclaimed == {"locks": 1, "committed": 1, "deleted": 0, "placeholders": 0})
        comm.Barrier()
        found = d.lookup(NS, block)
        ok = ok and found is not None and (found.rank, found.location) == (victim, 7)
        if comm.rank == victim:  # waking up, it finds its insert done and its lock gone
            ok = ok and raises(ClaimReclaimed, d.resume)
        assert everywhere(ok, f"reclaimed {d.reclaimed}, found {found}")


def test_an_unwritten_claim_is_swept_by_its_owner_after_the_lease(comm, everywhere, parts):
    victim, placer = parts
    block = key_owned_by(0, comm.size, 3000)
    with AbandoningDirectory(comm, slots_per_rank=256, claim_lease=LEASE) as d:
        ok = True
        if comm.rank == victim:
            d.abandon_at("claimed")
            ok = raises(Abandoned, d.insert_if_absent, NS, block, DirectoryEntry(1, victim, 7, 64))
        comm.Barrier()
        if comm.rank == placer:
            inserted, _ = d.insert_if_absent(NS, block, DirectoryEntry(1, placer, 9, 64))
            ok = inserted and d.reclaimed["locks"] == 1
        comm.Barrier()
        if comm.rank == 0:  # the claim holds no key: only its owner's sweep finds it
            before = d.local_stats()["writing"]
            first = d.sweep()  # first sighting
            time.sleep(LEASE * 1.5)
            second = d.sweep()
            ok = ok and (before, first, second, d.local_stats()["writing"]) == (1, 0, 1, 0)
        assert everywhere(ok, f"reclaimed {d.reclaimed}")


def test_mark_failed_rejects_this_rank_and_strangers(comm, everywhere):
    with AbandoningDirectory(comm, slots_per_rank=64) as d:
        ok = raises(ValueError, d.mark_failed, [comm.rank]) and raises(ValueError, d.mark_failed, [comm.size])
        assert everywhere(ok)


def test_a_placeholder_whose_child_died_with_its_rank_is_swept_after_its_lease(comm, everywhere, parts):
    victim, placer = parts
    parent, child = key_owned_by(0, comm.size, 4000), key_owned_by(victim, comm.size, 5000)
    with AbandoningDirectory(comm, slots_per_rank=256, placeholder_lease=1.0) as d:
        ok = True
        if comm.rank == placer:
            ok = d.insert_if_absent(NS, parent, DirectoryEntry(1, placer, 1, 64))[0]
        comm.Barrier()
        if comm.rank == victim:  # places a child of the block, then "dies" holding it
            ok = d.insert_if_absent(NS, child, DirectoryEntry(1, victim, 2, 64))[0] and d.add_child(NS, parent) == 1
        comm.Barrier()
        if comm.rank == placer:  # the parent goes while its child is cached: a placeholder stays
            ok = d.remove(NS, parent).value == "removed" and d.lookup(NS, parent) is None
        comm.Barrier()
        if comm.rank == 0:  # the placeholder's owner
            young = d.sweep()
            time.sleep(2.1)  # placeholders are stamped in whole wall-clock seconds
            old = d.sweep()
            ok = ok and (young, old, d.reclaimed["placeholders"]) == (0, 1, 1)
        comm.Barrier()
        if comm.rank == placer:  # a re-put starts afresh instead of inheriting the dead child's count
            inserted, entry = d.insert_if_absent(NS, parent, DirectoryEntry(1, placer, 3, 64))
            ok = ok and inserted and entry.children == 0
        assert everywhere(ok, f"reclaimed {d.reclaimed}")
