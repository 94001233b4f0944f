"""Shared fixtures: small configs in per-test temp directories."""
from __future__ import annotations

import pytest

from cascade import Config


@pytest.fixture
def tiny_config(tmp_path) -> Config:
    """A store config with the tiny model (4 KiB blocks), 64 blocks of SHM, 256 of file."""
    return Config(model="tiny", shm_bytes=64 * 4096, file_bytes=256 * 8192,
                  file_dir=str(tmp_path / "files"), file_segment_bytes=1 << 20)
