"""Element types by name, whichever library names them (numpy, torch, cupy, ml_dtypes).

bfloat16 and the float8 types have no numpy spelling of their own: ``ml_dtypes`` (the
package JAX uses) registers them with numpy, so ``numpy.dtype("bfloat16")`` works once it
is imported. torch dtypes are recognised by their module and mapped by name
(``torch.bfloat16`` -> ``"bfloat16"``) without importing torch.
"""
from __future__ import annotations

from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16, float8_* ... with numpy)
import numpy as np

from ..errors import InvalidBlock


def as_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype named by ``dtype``: a numpy/cupy dtype or scalar type, a string
    (``"float16"``, ``"bfloat16"``, ``"float8_e4m3fn"``), an ml_dtypes type or a torch
    dtype. :class:`InvalidBlock` when it names no dtype numpy knows."""
    if isinstance(dtype, np.dtype):
        return dtype
    if type(dtype).__module__ == "torch":
        dtype = str(dtype).removeprefix("torch.")
    try:
        return np.dtype(dtype)
    except TypeError:
        raise InvalidBlock(f"unknown dtype {dtype!r}: use a numpy, torch or ml_dtypes dtype, or a name "
                           "such as 'float16', 'bfloat16' or 'float8_e4m3fn'") from None


def device_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a cupy array of ``dtype``'s elements is given: ``dtype`` itself when it is
    one of numpy's own (cupy has those that fit a GPU), else (a type ml_dtypes registers:
    bfloat16, the float8 types, which not every cupy has) the unsigned integer of the
    same width, the same in every cupy, whose bytes a caller reinterprets, e.g.
    ``torch.as_tensor(a, device="cuda").view(torch.bfloat16)``."""
    return dtype if dtype.isbuiltin == 1 else np.dtype(f"u{dtype.itemsize}")


def dtype_name(dtype: Any) -> str:
    """The canonical name of ``dtype`` (``"float16"``, ``"bfloat16"``...)."""
    return as_dtype(dtype).name
