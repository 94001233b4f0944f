"""Small MPI helpers shared by the directory and the window slab.

mpi4py is imported only when a distributed component is built; without it the import
error names the ``mpi`` extra. Nothing here touches ``COMM_WORLD``.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import RankFailure

if TYPE_CHECKING:
    from mpi4py import MPI

# A wait on another rank's in-flight update this long means that rank is gone or stuck.
STALL_SECONDS = 60.0


def load_mpi():
    """The ``mpi4py.MPI`` module, or ImportError naming the extra that provides it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "Cascade's distributed parts need mpi4py and an MPI library: "
            "pip install 'cascade-kv[mpi]'") from exc
    return MPI


class RoundTrips:
    """Counts of completed RMA round trips (each ``Flush``/``Flush_local`` = one) per
    window kind, for the scale figures (docs/scale.md). Process-wide, not thread-safe
    (counts may be lost under threads; they are statistics)."""

    counts: dict[str, int] = {}

    @classmethod
    def snapshot(cls) -> dict[str, int]:
        return dict(cls.counts)

    @classmethod
    def since(cls, before: dict[str, int]) -> dict[str, int]:
        """Round trips per window kind since ``before`` (a :meth:`snapshot`)."""
        return {k: v - before.get(k, 0) for k, v in cls.counts.items() if v != before.get(k, 0)}


class CountedWin:
    """An ``MPI.Win`` that counts its flushes (round trips) under ``label`` in
    :class:`RoundTrips`; every other attribute is the window's own."""

    __slots__ = ("win", "label")

    def __init__(self, win: MPI.Win, label: str) -> None:
        self.win = win
        self.label = label
        RoundTrips.counts.setdefault(label, 0)

    def Flush(self, rank: int) -> None:
        RoundTrips.counts[self.label] += 1
        self.win.Flush(rank)

    def Flush_local(self, rank: int) -> None:
        RoundTrips.counts[self.label] += 1
        self.win.Flush_local(rank)

    def __getattr__(self, name: str):
        return getattr(self.win, name)


def get_bytes(win: CountedWin | MPI.Win, byte_type: MPI.Datatype, rank: int, offset: int,
              views: Sequence[memoryview], limit: int, what: str) -> None:
    """Read the bytes at ``offset`` of ``rank``'s window ``win`` into the byte views
    ``views`` back to back: one ``Get`` per view, one ``Flush_local`` (one round trip).
    ``ValueError`` when the read would pass ``limit``, the size of ``what``."""
    end = offset + sum(v.nbytes for v in views)
    if offset < 0 or end > limit:
        raise ValueError(f"read of {end - offset} bytes at {offset} is outside rank {rank}'s "
                         f"{what} of {limit} bytes")
    for view in views:
        if n := view.nbytes:
            win.Get([view, byte_type], rank, (offset, n, byte_type))
            offset += n
    win.Flush_local(rank)


def window_info(MPI) -> MPI.Info:
    """Info hints for Cascade's windows: ``accumulate_ordering=none`` (nothing relies on
    the order of two atomics; every dependent step waits for its ``Flush``).
    ``accumulate_ops=same_op_no_op`` is NOT given: the directory's CTL word takes both
    ``Compare_and_swap`` and ``Accumulate(REPLACE)``. Measured with the PyPI MPICH on 2
    emulated nodes (benchmark/workloads/mpi_micro.py ``busy_target``): no hint set
    (including ``same_op_no_op`` and ``disable_shm_accumulate``) makes inter-node atomics
    complete while the target computes; plain ``Get`` does, with or without hints."""
    info = MPI.Info.Create()
    info.Set("accumulate_ordering", "none")
    return info


def allocate_window(comm: MPI.Comm, nbytes: int, disp_unit: int, *, zero: bool = True,
                    label: str = "window") -> MPI.Win:
    """Collective: a ``Win.Allocate`` window (zeroed unless ``zero=False``) with its
    ``Lock_all`` epoch open, counting its round trips under ``label``.

    Passive-target epochs are opened once here: with MPICH a fresh ``Lock`` waits for
    the target to enter MPI, whereas operations inside ``Lock_all`` + ``Flush`` complete
    while the target computes. The window must use the unified memory model, where
    local stores and RMA see one copy (true for every shared-memory and RDMA device).
    """
    MPI = load_mpi()
    info = window_info(MPI)
    try:
        win = MPI.Win.Allocate(nbytes, disp_unit, info=info, comm=comm)
    finally:
        info.Free()
    if win.Get_attr(MPI.WIN_MODEL) != MPI.WIN_UNIFIED:
        win.Free()
        raise RuntimeError("Cascade needs MPI windows with the unified memory model")
    if zero and nbytes:
        np.frombuffer(win.tomemory(), dtype=np.uint8)[:] = 0
    win.Lock_all()
    win.Sync()
    comm.Barrier()  # nobody touches a window before every rank has zeroed its part
    return CountedWin(win, label)


def free_window(win: MPI.Win) -> None:
    """Collective: close the ``Lock_all`` epoch and free the window."""
    win = getattr(win, "win", win)
    win.Unlock_all()
    win.Free()


class Backoff:
    """Waits between retries of an operation blocked by another rank's in-flight update:
    spin, then yield, then sleep up to 1 ms. Raises :class:`RankFailure` after
    :data:`STALL_SECONDS`, since the other rank must then be dead or stuck."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.tries = 0
        self.start = time.monotonic()

    def wait(self) -> None:
        self.tries += 1
        if self.tries <= 4:
            return
        if time.monotonic() - self.start > STALL_SECONDS:
            raise RankFailure(f"{self.what}: still blocked after {STALL_SECONDS:.0f} s "
                              f"({self.tries} retries); the rank holding it is dead or stuck")
        # the exponent is capped: 2 ** tries overflows a float after ~1000 tries (~1 s)
        time.sleep(0 if self.tries <= 16 else min(1e-3, 1e-6 * 2.0 ** min(self.tries - 16, 10)))
