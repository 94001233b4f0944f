"""Numbers measured in several repetitions: the median to plot and quote, and the spread.

A suite run (``python -m benchmark.suite``) runs every workload N times at one commit. The
paper merges the N results files of a workload into one document (:func:`merge`): where the
repetitions hold numbers that differ, the merged document holds a :class:`Spread` -- a
``float`` equal to the median that also carries every repetition's value. Arithmetic on
spreads is done per repetition (repetition k with repetition k), so a ratio or a sum that
a figure computes is itself the median (and min-max) of that quantity over repetitions,
not a ratio of medians. Values equal in every repetition (sizes, counts, deterministic hit
ratios) stay plain numbers.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

Number = int | float


class Spread(float):
    """A measured number over repetitions: ``float(x)`` is the median, ``x.reps`` every
    repetition's value in repetition order, ``x.lo``/``x.hi`` the min and max."""

    reps: tuple[float, ...]

    def __new__(cls, reps: Sequence[float]) -> "Spread":
        values = tuple(float(v) for v in reps)
        if not values:
            raise ValueError("a Spread needs at least one repetition")
        obj = super().__new__(cls, statistics.median(values))
        obj.reps = values
        return obj

    @property
    def lo(self) -> float:
        return min(self.reps)

    @property
    def hi(self) -> float:
        return max(self.reps)

    @property
    def varies(self) -> bool:
        return self.lo != self.hi

    def __repr__(self) -> str:
        return f"Spread(median={float(self)!r}, reps={self.reps!r})"

    def __reduce__(self):
        return (Spread, (self.reps,))

    # -- arithmetic: per repetition ----------------------------------------------------------
    def _apply(self, other: Any, op: Callable[[float, float], float]) -> Any:
        if isinstance(other, Spread):
            if len(other.reps) != len(self.reps):
                raise ValueError(f"spreads of {len(self.reps)} and {len(other.reps)} repetitions do not combine")
            return Spread([op(a, b) for a, b in zip(self.reps, other.reps)])
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return Spread([op(a, float(other)) for a in self.reps])
        return NotImplemented

    def __add__(self, o): return self._apply(o, lambda a, b: a + b)
    def __radd__(self, o): return self._apply(o, lambda a, b: b + a)
    def __sub__(self, o): return self._apply(o, lambda a, b: a - b)
    def __rsub__(self, o): return self._apply(o, lambda a, b: b - a)
    def __mul__(self, o): return self._apply(o, lambda a, b: a * b)
    def __rmul__(self, o): return self._apply(o, lambda a, b: b * a)
    def __truediv__(self, o): return self._apply(o, lambda a, b: a / b)
    def __rtruediv__(self, o): return self._apply(o, lambda a, b: b / a)
    def __pow__(self, o): return self._apply(o, lambda a, b: a ** b)
    def __neg__(self): return Spread([-a for a in self.reps])
    def __abs__(self): return Spread([abs(a) for a in self.reps])
    def __pos__(self): return self


def pairwise(op: Callable[[float, float], float], a: Any, b: Any) -> Any:
    """``op`` of two measured values repetition by repetition (``pairwise(max, x, y)`` is
    the better of two limits in each repetition, not of their medians)."""
    if isinstance(a, Spread) or isinstance(b, Spread):
        n = len(a.reps) if isinstance(a, Spread) else len(b.reps)
        ra = a.reps if isinstance(a, Spread) else (float(a),) * n
        rb = b.reps if isinstance(b, Spread) else (float(b),) * n
        if len(ra) != len(rb):
            raise ValueError(f"spreads of {len(ra)} and {len(rb)} repetitions do not combine")
        return Spread([op(x, y) for x, y in zip(ra, rb)])
    return op(a, b)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def low_high(value: Any) -> tuple[float, float]:
    """(min, max) of a measured value; a plain number is its own min and max."""
    if isinstance(value, Spread):
        return value.lo, value.hi
    return float(value), float(value)


def fmt(value: Any, one: Callable[[float], str], *, sep: str = "--") -> str:
    """``value`` formatted by ``one``; a spread that varies as ``median (min--max)``."""
    if isinstance(value, Spread) and value.varies:
        lo, hi = one(value.lo), one(value.hi)
        if lo != hi:
            if sep == "--" and (lo.startswith("-") or hi.startswith("-")):
                sep = r"\,--\,"  # "-133 -- -127", not "-133---127"
            return f"{one(float(value))} ({lo}{sep}{hi})"
    return one(float(value) if isinstance(value, Spread) else value)


# -- merging repetitions ---------------------------------------------------------------------
#: Row keys that identify a row (matched across repetitions by these, not by position).
IDENTITY_KEYS = ("system", "block_bytes", "bytes", "mode", "ranks", "capacity_blocks", "tier", "name", "policy",
                 "scope", "op", "fault", "source", "queue_depth", "threads", "form", "cache", "file_read_mode", "limit")


def _identity(row: dict) -> tuple | None:
    ident = tuple((k, row[k]) for k in IDENTITY_KEYS if k in row and not isinstance(row[k], (dict, list)))
    return ident or None


def merge(docs: Sequence[Any]) -> Any:
    """One document from the same document of several repetitions (see the module doc).

    Dicts keep the keys every repetition has; lists of rows are matched by their identity
    keys (rows missing from a repetition are dropped); lists of numbers of equal length are
    merged element by element; anything else that differs (timestamps, commands) is taken
    from the first repetition."""
    first = docs[0]
    if len(docs) == 1:
        return first
    if all(is_number(d) for d in docs):
        if all(d == first for d in docs) and not any(isinstance(d, float) and math.isnan(d) for d in docs):
            return first
        if not all(math.isfinite(float(d)) for d in docs):
            return first
        return Spread([float(d) for d in docs])
    if all(isinstance(d, dict) for d in docs):
        keys = [k for k in first if all(k in d for d in docs)]
        return {k: merge([d[k] for d in docs]) for k in keys}
    if all(isinstance(d, list) for d in docs):
        if all(isinstance(r, dict) for d in docs for r in d) and first:
            idents = [[_identity(r) for r in d] for d in docs]
            if all(i is not None for ids in idents for i in ids) and all(len(set(ids)) == len(ids) for ids in idents):
                by_ident = [dict(zip(ids, d)) for ids, d in zip(idents, docs)]
                return [merge([b[i] for b in by_ident]) for i in idents[0] if all(i in b for b in by_ident)]
        if all(len(d) == len(first) for d in docs):
            return [merge(list(items)) for items in zip(*docs)]
        return first
    return first
