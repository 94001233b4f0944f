"""Copies between a host slab and a block's buffers: what a SHM tier's small-block
gets and puts (under the store's lock) and its leased reads into host arrays run.

``copy_out(slab, pos, last, outs)`` fills ``outs`` in order with slab bytes
``[pos, last)``; ``copy_in(slab, pos, last, parts)`` writes ``parts`` in order there. Each
returns True when the buffers took exactly that range, and False, having written
nothing, when one of them has no C-contiguous byte buffer (writable, for outputs), when
their sizes do not add up to the range, or when there are more than :data:`MAX_BUFFERS`
of them; a range outside the slab is a ValueError.

They are the compiled ``_slabcopy`` module when the install built it (``make install``
does, with the machine's C compiler): one call per block instead of a Python view and
slice per buffer (a 4 KiB block's two copies: 0.18 us against 1.1 us on this project's
VM), with copies of 256 KiB and more made with the interpreter lock released, so other
threads run meanwhile. Without it (no compiler, another Python) the memoryview versions
below do the same, slower. :data:`COMPILED` says which is in use.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

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


def copy_out_python(slab: memoryview, pos: int, last: int, outs: Sequence[Any]) -> bool:
    """:func:`copy_out` through memoryview slices (the fallback)."""
    _check_range(slab, pos, last)
    views = _byte_views(outs, writable=True)
    if views is None or sum(v.nbytes for v in views) != last - pos:
        return False
    for view in views:
        end = pos + view.nbytes
        view[:] = slab[pos:end]
        pos = end
    return True


def copy_in_python(slab: memoryview, pos: int, last: int, parts: Sequence[Any]) -> bool:
    """:func:`copy_in` through memoryview slices (the fallback)."""
    _check_range(slab, pos, last)
    views = _byte_views(parts, writable=False)
    if views is None or sum(v.nbytes for v in views) != last - pos:
        return False
    for view in views:
        end = pos + view.nbytes
        slab[pos:end] = view
        pos = end
    return True


try:
    from ._slabcopy import copy_in, copy_out
    COMPILED = True
except ImportError:  # not built here: the memoryview versions
    copy_in, copy_out = copy_in_python, copy_out_python
    COMPILED = False
