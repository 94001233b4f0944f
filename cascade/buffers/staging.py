"""Pinned host memory for host <-> device copies (DESIGN.md 3a): one staging arena, and
host ranges (the SHM slab) registered with the CUDA driver once.

A copy between device memory and *pageable* host memory runs at a fraction of the PCIe
speed, and pinning per call costs more than the copy. So:

- :class:`StagingArena` is pinned once (lazily, by the first copy that needs it, through
  the device copier's ``alloc_pinned``) and sub-allocated: a lease is a slice of it,
  taken and given back in a ``with`` block. Thread-safe; a lease that does not fit waits
  for room a bounded time, then the caller falls back to its own memory (counted).
- :class:`PinnableRanges` holds host ranges that may be registered with the driver (the
  SHM slab): registered on the first device copy that touches one, unregistered when
  its owner forgets it. A range whose registration fails is staged instead (logged once).

Neither imports cupy: everything goes through the device copier
(:func:`cascade.buffers.device_copier`).
"""
from __future__ import annotations

import bisect
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import TierFull
from ..tiers.slab import SlabAllocator

log = logging.getLogger(__name__)

DEFAULT_ARENA_BYTES = 64 << 20
WAIT_S = 1.0  # longest wait for room in the arena before a caller uses its own memory


class StagingArena:
    """``nbytes`` of pinned host memory, allocated on first use by ``copier.alloc_pinned``
    and handed out in slices. ``stats`` counts allocations (at most one), leases, waits
    and fallbacks (no room within :data:`WAIT_S`, or a request larger than the arena)."""

    def __init__(self, copier: Any, nbytes: int = DEFAULT_ARENA_BYTES) -> None:
        if nbytes <= 0:
            raise ValueError(f"a staging arena needs a positive size, got {nbytes}")
        self.nbytes = nbytes
        self._copier = copier
        self._room = threading.Condition()
        self._memory: np.ndarray | None = None
        self._alloc = SlabAllocator(nbytes)
        self.stats = {"allocations": 0, "leases": 0, "waits": 0, "fallbacks": 0}

    @property
    def memory(self) -> np.ndarray | None:
        """The pinned bytes (None until first used)."""
        return self._memory

    def contains(self, ptr: int, nbytes: int) -> bool:
        """Whether ``[ptr, ptr + nbytes)`` lies inside the arena."""
        mem = self._memory
        if mem is None:
            return False
        start = int(mem.ctypes.data)
        return start <= ptr and ptr + nbytes <= start + self.nbytes

    @contextlib.contextmanager
    def lease(self, nbytes: int, *, wait_s: float = WAIT_S) -> Iterator[np.ndarray | None]:
        """A pinned ``uint8`` slice of ``nbytes`` for the ``with`` block, or None (counted
        as a fallback) when the arena is smaller or stays full for ``wait_s``."""
        offset = self._take(nbytes, wait_s)
        if offset is None:
            yield None
            return
        try:
            yield self._memory[offset:offset + nbytes]
        finally:
            with self._room:
                self._alloc.free(offset, nbytes)
                self._room.notify_all()

    def _take(self, nbytes: int, wait_s: float) -> int | None:
        with self._room:
            if self._memory is None:
                self._memory = self._copier.alloc_pinned(self.nbytes)
                self.stats["allocations"] += 1
            if nbytes > self.nbytes:
                self.stats["fallbacks"] += 1
                return None
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    offset = self._alloc.alloc(nbytes)
                except TierFull:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.stats["fallbacks"] += 1
                        return None
                    self.stats["waits"] += 1
                    self._room.wait(left)
                    continue
                self.stats["leases"] += 1
                return offset


@dataclass(eq=False)
class _Range:
    start: int
    nbytes: int
    owner: Any  # keeps the memory mapped while registered
    state: str = "pending"  # pending -> registered | failed
    copier: Any = field(default=None)


class PinnableRanges:
    """Host ranges to register with the CUDA driver on first device use. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._ranges: dict[int, _Range] = {}

    def add(self, array: np.ndarray) -> _Range | None:
        """Note ``array``'s memory (C-contiguous host bytes) as registrable; the token to
        :meth:`forget` it with. Nothing is registered yet. None for an empty array."""
        if not array.nbytes:
            return None
        r = _Range(int(array.ctypes.data), int(array.nbytes), array)
        with self._lock:
            bisect.insort(self._starts, r.start)
            self._ranges[r.start] = r
        return r

    def pinned(self, ptr: int, nbytes: int, copier: Any) -> bool:
        """Whether ``[ptr, ptr + nbytes)`` lies in a range registered with the driver,
        registering that range now (through ``copier.register_host``) on first use."""
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            if i < 0:
                return False
            r = self._ranges[self._starts[i]]
            if ptr + nbytes > r.start + r.nbytes:
                return False
            if r.state == "pending":
                try:
                    copier.register_host(r.start, r.nbytes)
                except Exception as exc:  # e.g. the driver cannot pin that much: stage instead
                    log.warning("could not register %d bytes of host memory with the CUDA driver (%s): "
                                "device copies of it go through the staging arena", r.nbytes, exc)
                    r.state = "failed"
                else:
                    r.state, r.copier = "registered", copier
            return r.state == "registered"

    def forget(self, token: _Range | None) -> None:
        """Drop a range (unregistering it if it was registered). Call before unmapping."""
        if token is None:
            return
        with self._lock:
            if self._ranges.get(token.start) is not token:
                return
            del self._ranges[token.start]
            self._starts.remove(token.start)
            registered, token.state = token.state == "registered", "forgotten"
        if registered:
            try:
                token.copier.unregister_host(token.start)
            except Exception as exc:  # the context may be gone at exit: the mapping goes anyway
                log.debug("cudaHostUnregister failed: %s", exc)
        token.owner = None
