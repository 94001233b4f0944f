"""LMCache 0.5.x driven through its own ``StorageManager`` on CPU, without vLLM or a GPU.

Three adapters share this module:

=================  ====================================================================
``lmcache_cpu``    ``LocalCPUBackend`` only (``local_cpu=True``, no disk)
``lmcache_disk``   ``LocalDiskBackend``; the CPU backend is only LMCache's staging pool
                   (``local_cpu=False``), as LMCache always creates it
``lmcache_cpu_disk`` ``LocalCPUBackend`` in front of ``LocalDiskBackend`` (every put goes
                   to both tiers; a disk hit is written back into the CPU tier by LMCache)
=================  ====================================================================

``use_odirect=True`` (the registry's ``lmcache_disk_odirect``) sets the disk backend's
documented ``extra_config.use_odirect``: LMCache then writes and reads each chunk file
with ``O_DIRECT`` when its size is a multiple of the file system's block size (else
buffered, with a warning), bypassing the page cache.

How a block maps onto LMCache (what a vLLM connector would hand it):

* key: ``CacheEngineKey(model_name, world_size=1, worker_id=rank, chunk_hash, uint8)``
  with ``chunk_hash = int(block_id, 16)`` (the 128-bit id is the chunk's prefix hash).
* data: one ``MemoryObj`` from LMCache's own allocator (``StorageManager.allocate``) in
  its ``KV_2LTD`` format, shape ``[2, 1, 1, n]`` uint8: row 0 the key (K) bytes, row 1
  the value (V) bytes — the byte image of a ``[2, layers, tokens, hidden]`` chunk. A
  block whose key and value differ in size is stored flat as ``[1, 1, 1, k + v]``.
  The sizes of each block are kept beside the store (a serving engine knows them from
  the model shape); whether a block is present is always asked of LMCache.

Copies LMCache's API forces: put copies the caller's bytes into the ``MemoryObj``
(LMCache only stores its own allocations; this is the GPU->CPU copy of a real
deployment); the CPU backend then keeps that object (no copy), the disk backend
writes it to one file per chunk (``<dir>/<key>.pt``) from a background thread. get
copies the stored object into the caller's buffers (the CPU->GPU copy of a real
deployment); from disk, LMCache first reads the file into a staging object (one more
copy). Known LMCache behaviour worked around here: a key is never overwritten (a put of
a present id is skipped, which is correct for content ids), and ``StorageManager.get``
does not return when the CPU tier is off, so reads use ``contains`` and then
``batched_get(location=<backend that has it>)``.

Not thread-safe: one adapter per rank, driven from one thread.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import threading
from typing import Any

from cascade import buffers

from .base import (AdapterUnavailable, Buffer, StorageAdapter, byte_view, process_rank,
                   writable_view)

_CPU = "LocalCPUBackend"
_DISK = "LocalDiskBackend"
_GIB = float(1 << 30)


def _import_lmcache():
    """Import torch and LMCache's storage layer; AdapterUnavailable with the reason."""
    # LMCache reads these at import time: no usage telemetry, quiet logs.
    os.environ["LMCACHE_TRACK_USAGE"] = "false"
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")
    try:
        import torch
        import lmcache
        from lmcache.utils import CacheEngineKey
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.event_manager import EventManager
        from lmcache.v1.memory_management import MemoryFormat
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend.storage_manager import StorageManager
    except ImportError as exc:
        raise AdapterUnavailable(
            f"LMCache is not importable ({exc}); install it with "
            "third_party/install.sh (pins in third_party/lmcache/requirements.txt)") from exc
    version = getattr(lmcache, "__version__", "unknown")
    if not version.startswith("0.5."):
        raise AdapterUnavailable(f"LMCache {version} is installed; this adapter drives 0.5.x")
    return dict(torch=torch, lmcache=lmcache, CacheEngineKey=CacheEngineKey,
                LMCacheEngineConfig=LMCacheEngineConfig, EventManager=EventManager,
                MemoryFormat=MemoryFormat, LMCacheMetadata=LMCacheMetadata,
                StorageManager=StorageManager)


