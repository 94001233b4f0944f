"""Warm restart of the file tier: rebuild its index by scanning its files.

Records are read header by header in file order. A page that holds no valid header is
skipped (resynchronising at the next page) and counted (``bad_headers``); a record
running past the end of its file is torn (``torn_records``). A tombstone written over
a record in place forgets every earlier record of its key (one still live is killed on
disk: a compaction of the tombstone's file does not carry it); an appended tombstone kills
the record it names; a void (a tombstone naming file 0) kills nothing. A compaction's
copy names its origin: it is dropped (voided on disk) while its origin's file is still
here and that record is no longer the key's live one (deleted or replaced before the
compaction ended); an origin still live means a crash mid-compaction, and the copy wins.
A key seen twice keeps its later record, and the earlier one is killed on disk (the copy
first forgets its origin, so that kill does not drop it at the next restart; a copy that
cannot is voided, its origin staying), unless its bytes fail their checksum (a
replacement torn by a crash: the earlier record stays, the torn one is voided). The last
record of each file is verified against its checksum now (a crash tears appends at the
end); every read verifies the others. A file that cannot be read through (an I/O error)
keeps what its scan found so far and is counted in ``bad_files``. Files left with
nothing live are removed, and so is a file of an earlier record format (``old_files``:
see :mod:`.records`).

A kill or void the scan cannot write (an I/O error, a full disk) is kept pending as a
delete's is (``pending_deletes``, retried at later changes), and until every such kill
is on disk no file with records is removed or compacted (``_restart_kills``): the later
records that made the scan decide it stay, so a restart meanwhile decides the same, and
a superseded or deleted record never comes back (were they compacted away first, the
old record would be the key's only one).
"""
from __future__ import annotations

import logging
import os
import re

from ..checksum import checksum
from ..errors import CascadeError
from .base import BlockKey
from .file_state import Loc, SegmentFile
from .records import HEADER_BYTES, OLD_MAGICS, PAGE, RecordHeader, key_seed, unpack_header

log = logging.getLogger("cascade.tiers.file_tier")


