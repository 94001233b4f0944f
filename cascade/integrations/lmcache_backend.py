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
* namespace: ``cascade.namespace`` (default ``"lmcache"``). ``pin``/``unpin``/``remove``
  map onto the store's.
* never stalling the engine: ``batched_submit_put_task`` copies each chunk into a block
  buffer and returns; the store's ``put_async`` writes it in the background
  (``exists_in_put_tasks`` says which are still in flight, LMCache's completion callback
  runs when one lands, a lookup or get of a chunk sees its pending put; attached to a
  rank, a batch's chunks go as one request, done when it returns: their bytes are
  then in the rank's store; chunks it has already land as dedups there). A batch is looked up with one request too. LMCache's
  asynchronous entry points (``enable_async_loading``: ``batched_async_contains``,
  ``batched_get_non_blocking``, ``get_non_blocking``) run the lookups and batched reads
  on worker threads, never on LMCache's event loop.

With ``cascade.endpoint`` (a rank's socket path, or ``auto``: this node's ``cascade serve``
ranks, see cascade/serve/), the worker attaches to its node's rank of a Cascade job and
every instance shares one cluster-wide cache; the block size is then the rank's, and a
rank that is gone makes every lookup a miss (the engine recomputes) until it is back;
``cascade.timeout`` (seconds, default 120) is how long a rank that does not answer may
take before it counts as gone (while one thread tries to attach again, the others miss).
Without it, each LMCache worker (one per tensor-parallel rank) opens its own local store
(no MPI); its file-tier files are named by the worker id, so workers of one instance can
share a ``file_dir`` (separate instances need separate directories). The log says which.
Tested with LMCache's ``StorageManager`` on CPU (tests/test_lmcache_backend.py,
tests/test_serve.py, tests/test_serve_lmcache.py), not under vLLM.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import blake3
import numpy as np

from .. import buffers
from ..config import Config, parse_size
from ..errors import BlockNotFound, BlockPinned, CascadeError, ConfigError, InvalidBlock
from ..identity import ID_HEX_CHARS, check_namespace
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


