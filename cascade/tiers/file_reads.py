"""Reads of the file tier: choosing the read mode, leasing a record, reading it verified.

``read_mode`` ``auto`` reads O_DIRECT on Lustre (through an aligned bounce buffer unless
the caller's buffers are page-aligned) and through the page cache elsewhere (kernel
readahead for cold reads, memory speed for hot ones); ``direct`` and ``buffered`` force
one (O_DIRECT falls back to buffered where the file system refuses it). O_DIRECT records
of 8 MiB and more are read as chunks with several reads in flight; buffered records over
1 MiB in order as 1 MiB pieces, hashed as they land, those of 8 MiB and more one at a
time, in file order (see :mod:`.record_io`); a batch queues the pieces of its records
under 8 MiB as it leases them, so they are read while it hashes the records before
(:class:`~.record_io.InOrderRead`). A batch's buffered reads of small records
lying back to back (blocks written together, read in the same order) go as runs of up
to 128 KiB (:data:`RUN_BYTES`; 1 MiB past the first 1 MiB of a stream of them,
:data:`STREAM_START_BYTES`; up to 20 KiB over the first 128 KiB of a stream of records of
up to 20 KiB, a 16 KiB block and its header page, that starts out of the page cache,
:data:`SLOW_START_BYTES`), one ``preadv`` each
(:meth:`Reads.read_runs`), queued on the reader thread of :func:`~.record_io.submit`
(:meth:`Reads.start_leased_run`), the kernel told to fetch a stream's start first
(:meth:`Reads.will_read`). Every payload is
verified against its checksum; a truncated or failing record is a :class:`CorruptBlock`.
Every read runs leased, outside the store's lock, even of a record in the page cache: a
read there can still wait for the disk (``RWF_NOWAIT`` reads in the locked step, until
session 34, waited up to milliseconds for the readahead they set off, and held up every
other get and put meanwhile: docs/architecture.md).
"""
from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..buffers import WRITABLE_C, as_byte_view
from ..checksum import checksum
from ..errors import CascadeError, ConfigError, CorruptBlock, UnreadableBlock
from .base import BlockKey
from .file_state import Loc, SegmentFile
from . import record_io
from .record_io import READERS, SCAN, STREAM_MIN, open_own, output_views, page_aligned, read_hashed
from .records import HEADER_BYTES, PAGE, key_seed, pad

log = logging.getLogger("cascade.tiers.file_tier")
READ_MODES = ("auto", "direct", "buffered")


def reads_direct(read_mode: str, odirect: bool, on_lustre: bool) -> bool:
    """Whether a file tier reads O_DIRECT: ``read_mode`` (one of :data:`READ_MODES`,
    else :class:`ConfigError`) resolved against the file system; never without ``odirect``."""
    if read_mode not in READ_MODES:
        raise ConfigError(f"read_mode must be one of {READ_MODES}, got {read_mode!r}")
    # auto: O_DIRECT on Lustre (large RPCs, no client page-cache churn, striped reads
    # in flight), elsewhere the page cache with readahead (and hot re-reads from
    # memory). Benchmark file_read_mode on this project's 2-core virtio disk, rounds
    # in which buffered beat O_DIRECT (64 KiB loop / batch, 2 MiB loop / batch,
    # 16 MiB loop / batch), four sets: 54 rounds at load 1.6-7 (results/
    # file_read_mode_ab_20261126/): 50, 50, 13, 34, 37, 33 of 54; the suite at
    # ccf2a27: 9, 9, 5, 0, 9, 1 of 9 (its round order favoured Cascade's buffered
    # passes, see the workload); 18 shuffled rounds at load 7-10: 12, 5, 7, 8, 10, 12
    # of 18 (these three sets with batches of 4 workers); 9 rounds of the current
    # workload at load 6-9: 3, 6, 1, 4, 5, 5 of 9. Buffered led at 64 KiB and 16 MiB
    # in most sets, O_DIRECT at 2 MiB in three of four; but in half the rounds of the
    # last set two identical raw passes differed 1.5-6x, so the counts are weak
    # evidence. A rule sending only 2 MiB-class records to O_DIRECT would fit one
    # virtual disk on thin evidence and lose hot re-reads from memory: auto stays
    # buffered off Lustre.
    return odirect and (read_mode == "direct" or (read_mode == "auto" and on_lustre))


