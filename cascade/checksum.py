"""Record checksums: 64-bit XXH3 over a block's bytes (~memcpy speed; not a content id)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import xxhash


def checksum(parts: Iterable[Any], seed: int = 0) -> int:
    """XXH3-64 (with ``seed``) of the concatenation of ``parts`` (buffers), without
    concatenating."""
    h = xxhash.xxh3_64(seed=seed)
    for part in parts:
        h.update(part)
    return h.intdigest()
