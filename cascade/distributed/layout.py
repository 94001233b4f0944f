"""Pure arithmetic of the directory's window hash table (no MPI here).

A shard is ``nbuckets`` buckets of :data:`BUCKET_WORDS` little-endian u64 words::

    bucket = [LOCK, MAXDIST, slot 0 (ENTRY_WORDS words), ..., slot BUCKET_SLOTS-1]
    slot   = [SEAL, CTL, NS, ID_HI, ID_LO, PLACE, LOCATION, LENGTH, CHECKSUM, SHARES]

* ``LOCK``: the insert/remove lock of keys whose home is this bucket: 0 free, else the
  holder's rank + 1 in the low 32 bits and the holder's acquisition count above them, so
  every acquisition is a distinct word (a waiter that sees one word for a lease knows it
  is one holding, not many).
* ``MAXDIST``: how many buckets past home the farthest key homed here lives (monotone),
  so a lookup reads exactly the buckets that can hold its key, tombstones or not.
* ``CTL`` packs state (2 bits), pin count ``refs`` (20), cached-children count (20) and a
  version (22, wraps) so "remove only if unpinned" and "pin only this incarnation" are one
  compare-and-swap.
* ``NS, ID_HI, ID_LO`` are the key: 8 bytes of BLAKE3(namespace) and the 16 raw id bytes;
  in memory they are the 24 bytes ``namespace_hash(ns) + bytes.fromhex(id)``.
* ``SEAL`` is XXH3-64 of words ``NS..CHECKSUM`` seeded with the version: a reader takes a
  whole bucket with one ``Get`` and accepts a slot only if its seal matches, so a torn read
  (a writer between two words) is detected without a second round trip (seqlock check).
* ``PLACE`` packs the tier kind (8 bits) and the rank holding the bytes (32 bits): for the
  REMOTE tier that is the rank whose window holds them, not the rank that put them.
* ``CHECKSUM`` is XXH3-64 of the block's bytes: every cross-rank read verifies the bytes
  it copied against it (end to end, whichever tier and rank served them).
* ``SHARES`` counts the puts/sequences that deduplicated onto the entry (atomic add).
* A *placeholder* is a VALID slot with tier :data:`NO_TIER` (length and checksum 0, and
  as location the wall-clock second it became one): the block was removed while children
  of it were still cached, so the slot keeps only its child count. Lookups treat it as
  absent; an insert of its key takes it over (keeping the count); it is deleted when its
  last child goes, or by its owner's sweep once older than the placeholder lease (its
  children may have died with their rank).
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import blake3
import numpy as np
from xxhash import xxh3_64_intdigest

from ..identity import HEX_DIGITS, ID_BYTES, check_id

# -- slot words ------------------------------------------------------------------------
ENTRY_WORDS = 10
SEAL, CTL, NS, ID_HI, ID_LO, PLACE, LOCATION, LENGTH, CHECKSUM, SHARES = range(ENTRY_WORDS)
KEY_BYTES = 8 + ID_BYTES
_HEX = HEX_DIGITS.encode()

# -- buckets ---------------------------------------------------------------------------
BUCKET_SLOTS = 8
LOCK, MAXDIST = 0, 1
HEADER_WORDS = 2
BUCKET_WORDS = HEADER_WORDS + BUCKET_SLOTS * ENTRY_WORDS
BUCKET_BYTES = BUCKET_WORDS * 8
MAX_PROBE = 64  # buckets past home an entry may live; beyond that the shard counts as full

# -- CTL word --------------------------------------------------------------------------
EMPTY, WRITING, VALID, DELETED = range(4)
STATE_NAMES = ("empty", "writing", "valid", "deleted")
REFS_SHIFT, REFS_BITS = 2, 20
CHILDREN_SHIFT, CHILDREN_BITS = 22, 20
VERSION_SHIFT, VERSION_BITS = 42, 22
COUNT_MAX = (1 << REFS_BITS) - 1  # the same for refs and children
_PLACE_RANK_SHIFT = 8
NO_TIER = 0xFF  # the tier of a placeholder (see the module docstring)
_ENTRY = struct.Struct("<" + "Q" * ENTRY_WORDS)
_WORD = struct.Struct("<Q")


@dataclass(slots=True)
class DirectoryEntry:
    """Where a block lives and who holds it (a snapshot; changing it changes nothing).
    ``tier`` is the store's small tier number, ``rank`` the rank holding the bytes,
    ``location`` a tier-specific u64 (window offset, file id and offset, ...).
    ``refs``/``shares``/``children``/``version`` are read back from the directory (on
    insert they are the initial counts and ``version`` is ignored)."""

    tier: int
    rank: int
    location: int
    length: int
    checksum: int = 0
    refs: int = 0
    shares: int = 1
    children: int = 0
    version: int = 0

    def placement(self) -> tuple[int, int, int]:
        """``(tier, rank, location)``: what ``expect=`` arguments compare."""
        return (self.tier, self.rank, self.location)


# -- addresses -------------------------------------------------------------------------
def slot_offset(i: int) -> int:
    """Byte offset of slot ``i`` inside a bucket."""
    return 8 * (HEADER_WORDS + i * ENTRY_WORDS)


def bucket_disp(bucket: int) -> int:
    """Window displacement (in u64 words) of a bucket."""
    return bucket * BUCKET_WORDS


def slot_disp(bucket: int, i: int) -> int:
    """Window displacement (in u64 words) of slot ``i`` of a bucket."""
    return bucket * BUCKET_WORDS + HEADER_WORDS + i * ENTRY_WORDS


def buckets_for(slots_per_rank: int) -> int:
    """Buckets of a shard of at least ``slots_per_rank`` slots (at least one bucket)."""
    return max(1, -(-slots_per_rank // BUCKET_SLOTS))


@lru_cache(maxsize=4096)
def namespace_hash(namespace: str) -> bytes:
    """The 8 bytes standing for a namespace in the table: BLAKE3 of its UTF-8 name."""
    return blake3.blake3(namespace.encode()).digest(8)


def key_bytes(namespace: str, block_id: str) -> bytes:
    """The 24 key bytes of a slot (``NS, ID_HI, ID_LO`` as they sit in memory)."""
    return namespace_hash(namespace) + bytes.fromhex(block_id)


def home_bucket(key: bytes, nbuckets: int) -> int:
    """Home bucket of a key. Uses the id's last 8 bytes (the owner uses the first 8)."""
    return (int.from_bytes(key[:8], "little") ^ int.from_bytes(key[16:], "little")) % nbuckets


