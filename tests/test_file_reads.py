"""File-tier read paths: per-file-system mode choice, chunked parallel reads, verification."""
from __future__ import annotations

import os

import numpy as np
import pytest

from cascade import CascadeStore, Config, ConfigError, CorruptBlock
from cascade.tiers import record_io
from cascade.tiers.file_tier import FileTier
from cascade.tiers.records import HEADER_BYTES

SIZE = max(5 * record_io.CHUNK, record_io.PARALLEL_MIN) + 4096  # chunked: several chunks, a short last one


def _aligned(nbytes: int) -> np.ndarray:
    import mmap

    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8)


@pytest.mark.parametrize("mode", ["auto", "buffered", "direct"])
def test_big_records_read_back_exactly_in_every_mode(tmp_path, mode):
    tier = FileTier(64 << 20, str(tmp_path / "f"), read_mode=mode, segment_bytes=1 << 30)
    expected = {"auto": "direct" if tier.on_lustre else "buffered", "buffered": "buffered", "direct": "direct"}
    assert tier.read_mode == expected[mode]
    rng = np.random.default_rng(0)
    blocks = {("ns", f"{i:032x}"): rng.integers(0, 255, SIZE, dtype=np.uint8) for i in range(3)}
    for key, data in blocks.items():
        tier.put(key, [data[:SIZE // 2], data[SIZE // 2:]])
    tier.sync()
    for key, data in blocks.items():
        for out in (np.empty(SIZE, np.uint8), _aligned(SIZE)):  # unaligned (bounced) and aligned outputs
            tier.read_parts_into(key, [out])
            assert np.array_equal(out, data)
    tier.close()


@pytest.mark.parametrize("mode", ["buffered", "direct"])
def test_a_flipped_byte_in_a_middle_chunk_is_caught(tmp_path, mode):
    tier = FileTier(64 << 20, str(tmp_path / "f"), read_mode=mode, segment_bytes=1 << 30)
    key = ("ns", "ab" * 16)
    tier.put(key, [np.full(SIZE, 7, np.uint8)])
    tier.sync()
    path = tier._files[tier._index[key].file_id].path
    with open(path, "r+b") as f:  # a byte in the third chunk of the payload
        f.seek(HEADER_BYTES + 2 * record_io.CHUNK + 123)  # inside the third chunk
        f.write(b"\x08")
    os.posix_fadvise(tier._files[tier._index[key].file_id].fd, 0, 0, os.POSIX_FADV_DONTNEED)
    with pytest.raises(CorruptBlock):
        tier.read_parts_into(key, [_aligned(SIZE)])
    assert key not in tier and tier.counters["corrupt_reads"] == 1
    tier.close()


def test_read_mode_is_a_config_key(tmp_path):
    with pytest.raises(ConfigError, match="file_read_mode"):
        Config(file_read_mode="fast")
    cfg = Config(model="tiny", shm_bytes=0, file_dir=str(tmp_path / "f"), file_read_mode="buffered")
    with CascadeStore(cfg) as store:
        assert store.stats()["tiers"]["file"]["read_mode"] == "buffered"
