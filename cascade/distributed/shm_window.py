"""Every rank's SHM slab as an MPI RMA window, so ranks on other nodes can read it.

Ranks on one node read a peer's slab straight from its ``/dev/shm`` file (one memcpy,
no MPI). A rank on another node cannot see that file, so each rank also exposes its slab
mapping with ``Win.Create`` (no copy: the window *is* the mmap'd slab) and remote readers
fetch a block with one ``Get`` per output buffer and one ``Flush_local``. Gets on these
windows complete while the target computes (measured: benchmark/workloads/mpi_micro.py
``busy_target``), unlike atomics, which is why the read path takes no pin.

Collective: the constructor and :meth:`free`. Reads are local and one-sided; not
thread-safe.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..buffers import as_byte_view
from .rma import CountedWin, get_bytes, load_mpi, window_info

if TYPE_CHECKING:
    from mpi4py import MPI


class SlabWindow:
    """Exposes ``buffer`` (this rank's SHM slab mapping, or None when it has no SHM tier)
    to every rank of ``comm``."""

    def __init__(self, comm: MPI.Comm, buffer: Any | None) -> None:
        MPI = self._MPI = load_mpi()
        self._BYTE = MPI.BYTE
        memory = buffer if buffer is not None and len(buffer) else MPI.BOTTOM
        nbytes = len(buffer) if memory is not MPI.BOTTOM else 0
        self.sizes: list[int] = comm.allgather(nbytes)
        info = window_info(MPI)
        try:
            win = MPI.Win.Create(memory, 1, info=info, comm=comm)
        finally:
            info.Free()
        win.Lock_all()  # once: a fresh Lock per read would wait for the target (MPICH)
        self._win: CountedWin | None = CountedWin(win, "shm_window")

    def get_into(self, rank: int, offset: int, outs: Sequence[Any]) -> None:
        """Copy ``sum(len(out))`` bytes at ``offset`` of ``rank``'s slab into ``outs``
        back to back: one ``Get`` per buffer, one round trip in all."""
        views = [as_byte_view(out, "output buffer", writable=True) for out in outs]
        get_bytes(self._win, self._BYTE, rank, offset, views, self.sizes[rank], "SHM window")

    def free(self) -> None:
        """Collective: close the epoch and free the window (not the slab). Idempotent."""
        if self._win is not None:
            self._win.Unlock_all()
            self._win.win.Free()
            self._win = None
