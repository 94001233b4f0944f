"""The file tier: append-only aggregated files on a (parallel) file system.

Blocks are appended as records (see :mod:`.records`) to ``agg_rank{rank:03d}_{id:06d}.bin``,
rolling to a new file at ``segment_bytes`` (with a store, one of two empty files its
housekeeper made ahead, outside the store's lock: :mod:`.file_set`). Each rank writes only its own files; an
exclusive ``flock`` on ``agg_rank{rank:03d}.lock`` keeps a second process from writing
them at the same time. On open the index is rebuilt by scanning the files (warm
restart, :mod:`.file_recovery`): torn tails and records with a bad header are skipped and counted, and every
payload is verified against its checksum when read, so corrupted bytes are never served.

A delete kills its record in place (:mod:`.file_kills`): the record's header is rewritten as a tombstone of
the same length (one page, no new space: deletes stay durable on a full disk; a restart
forgets the record and every earlier record of its key). With a store, that write runs
on its housekeeper thread (:mod:`cascade.core.housekeeper`), outside the store's lock
(a 4 KiB ``pwrite`` under it waited milliseconds while a compaction kept the disk busy),
the file held open until it is written: a delete reaches the disk by the end of the
next ``flush()``, and a process that dies before may serve the block again at a
restart, as one whose delete was never asked for. A kill means the same whenever it is
written (it kills by position: its record and every earlier record of its key), so
writing it late changes nothing else. A delete whose rewrite fails (an I/O error) is
kept pending, retried at every later change and counted (``pending_deletes``). Older files may also hold appended tombstones (records that name a
killed record elsewhere); they are read and carried along as long as their target lives.

Disk use is bounded: a file is sealed (the next record goes to a new one) at
``seal_bytes = min(segment_bytes, capacity // 4)`` (at least one record per file), and
any file (:mod:`.compaction`), the active one once it reaches ``seal_bytes``, whose dead fraction reaches
``compact_dead_fraction`` (f, at most 0.9) is compacted: its live records are copied to
a file of their own, fsynced, and only then is the old file unlinked (with a store, on a
thread of its own, outside the store's lock). So, once no read, write or compaction is
in flight, ``disk_bytes <= capacity / (1 - f) + max(seal_bytes, largest record)``
(``disk_bound`` in :meth:`stats`); a write that finds the files over it while a
compaction runs sets ``behind``, and the store's writers wait for that compaction
(back-pressure). A compaction that finds the disk full drops its copies (nothing is
forgotten before its copy is durable), is counted (``compactions_deferred``, with the
dead bytes it could not reclaim in ``dead_bytes_stuck``) and is retried at later
changes; neither gets nor deletes ever fail because of it. Reads (``read_mode``: O_DIRECT on Lustre, the page cache elsewhere,
and the measurements behind that choice) are in :mod:`.file_reads`.

Expiries (wall clock) live in record headers. A read that refreshes a last-use TTL has
its header rewritten in batches (``set_expiry(batched=True)``: at most every
``EXPIRY_FLUSH_S`` seconds or ``EXPIRY_BATCH`` blocks, and at sync and close), so a restart
keeps blocks that reads kept alive; a crash can make them expire up to that window early.

Writes and reads run outside the store's lock in two phases (see :mod:`.base`): a write
reserves its record's range at the end of the active file, then ``pwritev``s it
(:mod:`.file_writes`); a read leases the record, then ``preadv``s it (:mod:`.file_reads`).
A file with reads or writes in flight is not compacted until they end; a file read while
it is compacted stays until its last read ends.
"""
from __future__ import annotations

