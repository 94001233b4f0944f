"""The file tier's in-memory view of its files: where each live record is (:class:`Loc`)
and what each open aggregated file holds (:class:`SegmentFile`). Plain data; the tier's
lock guards them."""
from __future__ import annotations

from dataclasses import dataclass, field

from .base import BlockKey
from .records import HEADER_BYTES, PAGE


Kill = tuple[BlockKey, int, int, int, bool]  # a record to kill: (key, file id, offset, payload length, void)


@dataclass(slots=True)
class Loc:
    """Where a live record is: its file, header offset, payload length and checksum,
    with the parent and expiry its header records."""
    file_id: int
    offset: int  # of the record header
    length: int  # payload bytes
    checksum: int
    parent: str | None
    expires: float = 0.0  # wall-clock expiry, 0 = none
    corrupt: bool = False  # a compaction found it corrupt and told the store (kept while pinned elsewhere)

    @property
    def record_bytes(self) -> int:
        return HEADER_BYTES + (self.length + PAGE - 1) // PAGE * PAGE  # (pad(), written out: per block of a batch)


@dataclass
class SegmentFile:
    """One open aggregated file of the tier and what it holds."""
    file_id: int
    path: str
    fd: int
    size: int
    live: int = 0  # bytes of live records
    keys: set[BlockKey] = field(default_factory=set)  # of its live records (a compaction's start reads no other file's)
    tombstones: list[tuple[BlockKey, int, int]] = field(default_factory=list)
    direct_fd: int | None = None
    users: int = 0  # reads, writes and compactions in flight: the file is not compacted away meanwhile
    retired: bool = False  # compacted while read: unlinked when its last reader ends
