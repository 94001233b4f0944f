"""Writes of the file tier: a record appended at the end of the active file.

A write runs in two phases (see :mod:`.base`): :meth:`Writes.reserve` claims the record's
range at the end of the active file under the store's lock (rolling to a new file at
``seal_bytes``), :meth:`Writes.fill` checksums and ``pwritev``s it outside the lock, and
:meth:`Writes.commit` or :meth:`Writes.discard` ends it under the lock again. A full disk
(ENOSPC, EDQUOT, EFBIG) is a counted :class:`TierFull` (``full_events``) and lets the next
compaction take the active file too. A commit that replaces a block kills its old record
in place, or voids it when it lies after the new one (a compaction's copy, see
:meth:`~.file_tier.FileTier._void_record`), so a restart keeps the new one.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..buffers import host_bytes
from ..checksum import checksum
from ..errors import FULL_ERRNOS, TierFull
from .base import BlockKey
from .file_state import Loc, SegmentFile
from .record_io import pwritev_all
from .records import PAGE, RecordHeader, key_seed, pad

_ZEROS = bytes(PAGE)


@dataclass(slots=True, eq=False)
class Reservation:
    """Room claimed at the end of a file for one record, written outside the lock."""
    file: SegmentFile
    header: RecordHeader
    offset: int
    written: bool = False


class Writes:
    """The :class:`~cascade.tiers.file_tier.FileTier` methods that write its records (a
    mixin: it uses the tier's files, index, capacity and counters)."""

    def put(self, key: BlockKey, parts: Sequence[Any], *, parent: str | None = None) -> None:
        views = [memoryview(host_bytes(p, "block part")) for p in parts]
        self._put_in_two_phases(key, views, sum(v.nbytes for v in views), parent)

    def reserve(self, key: BlockKey, nbytes: int, *, parent: str | None = None) -> Reservation:
        """Claim the next record's room at the end of the active file (rolling to a new
        file at ``seal_bytes``). :class:`TierFull` when over capacity."""
        if not self.fits(nbytes):
            raise TierFull(f"{self.name}: no room for {nbytes} bytes ({self.free} of {self._capacity} free)")
        expires = self.expiry_of(key) if self.expiry_of is not None else 0.0
        header = RecordHeader(key[0], key[1], nbytes, 0, parent=parent, expires=expires)
        try:
            f = self._room_for(header.record_bytes)
        except OSError as exc:  # a new file cannot be made (no space or inode left): a full tier, as a write's
            if exc.errno not in FULL_ERRNOS:
                raise
            self.counters["full_events"] += 1
            self._disk_full = True
            raise TierFull(f"{self.name}: cannot create a file in {self.directory}: {exc.strerror}") from exc
        reservation = Reservation(f, header, f.size)
        self.behind = self._compacting and self._over_bound()
        f.size += header.record_bytes
        f.users += 1
        self._reserved_bytes += header.record_bytes
        return reservation

    def fill(self, reservation: Reservation, parts: Sequence[Any]) -> None:
        """Checksum and write the record (one ``pwritev``, fsync if configured). Writes
        only its own range: safe beside any other call. :class:`TierFull` on a full disk."""
        views = [memoryview(host_bytes(p, "block part")) for p in parts]
        header = reservation.header
        if sum(v.nbytes for v in views) != header.payload_len:
            raise ValueError(f"{self.name}: parts hold {sum(v.nbytes for v in views)} bytes, reserved {header.payload_len}")
        header = replace(header, checksum=checksum(views, key_seed(header.namespace, header.block_id)))
        self._write_record(reservation.file, header, views, reservation.offset)
        reservation.header, reservation.written = header, True

    def commit(self, key: BlockKey, reservation: Reservation) -> None:
        header, f = reservation.header, reservation.file
        self._unreserve(reservation)
        if key in self._index:  # replaced: the old record must not come back at a restart
            old = self._index[key]
            if (old.file_id, old.offset) > (f.file_id, reservation.offset):
                self._forget(key)  # a copy compaction wrote after this record was reserved
                self._void_record(key, old.file_id, old.offset, old.length)
            else:
                self._kill(key)
        self._remember(key, Loc(f.file_id, reservation.offset, header.payload_len, header.checksum,
                                 header.parent, header.expires))
        self._after_change()

    def discard(self, reservation: Reservation) -> None:
        """Give the room back: cut it off the file's end when it is last, else void it (a
        tombstone that kills only itself, whatever was written there: a whole record that
        lost a race with a put of its id, or a header a full disk cut short). A tombstone
        in place would kill every earlier record of the key at a restart, the live one
        included."""
        self._unreserve(reservation)
        f, size = reservation.file, reservation.header.record_bytes
        if f.size == reservation.offset + size:
            try:
                os.ftruncate(f.fd, reservation.offset)
                f.size = reservation.offset
                return
            except OSError:
                pass
        header = reservation.header
        self._void_record((header.namespace, header.block_id), f.file_id, reservation.offset, header.payload_len)

    def _unreserve(self, reservation: Reservation) -> None:
        reservation.file.users -= 1
        self._reserved_bytes -= reservation.header.record_bytes

    def _room_for(self, record_bytes: int) -> SegmentFile:
        """The active file, or a new one when this record would pass ``seal_bytes``."""
        if self._active.size and self._active.size + record_bytes > self.seal_bytes:
            self._active = self._new_file()
        return self._active

    def _record_iov(self, header: RecordHeader, views: Sequence[memoryview]) -> list[Any]:
        """A record's buffers as written: header page, payload, zeros to the next page."""
        tail = pad(header.payload_len) - header.payload_len
        return [header.pack(self._header_key), *views] + ([memoryview(_ZEROS)[:tail]] if tail else [])

    def _write_record(self, f: SegmentFile, header: RecordHeader, views: Sequence[memoryview], offset: int) -> None:
        try:
            pwritev_all(f.fd, self._record_iov(header, views), offset)
            if self._fsync:
                os.fsync(f.fd)
        except OSError as exc:
            if exc.errno in FULL_ERRNOS:
                self.counters["full_events"] += 1
                self._disk_full = True
                raise TierFull(f"{self.name}: {f.path}: {exc.strerror}") from exc
            raise