import fcntl
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from ..config import MAX_DEAD_FRACTION, MAX_SEGMENT_BYTES
from ..errors import BlockNotFound, CascadeError, ConfigError
from .base import BlockKey, Memory, Tier, TierKind
from .compaction import Compaction
from .file_kills import Kills
from .file_reads import Reads, Stream, reads_direct
from .file_recovery import Recovery
from .file_set import Files
from .file_state import Kill, Loc, SegmentFile
from .file_writes import Writes
from .lustre_fs import is_lustre, set_striping
from .private_dir import ensure_private_dir
from .record_io import ReadStream, encode_location, header_key, open_own, queued_reads
from .records import HEADER_BYTES, PAGE, RecordHeader, pad

log = logging.getLogger(__name__)
EXPIRY_BATCH = 256  # refreshed expiries written together (see set_expiry)
EXPIRY_FLUSH_S = 1.0  # ... or after this many seconds


class FileTier(Recovery, Compaction, Reads, Writes, Kills, Files, Tier):
    """Aggregated-file tier of one rank in ``directory`` (created 0700 if missing;
    refused with a :class:`ConfigError` if another user owns it or can write to it)."""

    name = "file"
    kind = TierKind.FILE
    memory = Memory.DISK
    concurrent = True
    persistent = True
    records_ttl = True

    def __init__(
        self,
        capacity: int,
        directory: str,
        *,
        rank: int = 0,
        segment_bytes: int = 1 << 30,
        odirect: bool = True,
        read_mode: str = "auto",
        fsync: bool = False,
        compact_dead_fraction: float = 0.5,
        stripe_count: int = 4,
        stripe_size: int = 4 << 20,
    ) -> None:
        self._capacity = capacity
        self.directory = directory
        self.rank = rank
        self._segment_bytes = segment_bytes
        self._odirect = odirect  # resolved against read_mode once the file system is known
        self._fsync = fsync
        self._compact_fraction = compact_dead_fraction
        self._index: dict[BlockKey, Loc] = {}
        self._files: dict[int, SegmentFile] = {}
        self._live_bytes = 0  # record bytes of live blocks (what counts against capacity)
        self._payload_bytes = 0
        self._reserved_bytes = 0  # record bytes claimed by writes in flight
        self._bounces: list[mmap.mmap] = []  # spare page-aligned buffers for O_DIRECT reads
        self._bounce_lock = threading.Lock()
        #: Per file descriptor: the last batch's stream there (file_reads.Stream; a batch
        #: may go on with it: Reads._go_on).
        self._last_streams: dict[int, Stream] = {}
        self.counters = {"recovered": 0, "bad_headers": 0, "torn_records": 0, "corrupt_reads": 0,
                         "compactions": 0, "compactions_deferred": 0, "full_events": 0, "bad_files": 0,
                         "unlink_errors": 0, "old_files": 0, "expiry_writes": 0, "adopted": 0,
                         "adoption_deferred": 0, "adoption_dropped": 0, "adoption_expired": 0,
                         "compaction_errors": 0}
        if not 0.0 < compact_dead_fraction <= MAX_DEAD_FRACTION:
            raise ConfigError(f"compact_dead_fraction must be in (0, {MAX_DEAD_FRACTION}], got {compact_dead_fraction!r}")
        if not 0 < segment_bytes <= MAX_SEGMENT_BYTES:
            raise ConfigError(f"segment_bytes must be in 1 .. {MAX_SEGMENT_BYTES} (40-bit offsets), got {segment_bytes}")
        # Seal files relative to the capacity, so the dead space they carry stays bounded by it.
        self.seal_bytes = max(min(segment_bytes, capacity // 4), 2 * PAGE)
        self._next_id = 1  # above every file name seen, ours or not
        self._newest_id = 0  # of the last file handed out by _new_file
        self._spares: list[SegmentFile] = []  # empty files made ahead by the housekeeper, in id order
        self._lock_fd: int | None = None
        self._queued_kills: list[tuple[Kill, SegmentFile]] = []  # for the housekeeper, each holding its file
        self._pending_kills: list[Kill] = []  # whose write failed: retried at later changes
        # Those of them a restart's scan decided on: no file goes until they are written (.file_recovery).
        self._restart_kills: set[Kill] = set()
        self._freed_fds: list[int] = []  # descriptors of unlinked files, for the housekeeper to close
        self._compacting = False  # a compaction is under way (one at a time)
        self._compaction_ended = threading.Condition(threading.Lock())  # writes throttled wait on it
        self._changes = 0  # deletes and commits: paces compaction retries after a full disk
        self._retry_at = 0
        self._retry_step = 16
        self._disk_full = False  # a write found the disk full since the last compaction
        self._dirty_expiries: set[BlockKey] = set()  # refreshed expiries not yet written (set_expiry)
        self._expiries_flushed = time.monotonic()
        # Set by the store: key -> wall-clock expiry to write into a new record (0 = none),
        # so a block demoted here keeps its TTL across restarts.
        self.expiry_of: Callable[[BlockKey], float] | None = None
        # Set by the store: told which blocks compaction moved to another file (before
        # the old file goes), so that other ranks' readers learn their new locations.
        self.on_relocate: Callable[[list[BlockKey]], None] | None = None
        # Set by the store: told which blocks compaction found corrupt (kept: the store drops them).
        self.on_corrupt: Callable[[list[BlockKey]], None] | None = None
        # Set by the store: called instead of writing kills, closing freed files and
        # compacting inline (it runs housekeep() on a thread of its own: cascade.core.housekeeper).
        self.on_housekeeping_due: Callable[[], None] | None = None
        self.directory = directory = ensure_private_dir(directory)  # absolute: a later chdir moves nothing
        try:
            self._header_key = header_key(directory)  # keys every header of its files (see .records)
        except (OSError, CascadeError) as exc:
            raise ConfigError(f"file_dir: {exc}") from None
        self.on_lustre = is_lustre(directory)
        # Buffered reads of big records one at a time, in file order (see record_io), off
        # Lustre: its OSTs serve several at once.
        self._stream = None if self.on_lustre else ReadStream()
        self._odirect = reads_direct(read_mode, odirect, self.on_lustre)
        self.read_mode = "direct" if self._odirect else "buffered"
        # A batch's buffered runs are read on the reader threads (start_leased_run)
        self.reads_queued = not self._odirect and queued_reads()
        if self.on_lustre:
            set_striping(directory, stripe_count, stripe_size)
        self._lock_fd = self._take_lock()
        try:
            self._recover()
            self._active = self._new_file()
            self._after_change()  # files left mostly dead by the last run (best effort)
        except BaseException:
            self.close()
            raise

    # -- opening and recovery -----------------------------------------------------------
    def _take_lock(self) -> int:
        path = os.path.join(self.directory, f"agg_rank{self.rank:03d}.lock")
        try:
            fd = open_own(path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:  # e.g. ELOOP: a symlink planted as our lock file
            raise CascadeError(f"cannot open {path}: {exc.strerror}; remove it or use another file_dir") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CascadeError(
                f"{path} is held by another process: two stores cannot write rank {self.rank}'s "
                f"files in {self.directory} at once (use another file_dir or rank)"
            ) from None
        return fd

    def _remember(self, key: BlockKey, loc: Loc) -> None:
        if key in self._index:
            self._forget(key)
        self._index[key] = loc
        f = self._files[loc.file_id]
        f.live += loc.record_bytes
        f.keys.add(key)
        self._live_bytes += loc.record_bytes
        self._payload_bytes += loc.length

    def _move(self, key: BlockKey, loc: Loc) -> None:
        """The record of ``key`` now lies at ``loc``: the same record bytes in another
        file (a compaction's copy)."""
        old = self._index[key]
        self._index[key] = loc
        size = loc.record_bytes
        source, target = self._files[old.file_id], self._files[loc.file_id]
        source.live -= size
        source.keys.discard(key)
        target.live += size
        target.keys.add(key)

    def _forget(self, key: BlockKey) -> Loc:
        loc = self._index.pop(key)
        f = self._files[loc.file_id]
        f.live -= loc.record_bytes
        f.keys.discard(key)
        self._live_bytes -= loc.record_bytes
        self._payload_bytes -= loc.length
        return loc

    # -- Tier interface -------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def used(self) -> int:
        return self._payload_bytes

    @property
    def free(self) -> int:
        return self._capacity - self._live_bytes - self._reserved_bytes

    def fits(self, nbytes: int) -> bool:
        return HEADER_BYTES + pad(nbytes) <= self.free

    def __delitem__(self, key: BlockKey) -> None:
        """Forget ``key`` and kill its record in place. Never fails on a full disk."""
        self._loc(key)
        self._kill(key)
        self._after_change()

    def housekeep(self, lock: AbstractContextManager[Any], stop: threading.Event) -> None:
        """The upkeep due, the store's ``lock`` held only to pick work and record its end
        (:meth:`~.base.Tier.housekeep`): queued kills written, spare files made
        (:meth:`_make_spares`, again after each compaction's start), compactions due run (their
        copying stopped early once ``stop`` is set), the voids they queue written, and
        the descriptors of freed files closed."""
        self._write_kills(lock)
        self._make_spares(lock)
        while self.compact_next(lock, stop) and not stop.is_set():
            pass
        self._write_kills(lock)
        with lock:
            fds, self._freed_fds = self._freed_fds, []
        for fd in fds:
            os.close(fd)

    def __iter__(self) -> Iterator[BlockKey]:
        return iter(list(self._index))

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def location(self, key: BlockKey) -> int:
        """The block's record as one integer (file id and offset) for the directory."""
        loc = self._loc(key)
        return encode_location(loc.file_id, loc.offset)

    def record_span(self, key: BlockKey) -> tuple[str, int, int, int]:
        """Where the block's record lies and what it must hash to: (file path, offset of
        its payload, payload bytes, XXH3 checksum seeded with :func:`~.records.key_seed`).
        For tools that read the tier's files without the store (benchmark ``file_read_mode``)."""
        loc = self._loc(key)
        return self._files[loc.file_id].path, loc.offset + HEADER_BYTES, loc.length, loc.checksum

    def parent_of(self, key: BlockKey) -> str | None:
        """The parent id recorded with ``key`` (survives restarts)."""
        return self._loc(key).parent

    def expires_of(self, key: BlockKey) -> float:
        """The wall-clock expiry recorded with ``key`` (0 = none; survives restarts)."""
        return self._loc(key).expires

    def set_expiry(self, key: BlockKey, expires: float, *, batched: bool = False) -> None:
        """Record a new wall-clock expiry for ``key`` by rewriting its header in place
        (one page; a torn write fails the header CRC and loses only this block).

        ``batched`` (reads refreshing a last-use TTL): only noted now; the header is
        written, once per block however often it was refreshed, when
        ``EXPIRY_BATCH`` blocks are waiting or ``EXPIRY_FLUSH_S`` seconds have passed
        since the last batch (checked at each call and change), and at :meth:`sync` and
        :meth:`close`. A crash loses at most that window of refreshes: such blocks then
        expire up to ``EXPIRY_FLUSH_S`` seconds early (never late)."""
        loc = self._loc(key)
        if loc.expires == expires:
            return
        loc.expires = expires
        if batched:
            self._dirty_expiries.add(key)
            self._maybe_flush_expiries()
            return
        self._dirty_expiries.discard(key)
        self._write_header(key, loc)

    def _write_header(self, key: BlockKey, loc: Loc) -> None:
        f = self._files[loc.file_id]
        header = RecordHeader(key[0], key[1], loc.length, loc.checksum, parent=loc.parent, expires=loc.expires)
        os.pwrite(f.fd, header.pack(self._header_key), loc.offset)
        if self._fsync:
            os.fsync(f.fd)
        self.counters["expiry_writes"] += 1

    def _maybe_flush_expiries(self) -> None:
        if self._dirty_expiries and (len(self._dirty_expiries) >= EXPIRY_BATCH
                                     or time.monotonic() - self._expiries_flushed >= EXPIRY_FLUSH_S):
            self._flush_expiries()

    def _flush_expiries(self) -> None:
        """Write the refreshed expiries noted since the last batch (best effort: a block
        whose header cannot be written keeps its older, earlier expiry on disk)."""
        dirty, self._dirty_expiries = self._dirty_expiries, set()
        self._expiries_flushed = time.monotonic()
        for key in dirty:
            loc = self._index.get(key)
            if loc is not None and loc.file_id in self._files:
                try:
                    self._write_header(key, loc)
                except OSError as exc:
                    log.debug("%s: cannot refresh the expiry of %s: %s", self.name, key[1], exc)

    def remove_files(self) -> None:
        """Unlink every file of this tier: its blocks are gone (after another rank adopted
        them, see :mod:`.adoption`). Local."""
        for f in list(self._files.values()):
            self._drop_file(f)
        self._index.clear()
        self._live_bytes = self._payload_bytes = 0
        try:
            os.unlink(os.path.join(self.directory, f"agg_rank{self.rank:03d}.lock"))
        except FileNotFoundError:
            pass

    # -- misc -----------------------------------------------------------------------------
    def _loc(self, key: BlockKey) -> Loc:
        try:
            return self._index[key]
        except KeyError:
            raise BlockNotFound(f"{self.name}: no block {key[1]} in namespace {key[0]!r}") from None

    def sync_fds(self) -> list[int]:
        """Pending deletes and expiries written, then a new descriptor of every file of
        this rank and of its directory (:meth:`~.base.Tier.sync_fds`: fsynced outside the
        store's lock, so that a file made since the last sync keeps its name; one of
        a file compaction closes and unlinks meanwhile is fsynced harmlessly). Also what
        an O_DIRECT read of freshly written records would otherwise do implicitly (the
        kernel writes dirty pages back first)."""
        self._retry_kills()
        self._flush_expiries()
        fds: list[int] = []
        try:
            for f in self._files.values():
                fds.append(os.dup(f.fd))
            fds.append(os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY))  # the new files' names too
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def close(self) -> None:
        if self._files:
            self._flush_expiries()
        queued, self._queued_kills = self._queued_kills, []  # the housekeeper has stopped: written now
        self._keep_pending([kill for kill, f in queued if not self._write_kill(f.fd, kill)])
        for _, f in queued:
            f.users -= 1
        self._retry_kills()
        if self._pending_kills:
            log.warning("%s: %d deletes could not be written to %s: a restart may serve those blocks again",
                        self.name, len(self._pending_kills), self.directory)
        for f in list(self._files.values()):
            if f.retired:  # compacted: its records live in another file
                self._drop_file(f)
                continue
            for fd in (f.fd, f.direct_fd):
                if fd is not None:
                    os.close(fd)
        for f in self._spares:
            self._drop_file(f)
        self._spares.clear()
        for fd in self._freed_fds:
            os.close(fd)
        self._freed_fds.clear()
        self._files.clear()
        self._index.clear()
        for bounce in self._bounces:
            bounce.close()
        self._bounces.clear()
        if getattr(self, "_lock_fd", None) is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def stats(self) -> dict[str, Any]:
        disk = sum(f.size for f in self._files.values())
        stuck = sum(f.size - f.live for f in self._due())
        return {**super().stats(), **self.counters, "files": len(self._files), "disk_bytes": disk,
                "dead_bytes": disk - self._live_bytes, "dead_bytes_stuck": stuck, "disk_bound": self.disk_bound(),
                "seal_bytes": self.seal_bytes, "pending_deletes": len(self._pending_kills) + len(self._queued_kills),
                "odirect": self._odirect, "read_mode": self.read_mode,
                "on_lustre": self.on_lustre,
                "directory": self.directory}

