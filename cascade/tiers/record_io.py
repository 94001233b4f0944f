"""Reading and writing the file tier's records in files, outside any tier object.

The POSIX side of :mod:`.file_tier`: opening a file only if it is a regular file of
ours, writing a record whole, reading a payload (buffered, or O_DIRECT as chunks with
several reads in flight) while hashing it, and reading one record of any rank's files
by its directory location (other ranks' reads on a shared file system). Thread-safe;
the chunk readers are one pool per process.

A read of up to 1 MiB is one call (:func:`preadv_hashed`): the ``preadv`` and the XXH3 of
each record in it run in compiled code with the interpreter lock released
(``cascade/tiers/_recordread.c``, built by ``make install``; :data:`COMPILED` says whether
it was, else the Python versions here run). :func:`submit` queues such a read on a
reader thread of that module, which never takes the interpreter lock: a batch get starts
its runs of records as it leases them and counts each once it has landed
(:meth:`~cascade.tiers.file_reads.Reads.start_leased_run`), so its Python work and its
reads run on two cores.
"""
from __future__ import annotations

import ctypes
import errno
import heapq
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import xxhash

from ..buffers import as_byte_view
from ..checksum import checksum
from ..errors import BlockNotFound, CascadeError, CorruptBlock
from ..identity import BlockKey
from .records import HEADER_BYTES, PAGE, key_seed, unpack_header

# Never follow a symlink planted in place of one of our files; close-on-exec as usual.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

_OFFSET_BITS = 40  # records start below 1 TiB in a file; file ids take the upper 24 bits


def encode_location(file_id: int, offset: int) -> int:
    return (file_id << _OFFSET_BITS) | offset


def decode_location(location: int) -> tuple[int, int]:
    return location >> _OFFSET_BITS, location & ((1 << _OFFSET_BITS) - 1)


def output_views(outs: Sequence[Any]) -> tuple[list[memoryview], int]:
    """Writable flat byte views of host output buffers, and their bytes in all. A flat
    writable C-contiguous ``uint8`` numpy array, ``bytearray`` or byte ``memoryview``
    (what the store passes) costs one ``memoryview`` (a file read's overhead: half of it
    went to :func:`~cascade.buffers.as_byte_view`'s general checks at 64 KiB); anything
    else goes through those checks and their errors."""
    views = []
    nbytes = 0
    for out in outs:
        if type(out) in _FLAT_TYPES:
            view = memoryview(out)
            if view.ndim == 1 and view.format == "B" and view.c_contiguous and not view.readonly:
                views.append(view)
                nbytes += view.nbytes
                continue
        view = as_byte_view(out, "output buffer", writable=True)
        views.append(view)
        nbytes += view.nbytes
    return views, nbytes


_FLAT_TYPES = (np.ndarray, bytearray, memoryview)


def read_record(directory: str, rank: int, location: int, key: BlockKey, outs: Sequence[Any]) -> None:
    """Read a record of any rank's aggregated files (on a shared file system) into
    ``outs``, checking that the header names ``key`` and that the payload checksum holds.
    :class:`BlockNotFound` when the file or record is gone (compacted, deleted),
    :class:`CorruptBlock` when the bytes fail verification. Local; reads only."""
    file_id, offset = decode_location(location)
    path = os.path.join(directory, f"agg_rank{rank:03d}_{file_id:06d}.bin")
    views, nbytes = output_views(outs)
    try:
        fd = open_own(path, os.O_RDONLY)
    except FileNotFoundError:
        raise BlockNotFound(f"{path} is gone (compacted or removed)") from None
    except (OSError, CascadeError) as exc:  # a symlink, directory or foreign file in its place
        raise CorruptBlock(f"{path}: {exc}") from None
    try:
        header = unpack_header(os.pread(fd, HEADER_BYTES, offset), _key_of(directory))
        if header is None or header.tombstone or (header.namespace, header.block_id) != key:
            raise BlockNotFound(f"no record of {key[1]} at {path}:{offset}")
        if header.payload_len != nbytes:
            raise CorruptBlock(f"record of {key[1]} at {path}:{offset} has {header.payload_len} bytes")
        if (os.preadv(fd, views, offset + HEADER_BYTES) != header.payload_len
                or checksum(views, key_seed(*key)) != header.checksum):
            raise CorruptBlock(f"record of {key[1]} at {path}:{offset} is truncated or fails its checksum")
    finally:
        os.close(fd)


