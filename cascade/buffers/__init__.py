"""Callers' buffers: the only part of Cascade that knows array libraries (DESIGN.md 3a).

Whatever a caller hands in (numpy arrays, torch tensors on CPU or CUDA, cupy arrays,
anything with the buffer protocol, ``__cuda_array_interface__`` or ``__dlpack__``) becomes
a host byte view (a flat ``uint8`` numpy array over the caller's memory) or a
:class:`DeviceView`, with one error type, :class:`~cascade.errors.InvalidBlock`, naming
the fix. :func:`copy` moves bytes between any two of them (:func:`copy_each` several, synchronised once), host ends through pinned
memory (:mod:`.staging`); :func:`one_sync` synchronises a batch once per stream;
:func:`empty_like_kind` makes arrays of a caller's kind. torch and cupy are imported only when the
caller's object is one of theirs (or a device copy needs cupy).
"""
from .alloc import empty_like_kind
from .batch import SyncBatch, one_sync
from .copy import (CupyCopier, DeviceCopier, copy, copy_each, device_copier, forget_pinnable, host_bytes, host_outputs,
                   host_views, register_pinnable, set_staging_bytes, staging_arena, staging_buffer,
                   use_device_copier)
from .dtypes import as_dtype, device_dtype, dtype_name
from .staging import StagingArena
from .views import (WRITABLE_C, ByteView, DeviceView, as_byte_view, check_layout, host_array, host_view, nbytes,
                    settled, shape_and_dtype, view)

__all__ = [
    "WRITABLE_C", "ByteView", "CupyCopier", "DeviceCopier", "DeviceView", "StagingArena", "SyncBatch", "as_byte_view",
    "as_dtype", "check_layout", "copy", "copy_each", "device_copier", "device_dtype", "dtype_name", "empty_like_kind", "forget_pinnable",
    "host_array", "host_bytes", "host_outputs", "host_view", "host_views", "nbytes", "one_sync", "register_pinnable",
    "set_staging_bytes", "settled", "shape_and_dtype", "staging_arena", "staging_buffer", "use_device_copier",
    "view",
]
