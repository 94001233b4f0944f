"""Host-memory primitives (cascade.buffers.hostcopy): the compiled module and its Python
fallbacks copy the same bytes and refuse the same buffers having written nothing, a
store runs the same on either, and CPU torch tensors reach the store's hot paths as
numpy arrays over their own memory (cascade.buffers.host_array)."""
from __future__ import annotations

import ctypes
import gc
import weakref
from typing import Any

import ml_dtypes
import numpy as np
import pytest

try:
    import torch
except ImportError:  # the tests of CPU tensors skip
    torch = None

from cascade import CascadeStore, Config, buffers
from cascade.buffers import hostcopy
from cascade.models import BlockSpec
from cascade.tiers import slab_tier

IMPLS = {"compiled": (hostcopy.copy_out, hostcopy.copy_in, hostcopy.memory_at),
         "python": (hostcopy.copy_out_python, hostcopy.copy_in_python, hostcopy.memory_at_python)}


def test_the_compiled_copies_were_built():
    """`make install` builds cascade/buffers/_hostcopy.c; a test machine without it runs the
    slower fallbacks without saying so, so this says so."""
    assert hostcopy.COMPILED, "cascade.buffers._hostcopy was not built: run `make install` (needs a C compiler)"


@pytest.fixture(params=list(IMPLS))
def impl(request):
    if request.param == "compiled" and not hostcopy.COMPILED:
        pytest.skip("not built here (test_the_compiled_copies_were_built says why)")
    return IMPLS[request.param]


@pytest.fixture
def slab():
    return memoryview(bytearray(1 << 21))


@pytest.mark.parametrize("dtype, shape", [(np.uint8, (2048,)), (np.float16, (4, 8, 32)),
                                          (ml_dtypes.bfloat16, (2, 512)), (np.float32, (3, 5))])
def test_parts_go_in_and_come_back_out_exactly(impl, slab, dtype, shape):
    copy_out, copy_in, _ = impl
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal(shape).astype(dtype) for _ in range(2)]
    size = sum(p.nbytes for p in parts)
    assert copy_in(slab, 4096, 4096 + size, parts)
    assert bytes(slab[4096:4096 + size]) == b"".join(p.tobytes() for p in parts)
    outs = [np.zeros(shape, dtype) for _ in range(2)]
    assert copy_out(slab, 4096, 4096 + size, outs)
    for out, part in zip(outs, parts):
        assert out.tobytes() == part.tobytes()


def test_a_big_copy_is_exact(impl, slab):  # the compiled one copies 256 KiB and more without the GIL
    copy_out, copy_in, _ = impl
    parts = [np.random.default_rng(1).integers(0, 255, 1 << 19, dtype=np.uint8) for _ in range(2)]
    assert copy_in(slab, 0, 1 << 20, parts)
    outs = [np.zeros(1 << 19, np.uint8), bytearray(1 << 19)]
    assert copy_out(slab, 0, 1 << 20, outs)
    assert outs[0].tobytes() == parts[0].tobytes() and bytes(outs[1]) == parts[1].tobytes()


def _read_only() -> np.ndarray:
    out = np.zeros(2048, np.uint8)
    out.flags.writeable = False
    return out


@pytest.mark.parametrize("bad", ["short", "long", "read_only", "strided", "no_buffer", "too_many"])
def test_refused_buffers_are_refused_with_nothing_written(impl, slab, bad):
    copy_out, copy_in, _ = impl
    good = np.full(2048, 7, np.uint8)
    odd = {"short": np.zeros(2047, np.uint8), "long": np.zeros(2049, np.uint8), "read_only": _read_only(),
           "strided": np.zeros(4096, np.uint8)[::2], "no_buffer": object()}.get(bad)
    outs = [np.full(512, 9, np.uint8) for _ in range(8)] + [np.full(0, 9, np.uint8)] if bad == "too_many" \
        else [good, odd]
    slab[:4096] = bytes(range(256)) * 16
    before = bytes(slab[:4096])
    assert not copy_out(slab, 0, 4096, outs)
    assert good.tobytes() == bytes([7]) * 2048  # nothing written into the good output either
    if bad != "read_only":  # a read-only part is a fine source
        assert not copy_in(slab, 0, 4096, outs)
    assert bytes(slab[:4096]) == before


