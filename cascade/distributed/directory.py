"""The global block directory: ``(namespace, id) -> DirectoryEntry``, sharded over ranks.

Design
------
The owner of a key is ``identity.id_owner(id, comm.size)`` (first 8 id bytes mod size).
Every rank exposes its shard as one ``Win.Allocate`` window holding a fixed
open-addressing table of fixed-size entries (see :mod:`.layout`), and every operation is
one-sided: the calling rank reads and updates the owner's memory with ``Get``,
``Compare_and_swap``, ``Fetch_and_op`` and ``Accumulate`` inside a ``Lock_all`` epoch
opened once at construction, each operation completed with ``Flush`` (these primitives,
and the bucket lock below: :mod:`.directory_shard`). No rank serves requests, so no rank
funnels the job: load spreads with the (uniform) ids, and a rank busy in Python does not
delay lookups into its shard (tests/mpi/test_directory_mpi.py measures it). Rejected: a
fresh ``Lock`` per operation (with MPICH it waits for the target to enter MPI),
``Create_dynamic`` windows (need target progress), a server thread per rank (the GIL ties
it to the busy rank) and a central directory rank (a funnel).

Consistency
-----------
* Reads take a whole bucket with one ``Get``; a slot counts only if VALID and its seal (a
  hash of its words seeded with its version) matches, so torn reads are retried.
* A slot changes hands only by ``Compare_and_swap`` on its CTL word, which also holds the
  pin and child counts: "remove only if unpinned" and "pin this incarnation" are atomic.
* Inserts and removes of keys with the same home bucket serialise on that bucket's lock
  word, which makes dedup exact (one insert per key wins) while tombstones stay reusable.
  Lookups, pins and location updates take no lock.

Cost per operation in round trips (one RT ~3 us here; uncontended, entry in its home bucket;
each overflow bucket adds one): ``lookup`` 1; ``lookup_many`` 1 per batch (one indexed
``Get`` per owner, owners overlapped); ``insert_if_absent`` 5 when new, 4 when present;
``update_location`` 4; ``add_ref``/``release``/``add_child``/``remove_child`` 2; ``remove`` 4.
Measured on one 2-core node (benchmark/workloads/mpi_micro.py): ``lookup`` p50 ~9 us, under
3x one raw ``Fetch_and_op`` round trip; ``lookup_many`` 1-2e5 ids/s per rank.

MPI assumptions: the unified memory model (checked), and a ``Get`` racing an atomic on the
same aligned word returns the old or the new word (multi-word tears are caught by the
seal). Between nodes, whether atomics complete without the target's help depends on the
network: measured on 2 emulated nodes (``MPIR_CVAR_NUM_CLIQUES=2``) with the PyPI MPICH,
they wait until the target enters MPI (active messages), whatever the window hints,
while ``Get`` (so ``lookup``/``lookup_many``) does not; hardware atomics (not available
here), a :class:`.progress_thread.ProgressThread` on the owner (config ``mpi_progress``)
or ``MPIR_CVAR_ASYNC_PROGRESS=1`` lift that. On one node MPICH runs them in shared
memory. See :mod:`.progress_check`, which tests this at start-up.

Reclaim
-------
Stale locks, claims and placeholders of stopped ranks: see :mod:`.directory_reclaim`.

Thread-safety: a directory object is not thread-safe; use one per thread or a lock.
"""
from __future__ import annotations

import enum
import struct
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import BlockNotFound, CascadeError, TierFull
from ..identity import check_id, check_namespace, id_owner
from . import layout as L
from .directory_reclaim import Reclaim
from .directory_shard import ClaimReclaimed, ShardAccess
from .layout import DirectoryEntry
from .rma import Backoff, load_mpi

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..identity import BlockKey

__all__ = ["ClaimReclaimed", "DirectoryEntry", "DirectoryFull", "PinUnderflow", "Removal", "ShardedDirectory"]

#: Seconds a bucket lock or a slot being written may stay unchanged before another rank
#: reclaims it (see "Reclaim" above).
CLAIM_LEASE_SECONDS = 30.0
#: Seconds (wall clock) after which the owner's sweep deletes a placeholder.
PLACEHOLDER_LEASE_SECONDS = 3600.0