def ids_to_words(block_ids: Sequence[str]) -> np.ndarray:
    """``(n, 2)`` u64 words ``ID_HI, ID_LO`` of many ids (as they sit in a slot);
    :class:`InvalidBlock` for a malformed id. Vectorised: ~0.1 us per id."""
    try:
        joined = "".join(block_ids)
        ok = set(map(len, block_ids)) <= {2 * ID_BYTES} and not joined.encode().translate(None, _HEX)
    except (TypeError, UnicodeEncodeError):
        ok = False
    if not ok:
        for block_id in block_ids:
            check_id(block_id)
    return np.frombuffer(bytes.fromhex(joined), dtype=np.uint64).reshape(len(block_ids), 2)


def owners_of(id_words: np.ndarray, size: int) -> np.ndarray:
    """Vectorised :func:`cascade.identity.id_owner` (first 8 id bytes, big-endian, mod size)."""
    return id_words[:, 0].byteswap() % np.uint64(size)


def homes_of(ns_words: np.ndarray, id_words: np.ndarray, nbuckets: int) -> np.ndarray:
    """Vectorised :func:`home_bucket`."""
    return (ns_words ^ id_words[:, 1]) % np.uint64(nbuckets)


def probe_bucket(home: int, distance: int, nbuckets: int) -> int:
    """Bucket ``distance`` steps along the (linear) probe sequence from ``home``."""
    return (home + distance) % nbuckets


def max_probe(nbuckets: int) -> int:
    """Largest probe distance an entry may have in a shard of ``nbuckets``."""
    return min(MAX_PROBE, nbuckets) - 1


def _ctl_format() -> str:
    fmt, end = "<", 0
    for i in range(BUCKET_SLOTS):
        off = slot_offset(i) + 8 * CTL
        fmt += f"{off - end}xQ"
        end = off + 8
    return fmt


_CTLS = struct.Struct(_ctl_format())


# -- CTL word arithmetic ---------------------------------------------------------------
def make_ctl(state: int, refs: int = 0, children: int = 0, version: int = 0) -> int:
    if not (0 <= refs <= COUNT_MAX and 0 <= children <= COUNT_MAX):
        raise ValueError(f"refs={refs} / children={children} outside 0..{COUNT_MAX}")
    return (state | refs << REFS_SHIFT | children << CHILDREN_SHIFT
            | (version % (1 << VERSION_BITS)) << VERSION_SHIFT)


def ctl_state(ctl: int) -> int:
    return ctl & 3


def ctl_refs(ctl: int) -> int:
    return ctl >> REFS_SHIFT & COUNT_MAX


def ctl_children(ctl: int) -> int:
    return ctl >> CHILDREN_SHIFT & COUNT_MAX