# O_DIRECT reads of big records go as 1 MiB chunks, up to 8 in flight (striped Lustre
# files serve them from several OSTs at once; untested on Lustre: none here, and on this
# project's virtio disk they measured the same as one whole read). Smaller O_DIRECT
# records: one preadv.
# Buffered reads of records over SCAN bytes go in file order as pieces of SCAN bytes,
# each hashed as soon as it lands (still in the CPU cache, while the kernel's readahead
# fetches the next ones); records of STREAM_MIN and more are read one at a time per
# tier, in file order (``stream``: :class:`ReadStream`). Measured cold, 256 MiB of
# records on this project's 2-core virtio disk (read_ahead_kb 8192), one process,
# configurations alternated, 5 rounds, median GB/s (CPU seconds per GB), on a machine
# loaded 6-9 by other work (noisy):
# - 4 threads at 16 MiB, whole-record preadv then hash 1.01 (0.215), 512 KiB pieces
#   1.34 (0.176), pieces one record at a time 1.63 (0.104); at 2 MiB 2.18 (0.109),
#   2.14 (0.100), 1.55 (0.112): four 2 MiB reads fit in one readahead window and gain
#   from running together, four 16 MiB ones thrash it.
# - pieces of 512 KiB / 1 MiB / 2 MiB vs whole records: 1 thread 1.45 / 1.89 / 1.72 vs
#   1.98 at 2 MiB, 1.11 / 1.46 / 1.32 vs 1.35 at 16 MiB; 4 threads 2.61 / 2.72 / 2.75
#   vs 2.33 at 2 MiB, 1.03 / 1.25 / 1.04 vs 0.94 at 16 MiB; pieces always took less
#   CPU (0.094-0.164 vs 0.105-0.177 s/GB).
# Pieces read out of order, several in flight, stop the readahead (0.61x vs 0.85x whole
# at 16 MiB), so they stay in order.
# Our own POSIX_FADV_WILLNEED of the next records on sequential scans was tried and made
# 2 MiB cold reads 3x slower (the advice call blocks on this kernel); POSIX_FADV_SEQUENTIAL
# made no measurable difference (read_ahead_kb is 8 MiB here): neither is used.
# Hashing each piece on a reader thread while the next one is read (XXH3 releases the
# interpreter lock) was tried too (benchmark file_read_mode, 2 and 16 MiB, two runs of 3
# rounds each, alternated with this version in one sitting): the records read without
# the store reached 0.82 / 0.75x the best raw read at 2 MiB against 0.89 / 0.92x, and
# 0.82 / 0.73x at 16 MiB against 0.88 / 1.27x, at 0.46-0.55 CPU s/GB against 0.31-0.36:
# on 2 cores the hand-off cost more than the hash it moved. The other way round does
# gain: the pieces queued on the compiled module's reader thread (:func:`submit`, a
# thread that never takes the interpreter lock) while this thread hashes each one as it
# lands (benchmark file_read_mode, 2 and 16 MiB, 3 rounds, this version and the one
# before alternated twice in one sitting, medians, buffered vs the best raw cold read):
# 2 MiB loop 0.88 / 0.89 against 0.83 / 0.90, batch 0.88 / 0.88 against 0.82 / 0.86;
# 16 MiB loop 1.01 / 0.92 against 0.81 / 0.85, batch 0.98 / 0.95 against 1.13 / 0.89.
# Those were 3 rounds a side. Paired over 30-40 rounds (cold get_into loops over 256 MiB
# of records, each round's pass over the raw buffered cold read of the same bytes in
# that round, medians of the per-round ratios; one process, load about 1), a lone read
# gains nothing from the hand-off and spends more CPU on it: 2 MiB 0.83 / 0.83 queued
# against 0.86 / 0.89 read by the caller, 16 MiB 0.89 / 0.90 against 0.88 / 0.91, at
# 0.20-0.22 CPU s/GB against 0.18; from the page cache a 2 MiB get took 388 us queued
# against 322 (9 rounds). So only the records a batch starts ahead are queued
# (:class:`InOrderRead`); a lone read reads its pieces itself (:func:`_read_in_order`).
CHUNK = 1 << 20
PARALLEL_MIN = 8 << 20  # smaller O_DIRECT records: one preadv
READERS = 8
SCAN = 1 << 20  # buffered records over this: read in order as pieces of this size
STREAM_MIN = 8 << 20  # buffered records of this size and more: one at a time per tier, in file order
_reader_pool: ThreadPoolExecutor | None = None
_reader_pool_lock = threading.Lock()


