"""Cascade as an LMCache (0.5.x) storage plugin: LMCache and vLLM keep their engine and
put Cascade's tiers under it.

LMCache loads it through its ``StoragePluginInterface`` mechanism (LMCache config)::

    storage_plugins: ["cascade"]
    extra_config:
      storage_plugin.cascade.module_path: cascade.integrations.lmcache_backend
      storage_plugin.cascade.class_name: CascadeBackend
      cascade.shm_bytes: 8G            # any Cascade config key, prefixed "cascade."
      cascade.file_dir: /scratch/me/cascade

How chunks map onto Cascade:

* id: LMCache's key already names a token prefix (its ``chunk_hash`` is a chained hash of
  the chunk's tokens and every token before them) plus the model, world size, worker and
  KV dtype; the Cascade id is BLAKE3 of ``key.to_string()`` (32 hex). No KV bytes are
  hashed; the tiers' record checksums guard them.
* bytes: a block is a 256-byte header (magic, the chunk's shape, dtype, memory format and
  length, as JSON) followed by the chunk's bytes, padded to the block size (by default
  the bytes of a full chunk from LMCache's ``kv_shape`` and ``kv_dtype``, plus the
  header, rounded up to 4 KiB; ``cascade.block_bytes`` overrides it). A partial last
  chunk is padded; a chunk larger than a block is not stored (logged).
  Because the header travels with the bytes, a restarted worker reads its file tier back
  (warm restart) without any side index.
* namespace: ``cascade.namespace`` (default ``"lmcache"``). Puts are synchronous (done
  when ``batched_submit_put_task`` returns); ``pin``/``unpin``/``remove`` map onto the
  store's.

Each LMCache worker (one per tensor-parallel rank) opens its own local store (no MPI);
its file-tier files are named by the worker id, so workers of one instance can share a
``file_dir`` (separate instances need separate directories). Tested with LMCache's
``StorageManager`` on CPU (tests/test_lmcache_backend.py), not under vLLM.
"""
from __future__ import annotations

import json
import logging
import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

import blake3
import numpy as np

from .. import buffers
from ..config import Config
from ..errors import BlockNotFound, BlockPinned, CascadeError
from ..identity import ID_HEX_CHARS
from ..models import BlockSpec
from ..store import CascadeStore

try:  # LMCache and torch are optional: only this module needs them
    import torch
    from lmcache.utils import STR_DTYPE_TO_TORCH_DTYPE, TORCH_DTYPE_TO_STR_DTYPE, CacheEngineKey
    from lmcache.v1.memory_management import MemoryFormat, MemoryObj
    from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"cascade.integrations.lmcache_backend needs LMCache 0.5.x and torch ({exc}); "
        "install them with third_party/install.sh") from exc

log = logging.getLogger(__name__)
HEADER_BYTES = 256
_MAGIC = b"CSCDLMC1"
_PREFIX = "cascade."


def chunk_block_id(key: CacheEngineKey) -> str:
    """Cascade id of an LMCache chunk key (32 hex of BLAKE3 of ``key.to_string()``)."""
    return blake3.blake3(b"cascade-lmcache/1\0" + key.to_string().encode()).hexdigest()[:ID_HEX_CHARS]


def _full_chunk_bytes(metadata: Any) -> int:
    dtypes = metadata.get_dtypes() if hasattr(metadata, "get_dtypes") else [metadata.kv_dtype]
    itemsize = max(buffers.as_dtype(d).itemsize for d in dtypes)
    return math.prod(int(n) for n in metadata.kv_shape) * itemsize


