"""Host-memory primitives, each one call: copies between a slab (an SHM tier's mapping)
and a block's buffers, and a byte view of memory given by its address.

``copy_out(slab, pos, last, outs)`` fills ``outs`` in order with slab bytes
``[pos, last)``; ``copy_in(slab, pos, last, parts)`` writes ``parts`` in order there. Each
returns True when the buffers took exactly that range, and False, having written
nothing, when one of them has no C-contiguous byte buffer (writable, for outputs), when
their sizes do not add up to the range, or when there are more than :data:`MAX_BUFFERS`
of them; a range outside the slab is a ValueError. ``copy_out_many(slab, jobs)`` makes
one ``copy_out`` per job ``(pos, last, outs)`` in one call and returns each job's verdict
in a list: every job is checked before any is copied; ``copy_in_many(slab, jobs)`` the
same with one ``copy_in`` per job ``(pos, last, parts)``. With ``share`` true (a last
argument to each), a copy of 256 KiB or more is shared, as pieces, with the compiled
module's helper thread (:mod:`.splitcopy` says when); ``helper_pieces()`` counts the pieces
that thread has copied in this process. With ``stream`` true (the argument after
``share``), a call copying :data:`STREAM_MIN` bytes or more in all writes with
non-temporal stores on x86-64 (memcpy elsewhere), which bypass the cache: for a store's
copies, whose destinations are seldom read again soon, up to twice memcpy's rate on this
project's VM (Config ``stream_copies`` has the figures); ``streamed_copies()`` counts
the calls that streamed. ``memory_at(address, nbytes,
writable, owner)`` is a flat byte buffer over memory that ``owner`` holds (a CPU
tensor's ``data_ptr()``: :func:`cascade.buffers.views.host_array`); it keeps ``owner``
alive as long as it, or an array made over it, lives. ``plain_pairs(pairs, array_type,
dtype, shape)`` counts the leading ``(key, value)`` pairs of ``pairs`` whose arrays are
both exactly of ``array_type``, of ``dtype`` (that very object), of ``shape``, writable and
C-contiguous (a batch get's check of its outputs before it reads: 64 pairs in 66 us
through numpy's attributes on this project's VM). ``plain_pair(key, value, dtype, shape)``
says whether both are exactly numpy arrays of ``dtype`` (that very object) and ``shape``,
whatever their layout (a put's and a get's first check of its arrays: the small-block hot
paths' candidates; numpy keeps one dtype object of each built-in and registered dtype, and
arrays of another equal one take the full path). ``overlapping(buffers)`` says whether the
byte ranges of any two of ``buffers`` overlap (device memory is not looked at); the copies
out refuse outputs that overlap each other.

They are the compiled ``_hostcopy`` module when the install built it (``make install``
does, with the machine's C compiler): a 4 KiB block's two copies cost 0.18 us against
1.1 us through memoryview slices on this project's VM, and copies of 256 KiB and more
are made with the interpreter lock released, so other threads run meanwhile (a batch
call's copies as one stretch once they add up to 256 KiB). Without it
(no compiler, another Python) the versions below do the same, slower. :data:`COMPILED`
says which is in use.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidBlock

#: The most buffers one call copies (a block's key and value, or a few parts of them).
MAX_BUFFERS = 8

#: What taking a flat byte view of a buffer raises when it has none (no buffer protocol,
#: strided, a format memoryview cannot cast, read-only where writing).
_NO_BYTE_VIEW = (TypeError, ValueError, BufferError, NotImplementedError)


def _byte_view(buffer: Any) -> memoryview:
    """``buffer``'s bytes as a flat memoryview (one of :data:`_NO_BYTE_VIEW` if it has none)."""
    if type(buffer) is not np.ndarray:
        return memoryview(buffer).cast("B")
    try:
        return buffer.data.cast("B")
    except _NO_BYTE_VIEW:  # a format memoryview cannot cast (bfloat16, fp8): its bytes as uint8
        return buffer.view(np.uint8).data.cast("B")


def _byte_views(buffers: Sequence[Any], writable: bool) -> list[memoryview] | None:
    if len(buffers) > MAX_BUFFERS:
        return None
    try:
        views = [_byte_view(b) for b in buffers]
    except _NO_BYTE_VIEW:
        return None
    if writable and any(v.readonly for v in views):
        return None
    return views


def _check_range(slab: memoryview, pos: int, last: int) -> None:
    if pos < 0 or last < pos or last > slab.nbytes:
        raise ValueError(f"slab range [{pos}, {last}) outside a slab of {slab.nbytes} bytes")


def _copy_python(slab: memoryview, pos: int, last: int, buffers: Sequence[Any], *, out: bool) -> bool:
    """The fallbacks' body: slab -> ``buffers`` with ``out``, else ``buffers`` -> slab."""
    _check_range(slab, pos, last)
    views = _byte_views(buffers, writable=out)
    if views is None or sum(v.nbytes for v in views) != last - pos or (out and overlapping_python(views)):
        return False
    for view in views:
        end = pos + view.nbytes
        if out:
            view[:] = slab[pos:end]
        else:
            slab[pos:end] = view
        pos = end
    return True


def copy_out_python(slab: memoryview, pos: int, last: int, outs: Sequence[Any], share: bool = False,
                    stream: bool = False) -> bool:
    """:func:`copy_out` through memoryview slices (the fallback: on this thread, through
    the cache, whatever ``share`` and ``stream``)."""
    return _copy_python(slab, pos, last, outs, out=True)


