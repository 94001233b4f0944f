"""The multi-rank layer of a :class:`~cascade.store.CascadeStore`: what the store does
beside its local tiers when it is one rank of a job.

The store calls the same methods in every run; :class:`Solo` (one rank, no MPI) answers
them without doing anything, :class:`Joined` (a communicator of more than one rank)
keeps the global directory true for this rank's blocks through a
:class:`~.cluster.Cluster`:

* a block is *published* (tier kind, the rank holding the bytes, location, XXH3-64 of the
  bytes) once stored, *republished* when it moves between tiers, and *withdrawn* before
  its bytes are freed; moves and withdrawals are refused while another rank pins it
  (withdrawals also while another rank caches a child, when asked);
* a put of a block another rank already publishes is a cluster-wide dedup;
* a local miss reads the block from whichever rank publishes it;
* pins taken on another rank's copy are this rank's own and only it releases them.

Local (one-sided MPI) except :meth:`Joined.close`, which is collective. Thread-safe:
:class:`Joined` runs one call at a time (its own lock), so the store reads other ranks'
blocks without holding its lock, and calls everything else under it (lock order: the
store's, then this one's).
"""
from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..checksum import checksum
from ..errors import BlockNotFound, BlockPinned
from ..tiers.base import TierKind
from .agree import DEFAULT_TIMEOUT as AGREE_TIMEOUT

if TYPE_CHECKING:
    from ..policy import BlockMeta
    from ..identity import BlockKey
    from ..tiers.base import Tier
    from .cluster import Cluster
    from .directory import DirectoryEntry


_F = TypeVar("_F", bound=Callable[..., Any])
log = logging.getLogger(__name__)


def _serialized(method: _F) -> _F:
    """Run ``method`` under the layer's lock (the directory and RMA helpers are not
    thread-safe)."""
    @functools.wraps(method)
    def locked(self: "Joined", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)
    return locked  # type: ignore[return-value]


def parts_checksum(parts: Sequence[Any]) -> int:
    """XXH3-64 of a block's bytes (any buffers; device memory is copied to the host)."""
    return checksum(parts)


class Solo:
    """A store on its own: nothing is published, nothing is held elsewhere."""

    cluster: Cluster | None = None

    def checksum(self, parts: Sequence[Any]) -> int:
        return 0  # nobody else reads this store's bytes

    def recovered(self, meta: BlockMeta) -> bool:
        return True

    def count_recovered_children(self) -> None:
        pass

    def held_elsewhere(self, key: BlockKey) -> bool:
        return False

    def publish(self, meta: BlockMeta) -> bool:
        return True

    def republish(self, meta: BlockMeta, t: int) -> bool:
        return True

    def relocated(self, meta: BlockMeta) -> None:
        pass

    def withdraw(self, meta: BlockMeta, *, leaf_only: bool) -> bool:
        return True

    def read(self, key: BlockKey, outs: Sequence[Any]) -> DirectoryEntry | None:
        return None

    def found_elsewhere(self, keys: Sequence[BlockKey]) -> list[bool]:
        return [False] * len(keys)

    def pin(self, key: BlockKey, meta: BlockMeta | None) -> None:
        if meta is None:
            raise BlockNotFound(f"no block {key[1]} in namespace {key[0]!r}")

    def release_foreign_pin(self, key: BlockKey) -> bool:
        return False

    def unpinned(self, meta: BlockMeta) -> None:
        pass

    def not_pinned(self, key: BlockKey, meta: BlockMeta | None) -> Exception:
        if meta is None:
            return BlockNotFound(f"no block {key[1]} in namespace {key[0]!r}")
        return BlockPinned(f"block {key[1]} is not pinned")

    def close(self, ok: bool = True, timeout: float = AGREE_TIMEOUT) -> None:
        pass


