"""Numbers measured in several repetitions: the median to plot and quote, and the spread.

A suite run (``python -m benchmark.suite``) runs every workload N times at one commit. The
paper merges the N results files of a workload into one document (:func:`merge`): where the
repetitions hold numbers that differ, the merged document holds a :class:`Spread` -- a
``float`` equal to the median that also carries every repetition's value. Arithmetic on
spreads is done per repetition (repetition k with repetition k), so a ratio or a sum that
a figure computes is itself the median (and min-max) of that quantity over repetitions,
not a ratio of medians. Values equal in every repetition (sizes, counts, deterministic hit
ratios) stay plain numbers. A row that some repetitions did not measure is kept, as spreads
over the repetitions that did; arithmetic with it is over the repetitions both operands
measured.
"""
from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Sequence
from typing import Any

Number = int | float


class Spread(float):
    """A measured number over repetitions: ``float(x)`` is the median, ``x.reps`` every
    repetition's value in repetition order, ``x.lo``/``x.hi`` the min and max.
    ``x.index`` names the repetitions (0-based) the values come from when the merge set
    them (a row some repetitions did not measure); ``None`` means "in order, all of them"."""

    reps: tuple[float, ...]
    index: tuple[int, ...] | None

    def __new__(cls, reps: Sequence[float], index: Sequence[int] | None = None) -> "Spread":
        values = tuple(float(v) for v in reps)
        if not values:
            raise ValueError("a Spread needs at least one repetition")
        if index is not None and len(index) != len(values):
            raise ValueError(f"{len(values)} values for {len(index)} repetitions")
        obj = super().__new__(cls, statistics.median(values))
        obj.reps = values
        obj.index = None if index is None else tuple(index)
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

    def by_rep(self) -> dict[int, float]:
        """Repetition number -> value."""
        return dict(zip(self.index if self.index is not None else range(len(self.reps)), self.reps))

    def __repr__(self) -> str:
        return f"Spread(median={float(self)!r}, reps={self.reps!r}, index={self.index!r})"

    def __reduce__(self):
        return (Spread, (self.reps, self.index))

    # -- arithmetic: per repetition ----------------------------------------------------------
    def _apply(self, other: Any, op: Callable[[float, float], float]) -> Any:
        if isinstance(other, Spread):
            return pairwise(op, self, other)
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return Spread([op(a, float(other)) for a in self.reps], self.index)
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
    def __neg__(self): return Spread([-a for a in self.reps], self.index)
    def __abs__(self): return Spread([abs(a) for a in self.reps], self.index)
    def __pos__(self): return self


def _aligned(a: Spread, b: Spread) -> tuple[list[tuple[float, float]], tuple[int, ...] | None]:
    """The value pairs of the repetitions ``a`` and ``b`` share, and their index. Spreads
    the merge gave an index combine over the repetitions both measured; others only when
    they have as many repetitions."""
    if a.index is not None and b.index is not None and a.index != b.index:
        left, right = a.by_rep(), b.by_rep()
        common = sorted(set(left) & set(right))
        if not common:
            raise ValueError(f"spreads of repetitions {a.index} and {b.index} share none")
        return [(left[k], right[k]) for k in common], tuple(common)
    if len(a.reps) != len(b.reps):
        raise ValueError(f"spreads of {len(a.reps)} and {len(b.reps)} repetitions do not combine")
    return list(zip(a.reps, b.reps)), a.index if a.index is not None else b.index


def pairwise(op: Callable[[float, float], float], a: Any, b: Any) -> Any:
    """``op`` of two measured values repetition by repetition (``pairwise(max, x, y)`` is
    the better of two limits in each repetition, not of their medians)."""
    if isinstance(a, Spread) and isinstance(b, Spread):
        pairs, index = _aligned(a, b)
        return Spread([op(x, y) for x, y in pairs], index)
    if isinstance(a, Spread):
        return Spread([op(x, float(b)) for x in a.reps], a.index)
    if isinstance(b, Spread):
        return Spread([op(float(a), y) for y in b.reps], b.index)
    return op(a, b)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def low_high(value: Any) -> tuple[float, float]:
    """(min, max) of a measured value; a plain number is its own min and max."""
    if isinstance(value, Spread):
        return value.lo, value.hi
    return float(value), float(value)


def _unsigned_zero(text: str) -> str:
    """``-0`` or ``-0.0`` (a small negative number rounded to zero) without its sign."""
    return text[1:] if re.fullmatch(r"-0+(\.0+)?", text) else text


def fmt(value: Any, one: Callable[[float], str], *, sep: str = "--") -> str:
    """``value`` formatted by ``one``; a spread that varies as ``median (min--max)``; a zero
    is never signed."""
    def show(v: float) -> str:
        return _unsigned_zero(one(v))

    if isinstance(value, Spread) and value.varies:
        lo, hi = show(value.lo), show(value.hi)
        if lo != hi:
            if sep == "--" and (lo.startswith("-") or hi.startswith("-")):
                sep = r"\,--\,"  # "-133 -- -127", not "-133---127"
            return f"{show(float(value))} ({lo}{sep}{hi})"
    return show(float(value) if isinstance(value, Spread) else value)


