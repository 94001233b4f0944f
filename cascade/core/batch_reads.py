"""Batch gets of leased blocks: the blocks of a batch leased a chunk at a time under the
store's lock, read outside it as runs that a tier reads in one go (queued on the file
tier's reader thread, or on the store's I/O workers), and counted as each run lands.
An exception anywhere waits for every run started and ends every lease. Thread-safe.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import CorruptBlock
from ..identity import BlockKey
from ..policy import BlockMeta
from ..stats import StoreMetrics
from ..tiers.base import Memory, Tier
from .guards import InFlight, Lease
from .index import BlockIndex

#: A batch get leases its file-tier blocks in steps of this many bytes (:meth:`LeasedBatchReads.read_leased_many`):
#: a leased block can be neither evicted nor compacted away, so a big batch must not pin all of it at once.
LEASED_STEP_BYTES = 256 << 20
#: A batch get leases this many blocks in one locked step, then starts their runs (queued
#: runs read while it leases the next ones: :meth:`LeasedBatchReads._read_leased_step`).
LEASE_CHUNK = 32
#: ... but its first chunk of a step leases this many, each next chunk twice the last, up to
#: :data:`LEASE_CHUNK`: the reader thread idles until a batch's first run is queued, and
#: leasing 32 blocks took about 110 us (3 us each) of a 64-block call of 64 KiB blocks
#: from the page cache that took 750 (``get_many_into`` calls of 64 in turn over 256 MiB,
#: one process, the two alternated, medians of each round's time per block over the
#: loop's): warm, 16 rounds, 0.71x the loop against 0.81x with 32 from the start (4.67
#: against 4.42 GB/s); cold (page cache dropped before each pass), 12 rounds, 1.11x
#: against 1.11x (2.28 against 2.21 GB/s; rounds 0.2-1.35x): a gain from memory only.
FIRST_LEASE_CHUNK = 8
#: Bytes of queued runs a batch step starts ahead of the ones it has counted: past this it
#: counts the oldest before it leases more. Before, a step leased, advised
#: (``POSIX_FADV_WILLNEED``) and queued all of its blocks before it counted any: a 256 MiB
#: batch of 64 KiB blocks told the kernel to fetch all 256 MiB at once (0.25 CPU s/GB
#: more in the kernel than the same blocks read one by one: :meth:`~cascade.tiers.base.Tier.will_read`).
QUEUED_AHEAD_BYTES = 32 << 20

#: Kinds of numpy's own dtypes that a ``memoryview`` takes as they are (a tier's read
#: fills the array's own buffer). Dtypes added to numpy (ml_dtypes' bfloat16, float8:
#: ``isbuiltin`` 2) it does not take: they go through :meth:`~.reads.ReadPath.read`'s byte views.
BUFFER_KINDS = frozenset("biufc")


def buffer_arrays(outs: Sequence[Any]) -> bool:
    """Whether every output is a numpy array of numpy's own dtype of a :data:`BUFFER_KINDS` kind."""
    for o in outs:  # a loop, not all() over a generator: it runs per block of a batch
        if type(o) is not np.ndarray or o.dtype.isbuiltin != 1 or o.dtype.kind not in BUFFER_KINDS:
            return False
    return True


