"""CascadeStore: the content-addressed, tiered KV-block store of one rank.

The store owns the tiers (fastest first: GPU, SHM, REMOTE, LUSTRE — those configured),
the per-block metadata, the policy and the counters. A block lives in exactly one tier;
puts enter the fastest tier, eviction demotes tier by tier (failure-atomic: a block
leaves a tier only after the slower tier accepted it) and only the last tier drops.

In a multi-rank run the store tells its multi-rank layer
(:mod:`cascade.distributed.store_layer`) about every block it stores, moves and frees;
the layer keeps the global directory true and answers local misses from other ranks.
On one rank the layer is a no-op stand-in, so the code here is the same either way.

Thread-safety: every public method is safe to call from several threads. One lock per
store guards the metadata only; the bytes move outside it. A get leases the block in its
tier (its bytes stay in place, even if deleted meanwhile) and counts a reader on it (the
policy does not move it meanwhile), copies, then does its bookkeeping under the lock; a
put claims room under the lock, copies outside it, and commits under it; a demotion
that makes room for a put copies between two short locked steps. Cross-rank reads run
outside the store's lock too (the multi-rank layer serialises its own calls). Still
under the lock: the copies of a hint's promotion, demotions made for a promotion or a
namespace quota, room-making for content-hashed puts, REMOTE-tier (MPI) copies,
warm-restart checks and compaction of the file tier.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from . import manifest
from .async_ops import AsyncCalls
from .buffers import host_bytes, host_outputs
from .config import Config
from .distributed.agree import PeerStepFailed, agree
from .distributed.directory import DirectoryFull
from .distributed.store_layer import Joined, Solo
from .errors import (BlockNotFound, BlockPinned, ConfigError, CorruptBlock, InvalidBlock, RankFailure, StoreClosed,
                     TierFull)
from .identity import block_id as compute_block_id, check_id, check_namespace
from .models import BlockSpec
from .namespace_victims import NamespaceVictims
from .policy import BlockMeta, Policy
from .histogram import LatencyHistogram
from .stats import StoreCounters, TierCounters, write_stats_file
from .tiers.base import BlockKey, Tier
from .tiers.adoption import adopt_orphans
from .tiers.file_tier import FileTier
from .tiers.gpu import GpuTier, cupy_module
from .tiers.slab_tier import SlabTier
from .tiers.shm import ShmTier, remove_stale_slabs
from .validate import check_priority, check_ttl

log = logging.getLogger(__name__)
DEFAULT_NAMESPACE = "default"
_HISTORY_PER_BLOCK = 8  # the policy remembers use counts of 8x as many dropped blocks as fit
#: Seconds close() lets non-blocking calls submitted before it finish before cancelling the rest.
ASYNC_CLOSE_SECONDS = 60.0
_OVERLAP_MIN_BYTES = 256 << 10  # below this, handing the hash to a thread costs more than it saves


class _Busy(Exception):
    """A chosen victim may not move or go now: another rank pins it or caches a child."""


class _MoveFailed(Exception):
    """A demotion's copy failed (e.g. the slower tier's disk is full): the block stayed."""


class _Move:
    """A demotion in progress: ``meta``'s bytes leased in tier ``src``, room claimed
    below (``dst``); copied by :meth:`CascadeStore._run_move`."""

    __slots__ = ("meta", "src", "lease", "dst")

    def __init__(self, meta: BlockMeta, src: int, lease: Any, dst: "_Slot") -> None:
        self.meta, self.src, self.lease, self.dst = meta, src, lease, dst


class _Slot:
    """Room that a put (or a promotion, or a private copy) claimed in tier ``tier``:
    filled outside the store's lock, then committed or discarded under it."""

    __slots__ = ("tier_obj", "tier", "handle", "filled")

    def __init__(self, tier_obj: Tier, tier: int, handle: Any) -> None:
        self.tier_obj, self.tier, self.handle, self.filled = tier_obj, tier, handle, False

    def fill(self, parts: Sequence[Any]) -> None:
        self.tier_obj.fill(self.handle, parts)
        self.filled = True

    def commit(self, key: BlockKey) -> None:
        self.tier_obj.commit(key, self.handle)

    def discard(self) -> None:
        self.tier_obj.discard(self.handle)


def build_tiers(config: Config, *, rank: int = 0, array_module=None, comm=None,
                layout: manifest.Layout | None = None, world_size: int | None = None) -> list[Tier]:
    """The tiers ``config`` asks for, fastest first. Collective when ``comm`` (of more
    than one rank) is given: the ranks agree that every rank opened its local tiers
    (a rank that failed, e.g. because another job holds its file-tier lock, raises its
    own error and every other rank :class:`~cascade.distributed.agree.PeerStepFailed`),
    then the REMOTE tier allocates its MPI window.

    ``layout``: the block layout the file tier's records must have (checked against the
    directory's manifest). ``world_size``: the job's size when known; the file tier then
    adopts the files of ranks at or beyond it (a restart on fewer ranks).

    ``array_module`` forces the GPU tier's array module (numpy in tests); by default the
    GPU tier uses cupy and is off, with a log line, when no GPU is usable.
    """
    fast: list[Tier] = []
    slow: list[Tier] = []
    try:
        if config.gpu_bytes > 0:
            xp = array_module if array_module is not None else cupy_module()
            if xp is not None:
                fast.append(GpuTier(config.gpu_bytes, xp, verify=config.verify_dram_reads))
        for path in remove_stale_slabs(config.shm_dir):  # left by a crashed process of ours
            log.info("removed stale SHM slab %s (its process is gone)", path)
        if config.shm_bytes > 0:
            try:
                fast.append(ShmTier(config.shm_bytes, config.shm_dir, verify=config.verify_dram_reads))
            except (TierFull, OSError) as exc:  # a full or missing /dev/shm: run on the other tiers
                log.warning("SHM tier off: %s", exc)
        if config.file_bytes > 0:
            if layout is not None:
                manifest.check(config.file_dir, layout, world_size)
            slow.append(open_file_tier(config, rank))
            if world_size is not None:
                adopted = adopt_orphans(slow[0], world_size, lambda old: open_file_tier(config, old, capacity=1 << 62))
                slow[0].counters["adopted"] = adopted.blocks
        opened = True
    except BaseException:
        opened = False
        for tier in fast + slow:
            tier.close()
        if comm is None:
            raise
        agree(comm, False, "opening the local tiers")
        raise
    if comm is None:
        return fast + slow
    try:
        agree(comm, opened, "opening the local tiers")
        from .tiers.remote import RemoteTier

        # every rank takes part in the window, even one exposing 0 bytes; always
        # verified: its reads cross ranks (the end-to-end check, like peers' reads)
        remote = RemoteTier(comm, config.remote_bytes, chunk_bytes=remote_chunk_bytes(config.remote_bytes),
                            verify=True)
    except BaseException:
        for tier in fast + slow:
            tier.close()
        raise
    return fast + [remote] + slow


def open_file_tier(config: Config, rank: int, *, capacity: int | None = None) -> FileTier:
    """Rank ``rank``'s file tier as ``config`` sets it up (``capacity`` overrides
    ``file_bytes``: adopting another rank's files reads them whatever their size)."""
    return FileTier(
        config.file_bytes if capacity is None else capacity, config.file_dir, rank=rank,
        segment_bytes=config.file_segment_bytes, odirect=config.file_odirect, read_mode=config.file_read_mode,
        fsync=config.file_fsync, compact_dead_fraction=config.compact_dead_fraction,
        stripe_count=config.lustre_stripe_count, stripe_size=config.lustre_stripe_size,
    )


def remote_chunk_bytes(exposed: int) -> int:
    """Lease unit of the REMOTE tier: 16 MiB, smaller for small windows (at least 64
    chunks per window, so a window is shared fairly among writers)."""
    chunk = 16 << 20
    while chunk > 4096 and exposed // chunk < 64:
        chunk //= 2
    return chunk


