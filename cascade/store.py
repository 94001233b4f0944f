"""CascadeStore: the content-addressed, tiered KV-block store of one rank.

The store owns the tiers (fastest first: GPU, SHM, REMOTE, LUSTRE — those configured),
the per-block metadata, the policy and the counters. A block lives in exactly one tier;
puts enter the fastest tier, eviction demotes tier by tier (failure-atomic: a block
leaves a tier only after the slower tier accepted it) and only the last tier drops.

In a multi-rank run the store tells its multi-rank layer
(:mod:`cascade.distributed.store_layer`) about every block it stores, moves and frees;
the layer keeps the global directory true and answers local misses from other ranks.
On one rank the layer is a no-op stand-in, so the code here is the same either way.

Thread-safety: every public method is safe to call from several threads (one lock per
store; content hashing of a put runs outside it).
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .config import Config
from .distributed.store_layer import Joined, Solo
from .errors import BlockNotFound, BlockPinned, ConfigError, CorruptBlock, InvalidBlock, StoreClosed, TierFull
from .identity import block_id as compute_block_id, check_id, check_namespace
from .models import BlockSpec
from .policy import BlockMeta, Policy
from .histogram import LatencyHistogram
from .stats import StoreCounters, TierCounters, write_stats_file
from .tiers.base import BlockKey, Tier
from .tiers.file_tier import FileTier
from .tiers.gpu import GpuTier, cupy_module
from .tiers.shm import ShmTier, remove_stale_slabs
from .validate import check_priority, check_ttl

log = logging.getLogger(__name__)
DEFAULT_NAMESPACE = "default"
_HISTORY_PER_BLOCK = 8  # the policy remembers use counts of 8x as many dropped blocks as fit
_OVERLAP_MIN_BYTES = 256 << 10  # below this, handing the hash to a thread costs more than it saves


class _Busy(Exception):
    """A chosen victim may not move or go now: another rank pins it or caches a child."""


def build_tiers(config: Config, *, rank: int = 0, array_module=None, comm=None) -> list[Tier]:
    """The tiers ``config`` asks for, fastest first. Collective when ``comm`` (of more
    than one rank) is given: the REMOTE tier allocates its MPI window then.

    ``array_module`` forces the GPU tier's array module (numpy in tests); by default the
    GPU tier uses cupy and is off, with a log line, when no GPU is usable.
    """
    tiers: list[Tier] = []
    if config.gpu_bytes > 0:
        xp = array_module if array_module is not None else cupy_module()
        if xp is not None:
            tiers.append(GpuTier(config.gpu_bytes, xp, verify=config.verify_dram_reads))
    for path in remove_stale_slabs(config.shm_dir):  # left by a crashed process of ours
        log.info("removed stale SHM slab %s (its process is gone)", path)
    if config.shm_bytes > 0:
        try:
            tiers.append(ShmTier(config.shm_bytes, config.shm_dir, verify=config.verify_dram_reads))
        except (TierFull, OSError) as exc:  # a full or missing /dev/shm: run on the other tiers
            log.warning("SHM tier off: %s", exc)
    if comm is not None:  # every rank takes part in the window, even one exposing 0 bytes
        from .tiers.remote import RemoteTier

        # always verified: its reads cross ranks (the end-to-end check, like peers' reads)
        tiers.append(RemoteTier(comm, config.remote_bytes, chunk_bytes=remote_chunk_bytes(config.remote_bytes),
                                verify=True))
    if config.file_bytes > 0:
        tiers.append(FileTier(
            config.file_bytes, config.file_dir, rank=rank, segment_bytes=config.file_segment_bytes,
            odirect=config.file_odirect, read_mode=config.file_read_mode, fsync=config.file_fsync,
            compact_dead_fraction=config.compact_dead_fraction,
            stripe_count=config.lustre_stripe_count, stripe_size=config.lustre_stripe_size,
        ))
    return tiers


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
    dedup, reads and pins. Then the constructor and :meth:`close` are collective. Without
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
        built = list(tiers) if tiers is not None else build_tiers(
            self.config, rank=rank, array_module=array_module, comm=comm if clustered else None)
        self._built_tiers = built  # all of them, for close(): the REMOTE tier's is collective
        self.tiers: list[Tier] = [t for t in built if t.capacity > 0]
        if not self.tiers:
            for tier in built:
                tier.close()
            raise TierFull("no tier has capacity: set shm_bytes, gpu_bytes or file_bytes above 0")
        capacity_blocks = sum(t.capacity for t in self.tiers) // max(self.spec.block_bytes, 1)
        self.policy = Policy(len(self.tiers), self.config.policy, ttl_mode=self.config.ttl_mode,
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
        self._lock = threading.RLock()
        self._hasher: ThreadPoolExecutor | None = None
        self._closed = False
        # Blocks found on disk at open, not yet confirmed by a put of the same bytes: a
        # put never dedups onto one of them unseen (see _confirmed).
        self._unconfirmed: set[BlockKey] = set()
        for tier in self.tiers:
            if hasattr(tier, "expiry_of"):  # persistent tiers record TTLs (wall clock)
                tier.expiry_of = self._wall_expiry
        self._peers: Solo = Solo()  # the multi-rank layer (cascade/distributed/store_layer.py)
        try:
            if clustered:
                from .distributed.cluster import Cluster

                shm = next((t for t in self.tiers if t.name == "shm"), None)
                remote = next((t for t in built if t.name == "remote"), None)
                cluster = Cluster(comm, shm_path=getattr(shm, "path", None), file_dir=self.config.file_dir,
                                  shm_buffer=getattr(shm, "mapping", None),
                                  remote=remote, directory_slots=self.config.directory_slots)
                self._peers = Joined(cluster, self.tiers, rank)
            self._recover()
        except BaseException:
            for tier in built:
                tier.close()
            raise

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
        for meta in list(self._meta.values()):
            try:
                kept = self._peers.recovered(meta)
            except CorruptBlock as exc:
                log.warning("%s", exc)
                kept = False
            if not kept:  # corrupt, or another rank's copy won
                self._drop(meta)
        for t, tier in enumerate(self.tiers):  # a smaller capacity than last time: shed blocks
            while tier.free < 0 and (victim := self.policy.victim(t)) is not None:
                self._demote(victim)

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
        if self._closed:
            raise StoreClosed("this CascadeStore is closed")

    def _check_pair(self, key: Any, value: Any) -> list[Any]:
        self._check_open()
        self.spec.check(key, "key")
        self.spec.check(value, "value")
        return [key, value]

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
        content digest; ``verify=True`` recomputes it and checks a given ``block_id``. A put of an id already cached in ``namespace`` only
        adds a reference (dedup). ``parent`` is the id of the previous block of the
        sequence. Raises :class:`InvalidBlock` for bad input and :class:`TierFull` when
        no tier can take the block (nothing stored is lost either way).
        """
        parts = self._check_pair(key, value)
        check_namespace(namespace)
        if parent is not None:
            check_id(parent)
        priority = check_priority(priority)  # all checks before anything is stored
        ttl = None if ttl is None else check_ttl(ttl)
        started = time.perf_counter()
        staged = None
        if block_id is None or verify:
            if self._can_overlap():
                # Copy into the fastest tier while another thread hashes (BLAKE3 and
                # SHA-256 release the GIL): the put costs max(copy, hash), not the sum.
                pending = self._hash_pool().submit(compute_block_id, key, value, algo=self.config.hash_algo)
                try:
                    staged = self._stage(parts, namespace)
                except TierFull:
                    staged = None  # the fastest tier is full of pinned blocks: _place finds another
                digest = pending.result()
            else:
                digest = compute_block_id(key, value, algo=self.config.hash_algo)
            if block_id is not None and check_id(block_id) != digest:
                self._discard(staged)
                raise InvalidBlock(f"block_id {block_id} does not match the content digest {digest}")
            block_id = digest
        bkey = self._key(block_id, namespace)
        # published with the block so that every cross-rank read can verify the bytes
        block_sum = self._peers.checksum(parts)
        with self._lock:
            self.counters.puts += 1
            now = time.monotonic()
            meta = self._meta.get(bkey)
            if meta is not None and not self._expired(meta, now) and self._confirmed(meta, parts):
                self._discard(staged)
                meta.shares += 1
                self.policy.touched(meta, now)
                self.counters.deduped += 1
                return block_id
            if meta is not None and self._peers.withdraw(meta, leaf_only=False):
                self._drop(meta)
            elif meta is not None:  # expired but pinned by another rank: keep serving it
                self.counters.deduped += 1
                self._discard(staged)
                return block_id
            if self._peers.held_elsewhere(bkey):
                self._discard(staged)
                self.counters.deduped += 1
                self.counters.cluster_deduped += 1
                return block_id
            try:
                if staged is not None:
                    self.tiers[0].commit(bkey, staged)
                    placed = 0
                else:
                    placed = self._place(bkey, parts, parent)
            except TierFull:
                self.counters.rejected += 1
                raise
            meta = BlockMeta(bkey, self.spec.block_bytes, placed, parent=parent, priority=priority,
                             ttl=self.config.default_ttl if ttl is None else ttl, checksum=block_sum)
            meta.depth = self._depth(meta)
            self._unconfirmed.discard(bkey)
            self._admit(meta, now)
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

    @property
    def cluster(self):
        """The :class:`~cascade.distributed.cluster.Cluster` of a multi-rank store (its
        directory, peers' readers), None for a local one."""
        return self._peers.cluster

    def _can_overlap(self) -> bool:
        return self.spec.block_bytes >= _OVERLAP_MIN_BYTES and hasattr(self.tiers[0], "stage")

    def _hash_pool(self) -> ThreadPoolExecutor:
        if self._hasher is None:
            self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cascade-hash")
        return self._hasher

    def _stage(self, parts: list[Any], namespace: str) -> tuple[int, int] | None:
        """Copy a block into the fastest tier's free space (not yet published)."""
        with self._lock:
            self._make_room(0, self.spec.block_bytes, namespace)
            return self.tiers[0].stage(parts)

    def _discard(self, staged: tuple[int, int] | None) -> None:
        if staged is not None:
            with self._lock:
                self.tiers[0].discard(staged)

    def _place(self, bkey: BlockKey, parts: list[Any], parent: str | None) -> int:
        """Write a new block into the fastest tier that can make room (one full of
        pinned blocks is passed over); returns that tier's index. :class:`TierFull`
        when none can."""
        nbytes = self.spec.block_bytes
        reasons = []
        for t, tier in enumerate(self.tiers):
            if tier.capacity < nbytes:
                reasons.append(f"{tier.name}: the block exceeds its capacity of {tier.capacity}")
                continue
            try:
                self._make_room(t, nbytes, bkey[0])
                tier.put(bkey, parts, parent=parent)
                return t
            except OSError as exc:  # TierFull included (ENOSPC and friends too)
                self.tier_counters[t].full_events += 1
                reasons.append(str(exc))
        raise TierFull(f"no tier can take a block of {nbytes} bytes: {'; '.join(reasons)}")

    def put_many(
        self,
        pairs: Iterable[tuple[Any, Any]],
        *,
        namespace: str = DEFAULT_NAMESPACE,
        chain: bool = False,
        parent: str | None = None,
    ) -> list[str]:
        """Put each (key, value); with ``chain=True`` each block's parent is the one
        before it (the first one's is ``parent``). Returns the ids. Local."""
        ids: list[str] = []
        for key, value in pairs:
            bid = self.put(key, value, namespace=namespace, parent=parent if chain else None)
            ids.append(bid)
            if chain:
                parent = bid
        return ids

    # -- eviction ---------------------------------------------------------------------------
    def _make_room(self, t: int, nbytes: int, namespace: str | None = None) -> None:
        """Evict from tier ``t`` until ``nbytes`` (of ``namespace``) fit. With a
        namespace share, a namespace that would go over its share of the tier first
        moves its own blocks down. Raises :class:`TierFull`."""
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
                    self._demote(victim)
                except _Busy:  # another rank pins it (or caches its child): not now
                    self.policy.set_aside(victim)
                    set_aside.append(victim)
        finally:
            for meta in set_aside:
                if meta.key in self._meta:
                    self.policy.changed(meta)

    def _keep_share(self, t: int, nbytes: int, namespace: str) -> None:
        """Move ``namespace``'s own blocks out of tier ``t`` until ``nbytes`` more stay
        within its share; :class:`TierFull` when its movable blocks do not suffice.
        Costs a scan of the namespace's blocks in the tier per victim."""
        share = self.config.namespace_share * self.tiers[t].capacity
        skipped: set[BlockKey] = set()
        while self._ns_bytes[t].get(namespace, 0) + nbytes > share:
            own = [m for m in self._meta.values()
                   if m.tier == t and m.key[0] == namespace and m.key not in skipped and self.policy.eligible(m)]
            if not own:
                self.tier_counters[t].full_events += 1
                raise TierFull(f"{self.tiers[t].name}: namespace {namespace!r} is at its share "
                               f"({self.config.namespace_share:g} of the tier) and none of its blocks there can move")
            victim = min(own, key=self.policy.score)
            try:
                self._demote(victim)
            except _Busy:
                skipped.add(victim.key)

    def _demote(self, meta: BlockMeta) -> None:
        """Move ``meta`` to the next slower tier that takes it (one without room or
        capacity is skipped), or drop it when none does. Failure-atomic: the block stays
        where it is until a slower tier holds it."""
        t = meta.tier
        for lower in range(t + 1, len(self.tiers)):
            if self.tiers[lower].capacity < meta.nbytes:
                continue
            try:
                self._make_room(lower, meta.nbytes, meta.key[0])
                self._copy_between(meta, t, lower)
            except (TierFull, OSError) as exc:
                log.debug("demotion of %s to %s failed (%s)", meta.key[1], self.tiers[lower].name, exc)
                continue
            self.tier_counters[t].demotions += 1
            return
        if not self._peers.withdraw(meta, leaf_only=True):
            raise _Busy(meta.key)
        self.tier_counters[t].evictions += 1
        self.policy.evicted(meta)
        self._drop(meta)

    def _copy_between(self, meta: BlockMeta, src: int, dst: int) -> None:
        """Copy a block from tier ``src`` to ``dst``, then delete it from ``src``."""
        buf = np.empty(meta.nbytes, dtype=np.uint8)
        self.tiers[src].read_into(meta.key, buf)
        try:
            self.tiers[dst].put(meta.key, [buf], parent=meta.parent)
        except OSError:  # TierFull included: ENOSPC and friends
            self.tier_counters[dst].full_events += 1
            raise
        self._move_published(meta, src, dst)
        self.tier_counters[dst].bytes_written += meta.nbytes

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
        data). Local."""
        self.spec.check(key_out, "key_out")
        self.spec.check(value_out, "value_out")
        if getattr(key_out, "flags", None) is not None and not (key_out.flags.writeable and value_out.flags.writeable):
            raise InvalidBlock("key_out and value_out must be writable")
        return self._read(block_id, namespace, [key_out, value_out])

    def get_many(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE) -> list[tuple[Any, Any] | None]:
        """``get`` of each id, in order. Local."""
        return [self.get(b, namespace=namespace) for b in block_ids]

    def _read(self, block_id: str, namespace: str, outs: list[Any]) -> bool:
        bkey = self._key(block_id, namespace)
        started = time.perf_counter()
        with self._lock:
            self.counters.gets += 1
            now = time.monotonic()
            meta = self._meta.get(bkey)
            if meta is not None and self._expired(meta, now) and self._peers.withdraw(meta, leaf_only=False):
                self.counters.expired += 1
                self._drop(meta)
                meta = None
            if meta is None:
                return self._read_from_cluster(bkey, outs, started)
            t = meta.tier
            try:
                self.tiers[t].read_parts_into(bkey, outs)
            except CorruptBlock as exc:
                log.warning("%s", exc)
                self.tier_counters[t].corruptions += 1
                self._drop_corrupt(meta)
                return self._miss(len(self.tiers))
            self.counters.hits += 1
            counters = self.tier_counters[t]
            counters.hits += 1
            counters.bytes_read += meta.nbytes
            self.get_latency[t].record(time.perf_counter() - started)
            for faster in self.tier_counters[:t]:
                faster.misses += 1
            if meta.hints:  # the queued request it was hinted for has come
                self._release_hint(meta)
            self.policy.touched(meta, now)
            if t > 0 and self.config.promote_on_hit:
                self._promote(meta, outs)
            self._maybe_write_stats()
            return True

    def _read_from_cluster(self, bkey: BlockKey, outs: list[Any], started: float) -> bool:
        """A local miss: read the block from whichever rank published it."""
        try:
            entry = self._peers.read(bkey, outs)
        except CorruptBlock as exc:
            log.warning("%s", exc)
            self.counters.cluster_corruptions += 1
            return self._miss(len(self.tiers))
        if entry is None:
            return self._miss(len(self.tiers))
        self.counters.hits += 1
        self.counters.cluster_hits += 1
        self.cluster_latency.record(time.perf_counter() - started)
        if self.config.cache_cluster_reads and entry.rank != self.rank:
            self._keep_private_copy(bkey, outs)
        for counters in self.tier_counters:  # no local tier had it
            counters.misses += 1
        return True

    def _keep_private_copy(self, bkey: BlockKey, data: list[Any]) -> None:
        """Keep a block just read from another rank in the fastest tier, unpublished, so
        the next reads of a hot block stay local and its holder serves each rank once.
        The copy is never shared and may outlive the holder's copy (the same bytes:
        ids name content). Best effort: nothing happens when no room can be made."""
        try:
            self._make_room(0, self.spec.block_bytes, bkey[0])
            self.tiers[0].put(bkey, data)
        except (TierFull, OSError) as exc:
            log.debug("no private copy of %s: %s", bkey[1], exc)
            return
        meta = BlockMeta(bkey, self.spec.block_bytes, 0, ttl=self.config.default_ttl)
        self._admit(meta, time.monotonic())

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

    def _promote(self, meta: BlockMeta, data: list[Any]) -> None:
        """Move a block just read (its bytes in ``data``) up to the fastest tier, if room
        can be made without dropping pinned or parent blocks. Best effort."""
        src = meta.tier
        meta.pins += 1  # keep it from being chosen as a victim while making room
        try:
            self._make_room(0, meta.nbytes, meta.key[0])
            self.tiers[0].put(meta.key, data, parent=meta.parent)
        except (TierFull, OSError) as exc:
            log.debug("promotion of %s skipped: %s", meta.key[1], exc)
            return
        finally:
            meta.pins -= 1
            self.policy.changed(meta)
        try:
            self._move_published(meta, src, 0)
        except _Busy:
            return
        self.tier_counters[src].promotions += 1
        self.tier_counters[0].bytes_written += meta.nbytes

    # -- scheduler hints --------------------------------------------------------------------
    def hint(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE) -> int:
        """Blocks a queued request will read soon: move each cached one up to the
        fastest tier (best effort) and keep it from eviction until a :meth:`get` /
        :meth:`get_into` of it (one get uses up one hint) or :meth:`unhint`. Hints count:
        a block hinted for two queued requests stays protected until both read it.

        Hinted blocks hold at most ``config.hint_fraction`` of the fastest tier's bytes,
        so hints cannot starve puts: a hint that would go past the cap, and a hint of a
        block not cached on this rank, is ignored. Returns how many hints were taken.
        Local (other ranks' blocks are not hinted); thread-safe.
        """
        keys = [self._key(b, namespace) for b in block_ids]
        cap = self.config.hint_fraction * self.tiers[0].capacity
        taken = 0
        with self._lock:
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
                self.policy.changed(meta)
                if meta.tier > 0:
                    self._promote_cached(meta)
            self.counters.hints += taken
        return taken

    def unhint(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE) -> int:
        """Withdraw one hint of each id (its request left the queue unserved); ids
        without a hint are skipped. Returns how many hints were withdrawn. Local."""
        keys = [self._key(b, namespace) for b in block_ids]
        withdrawn = 0
        with self._lock:
            for bkey in keys:
                meta = self._meta.get(bkey)
                if meta is not None and meta.hints:
                    self._release_hint(meta)
                    withdrawn += 1
        return withdrawn

    def _release_hint(self, meta: BlockMeta) -> None:
        meta.hints -= 1
        if meta.hints == 0:
            self._hinted_bytes -= meta.nbytes
        self.policy.changed(meta)

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
        self._promote(meta, [buf])

    # -- other operations -------------------------------------------------------------------
    def contains(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Whether a block is cached (not expired) in ``namespace``. Local; counts nothing."""
        return self.contains_many([block_id], namespace=namespace)[0]

    def contains_many(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE) -> list[bool]:
        """``contains`` of each id; ids not cached here are looked up in the cluster
        directory in one batch (multi-rank runs)."""
        keys = [self._key(b, namespace) for b in block_ids]
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
        """Make every completed put durable in the persistent tiers (fsync). Local."""
        self._check_open()
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

    def _persist_ttl(self, meta: BlockMeta) -> None:
        set_expiry = getattr(self.tiers[meta.tier], "set_expiry", None)
        if set_expiry is not None:
            try:
                set_expiry(meta.key, self._wall_expiry(meta.key))
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
        incoming = np.concatenate([np.frombuffer(memoryview(np.ascontiguousarray(p)).cast("B"), np.uint8)
                                   for p in parts])
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
                write_stats_file(self.config.stats_dir, self.rank, self.stats())
            except OSError as exc:
                log.warning("cannot write stats file in %s: %s", self.config.stats_dir, exc)

    def close(self, *, keep: bool = True) -> None:
        """Release every tier; file-tier data stays for a warm restart. Idempotent.

        With ``keep`` (default), blocks in the GPU and SHM tiers first move to the file
        tier, as far as it has room without evicting anything (the rest are lost, as are
        REMOTE-tier blocks, which live in other ranks' DRAM). Collective in multi-rank
        runs: SHM slabs and windows go only after every rank has entered ``close`` (so
        has stopped reading them)."""
        with self._lock:
            if keep and self._meta:
                self._keep_hot_blocks()
            if self._meta or self.counters.puts or self.counters.gets:
                self._maybe_write_stats(force=True)
            # first (collective): no rank reads our slab or windows after this, and the
            # slab window maps the SHM tier's slab
            self._peers.close()
            self._peers = Solo()
            for tier in self._built_tiers:
                tier.close()
            self._meta.clear()
            if self._hasher is not None:
                self._hasher.shutdown()
                self._hasher = None
            self._closed = True  # any later call raises StoreClosed

    def _keep_hot_blocks(self) -> None:
        """Demote GPU/SHM blocks to the file tier while it has room (no eviction)."""
        slow = next((t for t, tier in enumerate(self.tiers) if isinstance(tier, FileTier)), None)
        if slow is None:
            return
        kept = lost = 0
        for meta in sorted(self._meta.values(), key=lambda m: m.depth):  # heads first
            if self.tiers[meta.tier].name not in ("gpu", "shm"):
                continue
            src = meta.tier
            try:
                if not self.tiers[slow].fits(meta.nbytes):
                    raise TierFull("file tier full")
                self._copy_between(meta, src, slow)
            except (_Busy, CorruptBlock, OSError):  # TierFull included; _Busy: pinned elsewhere
                lost += 1
                continue
            self.tier_counters[src].demotions += 1
            kept += 1
        if kept:
            self.tiers[slow].sync()
        log.info("close: kept %d hot blocks in the file tier, %d lost", kept, lost)

    def __enter__(self) -> "CascadeStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