def test_outputs_that_overlap_are_refused_with_nothing_written(impl, slab):
    copy_out, copy_in, _ = impl
    buf = np.full(3072, 7, np.uint8)
    slab[:4096] = bytes(range(256)) * 16
    assert not copy_out(slab, 0, 4096, [buf[:2048], buf[1024:3072]])  # their byte ranges overlap
    assert not copy_out(slab, 0, 4096, [buf[:2048], buf[:2048]])  # the same buffer twice
    assert buf.tobytes() == bytes([7]) * 3072
    assert copy_in(slab, 0, 4096, [buf[:2048], buf[:2048]])  # overlapping sources are fine
    assert copy_out(slab, 0, 4096, [np.zeros(2048, np.uint8), np.zeros(2048, np.uint8)])


@pytest.mark.parametrize("overlapping", [hostcopy.overlapping, hostcopy.overlapping_python], ids=["compiled", "python"])
def test_overlapping_looks_at_every_pair_of_host_buffers(overlapping):
    buf = np.zeros(4096, np.uint8)
    assert not overlapping([buf[:1024], buf[1024:2048], buf[3072:], buf[2048:3072]])  # adjacent, any order
    assert overlapping([buf[3072:], buf[:1024], buf[2000:3073]])  # the last two share a byte, far apart in the list
    assert overlapping([buf, buf[100:200]])
    assert not overlapping([buf[:0], buf[:0], buf])  # empty ones never overlap
    assert not overlapping([buf[:10], object(), buf[10:20]])  # no host buffer: not looked at


def test_a_range_outside_the_slab_is_an_error(impl, slab):
    copy_out, copy_in, _ = impl
    part = np.zeros(2048, np.uint8)
    for pos, last in [(-1, 2047), (len(slab) - 2048, len(slab) + 2048), (10, 5)]:
        with pytest.raises(ValueError, match="outside a slab"):
            copy_out(slab, pos, last, [part])
        with pytest.raises(ValueError, match="outside a slab"):
            copy_in(slab, pos, last, [part])


def test_a_read_only_slab_takes_no_copy_in(impl):
    _, copy_in, _ = impl
    with pytest.raises((TypeError, BufferError)):
        copy_in(memoryview(bytes(4096)), 0, 2048, [np.zeros(2048, np.uint8)])


def test_memory_at_views_the_memory_at_an_address_and_keeps_its_owner(impl):
    _, _, memory_at = impl
    owner = bytearray(b"abcdefgh")
    address = ctypes.addressof((ctypes.c_char * len(owner)).from_buffer(owner))
    view = memoryview(memory_at(address + 2, 4, True, owner))
    assert bytes(view) == b"cdef" and view.nbytes == 4 and not view.readonly
    view[0] = ord("X")
    assert owner == bytearray(b"abXdefgh")
    read_only = memoryview(memory_at(address, 8, False, owner))
    assert read_only.readonly and bytes(read_only) == b"abXdefgh"
    with pytest.raises(TypeError):
        read_only[0] = 0
    array = np.frombuffer(memory_at(address, 8, False, owner), np.uint8)
    alive = weakref.ref(kept := Owner())
    held = memory_at(address, 8, False, kept)
    del kept
    assert alive() is not None  # held by the buffer
    del held
    assert alive() is None
    assert array.tobytes() == b"abXdefgh"
    for bad in [(0, 8), (address, -1)]:
        with pytest.raises(ValueError, match="no memory"):
            memory_at(*bad, False, owner)


class Owner:
    """Something weakly referable to own memory in a test."""


@pytest.mark.parametrize("nbytes", [8 << 10, 1 << 20])  # small blocks (hot path) and leased reads
def test_a_store_serves_the_same_on_either(tmp_path, monkeypatch, impl, nbytes):
    copy_out, copy_in, _ = impl
    monkeypatch.setattr(slab_tier, "copy_out", copy_out)
    monkeypatch.setattr(slab_tier, "copy_in", copy_in)
    spec = BlockSpec.flat(nbytes)
    cfg = Config(shm_bytes=16 * nbytes + (1 << 20), file_bytes=0, shm_dir=str(tmp_path))
    rng = np.random.default_rng(2)
    pairs = [(rng.integers(0, 255, spec.shape, dtype=np.uint8), rng.integers(0, 255, spec.shape, dtype=np.uint8))
             for _ in range(8)]
    ids = [f"{i:032x}" for i in range(8)]
    with CascadeStore(cfg, block_spec=spec) as store:
        for b, (k, v) in zip(ids, pairs):
            assert store.put(k, v, block_id=b) == b
        outs = [spec.empty() for _ in ids]
        assert store.get_many_into(ids, outs) == [True] * 8
        for (k, v), (ko, vo) in zip(pairs, outs):
            assert np.array_equal(k, ko) and np.array_equal(v, vo)
        ko, vo = spec.empty()
        assert store.get_into(ids[3], ko, vo) and np.array_equal(vo, pairs[3][1])
        assert store.stats()["hits"] == 9


