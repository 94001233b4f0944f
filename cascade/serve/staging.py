"""A client's staging region: the shared memory block bytes cross through.

The rank creates it per client connection as an anonymous memory file
(``memfd_create``: no name in any directory, so nothing to guess, open or leak), sizes it,
maps it and hands the descriptor to the client over the Unix socket. The client maps the
same pages. It is freed when both sides have unmapped it (connection closed, or either
process died). The region is cut into slots of one block each (``stride`` bytes, page
aligned); slot ``i``'s key sits at ``i * stride``, its value right after.

A put through a client costs one copy more than the in-process store (client buffer ->
staging slot); so does a get of a block outside the rank's SHM slab. A get of a block in
the slab is copied straight out of it (:mod:`.slab_map`).
"""
from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..models import PAGE, BlockSpec

DEFAULT_STAGING_BYTES = 64 << 20
MAX_STAGING_BYTES = 16 << 30


def slot_stride(spec: BlockSpec) -> int:
    """Bytes of one slot: a block, rounded up to whole pages."""
    return -(-spec.block_bytes // PAGE) * PAGE


def check_size(nbytes: int, spec: BlockSpec) -> int:
    """The number of slots a region of ``nbytes`` holds; :class:`ConfigError` if it
    holds no block or exceeds :data:`MAX_STAGING_BYTES`."""
    if not 0 < nbytes <= MAX_STAGING_BYTES:
        raise ConfigError(f"staging_bytes must be in 1..{MAX_STAGING_BYTES}, got {nbytes}")
    slots = nbytes // slot_stride(spec)
    if slots < 1:
        raise ConfigError(f"staging_bytes={nbytes} holds no block of {spec.block_bytes} bytes "
                          f"(one slot is {slot_stride(spec)} bytes)")
    return slots


class Staging:
    """One mapped staging region of ``slots`` slots of ``spec`` blocks. Not thread-safe:
    its owner (one connection) uses one request's slots at a time."""

    def __init__(self, fd: int, spec: BlockSpec, slots: int) -> None:
        self.spec, self.slots, self.stride = spec, slots, slot_stride(spec)
        self.nbytes = slots * self.stride
        self._map = mmap.mmap(fd, self.nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._raw = np.frombuffer(self._map, dtype=np.uint8)

    @classmethod
    def create(cls, spec: BlockSpec, slots: int) -> tuple["Staging", int]:
        """A fresh region (rank side) and its descriptor (to send, then close)."""
        fd = os.memfd_create("cascade-staging", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, slots * slot_stride(spec))
            return cls(fd, spec, slots), fd
        except BaseException:
            os.close(fd)
            raise

    def pair(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        """(key, value) views of ``slot`` with the spec's shape and dtype."""
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} outside 0..{self.slots - 1}")
        half, start = self.spec.half_bytes, slot * self.stride
        key = self._raw[start:start + half].view(self.spec.np_dtype).reshape(self.spec.shape)
        value = self._raw[start + half:start + 2 * half].view(self.spec.np_dtype).reshape(self.spec.shape)
        return key, value

    def pairs(self, slots: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [self.pair(s) for s in slots]

    def holds(self, array: Any) -> bool:
        """Whether ``array`` (a numpy array) may lie in this region: a view of its slots
        (what a client's ``views()`` returns for a staged block)."""
        return type(array) is np.ndarray and np.may_share_memory(array, self._raw)

    def close(self) -> None:
        """Unmap (views still alive keep the pages until they go)."""
        self._raw = None  # type: ignore[assignment]
        try:
            self._map.close()
        except BufferError:  # a view outlives us: the mapping goes with it
            pass
