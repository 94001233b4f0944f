"""Access to the directory's shard windows (a mixin of :class:`~.directory.ShardedDirectory`):
the RMA word primitives and the per-bucket lock.

Every rank's shard is one ``Win.Allocate`` window (layout: :mod:`.layout`) inside a
``Lock_all`` epoch opened at allocation; every access below is one-sided and completed by
a ``Flush`` (``Flush_local`` for reads) of its target alone.

* Reads: one bucket with one ``Get`` (:meth:`ShardAccess._get_bucket`); many buckets of
  many owners with all their ``Get`` calls in flight together
  (:meth:`ShardAccess._gather_buckets`); this rank's whole shard with one ``Get``
  (:meth:`ShardAccess._snapshot`).
* Word atomics: ``Compare_and_swap`` (:meth:`ShardAccess._cas`), ``Fetch_and_op`` sum
  (:meth:`ShardAccess._fetch_add`), each 1 round trip; an ``Accumulate`` replace
  (:meth:`ShardAccess._store`) completes at the next :meth:`ShardAccess._flush`.
* The bucket lock: a bucket's LOCK word is 0 or names its holder (rank and acquisition
  count, :func:`.layout.lock_word`); taken by a CAS from 0 (or from a failed or
  lease-expired holder's word, see :mod:`.directory_reclaim`) and given back by a CAS
  from our word, so a holder whose lock was taken over learns it (:class:`ClaimReclaimed`).
  A slot claimed WRITING is committed by a CAS from its WRITING word; commit and unlock
  share one round trip (two CASes, one ``Flush``).

Thread-safety: none (the scratch buffers are shared); as the directory.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from ..errors import RankFailure
from . import layout as L
from .rma import Backoff, allocate_window, free_window

if TYPE_CHECKING:
    from mpi4py import MPI

log = logging.getLogger("cascade.distributed.directory")

class ClaimReclaimed(RankFailure):
    """This rank's bucket lock or slot claim was reclaimed by another rank (it held it
    past the claim lease, or was declared failed); its operation did not take effect."""


class ShardAccess:
    """The window of this rank's shard, one-sided word access to every rank's shard, and
    the bucket lock. Uses the directory's ``rank``, ``nbuckets`` and ``_MPI``, and for lock
    takeovers the reclaim mixin's ``failed``, ``reclaimed`` and ``_expired``
    (:class:`~.directory_reclaim.Reclaim`)."""

    def _open_shard(self, comm: MPI.Comm) -> None:
        """Collective: allocate this rank's shard window (all zero: every slot EMPTY, every
        bucket unlocked) and the scratch buffers of the operations below."""
        self._win: MPI.Win | None = allocate_window(comm, self.nbuckets * L.BUCKET_BYTES, 8, label="directory")
        self._raw = bytearray(L.BUCKET_BYTES)  # one bucket, read by single-key operations
        self._bucket = np.frombuffer(self._raw, dtype=np.uint64)
        self._origin = np.zeros(1, dtype=np.uint64)
        self._compare = np.zeros(1, dtype=np.uint64)
        self._result = np.zeros(1, dtype=np.uint64)
        self._in_flight: list[np.ndarray] = []
        self._lock_count = 0
        self._held: dict[tuple[int, int], int] = {}  # (owner, home) -> our LOCK word
        self._pair = np.zeros((3, 2), dtype=np.uint64)  # origin, compare, result of 2 CASes

    def _close_shard(self) -> None:
        """Collective: free the window. Idempotent."""
        if self._win is not None:
            free_window(self._win)
            self._win = None

    # -- words ---------------------------------------------------------------------------
    def _snapshot(self) -> bytearray:
        """A copy of this rank's whole shard, read with one Get (consistent per word)."""
        snapshot = bytearray(self.nbuckets * L.BUCKET_BYTES)
        self._win.Get(np.frombuffer(snapshot, dtype=np.uint64), self.rank, 0)
        self._win.Flush_local(self.rank)
        return snapshot

    def _get_bucket(self, owner: int, bucket: int) -> bytearray:
        """Bucket ``bucket`` of rank ``owner``, read into the one-bucket buffer (1 round
        trip); valid until the next read into it."""
        self._win.Get(self._bucket, owner, L.bucket_disp(bucket))
        self._win.Flush_local(owner)
        return self._raw

    def _gather_buckets(self, owners: np.ndarray, buckets: np.ndarray) -> np.ndarray:
        """Bucket ``buckets[i]`` of rank ``owners[i]`` as row i of a ``(n, BUCKET_WORDS)``
        array: one contiguous Get per distinct bucket, all in flight, one flush per owner.
        Not one derived-datatype Get: MPICH's network modules may run those as active
        messages, which wait for the target to enter MPI."""
        rows = np.empty((len(owners), L.BUCKET_WORDS), dtype=np.uint64)
        fetched = []
        for owner in np.unique(owners).tolist():
            sel = np.nonzero(owners == owner)[0]
            distinct, inverse = np.unique(buckets[sel], return_inverse=True)
            got = np.empty((len(distinct), L.BUCKET_WORDS), dtype=np.uint64)
            for row, bucket in enumerate(distinct.tolist()):
                self._win.Get(got[row], owner, bucket * L.BUCKET_WORDS)
            fetched.append((owner, sel, inverse, got))
        for owner, sel, inverse, got in fetched:
            self._win.Flush_local(owner)
            rows[sel] = got[inverse]
        return rows

    def _cas(self, owner: int, disp: int, compare: int, value: int) -> int:
        """Compare-and-swap one word; returns the word found (1 round trip)."""
        self._origin[0], self._compare[0] = value, compare
        self._win.Compare_and_swap(self._origin, self._compare, self._result, owner, disp)
        self._win.Flush(owner)
        return int(self._result[0])

    def _fetch_add(self, owner: int, disp: int, n: int) -> int:
        """Atomically add ``n`` to one word; returns the word before (1 round trip)."""
        self._origin[0] = n
        self._win.Fetch_and_op(self._origin, self._result, owner, disp, self._MPI.SUM)
        self._win.Flush(owner)
        return int(self._result[0])

    def _store(self, owner: int, disp: int, value: int) -> None:
        """Atomic replace of one word; completes at the caller's next :meth:`_flush`."""
        origin = np.array([value], dtype=np.uint64)
        self._in_flight.append(origin)  # an origin buffer must live until the Flush
        self._win.Accumulate(origin, owner, disp, self._MPI.REPLACE)

    def _flush(self, owner: int) -> None:
        """Complete every operation of this rank on ``owner``'s shard."""
        self._win.Flush(owner)
        self._in_flight.clear()

    # -- the bucket lock -----------------------------------------------------------------
    def _lock(self, owner: int, home: int) -> None:
        """Take the bucket lock; take it over from a failed or lease-expired holder."""
        if (owner, home) in self._held:
            raise RuntimeError("directory bucket lock taken twice by one rank (re-entrant call?)")
        disp = L.bucket_disp(home) + L.LOCK
        self._lock_count += 1
        mine = L.lock_word(self.rank, self._lock_count)
        backoff = Backoff(f"directory bucket lock {home} on rank {owner}")
        watch: dict = {}
        expect = 0
        while (word := self._cas(owner, disp, expect, mine)) != expect:
            expect = 0
            if word and (L.lock_holder(word) in self.failed
                         or self._expired(watch, watch, (home, -1), word, time.monotonic())):
                expect = word  # the next CAS takes it over
            elif word:
                backoff.wait()
        if expect:
            self.reclaimed["locks"] += 1
            log.warning("rank %d took over bucket lock %d on rank %d from rank %d (%s)", self.rank, home,
                        owner, L.lock_holder(expect),
                        "failed" if L.lock_holder(expect) in self.failed else "lease expired")
        self._held[(owner, home)] = mine

    def _unlock(self, owner: int, home: int) -> None:
        """Release the bucket lock if still held (:class:`ClaimReclaimed` if taken over)."""
        mine = self._held.pop((owner, home), None)
        if mine is not None and self._cas(owner, L.bucket_disp(home) + L.LOCK, mine, 0) != mine:
            raise ClaimReclaimed(f"rank {self.rank}'s lock of bucket {home} on rank {owner} was taken over")

    def _commit(self, owner: int, disp: int, writing: int, final: int, what: str) -> None:
        """CAS a claimed slot from ``writing`` to ``final`` (1 round trip)."""
        _check_commit(self._cas(owner, disp + L.CTL, writing, final), writing, final, what)

    def _commit_and_unlock(self, owner: int, home: int, disp: int, writing: int, final: int, what: str) -> None:
        """:meth:`_commit` and :meth:`_unlock` in one round trip (two CASes, one Flush)."""
        mine = self._held.pop((owner, home))
        self._pair[0] = final, 0
        self._pair[1] = writing, mine
        self._win.Compare_and_swap(self._pair[0, :1], self._pair[1, :1], self._pair[2, :1], owner, disp + L.CTL)
        self._win.Compare_and_swap(self._pair[0, 1:], self._pair[1, 1:], self._pair[2, 1:], owner,
                                   L.bucket_disp(home) + L.LOCK)
        self._win.Flush(owner)
        old, lock = (int(x) for x in self._pair[2])
        _check_commit(old, writing, final, what)
        if lock != mine:
            raise ClaimReclaimed(f"rank {self.rank}'s lock of bucket {home} on rank {owner} was taken over")


def _check_commit(old: int, writing: int, final: int, what: str) -> None:
    """A commit CAS found ``old``: ours (``writing``), or already committed for us by a
    reclaimer (VALID at the final version, counts maybe moved since); else it was lost."""
    if old != writing and not (L.ctl_state(old) == L.VALID and L.ctl_version(old) == L.ctl_version(final)):
        raise ClaimReclaimed(f"{what}: the claim was reclaimed by another rank (held past the claim lease, "
                             "or this rank was declared failed); nothing was written")
