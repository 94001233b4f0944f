"""cascade.buffers: callers' arrays (numpy, torch, device-interface objects) as byte views,
the copy routine between them, and what the store makes of them on every host tier.

Device code paths run here without a GPU: HostCudaArray puts host memory behind
``__cuda_array_interface__`` and HostMemoryCopier copies it, through the same dispatch a
cupy copy takes. The ``gpu``-marked tests need cupy with a real GPU."""
from __future__ import annotations

import subprocess
import sys
import threading

import ml_dtypes
import numpy as np
import pytest
import torch

from cascade import CascadeStore, Config, buffers
from cascade.errors import ConfigError, InvalidBlock
from cascade.models import MODEL_PRESETS, BlockSpec
from cascade.testing.device_buffers import HostCudaArray, HostMemoryCopier

SHAPE = (2, 2, 16, 16)  # the tiny preset's block shape
TORCH_DTYPES = [torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]


def _tensor(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random bytes of every pattern reinterpreted as ``dtype`` (NaN patterns included)."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (int(np.prod(SHAPE)) * torch.empty(0, dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(SHAPE)


def _bytes(obj) -> bytes:
    return buffers.host_bytes(obj).tobytes()


# -- views ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_cpu_tensor_view_is_zero_copy(dtype):
    t = _tensor(dtype, 1)
    v = buffers.view(t, "key", writable=True)
    assert isinstance(v, np.ndarray) and v.dtype == np.uint8 and v.nbytes == t.numel() * t.element_size()
    v[:] = 7  # writes through to the tensor's memory
    assert t.view(torch.uint8).eq(7).all()


def test_numpy_view_keeps_read_only_and_refuses_it_as_output():
    a = np.arange(8, dtype=np.float32)
    a.flags.writeable = False
    assert not buffers.view(a).flags.writeable
    with pytest.raises(InvalidBlock, match="read-only"):
        buffers.view(a, "key_out", writable=True)
    with pytest.raises(InvalidBlock, match="read-only"):
        buffers.view(b"abcd", "key_out", writable=True)


@pytest.mark.parametrize("make, fix", [
    (lambda: np.zeros((4, 4), np.float16)[:, ::2], r"numpy.ascontiguousarray"),
    (lambda: torch.zeros(4, 4, dtype=torch.bfloat16).t(), r"\.contiguous\(\)"),
    (lambda: HostCudaArray(np.zeros((4, 4), np.float16)[:, ::2]), "contiguous"),
    (lambda: memoryview(np.zeros((4, 4), np.uint8))[::2], "contiguous"),
])
def test_non_contiguous_inputs_name_the_fix(make, fix):
    with pytest.raises(InvalidBlock, match=fix):
        buffers.view(make(), "key")


def test_objects_that_are_no_buffer_are_refused():
    with pytest.raises(InvalidBlock, match="__cuda_array_interface__"):
        buffers.view([1, 2, 3], "key")
    with pytest.raises(InvalidBlock, match="stream 0"):
        buffers.view(HostCudaArray(np.zeros(4), stream=0), "key")


class DlpackOnly:
    """An object offering nothing but DLPack (over a numpy array's memory)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_dlpack_only_object_is_viewed_without_copy():
    a = np.zeros(SHAPE, np.float16)
    v = buffers.view(DlpackOnly(a), "key_out", writable=True)
    v[:] = 3
    assert (a.view(np.uint8) == 3).all()
    assert buffers.shape_and_dtype(DlpackOnly(a)) == (SHAPE, np.dtype(np.float16))


def test_host_view_refuses_device_memory():
    with pytest.raises(InvalidBlock, match="device memory"):
        buffers.host_view(HostCudaArray(np.zeros(4)), "block part")


# -- dtypes and BlockSpec ----------------------------------------------------------------
@pytest.mark.parametrize("torch_dtype, name", [(torch.float16, "float16"), (torch.bfloat16, "bfloat16"),
                                                (torch.float8_e4m3fn, "float8_e4m3fn"),
                                                (torch.float8_e5m2, "float8_e5m2")])
def test_blockspec_takes_torch_numpy_and_named_dtypes(torch_dtype, name):
    by_torch = BlockSpec(SHAPE, torch_dtype)
    assert by_torch == BlockSpec(SHAPE, name) == BlockSpec(SHAPE, np.dtype(name))
    assert by_torch.dtype == name and by_torch.np_dtype == buffers.as_dtype(torch_dtype)
    assert by_torch.half_bytes == int(np.prod(SHAPE)) * torch.empty(0, dtype=torch_dtype).element_size()
    assert BlockSpec(SHAPE, getattr(ml_dtypes, name, np.float16)).dtype == name


def test_blockspec_refuses_unknown_dtype():
    with pytest.raises(ConfigError, match="unknown dtype"):
        BlockSpec(SHAPE, "bfloat17")
    with pytest.raises(ConfigError, match="unknown dtype"):
        BlockSpec(SHAPE, torch.qint8)  # numpy has no name for it


@pytest.mark.parametrize("shape, dtype", [((2, -1), "float16"), (16, "float16"), ((2, 3), ">f2"), ((2, 3), "f2,")])
def test_blockspec_refuses_negative_or_scalar_shapes_and_foreign_byte_orders(shape, dtype):
    # they were taken: a store opened with block_bytes -128, a raw TypeError, and a
    # big-endian array refused as "has dtype float16, expected float16"
    with pytest.raises(ConfigError, match="block (shape|dtype)"):
        BlockSpec(shape, dtype)


class _EngineTensor(torch.Tensor):
    """A tensor subclass of an engine's own module (not torch.*)."""


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_tensor_subclasses_take_every_path(dtype, tmp_path):
    # put_async and get_into_async took them through DLPack, which names neither bf16
    # nor fp8, and get(like=) refused them: only torch.* classes were known as tensors
    spec = BlockSpec((2, 64), dtype)
    with CascadeStore(Config(model="tiny", shm_bytes=1 << 20, file_bytes=0, remote_bytes=0,
                             shm_dir=str(tmp_path)), block_spec=spec) as store:
        key = torch.arange(128, dtype=torch.float32).reshape(2, 64).to(dtype).as_subclass(_EngineTensor)
        value = (-key.float()).to(dtype).as_subclass(_EngineTensor)
        bid = store.put_async(key, value).result(timeout=30)
        outs = [torch.zeros((2, 64), dtype=dtype).as_subclass(_EngineTensor) for _ in range(2)]
        assert store.get_into_async(bid, *outs).result(timeout=30)
        assert torch.equal(outs[0].view(torch.uint8), key.view(torch.uint8))
        got = store.get(bid, like=key)
        assert got is not None and got[1].dtype == dtype and torch.equal(got[1].view(torch.uint8), value.view(torch.uint8))


def test_tensors_without_memory_or_a_shape_and_outputs_that_require_grad_are_refused(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with CascadeStore(Config(model="tiny", shm_bytes=1 << 20, file_bytes=0, remote_bytes=0,
                             shm_dir=str(tmp_path))) as store:
        key, value = (torch.zeros(store.spec.shape, dtype=torch.float16) for _ in range(2))
        bid = store.put(key, value)
        with FakeTensorMode():
            fake = torch.zeros(store.spec.shape, dtype=torch.float16)
        for call in (lambda: store.put(fake, value), lambda: store.put_async(fake, value),
                     lambda: store.get_into(bid, fake, value.clone())):
            with pytest.raises(InvalidBlock, match="no memory"):  # a raw ValueError or RuntimeError
                call()
        leaf = torch.zeros(store.spec.shape, dtype=torch.float16, requires_grad=True)
        with pytest.raises(InvalidBlock, match="requires grad"):  # written behind autograd's back
            store.get_into(bid, leaf, value.clone())
        assert store.get_into(bid, leaf.detach(), value.clone())


@pytest.mark.parametrize("name, device", [("float16", "float16"), ("float32", "float32"), ("int8", "int8"),
                                          ("bfloat16", "uint16"), ("float8_e4m3fn", "uint8"), ("float8_e5m2", "uint8")])
def test_device_arrays_hold_low_precision_blocks_as_unsigned_integers_of_their_width(name, device):
    """Not every cupy has bfloat16 or float8 (the H200 machine's had no float8): a GPU-tier
    view gives their bytes as uint16 / uint8, which torch reinterprets."""
    assert buffers.device_dtype(buffers.as_dtype(name)) == np.dtype(device)


def test_presets_name_bfloat16_and_fp8():
    bf16, fp16 = MODEL_PRESETS["llama3-8b-bf16"], MODEL_PRESETS["llama3-8b"]
    assert bf16.bytes_per_token == fp16.bytes_per_token
    assert MODEL_PRESETS["llama3-8b-fp8"].bytes_per_token * 2 == fp16.bytes_per_token
    spec = BlockSpec.for_model("tiny-bf16", 16)
    assert spec.dtype == "bfloat16" and spec.empty()[0].dtype == ml_dtypes.bfloat16


def test_check_matches_dtype_by_kind_not_only_itemsize():
    spec = BlockSpec(SHAPE, "bfloat16")
    spec.check(_tensor(torch.bfloat16, 0), "key")
    spec.check(np.zeros(SHAPE, ml_dtypes.bfloat16), "key")
    with pytest.raises(InvalidBlock, match="dtype float16, expected bfloat16"):
        spec.check(_tensor(torch.float16, 0), "key")
    with pytest.raises(InvalidBlock, match="shape"):
        spec.check(torch.zeros(4, dtype=torch.bfloat16), "key")


# -- the copy routine and its device dispatch ----------------------------------------------
@pytest.fixture
def copier():
    with buffers.use_device_copier(HostMemoryCopier()) as c:
        yield c


def test_copy_host_to_host_needs_no_device_copier(copier):
    src, dst = _tensor(torch.bfloat16, 2), np.zeros(SHAPE, ml_dtypes.bfloat16)
    assert buffers.copy(dst, src) == src.numel() * 2
    assert dst.tobytes() == _bytes(src) and copier.calls == []


def test_copy_dispatches_each_direction_on_the_device_end_stream(copier):
    host = np.arange(64, dtype=np.uint8)
    dev_a = HostCudaArray(np.zeros(64, np.uint8), stream=0x1234)
    dev_b = HostCudaArray(np.zeros(64, np.uint8), stream=2)
    back = np.zeros(64, np.uint8)
    buffers.copy(dev_a, host)  # h2d on the output's stream
    buffers.copy(dev_b, dev_a)  # d2d on the output's (per-thread default) stream, after the input's
    buffers.copy(back, dev_b)  # d2h on the input's stream
    assert copier.calls == [("h2d", 64, 0x1234), ("d2d", 64, 2), ("d2h", 64, 2)]
    assert copier.synced == [0x1234, 0x1234, 2, 2]
    assert back.tobytes() == host.tobytes()


def test_copy_refuses_size_mismatch_and_read_only_device_output(copier):
    with pytest.raises(InvalidBlock, match="holds 8 bytes"):
        buffers.copy(HostCudaArray(np.zeros(8, np.uint8)), np.zeros(16, np.uint8))
    with pytest.raises(InvalidBlock, match="read-only"):
        buffers.copy(HostCudaArray(np.zeros(8, np.uint8), readonly=True), np.zeros(8, np.uint8))
    assert copier.calls == []


def test_copy_each_synchronises_each_stream_once_after_all_its_copies(copier):
    srcs = [HostCudaArray(np.full(32, i, np.uint8)) for i in range(3)]  # device memory with nothing pending
    outs = [HostCudaArray(np.zeros(32, np.uint8), stream=s) for s in (0x51, 0x52, 0x51)]
    buffers.copy_each(list(zip(outs, srcs)))
    assert copier.calls == [("d2d", 32, 0x51), ("d2d", 32, 0x52), ("d2d", 32, 0x51)]
    assert copier.synced == [0x51, 0x52]  # not once per copy
    assert [o.array.tobytes() for o in outs] == [s.array.tobytes() for s in srcs]


def test_copy_each_that_fails_midway_synchronises_what_it_enqueued_and_raises(copier):
    class FailsSecond(HostMemoryCopier):
        def memcpy_async(self, *args):
            if len(self.calls) == 1 and not self.synced:
                raise RuntimeError("cudaErrorIllegalAddress (injected)")
            super().memcpy_async(*args)

    with buffers.use_device_copier(FailsSecond()) as failing:
        pairs = [(HostCudaArray(np.zeros(8, np.uint8), stream=s), HostCudaArray(np.ones(8, np.uint8)))
                 for s in (0x61, 0x62)]
        with pytest.raises(RuntimeError, match="injected"):
            buffers.copy_each(pairs)
        assert failing.synced == [0x61]  # the first copy is done before the error leaves
        failing.fail_sync = RuntimeError("cudaErrorLaunchFailure (injected)")
        with pytest.raises(RuntimeError, match="LaunchFailure"):
            buffers.copy_each(pairs)
        assert failing.synced == [0x61, 0x62]  # the stream after the failed one is synchronised too


def test_a_batch_covers_any_range_inside_the_union_of_its_outputs():
    batch = buffers.SyncBatch([(30, 40), (0, 10), (5, 20)])
    assert batch.covers(0, 20) and batch.covers(12, 8) and batch.covers(30, 10)
    assert not batch.covers(18, 5) and not batch.covers(29, 2) and not batch.covers(40, 1)
    assert not buffers.SyncBatch([]).covers(0, 1)


def test_host_bytes_copies_device_memory_and_views_host_memory(copier):
    a = np.arange(16, dtype=np.uint8)
    assert np.shares_memory(buffers.host_bytes(a), a)
    staged = buffers.host_bytes(HostCudaArray(a, stream=1))
    assert not np.shares_memory(staged, a) and staged.tobytes() == a.tobytes()
    assert copier.calls == [("d2h", 16, 0)]  # stream 1: the legacy default stream


# -- through CascadeStore, every host tier --------------------------------------------------
def _store(tier: str, tmp_path, dtype) -> CascadeStore:
    sizes = {"shm_bytes": 0, "file_bytes": 0, "gpu_bytes": 0}
    sizes[f"{tier}_bytes"] = 1 << 20
    cfg = Config(model="tiny", file_dir=str(tmp_path / "files"), file_segment_bytes=1 << 20, **sizes)
    return CascadeStore(cfg, block_spec=BlockSpec(SHAPE, dtype), array_module=np if tier == "gpu" else None)


def _only_tier_holds_one_block(store: CascadeStore, tier: str) -> None:
    counts = {name: t["blocks"] for name, t in store.stats()["tiers"].items()}
    assert counts == {tier: 1}


TIERS = ["shm", "file", "gpu"]


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_cpu_tensors_round_trip_byte_exact(tier, dtype, tmp_path):
    key, value = _tensor(dtype, 10), _tensor(dtype, 11)
    with _store(tier, tmp_path, dtype) as store:
        bid = store.put(key, value)
        assert store.put(key.clone(), value.clone()) == bid  # same content digest from torch bytes
        _only_tier_holds_one_block(store, tier)
        k_out, v_out = torch.empty(SHAPE, dtype=dtype), torch.empty(SHAPE, dtype=dtype)
        assert store.get_into(bid, k_out, v_out)
        assert _bytes(k_out) == _bytes(key) and _bytes(v_out) == _bytes(value)
        k_np, v_np = store.spec.empty()
        assert store.get_into(bid, k_np, v_np)
        assert k_np.dtype == buffers.as_dtype(dtype) and k_np.tobytes() == _bytes(key)
        got = store.get(bid)
        assert got[1].tobytes() == _bytes(value)


@pytest.mark.parametrize("tier", TIERS)
def test_bad_inputs_and_outputs_store_and_hold_nothing(tier, tmp_path):
    good = _tensor(torch.bfloat16, 3)
    store = _store(tier, tmp_path, torch.bfloat16)
    bad_inputs = [(good.transpose(2, 3), r"not contiguous: call \.contiguous\(\)"),
                  (good.to(torch.float16), "dtype float16"), (good[:1], "shape"), (good.reshape(-1), "shape")]
    for bad, reason in bad_inputs:
        with pytest.raises(InvalidBlock, match=reason):
            store.put(bad, good)
    assert store.stats()["blocks"] == 0
    bid = store.put(good, good)
    read_only = np.zeros(SHAPE, ml_dtypes.bfloat16)
    read_only.flags.writeable = False
    bad_outputs = [(torch.empty(SHAPE, dtype=torch.bfloat16).transpose(2, 3), "contiguous"),
                   (read_only, "read-only"), (torch.empty(SHAPE, dtype=torch.float8_e4m3fn), "dtype"),
                   (np.zeros(SHAPE, np.uint16), "dtype")]
    for k_out, reason in bad_outputs:
        with pytest.raises(InvalidBlock, match=reason):
            store.get_into(bid, k_out, torch.empty(SHAPE, dtype=torch.bfloat16))
    stats = store.stats()
    assert stats["blocks"] == 1 and stats["stored"] == 1
    store.close()  # returns: no read or reservation was left held


@pytest.mark.parametrize("tier", TIERS)
def test_device_interface_buffers_through_the_store(tier, tmp_path, copier):
    """Put from and read into __cuda_array_interface__ buffers: every copy goes through the
    device copier, on the buffers' streams."""
    key, value = np.random.default_rng(4).standard_normal((2, *SHAPE)).astype(np.float16)
    with _store(tier, tmp_path, np.float16) as store:
        bid = store.put(HostCudaArray(key, stream=0x77), HostCudaArray(value, stream=0x77))
        k_out, v_out = np.zeros_like(key), np.zeros_like(value)
        assert store.get_into(bid, HostCudaArray(k_out, stream=0x88), HostCudaArray(v_out, stream=0x88))
        assert k_out.tobytes() == key.tobytes() and v_out.tobytes() == value.tobytes()
        half = key.nbytes
        device_calls = [c for c in copier.calls if c[1] == half]
        assert ("d2h", half, 0x77) in device_calls and ("h2d", half, 0x88) in device_calls
        assert store.put(key, value) == bid  # the digest of device bytes is the digest of the bytes


def test_failed_device_copy_in_a_put_stores_nothing_and_store_keeps_serving(tmp_path, copier):
    key = np.ones(SHAPE, np.float16)
    with _store("shm", tmp_path, np.float16) as store:
        copier.fail = RuntimeError("cudaErrorLaunchFailure (injected)")
        with pytest.raises(RuntimeError, match="injected"):
            store.put(HostCudaArray(key), HostCudaArray(key), block_id="ab" * 16)
        assert store.stats()["blocks"] == 0 and store.tiers[0].used == 0
        bid = store.put(HostCudaArray(key), HostCudaArray(key), block_id="ab" * 16)
        assert store.get(bid)[0].tobytes() == key.tobytes()


@pytest.mark.parametrize("tier", TIERS)
def test_failed_device_copy_in_a_read_leaves_nothing_held(tier, tmp_path, copier):
    key = np.ones(SHAPE, np.float16)
    store = _store(tier, tmp_path, np.float16)
    bid = store.put(key, key)
    copier.fail = RuntimeError("cudaErrorIllegalAddress (injected)")
    with pytest.raises(RuntimeError, match="injected"):
        store.get_into(bid, HostCudaArray(np.empty_like(key)), HostCudaArray(np.empty_like(key)))
    assert store.get(bid)[0].tobytes() == key.tobytes()  # still serving
    closing = threading.Thread(target=store.close, daemon=True)
    closing.start()
    closing.join(3)
    assert not closing.is_alive(), "close() is still waiting for the failed read"


def test_numpy_callers_never_import_torch_or_cupy(tmp_path):
    code = (
        "import sys, numpy as np\n"
        "from cascade import CascadeStore, Config\n"
        f"cfg = Config(model='tiny-bf16', shm_bytes=1 << 20, file_bytes=1 << 20, file_dir={str(tmp_path)!r})\n"
        "with CascadeStore(cfg) as store:\n"
        "    k, v = store.spec.empty()\n"
        "    k[...] = 1; v[...] = 2\n"
        "    bid = store.put(k, v)\n"
        "    assert store.get_into(bid, *store.spec.empty())\n"
        "    assert store.get(bid)[1].tobytes() == v.tobytes()\n"
        "leaked = [m for m in ('torch', 'cupy') if m in sys.modules]\n"
        "assert not leaked, leaked\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# The real-GPU cases (every tier x numpy, torch CPU, torch CUDA, cupy; batches) are in tests/gpu.
