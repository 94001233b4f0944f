"""The calls of :class:`~cascade.store.CascadeStore` on blocks already cached (mixed into
it): scheduler hints, deletes, pins, TTLs and priorities. Each checks its ids, sees the
non-blocking puts submitted before it, and changes the block under the store's lock;
a hint's promotions run on the non-blocking-call threads. Thread-safe, local."""
from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Future

from ..errors import BlockNotFound, BlockPinned, StoreClosed
from ..identity import DEFAULT_NAMESPACE, BlockKey, check_namespace
from ..policy import BlockMeta, check_position
from ..validate import check_priority, check_ttl

log = logging.getLogger("cascade.store")


class BlockCalls:
    """Hints, deletes, pins, TTLs and priorities of cached blocks (uses the store's checks
    and layers: ``_key``, ``_keys``, ``_async``, ``_inflight``, ``_lock``, ``_reads``,
    ``_index``, ``_chain``, ``_expiry``, ``config``, ``tiers``, ``counters``)."""

    # -- scheduler hints ----------------------------------------------------------------
    def hint(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE,
             position: float | None = None) -> int:
        """Blocks a queued request will read soon: move each cached one up to the
        fastest tier (best effort, in the background: the call returns at once and the
        copies run on the I/O workers outside the store's lock, cancelled when the block is
        read or unhinted first; the store's ``flush()`` waits for them) and evict it only
        after every unhinted block, until a ``get`` / ``get_into`` of it (one get uses up
        its soonest hint) or :meth:`unhint`. Hints count: a block hinted for two queued requests stays hinted
        until both read it. ``position`` is the request's place in the queue (e.g. its
        arrival number; default: after every earlier hint): among hinted blocks the one
        whose next hinted use comes last goes first.

        Hinted blocks hold at most ``config.hint_fraction`` of the fastest tier's bytes:
        a hint that would go past the cap, and a hint of a block not cached on this
        rank, is ignored. Returns how many hints were taken. :class:`ConfigError` for a
        position that is not a finite number. Local (other ranks' blocks are not
        hinted); thread-safe.
        """
        keys = self._keys(block_ids, namespace, "hint")
        self._async.wait_for_puts(keys)  # a hint after a put_async of an id sees it
        with self._inflight.hold(f"a hint of {len(keys)} blocks"), self._lock:
            taken, below = self._reads.hint(keys, self.config.hint_fraction * self.tiers[0].capacity, position)
            self.counters.hints += taken
        for key in below:  # copies on the I/O workers, outside the lock: flush() waits for them
            try:
                promotion = self._async.submit(lambda key=key: self._reads.promote_hinted(key))
            except StoreClosed:  # a close() since the hints were taken: their promotions (best effort) are moot
                break
            promotion.add_done_callback(_log_failure)
        return taken

    def unhint(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE,
               position: float | None = None) -> int:
        """Withdraw one hint of each id (its request left the queue unserved): the one
        given at ``position``, else the soonest; ids without a hint are skipped. Returns
        how many hints were withdrawn. :class:`ConfigError` for a position that is not a
        finite number. Local."""
        keys = self._keys(block_ids, namespace, "unhint")
        if position is not None:
            check_position(position)  # (not taken as the latest position: later hints' default stays)
        with self._lock:
            return self._index.unhint(keys, position)


    def delete(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Remove a block. :class:`BlockNotFound` if absent, :class:`BlockPinned` if pinned."""
        bkey = self._key(block_id, namespace)
        self._async.wait_for_puts([bkey])  # a delete after a put_async of it sees it
        with self._lock:
            meta = self._require(bkey)
            if meta.pins or not self._chain.withdraw_and_drop(meta):
                raise BlockPinned(f"block {block_id} is pinned by an in-flight request; unpin it first")
            self.counters.deletes += 1

    def clear(self, *, namespace: str | None = None) -> int:
        """Drop every unpinned block (of ``namespace``, or of all); returns how many went.
        Local: in multi-rank runs only this rank's blocks (other ranks' pins are kept)."""
        self._inflight.check_open()
        if namespace is not None:
            check_namespace(namespace)
        with self._lock:
            dropped = sum(1 for meta in self._index
                          if namespace in (None, meta.key[0]) and not meta.pins and self._chain.withdraw_and_drop(meta))
            self.counters.deletes += dropped
            return dropped

    def pin(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Add a reference from an in-flight request: the block cannot be evicted or
        expire until the matching :meth:`unpin`."""
        bkey = self._key(block_id, namespace)
        self._async.wait_for_puts([bkey])  # a pin after a put_async of it sees it
        with self._lock:
            meta = self._reads.cached(bkey)  # an expired block is gone, not brought back
            self._chain.peers.pin(bkey, meta)  # cluster-wide: the holder cannot move or drop it
            if meta is not None:
                meta.pins += 1
                self._index.changed(meta)

    def unpin(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Drop one reference taken by :meth:`pin`."""
        with self._lock:
            bkey = self._key(block_id, namespace)
            peers = self._chain.peers
            if peers.release_foreign_pin(bkey):  # a pin taken on another rank's copy
                return
            meta = self._index.get(bkey)
            if meta is None or meta.pins == 0:
                raise peers.not_pinned(bkey, meta)
            meta.pins -= 1
            peers.unpinned(meta)
            self._index.changed(meta)

    def set_ttl(self, block_id: str, ttl: float, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Give a block a time to live in seconds (0 = none), counted per ``ttl_mode``."""
        ttl = check_ttl(ttl)
        bkey = self._key(block_id, namespace)
        self._async.wait_for_puts([bkey])
        with self._lock:
            meta = self._require(bkey)
            meta.ttl = ttl
            self._index.changed(meta)
            self._chain.persist_ttl(meta)
            if ttl:
                self._expiry.enter(meta, self._index.expires_at(meta))

    def set_priority(self, block_id: str, priority: int, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Raise (or lower, negative) a block's value: each step doubles (halves) it."""
        priority = check_priority(priority)
        bkey = self._key(block_id, namespace)
        self._async.wait_for_puts([bkey])
        with self._lock:
            meta = self._require(bkey)
            meta.priority = priority
            self._index.changed(meta)

    def _require(self, bkey: BlockKey) -> BlockMeta:
        """Under the lock: the cached block of a checked key; :class:`BlockNotFound` when
        there is none or it expired (then dropped)."""
        meta = self._reads.cached(bkey)
        if meta is None:
            raise BlockNotFound(f"no block {bkey[1]} in namespace {bkey[0]!r}")
        return meta


def _log_failure(future: Future) -> None:
    """A background promotion that raised (nobody waits on its future): say so."""
    if not future.cancelled() and future.exception() is not None:
        log.warning("a hinted block's promotion failed: %s", future.exception())
