"""Device-buffer stand-ins that run without a GPU, for tests of the device code paths.

:class:`HostCudaArray` exposes host memory through ``__cuda_array_interface__`` (v3, with
a stream), so :mod:`cascade.buffers` treats it exactly as a CUDA array;
:class:`HostMemoryCopier` is a device copier (the interface :class:`~cascade.buffers.CupyCopier`
implements) that copies such memory with ``memmove`` and records each call.
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


class HostMemoryCopier:
    """A device copier for :class:`HostCudaArray` memory: ``memmove`` at enqueue time.
    ``calls`` records ``(direction, nbytes, stream)`` per copy, ``synced`` each stream
    synchronised; ``fail`` makes the next copy raise it (fault injection)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Direction, int, int]] = []
        self.synced: list[int] = []
        self.fail: BaseException | None = None

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

    def synchronize(self, stream: int, device: int | None) -> None:
        self.synced.append(stream)
