"""SHM tier: blocks in a node-local ``/dev/shm`` slab (mmap).

The slab is one file, mode 0600, named ``cascade-<pid>-<128 random bits>`` so no other
user can guess or open it. It is removed on :meth:`close`, at interpreter exit, and, for
slabs whose process died (SIGKILL), by the next tier opened in the same directory.
"""
from __future__ import annotations

import logging
import mmap
import os
import re
import secrets
import weakref
from typing import Any

import numpy as np

from .. import buffers
from ..errors import TierFull
from .base import TierKind
from .slab_tier import SlabTier

log = logging.getLogger(__name__)
_NAME_RE = re.compile(r"^cascade-(\d+)-[0-9a-f]{32}$")


def remove_stale_slabs(directory: str) -> list[str]:
    """Delete this user's slab files whose owning process is gone; return their paths."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = _NAME_RE.match(name)
        if not m or _pid_alive(int(m.group(1))):
            continue
        path = os.path.join(directory, name)
        try:
            if os.stat(path).st_uid == os.getuid():
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class ShmTier(SlabTier):
    """A ``capacity``-byte mmap'd slab in ``directory`` (default ``/dev/shm``).

    Pages are only backed by memory once written, so a large capacity costs nothing
    until used. Filling tmpfs beyond its size raises :class:`TierFull` (SIGBUS is avoided
    by reserving the file's blocks with ``posix_fallocate`` up front).
    """

    name = "shm"
    kind = TierKind.SHM

    def __init__(self, capacity: int, directory: str = "/dev/shm", *, verify: bool = False) -> None:
        super().__init__(capacity, verify=verify)
        self.path = os.path.join(directory, f"cascade-{os.getpid()}-{secrets.token_hex(16)}")
        self._mmap: mmap.mmap | None = None
        self._view: memoryview | None = None
        if capacity == 0:
            self._finalizer = None
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        # Unlink at exit even if close() is never called; weakref keeps the tier collectable.
        self._finalizer = weakref.finalize(self, _unlink_quietly, self.path)
        try:
            try:
                os.posix_fallocate(fd, 0, capacity)
            except OSError as exc:
                raise TierFull(f"shm: cannot reserve {capacity} bytes in {directory}: {exc.strerror}") from exc
            # MAP_POPULATE: fault the (already reserved) pages in now, not on the first puts
            self._mmap = mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        except BaseException:
            os.close(fd)
            self._finalizer()
            raise
        os.close(fd)
        self._view = memoryview(self._mmap)
        self._bytes = np.frombuffer(self._mmap, dtype=np.uint8)

    # numpy copies release the GIL (memoryview slice assignment does not), so a put's
    # copy overlaps the content hashing running in another thread.
    def _copy_in(self, offset: int, part: Any) -> int:
        return buffers.copy(self._bytes[offset:offset + buffers.nbytes(part, "block part")], part)

    def _copy_out(self, offset: int, out: Any) -> None:
        buffers.copy(out, self._bytes[offset:offset + buffers.nbytes(out, "output buffer")])

    def _slab_view(self, offset: int, length: int) -> Any:
        return self._view[offset:offset + length]

    def close(self) -> None:
        self._bytes = None
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        if self._finalizer is not None:
            self._finalizer()
        self._index.clear()

    @property
    def mapping(self) -> mmap.mmap | None:
        """The slab's shared mapping (None when closed or of capacity 0): what the
        cluster exposes as an RMA window to ranks on other nodes."""
        return self._mmap

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "path": self.path}



class ShmPeerSlabs:
    """Read-only maps of other ranks' SHM slabs on this node (node-local reads, no MPI).

    Ranks of one node exchange their slab paths once (see ``cascade.distributed``); a
    block that a node peer holds in SHM is then copied straight out of its slab.
    """

    def __init__(self) -> None:
        self._maps: dict[str, tuple[mmap.mmap, memoryview]] = {}

    def read_into(self, path: str, offset: int, outs: list[Any]) -> None:
        """Copy the bytes at ``offset`` of the slab ``path`` into ``outs`` (in order)."""
        view = self._view(path)
        pos = offset
        for out in outs:
            dst = buffers.as_byte_view(out, "output buffer", writable=True)
            dst[:] = view[pos:pos + dst.nbytes]
            pos += dst.nbytes

    def _view(self, path: str) -> memoryview:
        entry = self._maps.get(path)
        if entry is None:
            fd = os.open(path, os.O_RDONLY)
            try:
                mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            entry = self._maps[path] = (mm, memoryview(mm))
        return entry[1]

    def close(self) -> None:
        for mm, view in self._maps.values():
            view.release()
            mm.close()
        self._maps.clear()
