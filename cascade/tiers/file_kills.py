"""Deletes of the file tier on disk: a record killed in place (its header rewritten
as a tombstone of itself, or as a void that kills only itself), written at once
without a store and by the store's housekeeper outside its lock with one; a kill
that cannot be written is kept pending and retried at later changes (while one that a
restart decided on is, no file goes: see :mod:`.file_recovery`).
"""
from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager
from typing import Any

from .base import BlockKey
from .file_state import Kill
from .records import HEADER_BYTES, RecordHeader

log = logging.getLogger("cascade.tiers.file_tier")


class Kills:
    """The :class:`~cascade.tiers.file_tier.FileTier` methods that kill records on disk
    (a mixin: it uses the tier's index, files, hooks and fsync setting)."""

    def _kill(self, key: BlockKey) -> None:
        """Forget ``key`` and kill its record on disk, so a restart forgets it too."""
        loc = self._forget(key)
        self._kill_record(key, loc.file_id, loc.offset, loc.length)

    def _kill_record(self, key: BlockKey, file_id: int, offset: int, length: int, *, void: bool = False) -> None:
        """Rewrite a record's header as a tombstone of itself (same length: needs no new
        space), which a restart reads as killing every earlier record of its key too;
        with ``void``, as a tombstone naming no record (file 0), which kills only itself
        (for a record lying after the key's live one: a compaction's copy). With a store
        the write is queued for its housekeeper, the file held (``users``: neither
        compacted nor closed) until it is written; else written now. On an I/O error the
        kill is kept pending (retried at later changes)."""
        f = self._files.get(file_id)
        if f is None:
            return
        kill = (key, file_id, offset, length, void)
        if self.on_housekeeping_due is None:
            if not self._write_kill(f.fd, kill):
                self._keep_pending([kill])
            return
        f.users += 1  # (a dup of its descriptor instead waited for ms when the process's table grew)
        self._queued_kills.append((kill, f))
        if len(self._queued_kills) == 1:
            self.on_housekeeping_due()

    def _void_record(self, key: BlockKey, file_id: int, offset: int, length: int) -> None:
        self._kill_record(key, file_id, offset, length, void=True)

    def _write_kill(self, fd: int, kill: Kill, *, sync: bool = True) -> bool:
        """Write one kill (or void) into its file's descriptor ``fd`` (fsynced with
        ``file_fsync`` and ``sync``); whether it was written. Touches one header only:
        safe outside the store's lock."""
        key, file_id, offset, length, void = kill
        target = (0, 0) if void else (file_id, offset)
        tomb = RecordHeader(key[0], key[1], length, 0, tombstone=True, target_file=target[0], target_offset=target[1])
        try:
            if os.pwrite(fd, tomb.pack(self._header_key), offset) != HEADER_BYTES:
                return False
            if self._fsync and sync:
                os.fsync(fd)
        except OSError:
            return False
        return True

    def _keep_pending(self, failed: list[Kill]) -> None:
        if failed and not self._pending_kills:
            log.warning("%s: cannot record a delete in %s: kept pending (retried at later changes; "
                        "a restart before it is written may serve the block again)", self.name, self.directory)
        self._pending_kills.extend(failed)

    def _retry_kills(self) -> None:
        """Under the lock: write the pending kills again (one whose file is gone is moot);
        files may go again once a restart's are all written."""
        if self._pending_kills:
            self._pending_kills = [k for k in self._pending_kills
                                   if (f := self._files.get(k[1])) is not None and not self._write_kill(f.fd, k)]
            if self._restart_kills:
                self._restart_kills.intersection_update(self._pending_kills)

    def _write_kills(self, lock: AbstractContextManager[Any]) -> None:
        """Write what :meth:`_kill_record` queued, outside ``lock`` (the store's), taken
        to pick the kills and to keep those that failed pending."""
        with lock:
            queued, self._queued_kills = self._queued_kills, []
        if not queued:
            return
        confirmed: set[Kill] = set()  # written (and fsynced, with file_fsync); the others stay pending
        try:
            written = [(kill, f) for kill, f in queued if self._write_kill(f.fd, kill, sync=False)]
            if self._fsync:  # each file once
                files = {id(f): f for _, f in written}
                synced = {key for key, f in files.items() if _fsynced(f.fd)}
                written = [(kill, f) for kill, f in written if id(f) in synced]
            confirmed.update(kill for kill, _ in written)
        finally:
            with lock:
                self._keep_pending([kill for kill, _ in queued if kill not in confirmed])
                for _, f in queued:
                    self._unhold(f)


def _fsynced(fd: int) -> bool:
    """fsync ``fd``; whether it succeeded."""
    try:
        os.fsync(fd)
    except OSError:
        return False
    return True
