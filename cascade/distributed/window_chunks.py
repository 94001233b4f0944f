"""The DRAM windows behind the REMOTE tier, and one-sided leasing of their space.

Every rank exposes ``nbytes`` (rounded down to whole chunks) as a data window, plus a
lease bitmap window with one bit per chunk. A rank that wants room on rank ``t`` reads
``t``'s bitmap (one ``Get``) and sets the bits of a free run of chunks with one
``Compare_and_swap``; inside its lease it then sub-allocates locally (``SlabAllocator``)
with no communication at all until the lease empties and its bits are cleared again (one
``Accumulate``). A put therefore costs one ``Put`` + ``Flush`` (plus 2 round trips when it
needs a new lease) and a read one ``Get`` + ``Flush``, straight between the caller's
buffer and the window.

Chosen over partitioning each window among writers (every writer would get 1/(P-1) of each
window and idle writers would strand their share) and over a shared allocator inside each
window (round trips and cross-rank fragmentation on every put). Leases are whole chunks, so
a block larger than 64 chunks (one bitmap word) is refused; pick ``chunk_bytes`` above the
largest block (the default 16 MiB holds three 5 MiB LLaMA-70B blocks).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .rma import Backoff, allocate_window, free_window, get_bytes, load_mpi

if TYPE_CHECKING:
    from mpi4py import MPI

CHUNK_BYTES = 16 << 20
WORD_BITS = 64


def find_run(word: int, nbits: int, run: int) -> int | None:
    """Lowest start of ``run`` consecutive clear bits among bits ``[0, nbits)`` of ``word``."""
    mask = (1 << run) - 1
    for start in range(nbits - run + 1):
        if not word >> start & mask:
            return start
    return None


def run_mask(start: int, run: int) -> int:
    """Bits ``[start, start + run)`` set."""
    return ((1 << run) - 1) << start


def chunks_needed(nbytes: int, chunk_bytes: int) -> int:
    return max(1, -(-nbytes // chunk_bytes))


def node_ids(comm: MPI.Comm) -> list[int]:
    """Collective: for every rank of ``comm``, the lowest rank sharing its node."""
    MPI = load_mpi()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        leader = node.allreduce(comm.Get_rank(), op=MPI.MIN)
    finally:
        node.Free()
    return comm.allgather(leader)


class WindowChunks:
    """One data window and one lease bitmap per rank of ``comm``. Collective: the
    constructor and :meth:`free`; everything else is local and one-sided. Not thread-safe."""

    def __init__(self, comm: MPI.Comm, nbytes: int, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        if chunk_bytes <= 0 or nbytes < 0:
            raise ValueError(f"need chunk_bytes > 0 and nbytes >= 0, got {chunk_bytes}, {nbytes}")
        self._MPI = MPI = load_mpi()
        self.rank = comm.Get_rank()
        self.chunk_bytes = chunk_bytes
        if comm.allreduce(chunk_bytes, op=MPI.MAX) != comm.allreduce(chunk_bytes, op=MPI.MIN):
            raise ValueError("every rank must pass the same chunk_bytes")
        self.chunks: list[int] = comm.allgather(nbytes // chunk_bytes)  # per rank
        self._sizes = [c * chunk_bytes for c in self.chunks]
        self._BYTE = MPI.BYTE
        self.nodes = node_ids(comm)
        mine = self.chunks[self.rank]
        self._data: MPI.Win | None = allocate_window(comm, mine * chunk_bytes, 1, zero=False,
                                                              label="remote_data")
        self._bitmap: MPI.Win | None = allocate_window(comm, 8 * -(-mine // WORD_BITS), 8,
                                                                label="remote_lease")
        self._origin = np.zeros(1, dtype=np.uint64)
        self._compare = np.zeros(1, dtype=np.uint64)
        self._result = np.zeros(1, dtype=np.uint64)

    def window_bytes(self, rank: int) -> int:
        return self._sizes[rank]

    # -- leases ------------------------------------------------------------------------
    def bitmaps(self, targets: Sequence[int]) -> dict[int, list[int]]:
        """The lease bitmap words of ``targets``, all read in one overlapped round trip."""
        got = {}
        for t in targets:
            words = np.zeros(-(-self.chunks[t] // WORD_BITS), dtype=np.uint64)
            if words.size:
                self._bitmap.Get(words, t, 0)
            got[t] = words
        for t in targets:
            self._bitmap.Flush_local(t)
        return {t: words.tolist() for t, words in got.items()}

    def lease(self, target: int, run: int, words: list[int] | None = None) -> int | None:
        """Lease ``run`` consecutive chunks of ``target``'s window; their first chunk index,
        or None when ``target`` has no such run free. ``words``: a fresh :meth:`bitmaps`
        reading to save its round trip. One-sided: 1-2 round trips per attempt."""
        if run > WORD_BITS:
            return None
        if words is None:
            words = self.bitmaps([target])[target]
        backoff = Backoff(f"lease on rank {target}")
        for w, word in enumerate(words):
            nbits = min(WORD_BITS, self.chunks[target] - w * WORD_BITS)
            while (start := find_run(word, nbits, run)) is not None:
                self._origin[0], self._compare[0] = word | run_mask(start, run), word
                self._bitmap.Compare_and_swap(self._origin, self._compare, self._result, target, w)
                self._bitmap.Flush(target)
                if int(self._result[0]) == word:
                    return w * WORD_BITS + start
                word = int(self._result[0])  # another rank leased meanwhile: look again
                backoff.wait()
        return None

    def unlease(self, target: int, first: int, run: int) -> None:
        """Give chunks back (the bits are ours, so one atomic AND clears them)."""
        w, start = divmod(first, WORD_BITS)
        self._origin[0] = ~run_mask(start, run) & (1 << WORD_BITS) - 1
        self._bitmap.Accumulate(self._origin, target, w, self._MPI.BAND)
        self._bitmap.Flush(target)

    # -- bytes -------------------------------------------------------------------------
    def put(self, target: int, offset: int, views: Sequence[memoryview]) -> None:
        """Write the byte views back to back at ``offset`` of ``target``'s window, then
        Flush (the bytes are visible to every rank on return)."""
        BYTE = self._BYTE
        for view in views:
            if view.nbytes:
                self._data.Put([view, BYTE], target, (offset, view.nbytes, BYTE))
            offset += view.nbytes
        self._data.Flush(target)

    def get_into(self, target: int, offset: int, outs: Sequence[memoryview]) -> None:
        """Read the bytes at ``offset`` of ``target``'s window into the byte views
        ``outs`` back to back (one round trip). :class:`ValueError` for a rank outside
        the communicator."""
        if not 0 <= target < len(self._sizes):
            raise ValueError(f"no rank {target} in a window of {len(self._sizes)} ranks")
        get_bytes(self._data, self._BYTE, target, offset, outs, self._sizes[target], "window")

    def free(self) -> None:
        """Collective: release both windows. Idempotent."""
        for name in ("_data", "_bitmap"):
            win = getattr(self, name)
            if win is not None:
                free_window(win)
                setattr(self, name, None)
