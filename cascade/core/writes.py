"""The write path of one store: a put, from the caller's arrays to a committed block.

A put is settled as a dedup when the block is already cached (here or, multi-rank, on
another rank); otherwise it claims room in the fastest tier that can make it (the tier
chain demotes to make it), copies outside the store's lock, and commits under it, then
publishes the block; a commit that leaves the fastest tier above its high watermark
wakes the background demoter (:mod:`.demoter`). Content-hashed puts of big blocks copy while a thread hashes. The
room claimed is a guard (:mod:`.guards`): any exception, the caller's bad input
included, gives it back, and the put is counted as rejected. Thread-safe.
"""
from __future__ import annotations

import threading
import time
from time import monotonic_ns
from collections.abc import Callable, Sequence
from concurrent.futures import wait
from contextlib import ExitStack
from typing import Any

import numpy as np

from ..buffers import host_bytes, one_sync
from ..distributed.store_layer import Solo
from ..errors import CorruptBlock, InvalidBlock, TierFull, lacks_room, put_error
from ..identity import BlockKey, block_id as compute_block_id, check_id
from ..policy import BlockMeta
from ..tiers.base import Memory
from .chain import TierChain
from .demoter import Demoter
from .guards import Claim, InFlight
from .pools import Pools
from .reads import HOT_COPY_MAX

_OVERLAP_MIN_BYTES = 256 << 10  # below this, handing the hash to a thread costs more than it saves
#: What one hot put did (WritePath._put_hot_locked): stored a new block, settled as a dedup, or refused.
_STORED, _SETTLED, _REFUSED = object(), object(), object()


