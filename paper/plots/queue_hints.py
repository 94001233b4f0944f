"""Table: hit ratio with scheduler hints at each queue depth against the lookahead oracle.

Source: the suite's ``queue_hints`` results (:mod:`benchmark.workloads.queue_hints`, schema
``cascade-bench/queue_hints/2``): per source and capacity ``rows[i]`` with
``reference_lru``, ``reference_belady`` and per queue depth ``cascade[j]``
(``block_hit_ratio``, ``reference_lookahead`` -- the oracle that sees the same queue --
and ``vs_lookahead``). The share of the oracle to reach is the workload's
``ORACLE_SHARE``; whether each cell reaches it, and whether the hit ratio never falls as
the depth grows, is judged here from the numbers.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core import Context, FigureSpec, Skip, absent
from ..macros import and_list, integer, pct, sig
from ..results import ResultsFile
from ..tables import escape
from .common import met_in, met_phrase, per_rep

TABLE_CAPTION = (
    r"Block hit ratio (\%) of Cascade's semantic policy with scheduler hints at each queue depth $d$ (the next "
    r"$d$ requests visible and their cached blocks hinted; $d$ in the column heads), beside the lookahead "
    r"oracle that sees the same queue (it evicts by the queued requests' references alone, LRU among the "
    r"rest), and their ratio; LRU and Belady (the offline optimum) for reference. Replayed through the real "
    r"store; each source's prefix as in the suite's options.")

MACROS = ("QhCells", "QhShare", "QhAtShare", "QhWorst", "QhMonotonic", "QhDepths", "QhCapacities", "QhSources",
          "QhOnlineGeLru")


def _share() -> float:
    from benchmark.workloads.queue_hints import ORACLE_SHARE

    return ORACLE_SHARE


def _source(name: str) -> str:
    if name.startswith("trace:"):
        return "trace " + name.rsplit("/", 1)[-1]
    return name.replace("cascade.workload.generate", "generator")


def _rows(rf: ResultsFile) -> list[tuple[int, dict[str, Any]]]:
    rows = rf.seq("rows")
    for i, row in enumerate(rows):
        p = ("rows", i)
        rf.get("source", within=row, prefix=p)
        for k in ("capacity_blocks", "reference_lru", "reference_belady"):
            rf.num(k, within=row, prefix=p)
        for j, c in enumerate(rf.seq("cascade", within=row, prefix=p)):
            for k in ("queue_depth", "block_hit_ratio", "reference_lookahead"):
                rf.num(k, within=c, prefix=(*p, "cascade", j))
    return list(enumerate(rows))


def _never_falls(values: Sequence[float | None]) -> bool:
    """Whether the measured ones of ``values`` never fall (one not measured is skipped)."""
    seen = [v for v in values if v is not None]
    return all(a <= b for a, b in zip(seen, seen[1:]))


def build(ctx: Context) -> list[ResultsFile]:
    rf = ctx.results.newest("queue_hints")
    if rf is None:
        raise absent("queue_hints")
    if not any("reference_lookahead" in c for r in rf.seq("rows") for c in r.get("cascade", [])):
        raise Skip(f"{rf.name} has no lookahead oracle (schema {rf.doc.get('schema', 'unnamed')}; "
                   "the oracle came with cascade-bench/queue_hints/2)")
    rows = _rows(rf)
    reps = rf.rep_numbers
    share = _share()
    depths = sorted({int(c["queue_depth"]) for _, r in rows for c in r["cascade"]})
    cells = [(i, j, r, c) for i, r in rows for j, c in enumerate(r["cascade"]) if c["reference_lookahead"] > 0]
    ratios = [c["block_hit_ratio"] / c["reference_lookahead"] for _, _, _, c in cells]
    m = ctx.macros
    m.add("QhCells", integer(len(cells)), rf.source("rows", "*", "cascade", "*") + " (cells with an oracle above zero)")
    m.add("QhShare", sig(share, 2) + r"$\times$", "benchmark/workloads/queue_hints.py: ORACLE_SHARE")
    per_cell = [met_in([x], reps, lambda v: v >= share) == len(reps) for x in ratios]
    m.add("QhAtShare", f"{sum(per_cell)} reach it in every repetition (the target as a whole: "
          + met_phrase(met_in(ratios, reps, lambda v: v >= share), len(reps)) + ")",
          rf.source("rows", "*", "cascade", "*", "block_hit_ratio") + " / reference_lookahead, per repetition")
    if cells:
        k = min(range(len(cells)), key=lambda n: float(ratios[n]))
        i, j, r, c = cells[k]
        m.add("QhWorst", f"{sig(ratios[k], 3, around=share)}$\\times$ ({pct(c['block_hit_ratio'])}\\,\\% against "
              f"{pct(c['reference_lookahead'])}\\,\\%, {escape(_source(str(r['source'])))}, "
              f"{integer(r['capacity_blocks'])} blocks, depth {integer(c['queue_depth'])})",
              rf.source("rows", i, "cascade", j, "block_hit_ratio") + " / reference_lookahead (the smallest ratio)")
    else:
        m.add("QhWorst", "not defined (no cell has an oracle above zero)", rf.source("rows"))
    monotonic = 0
    for _, r in rows:
        by_depth = [c["block_hit_ratio"] for c in sorted(r["cascade"], key=lambda c: c["queue_depth"])]
        monotonic += all(_never_falls(col) for col in zip(*[per_rep(v, reps) for v in by_depth]))
    m.add("QhMonotonic", f"{monotonic} of {len(rows)}",
          rf.source("rows", "*", "cascade", "*", "block_hit_ratio") + " (never falls with depth, every repetition)")
    online = [(r, c) for _, r in rows for c in r["cascade"] if c["queue_depth"] == 0]
    ge_lru = sum(all(a >= b for a, b in zip(per_rep(c["block_hit_ratio"], reps), per_rep(r["reference_lru"], reps))
                     if a is not None and b is not None) for r, c in online)
    m.add("QhOnlineGeLru", f"{ge_lru} of {len(online)}" if online else "none (depth 0 not replayed)",
          rf.source("rows", "*", "cascade", "queue_depth=0", "block_hit_ratio") + " >= reference_lru, every repetition")
    m.add("QhDepths", and_list([integer(d) for d in depths]), rf.source("rows", "*", "cascade", "*", "queue_depth"))
    m.add("QhCapacities", and_list([integer(c) for c in sorted({int(r["capacity_blocks"]) for _, r in rows})]),
          rf.source("rows", "*", "capacity_blocks"))
    m.add("QhSources", integer(len({str(r["source"]) for _, r in rows})), rf.source("rows", "*", "source"))

    cols = [("source", "l"), ("capacity", "r"), ("LRU", "r"), ("Belady", "r")]
    for d in depths:
        cols += [(f"$d={d}$", "r"), ("oracle", "r"), ("ratio", "r")]
    t = ctx.table("queue_hints", cols, [rf])
    for i, r in rows:
        by = {int(c["queue_depth"]): c for c in r["cascade"]}
        cells_ = []
        for d in depths:
            c = by.get(d)
            if c is None:
                cells_ += ["--"] * 3
                continue
            oracle = c["reference_lookahead"]
            cells_ += [pct(c["block_hit_ratio"]), pct(oracle),
                       sig(c["block_hit_ratio"] / oracle, 3, around=share) if oracle > 0 else "--"]
        t.add(escape(_source(str(r["source"]))), integer(r["capacity_blocks"]), pct(r["reference_lru"]),
              pct(r["reference_belady"]), *cells_)
    ctx.put(t)
    return [rf]


SPEC = FigureSpec("queue_hints", "", "queue_hints results", build, macros=MACROS,
                  tables={"queue_hints": TABLE_CAPTION}, wide_tables=("queue_hints",), figure=False)