class _LMCacheAdapter(StorageAdapter):
    """Shared implementation; the subclasses fix which LMCache backends are on."""

    has_eviction = True
    _use_cpu = True
    _use_disk = False

    def __init__(self, model_name: str = "cascade-bench", chunk_tokens: int = 16,
                 cpu_bytes: int | None = None, staging_bytes: int = 256 << 20,
                 wait_for_disk: bool | None = None, torch_threads: int = 1,
                 disk_io_threads: int | None = None, keep_files: bool = False,
                 use_odirect: bool = False) -> None:
        """Options:

        ``model_name``/``chunk_tokens``: recorded in LMCache's metadata and keys;
        ``cpu_bytes``: size of the CPU tier in ``lmcache_cpu_disk`` (default: the
        capacity; the disk tier always gets the capacity, and since every put lands on
        disk the distinct data held is the capacity); ``staging_bytes``: the CPU pool
        LMCache needs as a staging buffer in ``lmcache_disk``; ``wait_for_disk``:
        ``put`` returns only once the disk write finished (default off: LMCache writes
        behind, and :meth:`flush`, timed inside every put phase, waits for the writes); ``torch_threads``: ``torch.set_num_threads``; ``disk_io_threads``:
        LMCache's ``disk_io_threads``; ``keep_files``: leave the disk files at close;
        ``use_odirect``: LMCache's ``use_odirect`` for the disk backend (O_DIRECT file I/O).
        """
        super().__init__()
        if use_odirect and not self._use_disk:
            raise ValueError(f"{self.name}: use_odirect applies to LMCache's disk backend, which is off here")
        self._model = model_name
        self._chunk_tokens = int(chunk_tokens)
        self._cpu_bytes = cpu_bytes
        self._staging_bytes = int(staging_bytes)
        self._wait_for_disk = bool(wait_for_disk) and self._use_disk
        self._written = threading.Condition()
        self._unsynced: list[Any] = []
        self._torch_threads = int(torch_threads)
        self._disk_io_threads = disk_io_threads
        self._keep_files = keep_files
        self._use_odirect = bool(use_odirect)
        self._lm: dict[str, Any] = {}
        self._sm = None
        self._disk = None
        self._disk_dir = ""
        self._prom_dir = ""
        self._sizes: dict[str, tuple[int, int]] = {}
        self._keys: dict[str, Any] = {}
        self._rank = 0
        self._config_summary: dict[str, object] = {}

    @staticmethod
    def probe() -> str | None:
        try:
            _import_lmcache()
        except AdapterUnavailable as exc:
            return str(exc)
        return None

    # -- life cycle -------------------------------------------------------------------
    def initialize(self, capacity_bytes: int, data_dir: str) -> None:
        super().initialize(capacity_bytes, data_dir)
        lm = self._lm = _import_lmcache()
        torch = lm["torch"]
        torch.set_num_threads(self._torch_threads)
        self._rank = process_rank()

        cap_gb = self.capacity_bytes / _GIB
        if self._use_cpu:
            cpu_gb = (self._cpu_bytes if self._cpu_bytes else self.capacity_bytes) / _GIB
        else:
            cpu_gb = min(self._staging_bytes, self.capacity_bytes) / _GIB
        cfg: dict[str, object] = {
            "chunk_size": self._chunk_tokens,
            "local_cpu": self._use_cpu,
            "max_local_cpu_size": cpu_gb,
            "local_disk": None,
            "max_local_disk_size": 0.0,
            "cache_policy": "LRU",
            "save_unfull_chunk": True,
        }
        if self._use_disk:
            self._disk_dir = os.path.join(
                self.data_dir, f"lmcache_rank{self._rank:03d}_{os.getpid()}_{id(self):x}")
            os.makedirs(self._disk_dir, exist_ok=True)
            cfg["local_disk"] = self._disk_dir + "/"
            cfg["max_local_disk_size"] = cap_gb
            extra: dict[str, object] = {}
            if self._disk_io_threads:
                extra["disk_io_threads"] = int(self._disk_io_threads)
            if self._use_odirect:
                extra["use_odirect"] = True
            if extra:
                cfg["extra_config"] = extra
        self._config_summary = {k: v for k, v in cfg.items()}
        # LMCache's metrics logger sets PROMETHEUS_MULTIPROC_DIR (to /tmp/lmcache_prometheus)
        # for the whole process if unset; keep it inside our directory and unset after.
        prom_was_set = "PROMETHEUS_MULTIPROC_DIR" in os.environ
        if not prom_was_set:
            self._prom_dir = os.path.join(
                self.data_dir, f"lmcache_prometheus_{os.getpid()}_{id(self):x}")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = self._prom_dir
        try:
            config = lm["LMCacheEngineConfig"].from_defaults(**cfg)
            metadata = lm["LMCacheMetadata"](
                model_name=self._model, world_size=1, local_world_size=1,
                worker_id=self._rank, local_worker_id=0, kv_dtype=torch.uint8,
                kv_shape=(1, 2, self._chunk_tokens, 1, 1), role="worker",
                chunk_size=self._chunk_tokens)
            self._sm = lm["StorageManager"](config, metadata, lm["EventManager"]())
        except Exception:
            self.close()
            raise
        finally:
            if not prom_was_set:
                os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        backends = list(self._sm.storage_backends)
        if _CPU not in backends or (self._use_disk and _DISK not in backends):
            self.close()
            raise AdapterUnavailable(f"LMCache created backends {backends}, expected "
                                     f"{_CPU}{' and ' + _DISK if self._use_disk else ''}")
        self._disk = self._sm.storage_backends.get(_DISK)
        if self._disk is not None:
            # Be told when a write-behind task ends instead of polling with sleeps:
            # LMCache's disk worker calls remove_put_task once per finished write.
            worker = self._disk.disk_worker
            finish = worker.remove_put_task

            def remove_put_task(key, _finish=finish, _cond=self._written):
                _finish(key)
                with _cond:
                    _cond.notify_all()
            worker.remove_put_task = remove_put_task

    def close(self) -> None:
        if self._sm is not None:
            try:
                self.flush()
            finally:
                self._sm.close()
                self._sm = None
                self._disk = None
        if self._disk_dir and not self._keep_files:
            shutil.rmtree(self._disk_dir, ignore_errors=True)
        self._disk_dir = ""
        if self._prom_dir:
            shutil.rmtree(self._prom_dir, ignore_errors=True)
            self._prom_dir = ""
        self._sizes.clear()
        self._keys.clear()

    # -- mapping ----------------------------------------------------------------------
    def _key(self, block_id: str):
        """LMCache's key of a block (remembered only for blocks we put, for clear)."""
        key = self._keys.get(block_id)
        if key is None:
            try:
                chunk_hash = int(block_id, 16)
            except ValueError:  # not a hex id: hash it, as LMCache hashes token runs
                chunk_hash = int.from_bytes(hashlib.blake2b(block_id.encode(),
                                                            digest_size=16).digest(), "big")
            key = self._lm["CacheEngineKey"](self._model, 1, self._rank, chunk_hash,
                                             self._lm["torch"].uint8)
        return key

    def _where(self, key) -> str | None:
        """Where LMCache holds ``key``; a block whose write-behind is still queued is
        waited for (read-your-writes, as for every other system), and only then."""
        where = self._sm.contains(key)
        if where is None and self._disk is not None and self._disk.exists_in_put_tasks(key):
            self._wait_written([key])
            where = self._sm.contains(key)
        return where

    def _wait_written(self, keys=None) -> None:
        """Block until LMCache's in-flight disk writes of ``keys`` (None: all) ended;
        woken by each finished write (no sleep polling)."""
        if self._disk is None:
            return
        worker = self._disk.disk_worker
        if keys is None:
            pending = lambda: bool(worker.put_tasks)  # noqa: E731
        else:
            pending = lambda: any(worker.exists_in_put_tasks(k) for k in keys)  # noqa: E731
        with self._written:
            while pending():
                self._written.wait(timeout=1.0)

    # -- blocks -----------------------------------------------------------------------
    def put(self, block_id: str, key: Buffer, value: Buffer) -> None:
        kv = byte_view(key, "key")
        vv = byte_view(value, "value")
        ck = self._key(block_id)
        if (self._disk is not None and self._disk.exists_in_put_tasks(ck)) or self._sm.contains(ck) is not None:
            return  # LMCache never overwrites a chunk; content ids make it the same bytes
        torch = self._lm["torch"]
        if kv.nbytes == vv.nbytes:
            shape = torch.Size([2, 1, 1, kv.nbytes])
        else:
            shape = torch.Size([1, 1, 1, kv.nbytes + vv.nbytes])
        obj = self._sm.allocate(shape, torch.uint8, fmt=self._lm["MemoryFormat"].KV_2LTD)
        if obj is None:
            raise MemoryError(f"LMCache could not allocate {kv.nbytes + vv.nbytes} bytes "
                              f"(CPU pool {self._config_summary['max_local_cpu_size']} GiB)")
        dst = buffers.host_view(obj.tensor, "LMCache chunk", writable=True)
        buffers.copy(dst[:kv.nbytes], kv)
        buffers.copy(dst[kv.nbytes:], vv)
        # batched_put hands the object to every backend and drops our reference.
        self._sm.batched_put([ck], [obj])
        self._sizes[block_id] = (kv.nbytes, vv.nbytes)
        self._keys[block_id] = ck
        if self._disk is not None:
            self._unsynced.append(ck)
        if self._wait_for_disk:
            self._wait_written([ck])

    def _fetch(self, block_id: str):
        """The MemoryObj of a block (caller must ``ref_count_down``), or None."""
        ck = self._key(block_id)
        where = self._where(ck)
        if where is None:
            return None
        obj = self._sm.batched_get([ck], location=where)[0]
        return obj

    def _sizes_of(self, block_id: str, obj) -> tuple[int, int]:
        sizes = self._sizes.get(block_id)
        if sizes is not None:
            return sizes
        shape = tuple(obj.tensor.shape)  # a block stored by another adapter instance
        n = int(obj.tensor.numel())
        return (n // 2, n // 2) if shape[0] == 2 else (n, 0)

    def get(self, block_id: str) -> tuple[bytes, bytes] | None:
        obj = self._fetch(block_id)
        if obj is None:
            return None
        try:
            klen, _ = self._sizes_of(block_id, obj)
            raw = buffers.host_view(obj.tensor, "LMCache chunk")
            return raw[:klen].tobytes(), raw[klen:].tobytes()
        finally:
            obj.ref_count_down()

    def get_into(self, block_id: str, key_out: Buffer, value_out: Buffer) -> bool:
        kv = writable_view(key_out, "key_out")
        vv = writable_view(value_out, "value_out")
        obj = self._fetch(block_id)
        if obj is None:
            return False
        try:
            klen, vlen = self._sizes_of(block_id, obj)
            self._check_sizes(block_id, kv, vv, klen, vlen)
            raw = buffers.host_view(obj.tensor, "LMCache chunk")
            buffers.copy(kv, raw[:klen])
            buffers.copy(vv, raw[klen:klen + vlen])
        finally:
            obj.ref_count_down()
        return True

    def contains(self, block_id: str) -> bool:
        return self._where(self._key(block_id)) is not None

    def delete(self, block_id: str) -> None:
        ck = self._key(block_id)
        self._wait_written([ck])  # a queued disk write would re-insert the key later
        self._sm.remove(ck)
        self._sizes.pop(block_id, None)
        self._keys.pop(block_id, None)

    def clear(self) -> None:
        keys = list(self._keys.values())
        self._wait_written(keys)
        present = [k for k in keys if self._where(k) is not None]
        if present:
            self._sm.batched_remove(present)
        self._sizes.clear()
        self._keys.clear()

    def flush(self) -> None:
        """Wait for every queued disk write, then fsync the files written since the last
        flush (the put phase ends with the bytes on disk, as for Cascade and HDF5)."""
        if self._sm is None or self._disk is None:
            return
        self._wait_written()
        for ck in self._unsynced:
            try:
                fd = os.open(self._disk._key_to_path(ck), os.O_RDONLY)
            except FileNotFoundError:  # LMCache dropped the write (no space): nothing to sync
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._unsynced.clear()

    # -- reporting --------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        lm = self._lm or _import_lmcache()
        return {"lmcache": lm["lmcache"].__version__, "torch": lm["torch"].__version__}

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "lmcache_config": self._config_summary,
                "wait_for_disk": self._wait_for_disk, "disk_dir": self._disk_dir,
                "torch_threads": self._torch_threads, "use_odirect": self._use_odirect,
                **({"read_mode": "direct" if self._use_odirect else "buffered"} if self._use_disk else {})}


class LMCacheCPUAdapter(_LMCacheAdapter):
    """LMCache's CPU backend alone (LRU in host memory)."""

    name = "lmcache_cpu"
    _use_cpu = True
    _use_disk = False


class LMCacheDiskAdapter(_LMCacheAdapter):
    """LMCache's local-disk backend (the CPU pool only stages transfers)."""

    name = "lmcache_disk"
    _use_cpu = False
    _use_disk = True


class LMCacheCPUDiskAdapter(_LMCacheAdapter):
    """LMCache's CPU backend in front of its local-disk backend."""

    name = "lmcache_cpu_disk"
    _use_cpu = True
    _use_disk = True
