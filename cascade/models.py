"""Model presets and KV block shapes (DESIGN.md section 2).

A block holds the K and V tensors of ``block_tokens`` consecutive tokens for all layers:
key and value each have shape ``(layers, kv_heads, block_tokens, head_dim)``. Dtypes may
be named by numpy, torch, cupy or ml_dtypes (``"bfloat16"``, ``torch.float8_e4m3fn``...).
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from . import buffers
from .errors import ConfigError, InvalidBlock

PAGE = 4096


@dataclass(frozen=True)
class ModelPreset:
    """Attention geometry of one model (what a KV-cache block's size depends on).
    ``dtype`` is a name: ``"float16"``, ``"bfloat16"``, ``"float8_e4m3fn"``..."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "float16"

    @property
    def bytes_per_token(self) -> int:
        """K plus V bytes of one token across all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * buffers.as_dtype(self.dtype).itemsize


MODEL_PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset("llama3-70b", layers=80, kv_heads=8, head_dim=128),  # 320 KiB/token
        ModelPreset("llama3-8b", layers=32, kv_heads=8, head_dim=128),  # 128 KiB/token
        ModelPreset("llama2-7b", layers=32, kv_heads=32, head_dim=128),  # 512 KiB/token (MHA)
        ModelPreset("llama3-70b-bf16", layers=80, kv_heads=8, head_dim=128, dtype="bfloat16"),
        ModelPreset("llama3-8b-bf16", layers=32, kv_heads=8, head_dim=128, dtype="bfloat16"),
        ModelPreset("llama3-8b-fp8", layers=32, kv_heads=8, head_dim=128, dtype="float8_e4m3fn"),  # 64 KiB/token
        ModelPreset("tiny", layers=2, kv_heads=2, head_dim=16),  # 256 B/token, for tests
        ModelPreset("tiny-bf16", layers=2, kv_heads=2, head_dim=16, dtype="bfloat16"),
    )
}


@dataclass(frozen=True)
class BlockSpec:
    """Shape and dtype that every key and every value of a store must have. ``dtype``
    may be given as any dtype :func:`cascade.buffers.as_dtype` knows (numpy, torch, cupy,
    ml_dtypes or a name); it is kept as its canonical name."""

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        try:
            dtype = buffers.as_dtype(self.dtype)
        except InvalidBlock as exc:
            raise ConfigError(f"block dtype: {exc}") from None
        if dtype.byteorder not in "=|" or dtype.fields is not None or dtype.subdtype is not None:
            raise ConfigError(f"block dtype: {self.dtype!r} is not a plain native-endian element type")
        try:
            shape = tuple(int(n) for n in self.shape)
        except (TypeError, ValueError):
            raise ConfigError(f"block shape: a tuple of integers, got {self.shape!r}") from None
        if any(n < 0 for n in shape):
            raise ConfigError(f"block shape: no negative dimension, got {shape}")
        object.__setattr__(self, "dtype", dtype.name)
        object.__setattr__(self, "shape", shape)

    @classmethod
    def for_model(cls, model: str | ModelPreset, block_tokens: int) -> "BlockSpec":
        preset = MODEL_PRESETS.get(model) if isinstance(model, str) else model
        if preset is None:
            raise ConfigError(f"unknown model preset {model!r}; known: {sorted(MODEL_PRESETS)}")
        return cls((preset.layers, preset.kv_heads, block_tokens, preset.head_dim), preset.dtype)

    @classmethod
    def flat(cls, nbytes: int) -> "BlockSpec":
        """Key and value of ``nbytes // 2`` raw bytes each (benchmarks of raw block sizes)."""
        if nbytes < 2 or nbytes % 2:
            raise ConfigError(f"flat block size must be an even number of bytes >= 2, got {nbytes}")
        return cls((nbytes // 2,), "uint8")

    @cached_property
    def half_bytes(self) -> int:
        """Bytes of the key (and of the value)."""
        return int(np.prod(self.shape)) * self.np_dtype.itemsize

    @cached_property
    def np_dtype(self) -> np.dtype:
        """The element dtype as a numpy dtype (bfloat16 and float8 through ml_dtypes)."""
        return buffers.as_dtype(self.dtype)

    @cached_property
    def block_bytes(self) -> int:
        """Bytes of key plus value."""
        return 2 * self.half_bytes

    def empty(self, xp=np):
        """A fresh uninitialised (key, value) pair of this spec, in array module ``xp``."""
        dtype = self.np_dtype if xp is np else self.dtype
        return xp.empty(self.shape, dtype=dtype), xp.empty(self.shape, dtype=dtype)

    def empty_aligned(self):
        """A (key, value) pair on page-aligned host memory: file-tier reads with O_DIRECT
        then land in them without a bounce copy (when ``half_bytes`` is a multiple of 4096)."""
        half = self.half_bytes
        stride = (half + PAGE - 1) // PAGE * PAGE
        buf = mmap.mmap(-1, 2 * stride)
        raw = np.frombuffer(buf, dtype=np.uint8)
        key = raw[:half].view(self.np_dtype).reshape(self.shape)
        value = raw[stride:stride + half].view(self.np_dtype).reshape(self.shape)
        return key, value

    def check(self, array: Any, what: str, *, writable: bool = False) -> Any:
        """Raise :class:`InvalidBlock` (naming the fix) unless ``array`` (numpy, torch,
        cupy, or any object with the buffer protocol, ``__cuda_array_interface__`` or
        ``__dlpack__``) has this shape and dtype and is C-contiguous, and, with
        ``writable``, can be written. Returns what to copy to or from: a numpy array as
        it is, anything else as its byte view (:func:`cascade.buffers.view`), so that
        later copies do not read its interface again."""
        shape, dtype = buffers.shape_and_dtype(array, what)
        if shape != self.shape:
            raise InvalidBlock(f"{what} has shape {shape}, expected {self.shape}")
        if dtype != self.np_dtype:
            raise InvalidBlock(f"{what} has dtype {dtype.name}, expected {self.dtype}")
        checked = buffers.check_layout(array, what, writable=writable)
        return array if checked is None else checked