class Recovery:
    """The :class:`~cascade.tiers.file_tier.FileTier` methods that rebuild its index
    from its files at open (a mixin: it uses the tier's files, index and counters)."""

    def _recover(self) -> None:
        # \d{6,}: ids are zero-padded to 6 digits and keep growing past 999999.
        pattern = re.compile(rf"^agg_rank{self.rank:03d}_(\d{{6,}})\.bin$")
        ids = sorted(int(m.group(1)) for n in os.listdir(self.directory) if (m := pattern.match(n)))
        self._next_id = max(ids, default=0) + 1  # skipped names too: never reuse one
        for file_id in ids:
            try:
                f = self._open_file(file_id)
            except (OSError, CascadeError) as exc:  # a directory, symlink or foreign file in its place
                self.counters["bad_files"] += 1
                log.warning("%s: skipping %s: %s", self.name, self._file_path(file_id), exc)
                continue
            try:
                self._scan(f)
            except OSError as exc:  # e.g. EIO: the records found so far stay (every read verifies them)
                self.counters["bad_files"] += 1
                log.warning("%s: cannot read %s through (%s): kept what was found before", self.name, f.path, exc)
        self._hold_files_for_kills()
        for f in list(self._files.values()):  # (an empty file holds nothing a pending kill relies on)
            if f.live == 0 and not self._needed_tombstones(f) and not (f.size and self._restart_kills):
                self._drop_file(f)
        self.counters["recovered"] = len(self._index)
        if ids:
            log.info("%s: recovered %d blocks from %d files in %s", self.name, len(self._index), len(ids), self.directory)

    def _hold_files_for_kills(self) -> None:
        """Keep the kills this scan could not write (every kill pending now: none was
        before) in ``_restart_kills``: no file goes while one is (see the module docstring)."""
        self._restart_kills = set(self._pending_kills)
        if self._restart_kills:
            log.warning("%s: %d records this restart found superseded or dead cannot be killed in %s: kept "
                        "pending; no file is removed or compacted until they are written",
                        self.name, len(self._restart_kills), self.directory)

    def _forget_origin(self, f: SegmentFile, key: BlockKey, loc: Loc) -> bool:
        """Rewrite a compaction copy's header without its origin; False on an I/O error."""
        header = RecordHeader(key[0], key[1], loc.length, loc.checksum, parent=loc.parent, expires=loc.expires)
        try:
            return os.pwrite(f.fd, header.pack(self._header_key), loc.offset) == HEADER_BYTES
        except OSError:
            return False

    def _scan(self, f: SegmentFile) -> None:
        offset = 0
        last: tuple[BlockKey, Loc] | None = None
        if os.pread(f.fd, len(OLD_MAGICS[0]), 0) in OLD_MAGICS:  # an earlier format: dropped whole
            self.counters["old_files"] += 1
            log.warning("%s: %s holds records of an earlier format: not read (dropped)", self.name, f.path)
            return
        while offset + HEADER_BYTES <= f.size:
            header = unpack_header(os.pread(f.fd, HEADER_BYTES, offset), self._header_key)
            if header is None:  # not a record: resynchronise at the next page
                self.counters["bad_headers"] += 1
                offset += PAGE
                continue
            if offset + header.record_bytes > f.size:
                self.counters["torn_records"] += 1
                break
            key = (header.namespace, header.block_id)
            if header.tombstone and (header.target_file, header.target_offset) == (f.file_id, offset):
                if key in self._index:  # killed in place: every earlier record of the key is dead too,
                    old = self._forget(key)  # and killed on disk (a compaction does not carry this tombstone)
                    self._kill_record(key, old.file_id, old.offset, old.length)
            elif header.tombstone and header.target_file:
                f.tombstones.append((key, header.target_file, header.target_offset))
                loc = self._index.get(key)
                if loc is not None and (loc.file_id, loc.offset) == (header.target_file, header.target_offset):
                    self._forget(key)
            elif not header.tombstone:
                loc = Loc(f.file_id, offset, header.payload_len, header.checksum, header.parent, header.expires)
                old = self._index.get(key)
                origin = (header.target_file, header.target_offset)
                if header.target_file in self._files and (old is None or (old.file_id, old.offset) != origin):
                    self._void_record(key, f.file_id, offset, header.payload_len)  # its origin died first
                elif old is not None and not self._intact(f, key, loc):  # a torn replacement: the old one stays
                    self.counters["torn_records"] += 1
                    self._void_record(key, f.file_id, offset, header.payload_len)
                elif header.target_file in self._files and not self._forget_origin(f, key, loc):
                    # old is this copy's live origin (a crash mid-compaction): killed while the copy
                    # names it, both would go at the next restart. The origin stays, the copy is voided.
                    self._void_record(key, f.file_id, offset, header.payload_len)
                else:
                    self._remember(key, loc)
                    if old is not None:  # an older record, a copy's origin included: killed for good
                        self._kill_record(key, old.file_id, old.offset, old.length)
                    last = (key, loc)
            offset += header.record_bytes
        else:  # (not after a break) bytes left at the end, too few for a header: a torn record
            if offset < f.size:
                self.counters["torn_records"] += 1
        # A crash mid-append tears the last record (or, with writes in flight from several
        # threads, one of the last few): verify the last now; every read verifies the rest.
        if last is not None and self._index.get(last[0]) is last[1] and not self._intact(f, *last):
            self.counters["torn_records"] += 1
            self._forget(last[0])

    def _intact(self, f: SegmentFile, key: BlockKey, loc: Loc) -> bool:
        """Whether the record at ``loc`` in ``f`` holds its whole payload, matching its checksum."""
        buf = bytearray(loc.length)
        return (os.preadv(f.fd, [buf], loc.offset + HEADER_BYTES) == len(buf)
                and checksum([buf], key_seed(*key)) == loc.checksum)
