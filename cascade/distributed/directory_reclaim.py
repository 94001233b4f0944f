"""Reclaiming what a stopped rank left in the global directory (a mixin of
:class:`~.directory.ShardedDirectory`).

A rank that stops between taking a bucket lock or claiming a slot (state WRITING) and
committing would block that bucket's inserts, and every reader of that key, for good.
Both are reclaimable, by whichever rank meets them, with a compare-and-swap:

* a LOCK word names its holder (rank and acquisition count): a waiter takes it over at
  once when the holder is known failed (:meth:`Reclaim.mark_failed`), or when it
  has seen the very same word for ``claim_lease`` seconds;
* a WRITING slot is reclaimed once a waiter has seen the very same CTL word for
  ``claim_lease`` seconds, or at once when the entry its writer put there names a failed
  rank. If the writer's words are complete (sealed for the commit's version) and name a
  live rank, the reclaimer commits them on its behalf; otherwise the slot is deleted
  (that block becomes a miss; a rewrite's pin and child counts go with it).

Every commit and unlock is itself a compare-and-swap, so a writer that was presumed dead
and wakes up cannot overwrite what a reclaimer did: it gets :class:`ClaimReclaimed`. The
lease must therefore exceed any pause of a live rank inside one directory operation
(default :data:`.directory.CLAIM_LEASE_SECONDS`; shorter than :data:`.rma.STALL_SECONDS`, after
which waiters give up with :class:`~cascade.errors.RankFailure`). A slot claimed but never
written (no key in it) is found only by its owner's :meth:`Reclaim.sweep`.

A placeholder (see :mod:`.layout`) whose children were published by a rank that died
would wait for their removal forever: the owner's sweep deletes placeholders older than
``placeholder_lease`` (default :data:`.directory.PLACEHOLDER_LEASE_SECONDS`). Deleting one early only
means a later re-put of that block starts with no child count (leaf-first eviction then
sees it as a leaf). Not reclaimed: the child count of a parent that is still a block, and
entries naming a dead rank (the directory does not record a block's parent, nor which
tiers of a dead rank stay readable); reads of those fail their copy and count as misses.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from . import layout as L
from .layout import DirectoryEntry

log = logging.getLogger("cascade.distributed.directory")


class Reclaim:
    """Stale locks, claims and placeholders: found, then taken over by one CAS each.
    Uses the shard access (:class:`~.directory_shard.ShardAccess`: ``_snapshot``, ``_cas``)
    and the directory's ``failed`` ranks, ``claim_lease``, ``placeholder_lease``,
    ``reclaimed`` counters and ``_swept`` sightings."""

    def mark_failed(self, ranks) -> None:
        """Declare ranks stopped (e.g. those a :class:`~.agree.PeerStepFailed` names): their
        bucket locks, and claims whose entries name them, are reclaimed at once by this
        rank when met. Local; other ranks learn it only from their own calls."""
        bad = {int(r) for r in ranks}
        if not bad <= set(range(self.size)) or self.rank in bad:
            raise ValueError(f"mark_failed({sorted(bad)}): ranks must be other ranks of 0..{self.size - 1}")
        self.failed |= bad

    def sweep(self) -> int:
        """Reclaim stale locks, claims and placeholders in this rank's own shard (a claim
        whose writer stopped before writing its key is found by nobody's lookup). A lock
        or claim is stale when it names a failed rank, or when an earlier sweep saw the
        same word at least ``claim_lease`` seconds ago; a placeholder when it is older
        than ``placeholder_lease``. Returns how many it reclaimed. Local: one ``Get`` of
        the shard plus one CAS per reclaim."""
        words = np.frombuffer(self._snapshot(), dtype=np.uint64).reshape(self.nbuckets, L.BUCKET_WORDS)
        now, seen, done = time.monotonic(), {}, 0
        for bucket in np.nonzero(words[:, L.LOCK])[0].tolist():
            word = int(words[bucket, L.LOCK])
            if self._expired(self._swept, seen, (bucket, -1), word, now) or L.lock_holder(word) in self.failed:
                if self._cas(self.rank, L.bucket_disp(bucket) + L.LOCK, word, 0) == word:
                    self.reclaimed["locks"] += 1
                    done += 1
        ctls = words[:, L.HEADER_WORDS + L.CTL::L.ENTRY_WORDS]
        for bucket, i in zip(*np.nonzero((ctls & np.uint64(3)) == L.WRITING)):
            ctl, buf = int(ctls[bucket, i]), memoryview(words[bucket]).cast("B")
            claim = L.read_claim(buf, L.slot_offset(int(i)))
            if self._expired(self._swept, seen, (int(bucket), int(i)), ctl, now) or self._names_failed(claim):
                done += self._reclaim(self.rank, int(bucket), int(i), ctl, claim)
        slots = words[:, L.HEADER_WORDS:].reshape(self.nbuckets, L.BUCKET_SLOTS, L.ENTRY_WORDS)
        old = (((slots[:, :, L.CTL] & np.uint64(3)) == L.VALID) & ((slots[:, :, L.PLACE] & np.uint64(0xFF)) == L.NO_TIER)
               & (slots[:, :, L.LOCATION] + np.uint64(int(self.placeholder_lease)) < np.uint64(int(time.time()))))
        for bucket, i in zip(*np.nonzero(old)):
            ctl = int(slots[bucket, i, L.CTL])
            gone = L.next_ctl(ctl, L.DELETED, keep_counts=False)  # fails if a count moved or it was re-put
            if self._cas(self.rank, L.slot_disp(int(bucket), int(i)) + L.CTL, ctl, gone) == ctl:
                self.reclaimed["placeholders"] += 1
                done += 1
        self._swept = seen
        return done

    def _expired(self, before: dict, after: dict, where: tuple[int, int], word: int, now: float) -> bool:
        """Whether ``word`` at ``where`` was already seen (in ``before``) a lease ago;
        records the sighting in ``after``."""
        seen = before.get(where)
        since = seen[1] if seen is not None and seen[0] == word else now
        after[where] = (word, since)
        return now - since >= self.claim_lease

    def _names_failed(self, claim: DirectoryEntry | None) -> bool:
        return claim is not None and claim.tier != L.NO_TIER and claim.rank in self.failed

    def _reclaim(self, owner: int, bucket: int, i: int, ctl: int, claim: DirectoryEntry | None) -> int:
        """Finish (complete words naming a live rank) or delete a stale claim: one CAS.
        Returns 1 when this call changed it, 0 when it had moved on meanwhile."""
        commit = claim is not None and not self._names_failed(claim)
        new = L.next_ctl(ctl, L.VALID) if commit else L.next_ctl(ctl, L.DELETED, keep_counts=False)
        if self._cas(owner, L.slot_disp(bucket, i) + L.CTL, ctl, new) != ctl:
            return 0
        self.reclaimed["committed" if commit else "deleted"] += 1
        log.warning("rank %d reclaimed a stale claim of slot %d/%d on rank %d: %s", self.rank, bucket, i, owner,
                    "committed its complete entry" if commit else "deleted it")
        return 1
