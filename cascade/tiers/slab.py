"""First-fit allocator of byte ranges inside one fixed slab (GPU, SHM, REMOTE tiers).

Pure bookkeeping: it hands out ``(offset, length)`` ranges and coalesces freed ones. Costs
O(log n) to free and O(n) worst case to allocate (first fit over the free list, which stays
short when blocks are of one size, the common case). Not thread-safe.

:class:`SlabAllocator` is the compiled one (``cascade/tiers/_firstfit.c``: an allocation
runs per put) where it was built, else :class:`PythonSlabAllocator`, which gives the same
ranges.
"""
from __future__ import annotations

import bisect

from ..errors import TierFull

try:
    from ._firstfit import FirstFit
except ImportError:  # not built: the Python allocator below runs
    FirstFit = None

ALIGN = 64  # cache-line alignment of every range: keeps copies on the fast path


def _round_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


class PythonSlabAllocator:
    """Allocate aligned ranges from ``[0, size)``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._starts: list[int] = [0] if size > 0 else []  # sorted free-range starts
        self._lengths: dict[int, int] = {0: size} if size > 0 else {}
        self.allocated = 0  # bytes handed out, after alignment padding

    def alloc(self, nbytes: int) -> int:
        """Offset of a fresh range of at least ``nbytes``; :class:`TierFull` if none is free."""
        need = (nbytes + ALIGN - 1) // ALIGN * ALIGN if nbytes > 0 else ALIGN  # footprint(), inlined: per put
        starts, lengths = self._starts, self._lengths
        i = 0
        for start in starts:
            length = lengths[start]
            if length >= need:
                break
            i += 1
        else:
            raise TierFull(f"no free range of {nbytes} bytes in a slab of {self.size} "
                           f"({self.size - self.allocated} free, fragmented)")
        del lengths[start]
        if length == need:
            del starts[i]
        else:
            starts[i] = start + need
            lengths[start + need] = length - need
        self.allocated += need
        return start

    def free(self, offset: int, nbytes: int) -> None:
        """Return the range at ``offset`` (``nbytes`` as passed to :meth:`alloc`)."""
        length = _round_up(max(nbytes, 1))
        self.allocated -= length
        i = bisect.bisect_left(self._starts, offset)
        # merge with the following free range
        if i < len(self._starts) and self._starts[i] == offset + length:
            length += self._lengths.pop(self._starts[i])
            del self._starts[i]
        # merge with the preceding free range
        if i > 0 and self._starts[i - 1] + self._lengths[self._starts[i - 1]] == offset:
            self._lengths[self._starts[i - 1]] += length
            return
        self._starts.insert(i, offset)
        self._lengths[offset] = length

    def can_fit(self, nbytes: int) -> bool:
        need = _round_up(max(nbytes, 1))
        return any(length >= need for length in self._lengths.values())

    def free_ranges(self) -> list[tuple[int, int]]:
        """The free ``(start, length)`` ranges, by start."""
        return [(start, self._lengths[start]) for start in self._starts]

    @staticmethod
    def footprint(nbytes: int) -> int:
        """Bytes a range of ``nbytes`` really takes (alignment included)."""
        return _round_up(max(nbytes, 1))


if FirstFit is None:
    SlabAllocator = PythonSlabAllocator
else:
    class SlabAllocator(FirstFit):  # type: ignore[no-redef]
        """Allocate aligned ranges from ``[0, size)``: :class:`PythonSlabAllocator`'s
        methods, compiled."""

        __slots__ = ()

        def __init__(self, size: int) -> None:
            super().__init__(size, TierFull)

        footprint = staticmethod(PythonSlabAllocator.footprint)
