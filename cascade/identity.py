"""Block identity: content digests, id validation and namespaces (DESIGN.md section 2).

A block id is the first 32 hex characters (128 bits) of a 256-bit digest of the key bytes
followed by the value bytes. BLAKE3 is the default; SHA-256 is selectable for
compatibility with systems that already use it.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any, Literal

import blake3

from .buffers import host_views
from .errors import InvalidBlock

BlockKey = tuple[str, str]  # (namespace, block id): the key of a block in every layer
DEFAULT_NAMESPACE = "default"
HashAlgo = Literal["blake3", "sha256"]
HASH_ALGOS: tuple[str, ...] = ("blake3", "sha256")
ID_HEX_CHARS = 32
ID_BYTES = ID_HEX_CHARS // 2
HEX_DIGITS = "0123456789abcdef"  # what a block id is made of
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_.:/@+-]{1,200}")
_KNOWN_NAMESPACES: set[str] = set()  # namespaces checked already (every put checks its namespace)
_KNOWN_NAMESPACES_MAX = 4096
# Above this size BLAKE3 hashes with all cores (it releases the GIL either way). Below it
# the thread hand-off costs more than it saves (measured here: 1 MiB hashes at 3.9 GB/s on
# one thread, 1.4 GB/s with all threads on a loaded 2-core machine).
_BLAKE3_THREADED_BYTES = 32 << 20


def _hasher(algo: str, nbytes: int):
    if algo == "blake3":
        threads = blake3.blake3.AUTO if nbytes >= _BLAKE3_THREADED_BYTES else 1
        return blake3.blake3(max_threads=threads)
    if algo == "sha256":
        return hashlib.sha256()
    raise InvalidBlock(f"unknown hash algorithm {algo!r}; choose one of {HASH_ALGOS}")


def digest_parts(parts: Iterable[Any], *, algo: str = "blake3") -> str:
    """Hex id of the concatenation of ``parts`` (buffers in host or device memory; no
    concatenated copy is made; device memory is staged through pinned memory). Local,
    thread-safe."""
    with host_views(list(parts), "block part") as views:
        h = _hasher(algo, sum(v.nbytes for v in views))
        for v in views:
            h.update(v)
        return h.hexdigest()[:ID_HEX_CHARS]


def block_id(key, value, *, algo: str = "blake3") -> str:
    """Content id of a block: 32 hex chars of ``algo(key bytes || value bytes)``.

    ``key`` and ``value`` are any C-contiguous buffers :mod:`cascade.buffers` accepts
    (numpy, torch, cupy, bytes...). Costs one pass over the data (BLAKE3 ~6 GB/s
    multi-threaded here, SHA-256 ~1.2 GB/s), plus a copy to the host for device memory.
    """
    return digest_parts([key, value], algo=algo)


def check_id_python(block_id: str) -> str:
    """Return ``block_id`` if it is 32 lowercase hex chars, else raise :class:`InvalidBlock`
    (:func:`check_id` where ``cascade/_ids.c`` was not built)."""
    # 32 characters, none left once the hex digits are stripped from both ends: 0.37 us
    # against 0.61 us for a regex match here
    if not isinstance(block_id, str) or len(block_id) != ID_HEX_CHARS or block_id.strip(HEX_DIGITS):
        raise InvalidBlock(f"malformed block id {block_id!r}: expected {ID_HEX_CHARS} lowercase hex characters")
    return block_id


try:  # every put checks its id: compiled, 27 ns against 245 for the Python check (timeit, this VM)
    from ._ids import check_id
    COMPILED_ID_CHECK = True
except ImportError:  # not built here (no C compiler)
    check_id = check_id_python
    COMPILED_ID_CHECK = False


def check_namespace(namespace: str) -> str:
    """Return ``namespace`` if it is a valid tenant/model name, else raise :class:`InvalidBlock`.
    Names that passed are remembered (a set lookup instead of a regex on every call)."""
    if type(namespace) is str and namespace in _KNOWN_NAMESPACES:
        return namespace
    if not isinstance(namespace, str) or not _NAMESPACE_RE.fullmatch(namespace):
        raise InvalidBlock(
            f"malformed namespace {namespace!r}: 1-200 chars of letters, digits and _.:/@+-"
        )
    if type(namespace) is str and len(_KNOWN_NAMESPACES) < _KNOWN_NAMESPACES_MAX:
        _KNOWN_NAMESPACES.add(namespace)
    return namespace


def id_owner(block_id: str, world_size: int) -> int:
    """Rank that owns ``block_id`` in the sharded directory: first 8 bytes mod world size."""
    return int(block_id[:16], 16) % world_size