# -- CPU torch tensors: numpy arrays over their memory (buffers.host_array) ---------------------
BF16 = BlockSpec(shape=(4, 256), dtype="bfloat16")
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (make test installs CPU torch)")


def _tensors(spec: BlockSpec, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(spec.shape, generator=g).to(torch.bfloat16) for _ in range(2))


@needs_torch
def test_host_array_is_the_tensor_memory_read_only_unless_asked():
    t = _tensors(BF16, 0)[0]
    ro = buffers.host_array(t, BF16.shape, BF16.np_dtype)
    assert ro.shape == BF16.shape and ro.dtype == BF16.np_dtype and not ro.flags.writeable
    assert ro.tobytes() == t.view(torch.int16).numpy().tobytes()
    rw = buffers.host_array(t, BF16.shape, BF16.np_dtype, writable=True)
    rw[1, 2] = 5.0
    assert float(t[1, 2]) == 5.0


@needs_torch
def test_host_array_keeps_its_tensor_alive():
    """A tensor given as a temporary (an argument moved into the callee, then dropped) stays
    alive as long as the array over it: its memory is never freed under the array."""
    spec = BlockSpec(shape=(1 << 16,), dtype="float16")
    array = buffers.host_array(torch.full(spec.shape, 3.0, dtype=torch.float16), spec.shape, spec.np_dtype)
    gc.collect()
    churn = [torch.full(spec.shape, 7.0, dtype=torch.float16) for _ in range(8)]  # would reuse freed memory
    assert np.all(array == 3.0) and len(churn) == 8


@needs_torch
@pytest.mark.parametrize("content_addressed", [False, True])
def test_a_store_reads_temporary_tensors_correctly(tmp_path, content_addressed):
    """Tensors made in the call itself (found by the store model: a content-addressed put
    of temporaries stored freed memory)."""
    spec = BlockSpec(shape=(2, 2, 16, 16), dtype="float16")
    rng = np.random.default_rng(3)
    key = rng.standard_normal(spec.shape).astype(spec.np_dtype)
    with CascadeStore(Config(shm_bytes=1 << 22, file_bytes=0, shm_dir=str(tmp_path)), block_spec=spec) as store:
        bid = store.put(torch.from_numpy(key.copy()), torch.from_numpy((key * 2).copy()),
                        block_id=None if content_addressed else "ab" * 16)
        ko, vo = spec.empty()
        assert store.get_into(bid, ko, vo) and ko.tobytes() == key.tobytes() and vo.tobytes() == (key * 2).tobytes()
        if content_addressed:
            assert store.put(key, key * 2) == bid  # the same content: the same id


@needs_torch
@pytest.mark.parametrize("other", ["float32", "shape", "transposed", "slice", "neg_view", "numpy", "list"])
def test_host_array_is_none_for_anything_but_a_plain_cpu_tensor_of_the_spec(other):
    t = _tensors(BF16, 1)[0]
    obj = {"float32": t.float(), "shape": t.reshape(8, 128), "transposed": t.t(), "slice": t[:, ::2],
           "neg_view": torch._neg_view(t), "numpy": np.zeros(BF16.shape, BF16.np_dtype), "list": [1, 2]}[other]
    assert buffers.host_array(obj, BF16.shape, BF16.np_dtype) is None


