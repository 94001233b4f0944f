"""A directory whose next insert stops half way, as a rank that dies there would.

A rank that really dies ends the whole job under ``mpiexec`` (hydra), so the reclaim of a
dead rank's bucket lock and slot claim (:mod:`cascade.distributed.directory_reclaim`) is
tested with a rank that stays alive but abandons its insert: it keeps the bucket lock and
leaves the slot as it was at the chosen step, never commits and never unlocks
(:meth:`~cascade.distributed.directory_shard.ShardAccess._commit_and_unlock`), as if it
had stopped there. Everything else is the real directory over real MPI windows.
"""
from __future__ import annotations

from cascade.distributed.directory import ShardedDirectory
from cascade.errors import CascadeError

STEPS = ("locked", "claimed", "written")


class Abandoned(CascadeError, RuntimeError):
    """Raised by :class:`AbandoningDirectory` where the emulated rank stopped."""


class AbandoningDirectory(ShardedDirectory):
    """:class:`ShardedDirectory` whose next insert of a new key, after :meth:`abandon_at`,
    stops at ``step``: ``"locked"`` (bucket lock taken, nothing claimed), ``"claimed"``
    (a free slot CAS-ed to WRITING, no words written) or ``"written"`` (every word written
    and sealed, only the commit missing); it raises :class:`Abandoned` and keeps the lock."""

    _step: str | None = None

    def abandon_at(self, step: str) -> None:
        if step not in STEPS:
            raise ValueError(f"step must be one of {STEPS}, not {step!r}")
        self._step = step

    def _insert_locked(self, owner, home, key, entry):
        if self._step == "locked":
            self._stop()
        return super()._insert_locked(owner, home, key, entry)

    def _claim(self, owner, home, free, start, entry):
        claimed = super()._claim(owner, home, free, start, entry)
        if self._step == "claimed":
            self._stop()
        return claimed

    def _commit_and_unlock(self, owner, home, disp, writing, final, what):
        if self._step == "written":
            self._commit_left = (owner, home, self._held[(owner, home)], disp, writing, final, what)
            self._stop()
        return super()._commit_and_unlock(owner, home, disp, writing, final, what)

    def resume(self) -> None:
        """The emulated rank wakes up and does what was left of an insert abandoned at
        ``"written"``: commit and unlock (:class:`ClaimReclaimed` if another rank
        reclaimed them meanwhile)."""
        owner, home, word, disp, writing, final, what = self._commit_left
        self._held[(owner, home)] = word
        super()._commit_and_unlock(owner, home, disp, writing, final, what)

    def _stop(self) -> None:
        self._step = None
        self._held.clear()  # the lock stays taken: this "rank" never unlocks
        raise Abandoned("insert abandoned (emulating a rank that stopped here)")
