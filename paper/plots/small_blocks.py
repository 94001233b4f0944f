"""Table: the per-block cost of Cascade's calls against a dict plus copy, batch against loop.

Source: the suite's ``small_blocks`` results (:mod:`benchmark.workloads.small_blocks`):
per block size ``rows[i]`` with microseconds per block (``dict_get_us``, ``get_loop_us``,
``get_batch_us``, ``dict_put_us``, ``put_loop_us``, ``put_batch_us``, ``view_us``,
``cold_get_loop_us``, ``cold_get_batch_us``; ``put_fresh_pages_us`` from results since it was
measured) and the ratios of the same round
(``get_vs_dict``, ``put_vs_dict``, ``hot_get_batch_vs_loop``, ``put_batch_vs_loop``,
``cold_get_batch_vs_loop``). Targets (the workload's ``GET_TARGET``, ``PUT_TARGET``; batch
never slower than loop) are judged here in each repetition from those numbers.
"""
from __future__ import annotations

from typing import Any

from ..core import Context, FigureSpec, absent
from ..macros import and_list, sig, size
from ..results import ResultsFile
from ..tables import escape
from .common import met_in, met_phrase

TABLE_CAPTION = (
    r"Per-block cost of Cascade's calls in $\mu$s (median and range over the \SuiteReps repetitions, each the "
    r"median of its rounds) beside the plainest in-process store: a Python dict holding a copy of each block "
    r"(put: insert of a copy; get: lookup and a copy into a preallocated output). Hot: SHM tier, its pages "
    r"backed at open as in a store past its first fill; cold: file tier "
    r"alone, its files dropped from the page cache first, read mode \texttt{auto}. ``$\times$ dict'': Cascade "
    r"over the dict in the same round; ``batch/loop'': \texttt{get\_many\_into} or \texttt{put\_many} per block "
    r"over the same calls one by one (below one: the batch is cheaper); view: a zero-copy lease taken and "
    r"given back.")

MACROS = ("SbSmallBlock", "SbGetUs", "SbDictGetUs", "SbGetVsDict", "SbPutUs", "SbDictPutUs", "SbPutVsDict",
          "SbPutFreshUs", "SbTarget", "SbGetMet", "SbPutMet", "SbBatchWorst", "SbBatchMet", "SbViewUs", "SbColdMode")

BATCH_FORMS = (("hot_get_batch_vs_loop", "hot get"), ("put_batch_vs_loop", "put"),
               ("cold_get_batch_vs_loop", "cold get"))
#: Batch never slower than loop: every ``*_batch_vs_loop`` at most this.
BATCH_TARGET = 1.0
FIELDS = ("size", "dict_get_us", "get_loop_us", "get_vs_dict", "dict_put_us", "put_loop_us", "put_vs_dict",
          "view_us", *(f for f, _ in BATCH_FORMS))


def _rows(rf: ResultsFile) -> list[tuple[int, dict[str, Any]]]:
    rows = rf.seq("rows")
    for i, row in enumerate(rows):
        for f in FIELDS:
            rf.num(f, within=row, prefix=("rows", i))
    return sorted(enumerate(rows), key=lambda ir: ir[1]["size"])


def _thresholds() -> tuple[float, float]:
    from benchmark.workloads.small_blocks import GET_TARGET, PUT_TARGET

    return GET_TARGET, PUT_TARGET


