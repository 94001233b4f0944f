"""REMOTE tier: blocks kept in other ranks' DRAM, exposed as MPI RMA windows.

Bytes move with one-sided ``Put`` / ``Get`` between the caller's buffers and the target
window (no pickling, no copy through a staging buffer); space comes from chunk leases on
the targets (see :mod:`cascade.distributed.window_chunks`). Targets are the other ranks:
those on this rank's node first (shared memory), other nodes only when those are full. A
tier on a one-rank communicator has capacity 0: every put raises :class:`TierFull`.

A new lease probes at most :data:`PROBE_TARGETS` random targets per group (their lease
bitmaps in one overlapped round trip), not all P - 1: the cost of a put stays flat as the
job grows. The price: with most targets full, a put may be refused (:class:`TierFull`,
the store then demotes further down) although some unprobed rank had room.

Reading a block that another rank put: take ``(rank, location, length)`` from the
directory entry, pin it (``ShardedDirectory.add_ref``) so its owner does not free it, call
:meth:`RemoteTier.read_remote`, then release. The owner frees bytes only after a
directory ``remove`` that did not report the block pinned.

Collective: the constructor and :meth:`close` (every rank of ``comm`` must call them).
Everything else is local and one-sided. Not thread-safe (as every tier).
"""
from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checksum import checksum
from ..errors import BlockNotFound, CorruptBlock, InvalidBlock, TierFull
from ..buffers import as_byte_view, host_bytes
from ..tiers.base import BlockKey, Memory, Tier, TierKind
from ..tiers.slab import SlabAllocator
from .rma import load_mpi
from .window_chunks import CHUNK_BYTES, WORD_BITS, WindowChunks, chunks_needed, find_run

if TYPE_CHECKING:
    from mpi4py import MPI

PROBE_TARGETS = 4  # lease bitmaps read per group when a put needs a new lease


@dataclass(eq=False)
class _Lease:
    rank: int
    first: int          # first chunk
    run: int            # chunks
    base: int           # byte offset of the lease in the rank's window
    alloc: SlabAllocator
    blocks: int = 0


@dataclass(slots=True)
class _Block:
    lease: _Lease
    offset: int         # inside the lease
    length: int
    checksum: int | None


@dataclass(slots=True)
class _Reserved:
    """Room taken in a lease for a put: the bytes are copied in at commit."""
    lease: _Lease
    offset: int
    nbytes: int
    parts: Sequence[Any] = ()


