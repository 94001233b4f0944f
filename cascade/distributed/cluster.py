"""The store's view of the other ranks: directory bookkeeping and cross-rank reads.

A :class:`Cluster` is what a :class:`~cascade.store.CascadeStore` built with a
communicator of more than one rank uses to

* publish where each of its blocks lives (tier kind, rank, location) in the sharded
  :class:`~.directory.ShardedDirectory`, and keep that entry true when the block moves
  or leaves (moves and drops are refused while another rank pins the block);
* find and read blocks other ranks hold: node peers' SHM slabs through their files in
  ``/dev/shm``, SHM slabs of ranks on other nodes through an RMA window over the slab
  (:mod:`.shm_window`), any rank's REMOTE-window bytes, and aggregated files of ranks
  that share this rank's ``file_dir`` (checked at start, :mod:`.shared_fs`).

GPU-resident blocks of other ranks are not readable (no CUDA IPC or GPU RDMA here): a
rank that meets one counts it in :attr:`Cluster.unreadable` (logged once), stores its own
copy rather than deduplicating onto it, and keeps that copy private. The same holds for
file-tier blocks of ranks whose ``file_dir`` it cannot see.

Cross-rank reads take no pin: they use Gets only (lookup, bytes, lookup again) and keep
the bytes only if the entry still has the same placement and version afterwards. The
holder changes the entry (a move bumps the version, a withdrawal deletes it) before it
frees or reuses the bytes, so an unchanged entry proves the bytes were intact (seqlock).
Atomics would be the alternative, and between nodes MPICH completes those only when the
target enters MPI (:mod:`.progress_check`); Gets complete while it computes.

Every read verifies the bytes against the XXH3-64 checksum published in the entry (end
to end, whichever tier and rank served them): a mismatch is a miss, never data.

Collective: the constructor and :meth:`close`. Everything else is local and one-sided.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..buffers import host_outputs
from ..checksum import checksum
from ..errors import BlockNotFound, CorruptBlock
from ..identity import BlockKey
from ..tiers.base import TierKind
from ..tiers.record_io import read_record
from ..tiers.shm import ShmPeerSlabs
from .agree import DEFAULT_TIMEOUT as AGREE_TIMEOUT, agree
from .directory import DirectoryEntry, PinUnderflow, Removal, ShardedDirectory
from .progress_check import check_progress
from .progress_thread import ProgressThread
from .shared_fs import file_share_groups
from .shm_window import SlabWindow

if TYPE_CHECKING:
    from mpi4py import MPI

    from .remote_tier import RemoteTier

log = logging.getLogger(__name__)

#: The progress thread's visit interval and GIL switch interval when ``mpi_progress`` is on:
#: the setting that kept busy-owner atomics under 10 ms p99 in benchmark/workloads/cross_node.py.
PROGRESS_INTERVAL = 2e-4
#: Publishes between two sweeps of this rank's directory shard (stale locks, claims and
#: placeholders; see :meth:`.directory.ShardedDirectory.sweep`): one shard-sized Get.
SWEEP_EVERY = 4096


class Cluster:
    """Directory + peer readers for one rank of ``comm`` (size > 1)."""

    # optimistic reads retried this often before falling back to a pinned read
    OPTIMISTIC_TRIES = 3

    def __init__(self, comm: MPI.Comm, *, shm_path: str | None, file_dir: str,
                 remote: RemoteTier | None, directory_slots: int, shm_buffer: Any | None = None,
                 check_progress_at_start: bool = True, mpi_progress: str = "off") -> None:
        from mpi4py import MPI

        if mpi_progress not in ("off", "auto", "on"):
            raise ValueError(f"mpi_progress must be 'off', 'auto' or 'on', not {mpi_progress!r}")
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.directory = ShardedDirectory(comm, slots_per_rank=directory_slots)
        self.shm_window: SlabWindow | None = None
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        try:
            # node id = lowest rank on the node; node peers read each other's SHM slabs
            self.node_of = comm.allgather(local.allreduce(self.rank, op=MPI.MIN))
            self.shm_paths = comm.allgather(shm_path)
            self.file_groups = file_share_groups(comm, file_dir, local)
            self.shm_window = SlabWindow(comm, shm_buffer)
            # None on one node; False: inter-node atomics wait for a busy target (warned)
            self.atomics_progress = check_progress(comm, self.node_of) if check_progress_at_start else None
        except BaseException:
            if self.shm_window is not None:
                self.shm_window.free()
            self.directory.free()
            raise
        finally:
            local.Free()
        self.nodes = len(set(self.node_of))
        # inter-node atomics on this rank's windows progress while it computes (progress_thread.py)
        self.progress_thread: ProgressThread | None = None
        if mpi_progress == "on" or (mpi_progress == "auto" and self.atomics_progress is False):
            self.progress_thread = ProgressThread(comm, PROGRESS_INTERVAL, switch_interval=PROGRESS_INTERVAL).start()
            log.info("rank %d: MPI progress thread on (every %.1f ms)", self.rank, PROGRESS_INTERVAL * 1e3)
        self.file_dir = file_dir
        self.remote = remote
        self._peers = ShmPeerSlabs()
        self.unreadable = 0       # entries found that this rank cannot read (GPU, private files)
        self.optimistic_retries = 0
        self._publishes = 0
        self.same_node_reads = 0  # SHM reads through /dev/shm (node peers)
        self.window_reads = 0     # SHM reads through the slab window (other nodes)
        self._warned: set[int] = set()

    # -- what another rank can read ---------------------------------------------------------
    def readable(self, entry: DirectoryEntry) -> bool:
        """Whether this rank can read the bytes ``entry`` points at."""
        kind = TierKind(entry.tier)
        if entry.rank == self.rank:
            return True
        if kind is TierKind.SHM:
            return self._same_node_shm(entry.rank) or (
                self.shm_window is not None and self.shm_window.sizes[entry.rank] > 0)
        if kind is TierKind.REMOTE:
            return self.remote is not None
        if kind is TierKind.FILE:
            group = self.file_groups[self.rank]
            return group >= 0 and self.file_groups[entry.rank] == group
        return False  # GPU: no device memory access across processes here

    def _same_node_shm(self, rank: int) -> bool:
        return self.node_of[rank] == self.node_of[self.rank] and self.shm_paths[rank] is not None

    def read(self, key: BlockKey, outs: Sequence[Any]) -> DirectoryEntry | None:
        """Read a block some rank published into ``outs``. Returns the entry it read, or
        None (absent, unreadable here, or gone meanwhile). Gets only: 2 directory round
        trips + 1 for the bytes (see the module docstring); after
        :attr:`OPTIMISTIC_TRIES` changed entries, one pinned read (atomics).
        :class:`CorruptBlock` when file-tier bytes fail verification."""
        namespace, block_id = key
        for _ in range(self.OPTIMISTIC_TRIES):
            entry = self.directory.lookup(namespace, block_id)
            if entry is None:
                return None
            if not self.readable(entry):
                self._count_unreadable(entry)
                return None
            try:
                got, error = self._copy(key, entry, outs), None
            except CorruptBlock as exc:
                got, error = False, exc
            again = self.directory.lookup(namespace, block_id)
            if again is not None and again.placement() == entry.placement() and again.version == entry.version:
                if error is not None:
                    raise error
                return entry if got else None
            self.optimistic_retries += 1  # moved or withdrawn while we read: bytes unproven
        return self._pinned_read(key, outs)

    def _pinned_read(self, key: BlockKey, outs: Sequence[Any]) -> DirectoryEntry | None:
        """Pin, look up, copy, unpin: the holder can neither move nor free it meanwhile."""
        namespace, block_id = key
        try:
            self.directory.add_ref(namespace, block_id)
        except BlockNotFound:
            return None
        try:
            entry = self.directory.lookup(namespace, block_id)  # the location, under the pin
            if entry is None or not self.readable(entry):
                return None
            return entry if self._copy(key, entry, outs) else None
        finally:
            try:
                self.directory.release(namespace, block_id)
            except (BlockNotFound, PinUnderflow):
                pass

    def _copy(self, key: BlockKey, entry: DirectoryEntry, outs: Sequence[Any]) -> bool:
        """Copy the bytes ``entry`` points at into ``outs`` (any buffers: device ones get a
        host stand-in, see :func:`cascade.buffers.host_outputs`); False when they are gone."""
        with host_outputs(outs) as hosts:
            return self._copy_to_host(key, entry, hosts)

    def _copy_to_host(self, key: BlockKey, entry: DirectoryEntry, outs: list[Any]) -> bool:
        kind = TierKind(entry.tier)
        if kind is TierKind.SHM:
            if self._same_node_shm(entry.rank):
                try:
                    self._peers.read_into(self.shm_paths[entry.rank], entry.location, list(outs))
                except BlockNotFound:  # the peer's slab is gone (it closed or died): a miss
                    return False
                self.same_node_reads += 1
            else:
                self.shm_window.get_into(entry.rank, entry.location, outs)
                self.window_reads += 1
        elif kind is TierKind.REMOTE:
            self.remote.read_remote_parts(entry.rank, entry.location, outs)
        elif kind is TierKind.FILE:
            try:
                read_record(self.file_dir, entry.rank, entry.location, key, outs)
            except BlockNotFound:
                return False
        else:
            return False
        if checksum(outs) != entry.checksum:  # end to end, whichever tier and rank served it
            raise CorruptBlock(f"block {key[1]} read from rank {entry.rank} ({kind.name}) "
                               "does not match its published checksum")
        return True

    def _count_unreadable(self, entry: DirectoryEntry) -> None:
        self.unreadable += 1
        if entry.tier not in self._warned:
            self._warned.add(entry.tier)
            log.warning("rank %d cannot read %s-tier blocks of rank %d (counted as misses in "
                        "cluster.unreadable; this rank keeps its own copies)",
                        self.rank, TierKind(entry.tier).name, entry.rank)

    @property
    def atomics_wait_for_busy_ranks(self) -> bool:
        """Whether this rank's directory atomics may wait for a target rank busy outside
        MPI: the start-up self-test found inter-node atomics waiting, and no progress
        thread runs (``mpi_progress``)."""
        return self.atomics_progress is False and self.progress_thread is None

    # -- the holder's bookkeeping ---------------------------------------------------------------
    def publish(self, key: BlockKey, kind: TierKind, rank: int, location: int, length: int,
                parent: str | None, *, checksum: int) -> tuple[bool, DirectoryEntry, bool]:
        """Announce a block this rank put: its bytes are at ``location`` of ``rank``'s
        tier ``kind`` (another rank's for REMOTE) and hash to ``checksum``. Returns
        ``(inserted, entry, counted)``; not inserted means another rank published it
        first (cross-rank dedup: its share count rose); ``counted``: the parent's child
        count was taken (not when no rank lists the parent), so the withdrawal gives it
        back (pass the parent to :meth:`withdraw` only then). All or nothing: when
        counting the child raises, the insert is undone before the exception propagates;
        an insert that cannot be undone (pinned meanwhile, or the removal raised too)
        stays, uncounted, and the publish succeeds: the entry keeps matching the bytes."""
        entry = DirectoryEntry(tier=int(kind), rank=rank, location=location, length=length, checksum=checksum)
        self._publishes += 1
        if self._publishes % SWEEP_EVERY == 0:
            self.directory.sweep()
        inserted, current = self.directory.insert_if_absent(key[0], key[1], entry)
        counted = False
        if inserted and parent is not None:
            try:
                counted = self._adjust_child(key[0], parent, +1)
            except BaseException:
                try:
                    undo = self.directory.remove(key[0], key[1], expect=current)
                except Exception:  # the entry stays: the block with it (withdrawn as any other), uncounted
                    log.warning("publish of %s: child count of %s not taken and the insert could not be undone: "
                                "kept published", key[1], parent, exc_info=True)
                    return inserted, current, False
                if undo is Removal.PINNED:  # a reader pinned it meanwhile: keep it published
                    log.warning("publish of %s: child count of %s not taken and the insert not undone "
                                "(pinned)", key[1], parent, exc_info=True)
                    return inserted, current, False
                raise
        return inserted, current, counted

    def add_child(self, namespace: str, parent: str) -> bool:
        """Count one more cached child of ``parent``; False when no rank lists it."""
        return self._adjust_child(namespace, parent, +1)

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

    def relocate(self, key: BlockKey, old: DirectoryEntry, location: int) -> DirectoryEntry | None:
        """Point the entry at the block's new place within the same tier (file-tier
        compaction), pinned or not: the block stays where its pins want it. Returns the
        new entry, or None when the entry is no longer ours."""
        updated, entry = self.directory.update_location(key[0], key[1], tier=old.tier, rank=old.rank,
                                                        location=location, expect=old)
        return entry if updated else None

    def withdraw(self, key: BlockKey, old: DirectoryEntry, parent: str | None, *, leaf_only: bool) -> Removal:
        """Remove our entry before freeing the bytes, giving back the child count of
        ``parent`` (None: none was taken at :meth:`publish`). Anything but
        REMOVED/ABSENT/MISMATCH (pinned elsewhere, or children cached elsewhere) means:
        keep the block."""
        outcome = self.directory.remove(key[0], key[1], expect=old, leaf_only=leaf_only)
        if outcome is Removal.REMOVED and parent is not None:
            try:
                self._adjust_child(key[0], parent, -1)
            except Exception:  # the entry is gone either way; a count left too high only keeps the parent longer
                log.warning("withdraw of %s: child count of %s not released", key[1], parent, exc_info=True)
        return outcome

    def pin(self, key: BlockKey) -> int:
        """Pin a published block; :class:`BlockNotFound` when none is (a placeholder
        holding only a child count is not a block)."""
        refs = self.directory.add_ref(*key)
        if self.directory.lookup(*key) is None:  # a placeholder
            self.directory.release(*key)
            raise BlockNotFound(f"{key[0]}/{key[1]} is not in the directory")
        return refs

    def unpin(self, key: BlockKey) -> int:
        return self.directory.release(*key)

    def mark_failed(self, ranks) -> None:
        """Declare ranks stopped: their directory locks and claims are reclaimed at once when
        met (see :meth:`.directory.ShardedDirectory.mark_failed`). Local."""
        self.directory.mark_failed(ranks)

    def _adjust_child(self, namespace: str, parent: str, delta: int) -> bool:
        """Move ``parent``'s child count by ``delta``; False when nothing was counted."""
        try:
            if delta > 0:
                self.directory.add_child(namespace, parent, delta)
            else:
                self.directory.remove_child(namespace, parent, -delta)
        except (BlockNotFound, PinUnderflow):
            return False  # the parent is not cached (or was re-inserted): nothing to count
        return True

    def drain(self, ok: bool = True, timeout: float = AGREE_TIMEOUT) -> None:
        """Collective: return once every rank has stopped reading (entered close) and
        agreed that every rank's close went well (``ok``: ours did), waiting up to
        ``timeout`` seconds for them; see :func:`~.agree.agree` for what it raises."""
        agree(self.comm, ok, "closing the store", timeout=timeout)

    def close(self) -> None:
        """Collective: free the directory and slab windows."""
        if self.progress_thread is not None:
            self.progress_thread.stop()
            self.progress_thread = None
        self._peers.close()
        if self.shm_window is not None:
            self.shm_window.free()
            self.shm_window = None
        self.directory.free()
