"""What a figure module builds against: its spec, the drawing context, and Skip.

Kept apart from the driver (:mod:`paper.figures`) so that running the driver as
``python -m paper.figures`` and importing the figure modules share one set of classes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import style
from .macros import MacroBook
from .results import Results, ResultsFile
from .tables import Table, figure_float


class Skip(Exception):
    """The results a figure needs are absent; ``str(exc)`` says which."""


def absent(*workloads: str) -> Skip:
    """The :class:`Skip` for workloads the suite run does not hold (not run, or failed in
    every repetition), naming the suite option that runs them."""
    return Skip(f"the suite run has no {', '.join(workloads)} results "
                f"(python -m benchmark.suite --workloads {','.join(workloads)})")


@dataclass
class FigureSpec:
    """One figure (and/or its tables). ``build(ctx)`` draws it through ``ctx`` and
    returns the results files it used; it raises :class:`Skip` when they are absent."""

    name: str
    caption: str  # LaTeX; numbers only through macros
    needs: str  # what results feed it, for the skip message
    build: Callable[["Context"], list[ResultsFile]]
    macros: tuple[str, ...] = ()
    tables: dict[str, str] = field(default_factory=dict)  # name -> caption
    figure: bool = True
    wide: bool = False
    wide_tables: tuple[str, ...] = ()


@dataclass
class Context:
    """What a figure's build function draws into."""

    results: Results
    out: Path
    macros: MacroBook
    device: Results | None = None  # a separate suite run on a GPU machine (results.DEVICE_RESULTS)
    written: list[Path] = field(default_factory=list)
    layout: list[str] = field(default_factory=list)
    spec: FigureSpec | None = None
    used: list[ResultsFile] = field(default_factory=list)  # every file any figure or table drew from

    def device_used(self) -> bool:
        """Whether a figure or table drew from the separate GPU suite run (:attr:`device`)."""
        return self.device is not None and any(f in self.device.files for f in self.used)

    def _use(self, sources: Sequence[ResultsFile]) -> None:
        for f in sources:
            if f not in self.used:
                self.used.append(f)

    @property
    def figures_dir(self) -> Path:
        return self.out / "Figures"

    @property
    def tables_dir(self) -> Path:
        return self.out / "Tables"

    @property
    def generated_dir(self) -> Path:
        return self.out / "Generated"

    def save(self, fig, sources: Sequence[ResultsFile], *, caption_extra: str = "") -> None:
        """Check the layout of the spec's figure, then write it and its float (caption:
        the spec's, plus ``caption_extra`` for parts drawn only when their results exist)."""
        spec = self.spec
        assert spec is not None
        self._use(sources)
        self.layout += [f"{spec.name}: {p}" for p in style.layout_problems(fig)]
        self.written += style.save(fig, self.figures_dir, spec.name)
        caption = spec.caption + (" " + caption_extra if caption_extra else "")
        self.written.append(figure_float(self.generated_dir, spec.name, caption,
                                         [n for f in sources for n in f.rep_names], wide=spec.wide))

    def table(self, name: str, columns: list[tuple[str, str]], sources: Sequence[ResultsFile]) -> Table:
        """A new table of the current spec (caption from the spec); write it with :meth:`put`."""
        assert self.spec is not None and name in self.spec.tables, f"table {name} not declared by its spec"
        self._use(sources)
        return Table(name, self.spec.tables[name], columns, [n for f in sources for n in f.rep_names],
                     wide=name in self.spec.wide_tables)

    def put(self, table: Table) -> None:
        self.written.append(table.write(self.tables_dir))
