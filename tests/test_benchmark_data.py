"""The shared benchmark data directory: deterministic from its seed, and an index that
matches the bytes (ids are BLAKE3 content ids)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from benchmark import data
from cascade import block_id

SIZE = 64 << 10  # 256 tokens of the tiny model


def _gen(path, blocks: int, seed: int = 7, sizes=(SIZE,)):
    return data.generate(path, model="tiny", block_bytes=list(sizes), blocks=blocks, seed=seed,
                         file_bytes=1 << 20, progress=False)


def test_generation_is_deterministic_and_prefix_stable(tmp_path) -> None:
    a, b, c = _gen(tmp_path / "a", 20), _gen(tmp_path / "b", 20), _gen(tmp_path / "c", 6)
    ia, ib, ic = (json.loads((d / data.INDEX).read_text()) for d in (a, b, c))
    assert ia == ib
    assert ia["sets"][str(SIZE)]["ids"][:6] == ic["sets"][str(SIZE)]["ids"]
    for name in ia["sets"][str(SIZE)]["files"]:
        assert (a / name).read_bytes() == (b / name).read_bytes()
    other = json.loads((_gen(tmp_path / "d", 6, seed=8) / data.INDEX).read_text())
    assert not set(other["blocks"]) & set(ic["blocks"])


def test_index_maps_ids_to_the_bytes(tmp_path) -> None:
    out = _gen(tmp_path, 20, sizes=(SIZE, 2 * SIZE))
    index = json.loads((out / data.INDEX).read_text())
    meta = index["sets"][str(SIZE)]
    assert meta["blocks"] == 20 and meta["key_shape"] == [2, 2, 256, 16] and meta["block_tokens"] == 256
    assert len(meta["files"]) > 1  # rolled at --file-bytes: a few aggregated files, not one per block
    assert len(index["blocks"]) == 40
    with data.BlockData(out) as d:
        assert d.sizes == [SIZE, 2 * SIZE]
        blocks = d.blocks(SIZE)
        for b in blocks:
            entry = index["blocks"][b.id]
            assert entry["offset"] % data.PAGE == 0 and entry["key_bytes"] == entry["value_bytes"] == SIZE // 2
            assert block_id(b.key, b.value) == b.id
            assert not b.key.flags.writeable
        key, value = data.make_block(7, SIZE, 3, tuple(meta["key_shape"]))
        assert np.array_equal(blocks[3].key.view(np.float16).reshape(key.shape), key)
        with pytest.raises(ValueError, match="holds 20 blocks"):
            d.blocks(SIZE, 30)
    assert data.verify(out, progress=False)["blocks"] == 40


def test_verify_catches_a_flipped_byte(tmp_path) -> None:
    out = _gen(tmp_path, 4)
    name = json.loads((out / data.INDEX).read_text())["sets"][str(SIZE)]["files"][0]
    raw = bytearray((out / name).read_bytes())
    raw[100] ^= 1
    (out / name).write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="does not match its id"):
        data.verify(out, progress=False)


def test_ensure_extends_and_keeps(tmp_path) -> None:
    out = _gen(tmp_path, 4)
    first = json.loads((out / data.INDEX).read_text())["sets"][str(SIZE)]["ids"]
    data.ensure(out, [SIZE], 4, seed=7)  # enough already: untouched
    assert json.loads((out / data.INDEX).read_text())["sets"][str(SIZE)]["ids"] == first
    data.ensure(out, [SIZE], 9, seed=7)  # keeps the directory's model (tiny), extends
    index = json.loads((out / data.INDEX).read_text())
    assert index["model"] == "tiny" and index["sets"][str(SIZE)]["ids"][:4] == first
    assert index["sets"][str(SIZE)]["blocks"] == 9


def test_block_size_must_be_whole_tokens() -> None:
    with pytest.raises(ValueError, match="whole number"):
        data.block_shape("llama3-8b", 3 << 20 | 1)
    assert data.block_shape("llama3-8b", 2 << 20) == ((32, 8, 16, 128), 16)
