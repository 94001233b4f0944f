"""The read path of one store: a get, from the index to the caller's buffers.

A get looks the block up under the store's lock and leases it in its tier (its bytes
stay in place, even if deleted meanwhile; the policy does not move it), copies outside
the lock, then counts the hit under it and may claim room to promote the block. A local
miss is read from whichever rank publishes the block (multi-rank runs), outside the
store's lock, and may be kept as a private copy. Everything taken is a guard
(:mod:`.guards`): an exception anywhere, the caller's bad buffer included, gives it all
back. Thread-safe.
"""
from __future__ import annotations

import logging
import threading
import time
from time import monotonic_ns
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import numpy as np


from ..buffers import device_dtype, host_outputs, staging_buffer
from ..buffers.splitcopy import BATCH_SPLIT_MIN
from ..errors import CorruptBlock, UnreadableBlock
from ..identity import BlockKey
from ..models import BlockSpec
from ..policy import BlockMeta
from ..tiers.base import Memory
from .batch_reads import LeasedBatchReads, buffer_arrays
from .chain import Busy, TierChain
from .guards import Claim, InFlight, Lease, Move, Op, Reading
from .interrupts import atomic

log = logging.getLogger(__name__)
#: Blocks up to this size are copied under the store's lock on a hot hit (:meth:`ReadPath.read_hot`):
#: cheaper than a lease for a copy of a few microseconds (benchmark small_blocks).
HOT_COPY_MAX = 64 << 10
class ReadPath(LeasedBatchReads):
    """Gets of blocks of ``nbytes`` through ``chain`` (its index, tiers and peers)."""

    def __init__(self, chain: TierChain, inflight: InFlight, lock: threading.RLock, *, nbytes: int,
                 rank: int, default_ttl: float, promote_on_hit: bool, cache_cluster_reads: bool,
                 ttl_on_use: bool) -> None:
        self.chain, self.index, self.metrics = chain, chain.index, chain.metrics
        self._inflight, self._lock = inflight, lock
        self._nbytes, self._rank, self._ttl = nbytes, rank, default_ttl
        self._promote_on_hit, self._cache_cluster_reads = promote_on_hit, cache_cluster_reads
        self._ttl_on_use = ttl_on_use  # a read moves a block's expiry (ttl_mode "last_use")
        self._blocks, self._tiers = chain.index.blocks, chain.tiers  # (read_hot's lookups, fixed for the store's life)
        # whether read_hot may copy: a small block, and a tier that copies under the lock
        self._hot_size = nbytes <= HOT_COPY_MAX and any(tier.hot_reads for tier in chain.tiers)
        self._hot_batch = nbytes <= HOT_COPY_MAX and any(tier.hot_batch_reads for tier in chain.tiers)
        self._defer_hot = self._hot_batch and any(tier.defers_hot_copies for tier in chain.tiers)
        self._hot_hit, self._touched_at = chain.metrics.hot_hit, chain.index.touched_at  # (read_hot's, bound once)

    def read_hot(self, key: BlockKey, outs: Sequence[Any]) -> bool:
        """A hit on a small block (:data:`HOT_COPY_MAX`) in a tier that copies under the
        store's lock (:meth:`~cascade.tiers.base.Tier.read_hot`: SHM), in one locked
        step: look it up, copy it into ``outs``, count the hit, tell the policy. The lock
        held throughout stands in for the lease and in-flight count (close() cannot pass
        it, nothing can move or free the bytes). False, with nothing counted or changed,
        when it is not such a hit (not cached here, with a TTL or a hint, due for
        promotion, in another tier, a closing store) or ``outs`` are not writable
        C-contiguous host buffers of the block's size: the caller then takes :meth:`read`.

        It runs per block, so it is one call: the latency is taken on the monotonic
        clock in integer nanoseconds, and its end reading is the policy's time of use."""
        if not self._hot_size:
            return False
        lock = self._lock
        # acquire/release, not ``with``: the bound __enter__/__exit__ of a ``with`` cost a
        # tenth of a hot get (benchmark small_blocks); the finally gives the lock back alike.
        lock.acquire()
        try:
            started = monotonic_ns()
            meta = self._copy_hot(key, outs)
            if meta is None:
                return False
            now = monotonic_ns()
            self._hot_hit(meta.tier, meta.nbytes, now - started)
            self._touched_at(meta, now * 1e-9)
            return True
        finally:
            lock.release()

    def read_hot_many(self, keys: Sequence[BlockKey], outs: Sequence[Sequence[Any]]) -> list[bool]:
        """:meth:`read_hot` of each key into the matching ``outs``, all in one locked step
        with one pair of clock readings: each hit is timed as an equal share of the step,
        used at its end, and counted with the others of its tier in one call. Hits copied
        before a copy that raised are counted too. Only tiers whose hot reads serve
        batches (:attr:`~cascade.tiers.base.Tier.hot_batch_reads`: SHM), and each only
        until it declines a block: the rest of its blocks are then read leased.
        A batch of :data:`~cascade.buffers.splitcopy.BATCH_SPLIT_MIN` bytes or more
        gathers the copies of a tier that defers them
        (:attr:`~cascade.tiers.base.Tier.defers_hot_copies`: SHM) and makes them at the
        end of the step, on two cores (:meth:`_copy_later`)."""
        if not self._hot_batch:
            return [False] * len(keys)
        copy, copied = self._copy_hot, []
        append = copied.append
        skip = [not tier.hot_batch_reads for tier in self._tiers]
        later: list[tuple[int, Any, Any]] | None = (
            [] if self._defer_hot and len(keys) * self._nbytes >= BATCH_SPLIT_MIN else None)
        with self._lock:
            started = monotonic_ns()
            try:
                if later is None:
                    for key, out in zip(keys, outs):
                        append(copy(key, out, skip))
                else:
                    self._read_hot_later(keys, outs, skip, later, copied)
            finally:
                now = monotonic_ns()
                self._count_hot_hits(copied, (now - started) // max(1, len(copied)), now)
        return [meta is not None for meta in copied]

    def _read_hot_later(self, keys: Sequence[BlockKey], outs: Sequence[Sequence[Any]], skip: list[bool],
                        later: list[tuple[int, Any, Any]], copied: list[BlockMeta | None]) -> None:
        """Under the lock: :meth:`read_hot_many`'s loop, the copies of tiers that defer them
        gathered in ``later`` as (index, tier, job) and made at its end
        (:meth:`_copy_later`). If anything raises, no gathered block is a hit: each is
        counted as a missed get (its copy was not made, or not known to be whole)."""
        copy, append = self._copy_hot, copied.append
        try:
            for i, (key, out) in enumerate(zip(keys, outs)):
                append(copy(key, out, skip, later, i))
            self._copy_later(later, copied)
        except BaseException:
            for i, _, _ in later:
                copied[i] = None
                self.metrics.counters.gets += 1
                self.metrics.miss()
            raise

    def _copy_later(self, later: Sequence[tuple[int, Any, Any]], copied: list[BlockMeta | None]) -> None:
        """Under the lock: each tier's gathered copies in one call
        (:meth:`~cascade.tiers.base.Tier.copy_hot_jobs`); a block whose outputs the copy
        refused (nothing written) is no hit here: the batch reads it another way."""
        tiers: dict[int, Any] = {id(tier): tier for _, tier, _ in later}
        for tier in tiers.values():
            mine = [(i, job) for i, t, job in later if t is tier]
            for (i, _), took in zip(mine, tier.copy_hot_jobs([job for _, job in mine])):
                if not took:
                    copied[i] = None

    def _count_hot_hits(self, copied: Sequence[BlockMeta | None], share_ns: int, now_ns: int) -> None:
        """Under the lock: count the hits of ``copied`` (None: not a hit), each timed as
        ``share_ns``, per tier in one call, and tell the policy of each use at ``now_ns``."""
        hits, nbytes = [0] * len(self._tiers), [0] * len(self._tiers)
        touched_at, at = self.index.touched_at, now_ns * 1e-9
        for meta in copied:
            if meta is not None:
                t = meta.tier
                hits[t] += 1
                nbytes[t] += meta.nbytes
                touched_at(meta, at)
        for t, count in enumerate(hits):
            if count:
                self.metrics.hot_hit(t, nbytes[t], share_ns, count)

    def _copy_hot(self, key: BlockKey, outs: Sequence[Any], skip: list[bool] | None = None,
                  later: list[tuple[int, Any, Any]] | None = None, index: int = 0) -> BlockMeta | None:
        """Under the lock: copy block ``key`` into ``outs`` if that is a hot hit (see
        :meth:`read_hot`); its metadata then, else None with nothing counted or changed.
        An error of the copy itself is counted as a missed get and raised (as in
        :meth:`read`). ``skip``, of a batch (:meth:`read_hot_many`): per tier, whether
        its blocks are left to the leased reads; a tier that declines a block is set so.
        ``later``, of a batch: a tier that defers its copies
        (:attr:`~cascade.tiers.base.Tier.defers_hot_copies`) gives its job instead,
        appended as (``index``, tier, job), not copied yet."""
        meta = self._blocks.get(key)
        if (meta is None or meta.ttl or meta.hints or (meta.tier and self._promote_on_hit)
                or self._inflight.closing):
            return None
        t = meta.tier
        if skip is not None and skip[t]:
            return None
        tier = self._tiers[t]
        if later is not None and tier.defers_hot_copies:
            job = tier.hot_copy_job(key, outs)
            if job is None:
                skip[t] = True
                return None
            later.append((index, tier, job))
            return meta
        try:
            if not tier.read_hot(key, outs):
                if skip is not None:
                    skip[t] = True
                return None
        except BaseException:
            self.metrics.counters.gets += 1
            self.metrics.miss()
            raise
        return meta

    def read(self, key: BlockKey, outs: Sequence[Any]) -> bool:
        """Copy block ``key`` into ``outs``: True on a hit, False on a miss (a corrupt
        copy is dropped and counted as a miss). Errors of the copy itself (an output
        that is no writable buffer, an I/O error) are raised, counted as a miss."""
        started = time.perf_counter()
        hit: bool | None = None  # counted (a hit or a miss)
        with self._inflight.hold(f"a get of {key[1]}") as op:
            try:
                with ExitStack() as held:
                    with self._lock:
                        self.metrics.counters.gets += 1
                        meta = self.cached(key)
                        if meta is not None:
                            t = meta.tier
                            lease = held.enter_context(Lease(self._lock, self.index, meta, t, self.chain.tiers[t]))
                            op.what = f"a get of {key[1]} holding a lease in {lease.tier.name}"
                            if not lease.tier.concurrent:  # e.g. REMOTE (MPI): its copy stays under the lock
                                error = self._copy(lease, outs)
                    if meta is None:
                        return self._read_from_cluster(key, outs, started)
                    if lease.tier.concurrent:
                        error = self._copy(lease, outs)
                    with self._lock:
                        hit = self._finish(lease, error, started)
                        promotion = None
                        if hit and self._promote_on_hit and self.index.holds(meta) and meta.tier > 0:
                            promotion = self.claim_promotion(meta)
            except BaseException:
                if hit is None:
                    with self._lock:
                        self.metrics.miss()
                raise
            if promotion is not None:
                op.what = f"a promotion of {key[1]} into {promotion.dst.tier.name}"
                self._promote(promotion, outs)
            return hit

    def read_leased(self, key: BlockKey, outs: Sequence[Any]) -> bool | None:
        """:meth:`read` of a block cached in a tier read outside the lock (the file tier
        into numpy ``outs``; the SHM and GPU tiers into any outputs, host or device), in
        two locked steps and no other guard: one looks the block up, leases it and counts
        the get in flight; the copy runs outside the lock; one counts the hit (or drops a
        corrupt block) and ends the lease and the in-flight count. None, with nothing
        counted or changed, for every other get (a miss here, a file-tier block and an
        output that is no numpy array of a :data:`~.batch_reads.BUFFER_KINDS` dtype, a promotion due,
        another tier, a closing store): the caller then takes :meth:`read`. An error of
        the copy that is not a corrupt copy ends both, is counted as a missed get and is
        raised. This saves the generic path's guards (about a third of a warm 64 KiB
        file-tier get, and of a GPU-tier get into device memory, on this project's VM);
        a get of a file-tier block in the page cache comes this way too (no file read
        runs under the lock: :mod:`cascade.tiers.file_reads`)."""
        started = time.perf_counter()
        lock = self._lock
        with lock:
            meta = self.cached(key)
            if meta is None or (meta.tier and self._promote_on_hit) or self._inflight.closing:
                return None
            tier = self._tiers[meta.tier]
            if not tier.concurrent or not (tier.reads_into_device or buffer_arrays(outs)):
                return None
            lease = Lease(lock, self.index, meta, meta.tier, tier)
            token = self._inflight.enter(Op("a get of %s holding a lease in %s", key[1], tier.name))  # open: no raise
            self.metrics.counters.gets += 1
        try:
            error = None
            try:
                tier.read_leased(lease.handle, outs)  # (lease.read(), written out: per get)
            except CorruptBlock as exc:
                error = exc
        except BaseException:
            with lock:
                lease.release()
                self._inflight.leave(token)
                self.metrics.miss()
            raise
        with lock:
            hit = None
            try:
                hit = self._count(lease, error, started, release=True)
            finally:
                if hit is None:  # the count itself raised: nothing stays held
                    lease.release()
                    self.metrics.miss()
                self._inflight.leave(token)
        return hit

    def view(self, key: BlockKey, spec: BlockSpec) -> "BlockView":
        """The block ``key`` as read-only arrays over its bytes in place while the ``with``
        block runs (a block in a zero-copy tier: SHM or GPU; its lease keeps the bytes
        there), else a private copy read into new arrays of ``spec``; None on a miss. The
        view's cost does not grow with the block's size; close() waits for open views."""
        return BlockView(self, key, spec)

    def read_any(self, key: BlockKey, outs: Sequence[Any]) -> bool:
        """:meth:`read_leased` when it applies, else :meth:`read`."""
        hit = self.read_leased(key, outs)
        return self.read(key, outs) if hit is None else hit

    def cached(self, key: BlockKey) -> BlockMeta | None:
        """Under the lock: the cached block of ``key``; an expired one is dropped."""
        meta = self.index.blocks.get(key)  # (index.get(), written out: per get)
        if (meta is not None and meta.ttl > 0 and self.index.expired(meta, time.monotonic())
                and self.chain.withdraw_and_drop(meta)):
            self.metrics.counters.expired += 1
            return None
        return meta

    @staticmethod
    def _copy(lease: Lease, outs: Sequence[Any]) -> CorruptBlock | None:
        """The leased bytes into ``outs``; a verification failure is returned. A tier
        that fills host memory only (file reads, MPI) gets host stand-ins for device
        outputs (:func:`cascade.buffers.host_outputs`)."""
        try:
            if lease.tier.reads_into_device:
                lease.read(outs)
            else:
                with host_outputs(outs) as hosts:
                    lease.read(hosts)
        except CorruptBlock as exc:
            return exc
        return None

    def _finish(self, lease: Lease, error: CorruptBlock | None, started: float) -> bool:
        """Under the lock, after the copy: end the lease, then count the hit (using up a
        hint) or drop a corrupt block (if still the one read). Whether it was a hit."""
        return self._count(lease, error, started, release=True)

    def _count(self, lease: Lease, error: CorruptBlock | None, started: float, *, release: bool = False) -> bool:
        """Under the lock: count the hit of a leased read (ending the lease first with
        ``release``), or a miss: a corrupt block is dropped (if still the one read), an
        unreadable one (:class:`UnreadableBlock`) kept. Whether it was a hit."""
        meta, t = lease.meta, lease.t
        unreadable = isinstance(error, UnreadableBlock)
        cached = error is not None and not unreadable and lease.current()  # asked only to drop a corrupt copy
        if release:
            lease.release()
        if error is not None:
            log.warning("%s", error)
            if unreadable:
                self.metrics.tiers[t].read_errors += 1
            else:
                self.metrics.tiers[t].corruptions += 1
            if cached:
                self.chain.drop_corrupt(meta)
            return self.metrics.miss()
        self.metrics.hits(t, meta.nbytes, time.perf_counter() - started, 1)
        self._used(meta, time.monotonic())
        return True

    def _used(self, meta: BlockMeta, at: float) -> None:
        """Under the lock, after a hit on ``meta`` (if still cached): use up a hint, tell
        the policy of the use at ``at`` (monotonic seconds), move a last-use TTL."""
        if self.index.blocks.get(meta.key) is meta:  # not deleted or replaced while we copied (index.holds())
            if meta.hints:  # the queued request it was hinted for has come
                self.index.release_hint(meta)
            self.index.touched_at(meta, at)
            if meta.ttl and self._ttl_on_use:  # the read moved its expiry: recorded with others later
                self.chain.persist_ttl(meta, batched=True)

    # -- promotion -------------------------------------------------------------------------
    def claim_promotion(self, meta: BlockMeta) -> Move | None:
        """Under the lock: room in the fastest tier to move ``meta`` up into, if it can be
        made without dropping pinned or parent blocks (best effort: the block counts as a
        child there meanwhile, so its own parent stays). Until the promotion ends, the
        block counts as being read (it stays where it is)."""
        with ExitStack() as undo:
            reading = undo.enter_context(Reading(self._lock, self.index, meta))
            with self.index.counted_in(meta, 0):
                claim = self.chain.claim_fastest(meta.key, meta.nbytes, meta.parent)
            if claim is None:
                return None
            undo.pop_all()
        return Move(reading, claim, meta.tier)

    def _promote(self, move: Move, data: Sequence[Any]) -> None:
        """Copy ``data`` (the block's bytes) into the claimed room, outside the lock when
        the caller holds none, then move the block there: its copy below goes once the
        directory points up."""
        with move:
            meta, src, dst = move.meta, move.src, move.dst
            filled = _fill_quietly(dst, data)
            with self._lock, atomic():  # committed up and moved in the index, or neither
                move.source.release()
                if not filled or not self.index.holds(meta) or meta.tier != src:
                    return  # deleted, replaced or promoted by another reader meanwhile
                dst.commit(meta.key)
                try:
                    self.chain.moved(meta, src, dst.t)
                except Busy:
                    return
                self.metrics.tiers[src].promotions += 1
                self.metrics.tiers[dst.t].bytes_written += meta.nbytes

    def hint(self, keys: Sequence[BlockKey], cap: float, position: float | None) -> tuple[int, list[BlockKey]]:
        """Under the lock: take a hint (at queue ``position``) on each cached block of
        ``keys`` while hinted blocks stay within ``cap`` bytes. Returns how many were
        taken and the keys of those below the fastest tier, to :meth:`promote_hinted`."""
        at = self.index.hint_position(position)
        taken, below = 0, []
        for key in keys:
            meta = self.cached(key)
            if meta is None or not self.index.take_hint(meta, cap, at):
                continue
            taken += 1
            if meta.tier > 0:
                below.append(key)
        return taken, below

    def promote_hinted(self, key: BlockKey) -> bool:
        """Without the lock (a worker's job): move a hinted block up to the fastest tier,
        copying outside the lock. Cancelled (False) when the block was read, unhinted,
        moved up or dropped meanwhile, or no room can be made; until the move ends the
        block stays readable where it is (a get reads the lower tier, never waits). As
        on a get, a corrupt record is dropped (if still the one read) and one that failed
        with an I/O error (:class:`UnreadableBlock`) is kept."""
        with self._inflight.hold(f"a hint's promotion of {key[1]}"), ExitStack() as staged, ExitStack() as held:
            with self._lock:
                meta = self.index.get(key)
                if meta is None or not meta.hints or meta.tier == 0:
                    return False
                lease = held.enter_context(Lease(self._lock, self.index, meta, meta.tier, self.chain.tiers[meta.tier]))
                move = self.claim_promotion(meta)
                if move is None:
                    return False
                held.enter_context(move)  # given back on any error below; _promote ends it normally
                device = Memory.DEVICE in (lease.tier.memory, move.dst.tier.memory)
                buf = staged.enter_context(staging_buffer(meta.nbytes, device=device))  # outlives held.pop_all()
                if not lease.tier.concurrent:  # e.g. REMOTE (MPI): its copy stays under the lock
                    error = self._copy(lease, [buf])
            if lease.tier.concurrent:
                error = self._copy(lease, [buf])
            with self._lock:
                current = error is not None and lease.current()
                lease.release()
                if error is not None:
                    held.close()  # the claim and the readings go back before the block is dropped
                    log.warning("%s", error)
                    if isinstance(error, UnreadableBlock):  # no evidence against the bytes: kept
                        self.metrics.tiers[lease.t].read_errors += 1
                    else:
                        self.metrics.tiers[lease.t].corruptions += 1
                        if current:
                            self.chain.drop_corrupt(meta)
                    return False
            held.pop_all()  # the move (and its reading) now belong to _promote
            self._promote(move, [buf])
            return True

    # -- other ranks -----------------------------------------------------------------------
    def _read_from_cluster(self, key: BlockKey, outs: Sequence[Any], started: float) -> bool:
        """A local miss: read the block from whichever rank published it, outside the
        store's lock (the multi-rank layer serialises its own calls)."""
        try:
            entry, error = self.chain.peers.read(key, outs), None
        except CorruptBlock as exc:
            entry, error = None, exc
        with self._lock:
            if error is not None:
                log.warning("%s", error)
                self.metrics.counters.cluster_corruptions += 1
            if entry is None:
                return self.metrics.miss()
            self.metrics.cluster_hit(started)
            claim = None
            if self._cache_cluster_reads and entry.rank != self._rank and not self._inflight.closing:
                claim = self.chain.claim_fastest(key, self._nbytes, None)
        if claim is not None:
            self._keep_private_copy(key, claim, outs)
        return True

    def _keep_private_copy(self, key: BlockKey, claim: Claim, data: Sequence[Any]) -> None:
        """Keep a block just read from another rank in the fastest tier, unpublished, so
        the next reads of a hot block stay local and its holder serves each rank once.
        Never shared; it may outlive the holder's copy (the same bytes: ids name
        content). Given up when another put stored the block meanwhile."""
        with claim:
            filled = _fill_quietly(claim, data)
            with self._lock:
                if filled and self.index.get(key) is None:
                    claim.commit(key)
                    self.index.admit(BlockMeta(key, self._nbytes, claim.t, ttl=self._ttl), time.monotonic())


def _fill_quietly(claim: Claim, data: Sequence[Any]) -> bool:
    """Copy ``data`` into claimed room; False on an I/O error (best-effort copies)."""
    try:
        claim.fill(data)
    except OSError as exc:
        log.debug("copy into %s failed: %s", claim.tier.name, exc)
        return False
    return True


def _split(data: Any, spec: BlockSpec) -> list[Any]:
    """A block's flat bytes ``data`` as its key and value arrays of ``spec`` (views, no
    copy); device (cupy) arrays of a type numpy does not define itself (bfloat16, float8)
    come as unsigned integers of its width (:func:`cascade.buffers.device_dtype`)."""
    half = spec.half_bytes
    dtype = spec.np_dtype if isinstance(data, np.ndarray) else device_dtype(spec.np_dtype)
    return [data[:half].view(dtype).reshape(spec.shape), data[half:2 * half].view(dtype).reshape(spec.shape)]


class BlockView:
    """:meth:`ReadPath.view`'s ``with`` block: entering takes the in-flight count and,
    for a block in a zero-copy tier, its lease, in one locked step (a class, not a
    generator and an ``ExitStack``: a quarter to a third of a small view's cost);
    exiting gives back both in one locked step. Whatever an error on the way in had taken is given back.
    One view is entered once: its arrays are valid only inside that ``with`` block, so a
    second entry (again or nested) raises ``RuntimeError``; call ``view()`` again."""

    __slots__ = ("_reads", "_key", "_spec", "_lease", "_token", "_entered")

    def __init__(self, reads: ReadPath, key: BlockKey, spec: BlockSpec) -> None:
        self._reads, self._key, self._spec = reads, key, spec
        self._lease: Lease | None = None
        self._token: int | None = None
        self._entered = False

    def __enter__(self) -> list[Any] | None:
        if self._entered:
            raise RuntimeError(f"a view of {self._key[1]} is entered once (its arrays are valid inside that with "
                               f"block only): call view() again")
        self._entered = True
        reads, key = self._reads, self._key
        started = time.perf_counter()
        try:
            with reads._lock:
                op = Op(f"a view of {key[1]}")
                self._token = reads._inflight.enter(op)
                meta = reads.cached(key)
                if meta is not None and reads._tiers[meta.tier].zero_copy:
                    tier = reads._tiers[meta.tier]
                    reads.metrics.counters.gets += 1
                    self._lease = Lease(reads._lock, reads.index, meta, meta.tier, tier)
                    op.what = f"a view of {key[1]} holding a lease in {tier.name}"
            lease = self._lease
            if lease is None:  # not in a zero-copy tier here: an ordinary read into our own arrays
                outs = list(self._spec.empty())
                return outs if reads.read_any(key, outs) else None
            try:
                data, error = lease.tier.leased_view(lease.handle), None
            except CorruptBlock as exc:
                data, error = None, exc
            with reads._lock:
                hit = reads._count(lease, error, started)
            return _split(data, self._spec) if hit else None
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        """Give back the lease and the in-flight count (idempotent)."""
        with self._reads._lock:
            if self._lease is not None:
                self._lease.release()
                self._lease = None
            if self._token is not None:
                self._reads._inflight.leave(self._token)
                self._token = None