class ReadStream:
    """Big buffered reads of one tier, one at a time and in file order: of the reads
    waiting for their turn, the one at the lowest (file, offset) goes next. A batch's
    threads take records in order but reach the stream slightly out of it; a plain lock
    granted them as they came (5 of 16 reads of a 16 MiB batch jumped backwards,
    breaking the kernel's readahead at each)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._waiting: list[tuple[int, int]] = []  # a heap of (fd, offset)
        self._busy = False

    @contextmanager
    def turn(self, fd: int, offset: int) -> Iterator[None]:
        """Hold the stream once it is free and no read waiting for it is at an earlier
        (file, offset)."""
        ticket = (fd, offset)
        with self._cond:
            heapq.heappush(self._waiting, ticket)
            try:
                while self._busy or self._waiting[0] != ticket:
                    self._cond.wait()
            except BaseException:  # interrupted while waiting: the others must not wait for it
                self._waiting.remove(ticket)
                heapq.heapify(self._waiting)
                self._cond.notify_all()
                raise
            heapq.heappop(self._waiting)
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()


def _readers() -> ThreadPoolExecutor:
    global _reader_pool
    with _reader_pool_lock:
        if _reader_pool is None:
            _reader_pool = ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="cascade-read")
        return _reader_pool


IOV_MAX = 1024  # buffers one preadv takes at most (Linux)


def preadv_hashed_python(fd: int, offset: int, iov: Sequence[Any], spans: Sequence[tuple[int, int, int]]
                         ) -> list[int] | None:
    """:func:`preadv_hashed` through ``os.preadv`` and the ``xxhash`` module (the fallback)."""
    total = sum(memoryview(b).nbytes for b in iov)
    done = 0
    while done < total:  # a short read goes on where it stopped, as the compiled one does
        got = os.preadv(fd, _after(iov, done)[:IOV_MAX], offset + done)
        if got == 0:
            return None
        done += got
    digests = []
    for first, stop, seed in spans:
        h = xxhash.xxh3_64(seed=seed)
        for part in iov[first:stop]:
            h.update(part)
        digests.append(h.intdigest())
    return digests


def _after(iov: Sequence[Any], skip: int) -> list[memoryview]:
    """The buffers of ``iov`` less their first ``skip`` bytes."""
    rest = []
    for b in iov:
        view = memoryview(b).cast("B")
        if skip >= view.nbytes:
            skip -= view.nbytes
            continue
        rest.append(view[skip:])
        skip = 0
    return rest


class _ReadNow:
    """:func:`submit`'s job without reader threads: read at once, given by :meth:`wait`."""

    def __init__(self, fd: int, offset: int, iov: Sequence[Any], spans: Sequence[tuple[int, int, int]]) -> None:
        self._error: OSError | None = None
        self._digests: list[int] | None = None
        try:
            self._digests = preadv_hashed(fd, offset, iov, spans)
        except OSError as exc:
            self._error = exc

    def done(self) -> bool:
        return True

    def wait(self) -> list[int] | None:
        if self._error is not None:
            raise self._error
        return self._digests