class WritePath:
    """Puts of blocks of ``nbytes`` through ``chain``."""

    def __init__(self, chain: TierChain, inflight: InFlight, lock: threading.RLock, pools: Pools, demoter: Demoter, *,
                 nbytes: int, hash_algo: str, default_ttl: float) -> None:
        self.chain, self.index, self.metrics = chain, chain.index, chain.metrics
        self._demoter = demoter  # poked after each commit into the fastest tier
        self._inflight, self._lock, self._pools = inflight, lock, pools
        self._nbytes, self._algo, self._ttl = nbytes, hash_algo, default_ttl
        self._blocks, self._tiers = chain.index.blocks, chain.tiers  # (put_hot's lookups, fixed for the store's life)
        # whether put_hot may take a put (into the fastest tier, one that copies under the lock)
        self._hot = nbytes <= HOT_COPY_MAX and chain.share <= 0 and chain.tiers[0].hot_copies

    def content_id(self, parts: Sequence[Any]) -> str:
        """The content digest of a block's parts (its id when the caller gives none)."""
        return compute_block_id(*parts, algo=self._algo)

    def put(self, parts: list[Any], namespace: str, block_id: str | None, *, verify: bool,
            parent: str | None, ttl: float | None, priority: int) -> str:
        """Store ``parts`` (already checked) and return the block's id."""
        started = time.perf_counter()
        with self._inflight.hold(f"a put in namespace {namespace!r}") as op, ExitStack() as held:
            claim: Claim | None = None  # room taken in some tier, filled outside the lock
            if block_id is None or verify:
                claim, digest = self._hash_and_copy(parts, namespace, held)
                if block_id is not None and check_id(block_id) != digest:
                    raise InvalidBlock(f"block_id {block_id} does not match the content digest {digest}")
                block_id = digest
            key = (namespace, check_id(block_id))
            op.what = f"a put of {block_id}"
            block_sum = self.chain.peers.checksum(parts)  # published: every cross-rank read verifies
            with self._lock:
                self._inflight.check_open()
                self.index.check_parent(key, parent)
                self.metrics.counters.puts += 1
                if self._settled(key, parts):
                    return block_id
            committed = False  # after the commit, a failure is the directory's (publish), not a tier's
            try:
                if claim is None:
                    claim = held.enter_context(self.chain.claim_for_put(key, self._nbytes, parent))
                if not claim.filled:
                    claim.fill(parts)
                with self._lock:
                    # a put of the same id in another thread may have won meanwhile
                    if self._settled(key, parts, cluster=False):
                        return block_id
                    self.index.check_parent(key, parent)  # again: a put of another thread may close a cycle
                    claim.commit(key)  # a non-concurrent tier (REMOTE) copies only now
                    committed = True
                    meta = BlockMeta(key, self._nbytes, claim.t, parent=parent, priority=priority,
                                     ttl=self._ttl if ttl is None else ttl, checksum=block_sum)
                    if self._admit(meta, time.monotonic()):
                        self.metrics.stored(meta.tier, meta.nbytes, started)
                        if claim.t == 0:
                            self._demoter.poke()
                    return block_id
            except BaseException as exc:  # nothing was counted yet but the put itself
                with self._lock:
                    full = claim is not None and lacks_room(exc) and not committed
                    self.metrics.rejected(claim.t if full else None)
                error = put_error(exc, claim.tier.name if claim else "put")
                if error is exc:
                    raise
                raise error from exc

    def put_device_many(self, items: Sequence[tuple[list[Any], str, str | None]], namespace: str, *,
                        ttl: float | None, priority: int) -> list[str | BaseException]:
        """Puts of ``(parts, block_id, parent)`` (checked by the caller) whose parts are
        in device memory, in the calling thread: room claimed for all, every copy into
        device room enqueued on the inputs' streams (:func:`~cascade.buffers.one_sync`),
        each stream synchronised once, and only then all committed. A failed copy or
        synchronisation gives back every claim not yet committed (no block with
        unfinished bytes is ever visible) and is raised. Otherwise each entry is the id
        or the error of that put alone (the others still run)."""
        return self._put_claimed_many(items, namespace, ttl, priority, "device puts", _fill_on_streams)

    def put_host_many(self, items: Sequence[tuple[list[Any], str, str | None]], namespace: str, *,
                      ttl: float | None, priority: int) -> list[str | BaseException]:
        """Puts of ``(parts, block_id, parent)`` (checked by the caller) whose parts are
        host buffers, in the calling thread: room claimed for all, the copies into each
        tier's room made in one call per tier (:meth:`~cascade.tiers.base.Tier.fill_many`:
        one compiled copy of a host slab's, shared with the copy helper and streamed as
        one copy of their sum), then all committed. Per block this saves :meth:`put`'s
        in-flight guard, its extra locked step, and a copy call. Each entry is the id or
        the error of that put alone (a failed fill included: the others still run); an
        interruption during the copies gives back every claim not yet committed and is
        raised."""
        return self._put_claimed_many(items, namespace, ttl, priority, "puts", _fill_by_tier)

    def _put_claimed_many(self, items: Sequence[tuple[list[Any], str, str | None]], namespace: str,
                          ttl: float | None, priority: int, what: str,
                          fill_all: Callable[[list[tuple[Claim, list[Any]]]], list[Exception | None]]
                          ) -> list[str | BaseException]:
        """The body of :meth:`put_device_many` and :meth:`put_host_many`: each put
        settled as a dedup or given a claim, then ``fill_all`` of the claims and their
        parts (each fill's error in its place; raising: nothing of the batch is
        committed), then each filled claim committed."""
        started = time.perf_counter()
        done: list[str | BaseException | None] = [None] * len(items)
        claims: dict[int, Claim] = {}
        with self._inflight.hold(f"a batch of {len(items)} {what} in namespace {namespace!r}"), ExitStack() as held:
            sums = [self.chain.peers.checksum(parts) for parts, _, _ in items]  # before any copy is deferred
            for i, (parts, block_id, parent) in enumerate(items):
                key = (namespace, block_id)
                try:
                    with self._lock:
                        self._inflight.check_open()
                        self.metrics.counters.puts += 1  # (first: a refusal below is a counted rejection)
                        self.index.check_parent(key, parent)
                        if self._settled(key, parts):
                            done[i] = block_id
                            continue
                    claims[i] = held.enter_context(self.chain.claim_for_put(key, self._nbytes, parent))
                except Exception as exc:  # this put's own error
                    done[i] = self._rejected(exc, None)
            try:
                failed = fill_all([(claim, items[i][0]) for i, claim in claims.items()])
            except BaseException:  # nothing of the batch is committed
                with self._lock:
                    for claim in claims.values():
                        claim.discard()
                        self.metrics.rejected(None)
                raise
            for i, error in zip(list(claims), failed):
                if error is not None:
                    done[i] = self._rejected(error, claims.pop(i))
            for i, claim in claims.items():
                parts, block_id, parent = items[i]
                key = (namespace, block_id)
                committed = False
                try:
                    with self._lock:
                        if self._settled(key, parts, cluster=False):  # the same id earlier in the batch
                            done[i] = block_id
                            continue
                        self.index.check_parent(key, parent)  # again: blocks of this batch may close a cycle
                        claim.commit(key)
                        committed = True
                        meta = BlockMeta(key, self._nbytes, claim.t, parent=parent, priority=priority,
                                         ttl=self._ttl if ttl is None else ttl, checksum=sums[i])
                        if self._admit(meta, time.monotonic()):
                            self.metrics.stored(meta.tier, meta.nbytes, started)
                            if claim.t == 0:
                                self._demoter.poke()
                        done[i] = block_id
                except Exception as exc:
                    done[i] = self._rejected(exc, None if committed else claim)
        return done  # type: ignore[return-value]

    def _rejected(self, exc: Exception, claim: Claim | None) -> Exception:
        """Count a failed put as :meth:`put` counts it (room lacking in ``claim``'s tier
        for a full device); the error to report (:func:`~cascade.errors.put_error`)."""
        full = claim is not None and lacks_room(exc)
        with self._lock:
            if claim is not None:
                claim.discard()
            self.metrics.rejected(claim.t if full else None)
        return put_error(exc, claim.tier.name if claim else "put")

    def put_hot(self, parts: Sequence[Any], namespace: str, block_id: str, parent: str | None,
                ttl: float | None, priority: int) -> str | None:
        """A put of a small block (:data:`~.reads.HOT_COPY_MAX`) with a known id in one
        locked step: dedup, or the fastest tier's room, copy and commit in one call where
        it has the room free already, no demotion (:meth:`~cascade.tiers.base.Tier.store_hot`:
        SHM), then admit. The lock held throughout stands in for the in-flight count and
        the claim (nothing can take the room or move the block meanwhile). None, with
        nothing counted or changed, when it is not such a put (a bigger block, a tier that
        cannot copy under the lock or has no free room, namespace shares, a closing store,
        ``parts`` that are not host buffers of the block's size): the caller then takes
        :meth:`put`. Parts, namespace, id, parent and options are checked by the caller
        (a batch checks its ids once, before any of them is stored).

        It runs per block, so it is one call, denser than :meth:`put`: a store alone (no
        peers) skips the calls that only matter to other ranks (the dedup query, the
        checksum they verify, the publish), an absent id skips the dedup check, and one
        pair of monotonic clock readings in integer nanoseconds gives the latency."""
        if not self._hot:
            return None
        lock = self._lock
        lock.acquire()  # (not ``with``: see ReadPath.read_hot; the finally gives it back alike)
        try:
            if self._inflight.closing:
                return None
            started = monotonic_ns()
            done = self._put_hot_locked(parts, (namespace, block_id), parent, ttl, priority, started)
            if done is _STORED:
                self.metrics.hot_stored(self._nbytes, monotonic_ns() - started)
                if self._demoter.enabled:  # (poke() checks it too: one call less per put when off)
                    self._demoter.poke()
            return None if done is _REFUSED else block_id
        finally:
            lock.release()

    def put_hot_many(self, items: Sequence[tuple[Sequence[Any], str, str | None]], namespace: str, *,
                     ttl: float | None, priority: int) -> list[str | BaseException | None]:
        """:meth:`put_hot` of each ``(parts, block_id, parent)`` in one locked step, with
        one counting call and one demoter poke for all (each stored put is timed as an
        equal share of the step); ids checked by the caller. Each entry is the id, None
        (not such a put), or the error that put raised: the others still run."""
        done: list[str | BaseException | None] = [None] * len(items)
        if not self._hot:
            return done
        with self._lock:
            if self._inflight.closing:
                return done
            stored = 0
            started = monotonic_ns()
            try:
                for i, (parts, block_id, parent) in enumerate(items):
                    try:
                        put = self._put_hot_locked(parts, (namespace, block_id), parent, ttl, priority, started)
                    except Exception as exc:  # this put's own error (counted): the others still run
                        done[i] = exc
                        continue
                    if put is not _REFUSED:
                        done[i] = block_id
                        stored += put is _STORED
            finally:  # what was stored is counted, whatever ends the loop
                if stored:
                    self.metrics.hot_stored(self._nbytes * stored, (monotonic_ns() - started) // stored, stored)
                    if self._demoter.enabled:
                        self._demoter.poke()
        return done

    def _put_hot_locked(self, parts: Sequence[Any], key: BlockKey, parent: str | None, ttl: float | None,
                        priority: int, now_ns: int) -> object:
        """Under the lock, of an open store: the put of :meth:`put_hot` but for counting a
        stored block and poking the demoter; a new block is used at ``now_ns`` (the locked
        step's start, ``time.monotonic_ns()``). :data:`_STORED` (a new block, admitted: not
        counted yet), :data:`_SETTLED` (a dedup, here or onto another rank's copy:
        counted) or :data:`_REFUSED` (not such a put: nothing counted or changed). A
        failed copy, admission or publish is counted as a rejected put and raised."""
        if parent is not None:
            self.index.check_parent(key, parent)
        peers = self.chain.peers
        alone = type(peers) is Solo
        if not alone or key in self._blocks:
            if not (parts[0].flags.c_contiguous and parts[1].flags.c_contiguous):
                return _REFUSED  # put() refuses such input, a dedup too: never settled unchecked
            if self._settled(key, parts):
                self.metrics.counters.puts += 1
                return _SETTLED
        tier = self._tiers[0]
        try:
            if not tier.store_hot(key, parts, self._nbytes):  # no room as it is, or parts it cannot copy
                return _REFUSED
        except BaseException as exc:  # the copy failed, its room given back: a rejected put, as put() counts it
            self.metrics.counters.puts += 1
            self.metrics.rejected(0 if lacks_room(exc) else None)
            error = put_error(exc, tier.name)
            if error is exc:
                raise
            raise error from exc
        try:  # committed: a failure now is the index's or the directory's (publish), not the tier's
            meta = BlockMeta(key, self._nbytes, 0, parent)  # (keywords cost here: the rest set if not 0)
            meta.ttl = self._ttl if ttl is None else ttl
            if priority:
                meta.priority = priority
            if not alone:
                meta.checksum = peers.checksum(parts)
            admitted = self._admit(meta, now_ns * 1e-9)
        except BaseException:
            self.metrics.counters.puts += 1
            self.metrics.rejected(None)
            raise
        if admitted:
            return _STORED
        self.metrics.counters.puts += 1  # deduped onto another rank's copy (counted by _admit)
        return _SETTLED

    def _admit(self, meta: BlockMeta, now: float) -> bool:
        """Under the lock, once committed: enter the block in the index (used at ``now``,
        ``time.monotonic()``) and publish it. False when another rank published it first
        (ours dropped, counted a dedup)."""
        index = self.index
        if index.unconfirmed:
            index.unconfirmed.discard(meta.key)
        index.admit(meta, now)
        if meta.ttl:
            self.chain.persist_ttl(meta)
        peers = self.chain.peers
        if type(peers) is Solo:  # nobody to publish to
            return True
        try:
            published = peers.publish(meta)
        except BaseException:  # e.g. DirectoryFull: a rejected put stores nothing
            if index.holds(meta):
                self.chain.drop(meta)
            raise
        if not published:
            self.chain.drop(meta)
            self.metrics.counters.deduped += 1  # another rank published it first: use theirs
            self.metrics.counters.cluster_deduped += 1
        return published

    def _settled(self, key: BlockKey, parts: list[Any], *, cluster: bool = True) -> bool:
        """Under the lock, before a put stores: settle it as a dedup (counted) when
        ``key`` is cached here (or, with ``cluster``, published by another rank). Drops
        an expired copy (or an unconfirmed one with other bytes) first."""
        now = time.monotonic()
        meta = self.index.get(key)
        if meta is not None and not self.index.expired(meta, now) and self._confirmed(meta, parts):
            meta.shares += 1
            self.index.touched(meta)
            self.metrics.counters.deduped += 1
            return True
        if meta is not None and not self.chain.withdraw_and_drop(meta):
            self.metrics.counters.deduped += 1  # expired but pinned by another rank: keep serving it
            return True
        if cluster and self.chain.peers.held_elsewhere(key):
            self.metrics.counters.deduped += 1
            self.metrics.counters.cluster_deduped += 1
            return True
        return False

    def _confirmed(self, meta: BlockMeta, parts: list[Any]) -> bool:
        """Whether a put of ``parts`` may dedup onto ``meta``. A block found on disk at
        open is compared once with the first put of its id: different bytes (a stale or
        planted record) make the put replace it instead, unless it is pinned (the put
        then settles on the pinned copy; a put after the unpin compares again)."""
        if meta.key not in self.index.unconfirmed:
            return True
        if meta.pins:  # a reader holds this copy: the put settles on it (a later one, once unpinned, compares)
            return True
        stored = np.empty(meta.nbytes, dtype=np.uint8)
        try:
            self.chain.tiers[meta.tier].read_into(meta.key, stored)
        except (CorruptBlock, OSError):
            return False
        incoming = np.concatenate([host_bytes(p, "block part") for p in parts])
        if not np.array_equal(stored, incoming):
            self.metrics.counters.replaced_unconfirmed += 1
            return False
        self.index.unconfirmed.discard(meta.key)
        return True

    def _hash_and_copy(self, parts: list[Any], namespace: str, held: ExitStack) -> tuple[Claim | None, str]:
        """The content digest of a block, and (for blocks big enough, on a memory tier)
        its bytes copied into fresh room of the fastest tier while another thread hashes
        (BLAKE3 and SHA-256 release the GIL): the put costs max(copy, hash), not the
        sum. The room returned is held by ``held``."""
        fastest = self.chain.tiers[0]
        if (self._nbytes < _OVERLAP_MIN_BYTES or not fastest.concurrent
                or fastest.memory not in (Memory.HOST, Memory.DEVICE)):
            return None, self.content_id(parts)
        pending = self._pools.hasher().submit(compute_block_id, *parts, algo=self._algo)
        claim = None
        try:
            with self._lock:
                claim = held.enter_context(self.chain.claim(0, None, self._nbytes, namespace=namespace))
            claim.fill(parts)
        except TierFull:  # the fastest tier is full of pinned blocks: the put claims elsewhere
            if claim is not None:
                with self._lock:
                    claim.discard()
            claim = None
        except BaseException:
            wait([pending])
            raise
        return claim, pending.result()


def _fill_on_streams(claims: list[tuple[Claim, list[Any]]]) -> list[Exception | None]:
    """Every claim's copy enqueued on its parts' streams, each stream synchronised once
    (:func:`~cascade.buffers.one_sync`): any failure is raised, for all of them."""
    with one_sync([p for _, parts in claims for p in parts], sources=True) as batch:
        fill = batch.bind(Claim.fill)
        for claim, parts in claims:
            fill(claim, parts)
    return [None] * len(claims)


def _fill_by_tier(claims: list[tuple[Claim, list[Any]]]) -> list[Exception | None]:
    """The claims of each tier filled in one call (:meth:`~cascade.tiers.base.Tier.fill_many`):
    each fill's error in its place."""
    errors: list[Exception | None] = [None] * len(claims)
    by_tier: dict[int, list[int]] = {}
    for j, (claim, _) in enumerate(claims):
        by_tier.setdefault(claim.t, []).append(j)
    for members in by_tier.values():
        tier = claims[members[0]][0].tier
        filled = tier.fill_many([claims[j][0].handle for j in members], [claims[j][1] for j in members])
        for j, error in zip(members, filled):
            errors[j] = error
            claims[j][0].filled = error is None
    return errors