class RemoteTier(Tier):
    """Blocks in the DRAM windows of the other ranks of ``comm`` (default
    ``MPI.COMM_SELF``: no other rank, capacity 0). Every rank exposes ``exposed_bytes``
    (rounded down to whole ``chunk_bytes``) to the others. ``verify=True`` keeps an XXH3
    checksum per block and checks whole-block reads (:class:`CorruptBlock` on mismatch)."""

    name = "remote"
    kind = TierKind.REMOTE
    memory = Memory.PEER
    collective = True

    def __init__(self, comm: MPI.Comm | None = None, exposed_bytes: int = 0, *,
                 chunk_bytes: int = CHUNK_BYTES, verify: bool = False) -> None:
        if comm is None:
            comm = load_mpi().COMM_SELF
        self.windows: WindowChunks | None = WindowChunks(comm, exposed_bytes, chunk_bytes=chunk_bytes)
        self._verify = verify
        self.rank = comm.Get_rank()
        size = comm.Get_size()
        others = [(self.rank + k) % size for k in range(1, size)]  # rotated: spreads the load
        usable = [t for t in others if self.windows.chunks[t]]
        here = self.windows.nodes[self.rank]
        self._groups = [g for g in ([t for t in usable if self.windows.nodes[t] == here],
                                    [t for t in usable if self.windows.nodes[t] != here]) if g]
        self._capacity = sum(self.windows.window_bytes(t) for t in usable)
        self._leases: dict[int, list[_Lease]] = {t: [] for t in usable}
        self._blocks: dict[BlockKey, _Block] = {}
        self._used = 0
        self._rng = random.Random(self.rank)
        self._hint: tuple[int, int, list[int]] | None = None  # fits()'s probe, for the next put

    # -- capacity ------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Bytes of all other ranks' windows: the pool this rank draws from (shared with
        the other ranks, so :attr:`free` is the better guide)."""
        return self._capacity

    @property
    def used(self) -> int:
        return self._used

    @property
    def free(self) -> int:
        """Bytes free in this rank's leases plus unleased chunks on every target (reads
        the targets' lease bitmaps: one overlapped round trip)."""
        spare = sum(lease.alloc.size - lease.alloc.allocated for ls in self._leases.values() for lease in ls)
        if not self._leases:
            return spare
        bitmaps = self.windows.bitmaps(list(self._leases))
        chunk = self.windows.chunk_bytes
        return spare + sum((self.windows.chunks[t] - sum(bin(w).count("1") for w in words)) * chunk
                           for t, words in bitmaps.items())

    def fits(self, nbytes: int) -> bool:
        """Whether a lease has room for ``nbytes`` or some target a free run of chunks."""
        if any(lease.alloc.can_fit(nbytes) for ls in self._leases.values() for lease in ls):
            return True
        for g, group in enumerate(self._groups):
            found = self._free_target(group, nbytes)
            if found is not None:
                self._hint = (g, *found)  # the put that follows leases there: no second probe
                return True
        return False

    # -- Tier interface ------------------------------------------------------------------
    def put(self, key: BlockKey, parts: Sequence[Any], *, parent: str | None = None) -> None:
        """Store the parts back to back on some other rank: one ``Put`` per part and one
        ``Flush`` (plus 2 round trips when a new lease is needed). Raises :class:`TierFull`
        when no target has room; the tier is then unchanged. ``parent`` is not kept
        (nothing here survives a restart)."""
        views = [memoryview(host_bytes(p, "block part")) for p in parts]
        room = self.reserve(key, sum(v.nbytes for v in views))
        try:
            self._write(key, room, views)
        except BaseException:
            self.discard(room)
            raise

    def reserve(self, key: BlockKey, nbytes: int, *, parent: str | None = None) -> _Reserved:
        """Take room for a block of ``nbytes`` now (:class:`TierFull` if none), so that
        claims made together never count on the same room; the bytes go in at
        :meth:`commit`. ``parent`` is not kept."""
        lease, offset = self._allocate(nbytes)
        return _Reserved(lease, offset, nbytes)

    def commit(self, key: BlockKey, handle: _Reserved) -> None:
        """Copy the filled parts into their room and enter the block (all or nothing: after
        a failed copy the room is still reserved)."""
        self._write(key, handle, [memoryview(host_bytes(p, "block part")) for p in handle.parts])

    def discard(self, handle: _Reserved) -> None:
        self._free(handle.lease, handle.offset, handle.nbytes)

    def _write(self, key: BlockKey, room: _Reserved, views: list[memoryview]) -> None:
        """``views`` into ``room`` on its rank, then the block entered under ``key``."""
        nbytes = sum(v.nbytes for v in views)
        if nbytes != room.nbytes:
            raise InvalidBlock(f"remote tier: {nbytes} bytes for room of {room.nbytes}")
        self.windows.put(room.lease.rank, room.lease.base + room.offset, views)
        if key in self._blocks:
            self._drop(key)
        self._blocks[key] = _Block(room.lease, room.offset, nbytes, checksum(views) if self._verify else None)
        self._used += nbytes

    def length(self, key: BlockKey) -> int:
        return self._block(key).length

    def location(self, key: BlockKey) -> tuple[int, int, int]:
        """``(rank, location, length)`` of a block: what to publish in the directory so
        that any rank can :meth:`read_remote` it."""
        block = self._block(key)
        return block.lease.rank, block.lease.base + block.offset, block.length

    def read_into(self, key: BlockKey, out: Any, offset: int = 0) -> None:
        """One ``Get`` from the holding rank straight into ``out``, then ``Flush``."""
        block = self._block(key)
        view = _writable(out)
        n = view.nbytes
        if offset < 0 or offset + n > block.length:
            raise InvalidBlock(f"read of {n} bytes at offset {offset} of a {block.length}-byte block")
        self.windows.get_into(block.lease.rank, block.lease.base + block.offset + offset, (view,))
        if block.checksum is not None and n == block.length:
            _check(key, [view], block.checksum)

    def read_parts_into(self, key: BlockKey, outs: Sequence[Any]) -> None:
        """The whole block scattered into ``outs``: one ``Get`` per buffer, one ``Flush``."""
        block = self._block(key)
        views = [_writable(o) for o in outs]
        if sum(v.nbytes for v in views) != block.length:
            raise InvalidBlock(f"output buffers hold {sum(v.nbytes for v in views)} bytes, block has {block.length}")
        self.windows.get_into(block.lease.rank, block.lease.base + block.offset, views)
        if block.checksum is not None:
            _check(key, views, block.checksum)

    def read_remote(self, rank: int, location: int, out: Any, *, checksum: int | None = None) -> None:
        """Read ``len(out)`` bytes at ``location`` of ``rank``'s window: a block another
        rank put (take rank, location, length and checksum from its directory entry, and
        pin it first). With ``checksum``, :class:`CorruptBlock` if the bytes differ."""
        self.read_remote_parts(rank, location, [out], checksum=checksum)

    def read_remote_parts(self, rank: int, location: int, outs: Sequence[Any], *,
                          checksum: int | None = None) -> None:
        """:meth:`read_remote` scattered into consecutive buffers: one ``Get`` each, one ``Flush``."""
        views = [_writable(o) for o in outs]
        self.windows.get_into(rank, location, views)
        if checksum is not None:
            _check((rank, location), views, checksum)

    def __delitem__(self, key: BlockKey) -> None:
        self._block(key)
        self._drop(key)

    def __iter__(self) -> Iterator[BlockKey]:
        return iter(list(self._blocks))

    def __len__(self) -> int:
        return len(self._blocks)

    def close(self) -> None:
        """Collective: free the windows (all blocks are lost). Idempotent."""
        if self.windows is not None:
            self._blocks.clear()
            self._leases.clear()
            self._groups = []
            self._used = 0
            self.windows.free()
            self.windows = None

    def stats(self) -> dict[str, Any]:
        leases = [lease for ls in self._leases.values() for lease in ls]
        return {**super().stats(), "leases": len(leases),
                "lent_bytes": self.windows.window_bytes(self.rank) if self.windows is not None else 0,
                "leased_bytes": sum(lease.alloc.size for lease in leases),
                "targets": [t for group in self._groups for t in group]}

    # -- internals -----------------------------------------------------------------------
    def _block(self, key: BlockKey) -> _Block:
        block = self._blocks.get(key)
        if block is None:
            raise BlockNotFound(f"{key[0]}/{key[1]} is not in the remote tier")
        return block

    def _allocate(self, nbytes: int) -> tuple[_Lease, int]:
        """Room for ``nbytes``: in a lease on this node, a new lease on this node, a lease
        elsewhere, a new lease elsewhere, in that order."""
        hint, self._hint = self._hint, None
        for g, group in enumerate(self._groups):
            for target in group:
                for lease in self._leases[target]:
                    if lease.alloc.can_fit(nbytes):
                        lease.blocks += 1
                        return lease, lease.alloc.alloc(nbytes)
            found = hint[1:] if hint is not None and hint[0] == g else self._free_target(group, nbytes)
            while found is not None:
                target, words = found
                lease = self._lease(target, nbytes, words)
                if lease is not None:
                    lease.blocks += 1
                    return lease, lease.alloc.alloc(nbytes)
                found = self._free_target(group, nbytes)  # lost a race for the run: re-read
        raise TierFull(f"remote tier: no rank has {nbytes} contiguous bytes free "
                       f"(of {self._capacity} bytes lent by {sum(map(len, self._groups))} other ranks, "
                       f"in chunks of {self.windows.chunk_bytes if self.windows else 0})")

    def _free_target(self, group: list[int], nbytes: int) -> tuple[int, list[int]] | None:
        """Of up to :data:`PROBE_TARGETS` random targets of ``group``, the one with the most
        free chunks among those with a free run big enough, and its bitmap words; one
        overlapped round trip."""
        run = chunks_needed(SlabAllocator.footprint(nbytes), self.windows.chunk_bytes)
        probe = group if len(group) <= PROBE_TARGETS else self._rng.sample(group, PROBE_TARGETS)
        best, best_free = None, 0
        for target, words in self.windows.bitmaps(probe).items():
            chunks = self.windows.chunks[target]
            has_run = any(find_run(w, min(WORD_BITS, chunks - i * WORD_BITS), run) is not None
                          for i, w in enumerate(words))
            free = chunks - sum(bin(w).count("1") for w in words)
            if has_run and free > best_free:
                best, best_free = (target, words), free
        return best

    def _lease(self, target: int, nbytes: int, words: list[int]) -> _Lease | None:
        run = chunks_needed(SlabAllocator.footprint(nbytes), self.windows.chunk_bytes)
        first = self.windows.lease(target, run, words)
        if first is None:
            return None
        chunk = self.windows.chunk_bytes
        lease = _Lease(target, first, run, first * chunk, SlabAllocator(run * chunk))
        self._leases[target].append(lease)
        return lease

    def _drop(self, key: BlockKey) -> None:
        block = self._blocks.pop(key)
        self._used -= block.length
        self._free(block.lease, block.offset, block.length)

    def _free(self, lease: _Lease, offset: int, nbytes: int) -> None:
        lease.alloc.free(offset, nbytes)
        lease.blocks -= 1
        if lease.blocks == 0:  # give the chunks back for any rank to lease
            self._leases[lease.rank].remove(lease)
            self.windows.unlease(lease.rank, lease.first, lease.run)


def _check(what: object, views: list[memoryview], expected: int) -> None:
    if checksum(views) != expected:
        raise CorruptBlock(f"remote tier: {what} failed its checksum")


def _writable(out: Any) -> memoryview:
    return as_byte_view(out, "output buffer", writable=True)
