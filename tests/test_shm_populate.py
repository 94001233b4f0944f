"""The SHM tier maps each backing step's pages when it backs it (MADV_POPULATE_WRITE),
so that puts do not fault them in one by one; without it, puts still work."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from cascade.tiers.shm import _BACKING_STEP, ShmTier

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps, madvise: Linux")


def _rss_of(path: str) -> int:
    """Resident bytes of this process's mapping of ``path`` (/proc/self/smaps)."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(path):
            for entry in lines[i + 1:]:
                if entry.startswith("Rss:"):
                    return int(entry.split()[1]) * 1024
    raise AssertionError(f"{path} is not mapped")


def _put_one(tier: ShmTier) -> None:
    part = np.arange(2048, dtype=np.uint8)
    assert tier.store_hot(("default", "0" * 32), [part, part], 4096)


def test_backing_a_step_maps_its_pages(tmp_path):
    tier = ShmTier(4 * _BACKING_STEP, str(tmp_path))
    try:
        _put_one(tier)
        if not tier._can_populate:
            pytest.skip("this kernel has no MADV_POPULATE_WRITE")
        assert _rss_of(tier.path) >= _BACKING_STEP  # the whole first step, not the one page written
    finally:
        tier.close()


class _NoPopulate:
    """A mapping whose madvise fails as on a kernel without MADV_POPULATE_WRITE."""

    def __init__(self, mapping) -> None:
        self._mapping = mapping

    def madvise(self, *args) -> None:
        raise OSError(22, "Invalid argument")

    def __getattr__(self, name):
        return getattr(self._mapping, name)


def test_without_populate_puts_fault_pages_in_as_before(tmp_path):
    tier = ShmTier(4 * _BACKING_STEP, str(tmp_path))
    real = tier._mmap
    try:
        tier._mmap = _NoPopulate(real)
        _put_one(tier)
        assert not tier._can_populate
        out = [np.empty(2048, np.uint8), np.empty(2048, np.uint8)]
        assert tier.read_hot(("default", "0" * 32), out)
        assert np.array_equal(out[0], np.arange(2048, dtype=np.uint8))
    finally:
        tier._mmap = real
        tier.close()