@dataclass(slots=True, eq=False)
class Lease:
    """A block being read outside the store's lock: its record and the open file."""
    key: BlockKey
    loc: Loc
    file: SegmentFile


_leads = threading.local()
#: A run of back-to-back records read in one ``preadv`` (:meth:`Reads.read_runs`) spans
#: at most this many bytes and this many records (each takes up to 4 of the call's 1024
#: ``iovec``s). Runs of up to 1 MiB (:data:`.record_io.SCAN`, as the pieces of a big
#: record) made cold batches slower than the same gets in a loop, in bursts of 4 batches
#: of 64 blocks after a page-cache drop (benchmark small_blocks' cold forms, 6 rounds
#: each, one sitting): batch/loop 1.18 [1.11-1.36] at 4 KiB and 1.17 [1.09-1.46] at
#: 64 KiB; with 128 KiB runs 0.90 [0.76-1.26] and 0.83 [0.66-1.08] (256 KiB: 1.11 and
#: 0.94; 64 KiB: 0.94 at 4 KiB), rerun as committed 0.93 and 1.03: level with the loop
#: at 64 KiB, no longer behind it. A whole cold pass of 64 KiB blocks (file_read_mode,
#: 3 rounds, alternated twice) gave the batch 0.93 and 1.20 GB/s with 1 MiB runs, 1.32
#: and 1.23 with 128 KiB ones.
RUN_BYTES = 128 << 10
RUN_RECORDS = 64
#: A batch's buffered reads ask the kernel to start reading their records, up to
#: ADVISE_BYTES per leased chunk of records, if the chunk's records add up to ADVISE_MIN
#: (:meth:`Reads.will_read`). Bursts of 64 blocks of 64 KiB, each read from a plain file
#: one block at a time after a page-cache drop: 57-70 us per block with the advice against
#: 98-127 without (three rounds of 16 bursts each, two runs); bursts of 64 blocks of 8 KiB,
#: and 256 MiB read in blocks of 64 KiB, 2 MiB and 16 MiB, ran alike with it or without
#: (16 MiB: 7.5-7.8 ms per block advised up to 32 MiB, 7.9-8.7 advised all 256 MiB, 7.1-8.3
#: not advised). In the store (benchmark small_blocks, runs of 6 rounds), cold batch/loop
#: at 64 KiB went from 0.99-1.07 to 0.64-0.69 (two runs); at 4 KiB (chunks of 256 KiB) from 0.88-0.98 to
#: 0.94-1.06 when every chunk was advised: under ADVISE_MIN the kernel's own readahead
#: is left alone. ADVISE_MIN was 1 MiB until session 38: at 16 KiB (chunks of 640 KiB,
#: not advised then) cold batch/loop was 1.12-1.20 (two runs of 5 rounds), 0.84 in both
#: with 512 KiB; at 8 KiB (chunks of 384 KiB) 1.13-1.28 unadvised and 1.12 advised from
#: 256 KiB on (not explained yet), at 4 KiB 0.77-0.82 either way. Records over RUN_BYTES,
#: each a big request of its own, are not advised either: 2 MiB blocks (32 a pass, after
#: a page-cache drop; two runs each way, alternated) ran at medians of 1.04 and 1.07 of
#: the loop advised against 0.96 and 0.71 not, within this VM's spread (0.49-1.75 per
#: round) but no gain; bursts of 64 blocks of 256 KiB (small_blocks, 5 rounds, two runs
#: each) at 1.36-1.50 of the loop advised (a leased chunk of 32 was advised 8 MiB at once
#: before its first read was queued) against 0.97 not.
ADVISE_BYTES = 32 << 20
ADVISE_MIN = 512 << 10
#: The start of a stream of back-to-back records that a batch reads in one file (its
#: ``streams``: :meth:`Reads.read_runs`): advised (:meth:`Reads.will_read`) and read in runs
#: of up to :data:`RUN_BYTES`. Past it the kernel's readahead keeps ahead of the reads
#: (``read_ahead_kb`` 8192 on this VM's disk): no more advice, which cost kernel time for
#: nothing there, and runs of up to :data:`STREAM_RUN_BYTES`, fewer reads handed to the
#: reader thread. A cold batch of 4096 blocks of 64 KiB (256 MiB, written together, 9
#: rounds alternated in one sitting), advice only: 1.65 GB/s [1.04-2.06] at 0.62 CPU s/GB
#: (0.18 in the kernel) against 1.46 [1.36-2.08] at 0.72 (0.33) with every chunk advised;
#: 1.60 at 0.59 (0.16) with no advice at all. It was 8 MiB until session 49, when bursts
#: of 256 blocks of 64 KiB read cold in 4 calls of 64 (16 MiB after a page-cache drop; one
#: process, five runs of 32-48 bursts alternated with the loop) took 1.53-1.69 times the
#: loop's time: the second call crossed the advised start into reads the kernel's
#: readahead had not been ramping (the calls took 71, 121, 48, 106 us a block against the loop's 126, 21,
#: 19, 53). With 1 MiB 0.93 and 0.96 (2 MiB: 1.27 and 1.34; 512 KiB: 1.02); one call of
#: 64 such blocks 0.63 against 0.71 (2 MiB: 1.34); 8 and 16 KiB bursts 1.03 against 1.14
#: and 1.12 against 1.13; the 256 MiB batches of benchmark file_read_mode (three runs of 6
#: rounds each way, alternated) 1.85, 1.65, 1.98 GB/s at 0.36, 0.35, 0.30 CPU s/GB against
#: 1.72, 1.56, 1.66 at 0.40, 0.41, 0.37, the loops of the same runs as far apart. A value
#: fitted to this VM's virtual disk (``read_ahead_kb`` 8192).
STREAM_START_BYTES = 1 << 20
#: Runs past the start of a stream span up to this many bytes (and :data:`RUN_RECORDS`
#: records). The same batch as above, 7 rounds: 1.98 GB/s [1.09-2.09] at 0.41 CPU s/GB
#: against 1.90 [1.43-2.03] at 0.49 with runs of :data:`RUN_BYTES` throughout.
STREAM_RUN_BYTES = SCAN
#: A stream of records of up to :data:`SLOW_RUN_BYTES` whose first record was not in the
#: page cache when the batch came to it (:func:`~.record_io.cached_pages`, which starts no
#: read) is read over its first SLOW_START_BYTES in runs of up to SLOW_RUN_BYTES, as a loop
#: of gets reads it: the kernel sizes its first readahead from the first read (4 times a
#: small one), so a first run of 128 KiB waits for 512 KiB from the disk where a get of
#: 12 KiB waits for 64 KiB, and the windows after it grow from there either way. Benchmark
#: small_blocks' cold bursts (64 blocks a call, 4 calls after a page-cache drop), three
#: runs of 6 rounds alternated with the store before: batch/loop 0.85, 0.82, 0.88 against
#: 0.98, 0.95, 0.94 at 4 KiB, 1.07, 1.02, 0.99 against 1.17, 1.17, 1.11 at 8 KiB. Bigger
#: records, read alone over the slow start, gained nothing: 1.11, 1.07, 1.14 against 1.14,
#: 1.15, 1.16 at 16 KiB; at 32 KiB 1.17 and 1.20 against 1.07 and 1.11 (in one process,
#: 48 and 64 bursts). SLOW_RUN_BYTES was 16 KiB until session 50, which left 16 KiB blocks
#: (records of 20 KiB with their header page) out; slow-started one record a run, their
#: cold bursts in one process went to 0.93 and 0.96 of the loop from 1.16 and 1.19 (two
#: processes, 48 bursts each, alternated). Why session 49's 16 KiB figures above differ
#: is not recorded.
SLOW_START_BYTES = 128 << 10
SLOW_RUN_BYTES = (16 << 10) + HEADER_BYTES
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
_FADVISE = getattr(os, "posix_fadvise", None)

