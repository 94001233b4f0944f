"""Small helpers shared by the figure modules."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def default_block_bytes() -> int:
    """Bytes of a block of Cascade's default configuration (model preset and tokens per
    block from ``cascade.config.Config``): the block size the text quotes numbers at."""
    from cascade.config import Config
    from cascade.models import BlockSpec

    defaults = Config(file_dir="/nonexistent")  # defaults only: no environment, no file
    return BlockSpec.for_model(defaults.model, defaults.block_tokens).block_bytes


def reference_row(rows: Sequence[dict[str, Any]], target: int, key: str = "block_bytes") -> dict[str, Any]:
    """The row of the smallest measured size that holds ``target`` bytes (the largest
    row when none does). ``rows`` sorted by ``key``."""
    for row in rows:
        if row[key] >= target:
            return row
    return rows[-1]
