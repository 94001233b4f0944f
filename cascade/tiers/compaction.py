"""Compaction of the file tier: reclaiming the space of dead records.

A file whose dead fraction reaches ``compact_dead_fraction`` (the active file only once
it is ``seal_bytes`` long, or when the disk is full) has its live records and
still-needed tombstones copied to a file of their own, fsynced, and only then is it
unlinked. A compaction runs in three steps, so that the copying never holds the store's
lock (it took 146 ms beside a prober's gets in benchmark ``read_stall`` when it did):

* :meth:`Compaction.start_compaction` (under the lock): picks the cheapest file due,
  holds it (``users``), takes its live records' keys (the file's set, handed over whole)
  and the target file, then a new active file after it (so a later put lies after the
  copies, and a kill in place of a copy never kills a newer record at a restart); with
  a store both are spares its housekeeper made ahead, so the step creates no file. In a
  74k-block tier compacting a file of 2048 live records it held the lock 0.05-0.06 ms,
  against 0.25-1.1 ms while it copied the keys and created the files;
* :meth:`Compaction.copy_compaction` (outside the lock, beside any other call): reads
  each record verified, writes it to the target with its origin in its header, fsyncs;
* :meth:`Compaction.end_compaction` (under the lock, taken for each batch of
  :data:`RELOCATE_BATCH` records): points the index at the copies of records still
  current, voids the copies of records deleted or replaced meanwhile, and unlinks the
  old file once its last reader ends;
* :meth:`Compaction.finish_compaction` (outside the lock): closes the old file's
  descriptors, which frees its blocks (46 ms for 128 MiB here, under the lock, in
  benchmark ``read_stall`` before it moved out).

:meth:`Compaction.compact_next` runs them in turn. With a store, ``on_housekeeping_due``
(set by it) hands that to a background thread (:mod:`cascade.core.housekeeper`), which
also writes the voids the end step queues; a tier on its own runs it inline in the
change that made a file due (should it raise there, it is undone, logged and counted in
``compaction_errors``: the change, a put's stored block, stands). A copy names its
origin (file and offset of the record it copies), so a restart after a crash
mid-compaction keeps a copy only while its origin is still live or gone with its file
(:mod:`.file_recovery`).

Records are verified on the way: a corrupt one is copied as it is (it still fails its
checksum) and the store told through ``on_corrupt``, which drops it unless another rank
pins it; then it stays, as a corrupt block in any tier does, until a later read can drop
it. Failure-atomic: on a full disk or an I/O error the target file is dropped, the old
file stays, the attempt is counted (``compactions_deferred``) and retried after 16, 32,
... up to ``RETRY_MAX`` later changes. Files with reads or writes in flight are left
alone until they end; none is compacted while a kill that a restart decided on is
pending (:mod:`.file_recovery`).
"""
from __future__ import annotations

import logging
import os
import threading
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from ..errors import FULL_ERRNOS, CascadeError, CorruptBlock, UnreadableBlock
from .base import BlockKey, fsync_directory
from .file_reads import Lease
from .file_state import Loc, SegmentFile
from .record_io import pwritev_all
from .records import HEADER_BYTES, RecordHeader

log = logging.getLogger("cascade.tiers.file_tier")
RETRY_MAX = 1024  # after a failed compaction, retry after 16, 32, ... up to this many changes
RELOCATE_BATCH = 64  # copies pointed at per locked step of a compaction's end (2048 took 5.5 ms in one; 256, 0.35-0.7 ms)
THROTTLE_MAX_S = 10.0  # most seconds a write waits for a compaction under way (see wait_for_compaction)


class CompactionStopped(CascadeError):
    """The store is closing: a compaction's copying stopped before its end."""


@dataclass(eq=False)
class CompactionRun:
    """One compaction under way: the file it empties, the file it fills, and what it copies."""
    source: SegmentFile
    target: SegmentFile
    keys: set[BlockKey]  # of the source's live records at the start (the copy looks up where each is)
    tombstones: list[tuple[BlockKey, int, int]]  # the source's still-needed tombstones
    copies: list[tuple[BlockKey, Loc, int, float]] = field(default_factory=list)  # (key, origin, offset, expiry written)
    corrupt: list[BlockKey] = field(default_factory=list)  # found on the way: reported whether or not it ends
    size: int = 0  # bytes written to the target
    error: BaseException | None = None
    done: bool = False  # every copy written and fsynced
    unlinked: list[int] = field(default_factory=list)  # descriptors of the file it unlinked, to close


