"""Fresh arrays of the caller's kind: what ``CascadeStore.get(id, like=...)`` returns.

``like`` names a kind by example: a numpy array (or None) gives numpy arrays, a torch
tensor gives torch tensors on its device (CPU or that CUDA device), a cupy array gives
cupy arrays on its device. Only the example's library and device matter, not its shape
or dtype. torch and cupy are used only when the example is one of theirs. Local.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidBlock
from .views import is_torch_tensor

_KINDS = "a numpy array, a torch tensor (CPU or CUDA) or a cupy array"


def empty_like_kind(like: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """An uninitialised C-contiguous array of ``shape`` and ``dtype`` of ``like``'s kind.
    :class:`InvalidBlock` for another kind of example, or a dtype its library lacks."""
    if like is None or isinstance(like, np.ndarray):
        return np.empty(shape, dtype=dtype)
    module = type(like).__module__
    if is_torch_tensor(like):
        import torch

        torch_dtype = getattr(torch, dtype.name, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise InvalidBlock(f"like=: torch has no dtype {dtype.name}: pass a numpy example and convert")
        return torch.empty(shape, dtype=torch_dtype, device=like.device)
    if module.startswith("cupy"):
        import cupy

        with cupy.cuda.Device(like.device.id):
            try:
                return cupy.empty(shape, dtype=dtype)
            except (TypeError, ValueError) as exc:  # e.g. a dtype cupy does not support
                raise InvalidBlock(f"like=: cupy cannot hold dtype {dtype.name} ({exc}): pass a torch tensor "
                                   "example, or read into your own buffers with get_into") from None
    raise InvalidBlock(f"like= takes {_KINDS}, got a {type(like).__name__} (read into buffers of other kinds "
                       "with get_into)")
