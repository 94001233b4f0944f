"""The ``pytest -m gpu`` suite (issue 24 item 4): every tier x every array kind (numpy,
torch CPU, torch CUDA, cupy) as input x as output, bfloat16 blocks, batches on one
stream, ``get(like=...)``, the pinned arena and the registered SHM slab, on a real GPU
through :class:`~cascade.buffers.CupyCopier`. Each case is skipped with its reason where
cupy, a GPU or a CUDA build of torch is missing (the build machines have none)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cascade import CascadeStore, Config, buffers
from cascade.models import BlockSpec

pytestmark = pytest.mark.gpu
SHAPE = (2, 4, 16, 64)  # 16 KiB per half
TIERS = ["gpu", "shm", "file"]
KINDS = ["numpy", "torch_cpu", "torch_cuda", "cupy"]


def _cupy():
    try:
        import cupy
    except ImportError:
        pytest.skip("cupy is not installed (pip install 'cascade-kv[gpu]')")
    try:
        if cupy.is_available():
            return cupy
    except Exception as exc:  # broken driver installs raise here
        pytest.skip(f"cupy.is_available() failed: {exc}")
    pytest.skip("cupy sees no usable GPU")


def _need(kind: str):
    cupy = _cupy()
    if kind == "torch_cuda" and not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} has no CUDA (a CPU build, or no driver)")
    return cupy


def _make(kind: str, a: np.ndarray):
    """``a`` (float16, or bfloat16 for the torch kinds) as an array of ``kind``."""
    if kind == "numpy":
        return a.copy()
    if kind in ("torch_cpu", "torch_cuda"):
        t = torch.from_numpy(a.view(np.uint16).copy()).view(getattr(torch, a.dtype.name))
        return t.cuda() if kind == "torch_cuda" else t
    import cupy

    return cupy.asarray(a)


def _empty(kind: str, dtype: str = "float16"):
    if kind == "numpy":
        return np.empty(SHAPE, buffers.as_dtype(dtype))
    if kind in ("torch_cpu", "torch_cuda"):
        return torch.empty(SHAPE, dtype=getattr(torch, dtype), device="cuda" if kind == "torch_cuda" else "cpu")
    import cupy

    return cupy.empty(SHAPE, dtype)


def _host(obj) -> bytes:
    """What a buffer holds, read back independently of cascade.buffers."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu().view(torch.uint8).numpy().tobytes()
    return (obj.get() if hasattr(obj, "get") else np.asarray(obj)).tobytes()


def _store(tier: str, tmp_path, nbytes: int = 8 << 20, dtype: str = "float16", **extra) -> CascadeStore:
    sizes = {"shm_bytes": 0, "file_bytes": 0, "gpu_bytes": 0, f"{tier}_bytes": nbytes, **extra}
    cfg = Config(model="tiny", file_dir=str(tmp_path / "files"), file_segment_bytes=4 << 20, **sizes)
    return CascadeStore(cfg, block_spec=BlockSpec(SHAPE, dtype))


def _kv(seed: int, dtype: str = "float16") -> tuple[np.ndarray, np.ndarray]:
    """Random bit patterns (NaNs included: checks compare bytes)."""
    raw = np.random.default_rng(seed).integers(0, 1 << 16, (2, *SHAPE), dtype=np.uint16)
    return raw[0].view(buffers.as_dtype(dtype)), raw[1].view(buffers.as_dtype(dtype))


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("in_kind", KINDS)
@pytest.mark.parametrize("out_kind", KINDS)
def test_every_kind_in_and_out_of_every_tier(tier, in_kind, out_kind, tmp_path):
    cupy = _need(in_kind)
    _need(out_kind)
    key, value = _kv(hash((tier, in_kind)) % 1000)
    with _store(tier, tmp_path) as store:
        bid = store.put(_make(in_kind, key), _make(in_kind, value))
        assert {n: t["blocks"] for n, t in store.stats()["tiers"].items()} == {tier: 1}
        k_out, v_out = _empty(out_kind), _empty(out_kind)
        assert store.get_into(bid, k_out, v_out)
        cupy.cuda.runtime.deviceSynchronize()  # not needed by the contract; the check must not race
        assert _host(k_out) == key.tobytes() and _host(v_out) == value.tobytes()
        assert store.put(_make(out_kind, key), _make(out_kind, value)) == bid  # same digest from any kind
        if out_kind in ("cupy", "torch_cuda"):
            like = _empty(out_kind)
            got = store.get(bid, like=like)
            assert type(got[0]) is type(like) and _host(got[1]) == value.tobytes()


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("kind", ["cupy", "torch_cuda"])
@pytest.mark.parametrize("count", [1, 64])  # a batch of one is a get_into of the caller's arrays
def test_batches_on_the_callers_stream(tier, kind, count, tmp_path):
    cupy = _need(kind)
    blocks = [_kv(i) for i in range(count)]
    with _store(tier, tmp_path, nbytes=16 << 20) as store:
        ids = store.put_many([(_make(kind, k), _make(kind, v)) for k, v in blocks])
        outs = [(_empty(kind), _empty(kind)) for _ in ids]
        if kind == "torch_cuda":
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):  # the tensors' interface names this stream
                assert all(store.get_many_into(ids, outs))
            stream.synchronize()
        else:
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                assert all(store.get_many_into(ids, outs))
        cupy.cuda.runtime.deviceSynchronize()
        for (k, v), (ko, vo) in zip(blocks, outs):
            assert _host(ko) == k.tobytes() and _host(vo) == v.tobytes()


