"""Figure: scaling over ranks and nodes (placeholder until the harness's schema exists)."""
from __future__ import annotations

from ..core import Context, FigureSpec, Skip
from ..results import ResultsFile

CAPTION = r"Scaling over ranks."
MACROS: tuple[str, ...] = ()


def build(ctx: Context) -> list[ResultsFile]:
    raise Skip("scaling not implemented yet")


SPEC = FigureSpec("scaling", CAPTION, "scaling results", build, macros=MACROS)
