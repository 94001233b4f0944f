"""The SHM tier's one-call copies (cascade.tiers.slab_copy): the compiled module and its
memoryview fallback copy the same bytes, refuse the same buffers having written nothing,
and a store runs the same on either."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cascade import CascadeStore, Config
from cascade.models import BlockSpec
from cascade.tiers import slab_copy, slab_tier

IMPLS = {"compiled": (getattr(slab_copy, "copy_out", None), getattr(slab_copy, "copy_in", None)),
         "python": (slab_copy.copy_out_python, slab_copy.copy_in_python)}


def test_the_compiled_copies_were_built():
    """`make install` builds cascade/tiers/_slabcopy.c; a test machine without it runs the
    slower fallback without saying so, so this says so."""
    assert slab_copy.COMPILED, "cascade.tiers._slabcopy was not built: run `make install` (needs a C compiler)"


@pytest.fixture(params=list(IMPLS))
def impl(request):
    if request.param == "compiled" and not slab_copy.COMPILED:
        pytest.skip("not built here (test_the_compiled_copies_were_built says why)")
    return IMPLS[request.param]


@pytest.fixture
def slab():
    return memoryview(bytearray(1 << 21))


@pytest.mark.parametrize("dtype, shape", [(np.uint8, (2048,)), (np.float16, (4, 8, 32)),
                                          (ml_dtypes.bfloat16, (2, 512)), (np.float32, (3, 5))])
def test_parts_go_in_and_come_back_out_exactly(impl, slab, dtype, shape):
    copy_out, copy_in = impl
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
    copy_out, copy_in = impl
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
    copy_out, copy_in = impl
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


def test_a_range_outside_the_slab_is_an_error(impl, slab):
    copy_out, copy_in = impl
    part = np.zeros(2048, np.uint8)
    for pos, last in [(-1, 2047), (len(slab) - 2048, len(slab) + 2048), (10, 5)]:
        with pytest.raises(ValueError, match="outside a slab"):
            copy_out(slab, pos, last, [part])
        with pytest.raises(ValueError, match="outside a slab"):
            copy_in(slab, pos, last, [part])


def test_a_read_only_slab_takes_no_copy_in(impl):
    _, copy_in = impl
    with pytest.raises((TypeError, BufferError)):
        copy_in(memoryview(bytes(4096)), 0, 2048, [np.zeros(2048, np.uint8)])


@pytest.mark.parametrize("nbytes", [8 << 10, 1 << 20])  # small blocks (hot path) and leased reads
def test_a_store_serves_the_same_on_either(tmp_path, monkeypatch, impl, nbytes):
    copy_out, copy_in = impl
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