class CascadeBackend(StoragePluginInterface):
    """An LMCache storage backend whose chunks live in a :class:`CascadeStore`.

    Built by LMCache (``storage_plugin_launcher``) with its config, metadata and CPU
    backend, which allocates the memory objects that gets return. Thread-safe (the store
    is).
    """

    def __init__(self, dst_device: str = "cpu", config: Any = None, metadata: Any = None,
                 local_cpu_backend: Any = None, loop: Any = None) -> None:
        super().__init__(dst_device=dst_device, config=config, metadata=metadata,
                         local_cpu_backend=local_cpu_backend, loop=loop)
        if local_cpu_backend is None:
            raise CascadeError("the Cascade LMCache backend needs LMCache's local CPU backend "
                               "(it allocates the memory objects gets return)")
        extra = dict(getattr(config, "extra_config", None) or {})
        ours = {k[len(_PREFIX):]: v for k, v in extra.items() if k.startswith(_PREFIX)}
        self.namespace = str(ours.pop("namespace", "lmcache"))
        block_bytes = ours.pop("block_bytes", None)
        config_file = ours.pop("config_file", None)
        cascade_config = Config.load(config_file, **ours)
        if block_bytes is None:
            block_bytes = -(-(HEADER_BYTES + _full_chunk_bytes(metadata)) // 4096) * 4096
        self.block_bytes = int(block_bytes)
        worker = int(getattr(metadata, "worker_id", 0) or 0)
        self.store = CascadeStore(cascade_config, block_spec=BlockSpec.flat(self.block_bytes), rank=worker)
        self._half = self.block_bytes // 2

    def __str__(self) -> str:
        return self.__class__.__name__

    # -- lookups ------------------------------------------------------------------------
    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        bid = chunk_block_id(key)
        if not self.store.contains(bid, namespace=self.namespace):
            return False
        if pin:
            try:
                self.store.pin(bid, namespace=self.namespace)
            except BlockNotFound:  # evicted in between
                return False
        return True

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return False  # puts finish before batched_submit_put_task returns

    # -- put ----------------------------------------------------------------------------
    def batched_submit_put_task(self, keys: Sequence[CacheEngineKey], objs: list[MemoryObj],
                                transfer_spec: Any = None,
                                on_complete_callback: Callable[[CacheEngineKey], None] | None = None) -> None:
        buf = np.zeros(self.block_bytes, dtype=np.uint8)
        for key, obj in zip(keys, objs):
            if self._put(key, obj, buf) and on_complete_callback is not None:
                try:
                    on_complete_callback(key)
                except Exception:  # LMCache's contract: a callback failure is logged only
                    log.exception("LMCache put callback failed for %s", key)
        return None

    def _put(self, key: CacheEngineKey, obj: MemoryObj, buf: np.ndarray) -> bool:
        bid = chunk_block_id(key)
        if self.store.contains(bid, namespace=self.namespace):
            return True  # same key, same prefix: same KV
        tensor = obj.tensor
        if tensor is None:
            return False
        payload = buffers.host_bytes(tensor, "LMCache chunk")  # a view of a CPU tensor
        if HEADER_BYTES + payload.nbytes > self.block_bytes:
            log.warning("chunk %s of %d bytes exceeds Cascade's block of %d bytes (set cascade.block_bytes); "
                        "not stored", key.to_string(), payload.nbytes, self.block_bytes)
            return False
        meta = obj.metadata
        header = json.dumps({"shape": [int(n) for n in meta.shape], "dtype": TORCH_DTYPE_TO_STR_DTYPE[meta.dtype],
                             "fmt": meta.fmt.value, "nbytes": int(payload.nbytes)}).encode()
        if len(header) > HEADER_BYTES - len(_MAGIC) - 4:
            log.warning("chunk %s: shape too long for the header; not stored", key.to_string())
            return False
        buf[:HEADER_BYTES] = 0
        buf[:len(_MAGIC)] = np.frombuffer(_MAGIC, np.uint8)
        buf[len(_MAGIC):len(_MAGIC) + 4] = np.frombuffer(struct.pack("<I", len(header)), np.uint8)
        buf[len(_MAGIC) + 4:len(_MAGIC) + 4 + len(header)] = np.frombuffer(header, np.uint8)
        buf[HEADER_BYTES:HEADER_BYTES + payload.nbytes] = payload
        buf[HEADER_BYTES + payload.nbytes:] = 0  # no bytes of an earlier chunk in the padding
        try:
            self.store.put(buf[:self._half], buf[self._half:], block_id=bid, namespace=self.namespace)
        except CascadeError as exc:  # TierFull and friends: the chunk is simply not cached
            log.warning("Cascade did not store chunk %s: %s", key.to_string(), exc)
            return False
        return True

    # -- get ----------------------------------------------------------------------------
    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        """The chunk as a memory object from LMCache's CPU allocator, or None on a miss
        (also when the allocator has no room or the block is not one of ours)."""
        buf = np.empty(self.block_bytes, dtype=np.uint8)
        if not self.store.get_into(chunk_block_id(key), buf[:self._half], buf[self._half:], namespace=self.namespace):
            return None
        if bytes(buf[:len(_MAGIC)]) != _MAGIC:
            log.warning("block of chunk %s has no Cascade-LMCache header: treated as a miss", key.to_string())
            return None
        (length,) = struct.unpack("<I", bytes(buf[len(_MAGIC):len(_MAGIC) + 4]))
        try:
            head = json.loads(bytes(buf[len(_MAGIC) + 4:len(_MAGIC) + 4 + length]))
            shape, dtype = torch.Size(head["shape"]), STR_DTYPE_TO_TORCH_DTYPE[head["dtype"]]
            fmt, nbytes = MemoryFormat(head["fmt"]), int(head["nbytes"])
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("bad header in the block of chunk %s (%s): treated as a miss", key.to_string(), exc)
            return None
        obj = self.local_cpu_backend.allocate(shape, dtype, fmt)
        if obj is None:
            return None
        room = buffers.nbytes(obj.tensor, "LMCache chunk")
        if room != nbytes:
            obj.ref_count_down()
            log.warning("chunk %s: header says %d bytes, its shape %d: treated as a miss",
                        key.to_string(), nbytes, room)
            return None
        buffers.copy(obj.tensor, buf[HEADER_BYTES:HEADER_BYTES + nbytes])
        return obj

    # -- pins, removal, life cycle ------------------------------------------------------
    def pin(self, key: CacheEngineKey) -> bool:
        try:
            self.store.pin(chunk_block_id(key), namespace=self.namespace)
        except BlockNotFound:
            return False
        return True

    def unpin(self, key: CacheEngineKey) -> bool:
        try:
            self.store.unpin(chunk_block_id(key), namespace=self.namespace)
        except (BlockNotFound, BlockPinned):
            return False
        return True

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        try:
            self.store.delete(chunk_block_id(key), namespace=self.namespace)
        except (BlockNotFound, BlockPinned):
            return False
        return True

    def touch_cache(self) -> None:
        """Nothing to do: Cascade's policy sees every get."""

    def get_allocator_backend(self):
        return self.local_cpu_backend

    def close(self) -> None:
        self.store.close()
