"""Table: GPU buffers through Cascade's tiers beside the raw copies of the same GPU, or the
reason the suite could not run it.

Source: the suite's ``device_io`` results (:mod:`benchmark.workloads.device_io`). Without a
usable GPU the file holds ``skipped`` (the reason) and no rows: the newest suite run in
``benchmark/results/device`` (device_io alone on a GPU machine, at its own commit) is read
instead, and the text, the table's repetitions (``\\DevReps``) and the results-files
caption (``\\SuiteDevice``) name that run; with none, the table and the text say "not run"
with the reason. With a GPU: ``gpu``, ``driver_version``, and per block size and batch
(``size``, ``blocks``) ``limits.<raw>.gbps``, ``cascade.<op>.gbps`` and
``cpu_us_per_block``, and ``ratios`` (Cascade over the raw copy that bounds it, same
round); the target ratio is the workload's ``TARGET``, judged here per repetition.
"""
from __future__ import annotations

from typing import Any

from ..core import Context, FigureSpec, absent
from ..macros import integer, sig, size
from ..results import ResultsFile
from ..tables import escape
from .common import met_in, met_phrase

TABLE_CAPTION = (
    r"GPU buffers (cupy device arrays) through Cascade, GB/s, median and range over the \DevReps repetitions, "
    r"beside the raw copies of the same GPU in the same run; ``$\times$'': Cascade over the raw copy that bounds "
    r"it (GPU tier put and get: device-to-device; SHM-tier hit into GPU memory: pinned host-to-device; put from "
    r"GPU memory into the SHM tier: pinned device-to-host), taken within each round; CPU: process time per "
    r"block of the batch call.")

MACROS = ("DevSentence", "DevReps")
#: (ratio key, Cascade op, raw limit, words)
RATIOS = (("gpu_put_vs_d2d", "gpu_put", "raw_d2d", "GPU-tier puts"),
          ("gpu_get_vs_d2d", "gpu_get", "raw_d2d", "GPU-tier gets"),
          ("shm_get_into_gpu_vs_pinned_h2d", "shm_get_into_gpu", "raw_pinned_h2d", "SHM-tier hits into GPU memory"),
          ("shm_put_from_gpu_vs_pinned_d2h", "shm_put_from_gpu", "raw_pinned_d2h", "puts from GPU memory into SHM"))


def _target() -> float:
    from benchmark.workloads.device_io import TARGET

    return TARGET


def _rows(rf: ResultsFile) -> list[tuple[int, dict[str, Any]]]:
    rows = rf.seq("rows")
    for i, row in enumerate(rows):
        p = ("rows", i)
        rf.num("size", within=row, prefix=p)
        rf.num("blocks", within=row, prefix=p)
        for key, op, raw, _ in RATIOS:
            rf.num("ratios", key, within=row, prefix=p)
            rf.num("cascade", op, "gbps", within=row, prefix=p)
            rf.num("limits", raw, "gbps", within=row, prefix=p)
    return sorted(enumerate(rows), key=lambda ir: (ir[1]["size"], ir[1]["blocks"]))


def build(ctx: Context) -> list[ResultsFile]:
    rf = ctx.results.newest("device_io")
    if rf is None:
        raise absent("device_io")
    m = ctx.macros
    where = ""
    gpu_rf = ctx.device.newest("device_io") if ctx.device is not None else None
    if "skipped" in rf.doc and gpu_rf is not None and "skipped" not in gpu_rf.doc:
        where = (f"was skipped in this suite run ({escape(str(rf.get('skipped')))}); a separate run of it alone, "
                 f"{escape(ctx.device.describe())}, ")
        rf = gpu_rf
    m.add("DevReps", integer(len(rf.reps)), f"{rf.name}: repetitions of its suite run ({', '.join(rf.rep_names)})")
    if "skipped" in rf.doc:
        reason = escape(str(rf.get("skipped")))
        m.add("DevSentence", f"was not run in this suite run: {reason}", rf.source("skipped"))
        t = ctx.table("device_io", [("device\\_io", "l")], [rf])
        t.add(f"not run: {reason}")
        ctx.put(t)
        return [rf]
    cols = [("block", "r"), ("batch", "r"), ("raw D2D", "r"), ("GPU put", "r"), (r"$\times$", "r"), ("GPU get", "r"),
            (r"$\times$", "r"), ("pinned H2D", "r"), (r"SHM$\to$GPU", "r"), (r"$\times$", "r"), ("pinned D2H", "r"),
            (r"GPU$\to$SHM", "r"), (r"$\times$", "r"), (r"CPU $\mu$s", "r")]
    rows = _rows(rf)
    reps = rf.rep_numbers
    target = _target()
    verdicts = []
    for key, _, _, words in RATIOS:
        values = [r["ratios"][key] for _, r in rows]
        lo = min(values, key=float)
        verdicts.append(f"{words} at least {sig(lo, 2, around=target)}$\\times$ of the raw copy "
                        f"({met_phrase(met_in(values, reps, lambda v: v >= target), len(reps))})")
    m.add("DevSentence", where + f"ran on {escape(str(rf.get('gpu')))} (driver {int(rf.num('driver_version'))}): "
          f"against a target of {sig(target, 2)}$\\times$, " + "; ".join(verdicts),
          "; ".join(rf.source("rows", "*", "ratios", k) for k, *_ in RATIOS)
          + " (the smallest over sizes and batches; target benchmark/workloads/device_io.py: TARGET, per repetition)")
    t = ctx.table("device_io", cols, [rf])
    ratio = lambda v: sig(v, 2, around=target)  # noqa: E731
    for i, r in rows:
        c, lim, rat = r["cascade"], r["limits"], r["ratios"]
        batch = "gpu_get_batch" if r["blocks"] > 1 and isinstance(c.get("gpu_get_batch"), dict) else "gpu_get"
        t.add(size(r["size"]), integer(r["blocks"]), sig(lim["raw_d2d"]["gbps"]), sig(c["gpu_put"]["gbps"]),
              ratio(rat["gpu_put_vs_d2d"]), sig(c["gpu_get"]["gbps"]), ratio(rat["gpu_get_vs_d2d"]),
              sig(lim["raw_pinned_h2d"]["gbps"]), sig(c["shm_get_into_gpu"]["gbps"]),
              ratio(rat["shm_get_into_gpu_vs_pinned_h2d"]), sig(lim["raw_pinned_d2h"]["gbps"]),
              sig(c["shm_put_from_gpu"]["gbps"]), ratio(rat["shm_put_from_gpu_vs_pinned_d2h"]),
              sig(rf.num("cascade", batch, "cpu_us_per_block", within=r, prefix=("rows", i))))
    ctx.put(t)
    return [rf]


SPEC = FigureSpec("device_io", "", "device_io results", build, macros=MACROS,
                  tables={"device_io": TABLE_CAPTION}, wide_tables=("device_io",), figure=False)