class Joined(Solo):
    """One rank of a multi-rank store (see the module docstring). ``tiers`` are the
    store's tiers (fastest first), ``rank`` this rank."""

    def __init__(self, cluster: Cluster, tiers: Sequence[Tier], rank: int) -> None:
        self.cluster = cluster
        self.tiers = tiers
        self.rank = rank
        self._foreign_pins: dict[BlockKey, int] = {}  # pins this rank took on blocks it does not hold
        self._uncounted: set[BlockKey] = set()  # published while no rank listed the parent: no child count taken
        self._recovered: list[BlockMeta] = []  # republished at open, their child counts not taken yet
        self._lock = threading.RLock()

    def checksum(self, parts: Sequence[Any]) -> int:
        return parts_checksum(parts)

    @_serialized
    def recovered(self, meta: BlockMeta) -> bool:
        """Publish a block found on disk at start (its checksum read back first), without
        its parent's child count: every rank republishes at once, and the parent may not
        be listed yet (:meth:`count_recovered_children` counts it once every rank's blocks
        are). :class:`CorruptBlock` when its bytes fail verification."""
        buf = np.empty(meta.nbytes, dtype=np.uint8)
        self.tiers[meta.tier].read_into(meta.key, buf)
        meta.checksum = parts_checksum([buf])
        published = self._publish(meta, None)
        if meta.parent is not None and meta.entry is not None:
            self._uncounted.add(meta.key)  # until counted: a withdrawal meanwhile gives none back
            self._recovered.append(meta)
        return published

    @_serialized
    def count_recovered_children(self) -> None:
        """After every rank republished its blocks (a collective step of the caller's):
        count each recovered block still listed as ours among its parent's children."""
        recovered, self._recovered = self._recovered, []
        for meta in recovered:
            if meta.key in self._uncounted and self.cluster.add_child(meta.key[0], meta.parent):
                self._uncounted.discard(meta.key)

    @_serialized
    def held_elsewhere(self, key: BlockKey) -> bool:
        entry = self.cluster.lookup(key)
        return entry is not None and self._theirs(entry) and self.cluster.readable(entry)

    def _theirs(self, entry: DirectoryEntry) -> bool:
        """Whether another rank published ``entry`` (a REMOTE-tier entry names the rank
        whose window holds the bytes, never the rank that put them)."""
        return entry.rank != self.rank or entry.tier == TierKind.REMOTE

    def _placement(self, meta: BlockMeta, t: int | None = None) -> tuple[Any, int, int]:
        """(tier kind, rank holding the bytes, location) of a local block in tier ``t``
        (default: its tier)."""
        tier = self.tiers[meta.tier if t is None else t]
        if tier.kind is TierKind.REMOTE:
            rank, location, _ = tier.location(meta.key)
            return tier.kind, rank, location
        location = tier.location(meta.key) if tier.kind is TierKind.FILE else tier.offset(meta.key)
        return tier.kind, self.rank, location

    @_serialized
    def publish(self, meta: BlockMeta) -> bool:
        """Announce a local block in the directory. False when another rank's readable
        copy won the race (the caller drops ours and counts a dedup). All or nothing: on
        an exception nothing is published."""
        return self._publish(meta, meta.parent)

    def _publish(self, meta: BlockMeta, parent: str | None) -> bool:
        """:meth:`publish`, counting the block among ``parent``'s children (None: not)."""
        kind, rank, location = self._placement(meta)  # REMOTE: the rank whose window holds it
        inserted, entry, counted = self.cluster.publish(meta.key, kind, rank, location, meta.nbytes, parent,
                                                        checksum=meta.checksum)
        if inserted:
            meta.entry = entry
            if parent is not None and not counted:  # no rank listed the parent: nothing to give back
                self._uncounted.add(meta.key)
            return True
        # not theirs, or unreadable here: a private copy (ours serves this rank)
        return not self._theirs(entry) or not self.cluster.readable(entry)

    @_serialized
    def republish(self, meta: BlockMeta, t: int) -> bool:
        """Point our directory entry at the block's copy in tier ``t``. False (nothing
        changed) while another rank pins it."""
        if meta.entry is None:
            return True
        kind, rank, location = self._placement(meta, t)
        entry = self.cluster.move(meta.key, meta.entry, kind, rank, location)
        if entry is None:
            return False
        meta.entry = entry
        return True

    @_serialized
    def relocated(self, meta: BlockMeta) -> None:
        """Our copy moved within its tier (file-tier compaction): point our entry at it,
        so readers of the old place retry at the new one instead of missing."""
        if meta.entry is None:
            return
        _, _, location = self._placement(meta)
        entry = self.cluster.relocate(meta.key, meta.entry, location)
        if entry is not None:
            meta.entry = entry

    @_serialized
    def withdraw(self, meta: BlockMeta, *, leaf_only: bool) -> bool:
        """Remove our directory entry before the bytes go. False while another rank
        pins the block (or, with ``leaf_only``, caches a child of it)."""
        if meta.entry is None:
            return True
        from .directory import Removal

        parent = None if meta.key in self._uncounted else meta.parent
        outcome = self.cluster.withdraw(meta.key, meta.entry, parent, leaf_only=leaf_only)
        if outcome in (Removal.PINNED, Removal.HAS_CHILDREN):
            return False
        meta.entry = None
        self._uncounted.discard(meta.key)
        return True

    @_serialized
    def read(self, key: BlockKey, outs: Sequence[Any]) -> DirectoryEntry | None:
        """A local miss: read the block from whichever rank publishes it (verified)."""
        return self.cluster.read(key, outs)

    @_serialized
    def found_elsewhere(self, keys: Sequence[BlockKey]) -> list[bool]:
        """Whether another rank's readable copy of each key (not cached here) is listed:
        this rank's own entry never counts (a block of ours the caller did not find, e.g.
        expired, is not found elsewhere)."""
        return [e is not None and not self._our_entry(key, e) and self.cluster.readable(e)
                for key, e in zip(keys, self.cluster.lookup_many(list(keys)))]

    def _our_entry(self, key: BlockKey, entry: DirectoryEntry) -> bool:
        """Whether this rank published ``entry``: one naming this rank outside the REMOTE
        tier, or a REMOTE one for a block in this rank's REMOTE tier."""
        if entry.tier != TierKind.REMOTE:
            return entry.rank == self.rank
        return any(t.kind is TierKind.REMOTE and key in t for t in self.tiers)

    @_serialized
    def pin(self, key: BlockKey, meta: BlockMeta | None) -> None:
        """Pin cluster-wide (the holder can then neither move nor drop it)."""
        if meta is None or meta.entry is not None:
            try:
                self.cluster.pin(key)
            except BlockNotFound:
                if meta is None:
                    raise BlockNotFound(f"no block {key[1]} in namespace {key[0]!r} on any rank") from None
        if meta is None:
            self._foreign_pins[key] = self._foreign_pins.get(key, 0) + 1

    @_serialized
    def release_foreign_pin(self, key: BlockKey) -> bool:
        """Release one pin this rank took on another rank's copy; False if it has none."""
        if not self._foreign_pins.get(key):
            return False
        from .directory import PinUnderflow

        try:
            self.cluster.unpin(key)
        except (PinUnderflow, BlockNotFound):
            pass  # the directory entry went with the rank holding it: nothing to release
        self._foreign_pins[key] -= 1
        if not self._foreign_pins[key]:
            del self._foreign_pins[key]
        return True

    @_serialized
    def unpinned(self, meta: BlockMeta) -> None:
        """Give back the directory's pin of a block this rank pinned (the local count is
        already down): an entry gone meanwhile has no pin left to give back."""
        if meta.entry is not None:
            from .directory import PinUnderflow

            try:
                self.cluster.unpin(meta.key)
            except (PinUnderflow, BlockNotFound):
                log.warning("unpin of %s: its directory entry holds no pin of ours", meta.key[1])

    @_serialized
    def not_pinned(self, key: BlockKey, meta: BlockMeta | None) -> Exception:
        """What an unpin this rank cannot honour raises: :class:`BlockNotFound` for a
        block no rank lists, else :class:`BlockPinned` (pins are per rank)."""
        if meta is None and self.cluster.lookup(key) is None:
            return BlockNotFound(f"no block {key[1]} in namespace {key[0]!r} on any rank")
        return BlockPinned(f"block {key[1]} is not pinned by rank {self.rank} "
                           "(pins are per rank: unpin on the rank that pinned it)")

    @_serialized
    def close(self, ok: bool = True, timeout: float = AGREE_TIMEOUT) -> None:
        """Collective: agree with every rank on how its close went (``ok``: ours went
        well), which also waits (up to ``timeout`` seconds) until every rank has stopped
        reading (entered close), then free the windows. Before the store closes its tiers. Raises
        :class:`~.agree.PeerStepFailed` (windows freed) when another rank's close failed,
        :class:`~cascade.errors.RankFailure` (windows kept: freeing them would hang) when
        some rank never arrived."""
        from .agree import PeerStepFailed

        try:
            self.cluster.drain(ok, timeout)
        except PeerStepFailed:
            self.cluster.close()
            raise
        self.cluster.close()
