"""Compaction of the file tier: reclaiming the space of dead records.

A file whose dead fraction reaches ``compact_dead_fraction`` (the active file only once
it is ``seal_bytes`` long, or when the disk is full) has its live records and
still-needed tombstones copied to the active file, fsynced, and only then is it
unlinked. Records are verified on the way: a corrupt one is copied as it is (it still
fails its checksum) and the store told through ``on_corrupt``, which drops it unless
another rank pins it; then it stays, as a corrupt block in any tier does, until a later
read can drop it (the tier never drops a block the store still maps). Failure-atomic:
on a full disk or an I/O error the copies are cut off again, the file stays, the
attempt is counted (``compactions_deferred``) and retried after 16, 32, ... up to
``RETRY_MAX`` later changes. Files with reads or writes in flight are left alone until they end.
"""
from __future__ import annotations

import logging
import os

from ..errors import CascadeError, CorruptBlock
from .base import BlockKey
from .file_state import Loc, SegmentFile
from .records import HEADER_BYTES, RecordHeader

log = logging.getLogger("cascade.tiers.file_tier")
RETRY_MAX = 1024  # after a failed compaction, retry after 16, 32, ... up to this many changes


class Compaction:
    """The :class:`~cascade.tiers.file_tier.FileTier` methods that compact its files
    and bound its disk use (a mixin: it uses the tier's files, index and counters)."""

    def _needed_tombstones(self, f: SegmentFile) -> list[tuple[BlockKey, int, int]]:
        return [t for t in f.tombstones if t[1] in self._files and t[1] != f.file_id]

    def _after_change(self) -> None:
        """After a delete or commit: retry pending kills, then compact what is due.
        Never raises: a compaction that cannot run now is counted and retried later."""
        self._changes += 1
        self._retry_kills()
        self._maybe_flush_expiries()
        if self._compacting or self._changes < self._retry_at:
            return
        for f in self._due():
            if f.file_id in self._files and not self.compact(f.file_id):
                break  # the disk is full: the bigger ones would fail too

    def _due(self) -> list[SegmentFile]:
        """Files to compact: dead fraction at ``compact_dead_fraction`` or more (the
        active file only once it is ``seal_bytes`` long or the disk is full), no read or
        write in flight."""
        return sorted((f for f in self._files.values()
                if not f.users and f.size and 1.0 - f.live / f.size >= self._compact_fraction
                and (f is not self._active or f.size >= self.seal_bytes or self._disk_full)),
                key=lambda f: f.live)  # cheapest first: a dead file needs no room

    def compact(self, file_id: int) -> bool:
        """Move ``file_id``'s live records (and still-needed tombstones) to the active
        file, fsync them, then unlink it. Local; one read and one write per live record.
        Failure-atomic: on a full disk (or any I/O error) the copies are undone, the file
        stays as it was, and False is returned (counted in ``compactions_deferred``)."""
        f = self._files[file_id]
        moved: list[tuple[BlockKey, Loc, int, int]] = []
        carried: list[tuple[int, tuple[BlockKey, int, int]]] = []
        corrupt: list[BlockKey] = []  # found on the way: reported whether or not the compaction ends
        self._compacting = True
        mark = (self._active, self._active.size, self._next_id)
        try:
            if f is self._active:
                self._active = self._new_file()
            need = sum(l.record_bytes for l in self._index.values() if l.file_id == file_id)
            need += HEADER_BYTES * len(self._needed_tombstones(f))
            st = os.statvfs(self.directory)
            if st.f_bavail * st.f_frsize < need:  # cheap to find out: no backoff
                self.counters["compactions_deferred"] += 1
                self._undo_copies(*mark)
                return False
            for key, loc in [(k, l) for k, l in self._index.items() if l.file_id == file_id]:
                buf = bytearray(loc.length)
                lease = self.lease(key)
                try:
                    self.read_leased(lease, [buf])  # verified
                except CorruptBlock as exc:  # copied as it is: it still fails its checksum
                    log.warning("%s", exc)
                    corrupt.append(key)
                finally:
                    self.release(lease)
                header = RecordHeader(key[0], key[1], loc.length, loc.checksum, parent=loc.parent, expires=loc.expires)
                moved.append((key, loc, *self._append(header, [memoryview(buf)])))
            for tomb in self._needed_tombstones(f):
                key, tfile, toff = tomb
                header = RecordHeader(key[0], key[1], 0, 0, tombstone=True, target_file=tfile, target_offset=toff)
                carried.append((self._append(header, [])[0], tomb))
            for copy_id in {m[2] for m in moved} | {c[0] for c in carried}:
                os.fsync(self._files[copy_id].fd)  # durable before the originals go
        except (OSError, CascadeError) as exc:  # CascadeError: no file name left to take
            self._undo_copies(*mark)
            self.counters["compactions_deferred"] += 1
            self._retry_at = self._changes + self._retry_step
            self._retry_step = min(2 * self._retry_step, RETRY_MAX)
            if self.counters["compactions_deferred"] == 1:
                log.warning("%s: cannot compact %s now (%s): its dead space stays until there is room",
                            self.name, f.path, exc)
            return False
        finally:
            try:  # the store drops them (the kill of a dropped one's copy follows below); still
                if corrupt and self.on_corrupt is not None:  # compacting: its deletes compact nothing now
                    self.on_corrupt(corrupt)
            finally:
                self._compacting = False
        relocated = []
        for key, loc, new_file, new_offset in moved:
            if self._index.get(key) is loc:
                self._remember(key, Loc(new_file, new_offset, loc.length, loc.checksum, loc.parent, loc.expires))
                relocated.append(key)
            else:  # (not expected: the store's lock is held) a copy nobody maps must not come back
                self._kill_record(key, new_file, new_offset, loc.length)
        if relocated and self.on_relocate is not None:  # other ranks' readers learn the new places
            self.on_relocate(relocated)
        for copy_id, tomb in carried:
            self._files[copy_id].tombstones.append(tomb)
        self._drop_file(f)
        self.counters["compactions"] += 1
        self._retry_step = 16
        self._disk_full = False
        return True

    def _undo_copies(self, active: SegmentFile, size: int, next_id: int) -> None:
        """Cut a failed compaction's copies off: files it opened go, the active file it
        started from is truncated back to ``size`` and is active again."""
        for file_id in [i for i in self._files if i >= next_id]:
            self._drop_file(self._files[file_id])
        self._active, self._next_id = active, next_id
        try:
            os.ftruncate(active.fd, size)
        except OSError:  # the copies stay as dead bytes (later records win at a restart)
            return
        active.size = size

    def disk_bound(self, largest_record: int | None = None) -> int:
        """Most bytes this tier's files hold once no read or write is in flight and no
        compaction is deferred: ``capacity / (1 - f) + max(seal_bytes, largest record)``."""
        record = largest_record if largest_record is not None else max(
            (l.record_bytes for l in self._index.values()), default=0)
        return int(self._capacity / (1.0 - self._compact_fraction)) + max(self.seal_bytes, record)