def copy_in_python(slab: memoryview, pos: int, last: int, parts: Sequence[Any], share: bool = False,
                   stream: bool = False) -> bool:
    """:func:`copy_in` through memoryview slices (the fallback: on this thread, through
    the cache, whatever ``share`` and ``stream``)."""
    return _copy_python(slab, pos, last, parts, out=False)


def _copy_many_python(slab: memoryview, jobs: Sequence[tuple[int, int, Sequence[Any]]], *, out: bool) -> list[bool]:
    """The batch fallbacks' body: :func:`_copy_python` of each job, every range checked
    before a byte moves, as the compiled ones do."""
    for pos, last, _ in jobs:
        _check_range(slab, pos, last)
    return [_copy_python(slab, pos, last, buffers, out=out) for pos, last, buffers in jobs]


def copy_out_many_python(slab: memoryview, jobs: Sequence[tuple[int, int, Sequence[Any]]],
                         share: bool = False, stream: bool = False) -> list[bool]:
    """:func:`copy_out_many` through memoryview slices per job (the fallback: on this
    thread, through the cache, whatever ``share`` and ``stream``)."""
    return _copy_many_python(slab, jobs, out=True)


def copy_in_many_python(slab: memoryview, jobs: Sequence[tuple[int, int, Sequence[Any]]],
                        share: bool = False, stream: bool = False) -> list[bool]:
    """:func:`copy_in_many` through memoryview slices per job (the fallback: on this
    thread, through the cache, whatever ``share`` and ``stream``)."""
    return _copy_many_python(slab, jobs, out=False)


_OWNING_ARRAYS: dict[int, type] = {}  # nbytes -> a ctypes char array type that can hold an owner


def memory_at_python(address: int, nbytes: int, writable: bool, owner: Any) -> memoryview:
    """:func:`memory_at` through ctypes (the fallback): a memoryview whose ctypes array
    holds ``owner``."""
    if nbytes < 0 or (not address and nbytes):
        raise ValueError(f"no memory of {nbytes} bytes at address {address:#x}")
    kind = _OWNING_ARRAYS.get(nbytes)
    if kind is None:
        kind = _OWNING_ARRAYS[nbytes] = type("OwnedBytes", (ctypes.c_char * nbytes,), {})
    memory = kind.from_address(address)
    memory.owner = owner
    view = memoryview(memory).cast("B")
    return view if writable else view.toreadonly()


def helper_pieces_python() -> int:
    """:func:`helper_pieces` without the compiled module: no copy is shared."""
    return 0


def streamed_copies_python() -> int:
    """:func:`streamed_copies` without the compiled module: no copy streams."""
    return 0


def plain_pair_python(key: Any, value: Any, dtype: Any, shape: tuple[int, ...]) -> bool:
    """:func:`plain_pair` through numpy's attributes (the fallback)."""
    return (type(key) is np.ndarray and type(value) is np.ndarray and key.dtype is dtype and value.dtype is dtype
            and key.shape == shape and value.shape == shape)


def plain_pairs_python(pairs: Sequence[Any], array_type: type, dtype: Any, shape: tuple[int, ...]) -> int:
    """:func:`plain_pairs` through numpy's attributes (the fallback)."""
    for i, pair in enumerate(pairs):
        if type(pair) not in (tuple, list) or len(pair) != 2 or not all(
                type(a) is array_type and a.dtype is dtype and a.shape == shape
                and a.flags.writeable and a.flags.c_contiguous for a in pair):
            return i
    return len(pairs)


def overlapping_python(buffers: Sequence[Any]) -> bool:
    """:func:`overlapping` through numpy's array interface (the fallback)."""
    ranges = []
    for buffer in buffers:
        try:
            array = np.frombuffer(_byte_view(buffer), dtype=np.uint8)
        except _NO_BYTE_VIEW:  # no host buffer (device memory): not looked at
            continue
        if array.nbytes:
            start = array.__array_interface__["data"][0]
            ranges.append((start, start + array.nbytes))
    ranges.sort()
    return any(start < end for (_, end), (start, _) in zip(ranges, ranges[1:]))


try:
    from ._hostcopy import (STREAM_MIN, copy_in, copy_in_many, copy_out, copy_out_many, helper_pieces, memory_at,
                            overlapping, plain_pair, plain_pairs, streamed_copies)
    COMPILED = True
except ImportError:  # not built here: the Python versions
    copy_in, copy_out, memory_at = copy_in_python, copy_out_python, memory_at_python
    copy_out_many, copy_in_many, helper_pieces = copy_out_many_python, copy_in_many_python, helper_pieces_python
    streamed_copies = streamed_copies_python
    STREAM_MIN = 16 << 10  # what the compiled copies stream from (the fallbacks never stream)
    plain_pair, plain_pairs = plain_pair_python, plain_pairs_python
    overlapping = overlapping_python
    COMPILED = False


def refuse_overlaps(outs: Sequence[Any], what: str) -> None:
    """:class:`InvalidBlock` when any two of the output buffers ``outs`` overlap: reads into
    them would mix blocks' bytes, and a file-tier record read into them would fail its
    checksum (and be dropped as corrupt)."""
    if overlapping(outs):
        raise InvalidBlock(f"{what}: output buffers overlap; give each block's key and value room of their own")