_HEAD_BIG = struct.Struct(">Q")       # id bytes 0-7 as the owner reads them
_TAIL_LITTLE = struct.Struct("<8xQ")  # id bytes 8-15 as the home bucket reads them


class DirectoryFull(TierFull):
    """A directory shard has no free slot within the probe limit of a key's home bucket."""


class PinUnderflow(CascadeError, ValueError):
    """``release``/``remove_child`` without a matching ``add_ref``/``add_child``."""


class Removal(str, enum.Enum):
    """Outcome of :meth:`ShardedDirectory.remove`."""

    REMOVED = "removed"
    ABSENT = "absent"
    PINNED = "pinned"              # refs > 0: someone is reading it; try later
    HAS_CHILDREN = "has_children"  # leaf_only=True and cached children remain
    MISMATCH = "mismatch"          # the entry no longer points where ``expect`` said


class ShardedDirectory(ShardAccess, Reclaim):
    """Global directory, one shard of ``slots_per_rank`` entries (~82 bytes each) per rank
    of ``comm`` (default ``MPI.COMM_SELF``). Collective: the constructor, :meth:`free` (and
    the context manager); every other method is local and one-sided. ``claim_lease``:
    seconds after which another rank's unchanged lock or claim is reclaimed;
    ``placeholder_lease``: wall-clock seconds after which :meth:`sweep` deletes a placeholder."""

    def __init__(self, comm: MPI.Comm | None = None, slots_per_rank: int = 1 << 16, *,
                 claim_lease: float = CLAIM_LEASE_SECONDS,
                 placeholder_lease: float = PLACEHOLDER_LEASE_SECONDS) -> None:
        if not (claim_lease > 0 and placeholder_lease > 0):
            raise ValueError(f"claim_lease and placeholder_lease must be > 0 seconds, not "
                             f"{claim_lease!r}, {placeholder_lease!r}")
        MPI = load_mpi()
        self._MPI = MPI
        comm = MPI.COMM_SELF if comm is None else comm
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        if comm.allreduce(slots_per_rank, op=MPI.MAX) != comm.allreduce(slots_per_rank, op=MPI.MIN):
            raise ValueError("every rank must pass the same slots_per_rank")
        self.nbuckets = L.buckets_for(slots_per_rank)
        self.slots_per_rank = self.nbuckets * L.BUCKET_SLOTS
        self._max_probe = L.max_probe(self.nbuckets)
        self._open_shard(comm)
        self._namespaces: dict[str, tuple[bytes, int]] = {}
        self.claim_lease = float(claim_lease)
        self.placeholder_lease = float(placeholder_lease)
        self.failed: set[int] = set()  # ranks known to have stopped (mark_failed)
        self.reclaimed = {"locks": 0, "committed": 0, "deleted": 0, "placeholders": 0}  # what this rank reclaimed
        self._swept: dict[tuple[int, int], tuple[int, float]] = {}  # sweep()'s sightings

    # -- lifecycle ---------------------------------------------------------------------
    def free(self) -> None:
        """Collective: release the window. Idempotent."""
        self._close_shard()

    def __enter__(self) -> ShardedDirectory:
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    # -- public operations ---------------------------------------------------------------
    def owner(self, block_id: str) -> int:
        """Rank whose shard holds ``block_id``. Local, no communication."""
        return id_owner(block_id, self.size)

    def lookup(self, namespace: str, block_id: str) -> DirectoryEntry | None:
        """The entry of a key, or None (also for a placeholder). One-sided; 1 round trip."""
        owner, home, key = self._key(namespace, block_id)
        self._win.Get(self._bucket, owner, home * L.BUCKET_WORDS)
        self._win.Flush_local(owner)
        entry = L.read_live(self._raw, key)
        if entry is not None:
            return None if entry.tier == L.NO_TIER else entry
        if L.bucket_reach(self._raw) == 0 and self._raw.find(key) < 0:
            return None  # a plain miss
        found = self._find(owner, home, key)  # overflow buckets, or an entry in flight
        return found[3] if found and found[3].tier != L.NO_TIER else None

    def lookup_many(self, keys: Sequence[BlockKey]) -> list[DirectoryEntry | None]:
        """Entries of many keys, in order. One-sided: per round one indexed ``Get`` per
        owner, all owners in flight together; keys are matched with numpy. A second round
        only for keys living in overflow buckets (or caught mid-write)."""
        n = len(keys)
        results: list[DirectoryEntry | None] = [None] * n
        if n == 0:
            return results
        ids = L.ids_to_words([block_id for _, block_id in keys])
        nsmap = {ns: self._namespace(ns)[0] for ns in {ns for ns, _ in keys}}
        nss = np.frombuffer(b"".join([nsmap[ns] for ns, _ in keys]), dtype=np.uint64)
        words = np.column_stack([nss, ids])  # (n, 3): the NS, ID_HI, ID_LO words
        owners = L.owners_of(ids, self.size).astype(np.int64)
        homes = L.homes_of(nss, ids, self.nbuckets).astype(np.int64)
        distance = np.zeros(n, dtype=np.int64)
        reach = np.zeros(n, dtype=np.int64)
        pending = np.arange(n)
        backoff = None
        while pending.size:
            rows = self._gather_buckets(owners[pending], (homes[pending] + distance[pending]) % self.nbuckets)
            first = distance[pending] == 0
            reach[pending[first]] = rows[first, L.MAXDIST]
            slots = rows[:, L.HEADER_WORDS:].reshape(-1, L.BUCKET_SLOTS, L.ENTRY_WORDS)
            match = (slots[:, :, L.NS:L.ID_LO + 1] == words[pending, None, :]).all(axis=2)
            state = slots[:, :, L.CTL] & np.uint64(3)
            valid = match & (state == L.VALID)
            busy = (match & (state == L.WRITING)).any(axis=1)
            hit = valid.any(axis=1)
            hit_rows = np.nonzero(hit)[0]
            order = pending.tolist()
            chosen = L.entries_of(slots[hit_rows, valid[hit_rows].argmax(axis=1)])
            for row, entry in zip(hit_rows.tolist(), chosen):
                if entry is None:  # torn read: take it again
                    hit[row], busy[row] = False, True
                elif entry.tier != L.NO_TIER:  # a placeholder counts as absent
                    results[order[row]] = entry
            busy &= ~hit
            distance[pending[busy]] = 0
            onward = ~hit & ~busy & (distance[pending] < reach[pending])
            distance[pending[onward]] += 1
            if busy.any():
                backoff = backoff or Backoff("directory lookup_many")
                backoff.wait()
                if backoff.tries > 16:  # long in flight: the single-key path reclaims stale claims
                    for k in pending[busy].tolist():
                        namespace, block_id = keys[k]
                        found = self._find(*self._key(namespace, block_id))
                        results[k] = found[3] if found and found[3].tier != L.NO_TIER else None
                    busy[:] = False
            pending = pending[busy | onward]
        return results

    def insert_if_absent(self, namespace: str, block_id: str,
                         entry: DirectoryEntry) -> tuple[bool, DirectoryEntry]:
        """Insert ``entry`` unless the key is present; if present, atomically add one to its
        share count instead (cross-rank dedup: exactly one concurrent insert wins).
        A placeholder of the key is taken over, keeping its child count. Returns
        ``(inserted, current entry)``. :class:`DirectoryFull` when no slot is free
        near the key's home. One-sided, 5 round trips (4 when present)."""
        owner, home, key = self._key(namespace, block_id)
        L.check_entry(entry)
        self._lock(owner, home)
        try:
            return self._insert_locked(owner, home, key, entry)
        finally:
            self._unlock(owner, home)

    def update_location(self, namespace: str, block_id: str, *, tier: int, rank: int, location: int,
                        length: int | None = None, checksum: int | None = None,
                        expect: DirectoryEntry | None = None,
                        unpinned: bool = False) -> tuple[bool, DirectoryEntry | None]:
        """Point the entry at new bytes (e.g. after demotion or a move to another rank).
        With ``expect``, only if the entry still has ``expect``'s (tier, rank, location);
        with ``unpinned``, only while no rank pins it (a pin and the move are exclusive:
        both CAS the same word). Returns ``(updated, current entry or None when absent)``.
        One-sided, 4 round trips."""
        owner, home, key = self._key(namespace, block_id)
        backoff = Backoff(f"directory update of {block_id} on rank {owner}")
        while True:
            found = self._find(owner, home, key)
            if found is None:
                return False, None
            bucket, i, ctl, current = found
            if expect is not None and current.placement() != expect.placement():
                return False, current
            if unpinned and current.refs:
                return False, current
            writing = L.next_ctl(ctl, L.WRITING)
            final = L.next_ctl(writing, L.VALID)
            new = L.check_entry(DirectoryEntry(
                tier, rank, location, current.length if length is None else length,
                current.checksum if checksum is None else checksum, L.ctl_refs(final), current.shares,
                L.ctl_children(final), L.ctl_version(final)))
            disp = L.slot_disp(bucket, i)
            if self._cas(owner, disp + L.CTL, ctl, writing) != ctl:
                backoff.wait()  # pinned, unpinned or updated meanwhile: look again
                continue
            slot = np.frombuffer(L.pack_slot(key, final, new), dtype=np.uint64)
            # SHARES is left alone: a concurrent insert may be adding to it.
            self._win.Put(slot[L.SEAL:L.SEAL + 1], owner, disp + L.SEAL)
            self._win.Put(slot[L.PLACE:L.CHECKSUM + 1], owner, disp + L.PLACE)
            self._win.Flush(owner)
            self._commit(owner, disp, writing, final, block_id)
            return True, new

    def add_ref(self, namespace: str, block_id: str, n: int = 1) -> int:
        """Pin: add ``n`` to the entry's cluster-wide ref count; returns the new count.
        :class:`BlockNotFound` when absent. One-sided, 2 round trips."""
        return self._adjust(namespace, block_id, L.REFS_SHIFT, n)

    def release(self, namespace: str, block_id: str, n: int = 1) -> int:
        """Unpin (see :meth:`add_ref`); :class:`PinUnderflow` below zero."""
        return self._adjust(namespace, block_id, L.REFS_SHIFT, -n)

    def add_child(self, namespace: str, parent_id: str, n: int = 1) -> int:
        """Count ``n`` more cached children of ``parent_id``; returns the new count."""
        return self._adjust(namespace, parent_id, L.CHILDREN_SHIFT, n)

    def remove_child(self, namespace: str, parent_id: str, n: int = 1) -> int:
        """Count ``n`` fewer cached children (see :meth:`add_child`); the last child of a
        placeholder deletes it (4 more round trips then)."""
        count, placeholder = self._adjust(namespace, parent_id, L.CHILDREN_SHIFT, -n, report=True)
        if count == 0 and placeholder:
            self.remove(namespace, parent_id, expect=_PLACEHOLDER)  # MISMATCH if re-put meanwhile
        return count

    def remove(self, namespace: str, block_id: str, *, expect: DirectoryEntry | None = None,
               leaf_only: bool = False) -> Removal:
        """Remove the entry unless it is pinned (or, with ``leaf_only``, has cached
        children, or, with ``expect``, no longer has ``expect``'s placement). The caller
        frees the bytes only on :attr:`Removal.REMOVED`. An entry with cached children
        becomes a placeholder keeping their count (so a re-put of the block starts with
        it). One-sided, 4 round trips."""
        owner, home, key = self._key(namespace, block_id)
        self._lock(owner, home)
        try:
            backoff = Backoff(f"directory remove of {block_id} on rank {owner}")
            while True:
                found = self._find(owner, home, key)
                if found is None:
                    return Removal.ABSENT
                bucket, i, ctl, current = found
                if expect is not None and not _matches(current, expect):
                    return Removal.MISMATCH
                if current.refs:
                    return Removal.PINNED
                if leaf_only and current.children:
                    return Removal.HAS_CHILDREN
                if current.children:
                    if current.tier == L.NO_TIER or self._rewrite(owner, bucket, i, ctl, key,
                                                                  _placeholder()) is not None:
                        return Removal.REMOVED
                else:
                    deleted = L.next_ctl(ctl, L.DELETED, keep_counts=False)
                    if self._cas(owner, L.slot_disp(bucket, i) + L.CTL, ctl, deleted) == ctl:
                        return Removal.REMOVED
                backoff.wait()
        finally:
            self._unlock(owner, home)

    # -- own shard -----------------------------------------------------------------------
    def local_entries(self) -> Iterator[tuple[bytes, str, DirectoryEntry]]:
        """``(namespace hash, block id, entry)`` of every live entry of this rank's shard
        (compare the hash with :func:`.layout.namespace_hash`). Local: one ``Get`` of the
        shard, then buckets caught mid-write are read again."""
        snapshot = self._snapshot()
        for bucket in range(self.nbuckets):
            buf, off = snapshot, bucket * L.BUCKET_BYTES
            backoff = Backoff(f"directory scan of rank {self.rank}")
            while True:
                ctls = L.slot_ctls(buf, off)
                states = [L.ctl_state(ctl) for ctl in ctls]
                reads = [L.read_slot(buf, off + L.slot_offset(i)) if state == L.VALID else None
                         for i, state in enumerate(states)]
                if all(state != L.WRITING and (state != L.VALID or read) for state, read in zip(states, reads)):
                    break
                backoff.wait()
                buf, off = self._get_bucket(self.rank, bucket), 0
            items = []
            for i, read in enumerate(reads):
                if read is not None:
                    key_off = off + L.slot_offset(i) + 8 * L.NS
                    key = bytes(buf[key_off:key_off + L.KEY_BYTES])
                    items.append((key[:8], key[8:].hex(), read[1]))
            yield from items

    def local_stats(self) -> dict[str, object]:
        """Counts of this rank's shard: slots by state, load, longest probe, pins, shares
        and bytes per tier. Local (reads its own window)."""
        words = np.frombuffer(self._snapshot(), dtype=np.uint64).reshape(self.nbuckets, L.BUCKET_WORDS)
        slots = words[:, L.HEADER_WORDS:].reshape(-1, L.ENTRY_WORDS)
        states = (slots[:, L.CTL] & np.uint64(3)).astype(np.int64)
        valid = slots[states == L.VALID]
        tiers = (valid[:, L.PLACE] & np.uint64(0xFF)).astype(np.int64)
        counts = np.bincount(states, minlength=4)
        return {
            "slots": self.slots_per_rank,
            **{L.STATE_NAMES[s]: int(counts[s]) for s in range(4)},
            "load": float(counts[L.VALID] + counts[L.WRITING]) / self.slots_per_rank,
            "max_probe_distance": int(words[:, L.MAXDIST].max()),
            "refs": int(((valid[:, L.CTL] >> np.uint64(L.REFS_SHIFT)) & np.uint64(L.COUNT_MAX)).sum()),
            "shares": int(valid[:, L.SHARES].sum()),
            "bytes_by_tier": {int(t): int(valid[tiers == t, L.LENGTH].sum()) for t in np.unique(tiers)},
        }

    # -- internals -----------------------------------------------------------------------
    def _namespace(self, namespace: str) -> tuple[bytes, int]:
        """The namespace's 8 key bytes and their little-endian value (validated once)."""
        known = self._namespaces.get(namespace)
        if known is None:
            nshash = L.namespace_hash(check_namespace(namespace))
            known = self._namespaces[namespace] = (nshash, int.from_bytes(nshash, "little"))
        return known

    def _key(self, namespace: str, block_id: str) -> tuple[int, int, bytes]:
        """``(owner, home bucket, 24 key bytes)``; :class:`InvalidBlock` for a bad id."""
        try:
            raw = bytes.fromhex(block_id)
            ok = len(raw) == 16 and raw.hex() == block_id  # exactly 32 lowercase hex digits
        except (TypeError, ValueError):
            ok = False
        if not ok:
            check_id(block_id)  # raises with the standard message
        nshash, nsword = self._namespace(namespace)
        # = identity.id_owner and layout.home_bucket, with precompiled structs (hot path)
        return (_HEAD_BIG.unpack_from(raw)[0] % self.size,
                (nsword ^ _TAIL_LITTLE.unpack_from(raw)[0]) % self.nbuckets, nshash + raw)

    def _adjust(self, namespace: str, block_id: str, shift: int, delta: int, report: bool = False):
        """CAS ``delta`` onto the count at ``shift`` of the key's CTL word: only this
        incarnation of the entry, never below zero. Returns the new count (with
        ``report``: and whether the entry is a placeholder)."""
        owner, home, key = self._key(namespace, block_id)
        backoff = Backoff(f"directory count update of {block_id} on rank {owner}")
        found = self._find(owner, home, key)
        placeholder = False
        while found is not None:
            bucket, i, ctl, entry = found
            if entry is not None:  # None: the same version as the last read (same placement)
                placeholder = entry.tier == L.NO_TIER
            count = (ctl >> shift & L.COUNT_MAX) + delta
            if count < 0:
                raise PinUnderflow(f"{block_id}: count would drop below zero (unbalanced release)")
            if count > L.COUNT_MAX:
                raise OverflowError(f"{block_id}: count would exceed {L.COUNT_MAX}")
            old = self._cas(owner, L.slot_disp(bucket, i) + L.CTL, ctl, ctl + (delta << shift))
            if old == ctl:
                return (count, placeholder) if report else count
            if L.ctl_state(old) == L.VALID and L.ctl_version(old) == L.ctl_version(ctl):
                found = (bucket, i, old, None)  # only the counts moved: retry at once
            else:
                backoff.wait()
                found = self._find(owner, home, key)
        raise BlockNotFound(f"{namespace}/{block_id} is not in the directory")

    def _find(self, owner: int, home: int, key: bytes) -> tuple[int, int, int, DirectoryEntry] | None:
        """``(bucket, slot, ctl, entry)`` of the key's VALID slot, or None."""
        return self._search(owner, home, key)[0]

    def _search(self, owner: int, home: int, key: bytes, want_free: bool = False):
        """Read the buckets that may hold the key (home .. home + MAXDIST), waiting out
        in-flight writes to a slot carrying it. Returns ``(hit, reach, free)``: the hit as
        in :meth:`_find`, the home's MAXDIST, and (with ``want_free``) the first free
        slot seen as ``(bucket, slot, ctl)``."""
        backoff = None
        watch: dict = {}  # claims carrying the key: (bucket, slot) -> (ctl, first seen)
        while True:
            buf = self._get_bucket(owner, home)
            reach = L.bucket_reach(buf)
            busy, free = False, None
            for distance in range(reach + 1):
                bucket = L.probe_bucket(home, distance, self.nbuckets)
                if distance:
                    buf = self._get_bucket(owner, bucket)
                hit, slot_busy = L.find_in_bucket(buf, key)
                if hit is not None:
                    return (bucket, *hit), reach, None
                if slot_busy:
                    now = time.monotonic()
                    for i, ctl in L.claims_of(buf, key):
                        claim = L.read_claim(buf, L.slot_offset(i))
                        if self._expired(watch, watch, (bucket, i), ctl, now) or self._names_failed(claim):
                            self._reclaim(owner, bucket, i, ctl, claim)
                busy |= slot_busy
                if want_free and free is None:
                    free = _first_free(buf, bucket)
            if not busy:
                return None, reach, free
            backoff = backoff or Backoff(f"directory lookup on rank {owner}")
            backoff.wait()

    def _rewrite(self, owner: int, bucket: int, i: int, ctl: int, key: bytes, entry: DirectoryEntry, *,
                 shares: bool = False) -> int | None:
        """Replace the placement words (and with ``shares`` the share count) of a VALID
        slot whose CTL is still ``ctl``, keeping its counts: CAS to WRITING, write, seal,
        back to VALID. Returns the new CTL; None (nothing changed) when it moved meanwhile."""
        writing = L.next_ctl(ctl, L.WRITING)
        final = L.next_ctl(writing, L.VALID)
        disp = L.slot_disp(bucket, i)
        if self._cas(owner, disp + L.CTL, ctl, writing) != ctl:
            return None
        new = DirectoryEntry(entry.tier, entry.rank, entry.location, entry.length, entry.checksum,
                             L.ctl_refs(final), entry.shares, L.ctl_children(final))
        slot = np.frombuffer(L.pack_slot(key, final, new), dtype=np.uint64)
        self._win.Put(slot[L.SEAL:L.SEAL + 1], owner, disp + L.SEAL)
        self._win.Put(slot[L.PLACE:(L.SHARES if shares else L.CHECKSUM) + 1], owner, disp + L.PLACE)
        self._win.Flush(owner)
        self._commit(owner, disp, writing, final, f"rewrite of slot {bucket}/{i}")
        return final

    def _insert_locked(self, owner: int, home: int, key: bytes,
                       entry: DirectoryEntry) -> tuple[bool, DirectoryEntry]:
        # The bucket lock keeps other inserts of this key out: a miss stays a miss.
        found, reach, free = self._search(owner, home, key, want_free=True)
        while found is not None and found[3].tier == L.NO_TIER:  # take the placeholder over
            bucket, i, ctl, current = found
            new = DirectoryEntry(entry.tier, entry.rank, entry.location, entry.length, entry.checksum,
                                 L.ctl_refs(ctl), entry.shares, L.ctl_children(ctl))
            final = self._rewrite(owner, bucket, i, ctl, key, new, shares=True)
            if final is not None:
                new.version = L.ctl_version(final)
                return True, new
            found, reach, free = self._search(owner, home, key, want_free=True)  # a count moved: again
        if found is not None:
            bucket, i, _, current = found
            current.shares = self._fetch_add(owner, L.slot_disp(bucket, i) + L.SHARES, 1) + 1  # our own snapshot
            return False, current
        bucket, i, writing = self._claim(owner, home, free, 0 if free else reach + 1, entry)
        final = L.next_ctl(writing, L.VALID)
        disp = L.slot_disp(bucket, i)
        slot = np.frombuffer(L.pack_slot(key, final, entry), dtype=np.uint64)
        self._win.Put(slot[L.SEAL:L.SEAL + 1], owner, disp + L.SEAL)
        self._win.Put(slot[L.NS:], owner, disp + L.NS)
        distance = (bucket - home) % self.nbuckets
        if distance > reach:
            self._store(owner, L.bucket_disp(home) + L.MAXDIST, distance)
        self._flush(owner)
        self._commit_and_unlock(owner, home, disp, writing, final, f"insert into slot {bucket}/{i}")
        return True, DirectoryEntry(entry.tier, entry.rank, entry.location, entry.length, entry.checksum,
                                    entry.refs, entry.shares, entry.children, L.ctl_version(final))

    def _claim(self, owner: int, home: int, free: tuple[int, int, int] | None, start: int,
               entry: DirectoryEntry) -> tuple[int, int, int]:
        """CAS a free slot to WRITING: ``free`` first, then the probe sequence from
        distance ``start``. Returns ``(bucket, slot, writing ctl)``."""
        candidates = [free] if free else []
        distance = start
        while True:
            for bucket, i, ctl in candidates:
                writing = L.make_ctl(L.WRITING, entry.refs, entry.children, L.ctl_version(ctl) + 1)
                if self._cas(owner, L.slot_disp(bucket, i) + L.CTL, ctl, writing) == ctl:
                    return bucket, i, writing
            if distance > self._max_probe:
                break
            bucket = L.probe_bucket(home, distance, self.nbuckets)
            candidates = [(bucket, i, ctl) for i, ctl in enumerate(L.slot_ctls(self._get_bucket(owner, bucket)))
                          if ctl & 3 in (L.EMPTY, L.DELETED)]
            distance += 1
        raise DirectoryFull(
            f"directory shard of rank {owner} is full around bucket {home}: no free slot within "
            f"{self._max_probe + 1} buckets of {L.BUCKET_SLOTS} (slots_per_rank={self.slots_per_rank}); "
            f"raise slots_per_rank")


def _placeholder() -> DirectoryEntry:
    """A placeholder's entry: no tier, and as location the wall-clock second it is made."""
    return DirectoryEntry(L.NO_TIER, 0, int(time.time()), 0, 0)


def _matches(current: DirectoryEntry, expect: DirectoryEntry) -> bool:
    """Whether ``current`` is what an ``expect=`` argument names: the same placement, or
    any placeholder for :data:`_PLACEHOLDER`."""
    if expect.tier == L.NO_TIER:
        return current.tier == L.NO_TIER
    return current.placement() == expect.placement()


_PLACEHOLDER = DirectoryEntry(L.NO_TIER, 0, 0, 0, 0)  # as ``expect=``: any placeholder


def _first_free(buf: bytearray, bucket: int) -> tuple[int, int, int] | None:
    for i, ctl in enumerate(L.slot_ctls(buf)):
        if ctl & 3 in (L.EMPTY, L.DELETED):
            return bucket, i, ctl
    return None