def _seconds(value: Any, key: str) -> float:
    """``value`` ("30", 30) as a positive, finite number of seconds; :class:`ConfigError` else."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise ConfigError(f"{key}: a positive number of seconds, got {value!r}")
    return seconds


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
        try:
            check_namespace(self.namespace)
        except InvalidBlock as exc:
            raise ConfigError(f"cascade.namespace: {exc}") from None
        block_bytes = ours.pop("block_bytes", None)
        if block_bytes is not None:  # a size as every cascade.* size takes it ("8K")
            block_bytes = parse_size(block_bytes, "cascade.block_bytes")
        config_file = ours.pop("config_file", None)
        endpoint, socket_dir = ours.pop("endpoint", None), ours.pop("socket_dir", None)
        timeout = ours.pop("timeout", None)
        worker = int(getattr(metadata, "worker_id", 0) or 0)
        if endpoint:  # the node's rank of a Cascade job: one cache for every instance
            from ..serve.attached import AttachedStore

            client_args = {} if timeout is None else {"timeout": _seconds(timeout, "cascade.timeout")}
            self.store = AttachedStore(str(endpoint), worker=worker, socket_dir=socket_dir, **client_args)
            if block_bytes is not None and block_bytes != self.store.spec.block_bytes:
                self.store.close()
                raise ConfigError(f"cascade.block_bytes={block_bytes} but the rank at {self.store.endpoint} "
                                  f"serves {self.store.spec.block_bytes}-byte blocks")
            self.block_bytes = self.store.spec.block_bytes
            self._attached = True
            workers = 1  # one connection: its requests go one at a time
            log.info("Cascade LMCache backend: attached to the Cascade rank at %s (shared cluster cache, "
                     "%d-byte blocks)%s", self.store.endpoint, self.block_bytes,
                     f"; ignoring {sorted(ours)} (the rank's config applies)" if ours else "")
        else:
            cascade_config = Config.load(config_file, **ours)
            if block_bytes is None:
                block_bytes = -(-(HEADER_BYTES + _full_chunk_bytes(metadata)) // 4096) * 4096
            self.block_bytes = block_bytes
            self.store = CascadeStore(cascade_config, block_spec=BlockSpec.flat(self.block_bytes), rank=worker)
            self._attached = False
            workers = cascade_config.io_threads
            log.info("Cascade LMCache backend: in-process store private to this worker (set cascade.endpoint "
                     "to share the node's Cascade rank)")
        self._half = self.block_bytes // 2
        # LMCache's asynchronous lookups and reads run here, never on its event loop
        self._workers = ThreadPoolExecutor(max(1, workers), thread_name_prefix="cascade-lmcache")

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

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        """How many leading ``keys`` are cached (one batched lookup of the store; attached,
        one request), each pinned with ``pin``."""
        found = self.store.contains_many([chunk_block_id(k) for k in keys], namespace=self.namespace)
        hits = found.index(False) if False in found else len(found)
        if pin:
            for i, key in enumerate(keys[:hits]):
                try:
                    self.store.pin(chunk_block_id(key), namespace=self.namespace)
                except BlockNotFound:  # evicted in between: the (pinned) prefix ends here
                    return i
        return hits

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return self.store.put_pending(chunk_block_id(key), namespace=self.namespace)

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False) -> int:
        """How many leading ``keys`` are cached (each pinned with ``pin``), looked up on a
        worker thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._workers, self.batched_contains, keys, pin)

    # -- put ----------------------------------------------------------------------------
    def batched_submit_put_task(self, keys: Sequence[CacheEngineKey], objs: list[MemoryObj],
                                transfer_spec: Any = None,
                                on_complete_callback: Callable[[CacheEngineKey], None] | None = None) -> None:
        """Copy each chunk into a block buffer and put it: in the background for an
        in-process store (returns before the store has it), as one batch request to an
        attached rank (returns once the rank has them). ``on_complete_callback(key)`` runs
        once a chunk is in."""
        ids = [chunk_block_id(key) for key in keys]
        # in-process: one lookup for the batch spares copying chunks the store has; attached,
        # it would cost a round trip and a directory lookup the rank's put does anyway
        # (a put of a cached block is settled there as a dedup, so it just lands)
        present = [False] * len(ids) if self._attached else self.store.contains_many(ids, namespace=self.namespace)
        todo = []
        for key, obj, bid, there in zip(keys, objs, ids, present):
            if there:
                self._completed(key, on_complete_callback)  # same key, same prefix: same KV
                continue
            buf = self._encode(key, obj)
            if buf is not None:
                todo.append((key, bid, buf))
        if self._attached:
            self._put_batch(todo, on_complete_callback)
            return None
        for key, bid, buf in todo:
            try:
                future = self.store.put_async(buf[:self._half], buf[self._half:], block_id=bid,
                                              namespace=self.namespace)
            except CascadeError as exc:
                log.warning("Cascade did not take chunk %s: %s", key.to_string(), exc)
                continue
            future.add_done_callback(lambda done, key=key: self._landed(done, key, on_complete_callback))
        return None

    def _put_batch(self, todo: list[tuple[CacheEngineKey, str, np.ndarray]],
                   callback: Callable[[CacheEngineKey], None] | None) -> None:
        """Put the encoded chunks of ``todo`` on the rank as one batch (one request per
        staging-full); a chunk the rank did not take is logged and not cached."""
        if not todo:
            return
        landed = todo
        try:
            self.store.put_many([(buf[:self._half], buf[self._half:]) for _, _, buf in todo],
                                block_ids=[bid for _, bid, _ in todo], namespace=self.namespace)
        except CascadeError as exc:  # some may have landed: ask which
            there = self.store.contains_many([bid for _, bid, _ in todo], namespace=self.namespace)
            landed = [t for t, ok in zip(todo, there) if ok]
            log.warning("Cascade did not store %d of %d chunks: %s", len(todo) - len(landed), len(todo), exc)
        for key, _, _ in landed:
            self._completed(key, callback)

    def _landed(self, future: Any, key: CacheEngineKey, callback: Callable[[CacheEngineKey], None] | None) -> None:
        error = future.exception()
        if error is not None:  # TierFull and friends: the chunk is simply not cached
            log.warning("Cascade did not store chunk %s: %s", key.to_string(), error)
            return
        self._completed(key, callback)

    @staticmethod
    def _completed(key: CacheEngineKey, callback: Callable[[CacheEngineKey], None] | None) -> None:
        if callback is None:
            return
        try:
            callback(key)
        except Exception:  # LMCache's contract: a callback failure is logged only
            log.exception("LMCache put callback failed for %s", key)

    def _encode(self, key: CacheEngineKey, obj: MemoryObj) -> np.ndarray | None:
        """A block buffer holding the chunk's header and bytes, or None (logged) when the
        chunk cannot be stored."""
        tensor = obj.tensor
        if tensor is None:
            return None
        try:
            payload = buffers.host_bytes(tensor, "LMCache chunk")  # a view of a CPU tensor, a copy of a GPU one
        except InvalidBlock as exc:  # e.g. a non-contiguous tensor: LMCache's allocator never makes one
            log.warning("chunk %s not stored: %s", key.to_string(), exc)
            return None
        if HEADER_BYTES + payload.nbytes > self.block_bytes:
            log.warning("chunk %s of %d bytes exceeds Cascade's block of %d bytes (set cascade.block_bytes); "
                        "not stored", key.to_string(), payload.nbytes, self.block_bytes)
            return None
        meta = obj.metadata
        header = json.dumps({"shape": [int(n) for n in meta.shape], "dtype": TORCH_DTYPE_TO_STR_DTYPE[meta.dtype],
                             "fmt": meta.fmt.value, "nbytes": int(payload.nbytes)}).encode()
        if len(header) > HEADER_BYTES - len(_MAGIC) - 4:
            log.warning("chunk %s: shape too long for the header; not stored", key.to_string())
            return None
        buf = np.zeros(self.block_bytes, dtype=np.uint8)  # no bytes of an earlier chunk in the padding
        buf[:len(_MAGIC)] = np.frombuffer(_MAGIC, np.uint8)
        buf[len(_MAGIC):len(_MAGIC) + 4] = np.frombuffer(struct.pack("<I", len(header)), np.uint8)
        buf[len(_MAGIC) + 4:len(_MAGIC) + 4 + len(header)] = np.frombuffer(header, np.uint8)
        buf[HEADER_BYTES:HEADER_BYTES + payload.nbytes] = payload
        return buf

    # -- get ----------------------------------------------------------------------------
    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        """The chunk as a memory object from LMCache's CPU allocator, or None on a miss
        (also when the allocator has no room or the block is not one of ours)."""
        return self.batched_get_blocking([key])[0]

    def batched_get_blocking(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        """Every chunk of ``keys`` (None for each miss), read as one batch of the store."""
        bufs = [np.empty(self.block_bytes, dtype=np.uint8) for _ in keys]
        hits = self.store.get_many_into([chunk_block_id(k) for k in keys],
                                        [(b[:self._half], b[self._half:]) for b in bufs], namespace=self.namespace)
        return [self._decode(key, buf) if hit else None for key, buf, hit in zip(keys, bufs, hits)]

    def get_non_blocking(self, key: CacheEngineKey, location: str | None = None) -> Any:
        """A future of :meth:`get_blocking`'s result, read on a worker thread."""
        return self._workers.submit(self.get_blocking, key)

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[CacheEngineKey],
                                       transfer_spec: Any = None) -> list[MemoryObj]:
        """The leading chunks of ``keys`` that are cached (up to the first miss: a chunk
        evicted since the lookup), read as one batch on a worker thread."""
        loop = asyncio.get_running_loop()
        objs = await loop.run_in_executor(self._workers, self.batched_get_blocking, keys)
        prefix: list[MemoryObj] = []
        for obj in objs:
            if obj is None:
                break
            prefix.append(obj)
        for obj in objs[len(prefix):]:
            if obj is not None:
                obj.ref_count_down()  # past the first miss: not returned, given back
        return prefix

    def _decode(self, key: CacheEngineKey, buf: np.ndarray) -> MemoryObj | None:
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
        self._workers.shutdown(wait=True)
        self.store.close()