def _outputs_for(loc: Loc, outs: Sequence[Any]) -> list[memoryview]:
    """Writable byte views of ``outs``, which must hold exactly the record's payload."""
    views, nbytes = output_views(outs)
    if nbytes != loc.length:
        raise ValueError(f"output buffers hold {nbytes} bytes, block has {loc.length}")
    return views


#: A batch's stream in one file (its ``streams``: file descriptor -> stream): where it
#: starts, where it ends so far, where its slow start ends (:data:`SLOW_START_BYTES`; its
#: start where it has none) and where the advice given over it from its start ends
#: (:meth:`Reads.will_read`).
Stream = tuple[int, int, int, int]
_NO_STREAM: Stream = (0, -1, 0, 0)


def _streamed(streams: dict[int, Stream], fd: int, offset: int) -> int:
    """Bytes of the batch's stream in file ``fd`` before ``offset`` (0 where it does not reach it)."""
    start, end, _, _ = streams.get(fd, _NO_STREAM)
    return offset - start if start <= offset <= end else 0


def _resident(fd: int, offset: int) -> bool:
    """Whether the byte at ``offset`` of file ``fd`` is in the page cache: a read that would
    wait for the disk is refused at once (``RWF_NOWAIT``). False where the kernel cannot tell."""
    if not _NOWAIT:
        return False
    try:
        return os.preadv(fd, [bytearray(1)], offset, _NOWAIT) == 1
    except OSError:  # EAGAIN: not cached; EOPNOTSUPP: the file system cannot tell
        return False