def submit_python(fd: int, offset: int, iov: Sequence[Any], spans: Sequence[tuple[int, int, int]]) -> _ReadNow:
    """:func:`submit` without reader threads (the fallback): the read happens now."""
    return _ReadNow(fd, offset, iov, spans)


#: Reader threads of :func:`submit`, shared by a process's file tiers: one, so queued
#: reads run one after another in the order queued: a batch's runs stay one sequential
#: stream (what the kernel's readahead follows), and each run's digests are taken before
#: the next run's bytes land (outputs shared by blocks of a batch hash as they were read).
QUEUED_READERS = 1


def wait_idle_python() -> None:
    """:func:`wait_idle` without reader threads (the fallback): nothing is ever queued."""


def cached_pages_python(fd: int, offset: int, length: int) -> int | None:
    """:func:`cached_pages` without the compiled module: the kernel is not asked (None)."""
    return None


try:  # preadv_hashed, submit, start_readers, wait_idle, cached_pages: see cascade/tiers/_recordread.c
    from ._recordread import cached_pages, preadv_hashed, start_readers, submit, wait_idle
    COMPILED = True
except ImportError:  # not built here, or xxhash without exported XXH3: the Python versions
    preadv_hashed, submit, wait_idle = preadv_hashed_python, submit_python, wait_idle_python
    cached_pages = cached_pages_python
    COMPILED = False


def queued_reads() -> bool:
    """Start the reader threads of :func:`submit` if they are not running; whether
    reads are queued on them (False without the compiled module: a job reads at once)."""
    if COMPILED:
        start_readers(QUEUED_READERS)
    return COMPILED


def read_hashed(fd: int, start: int, length: int, views: Sequence[memoryview], seed: int,
                lead: memoryview | None = None, parallel: bool = False,
                stream: ReadStream | None = None) -> tuple[bool, int]:
    """Read a record's payload at ``start`` into ``views``; (complete, XXH3 digest seeded
    with ``seed``).

    Buffered (``lead`` given): ``lead`` (not hashed) receives the bytes just before
    ``start``, so the read starts where the previous record ended and the kernel sees
    one sequential stream, keeping its readahead going across records. A record over
    :data:`SCAN` bytes is read in order as pieces of that size, each hashed as it
    lands; one of :data:`STREAM_MIN` bytes or more takes its turn in ``stream`` (if
    given): one such read at a time, in file order.

    With ``parallel`` (O_DIRECT), a big record is read as chunks with several reads in
    flight (preadv releases the GIL) and hashed in order as chunks land, so hashing
    overlaps the reads still in flight. Otherwise one preadv, then the hash.
    O_DIRECT callers pass page-aligned views (chunks stay page-aligned)."""
    if lead is not None:
        start -= lead.nbytes
        if length + lead.nbytes <= SCAN:
            digests = preadv_hashed(fd, start, [lead, *views], ((1, len(views) + 1, seed),))
            return (False, 0) if digests is None else (True, digests[0])
        if stream is None or length < STREAM_MIN:
            return _read_in_order(fd, start, lead, views, seed)
        with stream.turn(fd, start):
            return _read_in_order(fd, start, lead, views, seed)
    if not parallel or length < PARALLEL_MIN or READERS < 2:
        digests = preadv_hashed(fd, start, views, ((0, len(views), seed),))
        return (False, 0) if digests is None else (True, digests[0])
    h = xxhash.xxh3_64(seed=seed)
    chunks = []
    pos = start
    for view in views:
        for lo in range(0, view.nbytes, CHUNK):
            chunk = view[lo:lo + CHUNK]
            chunks.append((chunk, pos))
            pos += chunk.nbytes
    pool = _readers()
    futures = [pool.submit(os.preadv, fd, [chunk], off) for chunk, off in chunks]
    ok = True
    try:
        for (chunk, _), fut in zip(chunks, futures):
            if fut.result() != chunk.nbytes:
                ok = False
                break
            h.update(chunk)
    finally:
        for fut in futures:  # no read may still write into the caller's buffers
            try:
                fut.result()
            except OSError:
                ok = False
    return ok, h.intdigest() if ok else 0


