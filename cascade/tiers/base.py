"""The one interface every storage tier implements.

A tier is a mapping from a :data:`BlockKey` ``(namespace, block_id)`` to a block's bytes,
plus capacity accounting and zero-copy reads (``read_into``). Tiers store and fetch; they
never decide what to keep (that is the policy's job) and never evict on their own: a put
that does not fit raises :class:`~cascade.errors.TierFull`.

Thread-safety: a tier is not thread-safe; the store serialises calls to it, except the
data movement of the two-phase forms below on tiers with ``concurrent = True``:

* reads: :meth:`lease` (serialised) pins a block's bytes, :meth:`read_leased` copies them
  out from any thread while other calls go on, :meth:`release` (serialised) unpins. A
  block deleted or replaced while leased keeps its bytes until its last lease goes.
* writes: :meth:`reserve` (serialised) claims space, :meth:`fill` copies the block in
  from any thread, :meth:`commit` or :meth:`discard` (serialised) publish or free it.

Tiers that cannot move data concurrently (``concurrent = False``, e.g. REMOTE: MPI calls)
get the defaults here, which do the work in the serialised steps.
"""
from __future__ import annotations

import enum
import errno
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any, TypeVar

from ..errors import BlockNotFound, CorruptBlock, TierFull
from ..buffers import as_byte_view
from ..identity import BlockKey

E = TypeVar("E", bound=BaseException)


class _Deferred:
    """A reservation of a non-concurrent tier: the copy happens at commit."""

    __slots__ = ("key", "parent", "parts")

    def __init__(self, key: BlockKey, parent: str | None) -> None:
        self.key, self.parent, self.parts = key, parent, ()


class TierKind(enum.IntEnum):
    """What a tier is; its number is stored in directory entries (stable across
    configurations), so other ranks know how to read a block it holds."""

    GPU = 0
    SHM = 1
    REMOTE = 2
    FILE = 3
    NONE = 0xFF  # a placeholder directory entry: the block is gone, only its child count is kept


class Memory(enum.Enum):
    """Where a tier's bytes live."""

    DEVICE = "device"  # GPU memory of this process
    HOST = "host"  # this node's DRAM
    PEER = "peer"  # other ranks' DRAM (MPI windows)
    DISK = "disk"  # files


