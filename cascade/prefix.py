"""Token-prefix block ids: the ids a serving engine can compute before any KV exists.

Block ``i`` of a token sequence gets the id::

    id_i = BLAKE3(b"cascade-prefix/1" || fingerprint (16 bytes) || id_{i-1} (16 bytes)
                  || tokens[i*B:(i+1)*B] as little-endian uint32)[:32 hex]

with ``id_{-1}`` = ``parent`` (16 zero bytes for the start of a sequence). So an id names
the whole prefix up to the end of its block, equal prefixes give equal ids whichever batch
computed them, and ids are chained like vLLM's, LMCache's and SGLang's block hashes. Only
full blocks get ids: a partial last block is recomputed, not cached.

The fingerprint (:class:`ModelFingerprint`) binds ids to the model, its revision (weights),
the KV dtype and layout and the tensor-parallel shard: changed weights or a different
shard never find stale KV under the same tokens. The KV bytes themselves are not hashed;
their integrity is guarded by the tiers' record checksums.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property

import blake3
import numpy as np

from .errors import InvalidBlock
from .identity import ID_BYTES, check_id

_DOMAIN = b"cascade-prefix/1"
_TOKEN_DTYPE = np.dtype("<u4")
_ROOT = bytes(ID_BYTES)


@dataclass(frozen=True)
class ModelFingerprint:
    """What makes KV of equal tokens equal: model, weights revision, KV dtype, KV layout
    and the tensor/pipeline-parallel shard. ``extra`` takes anything else that changes
    the KV (a LoRA adapter, a KV quantisation scheme, a RoPE scaling).

    Raises :class:`InvalidBlock` for an empty model or a bad shard.
    """

    model: str
    revision: str
    dtype: str
    layout: str = ""
    tp_size: int = 1
    tp_rank: int = 0
    pp_rank: int = 0
    extra: str = ""

    def __post_init__(self) -> None:
        for name in ("model", "revision", "dtype", "layout", "extra"):
            if not isinstance(getattr(self, name), str):
                raise InvalidBlock(f"model fingerprint {name}: expected a string, got {getattr(self, name)!r}")
        if not self.model or not self.revision or not self.dtype:
            raise InvalidBlock("model fingerprint: model, revision and dtype must be non-empty "
                               "(the revision is what keeps KV of old weights from being reused)")
        for name in ("tp_size", "tp_rank", "pp_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidBlock(f"model fingerprint {name}: expected an integer >= 0, got {value!r}")
        if self.tp_size < 1 or self.tp_rank >= self.tp_size:
            raise InvalidBlock(f"model fingerprint: need 0 <= tp_rank < tp_size, got {self.tp_rank}, {self.tp_size}")

    @cached_property
    def digest(self) -> bytes:
        """16 bytes: BLAKE3 of the fields as canonical JSON."""
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return blake3.blake3(b"cascade-model/1\0" + text.encode()).digest()[:ID_BYTES]

    @property
    def hex(self) -> str:
        return self.digest.hex()


def model_fingerprint(model: str, revision: str, dtype: str, *, layout: str = "", tp_size: int = 1,
                      tp_rank: int = 0, pp_rank: int = 0, extra: str = "") -> ModelFingerprint:
    """A :class:`ModelFingerprint`; e.g. ``model_fingerprint("meta-llama/Llama-3-8B",
    "<commit sha>", "float16", layout="vllm", tp_size=4, tp_rank=0)``."""
    return ModelFingerprint(model, revision, dtype, layout, tp_size, tp_rank, pp_rank, extra)


def token_array(token_ids) -> np.ndarray:
    """``token_ids`` (a sequence or 1-D integer array) as little-endian uint32 (copy only
    if needed). :class:`InvalidBlock` for non-integers or ids outside [0, 2**32)."""
    arr = np.asarray(token_ids)
    if arr.size == 0:
        return np.empty(0, _TOKEN_DTYPE)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise InvalidBlock(f"token_ids: expected a 1-D sequence of integers, got {arr.dtype} of shape {arr.shape}")
    if arr.dtype != _TOKEN_DTYPE and (int(arr.min()) < 0 or int(arr.max()) >= 1 << 32):
        raise InvalidBlock("token_ids: every id must be in [0, 2**32)")
    return np.ascontiguousarray(arr, dtype=_TOKEN_DTYPE)


def prefix_ids(token_ids, *, block_tokens: int, model_fingerprint: ModelFingerprint,
               parent: str | None = None) -> list[str]:
    """Chained ids of the full ``block_tokens``-token blocks of ``token_ids`` (see the
    module docstring); ``parent`` is the id of the block just before ``token_ids[0]``
    (to extend a sequence). ``len(token_ids) // block_tokens`` ids. About 1 us per block
    plus BLAKE3 over the token bytes. Local, thread-safe.
    """
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise InvalidBlock(f"block_tokens: expected an integer >= 1, got {block_tokens!r}")
    if not isinstance(model_fingerprint, ModelFingerprint):
        raise InvalidBlock("model_fingerprint: pass a cascade.ModelFingerprint (cascade.model_fingerprint(...)), "
                           f"got {type(model_fingerprint).__name__}")
    tokens = token_array(token_ids)
    prev = _ROOT if parent is None else bytes.fromhex(check_id(parent))
    head = _DOMAIN + model_fingerprint.digest
    data = memoryview(tokens).cast("B")
    step = block_tokens * _TOKEN_DTYPE.itemsize
    ids: list[str] = []
    for start in range(0, (len(tokens) // block_tokens) * step, step):
        h = blake3.blake3(head)
        h.update(prev)
        h.update(data[start:start + step])
        prev = h.digest()[:ID_BYTES]
        ids.append(prev.hex())
    return ids


def chain(ids: Sequence[str], parent: str | None = None) -> list[tuple[str, str | None]]:
    """``(id, parent id)`` pairs of a chain from :func:`prefix_ids` (for ``put(parent=)``)."""
    return list(zip(ids, [parent, *ids[:-1]]))
