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


def per_rep(value: Any, reps: Sequence[int]) -> list[float | None]:
    """Each of the repetitions ``reps``' value of a merged number (``ResultsFile.rep_numbers``;
    a plain number was equal in all, ``None``: a row that repetition did not measure)."""
    from ..spread import Spread

    if isinstance(value, Spread):
        got = dict(zip(value.index if value.index is not None else reps, value.reps))
        return [got.get(k) for k in reps]
    return [float(value)] * len(reps)


def measured(value: Any, reps: Sequence[int]) -> list[float]:
    """The values of the repetitions that measured ``value``."""
    return [v for v in per_rep(value, reps) if v is not None]


def met_in(values: Sequence[Any], reps: Sequence[int], ok) -> int:
    """In how many of the repetitions ``reps`` ``ok`` holds for every one of ``values``
    (each judged repetition by repetition, never on medians; not measured: not met)."""
    columns = [per_rep(v, reps) for v in values]
    return sum(all(col[r] is not None and ok(col[r]) for col in columns) for r in range(len(reps)))


def met_phrase(k: int, reps: int) -> str:
    """``met in all 3 repetitions`` / ``missed in all 3 repetitions`` / ``met in 1 of 3 repetitions``."""
    if k == reps:
        return f"met in all {reps} repetitions" if reps > 1 else "met"
    if k == 0:
        return f"missed in all {reps} repetitions" if reps > 1 else "missed"
    return f"met in {k} of {reps} repetitions"
