"""Timing helpers shared by workloads: repeat, drop warm-up, summarise without the mean."""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def summarize(samples_s: list[float]) -> dict[str, float]:
    """median, p90, p99, max and min of samples (seconds)."""
    a = np.asarray(samples_s, dtype=float)
    return {"n": int(a.size), "median": float(np.median(a)), "p50": float(np.percentile(a, 50)),
            "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max()), "min": float(a.min())}


def time_calls(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def gbps(nbytes: int, seconds: float) -> float:
    """Decimal GB/s."""
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")