def _stream_on(streams: dict[int, Stream], fd: int, offset: int, stop: int, probe: bool) -> None:
    """Bytes ``[offset, stop)`` of file ``fd`` are read next: they extend its stream when
    they follow it, else start a new one, slow-started (:data:`SLOW_START_BYTES`) with
    ``probe`` when the page at ``offset`` is not in the page cache."""
    start, end, slow, advised = streams.get(fd, _NO_STREAM)
    if offset == end:
        streams[fd] = (start, stop, slow, advised)
    else:
        streams[fd] = (offset, stop, offset + SLOW_START_BYTES if probe and _cold(fd, offset) else offset, offset)


def _cold(fd: int, offset: int) -> bool:
    """Whether the page at ``offset`` of file ``fd`` is known not to be in the page cache
    (:func:`~.record_io.cached_pages`: no read started); False where the kernel cannot tell."""
    try:
        return record_io.cached_pages(fd, offset, PAGE) == 0
    except OSError:
        return False


def _run_iov(leases: Sequence[Lease], outs: Sequence[Sequence[Any]], scratch: memoryview
             ) -> tuple[list[Any], list[tuple[int, int, int]]]:
    """The buffers a run's one read fills (each record's header page and padding into
    ``scratch``, its payload into its outputs: numpy arrays as they are, as a single
    read takes them, :func:`_array_bytes`) and the span of each payload among them, with
    its checksum's seed (:func:`~.record_io.preadv_hashed`)."""
    iov: list[Any] = []
    spans: list[tuple[int, int, int]] = []
    for lease, out in zip(leases, outs):
        nbytes = lease.loc.length
        views = out if _array_bytes(out) == nbytes else _outputs_for(lease.loc, out)
        iov.append(scratch)
        first = len(iov)
        spans.append((first, first + len(views), key_seed(*lease.key)))
        iov.extend(views)
        padding = -nbytes % PAGE  # (pad(nbytes) - nbytes)
        if padding:
            iov.append(scratch[:padding])
    return iov, spans