def _read_in_order(fd: int, pos: int, lead: memoryview, views: Sequence[memoryview],
                   seed: int) -> tuple[bool, int]:
    """``lead`` then ``views`` from ``pos`` on, as pieces of :data:`SCAN` bytes (the last
    may be shorter), read by this thread in turn; each piece, less ``lead``, is hashed
    (XXH3 seeded with ``seed``) as it lands. A batch's records whose reads it starts
    ahead go through the reader thread instead (:class:`InOrderRead`); a lone read does
    not gain from that hand-off (see the figures above :data:`CHUNK`)."""
    h = xxhash.xxh3_64(seed=seed)
    for iov in _pieces(lead, views):
        if not _read_piece(fd, iov, pos, h, iov[0] is lead):
            return False, 0
        pos += sum(v.nbytes for v in iov)
    return True, h.intdigest()


class InOrderRead:
    """A buffered read of ``lead`` then ``views`` from ``pos`` on, as pieces of
    :data:`SCAN` bytes queued at once on the reader thread (:func:`submit`, which reads
    the next piece while :meth:`wait` hashes the last, less ``lead``, with XXH3 seeded
    with ``seed``). A batch
    starts the reads of its next records before it waits for the first
    (:meth:`~cascade.tiers.file_reads.Reads.start_leased_run`): their reads then overlap
    its hashing and bookkeeping too. The same interface as :func:`submit`'s jobs."""

    def __init__(self, fd: int, pos: int, lead: memoryview, views: Sequence[memoryview], seed: int) -> None:
        self._pieces, self._lead, self._hash = _pieces(lead, views), lead, xxhash.xxh3_64(seed=seed)
        self._jobs: list[Any] = []
        try:
            for iov in self._pieces:
                self._jobs.append(submit(fd, pos, iov, ()))
                pos += sum(v.nbytes for v in iov)
        except BaseException:
            self._wait_from(0)
            raise

    def wait(self) -> list[int] | None:
        """[the payload's digest], or None when a piece fell short; an I/O error is raised.
        Returns (or raises) only once no piece is still being read. Call it once."""
        waited = 0
        try:
            for job, iov in zip(self._jobs, self._pieces):
                waited += 1
                if job.wait() is None:
                    return None
                for v in iov[1:] if iov[0] is self._lead else iov:
                    self._hash.update(v)
            return [self._hash.intdigest()]
        finally:
            self._wait_from(waited)  # no read may go on into the outputs after this returns

    def _wait_from(self, first: int) -> None:
        for job in self._jobs[first:]:
            try:
                job.wait()
            except OSError:
                pass


def _pieces(lead: memoryview, views: Sequence[memoryview]) -> list[list[memoryview]]:
    """``lead`` then ``views`` cut into pieces of :data:`SCAN` bytes (the last may be
    shorter), each a list of buffers."""
    pieces: list[list[memoryview]] = []
    iov: list[memoryview] = [lead]
    room = SCAN - lead.nbytes
    for view in views:
        lo = 0
        while lo < view.nbytes:
            part = view[lo:lo + room] if lo or view.nbytes > room else view
            iov.append(part)
            lo += part.nbytes
            room -= part.nbytes
            if room == 0:
                pieces.append(iov)
                iov, room = [], SCAN
    if iov:
        pieces.append(iov)
    return pieces