def ctl_version(ctl: int) -> int:
    return ctl >> VERSION_SHIFT


def next_ctl(ctl: int, state: int, *, keep_counts: bool = True) -> int:
    """``ctl`` moved to ``state`` with the version bumped (wrapping); counts kept or zeroed."""
    refs, children = (ctl_refs(ctl), ctl_children(ctl)) if keep_counts else (0, 0)
    return make_ctl(state, refs, children, ctl_version(ctl) + 1)


# -- slots -----------------------------------------------------------------------------
_SEAL_START, _SEAL_STOP = 8 * NS, 8 * (CHECKSUM + 1)
_SLOT_BYTES = 8 * ENTRY_WORDS
_FIRST_KEY = 8 * (HEADER_WORDS + NS)  # byte offset of slot 0's key in a bucket


def seal_of(buf, slot_off: int, version: int) -> int:
    """XXH3-64 of a slot's sealed words (``NS..CHECKSUM``), seeded with its version."""
    return xxh3_64_intdigest(buf[slot_off + _SEAL_START:slot_off + _SEAL_STOP], version)


def lock_word(rank: int, sequence: int) -> int:
    """The LOCK word of ``rank``'s ``sequence``-th acquisition (never 0)."""
    return (sequence % (1 << 32)) << 32 | (rank + 1)


def lock_holder(word: int) -> int | None:
    """The rank holding a LOCK word, None when free."""
    return (word & 0xFFFFFFFF) - 1 if word else None


def pack_place(tier: int, rank: int) -> int:
    if not (0 <= tier < 1 << _PLACE_RANK_SHIFT and 0 <= rank < 1 << 32):
        raise ValueError(f"tier {tier} must fit 8 bits and rank {rank} 32 bits")
    return tier | rank << _PLACE_RANK_SHIFT


def check_entry(entry: DirectoryEntry) -> DirectoryEntry:
    """``entry`` if every field fits its slot word(s), else ValueError (checked before a
    slot is claimed, so a bad entry never leaves a slot half written)."""
    pack_place(entry.tier, entry.rank)
    make_ctl(VALID, entry.refs, entry.children)
    for name in ("location", "length", "checksum", "shares"):
        value = getattr(entry, name)
        if not 0 <= value < 1 << 64:
            raise ValueError(f"entry {name}={value} does not fit 64 unsigned bits")
    return entry


def pack_slot(key: bytes, ctl: int, entry: DirectoryEntry) -> bytearray:
    """The ``ENTRY_WORDS`` words of a slot holding ``entry`` under ``ctl``, sealed."""
    buf = bytearray(_ENTRY.size)
    _ENTRY.pack_into(buf, 0, 0, ctl, 0, 0, 0, pack_place(entry.tier, entry.rank),
                     entry.location, entry.length, entry.checksum, entry.shares)
    buf[NS * 8:NS * 8 + KEY_BYTES] = key
    _WORD.pack_into(buf, 0, seal_of(buf, 0, ctl_version(ctl)))
    return buf



def bucket_reach(buf, bucket_off: int = 0) -> int:
    """The MAXDIST word of the bucket at byte ``bucket_off`` of ``buf``."""
    return _WORD.unpack_from(buf, bucket_off + 8 * MAXDIST)[0]


def slot_ctls(buf, bucket_off: int = 0) -> tuple[int, ...]:
    """The CTL words of the slots of the bucket at byte ``bucket_off`` of ``buf``."""
    return _CTLS.unpack_from(buf, bucket_off)


def read_slot(buf, slot_off: int) -> tuple[int, DirectoryEntry] | None:
    """``(ctl, entry)`` of a VALID slot whose seal checks, else None (not valid, or torn)."""
    seal, ctl, _, _, _, place, location, length, checksum, shares = _ENTRY.unpack_from(buf, slot_off)
    if ctl & 3 != VALID or seal != xxh3_64_intdigest(
            buf[slot_off + _SEAL_START:slot_off + _SEAL_STOP], ctl >> VERSION_SHIFT):
        return None
    return ctl, DirectoryEntry(place & 0xFF, place >> _PLACE_RANK_SHIFT, location, length, checksum,
                               ctl >> REFS_SHIFT & COUNT_MAX, shares, ctl >> CHILDREN_SHIFT & COUNT_MAX,
                               ctl >> VERSION_SHIFT)


