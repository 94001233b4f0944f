"""GPU tier: blocks in one device-memory slab per GPU, through an array module.

With cupy and a visible GPU the slab is ``cupy.empty`` device memory. The same code runs
with numpy as the array module (a host slab): that is how this project's tests exercise
it, since its build machines have no GPU. Inputs and outputs may be host or device buffers
of any kind :mod:`cascade.buffers` accepts (device-to-device copies with cupy).
"""
from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

import numpy as np

from .. import buffers
from .base import Memory, TierKind
from .slab_tier import SlabTier

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


class GpuTier(SlabTier):
    """A ``capacity``-byte slab allocated with ``xp`` (cupy on a GPU, numpy in tests)."""

    name = "gpu"
    kind = TierKind.GPU
    memory = Memory.DEVICE

    def __init__(self, capacity: int, xp: ModuleType, *, device: int = 0, verify: bool = False) -> None:
        super().__init__(capacity, verify=verify)
        self.xp = xp
        self.device = device
        if xp.__name__ == "cupy":
            with xp.cuda.Device(device):
                self._slab = xp.empty(capacity, dtype=xp.uint8)
        else:
            self._slab = xp.empty(capacity, dtype=np.uint8)
        slab = buffers.view(self._slab, "GPU tier slab")
        # where the slab is device memory (or stands in for it: __cuda_array_interface__)
        self._base: int | None = slab.ptr if isinstance(slab, buffers.DeviceView) else None

    # Every copy goes through cascade.buffers: device <-> device, host <-> device (device
    # slab) or host <-> host (numpy slab), whatever the caller's buffer is. Free room and
    # committed blocks have nothing pending: a copy in runs on the part's own stream, a
    # copy out on the output's.
    def _region(self, offset: int, length: int) -> Any:
        # on a device slab made straight from its address: slicing a cupy array and
        # reading its interface cost about 10 us a copy, more than a small copy itself
        if self._base is not None:
            return buffers.DeviceView(self._base + offset, length, self.device, None, False, self._slab)
        return self._slab[offset:offset + length]

    def _slab_view(self, offset: int, length: int) -> Any:
        return self._slab[offset:offset + length]  # checksums stage it through the pinned arena

    def _slab_array(self) -> Any:
        return self._slab

    def close(self) -> None:
        self._index.clear()
        self._slab = self.xp.empty(0, dtype=self.xp.uint8)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "array_module": self.xp.__name__, "device": self.device}