def _read_piece(fd: int, iov: list[memoryview], pos: int, h: xxhash.xxh3_64, skip_first: bool) -> bool:
    if os.preadv(fd, iov, pos) != sum(v.nbytes for v in iov):
        return False
    for v in iov[1:] if skip_first else iov:
        h.update(v)
    return True


HEADER_KEY_FILE = "header.key"
_KEY_BYTES = 8


def header_key(directory: str) -> int:
    """The secret that keys the record headers of the files in ``directory``
    (:mod:`.records`): its ``header.key``, made (random, mode 0600) by the first store
    to open the directory. Ranks sharing a directory share it: a maker links its
    finished copy in place, so a second maker's never replaces the first. A file tier
    reads it once at open; a read of another rank's record (:func:`read_record`), with
    each read. :class:`CascadeError` when it is damaged or not a regular file of ours;
    ``OSError`` when it cannot be read or made."""
    path = os.path.join(directory, HEADER_KEY_FILE)
    try:
        return _read_header_key(path)
    except FileNotFoundError:
        pass
    made = f"{path}.{os.getpid()}.{threading.get_ident()}"
    try:
        fd = open_own(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            try:
                if os.write(fd, os.urandom(_KEY_BYTES)) != _KEY_BYTES:
                    raise OSError(errno.EIO, "short write")
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(made, path)
            except FileExistsError:  # another rank made it first: theirs is the one
                pass
        finally:
            os.unlink(made)  # never left behind, made or not
    except OSError as exc:
        raise OSError(exc.errno, f"cannot make {path}: {exc.strerror or exc}") from exc
    return _read_header_key(path)


def _key_of(directory: str) -> int:
    """The header key of another rank's ``directory`` (never made here): its records
    cannot be verified without it (:class:`CorruptBlock`)."""
    try:
        return _read_header_key(os.path.join(directory, HEADER_KEY_FILE))
    except (OSError, CascadeError) as exc:
        raise CorruptBlock(f"{directory}: no usable header key: {exc}") from None


def _read_header_key(path: str) -> int:
    fd = open_own(path, os.O_RDONLY)
    try:
        raw = os.pread(fd, _KEY_BYTES + 1, 0)
    finally:
        os.close(fd)
    if len(raw) != _KEY_BYTES:
        raise CascadeError(f"{path} holds {len(raw)} bytes, not a header key of {_KEY_BYTES}: the records of "
                           f"{os.path.dirname(path)} cannot be read; remove its files to start afresh")
    return int.from_bytes(raw, "little")


def open_own(path: str, flags: int) -> int:
    """``os.open`` that refuses a symlink (O_NOFOLLOW), a non-regular file and a file of
    another user: a planted or swapped file is never read or written."""
    fd = os.open(path, flags | _NOFOLLOW | os.O_NONBLOCK, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise CascadeError(f"{path} is not a regular file of uid {os.geteuid()}: refusing to use it")
    return fd


def page_aligned(view: memoryview) -> bool:
    """Whether a writable view starts on a page and holds whole pages (an O_DIRECT
    target). Its address through ctypes: 1.7 us, against 9.8 through numpy."""
    if view.nbytes % PAGE or view.readonly or not view.nbytes:
        return False
    return ctypes.addressof(ctypes.c_char.from_buffer(view)) % PAGE == 0


def pwritev_all(fd: int, iov: list, offset: int) -> int:
    """``pwritev`` until every byte is written (short writes happen near a full disk)."""
    total = sum(memoryview(b).nbytes for b in iov)
    done = os.pwritev(fd, iov, offset)
    while done < total:  # rare: finish the rest from one joined buffer
        rest = b"".join(bytes(b) for b in iov)[done:]
        n = os.pwrite(fd, rest, offset + done)
        if n == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += n
    return done