class LeasedBatchReads:
    """The batch gets of :class:`~.reads.ReadPath`, a base class of it: the read path
    provides the store's lock, index, tiers and metrics and the per-block lookup and
    counts declared here."""

    _lock: threading.RLock
    _inflight: InFlight
    _nbytes: int
    _tiers: Sequence[Tier]
    _promote_on_hit: bool
    index: BlockIndex
    metrics: StoreMetrics
    cached: Callable[[BlockKey], BlockMeta | None]
    _count: Callable[..., bool]
    _used: Callable[[BlockMeta, float], None]

    def read_leased_many(self, keys: Sequence[BlockKey], outs: Sequence[Sequence[Any]],
                         parallel: Callable[..., list[Any]], *, any_outputs: bool = False) -> list[bool | None]:
        """:meth:`~.reads.ReadPath.read` of each block of ``keys`` cached in a tier read outside the lock
        into host memory (the file tier) whose outputs are numpy arrays (of a
        :data:`BUFFER_KINDS` dtype), or with ``any_outputs`` of each block in a tier
        that reads into any buffer (SHM, GPU), host or device, whatever its outputs
        (device copies are only enqueued inside a batch: no worker threads needed), in
        steps of :data:`LEASED_STEP_BYTES`: one locked
        step leases a step's blocks, ``parallel(fn, items, in_memory=, item_bytes=)``
        runs their copies as runs that a tier reads in one go (the store's I/O workers;
        :meth:`~cascade.tiers.base.Tier.read_runs`: the file tier joins records lying
        back to back; ``in_memory`` when every copy of the step releases the
        interpreter lock: :attr:`~cascade.tiers.base.Tier.copies_without_gil`), one
        locked step counts them; each hit is timed as an equal share of its run. None for every other block (a miss here, a
        device output, a promotion due, another tier): the caller reads those one by
        one. Per block this saves the get's own locked steps and guards (65 of 90 us of
        a warm 64 KiB file-tier get through :meth:`~.reads.ReadPath.read` on this project's VM, against
        24 us for the tier's read). An error that is not a corrupt
        copy ends the step's leases, counts its uncounted blocks as missed gets and is
        raised (later steps are not read)."""
        results: list[bool | None] = [None] * len(keys)
        step = max(1, LEASED_STEP_BYTES // max(1, self._nbytes))
        streams: dict[int, tuple[int, ...]] = {}  # what the batch reads, for its tiers' read_runs and will_read
        with self._inflight.hold(f"a batch get of {len(keys)} blocks") as op:
            for lo in range(0, len(keys), step):
                self._read_leased_step(range(lo, min(lo + step, len(keys))), keys, outs, parallel, results, op,
                                       any_outputs, streams)
        return results

    def _read_leased_step(self, indices: range, keys: Sequence[BlockKey], outs: Sequence[Sequence[Any]],
                          parallel: Callable[..., list[Any]], results: list[bool | None], op: Any,
                          any_outputs: bool, streams: dict[int, tuple[int, ...]]) -> None:
        """One step of :meth:`read_leased_many`: the blocks ``keys[i]`` for ``i`` in ``indices``,
        leased a chunk at a time (:func:`_lease_chunks`). A run in a tier that queues its reads
        (:attr:`~cascade.tiers.base.Tier.reads_queued`: the file tier's buffered runs) is
        started as soon as its blocks are leased, so the reader threads read it while
        this thread leases the next blocks and counts the runs that have landed; the
        other runs are read by ``parallel``. Queued runs are counted in order, each hit
        timed as an equal share of its run's time from its start, the oldest ones as soon
        as more than :data:`QUEUED_AHEAD_BYTES` are queued."""
        leased: list[tuple[int, Lease]] = []
        queued: list[tuple[range, Any, float]] = []  # (run, its start, when), in order
        finished = 0  # queued runs finished so far
        ahead = 0  # bytes of the queued runs not finished yet
        others: list[range] = []

        def finish_next() -> None:
            nonlocal finished, ahead
            run, started, at = queued[finished]
            errors = leased[run[0]][1].tier.finish_leased_run(started)
            finished += 1
            ahead -= len(run) * self._nbytes
            share = (time.perf_counter() - at) / len(run)
            with self._lock:
                self._count_run_into(results, leased, run, errors, share)

        try:
            for chunk in _lease_chunks(indices):
                first = len(leased)
                with self._lock:
                    for i in chunk:
                        meta = self.cached(keys[i])
                        if meta is None or (meta.tier and self._promote_on_hit):
                            continue
                        tier = self._tiers[meta.tier]
                        if not tier.concurrent or not (tier.reads_into_device if any_outputs else
                                                       tier.memory is not Memory.DEVICE and buffer_arrays(outs[i])):
                            continue
                        leased.append((i, Lease(self._lock, self.index, meta, meta.tier, tier)))
                        self.metrics.counters.gets += 1
                    op.what = f"a batch get holding {len(leased)} leases"
                for run in _runs_advised(leased[first:], streams):
                    run = range(first + run.start, first + run.stop)
                    tier = leased[run.start][1].tier
                    if tier.reads_queued:
                        started = tier.start_leased_run([leased[j][1].handle for j in run],
                                                        [outs[leased[j][0]] for j in run])
                        queued.append((run, started, time.perf_counter()))
                        ahead += len(run) * self._nbytes
                    else:
                        others.append(run)
                while ahead > QUEUED_AHEAD_BYTES:
                    finish_next()

            def copy(run: range) -> tuple[list[CorruptBlock | None], float]:
                tier = leased[run[0]][1].tier
                started = time.perf_counter()
                errors = tier.read_leased_run([leased[j][1].handle for j in run], [outs[leased[j][0]] for j in run])
                return errors, (time.perf_counter() - started) / len(run)

            others = _joined_in_memory(others, leased)
            if others:
                copied = parallel(copy, others, in_memory=all(leased[run[0]][1].tier.copies_without_gil
                                                              for run in others),
                                  item_bytes=self._nbytes * sum(map(len, others)) // len(others))
                with self._lock:
                    for run, (errors, share) in zip(others, copied):
                        self._count_run_into(results, leased, run, errors, share)
            while finished < len(queued):
                finish_next()
        except BaseException:
            for run, started, _ in queued[finished:]:  # no queued read may go on past its leases
                try:
                    leased[run[0]][1].tier.finish_leased_run(started)
                except Exception:  # the error being raised is the one to report
                    pass
            with self._lock:
                for _, lease in leased:
                    if lease.held:  # not counted: a missed get
                        lease.release()
                        self.metrics.miss()
            raise

    def _count_run_into(self, results: list[bool | None], leased: Sequence[tuple[int, Lease]], run: range,
                        errors: Sequence[CorruptBlock | None], share: float) -> None:
        """Under the lock: :meth:`_count_run` of the leases ``leased[j]`` for ``j`` in
        ``run``, each verdict put at its block's index in ``results``."""
        for j, hit in zip(run, self._count_run([leased[j][1] for j in run], errors, share)):
            results[leased[j][0]] = hit

    def _count_run(self, leases: Sequence[Lease], errors: Sequence[CorruptBlock | None], share: float) -> list[bool]:
        """Under the lock: :meth:`_count` (with ``release``) of each lease of a run read
        in one go (one tier), each hit timed as ``share`` seconds and counted with the
        others in one call. Whether each was a hit; a lease whose count raised, and
        every lease after it, stay :attr:`~.guards.Reading.held` (the caller ends them)."""
        hits, nbytes, at, counted = 0, 0, time.monotonic(), []
        try:
            for lease, error in zip(leases, errors):
                if error is not None:
                    counted.append(self._count(lease, error, time.perf_counter() - share, release=True))
                    continue
                lease.release()
                hits += 1
                nbytes += lease.meta.nbytes
                counted.append(True)
                self._used(lease.meta, at)
        finally:
            if hits:
                self.metrics.hits(leases[0].t, nbytes, share, hits)
        return counted


def _lease_chunks(indices: range) -> Iterator[range]:
    """``indices`` cut into the chunks a batch step leases in turn: :data:`FIRST_LEASE_CHUNK`
    (at most :data:`LEASE_CHUNK`), then each twice the last, up to :data:`LEASE_CHUNK`."""
    lo, size = indices.start, min(FIRST_LEASE_CHUNK, LEASE_CHUNK)
    while lo < indices.stop:
        yield range(lo, min(lo + size, indices.stop))
        lo += size
        size = min(2 * size, LEASE_CHUNK)


def _runs_advised(leased: Sequence[tuple[int, Lease]], streams: dict[int, tuple[int, ...]]) -> list[range]:
    """Indices into ``leased`` cut into runs its tiers read in one go, each within one
    tier: per stretch of leases in one tier, :meth:`~cascade.tiers.base.Tier.read_runs`
    then :meth:`~cascade.tiers.base.Tier.will_read` of its leases, in order, with the
    batch's ``streams`` (which the runs extend before the advice reads them)."""
    runs: list[range] = []
    for lo, hi in _tier_stretches(leased):
        tier = leased[lo][1].tier
        handles = [lease.handle for _, lease in leased[lo:hi]]
        runs += [range(lo + r.start, lo + r.stop) for r in tier.read_runs(handles, streams)]
        tier.will_read(handles, streams)
    return runs


def _joined_in_memory(runs: list[range], leased: Sequence[tuple[int, Lease]]) -> list[range]:
    """``runs`` with each stretch of adjacent runs in one tier that copies without the
    interpreter lock (:attr:`~cascade.tiers.base.Tier.copies_without_gil`: a host slab,
    which reads any of its leases as one run) joined into one run. The chunks a step
    leases in turn (:func:`_lease_chunks`) each gave such a tier a run of its own, and
    runs went to the batch's worker threads, each copying alone, where one run is one
    compiled copy on the caller's thread shared with the copy helper
    (:mod:`~cascade.buffers.splitcopy`). Hot batches of 32 blocks of 2 MiB against the
    same gets in a loop, one process, the two alternated (60 rounds, two runs each):
    1.034 and 1.050 as three runs, 0.988 and 1.009 as one."""
    joined: list[range] = []
    for run in runs:
        last = joined[-1] if joined else None
        tier = leased[run.start][1].tier
        if last is not None and last.stop == run.start and tier.copies_without_gil and leased[last.start][1].tier is tier:
            joined[-1] = range(last.start, run.stop)
        else:
            joined.append(run)
    return joined


def _tier_stretches(leased: Sequence[tuple[int, Lease]]) -> list[tuple[int, int]]:
    """``(lo, hi)`` of each stretch ``leased[lo:hi]`` of leases in one tier, in order."""
    stretches: list[tuple[int, int]] = []
    lo = 0
    for hi in range(1, len(leased) + 1):
        if hi == len(leased) or leased[hi][1].tier is not leased[lo][1].tier:
            stretches.append((lo, hi))
            lo = hi
    return stretches
