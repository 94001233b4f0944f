"""GPU tier: blocks in one device-memory slab per GPU, through an array module.

With cupy and a visible GPU the slab is ``cupy.empty`` device memory. The same code runs
with numpy as the array module (a host slab): that is how this project's tests exercise
it, since its build machines have no GPU. Inputs and outputs may be host buffers or, with
cupy, device arrays (device-to-device copies).
"""
from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

import numpy as np

from .base import Memory, TierKind
from .slab_tier import SlabTier, _nbytes

log = logging.getLogger(__name__)


def cupy_module() -> ModuleType | None:
    """cupy when it is installed and a GPU is usable, else None (with a log line why)."""
    try:
        import cupy
    except ImportError:
        log.info("GPU tier off: cupy is not installed (pip install 'cascade-kv[gpu]')")
        return None
    try:
        available = cupy.is_available()
    except Exception as exc:  # driver/runtime errors surface here on broken installs
        log.info("GPU tier off: cupy.is_available() failed: %s", exc)
        return None
    if not available:
        log.info("GPU tier off: cupy.is_available() is false (no usable GPU)")
        return None
    return cupy


def _is_device(buf: Any) -> bool:
    return hasattr(buf, "__cuda_array_interface__")


class GpuTier(SlabTier):
    """A ``capacity``-byte slab allocated with ``xp`` (cupy on a GPU, numpy in tests)."""

    name = "gpu"
    kind = TierKind.GPU
    memory = Memory.DEVICE

    def __init__(self, capacity: int, xp: ModuleType, *, device: int = 0, verify: bool = False) -> None:
        super().__init__(capacity, verify=verify)
        self.xp = xp
        self.device = device
        self._on_gpu = xp.__name__ == "cupy"
        if self._on_gpu:
            with xp.cuda.Device(device):
                self._slab = xp.empty(capacity, dtype=xp.uint8)
        else:
            self._slab = xp.empty(capacity, dtype=np.uint8)

    def _flat(self, buf: Any):
        if _is_device(buf):
            return buf.reshape(-1).view(self.xp.uint8)
        return np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)

    def _copy_in(self, offset: int, part: Any) -> int:
        n = _nbytes(part)
        src = self._flat(part)
        dst = self._slab[offset:offset + n]
        if self._on_gpu and not _is_device(part):
            dst.set(src)
        else:
            dst[...] = src
        return n

    def _copy_out(self, offset: int, out: Any) -> None:
        n = _nbytes(out)
        src = self._slab[offset:offset + n]
        if self._on_gpu and not _is_device(out):
            src.get(out=np.frombuffer(memoryview(out).cast("B"), dtype=np.uint8))
        else:
            self._flat(out)[...] = src

    def _slab_view(self, offset: int, length: int) -> Any:
        view = self._slab[offset:offset + length]
        return view.get() if self._on_gpu else view

    def close(self) -> None:
        self._index.clear()
        self._slab = self.xp.empty(0, dtype=self.xp.uint8)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "array_module": self.xp.__name__, "device": self.device}
