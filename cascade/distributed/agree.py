"""Collective agreement on the outcome of a collective step (open, warm restart, close).

A collective step of a multi-rank store is done only when every rank's part of it is done
and visible: a rank that returns from the store's constructor while another is still
republishing its file-tier blocks reads a directory that is not complete yet. And a step
that failed on one rank must fail on every rank, with a message naming the rank, instead
of leaving the others waiting forever in the next collective call.

:func:`agree` is that step's end: every rank says whether its part succeeded, and learns
the others' answers. It doubles as a barrier (no rank leaves before every rank arrived),
so every one-sided update a rank completed (``Flush``-ed) before calling it is visible to
every rank after it.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..errors import RankFailure

#: Seconds a rank waits in :func:`agree` for the slowest rank before giving up
#: (a warm restart of a large file tier takes a while: see docs/scale.md).
DEFAULT_TIMEOUT = 600.0


class PeerStepFailed(RankFailure):
    """Another rank's part of a collective step failed (it raised its own error);
    ``ranks`` names them (e.g. for :meth:`.directory.ShardedDirectory.mark_failed`)."""

    def __init__(self, message: str, ranks: list[int] | tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)


def agree(comm: Any, ok: bool, step: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Collective: return once every rank of ``comm`` has finished its part of ``step``
    and every part succeeded (this rank's is ``ok``).

    Raises :class:`PeerStepFailed` naming the ranks whose part failed (when this rank's
    own part failed, the caller re-raises its own error instead: pass ``ok=False`` and
    catch), or :class:`~cascade.errors.RankFailure` when some rank has not arrived after
    ``timeout`` seconds (it died without MPI noticing, or hangs). Costs one allgather of
    one byte per rank; polls with short sleeps so a rank waiting here stays responsive
    to MPI progress (other ranks' one-sided operations on its windows).
    """
    size = comm.Get_size()
    mine = np.array([1 if ok else 0], dtype=np.uint8)
    everyone = np.zeros(size, dtype=np.uint8)
    request = comm.Iallgather(mine, everyone)
    deadline = time.monotonic() + timeout
    pause = 1e-5
    while not request.Test():
        if time.monotonic() > deadline:
            raise RankFailure(
                f"{step}: rank {comm.Get_rank()} waited {timeout:.0f} s for the other ranks and "
                f"some never arrived (a rank died or hangs); stop the job (python -m mpi4py "
                "aborts every rank when one fails)")
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)
    failed = [r for r in range(size) if not everyone[r]]
    if failed and ok:
        raise PeerStepFailed(f"{step} failed on rank(s) {failed}: see their error messages", failed)
