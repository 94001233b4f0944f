"""The slab tiers' first-fit allocator: the compiled one (``cascade/tiers/_firstfit.c``)
and the Python one give the same ranges, keep their free list sorted and coalesced, and
refuse what does not fit with TierFull."""
from __future__ import annotations

import random

import pytest

from cascade.errors import TierFull
from cascade.tiers import slab
from cascade.tiers.slab import ALIGN, PythonSlabAllocator, SlabAllocator

ALLOCATORS = [PythonSlabAllocator, SlabAllocator]


def test_the_compiled_allocator_is_built() -> None:
    assert slab.FirstFit is not None, "cascade.tiers._firstfit was not built (make install builds it)"
    assert SlabAllocator is not PythonSlabAllocator


@pytest.mark.parametrize("make", ALLOCATORS)
def test_first_fit_takes_the_lowest_range_and_aligns(make) -> None:
    alloc = make(1 << 20)
    assert [alloc.alloc(100), alloc.alloc(64), alloc.alloc(0), alloc.alloc(65)] == [0, 128, 192, 256]
    assert alloc.allocated == 128 + 64 + 64 + 128
    alloc.free(128, 64)
    assert alloc.alloc(10) == 128  # the hole, first
    assert alloc.alloc(100) == 384  # too big for any hole: after the last range
    assert alloc.can_fit((1 << 20) - 512) and not alloc.can_fit((1 << 20) - 511)


@pytest.mark.parametrize("make", ALLOCATORS)
def test_free_merges_with_both_neighbours(make) -> None:
    alloc = make(4096)
    a, b, c = (alloc.alloc(1024) for _ in range(3))
    alloc.free(a, 1024)
    alloc.free(c, 1024)
    assert alloc.free_ranges() == [(0, 1024), (2048, 2048)]
    alloc.free(b, 1024)
    assert alloc.free_ranges() == [(0, 4096)] and alloc.allocated == 0
    assert alloc.alloc(4096) == 0


@pytest.mark.parametrize("make", ALLOCATORS)
def test_a_full_slab_raises_tier_full_and_keeps_its_state(make) -> None:
    alloc = make(4096)
    kept = alloc.alloc(3000)
    with pytest.raises(TierFull, match="no free range of 2000 bytes in a slab of 4096"):
        alloc.alloc(2000)
    assert alloc.allocated == 3008 and alloc.free_ranges() == [(3008, 1088)]
    alloc.free(kept, 3000)
    assert alloc.alloc(4096) == 0
    with pytest.raises(TierFull):
        make(0).alloc(1)


@pytest.mark.parametrize("seed", range(4))
def test_both_allocators_give_the_same_ranges(seed: int) -> None:
    """Random allocations and frees of mixed sizes: the same offsets, errors and free
    lists from both, every free list sorted, coalesced and adding up with what is held."""
    rng = random.Random(seed)
    size = 256 << 10
    python, compiled = PythonSlabAllocator(size), SlabAllocator(size)
    held: list[tuple[int, int]] = []
    for _ in range(4000):
        if held and (rng.random() < 0.45 or len(held) > 200):
            offset, nbytes = held.pop(rng.randrange(len(held)))
            python.free(offset, nbytes)
            compiled.free(offset, nbytes)
        else:
            nbytes = rng.choice([1, 64, 100, 4096, 4097, 8 << 10, rng.randrange(1, 20 << 10)])
            outcomes = []
            for alloc in (python, compiled):
                try:
                    outcomes.append(alloc.alloc(nbytes))
                except TierFull:
                    outcomes.append(None)
            assert outcomes[0] == outcomes[1]
            if outcomes[0] is not None:
                held.append((outcomes[0], nbytes))
        ranges = compiled.free_ranges()
        assert ranges == python.free_ranges() and compiled.allocated == python.allocated
        assert all(start % ALIGN == 0 and length > 0 for start, length in ranges)
        assert all(s1 + l1 < s2 for (s1, l1), (s2, _) in zip(ranges, ranges[1:]))  # sorted, none touching
        assert sum(length for _, length in ranges) + compiled.allocated == size
        spans = sorted((o, o + SlabAllocator.footprint(n)) for o, n in held)
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # held ranges disjoint
