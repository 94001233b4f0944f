"""Plain-text reports of a store's stats (what ``cascade run`` and ``cascade stats`` print)."""
from __future__ import annotations

from typing import Any

_COLUMNS = ("blocks", "bytes", "capacity", "hits", "misses", "evictions", "promotions",
            "demotions", "corruptions", "full_events")


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def tier_table(stats: dict[str, Any]) -> str:
    """A fixed-width table with one row per tier of ``CascadeStore.stats()``."""
    header = ["tier", *_COLUMNS]
    rows = [header]
    for name, tier in stats["tiers"].items():
        row = [name]
        for col in _COLUMNS:
            value = tier.get(col, 0)
            row.append(human_bytes(value) if col in ("bytes", "capacity") else str(value))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summary(stats: dict[str, Any]) -> str:
    """One paragraph of store-wide counts."""
    gets = stats["gets"] or 1
    return (f"blocks cached {stats['blocks']}; puts {stats['puts']} (stored {stats['stored']}, "
            f"deduplicated {stats['deduped']}, rejected {stats['rejected']}); gets {stats['gets']} "
            f"(hits {stats['hits']}, {100 * stats['hits'] / gets:.1f}%); policy {stats['policy']}")
