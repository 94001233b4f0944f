"""Figure: the compared systems side by side (placeholder until the harness's schema exists)."""
from __future__ import annotations

from ..core import Context, FigureSpec, Skip
from ..results import ResultsFile

CAPTION = r"Throughput and latency of the compared systems."
MACROS: tuple[str, ...] = ()


def build(ctx: Context) -> list[ResultsFile]:
    raise Skip("systems comparison not implemented yet")


SPEC = FigureSpec("systems", CAPTION, "write/read throughput and read latency results", build, macros=MACROS)
