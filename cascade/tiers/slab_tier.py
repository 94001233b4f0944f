"""A tier that keeps blocks in one preallocated slab: the shared core of GPU and SHM.

Subclasses provide the slab (``_region``: its bytes as a buffer to copy to or from); this
class does the copies, the index, allocation, accounting and optional checksums.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..buffers import copy, copy_each
from ..buffers import nbytes as _nbytes
from ..buffers.batch import batches_open
from ..buffers.hostcopy import copy_in, copy_in_many, copy_out, copy_out_many
from ..buffers.splitcopy import BATCH_SPLIT_MIN, shared
from ..checksum import checksum
from ..errors import BlockNotFound, CorruptBlock, TierFull
from .base import BlockKey, Tier
from .slab import SlabAllocator


@dataclass(slots=True, eq=False)
class _Slot:
    offset: int
    length: int
    checksum: int | None = None
    readers: int = 0  # leases (reads in flight)
    dead: bool = False  # deleted while leased: the last lease frees it


class SlabTier(Tier):
    """Blocks in ``[0, capacity)`` of a slab, placed by a first-fit allocator.

    ``verify=True`` stores an XXH3 checksum per block and checks it on every read
    (costs about one extra pass over the data). ``split_copies=False`` keeps a big host
    copy on the calling thread (:func:`~cascade.buffers.splitcopy.shared`);
    ``stream_copies=False`` writes every host copy through the cache (``stream`` of
    :mod:`~cascade.buffers.hostcopy`).
    """

    concurrent = True
    zero_copy = True
    reads_into_device = True  # a slab copy goes between any two buffers (cascade.buffers.copy)

    def __init__(self, capacity: int, *, verify: bool = False, split_copies: bool = True,
                 stream_copies: bool = True) -> None:
        self._capacity = capacity
        self._split_copies = split_copies
        self._stream = stream_copies
        self._alloc = SlabAllocator(capacity)
        self._index: dict[BlockKey, _Slot] = {}
        self._used = 0
        self._verify = verify
        self._backed = capacity  # bytes from the slab's start backed by memory (SHM: see _back)
        # The slab as a writable host memoryview, set by a subclass whose slab lives in host
        # memory, unless it verifies checksums: what read_hot() and store_hot() copy through
        # (buffers.hostcopy: one call per block; a numpy copy's call overhead is 10x a 4 KiB block's).
        self._hot_host: memoryview | None = None

    # -- subclass hooks ---------------------------------------------------------------
    def _region(self, offset: int, length: int) -> Any:
        """Slab bytes ``[offset, offset + length)`` as a buffer to copy to or from, with
        nothing pending on it (copies into the slab are synchronised before a commit)."""
        raise NotImplementedError

    def _slab_view(self, offset: int, length: int) -> Any:
        """A read-only buffer over slab bytes (for checksums)."""
        raise NotImplementedError

    def _back(self, end: int) -> None:
        """Back the slab with memory up to at least ``end`` (past :attr:`_backed`) and
        raise :attr:`_backed` so far; :class:`TierFull` when it cannot (nothing changed
        then). A slab backed whole from the start never gets here."""
        raise NotImplementedError

    # -- Tier interface ---------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def used(self) -> int:
        return self._used

    @property
    def free(self) -> int:
        return self._capacity - self._alloc.allocated

    def fits(self, nbytes: int) -> bool:
        return self._alloc.can_fit(nbytes)

    def put(self, key: BlockKey, parts: Sequence[Any], *, parent: str | None = None) -> None:
        self._put_in_two_phases(key, parts, sum(_nbytes(p) for p in parts), parent)

    def reserve(self, key: BlockKey | None, nbytes: int, *, parent: str | None = None) -> _Slot:
        """Claim slab space for ``nbytes`` (any key: a put may reserve before its id is
        known), backing it with memory first if it lies past what is backed (:meth:`_back`).
        :class:`TierFull` if it does not fit or cannot be backed (nothing is claimed then)."""
        if nbytes > self._capacity:
            raise TierFull(f"{self.name}: block of {nbytes} bytes exceeds the tier's capacity of {self._capacity}")
        slot = _Slot(self._alloc.alloc(nbytes), nbytes)
        if slot.offset + nbytes > self._backed:
            try:
                self._back(slot.offset + nbytes)
            except BaseException:
                self.discard(slot)
                raise
        return slot

    def fill(self, slot: _Slot, parts: Sequence[Any]) -> None:
        """Copy ``parts`` into reserved space (and checksum it when verifying). Touches
        only that space: safe beside any other call."""
        # host slab, no checksums, numpy parts, no device batch open (as read_leased):
        # one hostcopy call (as read_leased's)
        if (self._hot_host is not None and not batches_open() and all(type(p) is np.ndarray for p in parts)
                and copy_in(self._hot_host, slot.offset, slot.offset + slot.length, parts,
                            shared(slot.length, self._split_copies), self._stream)):
            return
        sizes = [_nbytes(p) for p in parts]
        if sum(sizes) != slot.length:
            raise ValueError(f"{self.name}: parts hold {sum(sizes)} bytes, reserved {slot.length}")
        copies, pos = [], slot.offset
        for part, n in zip(parts, sizes):
            copies.append((self._region(pos, n), part))
            pos += n
        copy_each(copies, what="slab room")  # device parts: one synchronisation per stream for the block
        if self._verify:
            slot.checksum = checksum([self._slab_view(slot.offset, slot.length)])

    def fill_many(self, slots: Sequence[_Slot], parts: Sequence[Sequence[Any]]) -> list[Exception | None]:
        """A host slab's (no checksums) fills of numpy parts in one compiled call
        (``copy_in_many``: shared with the copy helper and streamed as one copy of their
        sum), unless a device batch is open (as :meth:`fill`); a fill that call refuses
        (other parts, wrong sizes) is made on its own, by :meth:`fill`."""
        if self._hot_host is None or batches_open():
            return super().fill_many(slots, parts)
        rest = self._copy_gathered(copy_in_many, slots, parts)
        errors: list[Exception | None] = [None] * len(slots)
        for j, error in zip(rest, super().fill_many([slots[j] for j in rest], [parts[j] for j in rest])):
            errors[j] = error
        return errors

    def commit(self, key: BlockKey, slot: _Slot) -> None:
        if key in self._index:
            self._release(key)
        self._index[key] = slot
        self._used += slot.length

    def discard(self, slot: _Slot) -> None:
        self._alloc.free(slot.offset, slot.length)

    def lease(self, key: BlockKey) -> _Slot:
        slot = self._slot(key)
        slot.readers += 1
        return slot

    def read_leased(self, slot: _Slot, outs: Sequence[Any]) -> None:
        # host slab, no checksums, numpy outputs, no device batch open in this process (whose
        # copies in flight the generic copy would settle first): hostcopy, as read_hot's (from
        # 256 KiB without the interpreter lock where compiled, and then on two cores: splitcopy)
        if (self._hot_host is not None and not batches_open() and all(type(o) is np.ndarray for o in outs)
                and copy_out(self._hot_host, slot.offset, slot.offset + slot.length, outs,
                             shared(slot.length, self._split_copies), self._stream)):
            return
        sizes = [_nbytes(o) for o in outs]
        if sum(sizes) != slot.length:
            raise ValueError(f"output buffers hold {sum(sizes)} bytes, block has {slot.length}")
        if self._verify and checksum([self._slab_view(slot.offset, slot.length)]) != slot.checksum:
            # The bytes stay allocated: the store withdraws every reference first.
            raise CorruptBlock(f"{self.name}: block at offset {slot.offset} failed its checksum")
        copies, pos = [], slot.offset
        for out, size in zip(outs, sizes):
            copies.append((out, self._region(pos, size)))
            pos += size
        copy_each(copies)  # device outputs: one synchronisation per stream for the block

    def read_runs(self, leases: Sequence[_Slot], streams: dict[int, tuple[int, ...]] | None = None) -> list[range]:
        """A host slab (no checksums) reads a batch's leased blocks in one run (:meth:`read_leased_run`)."""
        if self._hot_host is None:
            return super().read_runs(leases, streams)
        return [range(len(leases))] if leases else []

    def read_leased_run(self, leases: Sequence[_Slot], outs: Sequence[Sequence[Any]]) -> list[CorruptBlock | None]:
        """A run's copies into numpy outputs in one compiled call (``copy_out_many``:
        shared with the copy helper and streamed as one copy of their sum), unless a
        device batch is open (as :meth:`read_leased`); a block that call refuses (other
        outputs, wrong sizes) is read on its own, by :meth:`read_leased`."""
        if self._hot_host is None or batches_open():
            return super().read_leased_run(leases, outs)
        rest = self._copy_gathered(copy_out_many, leases, outs)
        super().read_leased_run([leases[j] for j in rest], [outs[j] for j in rest])  # raises what they raise
        return [None] * len(leases)

    def _copy_gathered(self, copy_many: Callable[..., list[bool]], slots: Sequence[_Slot],
                       buffers: Sequence[Sequence[Any]]) -> list[int]:
        """One ``copy_many`` call (``copy_in_many`` or ``copy_out_many``) between the host
        slab and every slot's buffers that are all numpy arrays, shared with the copy
        helper and streamed as one copy of their sum; the indices it did not copy (other
        buffers, or refused: nothing written)."""
        plain = [all(type(b) is np.ndarray for b in bufs) for bufs in buffers]
        jobs = [(slot.offset, slot.offset + slot.length, bufs) for slot, bufs, ok in zip(slots, buffers, plain) if ok]
        total = sum(slot.length for slot, ok in zip(slots, plain) if ok)
        took = iter(copy_many(self._hot_host, jobs, shared(total, self._split_copies), self._stream))
        return [j for j, ok in enumerate(plain) if not ok or not next(took)]

    def leased_view(self, slot: _Slot) -> Any:
        if self._verify and checksum([self._slab_view(slot.offset, slot.length)]) != slot.checksum:
            raise CorruptBlock(f"{self.name}: block at offset {slot.offset} failed its checksum")
        return self._read_only(slot.offset, slot.length)

    def _read_only(self, offset: int, length: int) -> Any:
        """Slab bytes ``[offset, offset + length)`` as an array the caller cannot write
        through (where the array library can say so: cupy arrays have no such flag)."""
        view = self._slab_array()[offset:offset + length]
        if isinstance(view, np.ndarray):
            view = view.view()
            view.flags.writeable = False
        return view

    def _slab_array(self) -> Any:
        """The whole slab as a uint8 array (numpy or cupy)."""
        raise NotImplementedError

    # read_hot() and store_hot() run per block under the store's lock: one call copies the
    # block's buffers (buffers.hostcopy: compiled where built), or refuses them having written nothing.
    def read_hot(self, key: BlockKey, outs: Sequence[Any]) -> bool:
        slot = self._index.get(key)
        if self._hot_host is None or slot is None:
            return False
        return copy_out(self._hot_host, slot.offset, slot.offset + slot.length, outs, False, self._stream)

    def hot_copy_job(self, key: BlockKey, outs: Sequence[Any]) -> tuple[int, int, Sequence[Any]] | None:
        slot = self._index.get(key)
        if self._hot_host is None or slot is None:
            return None
        return slot.offset, slot.offset + slot.length, outs

    def copy_hot_jobs(self, jobs: Sequence[tuple[int, int, Sequence[Any]]]) -> list[bool]:
        total = sum(last - pos for pos, last, _ in jobs)
        return copy_out_many(self._hot_host, jobs, shared(total, self._split_copies, BATCH_SPLIT_MIN), self._stream)

    def store_hot(self, key: BlockKey, parts: Sequence[Any], nbytes: int) -> bool:
        # reserve() and commit() written out: this runs per put.
        host = self._hot_host
        if host is None or nbytes > self._capacity:
            return False
        alloc = self._alloc
        try:
            pos = alloc.alloc(nbytes)
        except TierFull:
            return False
        try:  # the room is this call's own until its commit: given back on every other way out
            if pos + nbytes > self._backed:
                self._back(pos + nbytes)
            if copy_in(host, pos, pos + nbytes, parts, False, self._stream):
                index = self._index
                if key in index:
                    self._release(key)
                index[key] = _Slot(pos, nbytes)
                self._used += nbytes
                return True
        except TierFull:  # the room could not be backed
            pass
        except BaseException:
            alloc.free(pos, nbytes)
            raise
        alloc.free(pos, nbytes)
        return False

    def release(self, slot: _Slot) -> None:
        slot.readers -= 1
        if slot.dead and not slot.readers:
            self._alloc.free(slot.offset, slot.length)

    def current(self, key: BlockKey, slot: _Slot) -> bool:
        return self._index.get(key) is slot

    def length(self, key: BlockKey) -> int:
        return self._slot(key).length

    def offset(self, key: BlockKey) -> int:
        """Where the block starts in the slab (its location for node peers)."""
        return self._slot(key).offset

    def read_into(self, key: BlockKey, out: Any, offset: int = 0) -> None:
        slot = self._slot(key)
        n = _nbytes(out)
        if offset < 0 or offset + n > slot.length:
            raise ValueError(f"read of {n} bytes at {offset} outside a block of {slot.length}")
        if self._verify and offset == 0 and n == slot.length:
            self._check(key, slot)
        copy(out, self._region(slot.offset + offset, n))

    def read_parts_into(self, key: BlockKey, outs: Sequence[Any]) -> None:
        self.read_leased(self._slot(key), outs)

    def __delitem__(self, key: BlockKey) -> None:
        self._slot(key)
        self._release(key)

    def __iter__(self) -> Iterator[BlockKey]:
        return iter(list(self._index))

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    # -- helpers ----------------------------------------------------------------------
    def _slot(self, key: BlockKey) -> _Slot:
        try:
            return self._index[key]
        except KeyError:
            raise BlockNotFound(f"{self.name}: no block {key[1]} in namespace {key[0]!r}") from None

    def _release(self, key: BlockKey) -> None:
        slot = self._index.pop(key)
        self._used -= slot.length
        if slot.readers:
            slot.dead = True  # a read is copying it out: the last lease frees the space
        else:
            self._alloc.free(slot.offset, slot.length)

    def _check(self, key: BlockKey, slot: _Slot) -> None:
        # The bytes stay allocated: the owner frees them only after withdrawing every
        # reference (another rank may hold a directory entry pointing here).
        if checksum([self._slab_view(slot.offset, slot.length)]) != slot.checksum:
            raise CorruptBlock(f"{self.name}: block {key[1]} failed its checksum")

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "allocated": self._alloc.allocated}