# -- merging repetitions ---------------------------------------------------------------------
#: Row keys that identify a row (matched across repetitions by these, not by position).
IDENTITY_KEYS = ("system", "size", "block_bytes", "blocks", "bytes", "mode", "ranks", "rank", "writers", "readers",
                 "capacity_blocks", "tier", "name", "policy", "scope", "op", "fault", "source", "queue_depth",
                 "threads", "form", "cache", "file_read_mode", "limit")


class MergeError(ValueError):
    """Repetitions hold lists that cannot be matched: ``keys`` is where (from the document
    root), ``rep`` the repetition that differs from the first."""

    def __init__(self, problem: str, rep: int) -> None:
        super().__init__(problem)
        self.problem = problem
        self.rep = rep
        self.keys: list[str | int] = []


def _identity(row: dict) -> tuple | None:
    """The row's identity keys and values; a rank's row (``rank``) is identified by the rank
    alone, as its other keys (``blocks`` it held, ...) are measured."""
    keys = ("rank",) if "rank" in row else IDENTITY_KEYS
    ident = tuple((k, row[k]) for k in keys if k in row and not isinstance(row[k], (dict, list)))
    return ident or None


def merge(docs: Sequence[Any], index: Sequence[int] | None = None, *, partial: bool = False) -> Any:
    """One document from the same document of several repetitions (see the module doc);
    ``index`` numbers each document's repetition (default 0, 1, ...).

    Dicts keep the keys every repetition has. Lists of rows are matched by their identity
    keys; a row that only some repetitions hold is kept, merged over those (``partial``:
    its numbers are then spreads over those repetitions even where they agree, so that no
    one counts it as measured in the others). Lists of numbers of equal length are merged
    element by element, lists of strings are united; other lists that differ in length
    raise :class:`MergeError`. Anything else that differs (timestamps, commands) is taken
    from the first repetition."""
    index = tuple(range(len(docs))) if index is None else tuple(index)
    first = docs[0]
    if all(is_number(d) for d in docs):
        return _merge_numbers(docs, index, partial)
    if all(isinstance(d, dict) for d in docs):
        keys = [k for k in first if all(k in d for d in docs)]
        return {k: _merge_at(k, [d[k] for d in docs], index, partial and k not in IDENTITY_KEYS) for k in keys}
    if all(isinstance(d, list) for d in docs):
        return _merge_lists(docs, index, partial)
    return first


def _merge_numbers(docs: Sequence[Any], index: tuple[int, ...], partial: bool) -> Any:
    values = [float(d) for d in docs]
    if not all(math.isfinite(v) for v in values) or (not partial and all(d == docs[0] for d in docs)):
        return docs[0]
    return Spread(values, index)


def _merge_at(key: str | int, docs: Sequence[Any], index: tuple[int, ...], partial: bool) -> Any:
    """:func:`merge` of the values at ``key``, a :class:`MergeError` naming where."""
    try:
        return merge(docs, index, partial=partial)
    except MergeError as exc:
        exc.keys.insert(0, key)
        raise


def _merge_lists(docs: Sequence[list], index: tuple[int, ...], partial: bool) -> list:
    groups = _rows_by_identity(docs, index)
    if groups is not None:
        return [_merge_at(n, [r for r, _ in g], [k for _, k in g], partial or len(g) < len(docs))
                for n, g in enumerate(groups)]
    if all(len(d) == len(docs[0]) for d in docs):
        return [_merge_at(n, list(items), index, partial) for n, items in enumerate(zip(*docs))]
    if all(isinstance(v, str) for d in docs for v in d):
        return list(dict.fromkeys(v for d in docs for v in d))
    n = next(n for n, d in enumerate(docs) if len(d) != len(docs[0]))
    raise MergeError(f"has {len(docs[n])} entries in repetition {index[n]} and {len(docs[0])} in repetition "
                     f"{index[0]}, without identity keys to match them by", index[n])


def _rows_by_identity(docs: Sequence[list], index: tuple[int, ...]) -> list[list[tuple[dict, int]]] | None:
    """Each row with the repetition it comes from, grouped by identity in order of first
    appearance; None unless every entry is a row with an identity unique in its list."""
    if not any(docs) or not all(isinstance(r, dict) for d in docs for r in d):
        return None
    idents = [[_identity(r) for r in d] for d in docs]
    if any(i is None for ids in idents for i in ids) or any(len(set(ids)) != len(ids) for ids in idents):
        return None
    groups: dict[tuple, list[tuple[dict, int]]] = {}
    for ids, rows, k in zip(idents, docs, index):
        for ident, row in zip(ids, rows):
            groups.setdefault(ident, []).append((row, k))
    return list(groups.values())
