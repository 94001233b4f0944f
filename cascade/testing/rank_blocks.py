"""Blocks of known content per rank, for the multi-rank restart and failure jobs: what
a rank puts (:func:`content`) and the check that a later job reads it all back exact
(:func:`count_wrong_and_missing`)."""
from __future__ import annotations

from typing import Any

import numpy as np

from cascade import CascadeStore


def content(spec: Any, rank: int, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Key and value of rank ``rank``'s ``i``-th block (the same on every run)."""
    rng = np.random.default_rng([rank, i])
    return rng.standard_normal(spec.shape).astype(spec.dtype), rng.standard_normal(spec.shape).astype(spec.dtype)


def count_wrong_and_missing(store: CascadeStore, ids_by_rank: list[list[str]]) -> tuple[int, int]:
    """Read every block of ``ids_by_rank`` (rank r's ids, put as :func:`content`)
    through ``store``: how many came back with other bytes, and how many not at all."""
    wrong = missing = 0
    for rank, ids in enumerate(ids_by_rank):
        for i, bid in enumerate(ids):
            got = store.get(bid)
            if got is None:
                missing += 1
            elif not all(np.array_equal(a, b) for a, b in zip(got, content(store.spec, rank, i))):
                wrong += 1
    return wrong, missing
