"""Latency histograms with power-of-two microsecond buckets (cheap enough for every call)."""
from __future__ import annotations

from typing import Any

_BUCKETS = 32  # 1 us .. ~35 min


class LatencyHistogram:
    """Counts of durations in buckets ``[2**(i-1), 2**i)`` microseconds (bucket 0: < 1 us).
    Not thread-safe (the store records under its lock)."""

    __slots__ = ("counts", "total_s")

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.total_s = 0.0

    def record(self, seconds: float) -> None:
        us = seconds * 1e6
        i = 0 if us < 1 else min(int(us).bit_length(), _BUCKETS - 1)  # = floor(log2(us)) + 1
        self.counts[i] += 1
        self.total_s += seconds

    def record_ns(self, ns: int, count: int = 1) -> None:
        """:meth:`record` of a duration in integer nanoseconds (a difference of
        ``time.monotonic_ns`` readings: the hot paths' cheaper form, no float per bucket),
        ``count`` times (a batch's equal shares)."""
        i = (ns // 1000).bit_length()  # 0 below 1 us, else floor(log2(us)) + 1, as record()
        self.counts[i if i < _BUCKETS else _BUCKETS - 1] += count
        self.total_s += ns * count * 1e-9

    @property
    def count(self) -> int:
        return sum(self.counts)

    def quantile(self, q: float) -> float:
        """Upper bound (seconds) of the bucket holding quantile ``q``; 0 when empty."""
        n = self.count
        if n == 0:
            return 0.0
        rank = q * n
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= rank and c:
                return (2 ** i) * 1e-6
        return (2 ** (_BUCKETS - 1)) * 1e-6

    @staticmethod
    def bucket_bounds_s() -> list[float]:
        """Upper bound of each bucket, in seconds."""
        return [(2 ** i) * 1e-6 for i in range(_BUCKETS)]

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "sum_s": self.total_s, "p50_s": self.quantile(0.5),
                "p99_s": self.quantile(0.99), "buckets": self.counts}
