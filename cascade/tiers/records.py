"""On-disk record format of the file (Lustre) tier.

Each record is a 4096-byte header followed by the payload, padded to 4096 bytes so every
payload starts on a page boundary (O_DIRECT reads, Lustre page alignment)::

    offset  size  field
    0       8     magic b"CASCREC3"
    8       4     flags (1 = tombstone)
    12      4     namespace length n (<= 255)
    16      16    block id (raw bytes)
    32      8     payload length
    40      8     payload checksum (XXH3-64 seeded by namespace and id: see key_seed)
    48      8     target: file id of the record a tombstone kills, or a copy's origin (else 0)
    56      8     target: offset of that record (else 0)
    64      16    parent block id (raw bytes; flag 2 says it is set)
    80      8     expiry, wall-clock seconds since the epoch (float64; 0 = none)
    88      n     namespace (UTF-8)
    88+n    4     header check: XXH3-64 of bytes [0, 88+n) seeded with the directory's
                  header key (the low 32 bits; see below)

A tombstone whose target is its own position is a record killed in place (a delete
rewrites the header and keeps the payload length, so the scan skips the old payload): it
kills every earlier record of its (namespace, id). A tombstone naming file 0 is a void:
a record rewritten so that it kills nothing else (a compaction's copy that lies after its
key's live record). Any other tombstone kills the one record it names. A record that is
not a tombstone and names a target is a compaction's copy of the record there (its
origin; see :mod:`.file_recovery`).

A header whose magic or check does not match is not a record; a payload whose checksum
does not match is corrupt. Neither is ever served as data. The payload checksum is
seeded with the record's (namespace, id), so a record copied or planted under another
id fails it. The header check is keyed with a secret of the files' directory (its
``header.key``: :func:`~.record_io.header_key`, as private as the files): only the
store writes headers that pass it (a keyed hash, not a cryptographic MAC: it stops
headers made without the key, which no call returns). Bytes that a tenant put inside a payload can look
like a whole record, checksums and all (both seeds are computable from the format);
after a damaged header the restart scan resynchronises page by page, through that
payload, and such a planted header now fails the check instead of being adopted as
another namespace's block. Records of versions 1 and 2 (``CASCREC1``, ``CASCREC2``:
an unkeyed CRC-32) are not read: a file that starts with one is dropped whole at open.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import xxhash

PAGE = 4096
HEADER_BYTES = PAGE
MAGIC = b"CASCREC3"
OLD_MAGICS = (b"CASCREC1", b"CASCREC2")  # earlier formats: never read
FLAG_TOMBSTONE = 1
FLAG_PARENT = 2
_FIXED = struct.Struct("<8sII16sQQQQ16sd")
MAX_NAMESPACE_BYTES = 255


def pad(n: int) -> int:
    """``n`` rounded up to a whole page."""
    return (n + PAGE - 1) // PAGE * PAGE


def header_check(head: bytes, header_key: int) -> int:
    """The keyed check of a header's bytes (see the module docstring)."""
    return xxhash.xxh3_64_intdigest(head, seed=header_key) & 0xFFFFFFFF


def key_seed(namespace: str, block_id: str) -> int:
    """The XXH3 seed binding a record's payload checksum to its (namespace, id)."""
    return xxhash.xxh3_64_intdigest(namespace.encode() + b"\0" + bytes.fromhex(block_id))


@dataclass(frozen=True, slots=True)
class RecordHeader:
    namespace: str
    block_id: str
    payload_len: int
    checksum: int
    tombstone: bool = False
    target_file: int = 0
    target_offset: int = 0
    parent: str | None = None
    expires: float = 0.0  # wall-clock expiry (time.time()), 0 = none

    @property
    def record_bytes(self) -> int:
        """Bytes the whole record occupies in its file (header + padded payload)."""
        return HEADER_BYTES + pad(self.payload_len)

    def pack(self, header_key: int) -> bytes:
        """The header page, checked with the directory's ``header_key``."""
        ns = self.namespace.encode()
        if len(ns) > MAX_NAMESPACE_BYTES:
            raise ValueError(f"namespace longer than {MAX_NAMESPACE_BYTES} bytes")
        flags = (FLAG_TOMBSTONE if self.tombstone else 0) | (FLAG_PARENT if self.parent else 0)
        head = _FIXED.pack(
            MAGIC, flags, len(ns), bytes.fromhex(self.block_id), self.payload_len, self.checksum,
            self.target_file, self.target_offset, bytes.fromhex(self.parent) if self.parent else bytes(16),
            self.expires,
        ) + ns
        head += struct.pack("<I", header_check(head, header_key))
        return head.ljust(HEADER_BYTES, b"\0")


def unpack_header(buf: bytes, header_key: int) -> RecordHeader | None:
    """The header in ``buf`` (at least 4096 bytes), or None if it is not a valid header
    of a directory whose header key is ``header_key``."""
    if len(buf) < _FIXED.size + 4 or buf[:8] != MAGIC:
        return None
    magic, flags, ns_len, raw_id, payload_len, digest, tfile, toff, raw_parent, expires = _FIXED.unpack_from(buf)
    end = _FIXED.size + ns_len
    if ns_len > MAX_NAMESPACE_BYTES or len(buf) < end + 4:
        return None
    (check,) = struct.unpack_from("<I", buf, end)
    if check != header_check(bytes(buf[:end]), header_key):
        return None
    try:
        namespace = buf[_FIXED.size:end].decode()
    except UnicodeDecodeError:
        return None
    if not math.isfinite(expires) or expires < 0:
        return None
    parent = raw_parent.hex() if flags & FLAG_PARENT else None
    return RecordHeader(namespace, raw_id.hex(), payload_len, digest, bool(flags & FLAG_TOMBSTONE), tfile, toff,
                        parent, expires)
