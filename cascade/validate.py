"""Checks of per-block arguments (priority, TTL), done before anything is stored."""
from __future__ import annotations

import math
import numbers
from typing import Any

from .errors import InvalidBlock

PRIORITY_MIN, PRIORITY_MAX = -64, 64  # each step doubles a block's value: 2**64 is plenty


def check_priority(priority: Any) -> int:
    """An int in [PRIORITY_MIN, PRIORITY_MAX] (bool and floats are refused)."""
    if type(priority) is int and PRIORITY_MIN <= priority <= PRIORITY_MAX:
        return priority  # the common case, without the abstract-class check (a microsecond a put)
    if isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
        raise InvalidBlock(f"priority must be an int in [{PRIORITY_MIN}, {PRIORITY_MAX}], got {priority!r}")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise InvalidBlock(f"priority must be in [{PRIORITY_MIN}, {PRIORITY_MAX}], got {priority}")
    return int(priority)


def check_ttl(ttl: Any) -> float:
    """Seconds as a finite real number >= 0 (0 = no TTL; str, bool, NaN, inf refused)."""
    if isinstance(ttl, bool) or not isinstance(ttl, numbers.Real):
        raise InvalidBlock(f"ttl must be a number of seconds >= 0, got {ttl!r}")
    value = float(ttl)
    if not math.isfinite(value) or value < 0:
        raise InvalidBlock(f"ttl must be a finite number of seconds >= 0, got {ttl!r}")
    return value
