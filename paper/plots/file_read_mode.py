"""Table: cold file-tier reads in each read mode against the better raw cold read at the same depth.

Source: the suite's ``file_read_mode`` results (:mod:`benchmark.workloads.file_read_mode`):
per block size ``rows[i]``, per mode and form a ``<mode>_<form>`` object with ``gbps`` and
``vs_best_raw`` (the tier's whole-pass rate over the better of raw O_DIRECT and raw buffered
cold reads at the same depth, in the same round), the raw rates
``raw_odirect_<form>_gbps`` and ``raw_buffered_cold_<form>_gbps``, and the target
``target_vs_best_raw``. Which mode ``auto`` resolves to: the row's ``auto_read_mode`` when
the workload records it, else an ``auto`` mode's own cells, else what the default (``auto``)
file tier of the suite's ``small_blocks`` run read in (``cold_read_mode``).
"""
from __future__ import annotations

import re
from typing import Any

from ..core import Context, FigureSpec, absent
from ..macros import and_list, per_size, sig, size
from ..results import ResultsError, ResultsFile
from ..tables import escape
from .common import met_in, met_phrase

TABLE_CAPTION = (
    r"Cold reads from the file tier alone (its files dropped from the page cache before each pass) in each read "
    r"mode, GB/s over a whole pass and ($\times$ raw) that rate over the better of the two raw cold reads of "
    r"the same bytes from a plain file at the same depth (raw \texttt{O\_DIRECT} cut into the tier's requests, "
    r"raw buffered with kernel readahead), taken within each round; median and range over the \SuiteReps "
    r"repetitions. Form \emph{loop}: \texttt{get\_into} one block at a time; \emph{batch}: one "
    r"\texttt{get\_many\_into} at the store's default depth (one worker per spare core, at most "
    r"\texttt{io\_threads}), the raw reads at that depth too.")

MACROS = ("FrmSizes", "FrmTarget", "FrmAutoMode", "FrmAutoSource", "FrmAutoLoop", "FrmAutoBatch", "FrmAutoMet",
          "FrmBetterMode", "FrmAutoAgrees")

#: The file tier's read modes (``cascade.tiers.file_reads.READ_MODES``), in table order.
MODES = ("auto", "buffered", "direct")
#: A ``<mode>_<form>`` cell (other cells of a row, such as ``records_loop``, the tier's
#: records read without the store, are not read modes).
_CELL = re.compile(rf"^(?P<mode>{'|'.join(MODES)})_(?P<form>loop|batch)$")
FORMS = ("loop", "batch")


def _modes(row: dict[str, Any]) -> list[str]:
    """The read modes measured in ``row``."""
    found = {m.group("mode") for k, v in row.items() if (m := _CELL.match(k)) and isinstance(v, dict)}
    return sorted(found, key=MODES.index)


def _rows(rf: ResultsFile) -> list[tuple[int, dict[str, Any]]]:
    rows = rf.seq("rows")
    for i, row in enumerate(rows):
        p = ("rows", i)
        rf.num("size", within=row, prefix=p)
        for form in FORMS:
            rf.num(f"raw_odirect_{form}_gbps", within=row, prefix=p)
            rf.num(f"raw_buffered_cold_{form}_gbps", within=row, prefix=p)
            for mode in _modes(row):
                rf.num(f"{mode}_{form}", "gbps", within=row, prefix=p)
                rf.num(f"{mode}_{form}", "vs_best_raw", within=row, prefix=p)
        if len([m for m in _modes(row) if m != "auto"]) < 1:
            raise ResultsError(rf.path, f"rows[{i}].<mode>_loop", "is missing (no read mode measured)")
    return sorted(enumerate(rows), key=lambda ir: ir[1]["size"])


def _auto(ctx: Context, rf: ResultsFile, rows: list[tuple[int, dict[str, Any]]]) -> tuple[str, str, list[ResultsFile]]:
    """(mode ``auto`` resolved to or ``auto`` itself when measured, where that was read, extra files)."""
    if all(isinstance(r.get("auto_read_mode"), str) for _, r in rows):
        modes = {r["auto_read_mode"] for _, r in rows}
        return ", ".join(sorted(modes)), rf.source("rows", "*", "auto_read_mode"), []
    if all("auto" in _modes(r) for _, r in rows):
        return "auto", rf.source("rows", "*", "auto_<form>"), []
    sb = ctx.results.newest("small_blocks")
    if sb is not None and all(isinstance(r.get("cold_read_mode"), str) for r in sb.seq("rows")):
        modes = {r["cold_read_mode"] for r in sb.seq("rows")}
        return ", ".join(sorted(modes)), sb.source("rows", "*", "cold_read_mode") + " (default read mode auto)", [sb]
    return "", "not recorded by this suite run", []


