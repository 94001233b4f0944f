"""Small MPI helpers shared by the directory and the window slab.

mpi4py is imported only when a distributed component is built; without it the import
error names the ``mpi`` extra. Nothing here touches ``COMM_WORLD``.
"""
from __future__ import annotations

import time
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


def allocate_window(comm: MPI.Comm, nbytes: int, disp_unit: int, *, zero: bool = True) -> MPI.Win:
    """Collective: a ``Win.Allocate`` window (zeroed unless ``zero=False``) with its
    ``Lock_all`` epoch open.

    Passive-target epochs are opened once here: with MPICH a fresh ``Lock`` waits for
    the target to enter MPI, whereas operations inside ``Lock_all`` + ``Flush`` complete
    while the target computes. The window must use the unified memory model, where
    local stores and RMA see one copy (true for every shared-memory and RDMA device).
    """
    MPI = load_mpi()
    win = MPI.Win.Allocate(nbytes, disp_unit, comm=comm)
    if win.Get_attr(MPI.WIN_MODEL) != MPI.WIN_UNIFIED:
        win.Free()
        raise RuntimeError("Cascade needs MPI windows with the unified memory model")
    if zero and nbytes:
        np.frombuffer(win.tomemory(), dtype=np.uint8)[:] = 0
    win.Lock_all()
    win.Sync()
    comm.Barrier()  # nobody touches a window before every rank has zeroed its part
    return win


def free_window(win: MPI.Win) -> None:
    """Collective: close the ``Lock_all`` epoch and free the window."""
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
        time.sleep(0 if self.tries <= 16 else min(1e-3, 1e-6 * 2 ** (self.tries - 16)))
