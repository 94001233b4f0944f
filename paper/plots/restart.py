"""Table: how long a warm restart takes per GiB of file tier, at the same job size and at another.

Source: the suite's ``restart`` results (:mod:`benchmark.workloads.restart`): ``rows[i]`` per
case, a job of ``writers`` ranks that filled its file tiers and a job of ``readers`` ranks
that opened the store on them (cold): ``gib``, ``open_s`` (the collective constructor:
scan, adoption, republish), ``open_s_per_gib``, ``recovered``, ``adopted``, ``missing``,
``wrong`` (every block read back once, byte-exact).
"""
from __future__ import annotations

from typing import Any

from ..core import Context, FigureSpec, absent
from ..macros import and_list, integer, sig
from ..results import ResultsFile
from .common import measured

TABLE_CAPTION = (
    r"Warm restart: a job of $W$ ranks fills its file tiers, the files are dropped from the page cache, and a job "
    r"of $R$ ranks opens the store on them (the collective constructor: scanning the files, adopting those of "
    r"ranks that are gone, republishing to the directory) and reads every block back once, byte-exact. Open "
    r"time in seconds and per GiB, and blocks recovered in place and adopted, median and range over the "
    r"\SuiteReps repetitions; blocks missing or wrong, summed over the repetitions.")

MACROS = ("RsGib", "RsSameSize", "RsOtherSize", "RsLost")
FIELDS = ("writers", "readers", "gib", "open_s", "open_s_per_gib", "recovered", "adopted", "missing", "wrong")


def _rows(rf: ResultsFile) -> list[tuple[int, dict[str, Any]]]:
    rows = rf.seq("rows")
    for i, row in enumerate(rows):
        for f in FIELDS:
            rf.num(f, within=row, prefix=("rows", i))
    return list(enumerate(rows))


def _gib(value: float) -> str:
    """GiB as written (``1``, ``0.125``): the workload rounds it to three decimals."""
    return f"{float(value):g}"


def _case(row: dict[str, Any]) -> str:
    return rf"{integer(row['writers'])}$\to${integer(row['readers'])}"


def build(ctx: Context) -> list[ResultsFile]:
    rf = ctx.results.newest("restart")
    if rf is None:
        raise absent("restart")
    rows = _rows(rf)
    reps = rf.rep_numbers
    m = ctx.macros
    m.add("RsGib", and_list(sorted({_gib(r["gib"]) for _, r in rows})) + r"\,GiB", rf.source("rows", "*", "gib"))

    def cases(same: bool, name: str) -> None:
        chosen = [(i, r) for i, r in rows if (r["writers"] == r["readers"]) == same]
        if chosen:
            text = and_list([f"{sig(r['open_s_per_gib'])}\\,s per GiB ({_case(r)} ranks)" for _, r in chosen])
            m.add(name, text, "; ".join(rf.source("rows", i, "open_s_per_gib") for i, _ in chosen))
        else:
            m.add(name, "not measured in this suite run", rf.source("rows", "*", "writers") + " / readers")

    cases(True, "RsSameSize")
    cases(False, "RsOtherSize")
    lost = sum(sum(measured(r[k], reps)) for _, r in rows for k in ("missing", "wrong"))
    m.add("RsLost", integer(lost), rf.source("rows", "*", "missing") + " + wrong, summed over cases and repetitions")

    t = ctx.table("restart", [("$W\\to R$", "l"), ("GiB", "r"), ("open (s)", "r"), ("s per GiB", "r"),
                              ("recovered", "r"), ("adopted", "r"), ("missing", "r"), ("wrong", "r")], [rf])
    for _, r in rows:
        t.add(_case(r), _gib(r["gib"]), sig(r["open_s"]), sig(r["open_s_per_gib"]), integer(r["recovered"]),
              integer(r["adopted"]), integer(sum(measured(r["missing"], reps))),
              integer(sum(measured(r["wrong"], reps))))
    ctx.put(t)
    return [rf]


SPEC = FigureSpec("restart", "", "restart results", build, macros=MACROS, tables={"restart": TABLE_CAPTION},
                  figure=False)
