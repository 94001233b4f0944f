"""Device-buffer stand-ins that run without a GPU, for tests of the device code paths.

:class:`HostCudaArray` exposes host memory through ``__cuda_array_interface__`` (v3, with
a stream), so :mod:`cascade.buffers` treats it exactly as a CUDA array (and
:class:`HostDeviceModule` makes a GPU tier's slab of it);
:class:`HostMemoryCopier` is a device copier (the interface :class:`~cascade.buffers.CupyCopier`
implements) that copies such memory with ``memmove`` and records each call; its "pinned"
memory is plain host memory it counts, so tests see which copies were staged.
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..buffers.copy import Direction


class HostCudaArray:
    """A CUDA-array-interface object over ``array``'s host memory (kept alive)."""

    def __init__(self, array: np.ndarray, *, stream: int | None = None, readonly: bool = False) -> None:
        self.array, self.stream, self.readonly = array, stream, readonly

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        a = self.array
        return {"shape": a.shape, "typestr": a.dtype.str,
                "strides": None if a.flags.c_contiguous else a.strides,
                "data": (a.ctypes.data, self.readonly), "version": 3, "stream": self.stream}


class HostDeviceSlab(HostCudaArray):
    """A GPU tier's slab in host memory seen as device memory: sliced, viewed and
    reshaped as a cupy array is (each a new stand-in over the same memory)."""

    def __getitem__(self, index: slice) -> "HostDeviceSlab":
        return HostDeviceSlab(self.array[index])

    def view(self, dtype: Any) -> "HostDeviceSlab":
        return HostDeviceSlab(self.array.view(dtype))

    def reshape(self, shape: tuple[int, ...]) -> "HostDeviceSlab":
        return HostDeviceSlab(self.array.reshape(shape))


class HostDeviceModule:
    """An array module for a GPU tier (``CascadeStore(..., array_module=HostDeviceModule())``)
    whose slab is a :class:`HostDeviceSlab`: every copy in and out of it goes through the
    device copier, as with cupy."""

    __name__ = "host-device"
    uint8 = np.uint8

    @staticmethod
    def empty(n: int, dtype: Any = np.uint8) -> HostDeviceSlab:
        return HostDeviceSlab(np.zeros(n, dtype))


class HostMemoryCopier:
    """A device copier for :class:`HostCudaArray` memory: ``memmove`` at enqueue time.
    ``calls`` records ``(direction, nbytes, stream)`` per copy (``pointers`` their
    ``(dst, src)``), ``synced`` each stream synchronised, ``pinned_allocs`` the sizes
    of pinned allocations, ``registered`` the ranges registered now (``unregistered``
    those given back); ``fail`` makes the next copy raise it, ``fail_sync`` the next
    synchronisation (fault injection)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Direction, int, int]] = []
        self.pointers: list[tuple[int, int]] = []
        self.synced: list[int] = []
        self.events = 0
        self.pinned_allocs: list[int] = []
        self.registered: dict[int, int] = {}
        self.unregistered: list[int] = []
        self.fail: BaseException | None = None
        self.fail_sync: BaseException | None = None
        self.fail_register: BaseException | None = None

    def memcpy_async(self, dst: int, src: int, nbytes: int, direction: Direction, stream: int,
                     device: int | None) -> None:
        if self.fail is not None:
            error, self.fail = self.fail, None
            try:
                raise error
            finally:
                del error  # no frame -> exception -> traceback -> frame cycle keeping buffers alive
        ctypes.memmove(dst, src, nbytes)
        self.calls.append((direction, nbytes, stream))
        self.pointers.append((dst, src))

    def synchronize(self, stream: int, device: int | None) -> None:
        if self.fail_sync is not None:
            error, self.fail_sync = self.fail_sync, None
            try:
                raise error
            finally:
                del error
        self.synced.append(stream)

    def record_event(self, stream: int, device: int | None) -> int:
        self.events += 1
        return self.events

    def wait_event(self, event: int) -> None:
        pass  # memmove is done at enqueue time

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        self.pinned_allocs.append(nbytes)
        return np.empty(nbytes, dtype=np.uint8)

    def register_host(self, ptr: int, nbytes: int) -> None:
        if self.fail_register is not None:
            raise self.fail_register
        self.registered[ptr] = nbytes

    def unregister_host(self, ptr: int) -> None:
        del self.registered[ptr]
        self.unregistered.append(ptr)
