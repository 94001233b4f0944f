"""SHM tier: blocks in a node-local ``/dev/shm`` slab (mmap).

The slab is one file, mode 0600, named ``cascade-<pid>-<128 random bits>`` in a private
directory (``shm_dir``, default ``/dev/shm/cascade-<uid>``, checked like ``file_dir``:
see :mod:`.private_dir`; a shared sticky directory such as ``/dev/shm`` itself stands for
its subdirectory ``cascade-<uid>``). Its owner holds an exclusive ``flock`` on it for as long as it
is open; the lock is taken before the file gets its final name. A slab nobody holds a
lock on (its process died, e.g. SIGKILL) is removed by the next tier opened in the same
directory. Locks cross PID namespaces: a store in another container sharing the directory
keeps its slab, even though its PID is not visible here. The slab is removed on
:meth:`close` and at interpreter exit.

Memory is committed lazily: the file is sparse, and room is reserved with
``posix_fallocate`` only as far as the allocator has handed out ranges (in steps of
``_BACKING_STEP``), so an empty tier costs no memory and opens in microseconds (measured
here: a 2 GiB tier opened in 0.2 ms, against 8-11 s when the whole slab was reserved and
prefaulted at open). The kernel zeroes each page once either way: a put that crosses a
step pays for that step (a few ms), and maps its pages in the same go where the kernel
can (``MADV_POPULATE_WRITE``), else they fault in at the first copy into them. A
tmpfs that is full raises :class:`TierFull` at reserve time (never SIGBUS at copy time):
the put goes to a slower tier.
"""
from __future__ import annotations

import fcntl
import logging
import mmap
import os
import re
import secrets
import stat
import sys
import time
import weakref
from typing import Any

import numpy as np

from .. import buffers
from ..buffers.hostcopy import COMPILED
from ..buffers.splitcopy import ENABLED as SPLITS
from ..config import default_shm_dir
from ..errors import BlockNotFound, TierFull
from .base import TierKind
from .private_dir import ensure_private_dir
from .slab_tier import SlabTier

log = logging.getLogger(__name__)
_NAME_RE = re.compile(r"^\.?cascade-(\d+)-[0-9a-f]{32}(?:\.init)?$")
_BACKING_STEP = 4 << 20  # posix_fallocate the slab in steps of this (or to its end)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_STAGING_GRACE_S = 60.0  # a slab still under its staging name is left alone this long
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14 (Python 3.11 lacks the name)


def slab_dir(directory: str) -> str:
    """Where slabs of ``shm_dir`` = ``directory`` go: the directory itself, or, for a
    shared sticky directory such as ``/dev/shm`` or ``/tmp``, its ``cascade-<uid>``."""
    try:
        st = os.stat(directory)
    except OSError:
        return directory
    if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_mode & stat.S_IWOTH:
        return os.path.join(directory, f"cascade-{os.getuid()}")
    return directory


