"""HDF5 through h5py: every block of a rank aggregated into one file.

File ``<data_dir>/hdf5_rank{rank:03d}_{pid}.h5`` holds

* ``/data``  — one growing 1-D ``uint8`` dataset (chunked, unlimited), blocks appended
  back to back (key bytes then value bytes), never one dataset or file per block;
* ``/index`` — a compound dataset ``(id S32, offset u8, key_len u8, value_len u8)``
  written at :meth:`close`/:meth:`flush`, so a reopened file knows its blocks.

The live index is a Python dict (HDF5 has no key lookup of its own). HDF5 has no
eviction: a put that would pass ``capacity_bytes`` of live data raises ``OSError``
(``ENOSPC``), as a full device would. A deleted block's bytes stay in the file until
:meth:`clear` (HDF5 cannot reclaim space in place); its capacity is given back.

Copies on the way: put writes the caller's buffers with ``write_direct`` (HDF5 copies
into its chunk cache / file, no Python-side copy); ``get_into`` reads straight into the
caller's buffers with ``read_direct`` (no extra copy); ``get`` allocates new bytes.
"""
from __future__ import annotations

import errno
import os

import numpy as np

from .base import (AdapterUnavailable, Buffer, StorageAdapter, byte_view, process_rank,
                   writable_view)

_INDEX_DTYPE = np.dtype([("id", "S32"), ("offset", "<u8"), ("key_len", "<u8"),
                         ("value_len", "<u8")])


