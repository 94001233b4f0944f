"""The file tier's set of files: naming, opening and creating them, the spares its
store's housekeeper makes ahead, and letting them go.

A new file's id is above every file handed out before (a restart reads later files as
newer). With a store, :meth:`Files._new_file` hands out one of :data:`SPARE_FILES`
empty files the housekeeper made outside the store's lock (:meth:`Files._make_spares`);
creating one took 28-540 us at the median here, up to 2.5 ms. A file let go is forgotten
and unlinked under the lock; its descriptors are closed outside it when there is a
housekeeper (closing the last one frees its blocks).
"""
from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager
from typing import Any

from ..errors import CascadeError
from .file_state import SegmentFile
from .record_io import open_own

log = logging.getLogger("cascade.tiers.file_tier")
SPARE_FILES = 2  # empty files the housekeeper keeps ready (a compaction's start takes two)


class Files:
    """The :class:`~cascade.tiers.file_tier.FileTier` methods that make, open and let go
    of its files (a mixin: it uses the tier's directory, rank, files and hooks)."""

    def _file_path(self, file_id: int) -> str:
        return os.path.join(self.directory, f"agg_rank{self.rank:03d}_{file_id:06d}.bin")

    def _open_file(self, file_id: int) -> SegmentFile:
        """One of the tier's existing files, opened and known from now on."""
        path = self._file_path(file_id)
        fd = open_own(path, os.O_RDWR)
        f = SegmentFile(file_id, path, fd, os.fstat(fd).st_size)
        self._files[file_id] = f
        return f

    def _create_file(self, file_id: int) -> SegmentFile:
        """A new empty file, not yet known to the tier (:meth:`_hand_out`);
        ``FileExistsError`` when the name is taken."""
        path = self._file_path(file_id)
        return SegmentFile(file_id, path, open_own(path, os.O_RDWR | os.O_CREAT | os.O_EXCL), 0)

    def _new_file(self) -> SegmentFile:
        """Under the lock: a fresh file with an id above every file handed out before.
        With a housekeeper, a spare it made ahead (:meth:`_make_spares`), and it is asked
        to make the next: creating a file took 28 us at the median in one sitting and
        220-540 us in others, up to 2.5 ms (ext4 on this project's virtio disk, 300-1000
        creates each), a wait every get and put would share under the store's lock.
        Else, or with none ready, created now (a name taken meanwhile, e.g. planted by
        someone else, is passed over)."""
        if self.on_housekeeping_due is not None:
            self.on_housekeeping_due()
        while self._spares:
            f = self._spares.pop(0)
            if f.file_id > self._newest_id:
                return self._hand_out(f)
            self._discard_file(f)  # older than a file created meanwhile
        for _ in range(64):
            file_id, self._next_id = self._next_id, self._next_id + 1
            try:
                return self._hand_out(self._create_file(file_id))
            except FileExistsError:
                continue
        raise CascadeError(f"{self.name}: 64 file names in a row are taken in {self.directory}")

    def _hand_out(self, f: SegmentFile) -> SegmentFile:
        self._files[f.file_id] = f
        self._newest_id = f.file_id
        return f

    def _make_spares(self, lock: AbstractContextManager[Any]) -> None:
        """The housekeeper's step: create files up to :data:`SPARE_FILES` kept ready for
        :meth:`_new_file`, their ids taken under ``lock``, the files created outside it.
        A file that cannot be created now is left for the next round (and made under the
        lock when needed). Nothing without a housekeeper (``on_housekeeping_due``)."""
        if self.on_housekeeping_due is None:
            return
        with lock:
            if self._lock_fd is None:  # closed
                return
            ids = list(range(self._next_id, self._next_id + SPARE_FILES - len(self._spares)))
            self._next_id += len(ids)
        made = []
        for file_id in ids:
            try:
                made.append(self._create_file(file_id))
            except (OSError, CascadeError) as exc:  # a full disk, a planted name: now, under the lock
                log.debug("%s: no spare file %d: %s", self.name, file_id, exc)
        with lock:
            if self._lock_fd is None:  # closed meanwhile
                for f in made:
                    self._drop_file(f)
                return
            self._spares.extend(made)

    def _drop_file(self, f: SegmentFile) -> None:
        for fd in self._unlink_file(f):
            os.close(fd)

    def _unhold(self, f: SegmentFile) -> None:
        """Under the lock: end one use of ``f``; a file compacted while used goes at its
        last use (its descriptors closed by the housekeeper, with a store: closing the
        last one frees its blocks, 46 ms for 128 MiB here)."""
        f.users -= 1
        if f.retired and not f.users:
            self._discard_file(f)

    def _discard_file(self, f: SegmentFile) -> None:
        """Under the lock: forget and unlink ``f``; its descriptors are closed by the
        housekeeper, with a store (see :meth:`_unlink_file`), else now."""
        if self.on_housekeeping_due is None:
            self._drop_file(f)
        else:
            self._freed_fds.extend(self._unlink_file(f))
            self.on_housekeeping_due()

    def _unlink_file(self, f: SegmentFile) -> list[int]:
        """Forget and unlink a file, but leave its descriptors open: returned, for the
        caller to close (outside the store's lock: closing the last one frees the file's
        blocks, which took 46 ms for 128 MiB on this machine's ext4, and unlinking a
        closed file takes as long). A file that cannot be unlinked (EIO, a read-only
        mount) is logged and left: a restart finds it as after a crash before the unlink
        (a compacted source beside its copies), and its descriptors are returned all the same."""
        self._files.pop(f.file_id, None)  # (a spare was never known)
        self._last_streams.pop(f.fd, None)  # its descriptor's number may come back for another file
        try:
            os.unlink(f.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.counters["unlink_errors"] += 1
            log.warning("%s: cannot remove %s (%s): left for a restart to resolve", self.name, f.path, exc)
        return [fd for fd in (f.fd, f.direct_fd) if fd is not None]
