"""Record checksums: 64-bit XXH3 over a block's bytes (~memcpy speed; not a content id)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import xxhash

from .buffers import host_views

_HOST_BYTES = (bytes, bytearray, memoryview)  # hashed as they are, no view needed


def checksum(parts: Iterable[Any], seed: int = 0) -> int:
    """XXH3-64 (with ``seed``) of the concatenation of ``parts``, without concatenating.
    Parts are any buffers :mod:`cascade.buffers` accepts (device memory is copied to the
    host first). Local, thread-safe."""
    h = xxhash.xxh3_64(seed=seed)
    parts = list(parts)
    for first_other, part in enumerate(parts):  # host bytes (every file-tier read) are hashed as they are
        if type(part) not in _HOST_BYTES:
            break
        h.update(part)
    else:
        return h.intdigest()
    tail = parts[first_other:]  # from the first other kind of buffer on: through host views
    with host_views([p for p in tail if type(p) not in _HOST_BYTES], "block part") as views:
        rest = iter(views)
        for part in tail:
            h.update(part if type(part) in _HOST_BYTES else next(rest))
    return h.intdigest()