class HDF5Adapter(StorageAdapter):
    """One aggregated HDF5 file per rank. Not thread-safe (h5py holds one lock anyway)."""

    name = "hdf5"
    has_eviction = False

    def __init__(self, chunk_bytes: int = 4 << 20, rdcc_nbytes: int = 64 << 20,
                 keep_file: bool = False, driver: str | None = None) -> None:
        """``chunk_bytes``: HDF5 chunk size of ``/data``; ``rdcc_nbytes``: the raw
        chunk cache; ``keep_file``: leave the file at close (warm-restart studies);
        ``driver``: an h5py file driver (``None`` = sec2, POSIX I/O)."""
        super().__init__()
        self._chunk = int(chunk_bytes)
        self._rdcc = int(rdcc_nbytes)
        self._keep = keep_file
        self._driver = driver
        self._file = None
        self._data = None
        self._path = ""
        self._index: dict[str, tuple[int, int, int]] = {}
        self._end = 0            # append offset in /data
        self._live = 0           # bytes of blocks not deleted

    @staticmethod
    def probe() -> str | None:
        try:
            import h5py  # noqa: F401
        except ImportError:
            return "python package 'h5py' is missing (pip install -r third_party/hdf5/requirements.txt)"
        return None

    def initialize(self, capacity_bytes: int, data_dir: str) -> None:
        super().initialize(capacity_bytes, data_dir)
        reason = self.probe()
        if reason:
            raise AdapterUnavailable(reason)
        import h5py

        self._path = os.path.join(self.data_dir, f"hdf5_rank{process_rank():03d}_{os.getpid()}.h5")
        self._file = h5py.File(self._path, "w", libver="latest", driver=self._driver,
                               rdcc_nbytes=self._rdcc, rdcc_nslots=10007)
        self._data = self._file.create_dataset(
            "data", shape=(0,), maxshape=(None,), dtype=np.uint8, chunks=(self._chunk,))
        self._index.clear()
        self._end = self._live = 0

    # -- blocks -----------------------------------------------------------------------
    def put(self, block_id: str, key: Buffer, value: Buffer) -> None:
        if block_id in self._index:
            return
        kv = byte_view(key, "key")
        vv = byte_view(value, "value")
        size = kv.nbytes + vv.nbytes
        if self._live + size > self.capacity_bytes:
            raise OSError(errno.ENOSPC, f"hdf5 adapter full: {self._live} + {size} bytes "
                                        f"> capacity {self.capacity_bytes}")
        start = self._end
        new_end = start + size
        if new_end > self._data.shape[0]:
            # Grow by at least 1/8 of the file so appends do not resize on every block.
            grow = max(new_end, self._data.shape[0] + self._data.shape[0] // 8, self._chunk)
            self._data.resize((grow,))
        if kv.nbytes:
            self._data.write_direct(np.frombuffer(kv, np.uint8),
                                    dest_sel=np.s_[start:start + kv.nbytes])
        if vv.nbytes:
            self._data.write_direct(np.frombuffer(vv, np.uint8),
                                    dest_sel=np.s_[start + kv.nbytes:new_end])
        self._end = new_end
        self._live += size
        self._index[block_id] = (start, kv.nbytes, vv.nbytes)

    def get(self, block_id: str) -> tuple[bytes, bytes] | None:
        loc = self._index.get(block_id)
        if loc is None:
            return None
        start, klen, vlen = loc
        key = bytearray(klen)
        value = bytearray(vlen)
        self._read(start, klen, vlen, key, value)
        return bytes(key), bytes(value)

    def get_into(self, block_id: str, key_out: Buffer, value_out: Buffer) -> bool:
        kv = writable_view(key_out, "key_out")
        vv = writable_view(value_out, "value_out")
        loc = self._index.get(block_id)
        if loc is None:
            return False
        start, klen, vlen = loc
        self._check_sizes(block_id, kv, vv, klen, vlen)
        self._read(start, klen, vlen, kv, vv)
        return True

    def _read(self, start: int, klen: int, vlen: int, key_out, value_out) -> None:
        if klen:
            self._data.read_direct(np.frombuffer(key_out, np.uint8),
                                   source_sel=np.s_[start:start + klen])
        if vlen:
            self._data.read_direct(np.frombuffer(value_out, np.uint8),
                                   source_sel=np.s_[start + klen:start + klen + vlen])

    def contains(self, block_id: str) -> bool:
        return block_id in self._index

    def delete(self, block_id: str) -> None:
        loc = self._index.pop(block_id, None)
        if loc is not None:
            self._live -= loc[1] + loc[2]

    def clear(self) -> None:
        self._index.clear()
        self._end = self._live = 0
        self._data.resize((0,))
        if "index" in self._file:
            del self._file["index"]

    # -- life cycle -------------------------------------------------------------------
    def flush(self) -> None:
        """Write ``/index``, flush HDF5's buffers and fsync the file: the put phase ends
        with the bytes on disk, as Cascade's and LMCache's flush do."""
        if self._file is None:
            return
        rows = np.empty(len(self._index), dtype=_INDEX_DTYPE)
        for i, (bid, (off, klen, vlen)) in enumerate(self._index.items()):
            rows[i] = (bid.encode(), off, klen, vlen)
        if "index" in self._file:
            del self._file["index"]
        self._file.create_dataset("index", data=rows)
        self._data.resize((self._end,))
        self._file.flush()
        os.fsync(self._file.id.get_vfd_handle())

    def drop_process_cache(self) -> None:
        """Flush, then close and reopen the file: HDF5's chunk cache (``rdcc_nbytes``)
        starts empty, as in a reader that just opened it."""
        if self._file is None:
            return
        import h5py

        self.flush()
        self._file.close()
        self._file = h5py.File(self._path, "r+", libver="latest", driver=self._driver,
                               rdcc_nbytes=self._rdcc, rdcc_nslots=10007)
        self._data = self._file["data"]

    def close(self) -> None:
        if self._file is not None:
            try:
                if self._keep:
                    self.flush()
                self._file.close()
            finally:
                self._file = None
                self._data = None
                if not self._keep and self._path and os.path.exists(self._path):
                    os.unlink(self._path)
        self._index.clear()

    def versions(self) -> dict[str, str]:
        import h5py
        return {"h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version}

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "path": self._path, "chunk_bytes": self._chunk,
                "rdcc_nbytes": self._rdcc, "driver": self._driver or "sec2",
                "read_mode": "buffered" if self._driver in (None, "sec2") else None}