def build(ctx: Context) -> list[ResultsFile]:
    rf = ctx.results.newest("file_read_mode")
    if rf is None:
        raise absent("file_read_mode")
    rows = _rows(rf)
    reps = rf.rep_numbers
    target = rf.num("target_vs_best_raw")
    auto, auto_src, extra = _auto(ctx, rf, rows)
    m = ctx.macros
    m.add("FrmSizes", and_list([size(r["size"]) for _, r in rows]), rf.source("rows", "*", "size"))
    m.add("FrmTarget", sig(target, 2) + r"$\times$", rf.source("target_vs_best_raw"))
    m.add("FrmAutoMode", escape(auto or "an unrecorded mode"), auto_src)
    m.add("FrmAutoSource", "measured as its own mode" if auto == "auto" else
          "recorded by the workload" if "auto_read_mode" in auto_src else
          "recorded by the default file tier of the small-block runs" if extra else "not recorded", auto_src)
    cells = []
    for form, name in (("loop", "FrmAutoLoop"), ("batch", "FrmAutoBatch")):
        if auto in ("auto", "buffered", "direct") and all(auto in _modes(r) for _, r in rows):
            values = [(r["size"], r[f"{auto}_{form}"]["vs_best_raw"]) for _, r in rows]
            cells += [v for _, v in values]
            m.add(name, per_size([(s, sig(v, 2, around=target)) for s, v in values], r"$\times$"),
                  "; ".join(rf.source("rows", i, f"{auto}_{form}", "vs_best_raw") for i, _ in rows))
        else:
            m.add(name, "not measured", auto_src)
    m.add("FrmAutoMet", met_phrase(met_in(cells, reps, lambda v: v >= target), len(reps)) if cells else "not judged",
          f"every cell of FrmAutoLoop and FrmAutoBatch >= {rf.source('target_vs_best_raw')}, per repetition")
    better = []
    for i, r in rows:
        scores = {mode: sum(float(r[f"{mode}_{f}"]["vs_best_raw"]) for f in FORMS)
                  for mode in _modes(r) if mode != "auto"}
        better.append((r["size"], max(scores, key=scores.get)))
    groups: dict[str, list[int]] = {}
    for s, mode in better:
        groups.setdefault(mode, []).append(s)
    m.add("FrmBetterMode", and_list([f"{escape(mode)} at {and_list([size(s) for s in sizes])}"
                                     for mode, sizes in groups.items()]),
          rf.source("rows", "*", "<mode>_<form>", "vs_best_raw") + " (mode with the larger sum of loop and batch "
          "medians, per size)")
    agree = sum(mode == auto for _, mode in better)
    m.add("FrmAutoAgrees", f"{agree} of {len(better)}" if auto in ("buffered", "direct") else "none (not resolved)",
          "FrmAutoMode against FrmBetterMode, per size")

    modes = _modes(rows[0][1])
    cols = [("block", "r"), ("form", "l"), (r"raw \texttt{O\_DIRECT}", "r"), ("raw buffered", "r")]
    for mode in modes:
        cols += [(rf"\texttt{{{escape(mode)}}} GB/s", "r"), (r"$\times$ raw", "r")]
    t = ctx.table("file_read_mode", cols, [rf, *extra])
    for k, (i, r) in enumerate(rows):
        if k:
            t.rule()
        for j, form in enumerate(FORMS):
            cells_ = []
            for mode in modes:
                cell = r.get(f"{mode}_{form}")
                cells_ += [sig(cell["gbps"]), sig(cell["vs_best_raw"], 2, around=target)] if cell else ["--", "--"]
            t.add(size(r["size"]) if j == 0 else "", rf"\emph{{{form}}}", sig(r[f"raw_odirect_{form}_gbps"]),
                  sig(r[f"raw_buffered_cold_{form}_gbps"]), *cells_)
    ctx.put(t)
    return [rf, *extra]


SPEC = FigureSpec("file_read_mode", "", "file_read_mode results", build, macros=MACROS,
                  tables={"file_read_mode": TABLE_CAPTION}, figure=False)