def _array_bytes(outs: Sequence[Any]) -> int:
    """The bytes of ``outs`` when all are writable C-contiguous numpy arrays of numpy's own
    dtypes (what a get passes; a read takes their buffers as they are: byte views cost a
    tenth of a 64 KiB read from the page cache), else -1 (ml_dtypes' types have no buffer
    format: those outputs take byte views)."""
    nbytes = 0
    for out in outs:
        if type(out) is not np.ndarray or out.flags.num & WRITABLE_C != WRITABLE_C or out.dtype.isbuiltin != 1:
            return -1
        nbytes += out.nbytes
    return nbytes


def _lead() -> memoryview:
    """This thread's buffer for the header page read ahead of a buffered payload."""
    try:
        return _leads.buf
    except AttributeError:
        _leads.buf = memoryview(bytearray(HEADER_BYTES))
        return _leads.buf


class Reads:
    """The :class:`~cascade.tiers.file_tier.FileTier` methods that read its records (a
    mixin: it uses the tier's index, files, read mode, bounce buffers and counters)."""

    def length(self, key: BlockKey) -> int:
        return self._loc(key).length

    def read_into(self, key: BlockKey, out: Any, offset: int = 0) -> None:
        loc = self._loc(key)
        view = as_byte_view(out, "output buffer")
        if offset == 0 and view.nbytes == loc.length:
            self.read_parts_into(key, [view])
            return
        if offset < 0 or offset + view.nbytes > loc.length:
            raise ValueError(f"read of {view.nbytes} bytes at {offset} outside a block of {loc.length}")
        whole = bytearray(loc.length)  # a partial read still verifies the whole block
        self.read_parts_into(key, [whole])
        view[:] = memoryview(whole)[offset:offset + view.nbytes]

    def read_parts_into(self, key: BlockKey, outs: Sequence[Any]) -> None:
        lease = self.lease(key)
        try:
            self.read_leased(lease, outs)
        except UnreadableBlock:  # an I/O error: the record is kept
            raise
        except CorruptBlock:
            self._kill(key)
            raise
        finally:
            self.release(lease)

    def lease(self, key: BlockKey) -> Lease:
        loc = self._index.get(key)
        if loc is None:
            loc = self._loc(key)  # BlockNotFound
        f = self._files[loc.file_id]
        f.users += 1
        if self._odirect:
            self._direct_fd(f)  # opened here, under the store's lock
        return Lease(key, loc, f)

    def release(self, lease: Lease) -> None:
        self._unhold(lease.file)  # a file compacted while it was read goes at its last read

    def current(self, key: BlockKey, lease: Lease) -> bool:
        return self._index.get(key) is lease.loc

    def read_leased(self, lease: Lease, outs: Sequence[Any]) -> None:
        """Read and verify a leased record (reads only: safe beside any other call).
        :class:`CorruptBlock` when truncated or failing its checksum (the store drops it);
        :class:`UnreadableBlock` when the read fails with an I/O error (the store keeps it)."""
        key, loc, f = lease.key, lease.loc, lease.file
        nbytes = loc.length
        start = loc.offset + HEADER_BYTES
        seed = key_seed(*key)
        digest = None
        direct = f.direct_fd if self._odirect else None
        if direct is None and nbytes + HEADER_BYTES <= SCAN and _array_bytes(outs) == nbytes:
            views = outs  # plain arrays: read into as they are (see _array_bytes)
        else:
            views = _outputs_for(loc, outs)
        try:
            if direct is None:  # the header too (as the lead): see read_hashed
                ok, digest = read_hashed(f.fd, start, nbytes, views, seed, _lead(), stream=self._stream)
            elif all(page_aligned(v) for v in views):
                ok, digest = read_hashed(direct, start, loc.length, views, seed, parallel=True)
            else:
                ok = self._read_bounced(direct, start, loc.length, views)
        except OSError as exc:  # not evidence that the bytes are bad: the record stays
            raise UnreadableBlock(f"{self.name}: reading {key[1]} from {f.path} failed: {exc}") from exc
        if digest is None and ok:
            digest = checksum(views, seed)
        if not ok or digest != loc.checksum:
            self.counters["corrupt_reads"] += 1
            raise CorruptBlock(f"{self.name}: record of {key[1]} in {f.path} is truncated or fails its checksum (dropped)")

    def will_read(self, leases: Sequence[Lease], streams: dict[int, Stream] | None = None) -> None:
        """Buffered reads: ``POSIX_FADV_WILLNEED`` over each stretch of back-to-back
        records among the leased ones of up to :data:`RUN_BYTES` (those that runs join),
        up to :data:`ADVISE_BYTES` in all, so that the kernel fetches a batch's
        cold records in big requests at once instead of as its readahead window grows
        from the batch's first read. Less than :data:`ADVISE_MIN` in all is left to the
        kernel's readahead; an advice the kernel refuses is ignored (a hint). With the
        batch's ``streams`` (as :meth:`read_runs` of these leases left them), a stream is
        advised over its first :data:`STREAM_START_BYTES` only, and only on from where
        the advice given over it ends: once a stretch of it is left to the kernel's
        readahead (under :data:`ADVISE_MIN`), the rest is too. Advice after such a
        stretch fetched pages past the readahead's marks, which then stopped: 256 blocks
        of 32 KiB read cold in 4 calls of 64 (the first leased chunk of 8, 288 KiB, not
        advised, the next of 16 advised) took 1.32x the loop's time, 1.02x with this
        rule (one process, 32 bursts each); 64 KiB bursts 0.94x against 0.98x, 16 KiB
        1.15x against 1.13x."""
        if self._odirect or _FADVISE is None:
            return
        stretches: list[list[int]] = []  # [fd, start, end]
        total = 0
        for lease in leases:
            loc = lease.loc
            record_bytes = loc.record_bytes
            if record_bytes > RUN_BYTES:
                continue
            stop = loc.offset + min(record_bytes, ADVISE_BYTES - total)
            total += stop - loc.offset
            if stretches and stretches[-1][0] == lease.file.fd and stretches[-1][2] == loc.offset:
                stretches[-1][2] = stop
            else:
                stretches.append([lease.file.fd, loc.offset, stop])
            if total >= ADVISE_BYTES:
                break
        if total < ADVISE_MIN:
            return
        for fd, start, end in stretches:
            if streams is not None:
                end = min(end, start + max(0, STREAM_START_BYTES - _streamed(streams, fd, start)))
                stream = streams.get(fd)
                if end == start or (stream is not None and stream[3] != start):
                    continue
                if stream is not None:  # (and the record a next batch may go on with: _go_on)
                    streams[fd] = self._last_streams[fd] = (*stream[:3], end)
            try:
                _FADVISE(fd, start, end - start, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass

    def read_runs(self, leases: Sequence[Lease], streams: dict[int, Stream] | None = None) -> list[range]:
        """Buffered reads join leases of records lying back to back in one file (a
        batch of blocks written together, read in the same order) into runs of up to
        :data:`RUN_BYTES` and :data:`RUN_RECORDS` records: one ``preadv`` each
        (:meth:`read_leased_run`). O_DIRECT reads and records over :data:`RUN_BYTES`
        go alone. ``streams``: the batch's streams of back-to-back records (file
        descriptor -> :data:`Stream`), kept across its calls and extended by these
        leases; a run starting past the first :data:`STREAM_START_BYTES` of its stream
        spans up to :data:`STREAM_RUN_BYTES`, one in the slow start of a stream of small
        records that began out of the page cache up to :data:`SLOW_RUN_BYTES`. A batch's
        first lease in a file may go on with the previous batch's stream there
        (:meth:`_go_on`)."""
        runs: list[range] = []
        lo, file, start, end = 0, None, 0, -1  # the run so far: leases[lo:i], bytes [start, end) of file
        limit = RUN_BYTES
        joins = not self._odirect
        for i, lease in enumerate(leases):
            loc = lease.loc
            stop = loc.offset + loc.record_bytes
            if streams is not None:
                fd = lease.file.fd
                if fd not in streams and joins:
                    self._go_on(streams, fd, loc.offset)
                _stream_on(streams, fd, loc.offset, stop, joins and loc.record_bytes <= SLOW_RUN_BYTES)
            if joins and loc.offset == end and lease.file is file and i - lo < RUN_RECORDS and stop - start <= limit:
                end = stop
                continue
            if i:
                runs.append(range(lo, i))
            lo, file, start, end = i, lease.file, loc.offset, stop
            if streams is not None:  # (this lease is in its file's stream: just extended)
                first, _, slow, _ = streams[file.fd]
                limit = SLOW_RUN_BYTES if start < slow else RUN_BYTES if start - first < STREAM_START_BYTES else STREAM_RUN_BYTES
        if leases:
            runs.append(range(lo, len(leases)))
        self._last_streams.update(streams or ())
        return runs

    def _go_on(self, streams: dict[int, Stream], fd: int, offset: int) -> None:
        """A batch's first record in file ``fd`` is at ``offset``: it goes on with the stream
        of the batch before it there (into ``streams``) if that one stopped at ``offset``
        and what it read last is still in the page cache (:func:`_resident`), so neither a
        drop nor the kernel's reclaim came between them.

        Until session 44 every call started a stream of its own, so a stream read a batch
        at a time (an engine loading a long prefix) was advised and cut into short runs all
        the way, and the kernel's readahead never ran ahead of it: 256 MiB of 64 KiB
        records read cold in ``get_many_into`` calls of 64 (8 rounds alternated in one
        process) ran at 1.66 GB/s and 0.58 CPU s/GB each call afresh, 2.14 and 0.29 going
        on, 2.41 and 0.31 in one call. A call after a page-cache drop needs the advice:
        benchmark small_blocks' cold bursts (64 blocks, each after a drop) stay at 0.71 /
        0.89 of the loop at 64 KiB / 4 KiB with the probe, where going on by position alone
        made them 0.99 / 1.04 (0.73 / 0.84 in the suite before)."""
        last = self._last_streams.get(fd)
        if last is not None and last[1] == offset and offset > 0 and _resident(fd, offset - 1):
            streams[fd] = last

    def read_leased_run(self, leases: Sequence[Lease], outs: Sequence[Sequence[Any]]) -> list[CorruptBlock | None]:
        """Read a run of back-to-back records (:meth:`read_runs`) with one ``preadv``:
        headers and page padding into a scratch page, payloads into ``outs``; then
        verify each payload against its checksum (as :meth:`read_leased` does, which
        does not check headers either: the checksum is seeded with the block's key).
        A failed or short read, or any payload failing its checksum, reads the run
        again record by record, each read and verified in turn: every block gets its
        own verdict, and outputs shared by several blocks of a batch end as a loop of
        single reads would leave them (never a good block dropped as corrupt)."""
        if len(leases) == 1:
            return super().read_leased_run(leases, outs)
        iov, spans = _run_iov(leases, outs, _lead())
        try:
            digests = record_io.preadv_hashed(leases[0].file.fd, leases[0].loc.offset, iov, spans)
        except OSError:
            digests = None
        return self._verdicts(leases, outs, digests)

    def start_leased_run(self, leases: Sequence[Lease], outs: Sequence[Sequence[Any]]) -> Any:
        """Queue a buffered run (:meth:`read_runs`) on the reader thread, its header pages
        into a scratch page of its own: a run of up to :data:`~.record_io.SCAN` bytes as one
        read (:func:`~.record_io.submit`: the read and the hashing run without the
        interpreter lock), a record under :data:`~.record_io.STREAM_MIN` as its pieces
        (:class:`~.record_io.InOrderRead`, hashed in :meth:`finish_leased_run`), so the
        reads of a batch's next records overlap the hashing of the one before. Bigger
        records (one at a time per tier, :class:`~.record_io.ReadStream`) and O_DIRECT
        runs are read in :meth:`finish_leased_run`."""
        first, last = leases[0].loc, leases[-1].loc
        if not self.reads_queued or self._odirect:
            return leases, outs, None
        if last.offset + last.record_bytes - first.offset <= SCAN:
            iov, spans = _run_iov(leases, outs, memoryview(bytearray(HEADER_BYTES)))
            return leases, outs, record_io.submit(leases[0].file.fd, first.offset, iov, spans)
        if len(leases) > 1 or first.length >= STREAM_MIN:
            return leases, outs, None
        return leases, outs, record_io.InOrderRead(leases[0].file.fd, first.offset, memoryview(bytearray(HEADER_BYTES)),
                                                   _outputs_for(first, outs[0]), key_seed(*leases[0].key))

    def finish_leased_run(self, started: Any) -> list[CorruptBlock | None]:
        leases, outs, job = started
        if job is None:
            return self.read_leased_run(leases, outs)
        try:
            digests = job.wait()
        except OSError:
            digests = None
        return self._verdicts(leases, outs, digests)

    def _verdicts(self, leases: Sequence[Lease], outs: Sequence[Sequence[Any]], digests: list[int] | None
                  ) -> list[CorruptBlock | None]:
        """The run's verdicts from its digests (None: the read failed or fell short): all
        good when each matches its record's checksum, else each record read and verified
        again on its own (see :meth:`read_leased_run`)."""
        if digests == [lease.loc.checksum for lease in leases]:  # (None, or one per lease: compared as lists)
            return [None] * len(leases)
        record_io.wait_idle()  # no queued read may land in outputs a batch shares while these are verified
        return super().read_leased_run(leases, outs)

    def _read_bounced(self, fd: int, start: int, length: int, views: Sequence[memoryview]) -> bool:
        """O_DIRECT into a page-aligned bounce buffer, then copy out (unaligned outputs)."""
        size = pad(length)
        with self._bounce_lock:
            fitting = [b for b in self._bounces if len(b) >= size]
            if fitting:
                self._bounces.remove(fitting[0])
        bounce_map = fitting[0] if fitting else mmap.mmap(-1, max(size, 1 << 20))  # page-aligned
        bounce = memoryview(bounce_map)
        try:
            if os.preadv(fd, [bounce[:size]], start) < length:
                return False
            pos = 0
            for v in views:
                v[:] = bounce[pos:pos + v.nbytes]
                pos += v.nbytes
        finally:
            bounce.release()
            with self._bounce_lock:
                if len(self._bounces) < READERS:
                    self._bounces.append(bounce_map)
                else:
                    bounce_map.close()
        return True

    def _direct_fd(self, f: SegmentFile) -> int | None:
        if not self._odirect:
            return None
        if f.direct_fd is None:
            try:
                f.direct_fd = open_own(f.path, os.O_RDONLY | os.O_DIRECT)
            except (OSError, CascadeError) as exc:  # tmpfs and some FUSE file systems refuse O_DIRECT
                log.info("%s: O_DIRECT unavailable in %s (%s): buffered reads", self.name, self.directory, exc)
                self._odirect = False
                self.read_mode = "buffered"
                self.reads_queued = record_io.queued_reads()
                return None
        return f.direct_fd
