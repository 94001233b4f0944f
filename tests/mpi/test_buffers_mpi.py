"""Engine tensors across ranks: torch bfloat16 blocks another rank put, read into torch
tensors (and into device-interface buffers) through the cluster read path of each tier.

Same bodies at 1 rank and at N ranks (at one rank every read is local)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cascade import CascadeStore, Config, buffers
from cascade.models import BlockSpec
from cascade.testing.device_buffers import HostCudaArray, HostMemoryCopier

SHAPE = (2, 2, 16, 16)


def _tensor(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (int(np.prod(SHAPE)) * 2,), dtype=torch.uint8, generator=g).view(
        torch.bfloat16).reshape(SHAPE)


def _bytes(obj) -> bytes:
    return buffers.host_bytes(obj).tobytes()


# each config puts every block in one tier: SHM (same-node maps or the SHM window), REMOTE
# (another rank's window), file (shared records)
TIER_SIZES = {"shm": dict(shm_bytes=64 * 4096, remote_bytes=0, file_bytes=0),
              "remote": dict(shm_bytes=0, remote_bytes=64 * 4096, file_bytes=0),
              "file": dict(shm_bytes=0, remote_bytes=0, file_bytes=256 * 8192)}


@pytest.mark.parametrize("tier", sorted(TIER_SIZES))
def test_other_ranks_torch_blocks_read_into_torch_and_device_outputs(tier, comm, shared_dir, everywhere):
    if tier == "remote" and comm.size < 2:
        pytest.skip("the REMOTE tier needs 2 ranks")
    cfg = Config(model="tiny", file_dir=shared_dir, directory_slots=1 << 12, **TIER_SIZES[tier])
    store = CascadeStore(cfg, comm=comm, block_spec=BlockSpec(SHAPE, torch.bfloat16))
    try:
        seeds = [1000 * comm.rank + i for i in range(4)]
        mine = [store.put(_tensor(2 * s), _tensor(2 * s + 1)) for s in seeds]
        comm.Barrier()
        wrong = 0
        with buffers.use_device_copier(HostMemoryCopier()):
            for ids, rank_seeds in zip(comm.allgather(mine), comm.allgather(seeds)):
                for bid, s in zip(ids, rank_seeds):
                    k_out, v_out = torch.empty(SHAPE, dtype=torch.bfloat16), torch.empty(SHAPE, dtype=torch.bfloat16)
                    hit = store.get_into(bid, k_out, v_out)
                    wrong += not hit or _bytes(k_out) != _bytes(_tensor(2 * s)) or _bytes(v_out) != _bytes(_tensor(2 * s + 1))
                    dev = np.zeros(SHAPE, np.uint16)  # bfloat16 bits behind __cuda_array_interface__
                    hit = store.get_into(bid, HostCudaArray(dev.view("bfloat16")),
                                         HostCudaArray(np.zeros(SHAPE, np.uint16).view("bfloat16")))
                    wrong += not hit or dev.tobytes() != _bytes(_tensor(2 * s))
        assert everywhere(wrong == 0)
        assert everywhere(store.stats()["blocks"] == len(mine))  # the reads copied nothing in
    finally:
        store.close()
