"""``CascadeStore.get(id, like=...)``: the block comes back as arrays of the example's
kind (numpy, torch CPU here; torch CUDA and cupy in tests/gpu), or a clear error."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from cascade import CascadeStore, Config, buffers
from cascade.errors import InvalidBlock
from cascade.models import BlockSpec
from cascade.testing.device_buffers import HostCudaArray

SHAPE = (2, 2, 16, 16)


@pytest.fixture(params=["shm", "file", "gpu"])
def store(request, tmp_path):
    sizes = {"shm_bytes": 0, "file_bytes": 0, "gpu_bytes": 0, f"{request.param}_bytes": 1 << 20}
    cfg = Config(model="tiny", file_dir=str(tmp_path / "files"), file_segment_bytes=1 << 20, **sizes)
    with CascadeStore(cfg, block_spec=BlockSpec(SHAPE, torch.bfloat16), array_module=np) as s:
        yield s


def _kv():
    g = torch.Generator().manual_seed(5)
    return torch.randn(SHAPE, generator=g).to(torch.bfloat16), torch.randn(SHAPE, generator=g).to(torch.bfloat16)


def test_get_like_a_torch_tensor_returns_torch_tensors_of_the_spec(store):
    key, value = _kv()
    bid = store.put(key, value)
    got_k, got_v = store.get(bid, like=torch.empty(0, dtype=torch.float32))
    assert isinstance(got_k, torch.Tensor) and got_k.dtype == torch.bfloat16 and got_k.shape == SHAPE
    assert got_k.device.type == "cpu"
    assert torch.equal(got_k, key) and torch.equal(got_v, value)


def test_get_like_numpy_or_by_default_returns_numpy_arrays(store):
    key, value = _kv()
    bid = store.put(key, value)
    for like in (None, np.empty(3)):
        got_k, got_v = store.get(bid, like=like)
        assert isinstance(got_k, np.ndarray) and got_k.dtype == buffers.as_dtype(torch.bfloat16)
        assert got_v.tobytes() == buffers.host_bytes(value).tobytes()


def test_get_like_an_unsupported_kind_is_refused_and_holds_nothing(store):
    key, value = _kv()
    bid = store.put(key, value)
    for like in (HostCudaArray(np.zeros(4)), [1, 2], torch.nn.Linear(1, 1)):
        with pytest.raises(InvalidBlock, match="like= takes"):
            store.get(bid, like=like)
    assert store.get(bid, like=key) is not None  # still serving
    assert store.get("ab" * 16, like=key) is None  # a miss stays None
    closing = threading.Thread(target=store.close, daemon=True)
    closing.start()
    closing.join(3)
    assert not closing.is_alive()