def test_a_cuda_tensor_is_viewed_on_torchs_current_stream():
    """The stream a view names is torch's current one (its raw-stream query agrees with
    the public call), in and out of a stream context."""
    _need("torch_cuda")
    t = torch.empty(16, device="cuda")
    assert buffers.view(t).stream == (torch.cuda.current_stream().cuda_stream or 1)  # 0: the legacy default, 1
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert buffers.view(t).stream == side.cuda_stream != 1


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_torch_cuda_low_precision_blocks_and_get_like(tier, dtype, tmp_path):
    _need("torch_cuda")
    raw = np.random.default_rng(7).integers(0, 256, (2, *SHAPE, 2), dtype=np.uint8)
    with _store(tier, tmp_path, dtype=dtype) as store:
        n = int(np.prod(SHAPE)) * buffers.as_dtype(dtype).itemsize
        key, value = (torch.from_numpy(r.reshape(-1)[:n].copy()).view(getattr(torch, dtype)).reshape(SHAPE).cuda()
                      for r in raw)
        bid = store.put(key, value)
        k, v = store.get(bid, like=torch.empty(0, device="cuda"))
        assert k.is_cuda and k.dtype == getattr(torch, dtype) and _host(v) == _host(value)


def test_pinned_arena_and_registered_shm_slab_on_a_real_gpu(tmp_path):
    cupy = _need("cupy")
    with buffers.use_device_copier(buffers.CupyCopier(), staging_bytes=8 << 20):
        arena = buffers.staging_arena()
        key, value = _kv(3)
        with _store("shm", tmp_path) as store:
            bid = store.put(_make("cupy", key), _make("cupy", value))  # hashes through the arena
            k_out, v_out = _empty("cupy"), _empty("cupy")
            assert store.get_into(bid, k_out, v_out)  # DMA from the registered slab
            assert _host(v_out) == value.tobytes()
            ptr = int(store.tiers[0]._bytes.ctypes.data)
            attrs = cupy.cuda.runtime.pointerGetAttributes(ptr)
            assert attrs.type == 1  # cudaMemoryTypeHost: registered, the driver knows it (pageable is 0)
        assert arena.stats["allocations"] == 1 and arena.stats["fallbacks"] == 0
        big = cupy.arange(24 << 20, dtype=cupy.uint8)  # 3x the arena: chunked through it
        back = np.empty(big.nbytes, np.uint8)
        buffers.copy(back, big)
        assert back.tobytes() == big.get().tobytes()


def test_demotion_of_gpu_blocks_to_shm_on_a_real_gpu(tmp_path):
    _need("cupy")
    block = 2 * int(np.prod(SHAPE)) * 2
    blocks = [_kv(20 + i) for i in range(4)]
    with _store("gpu", tmp_path, nbytes=2 * block + 128, shm_bytes=8 << 20) as store:
        ids = [store.put(_make("cupy", k), _make("cupy", v)) for k, v in blocks]
        assert store.stats()["tiers"]["shm"]["blocks"] >= 2
        for bid, (k, v) in zip(ids, blocks):
            k_out, v_out = _empty("torch_cpu"), _empty("torch_cpu")
            assert store.get_into(bid, k_out, v_out) and _host(v_out) == v.tobytes()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn"])
def test_a_view_of_a_gpu_tier_block_is_the_device_slab_in_place(dtype, tmp_path):
    """``store.view`` of a GPU-tier block: cupy arrays over the slab's bytes (the dtype cupy
    has, else unsigned integers of its width), held while the ``with`` block runs."""
    cupy = _cupy()
    np_dtype = buffers.as_dtype(dtype)
    nbytes = int(np.prod(SHAPE)) * np_dtype.itemsize
    raw = np.random.default_rng(3).integers(0, 256, (2, nbytes), dtype=np.uint8)
    key, value = (r.view(np_dtype).reshape(SHAPE) for r in raw)
    with _store("gpu", tmp_path, dtype=dtype, verify_dram_reads=True) as store:
        bid = store.put(key, value)  # host arrays: cupy has no float8 to hand them in as
        slab = store.tiers[0]._slab_array()
        start, end = slab.data.ptr, slab.data.ptr + slab.nbytes
        with store.view(bid) as (k, v):
            assert isinstance(k, cupy.ndarray) and k.shape == v.shape == SHAPE
            assert k.dtype == v.dtype == buffers.device_dtype(np_dtype)
            assert start <= k.data.ptr < end and start <= v.data.ptr < end  # no copy
            store.delete(bid)
            store.put(value, key)  # the freed room may be reused meanwhile
            assert _host(k) == key.tobytes() and _host(v) == value.tobytes()
            if torch.cuda.is_available():  # what an engine does with it: its own dtype, same bytes
                t = torch.as_tensor(v, device="cuda").view(getattr(torch, dtype))
                assert t.dtype == getattr(torch, dtype) and _host(t) == value.tobytes()
        assert store.get(bid) is None and store.stats()["tiers"]["gpu"]["blocks"] == 1