def read_claim(buf, slot_off: int) -> DirectoryEntry | None:
    """The entry a WRITING slot's writer put in it, if its words are complete: sealed for
    the version its commit would give (``version + 1``). None while (or if forever) the
    writer has not finished its puts."""
    seal, ctl, _, _, _, place, location, length, checksum, shares = _ENTRY.unpack_from(buf, slot_off)
    version = ctl_version(next_ctl(ctl, VALID))
    if ctl & 3 != WRITING or seal != seal_of(buf, slot_off, version):
        return None
    return DirectoryEntry(place & 0xFF, place >> _PLACE_RANK_SHIFT, location, length, checksum,
                          ctl_refs(ctl), shares, ctl_children(ctl), version)


def claims_of(buf, key: bytes, bucket_off: int = 0) -> list[tuple[int, int]]:
    """``(slot, ctl)`` of the WRITING slots of a bucket that carry ``key`` (slot-aligned)."""
    first = bucket_off + _FIRST_KEY
    out, start, end = [], first, bucket_off + BUCKET_BYTES
    while (pos := buf.find(key, start, end)) >= 0:
        slot, misaligned = divmod(pos - first, _SLOT_BYTES)
        if not misaligned:
            ctl = _WORD.unpack_from(buf, pos - 8 * NS + 8 * CTL)[0]
            if ctl & 3 == WRITING:
                out.append((slot, ctl))
        start = pos + 1
    return out


def entries_of(slots: np.ndarray) -> list[DirectoryEntry | None]:
    """Vectorised :func:`read_slot` for ``(m, ENTRY_WORDS)`` u64 rows already known to be
    VALID: the entries, None where the seal fails (a torn read)."""
    if not len(slots):
        return []
    sealed = memoryview(np.ascontiguousarray(slots[:, NS:CHECKSUM + 1])).cast("B")
    ctl, place = slots[:, CTL], slots[:, PLACE]
    versions = (ctl >> np.uint64(VERSION_SHIFT)).tolist()
    width = _SEAL_STOP - _SEAL_START
    intact = [xxh3_64_intdigest(sealed[i * width:(i + 1) * width], v) == seal
              for i, (v, seal) in enumerate(zip(versions, slots[:, SEAL].tolist()))]
    count = np.uint64(COUNT_MAX)
    columns = (place & np.uint64(0xFF), place >> np.uint64(_PLACE_RANK_SHIFT), slots[:, LOCATION],
               slots[:, LENGTH], slots[:, CHECKSUM], ctl >> np.uint64(REFS_SHIFT) & count, slots[:, SHARES],
               ctl >> np.uint64(CHILDREN_SHIFT) & count)
    entries = map(DirectoryEntry, *(c.tolist() for c in columns), versions)
    return [e if ok else None for e, ok in zip(entries, intact)]


def read_live(buf, key: bytes) -> DirectoryEntry | None:
    """A lookup's fast path: the entry when the first copy of ``key`` in the bucket at the
    start of ``buf`` is a live, intact slot; otherwise None (absent, or ask
    :func:`find_in_bucket`)."""
    pos = buf.find(key, _FIRST_KEY, BUCKET_BYTES)
    if pos < 0 or (pos - _FIRST_KEY) % _SLOT_BYTES:
        return None
    slot_off = pos - 8 * NS  # read_slot, inlined: this is the hottest path of the directory
    seal, ctl, _, _, _, place, location, length, checksum, shares = _ENTRY.unpack_from(buf, slot_off)
    if ctl & 3 != VALID or seal != xxh3_64_intdigest(buf[pos:pos + _SEAL_STOP - _SEAL_START], ctl >> VERSION_SHIFT):
        return None
    return DirectoryEntry(place & 0xFF, place >> _PLACE_RANK_SHIFT, location, length, checksum,
                          ctl >> REFS_SHIFT & COUNT_MAX, shares, ctl >> CHILDREN_SHIFT & COUNT_MAX,
                          ctl >> VERSION_SHIFT)


def find_in_bucket(buf, key: bytes, bucket_off: int = 0) -> tuple[tuple[int, int, DirectoryEntry] | None, bool]:
    """Look for ``key`` in the bucket at byte ``bucket_off`` of ``buf``. Returns
    ``((slot, ctl, entry) or None, busy)``; ``busy`` when a slot carrying the key is being
    written or was read torn (read again). Finds only slot-aligned copies of the key."""
    busy = False
    first = bucket_off + _FIRST_KEY
    start, end = first, bucket_off + BUCKET_BYTES
    while (pos := buf.find(key, start, end)) >= 0:
        slot, misaligned = divmod(pos - first, _SLOT_BYTES)
        if not misaligned:
            slot_off = pos - _FIRST_KEY + HEADER_WORDS * 8
            read = read_slot(buf, slot_off)
            if read is not None:
                return (slot, *read), False
            busy |= _WORD.unpack_from(buf, slot_off + 8 * CTL)[0] & 3 in (WRITING, VALID)
        start = pos + 1
    return None, busy
