"""Streamed slab copies (``stream`` of cascade.buffers.hostcopy: non-temporal stores for a
call of STREAM_MIN bytes or more): the same bytes as memcpy's at every alignment and
length, nothing written outside the range or on a refusal, only calls asked to and big
enough stream, and a store streams its SHM copies unless ``stream_copies=False``. Both
implementations (``hostcopy_impl``, tests/conftest.py) take ``stream``."""
from __future__ import annotations

import numpy as np
import pytest

from cascade import CascadeStore, Config
from cascade.buffers import hostcopy
from cascade.models import BlockSpec
from cascade.tiers import slab_tier

MIN = hostcopy.STREAM_MIN


def pattern(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("sizes", [[MIN], [MIN - 1, 1], [1, MIN + 63], [MIN + 15, 17, 3 * MIN + 5],
                                   [7, 9, 31], [(1 << 20) + 3, 61], [5 << 20]])
@pytest.mark.parametrize("offset", [0, 1, 15, 16, 4095])
def test_a_streamed_copy_moves_the_same_bytes_at_any_alignment(hostcopy_impl, sizes, offset, share):
    copy_out, copy_in = hostcopy_impl.copy_out, hostcopy_impl.copy_in
    total = sum(sizes)
    guard = 4096
    slab = memoryview(bytearray(b"\x5a" * (offset + total + 2 * guard)))
    start = guard + offset
    parts = [pattern(n, i) for i, n in enumerate(sizes)]
    assert copy_in(slab, start, start + total, parts, share, True)
    assert bytes(slab[start:start + total]) == b"".join(p.tobytes() for p in parts)
    assert bytes(slab[:start]) == b"\x5a" * start  # nothing before the range
    assert bytes(slab[start + total:]) == b"\x5a" * guard  # nor after it
    # outputs at odd addresses too: each a view starting `offset` bytes into a bigger buffer
    backing = [np.full(n + offset + 64, 0xA5, np.uint8) for n in sizes]
    outs = [b[offset:offset + n] for b, n in zip(backing, sizes)]
    assert copy_out(slab, start, start + total, outs, share, True)
    for out, part, back, n in zip(outs, parts, backing, sizes):
        assert np.array_equal(out, part)
        assert (back[:offset] == 0xA5).all() and (back[offset + n:] == 0xA5).all()


def test_a_streamed_batch_copy_moves_each_jobs_bytes(hostcopy_impl):
    copy_in, copy_out_many = hostcopy_impl.copy_in, hostcopy_impl.copy_out_many
    sizes = [MIN // 4 + 1, 2 * MIN + 7, 64, (1 << 20) + 5]
    slab = memoryview(bytearray(sum(sizes) + 4096))
    jobs, pos = [], 0
    for i, n in enumerate(sizes):
        assert copy_in(slab, pos, pos + n, [pattern(n, i)], False, True)
        jobs.append((pos, pos + n, [np.zeros(n, np.uint8)]))
        pos += n
    for share in (False, True):
        assert copy_out_many(slab, jobs, share, True) == [True] * len(sizes)
        for i, (_, _, (out,)) in enumerate(jobs):
            assert np.array_equal(out, pattern(sizes[i], i))
            out[:] = 0


@pytest.mark.parametrize("case", ["read-only", "short", "too many"])
def test_a_streamed_copy_that_is_refused_writes_nothing(hostcopy_impl, case):
    copy_out, copy_in = hostcopy_impl.copy_out, hostcopy_impl.copy_in
    slab = memoryview(bytearray(b"\x07" * (4 * MIN)))
    outs = [np.zeros(2 * MIN, np.uint8), np.zeros(2 * MIN, np.uint8)]
    if case == "read-only":
        outs[1].flags.writeable = False
    elif case == "short":
        outs[1] = np.zeros(2 * MIN - 1, np.uint8)
    else:
        outs = [np.zeros(4 * MIN // 16, np.uint8) for _ in range(16)]
    assert copy_out(slab, 0, 4 * MIN, outs, False, True) is False
    assert all(not o.any() for o in outs)
    assert copy_in(slab, 0, 4 * MIN - 1, [np.ones(4 * MIN, np.uint8)], False, True) is False
    assert bytes(slab) == b"\x07" * (4 * MIN)


@pytest.mark.parametrize("case", ["streamed", "not asked", "under the threshold", "batch under", "batch over"])
def test_only_calls_asked_to_and_big_enough_stream(compiled_hostcopy, case):
    slab = memoryview(bytearray(4 * MIN))
    before = hostcopy.streamed_copies()
    if case.startswith("batch"):
        size = MIN // 4 if case == "batch under" else MIN // 2
        jobs = [(i * size, (i + 1) * size, [np.zeros(size, np.uint8)]) for i in range(3)]  # 3/4 or 3/2 of MIN
        assert hostcopy.copy_out_many(slab, jobs, False, True) == [True] * 3
    else:
        size = MIN - 1 if case == "under the threshold" else MIN
        assert hostcopy.copy_in(slab, 0, size, [np.ones(size, np.uint8)], False, case != "not asked")
    assert hostcopy.streamed_copies() - before == (case in ("streamed", "batch over"))


def test_stream_must_be_a_truth_value_and_arguments_are_counted(compiled_hostcopy):
    slab = memoryview(bytearray(MIN))

    class NoTruth:
        def __bool__(self):
            raise RuntimeError("no truth value")

    with pytest.raises(RuntimeError, match="no truth value"):
        hostcopy.copy_out(slab, 0, MIN, [np.zeros(MIN, np.uint8)], False, NoTruth())
    with pytest.raises(TypeError, match="stream"):
        hostcopy.copy_out(slab, 0, MIN, [np.zeros(MIN, np.uint8)], False, True, True)
    with pytest.raises(TypeError, match="stream"):
        hostcopy.copy_out_many(slab, [], False, True, True)


BLOCK = 1 << 20
SPEC = BlockSpec.flat(BLOCK)


def block(i: int) -> tuple[np.ndarray, np.ndarray]:
    return pattern(BLOCK // 2, 2 * i), pattern(BLOCK // 2, 2 * i + 1)


@pytest.mark.parametrize("stream_copies", [True, False])
def test_a_store_streams_its_shm_copies_unless_told_not_to(tmp_path, monkeypatch, stream_copies):
    streams: list[bool] = []
    for name in ("copy_in", "copy_out", "copy_out_many"):
        real = getattr(slab_tier, name)
        monkeypatch.setattr(slab_tier, name, lambda *a, real=real: (streams.append(a[-1]), real(*a))[1])
    config = Config(shm_bytes=16 * (BLOCK + 4096), file_bytes=0, remote_bytes=0, promote_on_hit=False,
                    stream_copies=stream_copies)
    ids = [f"{i:032x}" for i in range(4)]
    before = hostcopy.streamed_copies()
    with CascadeStore(config, block_spec=SPEC) as store:
        store.put(*block(0), block_id=ids[0])
        store.put_many([block(i) for i in (1, 2, 3)], block_ids=ids[1:])
        outs = [SPEC.empty() for _ in ids]
        assert store.get_into(ids[0], *outs[0])
        assert store.get_many_into(ids[1:], outs[1:]) == [True] * 3
        for i, (key, value) in enumerate(outs):
            assert np.array_equal(key, block(i)[0]) and np.array_equal(value, block(i)[1])
    assert streams and set(streams) == {stream_copies}
    if hostcopy.COMPILED:
        assert (hostcopy.streamed_copies() > before) == stream_copies


def test_stream_copies_is_a_config_key_with_an_environment_form():
    assert Config().stream_copies is True
    assert Config.load(env={"CASCADE_STREAM_COPIES": "false"}).stream_copies is False
