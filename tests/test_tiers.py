"""The tier contract, run against GPU (numpy array module), SHM and LUSTRE (file) tiers."""
from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from cascade.testing.tier_contract import TierContract
from cascade.tiers.file_tier import FileTier
from cascade.tiers.gpu import GpuTier, cupy_module
from cascade.tiers.shm import ShmTier


class TestGpuTierNumpy(TierContract):
    def make_tier(self, capacity):
        return GpuTier(capacity, np)


class TestShmTier(TierContract):
    def make_tier(self, capacity):
        return ShmTier(capacity)


class TestShmTierVerified(TierContract):
    def make_tier(self, capacity):
        return ShmTier(capacity, verify=True)


class TestFileTier(TierContract):
    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path):
        self.dir = str(tmp_path / "agg")

    def make_tier(self, capacity):
        return FileTier(capacity, self.dir, segment_bytes=1 << 20)


class TestFileTierBuffered(TestFileTier):
    def make_tier(self, capacity):
        return FileTier(capacity, self.dir, segment_bytes=1 << 20, odirect=False)


@pytest.mark.gpu
@pytest.mark.skipif(cupy_module() is None, reason="no usable GPU (cupy.is_available() is false)")
class TestGpuTierCupy(TierContract):
    def make_tier(self, capacity):
        import cupy

        return GpuTier(capacity, cupy)


def test_shm_slab_is_private_and_removed_on_close():
    tier = ShmTier(1 << 20)
    mode = stat.S_IMODE(os.stat(tier.path).st_mode)
    assert mode == 0o600
    assert len(os.path.basename(tier.path).split("-")[-1]) == 32  # 128 random bits
    tier.close()
    assert not os.path.exists(tier.path)


def test_file_tier_directory_is_private(tmp_path):
    tier = FileTier(1 << 20, str(tmp_path / "d"))
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o700
    tier.put(("ns", "0" * 32), [b"abc"])
    names = sorted(os.listdir(tmp_path / "d"))
    assert "agg_rank000_000001.bin" in names
    tier.close()


def test_file_tier_second_writer_of_same_rank_is_refused(tmp_path):
    from cascade.errors import CascadeError

    first = FileTier(1 << 20, str(tmp_path / "d"))
    with pytest.raises(CascadeError, match="held by another process"):
        FileTier(1 << 20, str(tmp_path / "d"))
    first.close()


def test_file_tier_rolls_segments_and_compacts(tmp_path):
    tier = FileTier(64 << 20, str(tmp_path / "d"), segment_bytes=1 << 20, compact_dead_fraction=0.5)
    keys = [("ns", f"{i:032x}") for i in range(40)]
    for k in keys:
        tier.put(k, [bytes(100_000)])
    assert tier.stats()["files"] > 1
    for k in keys[:30]:
        del tier[k]
    assert tier.stats()["compactions"] >= 1
    tier.close()
    reopened = FileTier(64 << 20, str(tmp_path / "d"), segment_bytes=1 << 20)
    assert set(reopened) == set(keys[30:])
    for k in keys[30:]:
        assert reopened[k] == bytes(100_000)
    reopened.close()
