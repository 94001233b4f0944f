"""Per-rank outcomes that feed collective assertions (``assert everywhere(...)``)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Verdict:
    """Every rank's outcome of one check: true when it held on all of them. ``failures``
    is one entry per rank: None where it held, else that rank's detail."""

    def __init__(self, failures: list[str | None]) -> None:
        self.failures = failures

    def __bool__(self) -> bool:
        return all(f is None for f in self.failures)

    def __repr__(self) -> str:
        bad = {r: f for r, f in enumerate(self.failures) if f is not None}
        if not bad:
            return f"<held on all {len(self.failures)} ranks>"
        return "<failed on " + "; ".join(f"rank {r}: {f}" for r, f in bad.items()) + ">"


class Outcome:
    """Whether a call raised what was expected; false ones say what happened instead."""

    def __init__(self, ok: bool, what: str) -> None:
        self.ok, self.what = ok, what

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self.what

    __repr__ = __str__


def raises(exc: type[BaseException] | tuple[type[BaseException], ...], fn: Callable[..., Any], *args: Any,
           match: str = "", **kwargs: Any) -> Outcome:
    """Call ``fn``; true when it raised ``exc`` with ``match`` in its message. Never
    raises itself (an unexpected error becomes a false outcome naming it), so one rank's
    outcome can feed a collective assertion without leaving the others in a hang."""
    try:
        result = fn(*args, **kwargs)
    except exc as err:
        if match in str(err):
            return Outcome(True, f"raised {type(err).__name__}")
        return Outcome(False, f"raised {type(err).__name__}({err}) without {match!r}")
    except Exception as err:  # noqa: BLE001 - reported through the collective assertion
        return Outcome(False, f"raised {type(err).__name__}({err}) instead of {exc}")
    return Outcome(False, f"returned {result!r} instead of raising {exc}")
