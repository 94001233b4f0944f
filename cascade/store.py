"""CascadeStore: the content-addressed, tiered KV-block store of one rank.

This module is the store's face: it checks what callers pass, owns the lifecycle and
hands each call to one layer of :mod:`cascade.core` (the read and write paths, the tier
chain with its two-phase moves, the block index that alone asks the policy, the resource
guards); docs/architecture.md follows a put and a get through them. In a multi-rank run
the chain keeps the multi-rank layer (:mod:`cascade.distributed.store_layer`) told about
every block it stores, moves and frees; on one rank that layer is a no-op stand-in.

Thread-safety: every public method is safe to call from several threads. One lock per
store guards the metadata only; the bytes move outside it (a get copies under a lease,
a put into claimed room, a demotion that makes room for a put between two short locked
steps; cross-rank reads, a hint's promotion, flush()'s fsyncs and the file tier's
compactions, copied by a thread of the store's own, too). Still under the lock:
demotions made for a promotion or a namespace quota, room-making for content-hashed
puts, REMOTE-tier (MPI) copies and warm-restart checks.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any, ContextManager

import numpy as np

from . import manifest
from .async_ops import AsyncCalls
from .buffers import WRITABLE_C, host_array
from .buffers.alloc import empty_like_kind
from .buffers.hostcopy import plain_pair, plain_pairs, refuse_overlaps
from .config import Config
from .core.batch import BatchCalls
from .core.block_calls import BlockCalls
from .core.chain import TierChain
from .core.housekeeper import Housekeeper
from .core.demoter import Demoter
from .core.expiry import ExpirySweeper
from .core.factory import build_tiers
from .core.guards import CLOSE_WAIT_S, InFlight
from .core.index import BlockIndex
from .core.pools import Pools, spare_cores
from .distributed.agree import DEFAULT_TIMEOUT as CLOSE_RANKS_WAIT_S
from .core.reads import ReadPath
from .core.lifecycle import close_layers, open_layers
from .core.writes import WritePath
from .errors import InvalidBlock, RankFailure, TierFull
from .identity import DEFAULT_NAMESPACE, BlockKey, check_id, check_namespace
from .models import BlockSpec
from .namespace_victims import NamespaceVictims
from .policy import BlockMeta, Policy
from .stats import StoreMetrics
from .tiers.base import Tier, fsync_and_close
from .validate import check_priority, check_ttl

log = logging.getLogger(__name__)
_HISTORY_PER_BLOCK = 8  # the policy remembers use counts of 8x as many dropped blocks as fit

#: Seconds a store left by an exception (``with``) waits for the other ranks to close it too.
EXIT_RANKS_WAIT_S = 30.0
#: Seconds close() lets non-blocking calls submitted before it finish before cancelling the rest.
ASYNC_CLOSE_SECONDS = 60.0


class CascadeStore(BatchCalls, BlockCalls):
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
        self._shape, self._dtype = self.spec.shape, self.spec.np_dtype  # (the hot paths' checks: one lookup each)
        self._stats_dir = self.config.stats_dir  # (the hot paths' test: the config is frozen)
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
        self.rank = rank
        nbytes = self.spec.block_bytes
        capacity_blocks = sum(t.capacity for t in self.tiers) // max(nbytes, 1)
        policy = NamespaceVictims if self.config.namespace_share > 0 else Policy  # per-namespace order
        self.policy = policy(len(self.tiers), self.config.policy, ttl_mode=self.config.ttl_mode,
                             history=_HISTORY_PER_BLOCK * capacity_blocks)
        self.metrics = StoreMetrics(len(self.tiers))
        self._lock = threading.RLock()  # metadata only: data moves outside it
        self._inflight = InFlight(self._lock)
        self._closed = False  # close() ended: the tiers are gone
        self._closer = threading.Lock()  # one close() at a time; a second waits for the first
        self._index = BlockIndex(self.policy, len(self.tiers))
        self._chain = TierChain(self.tiers, self._index, self.metrics, self._lock,
                                namespace_share=self.config.namespace_share, check_open=self._inflight.check_open)
        waits_on_network = any(getattr(t, "on_lustre", False) for t in self.tiers)  # threads hide its latency
        self._pools = Pools(self.config.io_threads, self._inflight.check_open,
                            cores=None if waits_on_network else spare_cores())
        self._async = AsyncCalls(self.config.io_threads)  # put_async & co. (cascade/async_ops.py)
        self._housekeeper = Housekeeper(self.tiers, self._inflight, self._lock)  # file-tier kills and compactions, off the lock
        self._demoter = Demoter(self._chain, self._inflight, self._lock, high=self.config.demote_high,
                                low=self.config.demote_low)  # keeps room in the fastest tier for puts
        self._expiry = ExpirySweeper(self._index, self._chain, self.metrics, self._inflight, self._lock)
        self._index.on_ttl = self._expiry.enter  # blocks past their TTL go without waiting for a read
        self._index.on_ttl_gone = self._expiry.forget
        self._writes = WritePath(self._chain, self._inflight, self._lock, self._pools, self._demoter, nbytes=nbytes,
                                 hash_algo=self.config.hash_algo, default_ttl=self.config.default_ttl)
        self._reads = ReadPath(self._chain, self._inflight, self._lock, nbytes=nbytes, rank=rank,
                               default_ttl=self.config.default_ttl, promote_on_hit=self.config.promote_on_hit,
                               cache_cluster_reads=self.config.cache_cluster_reads,
                               ttl_on_use=self.config.ttl_mode == "last_use")
        try:
            with self._lock:
                open_layers(self._chain, built, self.config, block_bytes=nbytes, rank=rank,
                            comm=comm if clustered else None, layout=self.layout if tiers is None else None)
        except BaseException:
            self._expiry.stop()  # it may have started for blocks found at open
            raise
        cluster = self._chain.peers.cluster
        if cluster is not None and cluster.atomics_wait_for_busy_ranks:
            self._expiry.stop()  # its withdrawals would hold the lock while atomics wait for busy ranks
            self._index.on_ttl = self._index.on_ttl_gone = None
            log.info("TTL expiry at reads only: inter-node atomics wait for busy ranks and mpi_progress is off")

    # -- what the layers hold, for reports and tests ------------------------------------------
    @property
    def counters(self):
        """Store-wide operation counts (:class:`~cascade.stats.StoreCounters`)."""
        return self.metrics.counters

    @property
    def tier_counters(self):
        """Events per tier, fastest first (:class:`~cascade.stats.TierCounters`)."""
        return self.metrics.tiers

    @property
    def _meta(self) -> dict[BlockKey, BlockMeta]:
        return self._index.blocks

    @property
    def cluster(self):
        """The :class:`~cascade.distributed.cluster.Cluster` of a multi-rank store (its
        directory, peers' readers), None for a local one."""
        return self._chain.peers.cluster

    # -- validation -------------------------------------------------------------------------
    def _check_pair(self, key: Any, value: Any) -> list[Any]:
        self._inflight.check_open()
        return [self.spec.check(key, "key"), self.spec.check(value, "value")]

    @staticmethod
    def _check_put_options(namespace: str, parent: str | None, priority: int,
                           ttl: float | None) -> tuple[int, float | None]:
        check_namespace(namespace)
        if parent is not None:
            check_id(parent)
        return check_priority(priority), None if ttl is None else check_ttl(ttl)

    def _key(self, block_id: str, namespace: str) -> BlockKey:
        self._inflight.check_open()
        return (check_namespace(namespace), check_id(block_id))

    def _keys(self, block_ids: Iterable[str], namespace: str, what: str) -> list[BlockKey]:
        """The keys of ``block_ids`` (each checked); :class:`InvalidBlock` for a single
        id passed where a list of ids is due (its characters are not ids)."""
        if isinstance(block_ids, str):
            raise InvalidBlock(f"{what}: expected a list of block ids, got the single id {block_ids!r}; "
                               f"wrap it in a list")
        return [self._key(b, namespace) for b in block_ids]

    def _check_outs(self, key_out: Any, value_out: Any) -> list[Any]:
        """:class:`InvalidBlock` unless both are writable arrays of the spec, not
        overlapping; else what to copy into (:meth:`BlockSpec.check`)."""
        outs = [self.spec.check(key_out, "key_out", writable=True), self.spec.check(value_out, "value_out", writable=True)]
        refuse_overlaps(outs, "get_into")
        return outs

    def _tick(self) -> None:
        """Refresh this rank's stats file when ``config.stats_dir`` is set (see
        :meth:`StoreMetrics.maybe_write`)."""
        if self._stats_dir:
            with self._lock:
                self.metrics.maybe_write(self._stats_dir, self.config.stats_interval, self.rank, self._stats)

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
        ``parent`` is the id of the previous block of the sequence; a parent that is
        the block itself, or one of its cached descendants, is refused. Raises
        :class:`InvalidBlock` for bad input and :class:`TierFull` when no tier can take
        the block (nothing stored is lost either way). The copy runs outside the store's
        lock (puts from several threads copy in parallel), except for a small block
        with ``block_id`` that the SHM tier has room for as it is: that put is one short
        locked step (:meth:`~cascade.core.writes.WritePath.put_hot`).
        """
        if not (namespace is DEFAULT_NAMESPACE and parent is None and ttl is None and priority.__class__ is int
                and not priority):  # the defaults need no check (tested here, not by a call: per put)
            priority, ttl = self._check_put_options(namespace, parent, priority, ttl)  # before anything is stored
        plain = plain_pair(key, value, self._dtype, self._shape)
        if not plain and (arrays := self._host_arrays(key, value, writable=False)) is not None:
            (key, value), plain = arrays, True  # CPU torch tensors: numpy arrays over their memory
        if block_id is not None and not verify and plain:
            stored = self._writes.put_hot((key, value), namespace, check_id(block_id), parent, ttl, priority)
            if stored is not None:
                if self._stats_dir:
                    self._tick()
                return stored
        parts = self._check_pair(key, value)
        stored = self._writes.put(parts, namespace, block_id, verify=verify, parent=parent, ttl=ttl,
                                  priority=priority)
        self._tick()
        return stored

    # -- get ------------------------------------------------------------------------------
    def get(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE, like: Any = None) -> tuple[Any, Any] | None:
        """(key, value) arrays of a cached block, or None on a miss. Local.

        The arrays are fresh ones of ``like``'s kind: numpy by default; a torch tensor
        example gives torch tensors on its device (CPU or that CUDA device), a cupy array
        cupy arrays on its device (only the example's kind and device matter, e.g.
        ``store.get(bid, like=kv_cache_tensor)``). :class:`InvalidBlock` for other
        examples (use :meth:`get_into` with your own buffers). A block whose stored bytes
        fail verification is dropped, counted as a corruption and reported as a miss
        (None): corrupted data is never returned.
        """
        key_out, value_out = (empty_like_kind(like, self.spec.shape, self.spec.np_dtype) for _ in range(2))
        return (key_out, value_out) if self._read(block_id, namespace, [key_out, value_out]) else None

    def get_into(self, block_id: str, key_out: Any, value_out: Any, *, namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Read a block straight into ``key_out`` and ``value_out`` (arrays of the store's
        spec, no extra copy). True on a hit; False on a miss (outputs then hold no valid
        data). :class:`InvalidBlock` for outputs that are not writable buffers of the
        spec (nothing is then held). Local; the copy runs outside the store's lock,
        except for a hit on a small block in the SHM tier (one short locked step:
        :meth:`~cascade.core.reads.ReadPath.read_hot`)."""
        if type(block_id) is str and type(namespace) is str:
            if not plain_pair(key_out, value_out, self._dtype, self._shape):
                arrays = self._host_arrays(key_out, value_out, writable=True)
                if arrays is None:
                    return self._read(block_id, namespace, self._check_outs(key_out, value_out))
                key_out, value_out = arrays  # CPU torch tensors: numpy arrays over their memory
            # a get after a put_async of this id sees it (a block found on disk at a warm
            # restart is replaced by a put of other bytes; one dict lookup when none is pending)
            self._async.wait_for_puts([(namespace, block_id)])
            if self._reads.read_hot((namespace, block_id), (key_out, value_out)):
                if self._stats_dir:
                    self._tick()
                return True
            if key_out.flags.num & WRITABLE_C == WRITABLE_C and value_out.flags.num & WRITABLE_C == WRITABLE_C:
                refuse_overlaps((key_out, value_out), "get_into")  # (the hot path's copy refuses them too)
                return self._read_checked_outs(block_id, namespace, [key_out, value_out])
        return self._read(block_id, namespace, self._check_outs(key_out, value_out))

    def _read_checked_outs(self, block_id: str, namespace: str, outs: list[np.ndarray]) -> bool:
        """:meth:`_read` of a string id and namespace into outputs checked as
        :meth:`_checked_out_pairs` checks them, its pending puts waited for. The id and
        namespace are checked only when the leased read does not hit: only checked ones
        are ever cached, so a hit needs no check (five calls a get)."""
        key = (namespace, block_id)
        hit = self._reads.read_leased(key, outs)
        if hit is None:
            self._key(block_id, namespace)  # InvalidBlock for a malformed one, StoreClosed once closed
            hit = self._reads.read(key, outs)
        if self._stats_dir:
            self._tick()
        return hit

    def _host_arrays(self, key: Any, value: Any, *, writable: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """``key`` and ``value`` as numpy arrays of the spec over their own memory when both
        are CPU torch tensors of the spec (:func:`cascade.buffers.host_array`), else None."""
        k = host_array(key, self._shape, self._dtype, writable=writable)
        if k is None:
            return None
        v = host_array(value, self._shape, self._dtype, writable=writable)
        return None if v is None else (k, v)

    def _plain_pairs(self, pairs: list[tuple[Any, Any]]) -> list[int]:
        """Indices of the ``(key, value)`` of ``pairs`` that are both numpy arrays of the
        spec's shape and dtype (:func:`~cascade.buffers.hostcopy.plain_pair`: candidates for the hot path, which
        still checks their layout). A pair of CPU torch tensors of the spec is replaced in
        ``pairs`` by numpy arrays over their memory (:meth:`_host_arrays`) and counted."""
        shape, dtype = self.spec.shape, self.spec.np_dtype
        plain = []
        for i, (k, v) in enumerate(pairs):
            if not plain_pair(k, v, dtype, shape):
                arrays = self._host_arrays(k, v, writable=False)
                if arrays is None:
                    continue
                pairs[i] = arrays
            plain.append(i)
        return plain

    def _checked_out_pairs(self, outs: list[Sequence[Any]]) -> list[Sequence[Any]]:
        """Each ``(key_out, value_out)`` of ``outs`` checked as :meth:`_check_outs` checks
        it (:class:`InvalidBlock` for the first bad one): a pair of writable C-contiguous
        numpy arrays of the spec, as it is (the leading run of such pairs in one compiled
        call, :func:`~cascade.buffers.hostcopy.plain_pairs`, for batches of small blocks),
        else what to copy into."""
        shape, dtype = self._shape, self._dtype
        plain = plain_pairs(outs, np.ndarray, dtype, shape)
        if plain == len(outs):
            return outs
        return outs[:plain] + [
            pair if plain_pairs((pair,), np.ndarray, dtype, shape)
            else self._host_arrays(pair[0], pair[1], writable=True) or tuple(self._check_outs(*pair))
            for pair in outs[plain:]]

    def view(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> ContextManager[list[Any] | None]:
        """``with store.view(id) as block:`` ``[key, value]`` read-only arrays over the
        block's bytes in place (no copy, whatever its size) when it is in the SHM or GPU
        tier, else a private copy; None on a miss. Valid only inside the ``with`` block,
        which holds the block in place (close() waits for it). Local."""
        bkey = self._key(block_id, namespace)
        self._async.wait_for_puts([bkey])
        return self._reads.view(bkey, self.spec)

    def _read(self, block_id: str, namespace: str, outs: list[Any], *, wait: bool = True) -> bool:
        bkey = self._key(block_id, namespace)
        if wait:
            self._async.wait_for_puts([bkey])  # a get after a put_async of this id sees it
        hit = self._reads.read_any(bkey, outs)
        if self._stats_dir:
            self._tick()
        return hit

    # -- other operations -------------------------------------------------------------------
    def contains(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Whether a block is cached (not expired) in ``namespace``. Local; counts nothing."""
        return self.contains_many([block_id], namespace=namespace)[0]

    def flush(self) -> None:
        """Wait for every non-blocking call submitted before it, for the background
        demoter to be idle and for the compactions asked for before it, then make every
        completed put durable in the persistent tiers (fsync, outside the store's lock:
        gets and puts go on meanwhile). Local."""
        self._inflight.check_open()
        self._async.wait_all()
        self._demoter.wait_idle()
        self._housekeeper.wait_idle()
        with self._inflight.hold("a flush's fsyncs"):
            fds: list[int] = []
            try:
                with self._lock:
                    for tier in self.tiers:
                        fds.extend(tier.sync_fds())
            finally:
                fsync_and_close(fds)

    def __len__(self) -> int:
        return len(self._index)

    # -- reporting and shutdown ---------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters overall and per tier (blocks, bytes, hits, misses, evictions,
        promotions, demotions, corruptions, full events, plus tier facts)."""
        self._inflight.check_open()
        return self._stats()

    def _stats(self) -> dict[str, Any]:
        with self._lock:
            facts = [(tier.name, {**tier.stats(), "bytes": tier.used}) for tier in self.tiers]
            return {"rank": self.rank, "blocks": len(self._index), **self.metrics.as_dict(facts),
                    "policy": self._index.policy_kind, "hinted_bytes": self._index.hinted_bytes,
                    "block_bytes": self.spec.block_bytes}

    def close(self, *, keep: bool = True, timeout: float = CLOSE_WAIT_S,
              ranks_timeout: float = CLOSE_RANKS_WAIT_S) -> None:
        """Release every tier; file-tier data stays for a warm restart. Idempotent.

        With ``keep`` (default), blocks in the GPU and SHM tiers first move to the file
        tier, as far as it has room without evicting anything (the rest are lost, as are
        REMOTE-tier blocks, which live in other ranks' DRAM). Collective in multi-rank
        runs: SHM slabs and windows go only after every rank has entered ``close`` (so
        has stopped reading them), and a close that fails on one rank (e.g. its file tier's
        fsync) raises that error there and ``PeerStepFailed`` on the others, after every
        rank has released its tiers. Later calls raise :class:`StoreClosed`. The
        non-blocking calls submitted before it finish first (at most
        :data:`ASYNC_CLOSE_SECONDS`; those not started by then are cancelled); calls of
        other threads still moving data get up to ``timeout`` seconds to finish (the
        wait gives the store's lock up), after which :class:`CloseTimeout` names what
        they hold and the tiers stay open (call ``close()`` again). Other ranks get
        ``ranks_timeout`` seconds to enter ``close`` (a rank that never does, e.g. it
        waits elsewhere for this one: :class:`~cascade.errors.RankFailure`, its MPI
        windows kept; ``with`` gives them :data:`EXIT_RANKS_WAIT_S` when leaving on an
        exception)."""
        unfinished = self._async.close(ASYNC_CLOSE_SECONDS)
        if unfinished:
            log.warning("close: %d non-blocking calls did not finish in %.0f s and were cancelled",
                        unfinished, ASYNC_CLOSE_SECONDS)
        self._demoter.stop()  # after its move under way; a put then makes room itself
        self._housekeeper.stop()  # a compaction's copying stops between two records and is undone
        self._expiry.stop()  # blocks past their TTL are left to the next open, which drops them
        with self._closer, self._lock:
            if self._closed:
                return
            self._inflight.closing = True
            self._inflight.drain(timeout)
            self._closed = True
            try:
                close_layers(self._chain, self._built_tiers, keep=keep, write_stats=self._write_final_stats,
                             ranks_timeout=ranks_timeout)
            finally:
                self._pools.shutdown()

    def _write_final_stats(self) -> None:
        if len(self._index) or self.counters.puts or self.counters.gets:
            self.metrics.maybe_write(self.config.stats_dir, self.config.stats_interval, self.rank, self._stats,
                                     force=True)

    def __enter__(self) -> "CascadeStore":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        """:meth:`close`; leaving on an exception, which may be this rank's alone (the
        others then wait elsewhere, never entering ``close``), it waits at most
        :data:`EXIT_RANKS_WAIT_S` seconds for them, and a :class:`RankFailure` of the close
        is logged: the exception that ended the block goes on."""
        if exc_type is None:
            self.close()
            return
        try:
            self.close(ranks_timeout=EXIT_RANKS_WAIT_S)
        except RankFailure as exc:
            log.warning("close after %s: %s", exc_type.__name__, exc)