def build(ctx: Context) -> list[ResultsFile]:
    rf = ctx.results.newest("small_blocks")
    if rf is None:
        raise absent("small_blocks")
    rows = _rows(rf)
    reps = rf.rep_numbers
    get_target, put_target = _thresholds()
    m = ctx.macros
    i0, small = rows[0]
    src = lambda *k: rf.source("rows", i0, *k)  # noqa: E731
    m.add("SbSmallBlock", size(small["size"]), src("size") + " (the smallest measured)")
    m.add("SbGetUs", sig(small["get_loop_us"]), src("get_loop_us"))
    m.add("SbDictGetUs", sig(small["dict_get_us"]), src("dict_get_us"))
    m.add("SbGetVsDict", sig(small["get_vs_dict"], 2, around=get_target) + r"$\times$", src("get_vs_dict"))
    m.add("SbPutUs", sig(small["put_loop_us"]), src("put_loop_us"))
    m.add("SbDictPutUs", sig(small["dict_put_us"]), src("dict_put_us"))
    m.add("SbPutVsDict", sig(small["put_vs_dict"], 2, around=put_target) + r"$\times$", src("put_vs_dict"))
    fresh = small.get("put_fresh_pages_us")
    m.add("SbPutFreshUs", "not measured in these results" if fresh is None else
          rf"{sig(fresh)}\,$\mu$s ({sig(fresh / small['dict_put_us'], 2)}$\times$ the dict)",
          src("put_fresh_pages_us") + " / " + src("dict_put_us"))
    same = get_target == put_target
    m.add("SbTarget", sig(get_target, 2) + r"$\times$" if same else
          f"{sig(get_target, 2)}$\\times$ (get) and {sig(put_target, 2)}$\\times$ (put)",
          "benchmark/workloads/small_blocks.py: GET_TARGET, PUT_TARGET")
    m.add("SbGetMet", met_phrase(met_in([small["get_vs_dict"]], reps, lambda v: v <= get_target), len(reps)),
          src("get_vs_dict") + " <= GET_TARGET, judged per repetition")
    m.add("SbPutMet", met_phrase(met_in([small["put_vs_dict"]], reps, lambda v: v <= put_target), len(reps)),
          src("put_vs_dict") + " <= PUT_TARGET, judged per repetition")
    cells = [(row[f], row["size"], label, i, f) for i, row in rows for f, label in BATCH_FORMS]
    worst = max(cells, key=lambda c: float(c[0]))
    m.add("SbBatchWorst", f"{sig(worst[0], 3, around=BATCH_TARGET)} ({worst[2]} at {size(worst[1])})",
          rf.source("rows", worst[3], worst[4]) + " (the largest batch/loop ratio of every size and form)")
    m.add("SbBatchMet", met_phrase(met_in([c[0] for c in cells], reps, lambda v: v <= BATCH_TARGET), len(reps)),
          "; ".join(rf.source("rows", i, f) for _, _, _, i, f in cells) + " (every one <= 1, per repetition)")
    ends = [rows[0], rows[-1]] if len(rows) > 1 else [rows[0]]
    m.add("SbViewUs", and_list([f"{sig(r['view_us'])}\\,$\\mu$s at {size(r['size'])}" for _, r in ends]),
          "; ".join(rf.source("rows", i, "view_us") for i, _ in ends))
    modes = sorted({str(r.get("cold_read_mode", "--")) for _, r in rows})
    m.add("SbColdMode", escape(", ".join(modes)), rf.source("rows", "*", "cold_read_mode"))

    t = ctx.table("small_blocks", [("block", "r"), ("dict get", "r"), ("get", "r"), (r"$\times$ dict", "r"),
                                   ("dict put", "r"), ("put", "r"), (r"$\times$ dict", "r"), ("view", "r"),
                                   ("batch/loop: hot get", "r"), ("put", "r"), ("cold get", "r")], [rf])
    for _, r in rows:
        t.add(size(r["size"]), sig(r["dict_get_us"]), sig(r["get_loop_us"]),
              sig(r["get_vs_dict"], 2, around=get_target), sig(r["dict_put_us"]), sig(r["put_loop_us"]),
              sig(r["put_vs_dict"], 2, around=put_target), sig(r["view_us"]),
              *(sig(r[f], 2, around=BATCH_TARGET) for f, _ in BATCH_FORMS))
    ctx.put(t)
    return [rf]


SPEC = FigureSpec("small_blocks", "", "small_blocks results", build, macros=MACROS,
                  tables={"small_blocks": TABLE_CAPTION}, wide_tables=("small_blocks",), figure=False)
