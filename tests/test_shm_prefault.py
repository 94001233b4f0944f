"""``shm_prefault``: the SHM slab backed and mapped at open, so puts never take a page
fault; a /dev/shm too small for it falls back to backing the slab as puts need it."""
from __future__ import annotations

import logging

import numpy as np

from cascade.config import Config
from cascade.models import BlockSpec
from cascade.store import CascadeStore
from test_faults import root_only, small_tmpfs

SPEC = BlockSpec.flat(64 << 10)


def _put_and_read(store: CascadeStore, n: int) -> int:
    """Put ``n`` distinct blocks, read each back; the number that came back exact."""
    rng = np.random.default_rng(0)
    blocks = {}
    for i in range(n):
        k, v = (rng.integers(0, 256, SPEC.half_bytes, dtype=np.uint8) for _ in range(2))
        blocks[store.put(k, v, block_id=f"{i:032x}")] = (k, v)
    return sum(1 for bid, (k, v) in blocks.items()
               if (got := store.get(bid)) is not None and np.array_equal(got[0], k) and np.array_equal(got[1], v))


def test_a_prefaulted_slab_is_backed_whole_at_open_and_stores_exact_bytes(tmp_path):
    cfg = Config(shm_bytes=8 << 20, file_bytes=0, shm_dir=str(tmp_path / "shm"), shm_prefault=True)
    with CascadeStore(cfg, block_spec=SPEC) as store:
        assert store.stats()["tiers"]["shm"]["backed_bytes"] == 8 << 20
        assert _put_and_read(store, 16) == 16


def test_without_prefault_the_slab_is_backed_only_as_puts_need_it(tmp_path):
    cfg = Config(shm_bytes=64 << 20, file_bytes=0, shm_dir=str(tmp_path / "shm"))
    with CascadeStore(cfg, block_spec=SPEC) as store:
        assert store.stats()["tiers"]["shm"]["backed_bytes"] == 0
        assert _put_and_read(store, 4) == 4
        assert 0 < store.stats()["tiers"]["shm"]["backed_bytes"] < 64 << 20


@root_only
def test_prefault_on_a_too_small_dev_shm_warns_and_backs_lazily(tmp_path, caplog):
    with small_tmpfs(tmp_path / "fs", "2m") as fs:
        cfg = Config(shm_bytes=8 << 20, file_bytes=0, shm_dir=str(fs / "shm"), shm_prefault=True)
        with caplog.at_level(logging.WARNING, logger="cascade.tiers.shm"):
            with CascadeStore(cfg, block_spec=SPEC) as store:
                assert store.stats()["tiers"]["shm"]["backed_bytes"] == 0
                assert _put_and_read(store, 8) == 8  # 1 MiB of blocks: fits in the 2 MiB file system
        assert any("cannot prefault" in r.getMessage() for r in caplog.records)
