"""Clients read blocks in place: the rank's SHM slab, mapped read-only by its clients.

At connect the rank hands each client a read-only descriptor of its SHM tier's slab (the
tier's file in ``/dev/shm/cascade-<uid>/``, reopened read-only through ``/proc``, so the
client cannot write through it; it could open the file itself anyway: same user, 0600).
A read then costs one copy, slab -> the client's buffer: the rank takes a lease on each
block (:meth:`cascade.store.CascadeStore.view`), answers with where its bytes sit in the
slab, and gives the leases back at the client's next request or when it hangs up (killed
included), so an evicted or deleted block's bytes stay in place while the client reads.
Blocks outside the slab (file tier, other ranks) come through the staging region as before.
"""
from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from ..models import BlockSpec
from ..tiers.shm import ShmTier


class SlabWindow:
    """Rank side: where a leased array lies in ``store``'s SHM slab (no slab: ``nbytes``
    is 0 and nothing lies in it). Thread-safe (read-only)."""

    def __init__(self, store: Any) -> None:
        tier = next((t for t in store.tiers if isinstance(t, ShmTier) and t.capacity > 0), None)
        self._tier = tier
        self.nbytes = tier.capacity if tier is not None else 0
        self._base = tier._slab_array().ctypes.data if tier is not None else 0

    def read_only_fd(self) -> int | None:
        """A new read-only descriptor of the slab (the caller closes it), or None: the
        tier's open file reopened through ``/proc``, so it works once its name is gone
        (removed by ``RemoveIPC`` or a ``/dev/shm`` cleaner). ``OSError`` when it cannot."""
        fd = self._tier.fd if self._tier is not None else None
        if fd is None:  # no slab, or the store is closed
            return None
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)

    def offset(self, array: Any) -> int | None:
        """Byte offset of C-contiguous numpy ``array`` in the slab, or None if it lies elsewhere."""
        if self._tier is None or not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            return None
        offset = array.__array_interface__["data"][0] - self._base
        return offset if 0 <= offset and offset + array.nbytes <= self.nbytes else None


class SlabMap:
    """Client side: the rank's slab mapped read-only from descriptor ``fd`` (not kept)."""

    def __init__(self, fd: int, nbytes: int, spec: BlockSpec) -> None:
        self.spec, self.nbytes = spec, nbytes
        self._map = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
        self._raw = np.frombuffer(self._map, dtype=np.uint8)

    def holds(self, array: Any) -> bool:
        """Whether ``array`` (a numpy array) may lie in the slab: an array of ``views()``."""
        return type(array) is np.ndarray and np.may_share_memory(array, self._raw)

    def pair(self, key_offset: int, value_offset: int) -> tuple[np.ndarray, np.ndarray]:
        """Read-only (key, value) arrays of the spec over the slab at the given offsets."""
        half = self.spec.half_bytes
        if not (0 <= key_offset <= self.nbytes - half and 0 <= value_offset <= self.nbytes - half):
            raise ValueError(f"offsets {key_offset}, {value_offset} outside the {self.nbytes}-byte slab")
        return tuple(self._raw[o:o + half].view(self.spec.np_dtype).reshape(self.spec.shape)
                     for o in (key_offset, value_offset))  # type: ignore[return-value]

    def close(self) -> None:
        self._raw = None  # type: ignore[assignment]
        try:
            self._map.close()
        except BufferError:  # a view outlives us: the mapping goes with it
            pass