def remove_stale_slabs(directory: str) -> list[str]:
    """Delete this user's slab files in ``slab_dir(directory)`` that no process holds a
    lock on (and whose PID, for slabs of older versions that took no lock, is not alive
    here); return their paths. A slab held by a process of another PID namespace is kept."""
    directory = slab_dir(directory)
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = _NAME_RE.match(name)
        if not m or _pid_alive(int(m.group(1))):  # (checked first: a slab being made is not locked yet)
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
        except OSError:  # gone meanwhile, or a symlink planted in its place
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                continue
            if name.endswith(".init") and time.time() - st.st_mtime < _STAGING_GRACE_S:
                continue  # being made right now, maybe not locked yet (by a process we cannot see)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its owner is alive, wherever it runs
                continue
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
        finally:
            os.close(fd)
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
    """A ``capacity``-byte mmap'd slab in :func:`slab_dir` of ``directory`` (default
    :func:`default_shm_dir`; created 0700 if missing, refused with a :class:`ConfigError` if another user owns it
    or can write to it). Memory is committed as ranges are first handed out (see the
    module docstring; ``prefault`` backs it all at open); :class:`TierFull` when the file
    system cannot back a range. ``split_copies``, ``stream_copies``: see :class:`~.slab_tier.SlabTier`."""

    name = "shm"
    kind = TierKind.SHM

    def __init__(self, capacity: int, directory: str | None = None, *, verify: bool = False,
                 prefault: bool = False, split_copies: bool = True, stream_copies: bool = True) -> None:
        super().__init__(capacity, verify=verify, split_copies=split_copies, stream_copies=stream_copies)
        directory = ensure_private_dir(slab_dir(directory or default_shm_dir()), "shm_dir")
        name = f"cascade-{os.getpid()}-{secrets.token_hex(16)}"
        self.path = os.path.join(directory, name)
        self._mmap: mmap.mmap | None = None
        self._pinnable = None
        self._view: memoryview | None = None
        self._fd: int | None = None
        self._backed = 0  # bytes from the start reserved with posix_fallocate
        self._can_populate = sys.platform.startswith("linux") and hasattr(mmap.mmap, "madvise")
        self._finalizer = None
        if capacity == 0:
            return
        staging = os.path.join(directory, f".{name}.init")
        fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # before the final name (a cleaner may hold it for a moment)
            os.ftruncate(fd, capacity)  # sparse: no memory yet
            os.rename(staging, self.path)
        except BaseException:
            os.close(fd)
            _unlink_quietly(staging)
            raise
        self._fd = fd
        # Unlink at exit even if close() is never called; weakref keeps the tier collectable.
        self._finalizer = weakref.finalize(self, _unlink_quietly, self.path)
        try:
            self._mmap = mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED)
        except BaseException:
            self.close()
            raise
        self._view = memoryview(self._mmap)
        self._hot_host = None if verify else self._view
        self.hot_copies = self.hot_reads = self.hot_batch_reads = self._hot_host is not None
        self.copies_without_gil = self._hot_host is not None and COMPILED  # (read_leased)
        # a batch's hot copies gathered and made at the end of its locked step, shared with
        # the copy helper thread when they add up to enough (splitcopy.BATCH_SPLIT_MIN)
        self.defers_hot_copies = self._hot_host is not None and SPLITS and self._split_copies
        self._bytes = np.frombuffer(self._mmap, dtype=np.uint8)
        self._pinnable = buffers.register_pinnable(self._bytes)  # cudaHostRegister'ed on first device copy
        if prefault:
            self._prefault()
        free = _free_bytes(directory)
        if free is not None and free < capacity - self._backed:
            log.warning("shm: %s has %d bytes free, less than the tier's %d: puts go to slower tiers "
                        "once it is full", directory, free, capacity)

    def _prefault(self) -> None:
        """Back the whole slab with memory and map every page now, so that puts never pay
        a page fault (a fresh tmpfs page costs about 1.6 GB/s of put rate on this machine
        kind, a mapped one about 20: benchmark write_throughput). A /dev/shm too small for
        it leaves the slab backed lazily, as without ``prefault``, with a warning."""
        try:
            os.posix_fallocate(self._fd, 0, self._capacity)
        except OSError as exc:
            log.warning("shm: cannot prefault %d bytes in %s (%s): backing it as puts need it",
                        self._capacity, os.path.dirname(self.path), exc.strerror)
            return
        self._backed = self._capacity
        self._bytes[::mmap.PAGESIZE] = 0  # one write per page maps it (the bytes are zero already)

    def _back(self, end: int) -> None:
        """posix_fallocate the slab up to ``end`` rounded up to a step (or just to
        ``end`` when a step does not fit) and map the new pages (:meth:`_populate`);
        :class:`TierFull` when the file system cannot back ``end``."""
        target = min(self._capacity, -(-end // _BACKING_STEP) * _BACKING_STEP)
        try:
            os.posix_fallocate(self._fd, self._backed, target - self._backed)
        except OSError as exc:
            try:  # a smaller step may still fit
                os.posix_fallocate(self._fd, self._backed, end - self._backed)
                target = end
            except OSError:
                raise TierFull(f"shm: cannot back {end - self._backed} more bytes in "
                               f"{os.path.dirname(self.path)}: {exc.strerror}") from exc
        self._populate(self._backed, target)
        self._backed = target

    def _populate(self, start: int, end: int) -> None:
        """Map slab bytes ``[start, end)``, just backed, in one call (Linux 5.14+
        ``MADV_POPULATE_WRITE``) instead of a page fault at the first copy into each page:
        measured here, 1.3-1.8 us a page against 1.9-2.4 (a 4 KiB put writes one page).
        Where the kernel lacks it, pages fault in as before."""
        if not self._can_populate:
            return
        first = start - start % mmap.PAGESIZE
        try:
            self._mmap.madvise(_MADV_POPULATE_WRITE, first, end - first)
        except (OSError, ValueError):  # an older kernel (EINVAL): fault pages in at first touch
            self._can_populate = False

    # numpy copies release the GIL (memoryview slice assignment does not), so a put's
    # copy overlaps the content hashing running in another thread.
    def _region(self, offset: int, length: int) -> Any:
        return self._bytes[offset:offset + length]

    def _slab_view(self, offset: int, length: int) -> Any:
        return self._view[offset:offset + length]

    def _slab_array(self) -> Any:
        return self._bytes

    def close(self) -> None:
        buffers.forget_pinnable(self._pinnable)  # unregistered before the unmap
        self._pinnable = None
        self._bytes = None
        self._hot_host = None
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:  # a caller still holds arrays from a view(): unmapped when they go
                log.debug("%s: slab still referenced by views; unmapped when they are released", self.name)
            self._mmap = None
        if self._finalizer is not None:
            self._finalizer()
        if self._fd is not None:  # releases the lock: only after the name is gone
            os.close(self._fd)
            self._fd = None
        self._index.clear()

    @property
    def fd(self) -> int | None:
        """The slab file's open descriptor (None once closed): it reopens the slab through
        ``/proc/self/fd`` even after the file's name is gone."""
        return self._fd

    @property
    def mapping(self) -> mmap.mmap | None:
        """The slab's shared mapping (None when closed or of capacity 0): what the
        cluster exposes as an RMA window to ranks on other nodes."""
        return self._mmap

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "path": self.path, "backed_bytes": self._backed}


def _free_bytes(directory: str) -> int | None:
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize



class ShmPeerSlabs:
    """Read-only maps of other ranks' SHM slabs on this node (node-local reads, no MPI).

    Ranks of one node exchange their slab paths once (see ``cascade.distributed``); a
    block that a node peer holds in SHM is then copied straight out of its slab.
    """

    def __init__(self) -> None:
        self._maps: dict[str, tuple[mmap.mmap, memoryview]] = {}

    def read_into(self, path: str, offset: int, outs: list[Any]) -> None:
        """Copy the bytes at ``offset`` of the slab ``path`` into ``outs`` (in order).
        :class:`BlockNotFound` (a miss) when the slab is gone or shorter than that."""
        view = self._view(path)
        if offset < 0 or offset + sum(buffers.nbytes(o, "output buffer") for o in outs) > view.nbytes:
            raise BlockNotFound(f"shm slab {path} holds no such range (its owner closed or restarted)")
        pos = offset
        for out in outs:
            dst = buffers.as_byte_view(out, "output buffer", writable=True)
            dst[:] = view[pos:pos + dst.nbytes]
            pos += dst.nbytes

    def _view(self, path: str) -> memoryview:
        entry = self._maps.get(path)
        if entry is None:
            try:
                fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
            except OSError as exc:  # its owner closed it or died and it was cleaned up
                raise BlockNotFound(f"shm slab {path} is gone: {exc.strerror}") from None
            try:
                mm = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            except (OSError, ValueError) as exc:  # e.g. an empty file
                raise BlockNotFound(f"shm slab {path} cannot be mapped: {exc}") from None
            finally:
                os.close(fd)
            entry = self._maps[path] = (mm, memoryview(mm))
        return entry[1]

    def close(self) -> None:
        for mm, view in self._maps.values():
            view.release()
            mm.close()
        self._maps.clear()
