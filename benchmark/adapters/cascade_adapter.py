"""Cascade itself behind the benchmark interface (in-process, one store per rank).

Two configurations, each holding exactly ``capacity_bytes``:

* ``cascade`` — the SHM (node DRAM) tier only: compared with in-memory systems;
* ``cascade_file`` — the file (Lustre) tier only, with the default
  ``file_read_mode="auto"``: reads go through ``O_DIRECT`` only when the directory is on
  Lustre, and through the page cache elsewhere (kernel readahead), which is what runs on
  this project's machines. A buffered read is one ``preadv`` of the record's header and
  payload; an ``O_DIRECT`` read of a record of 8 MiB or more goes as 1 MiB requests, up to
  8 in flight (smaller records: one request). The mode that ran is in :meth:`describe`
  (``read_mode``). Compared with file-backed systems (LMCache's disk backend, HDF5).

Puts take the benchmark's id as a precomputed block id, as an engine passes a
token-prefix id (:func:`cascade.prefix_ids`, computed from token ids before any KV
exists, like LMCache's chunk hash): the store does no KV hashing; integrity stays with
the tiers' record checksums. ``hash_on_put=True`` restores content addressing (BLAKE3
of the KV, overlapped with the copy, checked against the id: ``verify=True``). Reads go
straight into the caller's buffers (``get_into``), no extra copy. The store opens for the
block size given to :meth:`~CascadeAdapter.prepare` (the benchmarks call it right after
``initialize``, untimed, as peers start in ``initialize``), else for the first put's (key
and value of equal size, as K and V are); a put of another size drops what the store held
and starts a store of that size (``uniform_blocks``). The SHM slab is prefaulted at open
(``shm_prefault``), as LMCache allocates its CPU pool up front: without it a fresh store's
puts pay tmpfs page faults (about 1.6 GB/s against 18-20).
"""
from __future__ import annotations

import os
import shutil
from typing import ClassVar

from cascade import CascadeStore, Config, InvalidBlock, buffers
from cascade.models import BlockSpec

from .base import Buffer, StorageAdapter, process_rank

NAMESPACE = "bench"


class CascadeAdapter(StorageAdapter):
    """Cascade's store; ``tier`` is ``"shm"`` or ``"file"``."""

    name: ClassVar[str] = "cascade"
    has_eviction: ClassVar[bool] = True
    uniform_blocks: ClassVar[bool] = True

    def __init__(self, tier: str = "shm", hash_on_put: bool = False) -> None:
        super().__init__()
        if tier not in ("shm", "file"):
            raise ValueError(f"tier must be 'shm' or 'file', got {tier!r}")
        self.tier = tier
        self.hash_on_put = hash_on_put
        self._store: CascadeStore | None = None

    def initialize(self, capacity_bytes: int, data_dir: str) -> None:
        super().initialize(capacity_bytes, data_dir)
        self._file_dir = os.path.join(self.data_dir, f"cascade_rank{process_rank():03d}")

    def prepare(self, block_bytes: int) -> None:
        """Open the store (SHM slab prefaulted, or file tier) for blocks of ``block_bytes``."""
        if block_bytes <= 0 or block_bytes % 2:
            raise ValueError(f"cascade stores key and value of equal size: block_bytes must be even and "
                             f"positive, got {block_bytes}")
        if self._store is None or self._store.spec.half_bytes != block_bytes // 2:
            self._open(block_bytes // 2)

    def _open(self, half: int) -> CascadeStore:
        self.close()
        shutil.rmtree(self._file_dir, ignore_errors=True)  # this adapter's own files only
        spec = BlockSpec.flat(2 * half)
        if self.tier == "shm":
            cfg = Config(shm_bytes=self.capacity_bytes, file_bytes=0, file_dir=self._file_dir, shm_prefault=True)
        else:
            cfg = Config(shm_bytes=0, file_bytes=self.capacity_bytes, file_dir=self._file_dir)
        self._store = CascadeStore(cfg, block_spec=spec)
        return self._store

    def _arrays(self, key: Buffer, value: Buffer, writable: bool):
        k = buffers.host_view(key, "key", writable=writable)
        v = buffers.host_view(value, "value", writable=writable)
        if k.nbytes != v.nbytes:
            raise ValueError(f"cascade stores key and value of equal size; got {k.nbytes} and {v.nbytes}")
        return k, v

    def put(self, block_id: str, key: Buffer, value: Buffer) -> None:
        k, v = self._arrays(key, value, writable=False)
        store = self._store
        if store is None or store.spec.half_bytes != k.nbytes:
            store = self._open(k.nbytes)
        store.put(k, v, block_id=block_id, verify=self.hash_on_put, namespace=NAMESPACE)

    def get(self, block_id: str) -> tuple[bytes, bytes] | None:
        if self._store is None:
            return None
        got = self._store.get(block_id, namespace=NAMESPACE)
        return None if got is None else (got[0].tobytes(), got[1].tobytes())

    def get_into(self, block_id: str, key_out: Buffer, value_out: Buffer) -> bool:
        k, v = self._arrays(key_out, value_out, writable=True)
        if self._store is None:
            return False
        try:
            return self._store.get_into(block_id, k, v, namespace=NAMESPACE)
        except InvalidBlock:  # buffers of another size: a miss stays a miss, a hit is an error
            if not self.contains(block_id):
                return False
            half = self._store.spec.half_bytes
            self._check_sizes(block_id, memoryview(k), memoryview(v), half, half)
            raise

    def contains(self, block_id: str) -> bool:
        return self._store is not None and self._store.contains(block_id, namespace=NAMESPACE)

    def delete(self, block_id: str) -> None:
        if self._store is not None and self._store.contains(block_id, namespace=NAMESPACE):
            self._store.delete(block_id, namespace=NAMESPACE)

    def flush(self) -> None:
        """fsync the file tier: the put phase ends with the bytes on disk (as the raw
        write limit does), and later cold reads do not pay for the write-back."""
        if self._store is not None:
            self._store.flush()

    def clear(self) -> None:
        if self._store is not None:
            self._store.clear(namespace=NAMESPACE)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def versions(self) -> dict[str, str]:
        import cascade

        return {"cascade": cascade.__version__}

    def describe(self) -> dict[str, object]:
        """Configuration: ``block_bytes`` of the open store (``None`` before one opened);
        for the file tier also ``read_mode``, the read path the tier chose (``buffered`` or
        ``direct``; ``None`` before the store opened)."""
        out: dict[str, object] = {**super().describe(), "tier": self.tier, "hash_on_put": self.hash_on_put,
                                  "block_bytes": None if self._store is None else 2 * self._store.spec.half_bytes}
        if self.tier == "file":
            tiers = self._store.tiers if self._store is not None else []
            out["read_mode"] = next((t.read_mode for t in tiers if hasattr(t, "read_mode")), None)
        return out


class CascadeFileAdapter(CascadeAdapter):
    """Cascade's file (Lustre) tier alone."""

    name: ClassVar[str] = "cascade_file"

    def __init__(self, hash_on_put: bool = False) -> None:
        super().__init__(tier="file", hash_on_put=hash_on_put)
