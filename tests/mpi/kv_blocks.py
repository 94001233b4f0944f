"""Block data and comparison shared by the multi-rank tests."""
from __future__ import annotations

import numpy as np


def block(spec, seed: int):
    """A deterministic (key, value) pair of ``spec``'s shape and dtype."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(spec.shape).astype(spec.dtype),
            rng.standard_normal(spec.shape).astype(spec.dtype))


def same(got, expected) -> bool:
    """Whether a get's result holds exactly ``expected``'s bytes (a miss is not)."""
    return got is not None and np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
