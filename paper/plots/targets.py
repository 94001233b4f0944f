"""Table: the speed and hit-ratio targets the benchmark harness checks, met or missed.

Source: the ``targets`` list of every results file of the suite that has one
(``benchmark/README.md``: ``{name, system, other, metric, threshold, value, met, ...}``).
Each repetition decides on its own whether a target was met; the table gives the value's
median (min--max) and in how many repetitions the target was met. Nothing is rounded up:
a target missed in some repetition is shown as such.
"""
from __future__ import annotations

from ..core import Context, FigureSpec, Skip
from ..macros import integer, sig, size
from ..results import ResultsFile
from ..spread import Spread
from ..tables import escape

TABLE_CAPTION = (r"The targets the benchmark harness checks (its own thresholds), with the measured value "
                 r"(a ratio to the named system, or a fraction), median and range over the repetitions, and in "
                 r"how many of the repetitions each target was met; ``not measured'': the suite's sizes do not "
                 r"include the target's case.")

MACROS = ("TargetsCount", "TargetsMetAll", "TargetsMissedAll", "TargetsMixed", "TargetsNotMeasured")


def _key(t: dict) -> tuple:
    return (str(t.get("name")), t.get("block_bytes"), t.get("mode"), t.get("capacity_blocks"), t.get("threads"))


def _with_targets(ctx: Context) -> list[ResultsFile]:
    """Every results file of the suite that records ``targets`` in some repetition, by workload."""
    files = [f for f in ctx.results.files if any("targets" in r.doc for r in f.reps)]
    return sorted(files, key=lambda f: (f.workload, f.system, f.nodes, f.ranks, f.stamp))


def collect(rf: ResultsFile) -> list[dict]:
    """Per target of ``rf``: name, threshold, per-repetition values and met flags."""
    rows: dict[tuple, dict] = {}
    for rep in rf.reps:
        targets = rep.doc.get("targets")
        if targets is None:
            continue
        seq = rep.seq("targets", nonempty=False)
        for i, t in enumerate(seq):
            rep.get("name", within=t, prefix=("targets", i))
            rep.get("met", within=t, prefix=("targets", i))
            row = rows.setdefault(_key(t), {"target": t, "values": [], "met": [], "file": rep})
            row["values"].append(t.get("value"))
            row["met"].append(t.get("met"))
    return list(rows.values())


def build(ctx: Context) -> list[ResultsFile]:
    files = _with_targets(ctx)
    if not files:
        raise Skip("no results file of the suite records targets")
    t = ctx.table("targets", [("target", "l"), ("size", "r"), ("value", "r"), ("met", "r")], files)
    counts = {"all": 0, "none": 0, "mixed": 0, "unmeasured": 0}
    total = 0
    for rf in files:
        for row in collect(rf):
            total += 1
            target = row["target"]
            values = [float(v) for v in row["values"] if isinstance(v, (int, float)) and not isinstance(v, bool)]
            decided = [m for m in row["met"] if isinstance(m, bool)]
            if not decided:
                counts["unmeasured"] += 1
                met = "not measured"
            else:
                yes = sum(decided)
                counts["all" if yes == len(decided) else "none" if yes == 0 else "mixed"] += 1
                met = f"{yes} of {len(decided)}"
            threshold = target.get("threshold")
            value = "--" if not values else sig(Spread(values) if len(values) > 1 else values[0], 2,
                                                around=threshold if isinstance(threshold, (int, float)) else None)
            where = size(target["block_bytes"]) if isinstance(target.get("block_bytes"), int) else (
                f"{integer(target['capacity_blocks'])} blocks" if isinstance(target.get("capacity_blocks"), int)
                else "--")
            t.add(escape(str(target["name"])), where, value, met)
    ctx.put(t)
    m = ctx.macros
    src = "; ".join(f.source("targets") for f in files)
    m.add("TargetsCount", integer(total), f"{src} (targets, counted)")
    m.add("TargetsMetAll", integer(counts["all"]), f"{src} (met in every repetition)")
    m.add("TargetsMissedAll", integer(counts["none"]), f"{src} (met in no repetition)")
    m.add("TargetsMixed", integer(counts["mixed"]), f"{src} (met in some repetitions)")
    m.add("TargetsNotMeasured", integer(counts["unmeasured"]), f"{src} (value null: not measured)")
    return files


SPEC = FigureSpec("targets", "", "results files with targets", build, macros=MACROS,
                  tables={"targets": TABLE_CAPTION}, wide_tables=("targets",), figure=False)