class Tier(MutableMapping[BlockKey, bytes], ABC):
    """Abstract storage tier. Subclasses implement the six abstract methods and declare
    their capabilities in the class attributes below; the store reads only those,
    never a tier's name or type."""

    name: str = "tier"  # its key in stats() and log lines
    kind: TierKind = TierKind.NONE
    memory: Memory = Memory.HOST
    concurrent: bool = False  # read_leased / fill may run outside the store's lock
    reads_into_device: bool = False  # read_leased also fills device arrays (not only host memory)
    # Its leased reads into numpy arrays and fills from them are memory copies that
    # release the interpreter lock: a batch spreads them over every core
    # (Pools.parallel's in_memory).
    copies_without_gil: bool = False
    # start_leased_run() queues its reads on threads of their own and returns at once
    # (the file tier's buffered runs): a batch leases and counts its other blocks meanwhile.
    reads_queued: bool = False
    # store_hot() can copy (a slab in host memory); else it always declines, and the
    # store's small-block puts skip it (and its locked step)
    hot_copies: bool = False
    # read_hot() can copy a block under the store's lock (SHM: a slab in host memory; never
    # a tier whose copy may wait for a disk); else it always declines, and gets skip it.
    # hot_batch_reads: a batch's blocks too, all in one locked step, until the tier
    # declines one (the rest of its blocks are read leased, in runs).
    hot_reads: bool = False
    hot_batch_reads: bool = False
    # A batch's hot reads can be gathered (hot_copy_job) and copied in one go at the end of
    # its locked step (copy_hot_jobs: on two cores when that pays; SHM).
    defers_hot_copies: bool = False
    # leased_view() gives a read-only view of a leased block's bytes in place (no copy)
    zero_copy: bool = False
    # Its blocks outlive the process: a store opened on the same place adopts them (warm
    # restart) with their parents (:meth:`parent_of`).
    persistent: bool = False
    # It keeps each block's wall-clock expiry (:meth:`set_expiry`, :meth:`expires_of`),
    # asking ``expiry_of`` (set by the store) for it when a block is written.
    records_ttl: bool = False
    expiry_of: Callable[[BlockKey], float] | None = None
    # Set by the store: called (under its lock) with the keys of blocks the tier moved
    # within itself (file-tier compaction), so the directory follows them.
    on_relocate: Callable[[list[BlockKey]], None] | None = None
    # Set by the store: called (under its lock) with the keys of blocks whose bytes the
    # tier found corrupt by itself (file-tier compaction; it keeps them), so the store
    # drops them as a read that found them so would.
    on_corrupt: Callable[[list[BlockKey]], None] | None = None
    # Set by the store: called (under its lock) when the tier has disk upkeep due
    # (deletes to write, freed files to close, dead space to reclaim); the store then
    # runs housekeep() on a thread of its own. Unset, a tier does that work inline.
    on_housekeeping_due: Callable[[], None] | None = None
    # Writes outran its background compaction: the store's writers call
    # wait_for_compaction() before their next write into it (outside its lock).
    behind: bool = False

    def wait_for_compaction(self) -> None:
        """Outside the lock: wait (bounded) for the compaction under way to end."""

    def housekeep(self, lock: Any, stop: Any) -> None:
        """Run the upkeep due (none here), holding ``lock`` (the store's) only to pick
        work and record its end, the disk work outside it; a compaction's copying stops
        early once ``stop`` (an Event) is set."""

    def leased_view(self, lease: Any) -> Any:
        """A read-only, one-dimensional uint8 view of a leased block's bytes, valid until
        the lease is released (tiers with ``zero_copy`` only). :class:`CorruptBlock`
        when a verifying tier's bytes fail their checksum."""
        raise NotImplementedError(f"the {self.name} tier has no zero-copy views")
    collective: bool = False  # opening and closing it takes every rank (MPI windows)

    @property
    @abstractmethod
    def capacity(self) -> int:
        """Bytes this tier may hold."""

    @property
    @abstractmethod
    def used(self) -> int:
        """Bytes of payload currently held (allocator overhead excluded)."""

    @abstractmethod
    def put(self, key: BlockKey, parts: Sequence[Any], *, parent: str | None = None) -> None:
        """Store the concatenation of ``parts`` (buffers) under ``key`` without
        concatenating them first. Re-putting an existing key replaces it. ``parent`` is
        the id of the previous block of the sequence; persistent tiers record it so a
        warm restart rebuilds the prefix tree. Raises :class:`TierFull` when it does not
        fit; the tier is then unchanged."""

    @abstractmethod
    def length(self, key: BlockKey) -> int:
        """Payload bytes of ``key``; :class:`BlockNotFound` when absent."""

    @abstractmethod
    def read_into(self, key: BlockKey, out: Any, offset: int = 0) -> None:
        """Copy ``len(out)`` bytes of the block, starting at ``offset``, into the writable
        buffer ``out``. :class:`BlockNotFound` when absent, :class:`CorruptBlock` when the
        stored bytes fail verification (``out`` then holds no valid data)."""

    @abstractmethod
    def __delitem__(self, key: BlockKey) -> None:
        """Drop ``key`` and free its space; :class:`BlockNotFound` when absent."""

    @abstractmethod
    def __iter__(self) -> Iterator[BlockKey]: ...

    @abstractmethod
    def __len__(self) -> int: ...

    # -- derived operations ------------------------------------------------------------
    @property
    def free(self) -> int:
        """Bytes still available for new blocks."""
        return self.capacity - self.used

    def fits(self, nbytes: int) -> bool:
        """Whether a block of ``nbytes`` could be stored now without eviction."""
        return nbytes <= self.free

    def read_parts_into(self, key: BlockKey, outs: Sequence[Any]) -> None:
        """Scatter the block into consecutive buffers ``outs`` (e.g. key, value).
        Tiers that can verify only whole blocks override this to check once."""
        offset = 0
        for out in outs:
            view = as_byte_view(out, "output buffer")
            self.read_into(key, view, offset)
            offset += view.nbytes

    def __getitem__(self, key: BlockKey) -> bytes:
        out = bytearray(self.length(key))
        self.read_into(key, out)
        return bytes(out)

    def __setitem__(self, key: BlockKey, value: Any) -> None:
        self.put(key, [value])

    def __contains__(self, key: object) -> bool:
        try:
            self.length(key)  # type: ignore[arg-type]
        except (BlockNotFound, CorruptBlock):
            return False
        return True

    # -- two-phase data movement (see the module docstring) -----------------------------------
    def lease(self, key: BlockKey) -> Any:
        """Pin ``key``'s bytes for :meth:`read_leased`; :class:`BlockNotFound` when absent."""
        self.length(key)
        return key

    def read_leased(self, lease: Any, outs: Sequence[Any]) -> None:
        """Scatter a leased block into ``outs``; :class:`CorruptBlock` when its bytes fail
        verification (the tier is not changed: the store drops the block)."""
        self.read_parts_into(lease, outs)

    def release(self, lease: Any) -> None:
        """End a lease; frees the bytes of a block deleted while leased."""

    def will_read(self, leases: Sequence[Any], streams: dict[int, tuple[int, ...]] | None = None) -> None:
        """A batch is about to read these leased blocks, in this order: a tier may start
        fetching them now (a hint: it raises nothing). ``streams``: the batch's record of
        what it reads, as :meth:`read_runs` of these leases left it. Here nothing happens."""

    def read_runs(self, leases: Sequence[Any], streams: dict[int, tuple[int, ...]] | None = None) -> list[range]:
        """``leases`` (in a batch's order) cut into runs that :meth:`read_leased_run`
        reads in one go: here each lease alone; the file tier joins adjacent records.
        ``streams``: a record the batch keeps for its tiers across its calls, which a
        tier may extend (the file tier's streams of back-to-back records)."""
        return [range(i, i + 1) for i in range(len(leases))]

    def start_leased_run(self, leases: Sequence[Any], outs: Sequence[Sequence[Any]]) -> Any:
        """Begin :meth:`read_leased_run` of a run; :meth:`finish_leased_run` of what this
        returns ends it. Here the read happens in the finish; a tier with
        :attr:`reads_queued` queues it now. What ``outs`` and the leases' bytes are read
        into and from must stay until it is finished."""
        return leases, outs

    def finish_leased_run(self, started: Any) -> list[CorruptBlock | None]:
        """The end of :meth:`start_leased_run`: each block's verification failure in its
        place (as :meth:`read_leased_run`); any other error is raised. Once per start."""
        return self.read_leased_run(*started)

    def read_leased_run(self, leases: Sequence[Any], outs: Sequence[Sequence[Any]]) -> list[CorruptBlock | None]:
        """:meth:`read_leased` of each lease of a run (see :meth:`read_runs`) into the
        matching ``outs``: each block's verification failure is returned in its place;
        any other error is raised."""
        return _errors_in_place(self.read_leased, leases, outs, CorruptBlock)

    def read_hot(self, key: BlockKey, outs: Sequence[Any]) -> bool:
        """Copy block ``key`` into ``outs`` while the caller holds the store's lock (a
        small block: no lease needed; :attr:`hot_reads`). False when the tier cannot
        (outputs that are not writable C-contiguous host buffers of the block's size,
        bytes not in host memory, checksums to verify or failing): the caller then leases it (a first output may have been
        written meanwhile: the outputs hold no valid data until that read)."""
        return False

    def hot_copy_job(self, key: BlockKey, outs: Sequence[Any]) -> Any:
        """:meth:`read_hot` of a batch, not copied yet (:attr:`defers_hot_copies`): what
        :meth:`copy_hot_jobs` copies, still under the same hold of the store's lock; None
        when the tier holds no such block."""
        return None

    def copy_hot_jobs(self, jobs: Sequence[Any]) -> list[bool]:
        """Copy the jobs of :meth:`hot_copy_job`, under the hold of the store's lock that
        made them; whether each was copied (False: its outputs refused, nothing written
        for it: the caller reads that block another way)."""
        raise NotImplementedError(f"{self.name} does not defer hot copies")

    def store_hot(self, key: BlockKey, parts: Sequence[Any], nbytes: int) -> bool:
        """Store ``parts`` (``nbytes`` in all) as block ``key`` while the caller holds the
        store's lock: the small-block form of :meth:`reserve`, :meth:`fill` and
        :meth:`commit` in one call. False, with nothing held or changed, when the tier
        cannot as it is (no room free, parts that are not host buffers of ``nbytes``,
        bytes not in host memory, checksums to compute); a copy that raises gives its
        room back first."""
        return False

    def current(self, key: BlockKey, lease: Any) -> bool:
        """Whether ``lease`` still names the bytes stored under ``key``."""
        return key in self

    def reserve(self, key: BlockKey, nbytes: int, *, parent: str | None = None) -> Any:
        """Claim room for a block of ``nbytes`` (:class:`TierFull` if none)."""
        if not self.fits(nbytes):
            raise TierFull(f"{self.name}: no room for {nbytes} bytes")
        return _Deferred(key, parent)

    def fill(self, handle: Any, parts: Sequence[Any]) -> None:
        """Copy ``parts`` into reserved room (on a concurrent tier, from any thread)."""
        handle.parts = parts

    def fill_many(self, handles: Sequence[Any], parts: Sequence[Sequence[Any]]) -> list[Exception | None]:
        """:meth:`fill` of each reserved room with the matching ``parts``: each fill's
        error in its place (None: filled); anything but an :class:`Exception` is raised."""
        return _errors_in_place(self.fill, handles, parts, Exception)

    def commit(self, key: BlockKey, handle: Any) -> None:
        """Publish a filled reservation under ``key`` (replacing a block of that key)."""
        self.put(key, handle.parts, parent=handle.parent)

    def discard(self, handle: Any) -> None:
        """Give back a reservation that will not be committed."""

    def _put_in_two_phases(self, key: BlockKey, parts: Sequence[Any], nbytes: int, parent: str | None) -> None:
        """:meth:`put` of a concurrent tier: reserve, fill (room given back on failure), commit."""
        handle = self.reserve(key, nbytes, parent=parent)
        try:
            self.fill(handle, parts)
        except BaseException:
            self.discard(handle)
            raise
        self.commit(key, handle)

    # -- what persistent tiers record (see the capability flags) --------------------------
    def parent_of(self, key: BlockKey) -> str | None:
        """The parent recorded with a block (persistent tiers; None elsewhere)."""
        return None

    def expires_of(self, key: BlockKey) -> float:
        """A block's recorded wall-clock expiry (0 = none, or a tier that keeps none)."""
        return 0.0

    def set_expiry(self, key: BlockKey, expires: float, *, batched: bool = False) -> None:
        """Record a block's wall-clock expiry (tiers with ``records_ttl``); ``batched``:
        it may be written later, with others."""
        raise NotImplementedError(f"{self.name} tier does not record TTLs")

    def sync(self) -> None:
        """Make every completed put durable (persistent tiers fsync; others do nothing)."""
        fsync_and_close(self.sync_fds())

    def sync_fds(self) -> list[int]:
        """Under the store's lock: :meth:`sync` up to its fsyncs, which it leaves to the
        caller, outside the lock (:func:`fsync_and_close`): a new descriptor of each file
        to fsync (it keeps its file open if the tier closes it meanwhile). None here."""
        return []

    def close(self) -> None:
        """Release the tier's resources (memory, files). Idempotent."""

    def stats(self) -> dict[str, Any]:
        """Tier-specific facts for reports (capacity and use at least)."""
        return {"capacity": self.capacity, "used": self.used, "blocks": len(self)}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _errors_in_place(call: Callable[[Any, Any], None], firsts: Sequence[Any], seconds: Sequence[Any],
                     caught: type[E]) -> list[E | None]:
    """``call(a, b)`` for each pair of ``firsts`` and ``seconds`` in order: each error of
    kind ``caught`` in its place (None: done); any other error is raised."""
    errors: list[E | None] = []
    for first, second in zip(firsts, seconds):
        try:
            call(first, second)
        except caught as exc:
            errors.append(exc)
        else:
            errors.append(None)
    return errors


def fsync_directory(path: str) -> None:
    """fsync the directory ``path``: the names made in it (a compaction's or adoption's
    new files) are durable before a name is removed (their sources). A file system that
    cannot fsync a directory (EINVAL, ENOTSUP) is left as it is (:func:`fsync_and_close`)."""
    fsync_and_close([os.open(path, os.O_RDONLY | os.O_DIRECTORY)])


def fsync_and_close(fds: Sequence[int]) -> None:
    """fsync each descriptor of ``fds`` (:meth:`Tier.sync_fds`: files, and directories
    whose new names must last), then close it: every one is tried and closed, and the
    first error raised after the last. A descriptor its file system cannot fsync (EINVAL,
    ENOTSUP: e.g. a directory there) is passed over."""
    error: OSError | None = None
    for fd in fds:
        try:
            os.fsync(fd)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
                error = error or exc
        finally:
            os.close(fd)
    if error is not None:
        raise error