class CascadeStore:
    """A tiered KV-block store. ``CascadeStore(Config(...))``; close it (or use ``with``).

    ``block_spec`` overrides the shape/dtype implied by ``config.model`` and
    ``config.block_tokens``; ``tiers`` replaces the configured tiers (fastest first).

    ``comm`` (an mpi4py communicator) joins the ranks of ``comm`` into one cache: a global
    directory sharded over them, the REMOTE tier over their DRAM windows, cross-rank
    dedup, reads and pins. Then the constructor and :meth:`close` are collective: the
    constructor returns on a rank only once every rank has republished the blocks its file
    tier kept (so the first read anywhere sees every rank's warm-restart blocks), and an
    open or close that fails on one rank raises there and raises
    :class:`~cascade.distributed.agree.PeerStepFailed` (a :class:`RankFailure`) naming it
    on every other rank, instead of leaving them waiting; a rank that never arrives makes
    the others raise :class:`RankFailure` after ``agree.DEFAULT_TIMEOUT`` seconds. Without
    ``comm`` (or with one rank) the store is purely local and needs no MPI.
    """

    def __init__(
        self,
        config: Config | None = None,
        *,
        block_spec: BlockSpec | None = None,
        tiers: Sequence[Tier] | None = None,
        array_module=None,
        rank: int = 0,
        comm=None,
    ) -> None:
        self.config = config or Config.load()
        self.spec = block_spec or BlockSpec.for_model(self.config.model, self.config.block_tokens)
        clustered = comm is not None and comm.Get_size() > 1
        if clustered:
            rank = comm.Get_rank()
        self.layout = manifest.Layout(tuple(self.spec.shape), str(np.dtype(self.spec.dtype)),
                                      self.config.block_tokens, self.config.model)
        built = list(tiers) if tiers is not None else build_tiers(
            self.config, rank=rank, array_module=array_module, comm=comm if clustered else None,
            layout=self.layout, world_size=comm.Get_size() if comm is not None else None)
        self._built_tiers = built  # all of them, for close(): the REMOTE tier's is collective
        self.tiers: list[Tier] = [t for t in built if t.capacity > 0]
        if not self.tiers:
            for tier in built:
                tier.close()
            raise TierFull("no tier has capacity: set shm_bytes, gpu_bytes or file_bytes above 0")
        capacity_blocks = sum(t.capacity for t in self.tiers) // max(self.spec.block_bytes, 1)
        policy = NamespaceVictims if self.config.namespace_share > 0 else Policy  # per-namespace order
        self.policy = policy(len(self.tiers), self.config.policy, ttl_mode=self.config.ttl_mode,
                             history=_HISTORY_PER_BLOCK * capacity_blocks)
        self.counters = StoreCounters()
        self.tier_counters = [TierCounters() for _ in self.tiers]
        self.get_latency = [LatencyHistogram() for _ in self.tiers]  # per serving tier
        self.put_latency = LatencyHistogram()
        self.cluster_latency = LatencyHistogram()  # gets served by another rank
        self.rank = rank
        self._stats_written = 0.0
        self._meta: dict[BlockKey, BlockMeta] = {}
        self._hinted_bytes = 0  # bytes of blocks with hints > 0 (capped, see hint())
        # cached children per tier of each parent key, kept while the parent itself is
        # not cached (deleted, expired): a re-put of the head starts with its true count
        self._kids: dict[BlockKey, list[int]] = {}
        # namespace quotas (config.namespace_share): bytes of each namespace in each tier
        self._ns_bytes: list[dict[str, int]] = [{} for _ in self.tiers]
        self._lock = threading.RLock()  # metadata only: data moves outside it (see _read, put)
        self._inflight = 0  # reads and writes moving data outside the lock: close() waits for them
        self._idle = threading.Condition(self._lock)
        self._hasher: ThreadPoolExecutor | None = None
        self._io: ThreadPoolExecutor | None = None  # batch calls (get_many, put_many)
        self._io_workers = 0
        self._async = AsyncCalls(self.config.io_threads)  # put_async & co. (cascade/async_ops.py)
        self._closing = False  # close() has begun (or ended): new calls raise StoreClosed
        # Blocks found on disk at open, not yet confirmed by a put of the same bytes: a
        # put never dedups onto one of them unseen (see _confirmed).
        self._unconfirmed: set[BlockKey] = set()
        for tier in self.tiers:
            if hasattr(tier, "expiry_of"):  # persistent tiers record TTLs (wall clock)
                tier.expiry_of = self._wall_expiry
            if isinstance(tier, FileTier):
                tier.on_relocate = self._relocated
        self._peers: Solo = Solo()  # the multi-rank layer (cascade/distributed/store_layer.py)
        together = clustered  # whether every rank takes the same way out if this fails
        try:
            if clustered:
                from .distributed.cluster import Cluster

                shm = next((t for t in self.tiers if t.name == "shm"), None)
                remote = next((t for t in built if t.name == "remote"), None)
                cluster = Cluster(comm, shm_path=getattr(shm, "path", None), file_dir=self.config.file_dir,
                                  shm_buffer=getattr(shm, "mapping", None),
                                  remote=remote, directory_slots=self.config.directory_slots)
                self._peers = Joined(cluster, self.tiers, rank)
            try:
                self._recover()
                if rank == 0 and tiers is None and any(isinstance(t, FileTier) for t in self.tiers):
                    manifest.write(self.config.file_dir, self.layout, world_size=comm.Get_size() if comm else 1,
                                   nodes=self._peers.cluster.nodes if clustered else 1)
            except BaseException:
                if clustered:  # the others learn it, and no rank waits for us forever
                    together = False
                    agree(comm, False, "warm restart")
                    together = True
                raise
            if clustered:
                # Ready only when every rank's republished blocks are visible: a rank
                # leaving before the others finish republishing misses their blocks.
                together = False
                agree(comm, True, "warm restart")
        except PeerStepFailed:  # the agreement itself completed: every rank is failing
            self._abandon(collective=True)
            raise
        except BaseException:
            self._abandon(collective=together)
            raise

    def _abandon(self, *, collective: bool) -> None:
        """A failed open: release what the constructor took. ``collective``: every rank
        is here too (it failed, or learnt that a rank failed), so windows can be freed."""
        peers, self._peers = self._peers, Solo()
        try:
            if collective:
                peers.close(ok=False)
        except PeerStepFailed:
            pass  # we know: this open is failing everywhere
        finally:
            self._release_tiers(collective=collective)

    def _release_tiers(self, *, collective: bool) -> None:
        """Close every tier built (a REMOTE tier's window only when ``collective``: every
        rank is closing too) and forget every block."""
        for tier in self._built_tiers:
            if collective or not tier.collective:
                tier.close()
        self._meta.clear()

    # -- construction -------------------------------------------------------------------
    def _recover(self) -> None:
        """Adopt blocks that persistent tiers found on disk (warm restart)."""
        now = time.monotonic()
        wall = time.time()
        for t, tier in enumerate(self.tiers):
            parent_of = getattr(tier, "parent_of", None)
            expires_of = getattr(tier, "expires_of", None)
            sizes = {tier.length(key) for key in tier}
            if sizes - {self.spec.block_bytes}:
                raise ConfigError(
                    f"{tier.name} tier in {getattr(tier, 'directory', '?')} holds blocks of "
                    f"{sorted(sizes)} bytes but this store's blocks are {self.spec.block_bytes} bytes "
                    f"({self.config.model}, {self.config.block_tokens} tokens): use another file_dir")
            for key in tier:
                expires = expires_of(key) if expires_of else 0.0
                if expires and expires <= wall:  # its TTL ran out while no store was open
                    del tier[key]
                    self.counters.expired += 1
                    continue
                meta = BlockMeta(key, tier.length(key), t, parent=parent_of(key) if parent_of else None,
                                 ttl=expires - wall if expires else self.config.default_ttl)
                self._meta[key] = meta
                self._ns_add(meta, t, meta.nbytes)
                self._unconfirmed.add(key)
        for meta in self._meta.values():
            meta.depth = self._depth(meta)
            meta.child_tiers = self._kids.setdefault(meta.key, [0] * len(self.tiers))
            self.policy.admitted(meta, now)
        for meta in self._meta.values():
            self._link_child(meta)
        unlisted = 0
        for meta in sorted(self._meta.values(), key=lambda m: m.depth):  # heads first: prefixes survive
            try:
                kept = self._peers.recovered(meta)
            except CorruptBlock as exc:
                log.warning("%s", exc)
                kept = False
            except DirectoryFull:  # serve what fits: the rest could not be found by other ranks
                unlisted += 1
                kept = False
            if not kept:  # corrupt, no directory slot, or another rank's copy won
                self._drop(meta)
        if unlisted:
            self.counters.dropped_at_restart += unlisted
            log.warning("warm restart: the directory had no slot for %d blocks (directory_slots=%d per rank): "
                        "dropped; raise directory_slots to keep them", unlisted, self.config.directory_slots)
        for t, tier in enumerate(self.tiers):  # a smaller capacity than last time: shed blocks
            while tier.free < 0 and (victim := self.policy.victim(t)) is not None:
                self._demote(victim)

    def _relocated(self, keys: list[BlockKey]) -> None:
        """Under the lock (compaction runs inside tier calls the store makes under it):
        blocks the file tier moved to another of its files get their directory entries
        pointed at the new place."""
        for key in keys:
            meta = self._meta.get(key)
            if meta is not None and isinstance(self.tiers[meta.tier], FileTier):
                self._peers.relocated(meta)

    def _depth(self, meta: BlockMeta) -> int:
        depth, seen, parent = 0, set(), meta.parent
        while parent is not None and parent not in seen:
            seen.add(parent)
            up = self._meta.get((meta.key[0], parent))
            if up is None:
                break
            depth, parent = depth + 1, up.parent
        return depth

    # -- validation -------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closing:
            raise StoreClosed("this CascadeStore is closed")

    def _end_inflight(self) -> None:
        """Under the lock: one data movement outside the lock has ended."""
        self._inflight -= 1
        if not self._inflight:
            self._idle.notify_all()

    def _check_pair(self, key: Any, value: Any) -> list[Any]:
        self._check_open()
        self.spec.check(key, "key")
        self.spec.check(value, "value")
        return [key, value]

    @staticmethod
    def _check_put_options(namespace: str, parent: str | None, priority: int,
                           ttl: float | None) -> tuple[int, float | None]:
        check_namespace(namespace)
        if parent is not None:
            check_id(parent)
        return check_priority(priority), None if ttl is None else check_ttl(ttl)

    def _key(self, block_id: str, namespace: str) -> BlockKey:
        self._check_open()
        return (check_namespace(namespace), check_id(block_id))

    # -- put ------------------------------------------------------------------------------
    def put(
        self,
        key: Any,
        value: Any,
        *,
        parent: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        block_id: str | None = None,
        verify: bool = False,
        ttl: float | None = None,
        priority: int = 0,
    ) -> str:
        """Store a block (K and V arrays of the store's spec); return its id. Local.

        The main path: ``block_id`` is a token-prefix id (:func:`cascade.prefix_ids`),
        known before the KV is computed; the put then only copies (no hashing of the KV;
        the tiers' record checksums guard the bytes). Without ``block_id`` the id is the
        content digest; ``verify=True`` recomputes it and checks a given ``block_id``. A
        put of an id already cached in ``namespace`` only adds a reference (dedup).
        ``parent`` is the id of the previous block of the sequence. Raises
        :class:`InvalidBlock` for bad input and :class:`TierFull` when no tier can take
        the block (nothing stored is lost either way). The copy runs outside the store's
        lock: puts from several threads copy in parallel.
        """
        parts = self._check_pair(key, value)
        priority, ttl = self._check_put_options(namespace, parent, priority, ttl)  # before anything is stored
        started = time.perf_counter()
        slot: _Slot | None = None  # room taken in some tier, filled outside the lock
        if block_id is None or verify:
            slot, digest = self._hash_and_copy(parts, namespace)
            if block_id is not None and check_id(block_id) != digest:
                self._give_back(slot, inflight=slot is not None)
                raise InvalidBlock(f"block_id {block_id} does not match the content digest {digest}")
            block_id = digest
        bkey = self._key(block_id, namespace)
        # published with the block so that every cross-rank read can verify the bytes
        block_sum = self._peers.checksum(parts)
        with self._lock:
            self._check_open()
            self.counters.puts += 1
            settled = self._settled_without_storing(bkey, parts)
        if settled:
            self._give_back(slot, inflight=slot is not None)
            return block_id
        if slot is None:
            slot = self._room_for_put(bkey, parent)
        try:
            if not slot.filled:
                slot.fill(parts)
        except OSError as exc:  # TierFull included: ENOSPC and friends
            self._give_back(slot, inflight=True)
            with self._lock:
                self.counters.rejected += 1
                self.tier_counters[slot.tier].full_events += 1
            raise exc if isinstance(exc, TierFull) else TierFull(f"{slot.tier_obj.name}: {exc}") from exc
        except BaseException:
            self._give_back(slot, inflight=True)
            raise
        with self._lock:
            self._end_inflight()  # (close() waits for this lock: the commit still happens)
            # a put of the same id in another thread may have won meanwhile
            if self._settled_without_storing(bkey, parts, cluster=False):
                slot.discard()
                return block_id
            try:
                slot.commit(bkey)
            except OSError:  # TierFull included: a non-concurrent tier copies at commit
                self.counters.rejected += 1
                self.tier_counters[slot.tier].full_events += 1
                raise
            placed = slot.tier
            meta = BlockMeta(bkey, self.spec.block_bytes, placed, parent=parent, priority=priority,
                             ttl=self.config.default_ttl if ttl is None else ttl, checksum=block_sum)
            meta.depth = self._depth(meta)
            self._unconfirmed.discard(bkey)
            self._admit(meta, time.monotonic())
            if meta.ttl:
                self._persist_ttl(meta)
            try:
                published = self._peers.publish(meta)
            except BaseException:  # e.g. DirectoryFull: a rejected put stores nothing
                if meta.key in self._meta:
                    self._drop(meta)
                self.counters.rejected += 1
                raise
            if not published:
                self._drop(meta)
                self.counters.deduped += 1  # another rank published it first: use theirs
                self.counters.cluster_deduped += 1
                return block_id
            self.counters.stored += 1
            self.tier_counters[placed].bytes_written += meta.nbytes
            self.put_latency.record(time.perf_counter() - started)
            self._maybe_write_stats()
            return block_id

    def _settled_without_storing(self, bkey: BlockKey, parts: list[Any], *, cluster: bool = True) -> bool:
        """Under the lock, before a put stores: settle it as a dedup (counted) when
        ``bkey`` is cached here (or, with ``cluster``, published by another rank). Drops
        an expired copy (or an unconfirmed one with other bytes) first."""
        now = time.monotonic()
        meta = self._meta.get(bkey)
        if meta is not None and not self._expired(meta, now) and self._confirmed(meta, parts):
            meta.shares += 1
            self.policy.touched(meta, now)
            self.counters.deduped += 1
            return True
        if meta is not None and self._peers.withdraw(meta, leaf_only=False):
            self._drop(meta)
        elif meta is not None:  # expired but pinned by another rank: keep serving it
            self.counters.deduped += 1
            return True
        if cluster and self._peers.held_elsewhere(bkey):
            self.counters.deduped += 1
            self.counters.cluster_deduped += 1
            return True
        return False

    @property
    def cluster(self):
        """The :class:`~cascade.distributed.cluster.Cluster` of a multi-rank store (its
        directory, peers' readers), None for a local one."""
        return self._peers.cluster

    def _hash_and_copy(self, parts: list[Any], namespace: str) -> tuple[_Slot | None, str]:
        """The content digest of a block, and (for blocks big enough) its bytes copied
        into fresh room of the fastest tier while another thread hashes (BLAKE3 and
        SHA-256 release the GIL): the put costs max(copy, hash), not the sum. The room
        returned is counted in flight."""
        if self.spec.block_bytes < _OVERLAP_MIN_BYTES or not isinstance(self.tiers[0], SlabTier):
            return None, compute_block_id(*parts, algo=self.config.hash_algo)
        pending = self._hash_pool().submit(compute_block_id, *parts, algo=self.config.hash_algo)
        slot = None
        try:
            with self._lock:
                self._check_open()
                slot = self._reserve_in(0, None, None, self.spec.block_bytes, parts_namespace=namespace)
                self._inflight += 1
            slot.fill(parts)
        except TierFull:  # the fastest tier is full of pinned blocks: the put reserves elsewhere
            if slot is not None:
                self._give_back(slot, inflight=True)
            slot = None
        except BaseException:
            if slot is not None:
                self._give_back(slot, inflight=True)
            pending.result()
            raise
        return slot, pending.result()  # the slot stays counted in flight until committed

    def _hash_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._hasher is None:
                self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cascade-hash")
            return self._hasher

    def _room_for_put(self, bkey: BlockKey, parent: str | None) -> _Slot:
        """Claim room for a new block, counted in flight. Demotions that make room copy
        outside the lock, one at a time, between short locked steps. (A put of the same
        id by another thread meanwhile is found at commit.)"""
        failed: dict[BlockKey, set[int]] = {}  # victims' tiers a move into failed: skipped next time
        set_aside: list[BlockMeta] = []  # victims another rank keeps in place
        try:
            while True:
                with self._lock:
                    self._check_open()
                    step = self._reserve(bkey, parent, failed)
                    self._inflight += isinstance(step, _Slot)  # a _Move counted itself
                if isinstance(step, _Slot):
                    return step
                try:
                    self._run_move(step)
                except _MoveFailed:
                    failed.setdefault(step.meta.key, set()).add(step.dst.tier)
                except _Busy:
                    with self._lock:
                        self.policy.set_aside(step.meta)
                    set_aside.append(step.meta)
        finally:
            if set_aside:
                with self._lock:
                    for meta in set_aside:
                        if self._meta.get(meta.key) is meta:
                            self.policy.changed(meta)

    def _reserve(self, bkey: BlockKey, parent: str | None, failed: dict[BlockKey, set[int]]) -> _Slot | _Move:
        """Under the lock: room for a new block in the fastest tier that can make it (one
        full of pinned blocks is passed over), or the next demotion to run first.
        :class:`TierFull` (counted as a rejected put) when no tier can."""
        nbytes = self.spec.block_bytes
        reasons = []
        for t, tier in enumerate(self.tiers):
            if tier.capacity < nbytes:
                reasons.append(f"{tier.name}: the block exceeds its capacity of {tier.capacity}")
                continue
            try:
                move = self._make_room(t, nbytes, bkey[0], defer=True, failed=failed)
                return move or _Slot(tier, t, tier.reserve(bkey, nbytes, parent=parent))
            except OSError as exc:  # TierFull included (ENOSPC and friends too)
                self.tier_counters[t].full_events += 1
                reasons.append(str(exc))
        self.counters.rejected += 1
        raise TierFull(f"no tier can take a block of {nbytes} bytes: {'; '.join(reasons)}")

    def _reserve_in(self, t: int, bkey: BlockKey | None, parent: str | None, nbytes: int, *,
                    parts_namespace: str | None = None) -> _Slot:
        """Make room in tier ``t`` and claim it (under the lock; demotions included)."""
        self._make_room(t, nbytes, bkey[0] if bkey is not None else parts_namespace)
        return _Slot(self.tiers[t], t, self.tiers[t].reserve(bkey, nbytes, parent=parent))

    def _give_back(self, slot: _Slot | None, *, inflight: bool = False) -> None:
        """Free the room of a put that will not be committed."""
        if slot is None and not inflight:
            return
        with self._lock:
            if slot is not None:
                slot.discard()
            if inflight:
                self._end_inflight()

    def put_many(
        self,
        pairs: Iterable[tuple[Any, Any]],
        *,
        namespace: str = DEFAULT_NAMESPACE,
        chain: bool = False,
        parent: str | None = None,
        block_ids: Sequence[str] | None = None,
        max_workers: int | None = None,
    ) -> list[str]:
        """Put each (key, value), up to ``max_workers`` (default ``config.io_threads``)
        at once; returns the ids in order. ``block_ids`` gives each block's id (no
        hashing); without it the ids are content digests. With ``chain=True`` each
        block's parent is the one before it (the first one's is ``parent``). Each put is
        its own operation: when one fails, the others still complete and the first error
        is raised. Local."""
        pairs = list(pairs)
        if block_ids is not None:
            block_ids = [check_id(b) for b in block_ids]
            if len(block_ids) != len(pairs):
                raise InvalidBlock(f"put_many: {len(pairs)} blocks but {len(block_ids)} block_ids")
        elif chain:  # parents must be known up front: hash first, in parallel
            for key, value in pairs:
                self._check_pair(key, value)
            block_ids = self._parallel(lambda kv: compute_block_id(*kv, algo=self.config.hash_algo), pairs,
                                       max_workers)
        ids = block_ids if block_ids is not None else [None] * len(pairs)
        parents = ([parent] + list(ids[:-1])) if chain else [None] * len(pairs)

        def put_one(i: int) -> str:
            return self.put(*pairs[i], namespace=namespace, parent=parents[i], block_id=ids[i])

        return self._parallel(put_one, range(len(pairs)), max_workers)

    def _parallel(self, fn, items: Iterable[Any], max_workers: int | None) -> list[Any]:
        """``[fn(x) for x in items]`` on up to ``max_workers`` threads (items are taken in
        order, so file reads stay a near-sequential stream); the first error is raised
        after every item finished."""
        self._check_open()
        items = list(items)
        workers = min(max_workers or self.config.io_threads, len(items))
        results: list[Any] = [None] * len(items)
        errors: list[BaseException] = []
        order = iter(range(len(items)))  # next() on a range iterator is atomic under the GIL

        def drain() -> None:
            for i in order:
                try:
                    results[i] = fn(items[i])
                except BaseException as exc:  # raised in the caller's thread below
                    errors.append(exc)

        if workers <= 1:
            drain()
        else:
            pool = self._io_pool(workers)
            for fut in [pool.submit(drain) for _ in range(workers)]:
                fut.result()
        if errors:
            raise errors[0]
        return results

    def _io_pool(self, workers: int) -> ThreadPoolExecutor:
        with self._lock:
            self._check_open()  # a closed store starts no pool (close shut the last one down)
            if self._io is None or self._io_workers < workers:
                if self._io is not None:
                    self._io.shutdown(wait=False)
                self._io_workers = max(workers, self.config.io_threads)
                self._io = ThreadPoolExecutor(max_workers=self._io_workers, thread_name_prefix="cascade-io")
            return self._io

    # -- eviction ---------------------------------------------------------------------------
    def _make_room(self, t: int, nbytes: int, namespace: str | None = None, *,
                   defer: bool = False, failed: dict[BlockKey, set[int]] | None = None) -> _Move | None:
        """Evict from tier ``t`` until ``nbytes`` (of ``namespace``) fit. With a
        namespace share, a namespace that would go over its share of the tier first
        moves its own blocks down. Raises :class:`TierFull`.

        With ``defer``, the first demotion that needs a copy is started and returned
        instead of done (the caller copies outside the lock, see :meth:`_run_move`, and
        asks again); ``failed`` names the tiers each block's earlier moves failed into
        (skipped now)."""
        tier = self.tiers[t]
        if nbytes > tier.capacity:
            self.tier_counters[t].full_events += 1
            raise TierFull(f"{tier.name}: a block of {nbytes} bytes exceeds its capacity of {tier.capacity}")
        if namespace is not None and self.config.namespace_share > 0:
            self._keep_share(t, nbytes, namespace)
        set_aside: list[BlockMeta] = []
        try:
            while not tier.fits(nbytes):
                victim = self.policy.victim(t)
                if victim is None:
                    self.tier_counters[t].full_events += 1
                    raise TierFull(f"{tier.name}: full and every block in it is pinned or holds cached children")
                try:
                    if not defer:
                        self._demote(victim)
                    elif (move := self._start_demotion(victim, skip=(failed or {}).get(victim.key, set()))) is not None:
                        return move
                except _Busy:  # another rank pins it (or caches its child): not now
                    self.policy.set_aside(victim)
                    set_aside.append(victim)
        finally:
            for meta in set_aside:
                if meta.key in self._meta:
                    self.policy.changed(meta)
        return None

    def _keep_share(self, t: int, nbytes: int, namespace: str) -> None:
        """Move ``namespace``'s own blocks out of tier ``t`` until ``nbytes`` more stay
        within its share; :class:`TierFull` when its movable blocks do not suffice.
        Costs O(log n) per victim (the policy keeps each namespace's victim order)."""
        share = self.config.namespace_share * self.tiers[t].capacity
        set_aside: list[BlockMeta] = []
        try:
            while self._ns_bytes[t].get(namespace, 0) + nbytes > share:
                victim = self.policy.victim_in(t, namespace)
                if victim is None:
                    self.tier_counters[t].full_events += 1
                    raise TierFull(f"{self.tiers[t].name}: namespace {namespace!r} is at its share "
                                   f"({self.config.namespace_share:g} of the tier) and none of its blocks there can move")
                try:
                    self._demote(victim)
                except _Busy:  # another rank pins it: not now
                    self.policy.set_aside(victim)
                    set_aside.append(victim)
        finally:
            for meta in set_aside:
                if meta.key in self._meta:
                    self.policy.changed(meta)

    def _demote(self, meta: BlockMeta) -> None:
        """Move ``meta`` to the next slower tier that takes it, or drop it when none
        does (under the lock). Failure-atomic: the block stays where it is until a
        slower tier holds it. :class:`_Busy` when another rank keeps it in place."""
        skip: set[int] = set()
        while (move := self._start_demotion(meta, skip=skip)) is not None:
            try:
                self._run_move(move)
                return
            except _MoveFailed:
                skip.add(move.dst.tier)

    def _start_demotion(self, meta: BlockMeta, *, skip: set[int] = frozenset()) -> _Move | None:
        """Under the lock: claim room for ``meta`` in the next slower tier that takes it
        (one without room or capacity, or in ``skip``, is passed over) and lease its
        bytes, or, when none does, drop it now (None). :class:`_Busy` when another rank
        pins it or caches a child of it."""
        t = meta.tier
        for lower in range(t + 1, len(self.tiers)):
            if lower in skip or self.tiers[lower].capacity < meta.nbytes:
                continue
            try:
                self._make_room(lower, meta.nbytes, meta.key[0])
                return self._begin_move(meta, lower)
            except (TierFull, OSError) as exc:
                log.debug("demotion of %s to %s failed (%s)", meta.key[1], self.tiers[lower].name, exc)
        if not self._peers.withdraw(meta, leaf_only=True):
            raise _Busy(meta.key)
        self.tier_counters[t].evictions += 1
        self.policy.evicted(meta)
        self._drop(meta)
        return None

    def _begin_move(self, meta: BlockMeta, lower: int) -> _Move:
        """Under the lock: claim room for ``meta`` in tier ``lower`` (:class:`TierFull`
        if none) and lease its current bytes."""
        src = self.tiers[meta.tier]
        lease = src.lease(meta.key)
        try:
            handle = self.tiers[lower].reserve(meta.key, meta.nbytes, parent=meta.parent)
        except BaseException:
            src.release(lease)
            raise
        meta.readers += 1  # stays where it is, unchosen, until the move ends
        self._inflight += 1
        return _Move(meta, meta.tier, lease, _Slot(self.tiers[lower], lower, handle))

    def _run_move(self, move: _Move) -> None:
        """Copy a started demotion's block down (outside the lock when the caller holds
        none), then, under the lock, point the directory at the new copy and free the old
        one. A failed copy leaves the block where it was and raises :class:`_MoveFailed`;
        :class:`_Busy` when another rank pinned it meanwhile."""
        meta, src = move.meta, move.src
        buf = np.empty(meta.nbytes, dtype=np.uint8)
        # a non-concurrent tier (REMOTE: MPI calls) is read under the lock
        with nullcontext() if self.tiers[src].concurrent else self._lock:
            error = self._copy_out(self.tiers[src], move.lease, [buf])
        if error is None:
            try:
                move.dst.fill([buf])
            except OSError as exc:  # TierFull included: ENOSPC and friends
                error = exc
        with self._lock:
            self._end_inflight()
            tier = self.tiers[src]
            here = self._meta.get(meta.key) is meta and meta.tier == src and tier.current(meta.key, move.lease)
            tier.release(move.lease)
            meta.readers -= 1
            if error is None and here:
                try:
                    move.dst.commit(meta.key)  # a non-concurrent tier (REMOTE) copies only now
                except OSError as exc:  # TierFull included
                    error = exc
                else:
                    self._move_published(meta, src, move.dst.tier)
                    self.tier_counters[src].demotions += 1
                    self.tier_counters[move.dst.tier].bytes_written += meta.nbytes
                    return
            move.dst.discard()  # failed, or the block was deleted or replaced meanwhile
            if here:
                self.policy.changed(meta)
            if isinstance(error, CorruptBlock):
                log.warning("%s", error)
                self.tier_counters[src].corruptions += 1
                if here:
                    self._drop_corrupt(meta)
            elif error is not None:
                self.tier_counters[move.dst.tier].full_events += 1
                if here:
                    raise _MoveFailed(meta.key) from error

    def _move_published(self, meta: BlockMeta, src: int, dst: int) -> None:
        """The block now sits in ``src`` and ``dst``: repoint the directory, then free
        ``src``. If another rank pins it, undo the copy and raise :class:`_Busy`."""
        if not self._peers.republish(meta, dst):
            del self.tiers[dst][meta.key]
            raise _Busy(meta.key)
        del self.tiers[src][meta.key]
        self._set_tier(meta, dst)

    def _admit(self, meta: BlockMeta, now: float) -> None:
        """Enter a new block in the metadata and the policy, with the children of it that
        are already cached (they outlive a deleted or expired head)."""
        meta.child_tiers = self._kids.setdefault(meta.key, [0] * len(self.tiers))
        self._meta[meta.key] = meta
        self._ns_add(meta, meta.tier, meta.nbytes)
        self.policy.admitted(meta, now)
        self._link_child(meta)

    def _ns_add(self, meta: BlockMeta, tier: int, nbytes: int) -> None:
        used = self._ns_bytes[tier]
        used[meta.key[0]] = used.get(meta.key[0], 0) + nbytes
        if not used[meta.key[0]]:
            del used[meta.key[0]]

    def _count_child(self, meta: BlockMeta, tier: int, delta: int) -> None:
        """Count ``meta`` in or out of its parent's children in ``tier`` (the count is
        kept even while the parent is not cached)."""
        if meta.parent is None:
            return
        pkey = (meta.key[0], meta.parent)
        counts = self._kids.setdefault(pkey, [0] * len(self.tiers))
        counts[tier] += delta
        parent = self._meta.get(pkey)
        if parent is not None:
            self.policy.changed(parent)
        elif not any(counts):
            del self._kids[pkey]

    def _set_tier(self, meta: BlockMeta, tier: int) -> None:
        old = meta.tier
        self._count_child(meta, old, -1)
        self._count_child(meta, tier, +1)
        self._ns_add(meta, old, -meta.nbytes)
        self._ns_add(meta, tier, meta.nbytes)
        meta.tier = tier
        self.policy.moved(meta, old)

    def _drop(self, meta: BlockMeta) -> None:
        """Remove a block from its tier and from the metadata."""
        tier = self.tiers[meta.tier]
        if meta.key in tier:
            del tier[meta.key]
        self._forget(meta)

    def _forget(self, meta: BlockMeta) -> None:
        if meta.hints:
            self._hinted_bytes -= meta.nbytes
            meta.hints = 0
        if self._meta.pop(meta.key, None) is not None:
            self._ns_add(meta, meta.tier, -meta.nbytes)
        self.policy.removed(meta)
        if not any(self._kids.get(meta.key, ())):
            self._kids.pop(meta.key, None)
        self._count_child(meta, meta.tier, -1)

    def _link_child(self, meta: BlockMeta) -> None:
        self._count_child(meta, meta.tier, +1)

    def _expired(self, meta: BlockMeta, now: float) -> bool:
        return meta.pins == 0 and now > self.policy.expires_at(meta)

    # -- get ------------------------------------------------------------------------------
    def get(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> tuple[Any, Any] | None:
        """(key, value) arrays of a cached block, or None on a miss. Local.

        A block whose stored bytes fail verification is dropped, counted as a corruption
        and reported as a miss (None): corrupted data is never returned.
        """
        key_out, value_out = self.spec.empty()
        return (key_out, value_out) if self._read(block_id, namespace, [key_out, value_out]) else None

    def get_into(self, block_id: str, key_out: Any, value_out: Any, *, namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Read a block straight into ``key_out`` and ``value_out`` (arrays of the store's
        spec, no extra copy). True on a hit; False on a miss (outputs then hold no valid
        data). Local; the copy runs outside the store's lock."""
        self._check_outs(key_out, value_out)
        return self._read(block_id, namespace, [key_out, value_out])

    def _check_outs(self, key_out: Any, value_out: Any) -> None:
        self.spec.check(key_out, "key_out", writable=True)
        self.spec.check(value_out, "value_out", writable=True)

    def get_many(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE,
                 max_workers: int | None = None) -> list[tuple[Any, Any] | None]:
        """``get`` of each id, in order, up to ``max_workers`` (default
        ``config.io_threads``) reads in flight. Local."""
        return self._parallel(lambda b: self.get(b, namespace=namespace), list(block_ids), max_workers)

    def get_many_into(self, block_ids: Sequence[str], outs: Sequence[tuple[Any, Any]], *,
                      namespace: str = DEFAULT_NAMESPACE, max_workers: int | None = None) -> list[bool]:
        """``get_into`` of each id into the matching ``(key_out, value_out)`` of ``outs``,
        up to ``max_workers`` (default ``config.io_threads``) reads in flight. Local."""
        block_ids, outs = list(block_ids), list(outs)
        if len(block_ids) != len(outs):
            raise InvalidBlock(f"get_many_into: {len(block_ids)} ids but {len(outs)} output pairs")
        for key_out, value_out in outs:  # all checked before anything is read
            self._check_outs(key_out, value_out)
        return self._parallel(lambda i: self._read(block_ids[i], namespace, list(outs[i])),
                              range(len(block_ids)), max_workers)

    def _read(self, block_id: str, namespace: str, outs: list[Any]) -> bool:
        """A get: metadata under the lock, the copy outside it (the block's tier lease and
        reader count keep its bytes in place meanwhile), bookkeeping under the lock."""
        bkey = self._key(block_id, namespace)
        self._async.wait_for_puts([bkey])  # a get after a put_async of this id sees it
        started = time.perf_counter()
        with self._lock:
            self._check_open()
            self.counters.gets += 1
            meta = self._meta.get(bkey)
            if meta is not None and self._expired(meta, time.monotonic()) and self._peers.withdraw(meta, leaf_only=False):
                self.counters.expired += 1
                self._drop(meta)
                meta = None
            self._inflight += 1
            if meta is not None:
                t, tier = meta.tier, self.tiers[meta.tier]
                lease = tier.lease(bkey)
                meta.readers += 1
                if not tier.concurrent:  # e.g. REMOTE (MPI): its copy stays under the lock
                    error = self._copy_out(tier, lease, outs)
        if meta is None:
            return self._read_from_cluster(bkey, outs, started)
        if tier.concurrent:
            error = self._copy_out(tier, lease, outs)
        with self._lock:
            self._end_inflight()
            hit, promotion = self._finish_read(meta, t, lease, error, started)
        if promotion is not None:
            self._promote_filled(meta, *promotion, outs)
        return hit

    @staticmethod
    def _copy_out(tier: Tier, lease: Any, outs: list[Any]) -> CorruptBlock | None:
        """The leased block's bytes into ``outs``; a verification failure is returned.
        Slab tiers copy into any buffer; the others (file reads, MPI) fill host memory,
        so device outputs get host stand-ins (see :func:`cascade.buffers.host_outputs`)."""
        try:
            if isinstance(tier, SlabTier):
                tier.read_leased(lease, outs)
            else:
                with host_outputs(outs) as hosts:
                    tier.read_leased(lease, hosts)
        except CorruptBlock as exc:
            return exc
        return None

    def _finish_read(self, meta: BlockMeta, t: int, lease: Any, error: CorruptBlock | None,
                     started: float) -> tuple[bool, tuple[int, _Slot] | None]:
        """Under the lock, after a local copy: release the lease, then count the hit (and
        use up a hint) or drop a corrupt block (if still the one read). Returns whether
        it was a hit, and (the tier it is in now, room claimed in the fastest tier) to
        promote it. (A block being demoted may be read: it may sit lower by now.)"""
        tier = self.tiers[t]
        cached = self._meta.get(meta.key) is meta and meta.tier == t and tier.current(meta.key, lease)
        tier.release(lease)
        meta.readers -= 1
        if error is not None:
            log.warning("%s", error)
            self.tier_counters[t].corruptions += 1
            if cached:
                self._drop_corrupt(meta)
            return self._miss(len(self.tiers)), None
        self.counters.hits += 1
        counters = self.tier_counters[t]
        counters.hits += 1
        counters.bytes_read += meta.nbytes
        self.get_latency[t].record(time.perf_counter() - started)
        for faster in self.tier_counters[:t]:
            faster.misses += 1
        promotion = None
        if self._meta.get(meta.key) is meta:  # not deleted or replaced while we copied
            if meta.hints:  # the queued request it was hinted for has come
                self._release_hint(meta)
            self.policy.touched(meta, time.monotonic())
            if meta.ttl and self.config.ttl_mode == "last_use":  # the read moved its expiry
                self._persist_ttl(meta, batched=True)
            if meta.tier > 0 and self.config.promote_on_hit:
                slot = self._claim_promotion(meta)
                promotion = None if slot is None else (meta.tier, slot)
        self._maybe_write_stats()
        return True, promotion

    def _read_from_cluster(self, bkey: BlockKey, outs: list[Any], started: float) -> bool:
        """A local miss: read the block from whichever rank published it. Runs outside
        the store's lock (the multi-rank layer serialises its own calls); the caller
        counted it in flight."""
        try:
            entry, error = self._peers.read(bkey, outs), None
        except CorruptBlock as exc:
            entry, error = None, exc
        with self._lock:
            self._end_inflight()
            if error is not None:
                log.warning("%s", error)
                self.counters.cluster_corruptions += 1
            if entry is None:
                return self._miss(len(self.tiers))
            self.counters.hits += 1
            self.counters.cluster_hits += 1
            self.cluster_latency.record(time.perf_counter() - started)
            for counters in self.tier_counters:  # no local tier had it
                counters.misses += 1
            copy = None
            if self.config.cache_cluster_reads and entry.rank != self.rank and not self._closing:
                copy = self._claim_room(bkey, None)
        if copy is not None:
            self._keep_private_copy(bkey, copy, outs)
        return True

    def _claim_room(self, bkey: BlockKey, parent: str | None) -> _Slot | None:
        """Under the lock: room in the fastest tier for a best-effort copy (promotion,
        private copy), counted in flight; None when no room can be made."""
        try:
            slot = self._reserve_in(0, bkey, parent, self.spec.block_bytes)
        except (TierFull, OSError) as exc:
            log.debug("no room in %s for %s: %s", self.tiers[0].name, bkey[1], exc)
            return None
        self._inflight += 1
        return slot

    def _fill_claimed(self, slot: _Slot, data: list[Any]) -> bool:
        """Copy ``data`` into claimed room, outside the lock; False on an I/O error."""
        try:
            slot.fill(data)
        except OSError as exc:
            log.debug("copy into %s failed: %s", slot.tier_obj.name, exc)
            return False
        return True

    def _keep_private_copy(self, bkey: BlockKey, slot: _Slot, data: list[Any]) -> None:
        """Keep a block just read from another rank in the fastest tier, unpublished, so
        the next reads of a hot block stay local and its holder serves each rank once.
        The copy is never shared and may outlive the holder's copy (the same bytes:
        ids name content). Best effort: given up when another put stored it meanwhile."""
        filled = self._fill_claimed(slot, data)
        with self._lock:
            if not filled or bkey in self._meta:
                slot.discard()
            else:
                slot.commit(bkey)
                self._admit(BlockMeta(bkey, self.spec.block_bytes, 0, ttl=self.config.default_ttl), time.monotonic())
            self._end_inflight()

    def _drop_corrupt(self, meta: BlockMeta) -> None:
        """Drop a block whose bytes failed verification: withdraw first; while another
        rank pins it, the bytes stay allocated (its reads verify the checksum) and a
        later read retries."""
        if self._peers.withdraw(meta, leaf_only=False):
            self._drop(meta)

    def _miss(self, served_by: int) -> bool:
        self.counters.misses += 1
        for counters in self.tier_counters[:served_by]:
            counters.misses += 1
        return False

    def _claim_promotion(self, meta: BlockMeta) -> _Slot | None:
        """Under the lock: room in the fastest tier to move ``meta`` up into, if it can be
        made without dropping pinned or parent blocks (best effort). Until the promotion
        ends, the block counts as being read (it stays where it is)."""
        meta.readers += 1  # not chosen as a victim while making room, nor moved meanwhile
        slot = None
        try:
            slot = self._claim_room(meta.key, meta.parent)
        finally:
            if slot is None:
                meta.readers -= 1
                self.policy.changed(meta)
        return slot

    def _promote_filled(self, meta: BlockMeta, src: int, slot: _Slot, data: list[Any]) -> None:
        """Copy ``data`` (the block's bytes) into claimed room outside the lock, then
        move the block there: the copy in tier ``src`` goes once the directory points up."""
        filled = self._fill_claimed(slot, data)
        with self._lock:
            self._end_inflight()
            meta.readers -= 1
            if not filled or self._meta.get(meta.key) is not meta or meta.tier != src:
                slot.discard()  # deleted, replaced or promoted by another reader meanwhile
                if self._meta.get(meta.key) is meta:
                    self.policy.changed(meta)
                return
            slot.commit(meta.key)
            self.policy.changed(meta)
            try:
                self._move_published(meta, src, 0)
            except _Busy:
                return
            self.tier_counters[src].promotions += 1
            self.tier_counters[0].bytes_written += meta.nbytes

    # -- scheduler hints --------------------------------------------------------------------
    # -- non-blocking calls (ordering and buffer rules: cascade/async_ops.py) ----------------
    def put_async(self, key: Any, value: Any, *, parent: str | None = None, namespace: str = DEFAULT_NAMESPACE,
                  block_id: str | None = None, verify: bool = False, ttl: float | None = None,
                  priority: int = 0) -> Future:
        """:meth:`put` without waiting: returns a future of the block's id at once. Bad
        input raises here; TierFull and other errors of the put come from
        ``future.result()``. ``key`` and ``value`` must stay unchanged until it is done."""
        self._check_pair(key, value)
        self._check_put_options(namespace, parent, priority, ttl)
        puts = [self._key(block_id, namespace)] if block_id is not None else []
        return self._async.submit(lambda: self.put(key, value, parent=parent, namespace=namespace, block_id=block_id,
                                                   verify=verify, ttl=ttl, priority=priority), puts=puts)

    def put_many_async(self, pairs: Iterable[tuple[Any, Any]], *, block_ids: Sequence[str] | None = None,
                       **options: Any) -> Future:
        """:meth:`put_many` without waiting: a future of the list of ids. Pairs are
        checked here; they must stay unchanged until the future is done."""
        pairs = list(pairs)
        for key, value in pairs:
            self._check_pair(key, value)
        if block_ids is not None and len(block_ids) != len(pairs):
            raise InvalidBlock(f"put_many_async: {len(pairs)} pairs but {len(block_ids)} block_ids")
        namespace = options.get("namespace", DEFAULT_NAMESPACE)
        puts = [self._key(b, namespace) for b in block_ids] if block_ids is not None else []
        return self._async.submit(lambda: self.put_many(pairs, block_ids=block_ids, **options), puts=puts)

    def get_into_async(self, block_id: str, key_out: Any, value_out: Any, *,
                       namespace: str = DEFAULT_NAMESPACE) -> Future:
        """:meth:`get_into` without waiting: a future of True (hit) or False (miss). The
        outputs hold the block only once the future is done with True."""
        self._check_outs(key_out, value_out)
        bkey = self._key(block_id, namespace)
        return self._async.submit(lambda: self.get_into(block_id, key_out, value_out, namespace=namespace),
                                  after=[bkey])

    def get_many_into_async(self, block_ids: Sequence[str], outs: Sequence[tuple[Any, Any]], *,
                            namespace: str = DEFAULT_NAMESPACE, max_workers: int | None = None) -> Future:
        """:meth:`get_many_into` without waiting: a future of the list of hits."""
        block_ids, outs = list(block_ids), list(outs)
        if len(block_ids) != len(outs):
            raise InvalidBlock(f"get_many_into_async: {len(block_ids)} ids but {len(outs)} output pairs")
        for key_out, value_out in outs:
            self._check_outs(key_out, value_out)
        keys = [self._key(b, namespace) for b in block_ids]
        return self._async.submit(
            lambda: self.get_many_into(block_ids, outs, namespace=namespace, max_workers=max_workers), after=keys)

    def put_pending(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Whether a ``put_async`` of this id has not finished yet. Local."""
        return self._async.pending(self._key(block_id, namespace))

    def hint(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE,
             position: float | None = None) -> int:
        """Blocks a queued request will read soon: move each cached one up to the
        fastest tier (best effort) and evict it only after every unhinted block, until a
        :meth:`get` / :meth:`get_into` of it (one get uses up its soonest hint) or
        :meth:`unhint`. Hints count: a block hinted for two queued requests stays hinted
        until both read it. ``position`` is the request's place in the queue (e.g. its
        arrival number; default: after every earlier hint): among hinted blocks the one
        whose next hinted use comes last goes first.

        Hinted blocks hold at most ``config.hint_fraction`` of the fastest tier's bytes:
        a hint that would go past the cap, and a hint of a block not cached on this
        rank, is ignored. Returns how many hints were taken. :class:`ConfigError` for a
        position that is not a finite number. Local (other ranks' blocks are not
        hinted); thread-safe.
        """
        keys = [self._key(b, namespace) for b in block_ids]
        cap = self.config.hint_fraction * self.tiers[0].capacity
        taken = 0
        with self._lock:
            at = self.policy.hint_position(position)
            for bkey in keys:
                meta = self._meta.get(bkey)
                if meta is None:
                    continue
                if meta.hints == 0:
                    if self._hinted_bytes + meta.nbytes > cap:
                        continue
                    self._hinted_bytes += meta.nbytes
                meta.hints += 1
                taken += 1
                self.policy.hinted(meta, at)
                if meta.tier > 0:
                    self._promote_cached(meta)
            self.counters.hints += taken
        return taken

    def unhint(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE,
               position: float | None = None) -> int:
        """Withdraw one hint of each id (its request left the queue unserved): the one
        given at ``position``, else the soonest; ids without a hint are skipped. Returns
        how many hints were withdrawn. Local."""
        keys = [self._key(b, namespace) for b in block_ids]
        withdrawn = 0
        with self._lock:
            for bkey in keys:
                meta = self._meta.get(bkey)
                if meta is not None and meta.hints:
                    self._release_hint(meta, position)
                    withdrawn += 1
        return withdrawn

    def _release_hint(self, meta: BlockMeta, position: float | None = None) -> None:
        meta.hints -= 1
        if meta.hints == 0:
            self._hinted_bytes -= meta.nbytes
        self.policy.hint_released(meta, position)

    def _promote_cached(self, meta: BlockMeta) -> None:
        """Read a block from its slower tier and promote it (for a hint). Best effort:
        a corrupt record is dropped, as on a get."""
        buf = np.empty(meta.nbytes, dtype=np.uint8)
        try:
            self.tiers[meta.tier].read_into(meta.key, buf)
        except CorruptBlock as exc:
            log.warning("%s", exc)
            self.tier_counters[meta.tier].corruptions += 1
            self._drop_corrupt(meta)
            return
        slot = self._claim_promotion(meta)  # under the lock throughout: hints are scheduler-side
        if slot is not None:
            self._promote_filled(meta, meta.tier, slot, [buf])

    # -- other operations -------------------------------------------------------------------
    def contains(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Whether a block is cached (not expired) in ``namespace``. Local; counts nothing."""
        return self.contains_many([block_id], namespace=namespace)[0]

    def contains_many(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE) -> list[bool]:
        """``contains`` of each id; ids not cached here are looked up in the cluster
        directory in one batch (multi-rank runs)."""
        keys = [self._key(b, namespace) for b in block_ids]
        self._async.wait_for_puts(keys)  # a lookup after a put_async of an id sees it
        with self._lock:
            now = time.monotonic()
            found = [(m := self._meta.get(k)) is not None and not self._expired(m, now) for k in keys]
            rest = [i for i, hit in enumerate(found) if not hit]
            if rest:
                for i, there in zip(rest, self._peers.found_elsewhere([keys[i] for i in rest])):
                    found[i] = there
            return found

    def longest_prefix(self, block_ids: Sequence[str] | None = None, *, tokens: Any = None,
                       model_fingerprint: Any = None, namespace: str = DEFAULT_NAMESPACE) -> int:
        """How many leading blocks of a chain are cached (cluster-wide in multi-rank
        runs): of ``block_ids``, or of the token-prefix ids of ``tokens`` (token ids,
        blocks of ``config.block_tokens``, :func:`cascade.prefix_ids` with
        ``model_fingerprint``). Cached tokens = the result x ``config.block_tokens``.
        Local; one batched directory lookup."""
        if (block_ids is None) == (tokens is None):
            raise InvalidBlock("longest_prefix: pass either block_ids or tokens (with model_fingerprint)")
        if tokens is not None:
            from .prefix import prefix_ids

            block_ids = prefix_ids(tokens, block_tokens=self.config.block_tokens, model_fingerprint=model_fingerprint)
        found = self.contains_many(block_ids, namespace=namespace)
        return found.index(False) if False in found else len(found)

    def delete(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Remove a block. :class:`BlockNotFound` if absent, :class:`BlockPinned` if pinned."""
        with self._lock:
            meta = self._require(block_id, namespace)
            if meta.pins or not self._peers.withdraw(meta, leaf_only=False):
                raise BlockPinned(f"block {block_id} is pinned by an in-flight request; unpin it first")
            self._drop(meta)
            self.counters.deletes += 1

    def flush(self) -> None:
        """Wait for every non-blocking call submitted before it, then make every
        completed put durable in the persistent tiers (fsync). Local."""
        self._check_open()
        self._async.wait_all()
        with self._lock:
            for tier in self.tiers:
                tier.sync()

    def clear(self, *, namespace: str | None = None) -> int:
        """Drop every unpinned block (of ``namespace``, or of all); returns how many went.
        Local: in multi-rank runs only this rank's blocks (other ranks' pins are kept)."""
        self._check_open()
        with self._lock:
            dropped = 0
            for meta in list(self._meta.values()):
                if namespace not in (None, meta.key[0]) or meta.pins:
                    continue
                if self._peers.withdraw(meta, leaf_only=False):
                    self._drop(meta)
                    dropped += 1
            self.counters.deletes += dropped
            return dropped

    def pin(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Add a reference from an in-flight request: the block cannot be evicted or
        expire until the matching :meth:`unpin`."""
        with self._lock:
            bkey = self._key(block_id, namespace)
            meta = self._meta.get(bkey)
            self._peers.pin(bkey, meta)  # cluster-wide: the holder cannot move or drop it
            if meta is not None:
                meta.pins += 1
                self.policy.changed(meta)

    def unpin(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Drop one reference taken by :meth:`pin`."""
        with self._lock:
            bkey = self._key(block_id, namespace)
            if self._peers.release_foreign_pin(bkey):  # a pin taken on another rank's copy
                return
            meta = self._meta.get(bkey)
            if meta is None or meta.pins == 0:
                raise self._peers.not_pinned(bkey, meta)
            meta.pins -= 1
            self._peers.unpinned(meta)
            self.policy.changed(meta)

    def set_ttl(self, block_id: str, ttl: float, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Give a block a time to live in seconds (0 = none), counted per ``ttl_mode``."""
        ttl = check_ttl(ttl)
        with self._lock:
            meta = self._require(block_id, namespace)
            meta.ttl = ttl
            self.policy.changed(meta)
            self._persist_ttl(meta)

    def set_priority(self, block_id: str, priority: int, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Raise (or lower, negative) a block's value: each step doubles (halves) it."""
        priority = check_priority(priority)
        with self._lock:
            meta = self._require(block_id, namespace)
            meta.priority = priority
            self.policy.changed(meta)

    def _require(self, block_id: str, namespace: str) -> BlockMeta:
        bkey = self._key(block_id, namespace)
        meta = self._meta.get(bkey)
        if meta is None:
            raise BlockNotFound(f"no block {block_id} in namespace {namespace!r}")
        return meta

    def __len__(self) -> int:
        return len(self._meta)

    # -- TTLs on disk and blocks found there ------------------------------------------------
    def _wall_expiry(self, key: BlockKey) -> float:
        """Wall-clock expiry of a block for persistent tiers (0 = none). In-process TTLs
        run on the monotonic clock; on disk they must survive a restart."""
        meta = self._meta.get(key)
        if meta is None or meta.ttl <= 0:
            return 0.0
        return time.time() + (self.policy.expires_at(meta) - time.monotonic())

    def _persist_ttl(self, meta: BlockMeta, *, batched: bool = False) -> None:
        """Record ``meta``'s expiry in a persistent tier; ``batched`` (a read's refresh):
        written with others later, see :meth:`FileTier.set_expiry`."""
        set_expiry = getattr(self.tiers[meta.tier], "set_expiry", None)
        if set_expiry is not None:
            try:
                set_expiry(meta.key, self._wall_expiry(meta.key), batched=batched)
            except OSError as exc:  # the block still expires in this process
                log.warning("cannot record the TTL of %s: %s", meta.key[1], exc)

    def _confirmed(self, meta: BlockMeta, parts: list[Any]) -> bool:
        """Whether a put of ``parts`` may dedup onto ``meta``. A block found on disk at
        open is compared once with the first put of its id: different bytes (a stale or
        planted record) make the put replace it instead."""
        if meta.key not in self._unconfirmed:
            return True
        stored = np.empty(meta.nbytes, dtype=np.uint8)
        try:
            self.tiers[meta.tier].read_into(meta.key, stored)
        except (CorruptBlock, OSError):
            return False
        incoming = np.concatenate([host_bytes(p, "block part") for p in parts])
        if not np.array_equal(stored, incoming):
            self.counters.replaced_unconfirmed += 1
            return False
        self._unconfirmed.discard(meta.key)
        return True

    # -- reporting and shutdown ---------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters overall and per tier (blocks, bytes, hits, misses, evictions,
        promotions, demotions, corruptions, full events, plus tier facts)."""
        self._check_open()
        return self._stats()

    def _stats(self) -> dict[str, Any]:
        with self._lock:
            tiers = {}
            for tier, counters, hist in zip(self.tiers, self.tier_counters, self.get_latency):
                tiers[tier.name] = {**tier.stats(), "bytes": tier.used, **counters.as_dict(),
                                    "get_latency": hist.as_dict()}
            return {"rank": self.rank, "blocks": len(self._meta), **self.counters.as_dict(), "tiers": tiers,
                    "put_latency": self.put_latency.as_dict(), "cluster_get_latency": self.cluster_latency.as_dict(),
                    "policy": self.policy.kind, "hinted_bytes": self._hinted_bytes,
                    "block_bytes": self.spec.block_bytes}

    def _maybe_write_stats(self, force: bool = False) -> None:
        """Refresh ``stats_rank<r>.json`` in ``config.stats_dir`` (if set) every
        ``stats_interval`` seconds, so ``cascade stats`` can watch a running job."""
        if not self.config.stats_dir:
            return
        now = time.monotonic()
        if force or now - self._stats_written >= self.config.stats_interval:
            self._stats_written = now
            try:
                write_stats_file(self.config.stats_dir, self.rank, self._stats())
            except OSError as exc:
                log.warning("cannot write stats file in %s: %s", self.config.stats_dir, exc)

    def close(self, *, keep: bool = True) -> None:
        """Release every tier; file-tier data stays for a warm restart. Idempotent.

        With ``keep`` (default), blocks in the GPU and SHM tiers first move to the file
        tier, as far as it has room without evicting anything (the rest are lost, as are
        REMOTE-tier blocks, which live in other ranks' DRAM). Collective in multi-rank
        runs: SHM slabs and windows go only after every rank has entered ``close`` (so
        has stopped reading them), and a close that fails on one rank (e.g. its file tier's
        fsync) raises that error there and ``PeerStepFailed`` on the others, after every
        rank has released its tiers. Calls of other threads still moving data finish
        first, and so do the non-blocking calls submitted before it (at most
        :data:`ASYNC_CLOSE_SECONDS`; those not started by then are cancelled); later calls
        raise :class:`StoreClosed`."""
        unfinished = self._async.close(ASYNC_CLOSE_SECONDS)
        if unfinished:
            log.warning("close: %d non-blocking calls did not finish in %.0f s and were cancelled",
                        unfinished, ASYNC_CLOSE_SECONDS)
        with self._lock:
            if self._closing:
                return
            self._closing = True
            while self._inflight:
                self._idle.wait()
            error: BaseException | None = None
            try:
                if keep and self._meta:
                    self._keep_hot_blocks()
                elif self._meta:  # close(keep=False): nothing outside the file tier is kept
                    self.counters.lost_at_close += sum(not isinstance(self.tiers[m.tier], FileTier)
                                                       for m in self._meta.values())
                if self._meta or self.counters.puts or self.counters.gets:
                    self._maybe_write_stats(force=True)
            except BaseException as exc:  # still take part in the collective end below
                error = exc
            # first (collective): every rank learns whether every rank's close went well,
            # no rank reads our slab or windows after this, and the slab window maps the
            # SHM tier's slab
            peers, self._peers = self._peers, Solo()
            together = True
            try:
                peers.close(ok=error is None)
            except PeerStepFailed as exc:  # every rank took part: the windows are free
                error = error or exc
            except RankFailure:  # some rank never arrived: freeing MPI windows would hang
                together = False
                raise
            finally:
                self._release_tiers(collective=together)
                for pool in (self._hasher, self._io):
                    if pool is not None:
                        pool.shutdown(wait=False)
                self._hasher = self._io = None
            if error is not None:
                raise error

    def _keep_hot_blocks(self) -> None:
        """Demote every block outside the file tier (GPU, SHM, and REMOTE: those live in
        other ranks' DRAM, readable until every rank has entered close) to the file tier
        while it has room (no eviction); count the rest as lost."""
        slow = next((t for t, tier in enumerate(self.tiers) if isinstance(tier, FileTier)), None)
        kept = lost = 0
        for meta in sorted(self._meta.values(), key=lambda m: m.depth):  # heads first
            if meta.tier == slow:
                continue
            if slow is not None:
                try:
                    if not self.tiers[slow].fits(meta.nbytes):
                        raise TierFull("file tier full")
                    self._run_move(self._begin_move(meta, slow))
                except (_Busy, _MoveFailed, OSError):  # TierFull included; _Busy: pinned elsewhere
                    pass
            if meta.tier == slow and self._meta.get(meta.key) is meta:
                kept += 1
            else:
                lost += 1
        if kept:
            self.tiers[slow].sync()
        self.counters.kept_at_close += kept
        self.counters.lost_at_close += lost
        log.info("close: kept %d blocks of the GPU, SHM and REMOTE tiers in the file tier, %d lost%s",
                 kept, lost, "" if slow is not None else " (no file tier)")

    def __enter__(self) -> "CascadeStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
