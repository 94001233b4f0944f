"""The store's view of the other ranks: directory bookkeeping and cross-rank reads.

A :class:`Cluster` is what a :class:`~cascade.store.CascadeStore` built with a
communicator of more than one rank uses to

* publish where each of its blocks lives (tier kind, rank, location) in the sharded
  :class:`~.directory.ShardedDirectory`, and keep that entry true when the block moves
  or leaves (moves and drops are refused while another rank pins the block);
* find and read blocks other ranks hold: node peers' SHM slabs through their files in
  ``/dev/shm``, any rank's REMOTE-window bytes with one-sided ``Get``, and any rank's
  aggregated files on the shared file system. GPU-resident blocks of other ranks are
  not readable here (no CUDA IPC): they count as misses.

Cross-rank reads pin the entry (ref-count in the directory) for their duration, so the
holder can neither move nor free the bytes meanwhile.

Collective: the constructor and :meth:`close`. Everything else is local and one-sided.
"""
from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import BlockNotFound
from ..tiers.base import BlockKey
from ..tiers.file_tier import read_record
from ..tiers.shm import ShmPeerSlabs
from .directory import DirectoryEntry, PinUnderflow, Removal, ShardedDirectory

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..tiers.remote import RemoteTier

log = logging.getLogger(__name__)


class TierKind(enum.IntEnum):
    """Tier numbers as stored in directory entries (stable across configurations)."""

    GPU = 0
    SHM = 1
    REMOTE = 2
    LUSTRE = 3

    @classmethod
    def of(cls, tier_name: str) -> "TierKind":
        return cls[tier_name.upper()]


class Cluster:
    """Directory + peer readers for one rank of ``comm`` (size > 1)."""

    def __init__(self, comm: MPI.Comm, *, shm_path: str | None, file_dir: str,
                 remote: RemoteTier | None, directory_slots: int) -> None:
        from mpi4py import MPI

        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.directory = ShardedDirectory(comm, slots_per_rank=directory_slots)
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        try:
            # node id = lowest rank on the node; node peers read each other's SHM slabs
            self.node_of = comm.allgather(local.allreduce(self.rank, op=MPI.MIN))
            self.shm_paths = comm.allgather(shm_path)
        finally:
            local.Free()
        self.file_dir = file_dir
        self.remote = remote
        self._peers = ShmPeerSlabs()

    # -- what another rank can read ---------------------------------------------------------
    def readable(self, entry: DirectoryEntry) -> bool:
        """Whether this rank can read the bytes ``entry`` points at."""
        kind = TierKind(entry.tier)
        if entry.rank == self.rank:
            return True
        if kind is TierKind.SHM:
            return self.node_of[entry.rank] == self.node_of[self.rank] and self.shm_paths[entry.rank] is not None
        if kind is TierKind.REMOTE:
            return self.remote is not None
        return kind is TierKind.LUSTRE

    def read(self, key: BlockKey, outs: Sequence[Any]) -> DirectoryEntry | None:
        """Read a block some rank published into ``outs``: pin, look up, copy, unpin.
        Returns the entry it read, or None (absent, unreadable here, or gone meanwhile).
        :class:`CorruptBlock` when file-tier bytes fail verification."""
        namespace, block_id = key
        try:
            self.directory.add_ref(namespace, block_id)
        except BlockNotFound:
            return None
        try:
            entry = self.directory.lookup(namespace, block_id)  # the location, under the pin
            if entry is None or not self.readable(entry):
                return None
            kind = TierKind(entry.tier)
            if kind is TierKind.SHM:
                self._peers.read_into(self.shm_paths[entry.rank], entry.location, list(outs))
            elif kind is TierKind.REMOTE:
                self.remote.read_remote_parts(entry.rank, entry.location, outs)
            elif kind is TierKind.LUSTRE:
                try:
                    read_record(self.file_dir, entry.rank, entry.location, key, outs)
                except BlockNotFound:
                    return None
            else:
                return None
            return entry
        finally:
            try:
                self.directory.release(namespace, block_id)
            except (BlockNotFound, PinUnderflow):
                pass

    # -- the holder's bookkeeping ---------------------------------------------------------------
    def publish(self, key: BlockKey, kind: TierKind, location: int, length: int,
                parent: str | None) -> tuple[bool, DirectoryEntry]:
        """Announce a block this rank holds. Returns ``(inserted, entry)``; not inserted
        means another rank published it first (cross-rank dedup: its share count rose)."""
        entry = DirectoryEntry(tier=int(kind), rank=self.rank, location=location, length=length)
        inserted, current = self.directory.insert_if_absent(key[0], key[1], entry)
        if inserted and parent is not None:
            self._adjust_child(key[0], parent, +1)
        return inserted, current

    def lookup(self, key: BlockKey) -> DirectoryEntry | None:
        return self.directory.lookup(*key)

    def lookup_many(self, keys: Sequence[BlockKey]) -> list[DirectoryEntry | None]:
        return self.directory.lookup_many(list(keys))

    def move(self, key: BlockKey, old: DirectoryEntry, kind: TierKind, rank: int,
             location: int) -> DirectoryEntry | None:
        """Point the entry at the block's new place; returns the new entry, or None
        (nothing changed) while another rank pins it or it is no longer ours."""
        updated, entry = self.directory.update_location(key[0], key[1], tier=int(kind), rank=rank,
                                                        location=location, expect=old, unpinned=True)
        return entry if updated else None

    def withdraw(self, key: BlockKey, old: DirectoryEntry, parent: str | None, *, leaf_only: bool) -> Removal:
        """Remove our entry before freeing the bytes. Anything but REMOVED/ABSENT/MISMATCH
        (pinned elsewhere, or children cached elsewhere) means: keep the block."""
        outcome = self.directory.remove(key[0], key[1], expect=old, leaf_only=leaf_only)
        if outcome is Removal.REMOVED and parent is not None:
            self._adjust_child(key[0], parent, -1)
        return outcome

    def pin(self, key: BlockKey) -> int:
        return self.directory.add_ref(*key)

    def unpin(self, key: BlockKey) -> int:
        return self.directory.release(*key)

    def _adjust_child(self, namespace: str, parent: str, delta: int) -> None:
        try:
            if delta > 0:
                self.directory.add_child(namespace, parent, delta)
            else:
                self.directory.remove_child(namespace, parent, -delta)
        except (BlockNotFound, PinUnderflow):
            pass  # the parent is not cached (or was re-inserted): nothing to count

    def close(self) -> None:
        """Collective: free the directory windows."""
        self._peers.close()
        self.directory.free()
