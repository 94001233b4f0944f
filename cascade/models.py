"""Model presets and KV block shapes (DESIGN.md section 2).

A block holds the K and V tensors of ``block_tokens`` consecutive tokens for all layers:
key and value each have shape ``(layers, kv_heads, block_tokens, head_dim)``.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .errors import ConfigError, InvalidBlock

PAGE = 4096


@dataclass(frozen=True)
class ModelPreset:
    """Attention geometry of one model (what a KV-cache block's size depends on)."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "float16"

    @property
    def bytes_per_token(self) -> int:
        """K plus V bytes of one token across all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * np.dtype(self.dtype).itemsize


MODEL_PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset("llama3-70b", layers=80, kv_heads=8, head_dim=128),  # 320 KiB/token
        ModelPreset("llama3-8b", layers=32, kv_heads=8, head_dim=128),  # 128 KiB/token
        ModelPreset("llama2-7b", layers=32, kv_heads=32, head_dim=128),  # 512 KiB/token (MHA)
        ModelPreset("tiny", layers=2, kv_heads=2, head_dim=16),  # 256 B/token, for tests
    )
}


@dataclass(frozen=True)
class BlockSpec:
    """Shape and dtype that every key and every value of a store must have."""

    shape: tuple[int, ...]
    dtype: str

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
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize

    @cached_property
    def block_bytes(self) -> int:
        """Bytes of key plus value."""
        return 2 * self.half_bytes

    def empty(self, xp=np):
        """A fresh uninitialised (key, value) pair of this spec, in array module ``xp``."""
        return xp.empty(self.shape, dtype=self.dtype), xp.empty(self.shape, dtype=self.dtype)

    def empty_aligned(self):
        """A (key, value) pair on page-aligned host memory: file-tier reads with O_DIRECT
        then land in them without a bounce copy (when ``half_bytes`` is a multiple of 4096)."""
        half = self.half_bytes
        stride = (half + PAGE - 1) // PAGE * PAGE
        buf = mmap.mmap(-1, 2 * stride)
        raw = np.frombuffer(buf, dtype=np.uint8)
        key = raw[:half].view(self.dtype).reshape(self.shape)
        value = raw[stride:stride + half].view(self.dtype).reshape(self.shape)
        return key, value

    def check(self, array, what: str) -> None:
        """Raise :class:`InvalidBlock` unless ``array`` has this shape and dtype and is C-contiguous."""
        shape = getattr(array, "shape", None)
        dtype = getattr(array, "dtype", None)
        if shape is None or dtype is None:
            raise InvalidBlock(f"{what} must be an array with shape {self.shape} and dtype {self.dtype}, got {type(array).__name__}")
        if tuple(shape) != self.shape:
            raise InvalidBlock(f"{what} has shape {tuple(shape)}, expected {self.shape}")
        if np.dtype(dtype) != np.dtype(self.dtype):
            raise InvalidBlock(f"{what} has dtype {dtype}, expected {self.dtype}")
        flags = getattr(array, "flags", None)
        if flags is not None and not flags["C_CONTIGUOUS"]:
            raise InvalidBlock(f"{what} is not C-contiguous; pass numpy.ascontiguousarray({what})")