class Compaction:
    """The :class:`~cascade.tiers.file_tier.FileTier` methods that compact its files
    and bound its disk use (a mixin: it uses the tier's files, index and counters)."""

    def _needed_tombstones(self, f: SegmentFile) -> list[tuple[BlockKey, int, int]]:
        return [t for t in f.tombstones if t[1] in self._files and t[1] != f.file_id]

    def _after_change(self) -> None:
        """After a delete or commit: retry pending kills, then compact what is due (in
        the background with a store, else now). Never raises: a compaction that cannot
        run now is counted and retried later."""
        self._changes += 1
        self._retry_kills()
        self._maybe_flush_expiries()
        if self._compacting or self._changes < self._retry_at or self._restart_kills or not self._due():
            return
        if self.on_housekeeping_due is not None:
            self.on_housekeeping_due()
            return
        try:
            while self.compact_next():  # False: the disk is full, the bigger ones would fail too
                pass
        except Exception as exc:  # the change is done (a put's block stored): its compaction never fails it
            self._compaction_failed(exc)

    def compact_next(self, lock: AbstractContextManager[Any] = nullcontext(),
                     stop: threading.Event | None = None) -> bool | None:
        """Run the next compaction due, its four steps in turn, ``lock`` (the store's)
        held for the start and the end only; None when none is due, else whether it
        reclaimed space. Whatever the copy raises, the run is ended and its files freed."""
        with lock:
            run = self.start_compaction()
        if run is None:
            return None
        try:
            self._make_spares(lock)  # the start took two: made again before the copy
            self.copy_compaction(run, stop)
        finally:
            try:
                ended = self.end_compaction(run, lock)
            finally:
                self.finish_compaction(run)
        return ended

    def _due(self) -> list[SegmentFile]:
        """Files to compact: dead fraction at ``compact_dead_fraction`` or more (the
        active file only once it is ``seal_bytes`` long or the disk is full), no read or
        write in flight."""
        return sorted((f for f in self._files.values()
                if not f.users and f.size and 1.0 - f.live / f.size >= self._compact_fraction
                and (f is not self._active or f.size >= self.seal_bytes or self._disk_full)),
                key=lambda f: f.live)  # cheapest first: a dead file needs no room

    def start_compaction(self) -> CompactionRun | None:
        """Under the lock: hold the cheapest file due and open a target file for its
        live records; None when none is due, one is under way, or there is no room
        (counted in ``compactions_deferred``). Reads and writes go on meanwhile; a
        later put goes to a new active file, newer than the target (a restart reads
        later records as newer), never to the source or the target."""
        if self._compacting or self._changes < self._retry_at or self._restart_kills:
            return None
        due = self._due()
        if not due:
            return None
        f = due[0]
        tombstones = self._needed_tombstones(f)
        need = f.live + HEADER_BYTES * len(tombstones)
        try:
            st = os.statvfs(self.directory)
            if st.f_bavail * st.f_frsize < need:  # cheap to find out: no backoff
                self.counters["compactions_deferred"] += 1
                return None
            target = self._new_file()
            try:  # later puts go after the copies: a kill in place there must never kill a newer record
                old_active, self._active = self._active, self._new_file()
            except (OSError, CascadeError):
                self._drop_file(target)
                raise
            if not old_active.size and old_active is not f:  # nothing in it yet: it goes
                self._discard_file(old_active)
        except (OSError, CascadeError) as exc:  # CascadeError: no file name left to take
            self._defer(f, exc)
            return None
        # The source's set of keys goes to the run whole and no one changes it from here
        # (copying 2048 took 0.15 ms under the lock); the file keeps a fresh one, given
        # back what is still its own if the run does not end whole (_end_finish).
        keys, f.keys = f.keys, set()
        f.users += 1
        target.users += 1
        self._compacting = True
        return CompactionRun(f, target, keys, tombstones)

    def copy_compaction(self, run: CompactionRun, stop: threading.Event | None = None) -> None:
        """Outside the lock: copy the run's records (verified) and tombstones to its
        target file and fsync it. Touches only the two files the run holds, so it runs
        beside any other call. A failure (or ``stop`` set) is kept in ``run.error`` for
        :meth:`end_compaction`; only what is neither an ``OSError`` nor a
        :class:`CascadeError` (a bug, an interrupt) is raised too."""
        source, target = run.source, run.target
        try:
            # Unlocked looks (each a hint: a record that dies after its look is voided at
            # the end): the records still in the source, in file order.
            records = sorted(((key, loc) for key in run.keys
                              if (loc := self._index.get(key)) is not None and loc.file_id == source.file_id),
                             key=lambda item: item[1].offset)
            for key, loc in records:
                if stop is not None and stop.is_set():
                    raise CompactionStopped(f"{self.name}: compaction of {source.path} stopped: the store is closing")
                if self._index.get(key) is not loc:  # deleted or replaced already: nothing to copy
                    continue
                buf = bytearray(loc.length)
                try:
                    self.read_leased(Lease(key, loc, source), [buf])  # verified
                except UnreadableBlock:  # an I/O error: the compaction is put off, nothing dropped
                    raise
                except CorruptBlock as exc:  # copied as it is: it still fails its checksum
                    if not loc.corrupt:  # (reported once: a pinned one stays and may be copied again)
                        log.warning("%s", exc)
                        run.corrupt.append(key)
                expires = loc.expires  # (a refresh meanwhile is written at the end)
                header = RecordHeader(key[0], key[1], loc.length, loc.checksum, parent=loc.parent, expires=expires,
                                      target_file=source.file_id, target_offset=loc.offset)
                pwritev_all(target.fd, self._record_iov(header, [memoryview(buf)]), run.size)
                run.copies.append((key, loc, run.size, expires))
                run.size += header.record_bytes
            for key, tfile, toff in run.tombstones:
                header = RecordHeader(key[0], key[1], 0, 0, tombstone=True, target_file=tfile, target_offset=toff)
                pwritev_all(target.fd, self._record_iov(header, []), run.size)
                run.size += HEADER_BYTES
            os.fsync(target.fd)  # durable before the originals go, and so is its name
            fsync_directory(self.directory)
            run.done = True
        except BaseException as exc:
            run.error = exc
            if not isinstance(exc, (OSError, CascadeError)):
                raise

    def end_compaction(self, run: CompactionRun, lock: AbstractContextManager[Any] = nullcontext()) -> bool:
        """End a run, taking ``lock`` (the store's) for each of its steps. Copied: the
        index points at the copies of records still current, :data:`RELOCATE_BATCH` at a
        time (the directory told of each batch, ``on_relocate``; every record is
        readable at either place until the end), the others' copies are voided, and the
        source goes once its last reader ends; True. Else the target is dropped, the
        source stays as it was, and False (counted, retried later). Should a step
        raise, the source stays with the records not yet pointed at their copies."""
        whole = False
        try:
            with lock:  # the store drops them (their copies are voided below); still compacting: its deletes compact nothing now
                if run.done:  # (first: the target's bytes are counted whatever the hook does)
                    run.target.size = run.size
                if run.corrupt and self.on_corrupt is not None:
                    self.on_corrupt(run.corrupt)
            if run.done:
                for i in range(0, len(run.copies), RELOCATE_BATCH):
                    with lock:
                        self._relocate(run, run.copies[i:i + RELOCATE_BATCH])
                whole = True
        finally:
            with lock:
                self._end_finish(run, whole)
        return whole

    def _relocate(self, run: CompactionRun, copies: list[tuple[BlockKey, Loc, int, float]]) -> None:
        """Under the lock: point the index at the copies of records still current (same
        record bytes, another place), void the others' copies."""
        target = run.target
        corrupt = set(run.corrupt) if run.corrupt else ()
        relocated = []
        for key, loc, offset, expires in copies:
            if self._index.get(key) is loc:
                self._move(key, Loc(target.file_id, offset, loc.length, loc.checksum, loc.parent, loc.expires,
                                    corrupt=loc.corrupt or key in corrupt))
                if loc.expires != expires:  # refreshed while it was copied
                    self._dirty_expiries.add(key)
                relocated.append(key)
            else:  # deleted or replaced meanwhile: its copy must not come back at a restart
                self._void_record(key, target.file_id, offset, loc.length)
        if relocated and self.on_relocate is not None:  # other ranks' readers learn the new places
            self.on_relocate(relocated)

    def _end_finish(self, run: CompactionRun, whole: bool) -> None:
        """Under the lock: release the run's files. Not copied: the target goes (closed
        outside the lock: finish_compaction). With every copy ``whole``ly pointed at:
        the source goes (now, or at its last read's end) and the run counts."""
        source, target = run.source, run.target
        source.users -= 1
        target.users -= 1
        if not whole:  # the source stays, with the records not pointed at their copies
            source.keys = {key for key in run.keys
                           if (loc := self._index.get(key)) is not None and loc.file_id == source.file_id}
        with self._compaction_ended:
            self._compacting = self.behind = False
            self._compaction_ended.notify_all()
        if not run.done:
            run.unlinked = self._unlink_file(target)
            if run.error is not None and not isinstance(run.error, CompactionStopped):
                self._defer(source, run.error)
        elif not whole:  # a step raised: copies not pointed at must not outlive their origins at a restart
            for key, loc, offset, _ in run.copies:
                now = self._index.get(key)
                if now is None or (now.file_id, now.offset) != (target.file_id, offset):
                    self._void_record(key, target.file_id, offset, loc.length)
        else:
            target.tombstones.extend(run.tombstones)
            if source.users:  # read meanwhile: it goes when its last read ends (release)
                source.retired = True
            else:
                run.unlinked = self._unlink_file(source)
            if not run.size and not target.users:  # nothing was live in the source: no empty file kept
                run.unlinked = [*run.unlinked, *self._unlink_file(target)]
            self.counters["compactions"] += 1
            self._retry_step = 16
            self._disk_full = False

    def _over_bound(self) -> bool:
        """Under the lock: whether the files hold more than :meth:`disk_bound` allows
        (taking one record as at most ``seal_bytes``)."""
        limit = int(self._capacity / (1.0 - self._compact_fraction)) + self.seal_bytes
        return sum(f.size for f in self._files.values()) > limit

    def wait_for_compaction(self) -> None:
        """Outside the lock, when ``behind`` (a write found the files over their bound
        while a compaction ran): wait, at most :data:`THROTTLE_MAX_S`, for it to end."""
        with self._compaction_ended:
            self._compaction_ended.wait_for(lambda: not self._compacting, THROTTLE_MAX_S)

    def _defer(self, f: SegmentFile, exc: BaseException) -> None:
        """Count a compaction that could not run and put the next try off."""
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            self.counters["full_events"] += 1
            self._disk_full = True
        self.counters["compactions_deferred"] += 1
        self._put_off()
        if self.counters["compactions_deferred"] == 1:
            log.warning("%s: cannot compact %s now (%s): its dead space stays until there is room",
                        self.name, f.path, exc)

    def _put_off(self) -> None:
        """The next compaction waits 16, 32, ... up to :data:`RETRY_MAX` changes."""
        self._retry_at = self._changes + self._retry_step
        self._retry_step = min(2 * self._retry_step, RETRY_MAX)

    def _compaction_failed(self, exc: Exception) -> None:
        """A compaction run inline by a change raised (a bug, a hook, a failed close:
        not an I/O error of its copy, which defers it): :meth:`compact_next` undid it; logged,
        counted (``compaction_errors``) and put off."""
        self.counters["compaction_errors"] += 1
        self._put_off()
        log.error("%s: a compaction failed and was undone (retried later): %r", self.name, exc, exc_info=exc)

    @staticmethod
    def finish_compaction(run: CompactionRun) -> None:
        """Outside the lock, after :meth:`end_compaction`: close the descriptors of the
        file it unlinked (the source, or a failed run's target), which frees its blocks."""
        for fd in run.unlinked:
            os.close(fd)
        run.unlinked = []

    def disk_bound(self, largest_record: int | None = None) -> int:
        """Most bytes this tier's files hold once no read or write is in flight and no
        compaction is deferred: ``capacity / (1 - f) + max(seal_bytes, largest record)``."""
        record = largest_record if largest_record is not None else max(
            (l.record_bytes for l in self._index.values()), default=0)
        return int(self._capacity / (1.0 - self._compact_fraction)) + max(self.seal_bytes, record)
