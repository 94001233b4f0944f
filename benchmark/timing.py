"""Timing helpers shared by workloads: repeat, drop warm-up, summarise without the mean."""
from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

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


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Meanwhile, every object alive on entry is out of the garbage collector's reach
    (``gc.freeze()``), so a ``gc.collect()`` before a timed pass walks only what the
    passes made. A full collection walks every tracked object: with torch and LMCache
    imported, 214k of them in 0.14 s, which evicts the CPU's caches, so a short pass
    timed after one starts cold (benchmark small_blocks' docstring)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def gbps(nbytes: int, seconds: float) -> float:
    """Decimal GB/s."""
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


#: Zero-copy views timed at least per measurement of :func:`time_views`.
VIEWS_TIMED = 1024


def time_views(store: Any, block_ids: Sequence[str], at_least: int = VIEWS_TIMED) -> tuple[float, int]:
    """Microseconds per ``store.view`` taken and given back over ``block_ids`` (one
    untimed pass, then passes over them timed in one go, at least ``at_least`` views),
    and how many views missed. Timed a pass at a time after a ``gc.collect()``, the 16
    or 32 views of a big block size each paid a cold start (suite at b797029: 32.5 us at
    2 MiB, 42.6 at 16 MiB, against 20.5 at 4 KiB); in one go, ad hoc: 24.0 and 27.8."""
    passes = max(1, at_least // len(block_ids))
    missed = 0
    for b in block_ids:
        with store.view(b) as block:
            missed += block is None
    gc.collect()  # the timing pays for no garbage of what ran before it
    started = time.perf_counter()
    for _ in range(passes):
        for b in block_ids:
            with store.view(b) as block:
                missed += block is None
    return (time.perf_counter() - started) / (passes * len(block_ids)) * 1e6, missed