@needs_torch
@pytest.mark.parametrize("spec", [BF16, BlockSpec(shape=(4, 32768), dtype="bfloat16")])  # hot; leased (512 KiB)
def test_a_store_takes_cpu_tensors_without_its_general_checks(tmp_path, monkeypatch, spec):
    """put / get_into / put_many / get_many_into of CPU torch tensors, byte-exact, with
    the general path's per-object checks (which read torch's own views) never called."""
    def general(self, *objs):
        raise AssertionError(f"took the general check for {[type(o).__name__ for o in objs]}")

    def numpy_only(self, key, value):  # a put too big for the hot path: checked, as numpy arrays
        assert type(key) is np.ndarray and type(value) is np.ndarray
        return [key, value]

    monkeypatch.setattr(CascadeStore, "_check_outs", general)
    monkeypatch.setattr(CascadeStore, "_check_pair", numpy_only)
    blocks = [_tensors(spec, i) for i in range(6)]
    ids = [f"{i:032x}" for i in range(6)]
    cfg = Config(shm_bytes=8 * spec.block_bytes + (1 << 20), file_bytes=0, shm_dir=str(tmp_path))
    with CascadeStore(cfg, block_spec=spec) as store:
        for b, (k, v) in zip(ids[:3], blocks[:3]):
            assert store.put(k, v, block_id=b) == b
        assert store.put_many(blocks[3:], block_ids=ids[3:]) == ids[3:]
        outs = [tuple(torch.empty(spec.shape, dtype=torch.bfloat16) for _ in range(2)) for _ in ids]
        assert store.get_many_into(ids[:3], outs[:3]) == [True] * 3
        assert all(store.get_into(b, *o) for b, o in zip(ids[3:], outs[3:]))
        for (k, v), (ko, vo) in zip(blocks, outs):
            assert torch.equal(k.view(torch.int16), ko.view(torch.int16)) and torch.equal(v.view(torch.int16), vo.view(torch.int16))


def _version(name: str, which: str) -> Any:
    """``hostcopy``'s function ``name``: ``compiled`` (the test skips where it was not
    built) or its ``python`` fallback."""
    if which == "python":
        return getattr(hostcopy, f"{name}_python")
    if not hostcopy.COMPILED:
        pytest.skip("not built here (test_the_compiled_copies_were_built says why)")
    return getattr(hostcopy, name)


#: What :func:`_odd_arrays` holds that only the layout sets apart from a plain array.
LAYOUT_ONLY = ("read-only", "strided", "transposed")


def _odd_arrays(dtype: np.dtype, shape: tuple[int, ...]) -> dict[str, Any]:
    """Arrays and buffers the hot paths' checks must tell from numpy arrays of ``dtype`` and
    ``shape``: those of :data:`LAYOUT_ONLY`, then others of another shape, dtype or kind."""
    read_only = np.zeros(shape, dtype)
    read_only.flags.writeable = False
    return {"read-only": read_only, "strided": np.zeros((4, 16), dtype)[:, ::2], "transposed": np.zeros((8, 4), dtype).T,
            "shape": np.zeros((8, 4), dtype), "fewer dims": np.zeros(32, dtype), "more dims": np.zeros((1, 4, 8), dtype),
            "dtype": np.zeros(shape, np.float32), "bfloat16": np.zeros(shape, ml_dtypes.bfloat16),
            "subclass": np.zeros(shape, dtype).view(np.matrix), "bytearray": bytearray(64), "none": None}


@pytest.mark.parametrize("which", ["compiled", "python"])
def test_plain_pairs_counts_the_leading_pairs_a_batch_get_takes_as_they_are(which):
    plain_pairs = _version("plain_pairs", which)
    dtype, shape = np.dtype(np.float16), (4, 8)
    good = [(np.zeros(shape, dtype), np.zeros(shape, dtype)) for _ in range(3)]
    bad = _odd_arrays(dtype, shape)
    assert plain_pairs(good, np.ndarray, dtype, shape) == 3
    assert plain_pairs([list(p) for p in good], np.ndarray, dtype, shape) == 3
    assert plain_pairs([], np.ndarray, dtype, shape) == 0
    for what, array in bad.items():
        for pair in [(good[0][0], array), (array, good[0][1])]:
            assert plain_pairs(good[:2] + [pair] + good[2:], np.ndarray, dtype, shape) == 2, what
    assert plain_pairs(good[:1] + [good[1] + (good[1][0],)], np.ndarray, dtype, shape) == 1  # not a pair
    assert plain_pairs(good[:1] + [iter(good[1])], np.ndarray, dtype, shape) == 1


@pytest.mark.parametrize("which", ["compiled", "python"])
def test_plain_pair_takes_numpy_arrays_of_the_dtype_and_shape_whatever_their_layout(which):
    plain_pair = _version("plain_pair", which)
    dtype, shape = np.dtype(np.float16), (4, 8)
    good = np.zeros(shape, dtype)
    assert plain_pair(good, good, dtype, shape) is True
    for what, array in _odd_arrays(dtype, shape).items():
        taken = what in LAYOUT_ONLY
        assert plain_pair(good, array, dtype, shape) is taken and plain_pair(array, good, dtype, shape) is taken, what
    scalar = np.zeros((), dtype)
    assert plain_pair(scalar, scalar, dtype, ()) is True and plain_pair(good, good, dtype, ()) is False
    assert plain_pair(good, good, dtype, (1,) * 40) is False  # more dimensions than any array has
