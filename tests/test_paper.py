"""The paper's figures, tables and numbers regenerate from the committed results sample.

``paper/sample_results/suite_*/`` is a small real suite run: ``manifest.json`` and three
repetitions of every workload (``python -m paper.samples`` re-measures it). These tests fail when a figure or table cannot be made from them,
when a results file lacks a field a figure needs (the error must name file and field),
when a figure's text overlaps, and when the text quotes a number that is not a generated
macro. None of this needs TeX; the one PDF test is skipped without ``pdflatex``.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from paper import figures
from paper.macros import MISSING, integer, pct, sig
from paper.results import ResultsError, load_file
from paper.spread import Spread, merge

PAPER = Path(__file__).resolve().parent.parent / "paper"
SAMPLES = PAPER / "sample_results"
TEXT_FILES = [PAPER / "main.tex", PAPER / "1. Introduction.tex", PAPER / "2. Background.tex", PAPER / "3. Design.tex",
              PAPER / "4. Evaluation.tex"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("paper")
    report = figures.generate(SAMPLES, out)
    return out, report


def _suite(results: Path) -> Path:
    [suite] = [p for p in results.iterdir() if (p / "manifest.json").is_file()]
    return suite


def _sample(results: Path, workload: str, rep: int = 0) -> Path:
    """Repetition ``rep``'s file of ``workload`` in the suite under ``results`` (for
    ``run``: the run with the most ranks, the one the figures read)."""
    found = [load_file(f) for f in sorted((_suite(results) / f"rep{rep}").glob("*.json"))]
    found = [f for f in found if f.workload == workload]
    assert found, f"no {workload} file in {results}: run `make -C paper samples`"
    return max(found, key=lambda f: (f.ranks, f.stamp)).path


def _add_to_suite(suite: Path, rel: str, doc: dict, rep: int = 0) -> Path:
    """Write ``doc`` at ``suite/rel`` and list it in the manifest as a successful run."""
    path = suite / rel
    path.write_text(json.dumps(doc))
    manifest = json.loads((suite / "manifest.json").read_text())
    manifest["runs"].append({"rep": rep, "workload": doc.get("workload", "run"), "status": "ok", "file": rel})
    (suite / "manifest.json").write_text(json.dumps(manifest))
    return path


# -- everything regenerates from the sample ------------------------------------------------
def test_every_figure_and_table_is_generated(built):
    out, report = built
    assert not report.errors, [str(e) for e in report.errors]
    assert not report.skipped, f"figures skipped on the sample results: {report.skipped}"
    for spec in figures.all_specs():
        if spec.figure:
            for ext in ("pdf", "png"):
                path = out / "Figures" / f"{spec.name}.{ext}"
                assert path.is_file() and path.stat().st_size > 1000, path
            float_tex = (out / "Generated" / f"figure_{spec.name}.tex").read_text()
            assert f"Figures/{spec.name}" in float_tex and "NOT GENERATED" not in float_tex
        for table in spec.tables:
            text = (out / "Tables" / f"{table}.tex").read_text()
            assert "NOT GENERATED" not in text and r"\toprule" in text, table


def test_figures_have_no_overlapping_or_clipped_text(built):
    _, report = built
    assert report.layout == []


def test_every_declared_number_is_defined_and_traced(built):
    out, _ = built
    numbers = (out / "Generated" / "numbers.tex").read_text()
    defined = dict(re.findall(r"\\newcommand\{\\([A-Za-z]+)\}\{(.*)\\xspace\}", numbers))
    declared = {m for spec in figures.all_specs() for m in spec.macros}
    assert set(defined) == declared
    assert not [m for m, v in defined.items() if v == MISSING]
    lines = numbers.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(r"\newcommand"):
            assert lines[i - 1].startswith("% ") and len(lines[i - 1]) > 4, f"untraced: {line}"


def test_tables_have_consistent_rows(built):
    out, _ = built
    for path in (out / "Tables").glob("*.tex"):
        text = path.read_text()
        spec = re.search(r"\\begin\{tabular\}\{([lrc]+)\}", text).group(1)
        body = text.split(r"\midrule", 1)[1].split(r"\bottomrule")[0]
        for row in body.strip().splitlines():
            if row.strip() != r"\midrule":
                assert row.count("&") == len(spec) - 1 - row.count(r"\&"), (path.name, row)


def test_generation_is_deterministic(built, tmp_path):
    out, _ = built
    figures.generate(SAMPLES, tmp_path)
    for rel in ["Generated/numbers.tex", *(f"Tables/{p.name}" for p in (out / "Tables").glob("*.tex"))]:
        assert (tmp_path / rel).read_text() == (out / rel).read_text(), rel


# -- bad or absent results ------------------------------------------------------------------
MISSING_FIELDS = [
    ("tier_bandwidth", "tier_bandwidth", ["rows", 0, "shm", "get_gbps"], "rows[0].shm.get_gbps"),
    ("tier_bandwidth", "tier_bandwidth", ["rows", 0, "memcpy"], "rows[0].memcpy"),
    ("tier_bandwidth", "tier_bandwidth", ["memory_overhead"], "memory_overhead"),
    ("trace_replay", "hit_ratio", ["rows", 0, "reference_belady", "block_hit_ratio"],
     "rows[0].reference_belady.block_hit_ratio"),
    ("trace_replay", "hit_ratio", ["rows", 0, "cascade_semantic", "gap_closed"], "rows[0].cascade_semantic.gap_closed"),
    ("run", "get_breakdown", ["per_rank_stats", 1, "tiers", "shm", "get_latency", "buckets"],
     "per_rank_stats[1].tiers.shm.get_latency.buckets"),
    ("run", "get_breakdown", ["per_rank_stats", 0, "cluster_get_latency"], "per_rank_stats[0].cluster_get_latency"),
    ("mpi_micro", "mpi_micro", ["directory_latency", "lookup_us", "p50"], "directory_latency.lookup_us.p50"),
    ("trace_replay", "hit_ratio", ["system_rows", 3, "lru_block_hit_ratio"], "system_rows[3].lru_block_hit_ratio"),
    ("write_throughput", "systems", ["rows", 0, "put_gbps"], "rows[0].put_gbps"),
    ("read_throughput", "systems", ["limits"], "limits"),
    ("read_latency", "systems", ["rows", 2, "latency_s", "p99"], "rows[2].latency_s.p99"),
    ("scaling", "scaling", ["rows", 1, "get_gbps"], "rows[1].get_gbps"),
    ("scaling", "scaling", ["limits", "2", "memcpy_aggregate_gbps"], "limits.2.memcpy_aggregate_gbps"),
    ("small_blocks", "small_blocks", ["rows", 0, "get_vs_dict"], "rows[0].get_vs_dict"),
    ("small_blocks", "small_blocks", ["rows", 1, "view_us"], "rows[1].view_us"),
    ("file_read_mode", "file_read_mode", ["rows", 0, "buffered_loop", "vs_best_raw"],
     "rows[0].buffered_loop.vs_best_raw"),
    ("file_read_mode", "file_read_mode", ["target_vs_best_raw"], "target_vs_best_raw"),
    ("queue_hints", "queue_hints", ["rows", 0, "cascade", 1, "reference_lookahead"],
     "rows[0].cascade[1].reference_lookahead"),
    ("cluster_serving", "cluster_serving", ["serving", "private", "global"], "serving.private.global"),
    ("cluster_serving", "cluster_serving", ["attach", 0, "attach_cost_us_p50", "get"],
     "attach[0].attach_cost_us_p50.get"),
]


def _delete(doc, keys):
    node = doc
    for k in keys[:-1]:
        node = node[k]
    del node[keys[-1]]


def _copy_samples(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    shutil.copytree(SAMPLES, results)
    return results


@pytest.mark.parametrize("workload,spec,keys,field", MISSING_FIELDS, ids=[m[3] for m in MISSING_FIELDS])
def test_a_missing_field_is_an_error_naming_file_and_field(tmp_path, workload, spec, keys, field):
    results = _copy_samples(tmp_path)
    path = _sample(results, workload)  # one repetition lacks the field: the merge must not hide it
    doc = json.loads(path.read_text())
    _delete(doc, keys)
    path.write_text(json.dumps(doc))
    report = figures.generate(results, tmp_path / "out", only=[spec])
    assert report.exit_code(strict=False) == 2
    [error] = report.errors
    assert isinstance(error, ResultsError)
    assert error.path == str(path) and error.field == field
    assert path.name in str(error) and field in str(error)
    # nothing of a failed figure survives as if it were real
    numbers = (tmp_path / "out" / "Generated" / "numbers.tex").read_text()
    assert MISSING in numbers


def test_cli_reports_missing_field_with_file_and_field(tmp_path, capsys):
    results = _copy_samples(tmp_path)
    path = _sample(results, "trace_replay", rep=1)
    doc = json.loads(path.read_text())
    del doc["rows"][0]["capacity_blocks"]
    path.write_text(json.dumps(doc))
    code = figures.main(["--results", str(results), "--out", str(tmp_path / "out"), "--only", "hit_ratio"])
    err = capsys.readouterr().err
    assert code == 2
    assert path.name in err and "rows[0].capacity_blocks" in err


def test_unreadable_results_file_is_an_error(tmp_path):
    results = _copy_samples(tmp_path)
    suite = _suite(results)
    _add_to_suite(suite, "rep0/cascade_tier_bandwidth_1n_20260101T000000.json", {})
    (suite / "rep0/cascade_tier_bandwidth_1n_20260101T000000.json").write_text("{not json")
    report = figures.generate(results, tmp_path / "out")
    assert report.exit_code(strict=False) == 2
    assert "cascade_tier_bandwidth_1n_20260101T000000.json" in str(report.errors[0])


def test_unreadable_manifest_is_an_error(tmp_path):
    results = _copy_samples(tmp_path)
    (_suite(results) / "manifest.json").write_text("[]")
    report = figures.generate(results, tmp_path / "out")
    assert report.exit_code(strict=False) == 2 and "manifest.json" in str(report.errors[0])


def test_absent_results_are_skipped_listed_and_fail_under_strict(tmp_path, capsys):
    results = tmp_path / "empty"
    results.mkdir()
    # loose results files outside a suite are never read
    shutil.copy(_sample(SAMPLES, "tier_bandwidth"), results / "cascade_tier_bandwidth_1n_20990101T000000.json")
    out = tmp_path / "out"
    assert figures.main(["--results", str(results), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    needing_results = [s.name for s in figures.all_specs() if s.name != "design"]
    for name in needing_results:
        assert f"SKIPPED {name}:" in err
    # placeholders keep the paper buildable and the gaps visible
    for spec in figures.all_specs():
        if spec.figure:
            assert "NOT GENERATED" in (out / "Generated" / f"figure_{spec.name}.tex").read_text()
            assert not (out / "Figures" / f"{spec.name}.png").exists()
    numbers = (out / "Generated" / "numbers.tex").read_text()
    assert MISSING in numbers and r"\newcommand{\DBlockTokens}" in numbers
    assert figures.main(["--results", str(results), "--out", str(out), "--strict"]) == 1
    assert "skipped" in capsys.readouterr().err


def test_scaling_over_nodes_appears_with_runs_of_two_node_counts(tmp_path):
    # Code-path check only: a real multi-node run file does not exist on this machine, so a
    # copy of the sample run is relabelled as a 2-node run (never committed, never plotted
    # for the paper).
    results = _copy_samples(tmp_path)
    doc = json.loads(_sample(results, "run").read_text())
    doc["nodes"] = 2
    _add_to_suite(_suite(results), "rep0/cascade_run_2n_20990101T000000.json", doc)
    report = figures.generate(results, tmp_path / "out", only=["scaling"])
    assert not report.errors and not report.skipped and not report.layout
    numbers = (tmp_path / "out" / "Generated" / "numbers.tex").read_text()
    assert r"\newcommand{\ScaleMaxNodes}{2\xspace}" in numbers
    assert "cascade_run_2n_20990101T000000.json" in (tmp_path / "out" / "Generated" / "figure_scaling.tex").read_text()


def test_only_the_newest_suite_is_read(tmp_path):
    results = _copy_samples(tmp_path)
    old = results / "suite_000000000000_20000101T000000"
    shutil.copytree(_suite(results), old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["started"] = "2000-01-01T00:00:00+00:00"
    (old / "manifest.json").write_text(json.dumps(manifest))
    for path in old.rglob("*trace_replay*.json"):  # an old, broken suite must not be read
        doc = json.loads(path.read_text())
        del doc["rows"][0]["capacity_blocks"]
        path.write_text(json.dumps(doc))
    report = figures.generate(results, tmp_path / "out", only=["hit_ratio"])
    assert not report.errors and not report.skipped
    # naming the old suite reads it (and fails on the broken file)
    report = figures.generate(old, tmp_path / "out2", only=["hit_ratio"])
    assert report.exit_code(strict=False) == 2


# -- spread over repetitions ----------------------------------------------------------------
def test_spread_arithmetic_is_per_repetition():
    a, b = Spread([1.0, 4.0, 2.0]), Spread([2.0, 2.0, 4.0])
    assert float(a) == 2.0 and (a.lo, a.hi) == (1.0, 4.0)
    ratio = a / b  # per repetition: 0.5, 2.0, 0.5 -- not median(a) / median(b) = 0.667
    assert ratio.reps == (0.5, 2.0, 0.5) and float(ratio) == 0.5
    assert (100 * a).reps == (100.0, 400.0, 200.0) and (1 / b).reps == (0.5, 0.5, 0.25)
    assert sum([a, b]).reps == (3.0, 6.0, 6.0)
    with pytest.raises(ValueError):
        a + Spread([1.0, 2.0])


def test_merge_keeps_equal_values_and_spreads_differing_ones():
    docs = [{"n": 8, "rows": [{"system": "x", "gbps": g}, {"system": "y", "gbps": 1.0}], "host": h}
            for g, h in ((3.0, "a"), (1.0, "b"), (2.0, "c"))]
    docs[2]["rows"].reverse()  # rows are matched by identity, not position
    docs[1]["rows"].append({"system": "z", "gbps": 5.0})  # not in every repetition: kept, over those
    merged = merge(docs)
    assert merged["n"] == 8 and not isinstance(merged["n"], Spread) and merged["host"] == "a"
    assert [r["system"] for r in merged["rows"]] == ["x", "y", "z"]
    z = merged["rows"][2]["gbps"]
    assert isinstance(z, Spread) and z.reps == (5.0,) and z.index == (1,)
    x = merged["rows"][0]["gbps"]
    assert isinstance(x, Spread) and x.reps == (3.0, 1.0, 2.0) and float(x) == 2.0
    assert merged["rows"][1]["gbps"] == 1.0 and not isinstance(merged["rows"][1]["gbps"], Spread)


def test_merge_matches_rows_by_size_blocks_and_rank_and_keeps_partial_rows():
    """Rows keyed as the suite keys them (size, blocks) or by rank are matched, not taken by
    position; a row some repetitions lack stays, as spreads over the others; a rank's
    measured ``blocks`` does not split its row."""
    rows = [{"size": 4096, "n": 7}, {"size": 2 << 20, "us": 9.0, "n": 7}]
    docs = [{"rows": [{**rows[0], "us": 1.0 + k}, rows[1]][: 1 if k == 1 else 2],
             "io": [{"size": 4096, "blocks": b, "gbps": b + k} for b in (1, 64)],
             "per_rank_stats": [{"rank": r, "blocks": 10 * r + k, "gets": 5} for r in (1, 0)][:: 1 if k else -1]}
            for k in range(3)]
    merged = merge(docs)
    small, big = merged["rows"]
    assert small["us"].reps == (1.0, 2.0, 3.0) and small["n"] == 7 and not isinstance(small["n"], Spread)
    assert big["size"] == 2 << 20 and not isinstance(big["size"], Spread)
    for value in (big["us"], big["n"]):  # measured in repetitions 0 and 2 only, even where they agree
        assert isinstance(value, Spread) and value.index == (0, 2) and value.reps == (float(value),) * 2
    assert [(r["blocks"], r["gbps"].reps) for r in merged["io"]] == [(1, (1.0, 2.0, 3.0)), (64, (64.0, 65.0, 66.0))]
    assert [r["rank"] for r in merged["per_rank_stats"]] == [0, 1]
    assert merged["per_rank_stats"][1]["blocks"].reps == (10.0, 11.0, 12.0)


def test_spreads_of_different_repetitions_combine_over_those_both_measured():
    from paper.plots.common import met_in, per_rep

    full, partial = Spread([1.0, 2.0, 3.0], index=(0, 1, 2)), Spread([2.0, 4.0], index=(0, 2))
    ratio = full / partial
    assert ratio.reps == (0.5, 0.75) and ratio.index == (0, 2)
    assert (partial * 2).index == (0, 2)
    with pytest.raises(ValueError):
        Spread([1.0], index=(1,)) + Spread([1.0], index=(0,))
    assert per_rep(partial, [0, 1, 2]) == [2.0, None, 4.0]
    assert met_in([partial], [0, 1, 2], lambda v: v > 0) == 2  # not measured: not met


def test_merge_of_lists_that_cannot_be_matched_is_an_error_naming_the_file(tmp_path):
    results = _copy_samples(tmp_path)
    for rep in range(3):
        path = _sample(results, "small_blocks", rep)
        doc = json.loads(path.read_text())
        doc["per_pass_s"] = [0.5, 0.25] if rep != 1 else [0.5]
        path.write_text(json.dumps(doc))
    report = figures.generate(results, tmp_path / "out", only=["small_blocks"])
    assert report.exit_code(strict=False) == 2
    [error] = [e for e in report.errors if e.field == "per_pass_s"]
    assert error.path == str(_sample(results, "small_blocks", 1)) and "repetition 1" in str(error)


def test_a_row_measured_in_some_repetitions_is_kept_over_those(tmp_path):
    """small_blocks of repetition 1 lacks its largest size: every size stays in the table and
    the smallest one's numbers are spreads over all three repetitions."""
    results = _copy_samples(tmp_path)
    path = _sample(results, "small_blocks", 1)
    doc = json.loads(path.read_text())
    doc["rows"] = sorted(doc["rows"], key=lambda r: r["size"])[:-1]
    path.write_text(json.dumps(doc))
    report = figures.generate(results, tmp_path / "out", only=["small_blocks"])
    assert not report.errors and not report.skipped
    per_rep = [min(json.loads(_sample(results, "small_blocks", k).read_text())["rows"], key=lambda r: r["size"])
               for k in range(3)]
    assert _defined(tmp_path / "out")["SbGetUs"] == sig(Spread([r["get_loop_us"] for r in per_rep]))
    sizes = {r["size"] for r in json.loads(_sample(results, "small_blocks", 0).read_text())["rows"]}
    body = (tmp_path / "out" / "Tables" / "small_blocks.tex").read_text().split(r"\midrule")[1]
    assert body.count(r"\\") == len(sizes)


def test_small_negative_numbers_read_as_unsigned_zero_and_straddled_targets_show():
    from paper.macros import integer

    assert pct(-0.0033, 0) == "0" and sig(-0.0) == "0" and integer(-0.2) == "0"
    assert pct(Spread([-0.004, 0.004, 0.02]), 0) == "0 (0--2)"
    assert pct(-0.02, 0) == "-2"
    straddles = Spread([2.98, 3.01, 3.03])  # a target of 3 met in two repetitions of three
    assert sig(straddles, 2) == "3.0" and sig(straddles, 2, around=3.0) == "3.01 (2.98--3.03)"
    assert sig(straddles, 2, around=4.0) == "3.0"


def test_a_target_straddled_at_a_power_of_ten_shows_one_more_digit():
    """0.998 and 1.003 print as 1.00 and 1.0 at two digits, yet round alike: a range about a
    target of 1 gets its digit too, not ``1.0 (1.00--1.0)``."""
    straddles = Spread([0.998, 1.001, 1.003])
    assert sig(straddles, 2) == "1.0 (1.00--1.0)"
    assert sig(straddles, 2, around=1.0) == "1.00 (0.998--1.00)"


def test_numbers_and_tables_show_median_and_range(built):
    out, _ = built
    assert sig(Spread([1.0, 3.0, 2.0])) == "2.00 (1.00--3.00)" and pct(Spread([0.1, 0.3, 0.2]), 0) == "20 (10--30)"
    numbers = (out / "Generated" / "numbers.tex").read_text()
    assert re.search(r"\\newcommand\{\\SysCascadeGetGBps\}\{[0-9.]+ \([0-9.]+--[0-9.]+\)", numbers)
    assert r"\newcommand{\SuiteReps}{3\xspace}" in numbers
    assert re.search(r"[0-9.]+\\,\{\\scriptsize\([0-9.]+--[0-9.]+\)\}", (out / "Tables" / "systems.tex").read_text())


def test_figures_draw_min_max_bars(monkeypatch, tmp_path):
    from paper import style
    drawn: list[int] = []
    real = style.whiskers
    monkeypatch.setattr(style, "whiskers", lambda *a, **k: drawn.append(real(*a, **k)) or drawn[-1])
    for name in ("systems", "tier_bandwidth", "scaling"):
        drawn.clear()
        report = figures.generate(SAMPLES, tmp_path / name, only=[name])
        assert not report.errors and not report.skipped
        assert sum(drawn) > 0, f"{name}: no error bar drawn from a suite of differing repetitions"


def test_get_breakdown_shows_spread_over_repetitions(built, monkeypatch, tmp_path):
    out, _ = built
    cells = (out / "Tables" / "get_latency.tex").read_text().split(r"\midrule")[1]
    assert re.search(r"[0-9]+\\,\{\\scriptsize\([0-9.]+--[0-9.]+\)\}", cells), "no range in the get table"
    numbers = (out / "Generated" / "numbers.tex").read_text()
    assert re.search(r"\\newcommand\{\\RunServedGets\}\{[0-9]+ \([0-9]+--[0-9]+\)", numbers)
    from matplotlib.axes import Axes
    bands: list[int] = []
    real = Axes.fill_between
    monkeypatch.setattr(Axes, "fill_between", lambda *a, **k: bands.append(1) or real(*a, **k))
    report = figures.generate(SAMPLES, tmp_path, only=["get_breakdown"])
    assert not report.errors and not report.skipped and bands, "no min-max band on the cumulative curves"


def test_get_breakdown_copes_with_a_tier_that_served_no_gets_in_some_repetitions(tmp_path):
    # Code-path check on a copy (never committed): REMOTE-tier gets are few at 4 ranks, and a
    # repetition may have none; here only the last repetition that had some keeps them.
    results = _copy_samples(tmp_path)

    def remote_gets(rep: int) -> int:
        doc = json.loads(_sample(results, "run", rep).read_text())
        return sum(r["tiers"]["remote"]["get_latency"]["count"] for r in doc["per_rank_stats"])

    [keep, *_] = [rep for rep in (2, 1, 0) if remote_gets(rep)] or [None]
    assert keep is not None, "no repetition of the sample's run has REMOTE-tier gets: re-measure the sample"
    kept = None
    for rep in range(3):
        path = _sample(results, "run", rep)
        doc = json.loads(path.read_text())
        hists = [r["tiers"]["remote"]["get_latency"] for r in doc["per_rank_stats"]]
        if rep == keep:
            kept = 1e6 * sum(h["sum_s"] for h in hists) / sum(h["count"] for h in hists)
            continue
        for h in hists:
            h.update(count=0, sum_s=0.0, buckets=[0] * len(h["buckets"]))
        path.write_text(json.dumps(doc))
    report = figures.generate(results, tmp_path / "out", only=["get_breakdown"])
    assert not report.errors and not report.skipped and not report.layout
    [row] = [r for r in (tmp_path / "out" / "Tables" / "get_latency.tex").read_text().splitlines()
             if r.startswith("REMOTE")]
    assert row.split(" & ")[2] == sig(kept), row  # the mean of the one repetition that had such gets


# -- which suite run, and suites that lack or add workloads ---------------------------------
def test_default_is_newest_suite_in_benchmark_results_else_sample(tmp_path, monkeypatch, capsys):
    from paper import results as paper_results

    bench = tmp_path / "bench_results"
    bench.mkdir()
    (bench / "loose_tier_bandwidth_1n_20260101T000000.json").write_text("{}")  # not a suite: ignored
    monkeypatch.setattr(paper_results, "DEFAULT_RESULTS", bench)
    assert paper_results.default_results() == paper_results.SAMPLE_RESULTS
    assert figures.main(["--out", str(tmp_path / "a"), "--only", "design"]) == 0
    sample = _suite(SAMPLES)
    commit = json.loads((sample / "manifest.json").read_text())["commit"][:12]
    said = capsys.readouterr().out
    assert f"read the suite run {sample.relative_to(PAPER.parent)} (commit {commit}" in said
    assert "benchmark/results holds no suite run" in said
    assert commit in (tmp_path / "a" / "Generated" / "numbers.tex").read_text().split("\n\n")[0]
    # a suite run lands in benchmark/results (as the lead's default run will): read with no change
    copied = bench / "suite_0123456789ab_20991231T000000"
    shutil.copytree(sample, copied)
    manifest = json.loads((copied / "manifest.json").read_text())
    manifest.update(commit="0123456789ab" + "0" * 28, size="default", started="2099-12-31T00:00:00Z")
    (copied / "manifest.json").write_text(json.dumps(manifest))
    assert paper_results.default_results() == bench
    assert figures.main(["--out", str(tmp_path / "b"), "--only", "design"]) == 0
    said = capsys.readouterr().out
    assert f"read the suite run {copied} (commit 0123456789ab, size default, 3 repetitions)" in said
    header = (tmp_path / "b" / "Generated" / "numbers.tex").read_text().split("\n\n")[0]
    assert copied.name in header and "0123456789ab" in header


def _keep_runs(suite: Path, keep) -> None:
    manifest = json.loads((suite / "manifest.json").read_text())
    manifest["runs"] = [r for r in manifest["runs"] if keep(r)]
    (suite / "manifest.json").write_text(json.dumps(manifest))


def test_suite_without_run_workload_gives_n_a_for_get_breakdown_only(tmp_path):
    results = _copy_samples(tmp_path)
    _keep_runs(_suite(results), lambda r: r["workload"] != "run")
    report = figures.generate(results, tmp_path / "out")
    assert not report.errors and [name for name, _ in report.skipped] == ["get_breakdown"]
    assert "no run results (python -m benchmark.suite --workloads run)" in dict(report.skipped)["get_breakdown"]
    numbers = (tmp_path / "out" / "Generated" / "numbers.tex").read_text()
    assert re.search(r"% NOT GENERATED: the suite run has no run results.*\n\\newcommand\{\\RunGets\}\{"
                     + re.escape(MISSING), numbers)
    assert "NOT GENERATED" in (tmp_path / "out" / "Generated" / "figure_get_breakdown.tex").read_text()


def test_suite_with_extra_workloads_or_a_failed_repetition_still_builds(tmp_path):
    results = _copy_samples(tmp_path)
    suite = _suite(results)
    # a workload no figure reads (a default run has cross_node, stress_mpi, ...): listed as unused
    extra = {"system": "cascade", "workload": "stress_mpi", "total": {"hits": 5, "wrong_bytes": 0}}
    _add_to_suite(suite, "rep0/cascade_stress_mpi_1n_20990101T000000.json", extra)
    # a repetition that failed: its file is not read, the other two still give spreads
    _keep_runs(suite, lambda r: not (r["rep"] == 1 and r["workload"] in ("run", "read_throughput", "scaling")))
    report = figures.generate(results, tmp_path / "out")
    assert not report.errors and not report.skipped and not report.layout
    assert any("stress_mpi" in name for name in report.unused)
    assert "rep1/cascade_run" not in (tmp_path / "out" / "Generated" / "figure_get_breakdown.tex").read_text()


# -- the workloads with rows of their own: verdicts judged per repetition, absent parts said ----
def _defined(out: Path) -> dict[str, str]:
    return dict(re.findall(r"\\newcommand\{\\([A-Za-z]+)\}\{(.*)\\xspace\}",
                           (out / "Generated" / "numbers.tex").read_text()))


def test_device_io_without_a_gpu_says_not_run_and_why(tmp_path):
    out = tmp_path
    doc = json.loads(_sample(SAMPLES, "device_io").read_text())
    assert "skipped" in doc, "the sample was measured on a machine with a GPU: this test needs one without"
    from paper.tables import escape

    figures.generate(SAMPLES, out, only=["device_io"], device_dir=None)  # and no GPU suite beside it

    assert _defined(out)["DevSentence"] == f"was not run in this suite run: {escape(doc['skipped'])}"
    table = (out / "Tables" / "device_io.tex").read_text()
    assert f"not run: {escape(doc['skipped'])}" in table and r"\toprule" in table


def _samples_with_a_full_trace_row(tmp_path, requests: int, references: int):
    """The sample results, each trace_replay repetition with :func:`_add_full_trace_row`."""
    results = _copy_samples(tmp_path)
    for rep in range(3):
        path = _sample(results, "trace_replay", rep)
        doc = json.loads(path.read_text())
        _add_full_trace_row(doc, requests=requests, references=references)
        path.write_text(json.dumps(doc))
    return results


def _add_full_trace_row(doc: dict, requests: int, references: int) -> None:
    """A capacity at which Cascade replayed the whole trace (``scope: "full"``), on more
    requests than the common prefix of the sample's one capacity, with a wide LRU-to-Belady gap."""
    import copy

    row = copy.deepcopy(doc["rows"][0])
    row["capacity_blocks"] = 3000
    row["reference_lru"].update(block_hit_ratio=0.1, references=references)
    row["reference_belady"].update(block_hit_ratio=0.5, references=references)
    for policy in ("cascade_semantic", "cascade_lru"):
        row[policy].update(requests=requests, references=references, scope="full", capacity_blocks=3000,
                           prefix_requests=requests, block_hit_ratio=0.2, gap_closed=0.25)
        doc["system_rows"].append({k: v for k, v in row[policy].items() if k != "prefill_saving"})
    doc["rows"].append(row)


def test_trace_replay_quotes_each_capacity_on_its_own_requests(tmp_path):
    """The capacities replay different requests (the common prefix, the whole trace): the
    numbers quoted come with the requests and references of their own row, and the table
    says how many requests each capacity replayed."""
    results = _samples_with_a_full_trace_row(tmp_path, requests=90, references=2345)
    report = figures.generate(results, tmp_path / "out", only=["hit_ratio"])
    assert not report.errors and not report.skipped and not report.layout
    doc = json.loads(_sample(results, "trace_replay").read_text())
    prefix = doc["rows"][0]["cascade_semantic"]["requests"]
    defined = _defined(tmp_path / "out")
    assert (defined["TrCapacity"], defined["TrRequests"], defined["TrReferences"]) == ("3000", "90", "2345")
    assert defined["TrTraceRequests"] == integer(doc["requests"])
    assert defined["TrPeerRequests"] == str(prefix) and defined["TrPeerPrefix"] == "a shorter prefix"
    table = (tmp_path / "out" / "Tables" / "trace_replay.tex").read_text()
    assert "capacity & requests & LRU" in table and f"300 & {prefix} & " in table and "3000 & 90 & " in table
    assert "whole run is its first" not in (tmp_path / "out" / "Generated" / "figure_hit_ratio.tex").read_text()


def test_hit_ratio_lines_join_only_capacities_replayed_on_the_same_requests(tmp_path):
    """The sample's capacity replays the common prefix, an added one the whole trace: no line
    of the figure (LRU, Belady, a system, either panel) joins the two, and LRU and Belady
    still show at both, as markers."""
    import matplotlib.pyplot as plt

    from paper.plots import hit_ratio
    from paper.results import Results

    results = _samples_with_a_full_trace_row(tmp_path, requests=90, references=2345)
    rf = Results.load(results).newest("trace_replay")
    rows, srows = hit_ratio._rows(rf), hit_ratio._system_rows(rf)
    requests = hit_ratio._requests(rf, rows)
    assert len(requests) == 2 and len(set(requests.values())) == 2
    fig = hit_ratio.draw(rows, requests, srows, sorted({str(r["system"]) for _, r in srows}))
    try:
        for ax in fig.axes:
            for line in ax.get_lines():
                xs = {float(x) for x in line.get_xdata()}
                if xs <= set(requests):  # not the axhlines (axes coordinates) of the bottom panel
                    assert len({requests[x] for x in xs}) == 1, (line.get_label(), sorted(xs))
        ax_hit = fig.axes[0]
        for ref in hit_ratio.REFS.values():
            shown = [set(line.get_xdata()) for line in ax_hit.get_lines()
                     if line.get_color() == ref["color"] and line.get_marker() not in ("None", "_")]
            assert set().union(*shown) == set(requests)
    finally:
        plt.close(fig)


def test_trace_replay_peers_on_the_quoted_requests_are_not_called_a_shorter_prefix(built):
    doc = json.loads(_sample(SAMPLES, "trace_replay").read_text())
    assert len(doc["rows"]) == 1  # the sample quotes the common prefix: the peers replayed the same
    assert _defined(built[0])["TrPeerPrefix"] == "the same requests"


def test_a_trace_replay_row_is_whole_per_row_not_by_the_first_row():
    from paper.plots.hit_ratio import _whole

    assert _whole({"scope": "full", "requests": 12031, "prefix_requests": 12031, "truncated": False})
    assert _whole({"scope": "compare", "requests": 600, "prefix_requests": 600, "truncated": False})
    assert not _whole({"scope": "compare", "requests": 400, "prefix_requests": 600, "truncated": True})


def test_a_system_that_failed_in_one_repetition_is_kept_and_noted(tmp_path):
    """Mooncake replayed in repetitions 0 and 1 and could not start in 2: its rows stay (over
    two repetitions) and the caption names it as not run in one or more repetitions."""
    results = _copy_samples(tmp_path)
    path = _sample(results, "trace_replay", 2)
    doc = json.loads(path.read_text())
    doc["system_rows"] = [r for r in doc["system_rows"] if r["system"] != "mooncake"]
    doc["not_run"] = [{"system": "mooncake", "status": "skipped", "reason": "setup returned -1",
                       "capacity_blocks": 300, "scope": "compare"}]
    path.write_text(json.dumps(doc))
    report = figures.generate(results, tmp_path / "out", only=["hit_ratio"])
    assert not report.errors and not report.skipped
    assert "Mooncake" in _defined(tmp_path / "out")["TrPeersReplayed"]
    assert "Mooncake" in (tmp_path / "out" / "Tables" / "trace_replay_systems.tex").read_text()
    caption = (tmp_path / "out" / "Generated" / "figure_hit_ratio.tex").read_text()
    assert "Not run in one or more repetitions: Mooncake" in caption


def test_the_run_quotes_all_gets_and_the_served_gets_apart(built):
    """The tier histograms hold served gets (hits): \\RunGets is every get, and the hit ratio
    beside it is served over all gets of the same run."""
    out, _ = built
    totals = []
    for rep in range(3):
        doc = json.loads(_sample(SAMPLES, "run", rep).read_text())
        ranks = doc["per_rank_stats"]
        served = sum(t["get_latency"]["count"] for r in ranks for t in r["tiers"].values())
        totals.append((sum(r["gets"] for r in ranks), served + sum(r["cluster_get_latency"]["count"] for r in ranks)))
    defined = _defined(out)
    assert defined["RunGets"] == integer(Spread([g for g, _ in totals]))
    assert defined["RunServedGets"] == integer(Spread([s for _, s in totals]))
    assert defined["RunHitPct"] == pct(Spread([s / g for g, s in totals]))
    text = (PAPER / "4. Evaluation.tex").read_text()
    assert r"\GetLustreGetsPct\% of the served" in text and r"(\GetClusterGetsPct\% of the served gets)" in text


def test_the_targets_table_reads_every_file_with_targets(built):
    from paper.plots.targets import _key

    out, _ = built
    recorded = sum(len(json.loads(p.read_text()).get("targets") or [])
                   for p in sorted((_suite(SAMPLES) / "rep0").glob("*.json")))
    assert any("thread_scaling" in p.name for p in (_suite(SAMPLES) / "rep0").glob("*.json"))
    assert _defined(out)["TargetsCount"] == str(recorded)
    assert _key({"name": "get x", "block_bytes": 1, "threads": 1}) != _key({"name": "get x", "block_bytes": 1,
                                                                            "threads": 2})


def test_the_restart_caption_says_recovered_and_adopted_are_medians():
    from paper.plots.restart import TABLE_CAPTION

    medians, summed = TABLE_CAPTION.split("summed")[0].rsplit(";", 1)
    assert "recovered" in medians and "adopted" in medians and "median" in medians and "recovered" not in summed


def test_read_stall_files_are_known_by_name(tmp_path):
    path = tmp_path / "all_read_stall_1n_20990101T000000.json"
    path.write_text(json.dumps({"rows": []}))
    assert load_file(path).workload == "read_stall"


def test_device_io_with_a_gpu_gives_ratios_and_verdicts(tmp_path):
    """The GPU branch, on results shaped as device_io.run writes them on a GPU (no GPU here:
    the numbers are placeholders; the real run is in benchmark/results/device)."""
    results = _copy_samples(tmp_path)
    _add_gpu_device_io(_suite(results))
    report = figures.generate(results, tmp_path / "out", only=["device_io"])
    assert not report.errors and not report.skipped
    sentence = _defined(tmp_path / "out")["DevSentence"]
    assert sentence.startswith("ran on Test GPU (driver 13000)")
    assert "GPU-tier puts at least" in sentence and "met in 2 of 3 repetitions" in sentence
    assert "GPU-tier gets at least 0.91 (0.90--0.92)$\\times$ of the raw copy (met in all 3 repetitions)" in sentence
    body = (tmp_path / "out" / "Tables" / "device_io.tex").read_text().split(r"\midrule")[1]
    assert body.count(r"\\") == 4


def _with_gpu_suite(tmp_path):
    """The sample results, and beside them (``device``) a GPU suite run of device_io alone."""
    results = _copy_samples(tmp_path)
    device = tmp_path / "device"
    shutil.copytree(SAMPLES, device)
    gpu_suite = _suite(device)
    _keep_runs(gpu_suite, lambda r: False)
    _add_gpu_device_io(gpu_suite)
    return results, device, gpu_suite


def test_device_io_skipped_in_the_suite_is_read_from_the_gpu_suite_beside_it(tmp_path):
    """The build machines have no GPU: device_io then comes from a separate suite run made on
    a GPU machine (benchmark/results/device), and the text says which run it was."""
    results, device, gpu_suite = _with_gpu_suite(tmp_path)
    report = figures.generate(results, tmp_path / "out", only=["device_io"], device_dir=device)
    assert not report.errors and not report.skipped
    sentence = _defined(tmp_path / "out")["DevSentence"]
    assert sentence.startswith("was skipped in this suite run (")
    assert "a separate run of it alone, suite run " in sentence and gpu_suite.name.replace("_", r"\_") in sentence
    assert "ran on Test GPU (driver 13000)" in sentence
    body = (tmp_path / "out" / "Tables" / "device_io.tex").read_text()
    assert str(gpu_suite.name) in body and body.split(r"\midrule")[1].count(r"\\") == 4


def test_the_gpu_suite_device_io_came_from_is_named_with_its_commit_and_repetitions(tmp_path):
    """The paper reads one suite run but for device_io: the GPU suite run, at its own commit
    and with its own repetitions, is named in the captions, the numbers' header and on stdout."""
    results, device, gpu_suite = _with_gpu_suite(tmp_path)
    _keep_runs(gpu_suite, lambda r: r["rep"] != 2)  # a GPU suite of two repetitions
    manifest = json.loads((gpu_suite / "manifest.json").read_text())
    manifest["commit"] = "feedfacecafe" + "0" * 28
    (gpu_suite / "manifest.json").write_text(json.dumps(manifest))
    only = ["small_blocks", "device_io", "machine"]  # small_blocks: a file that records its machine
    report = figures.generate(results, tmp_path / "out", only=only, device_dir=device)
    assert not report.errors and not report.skipped
    defined = _defined(tmp_path / "out")
    assert defined["DevReps"] == "2" and defined["SuiteReps"] == "3"
    assert gpu_suite.name.replace("_", r"\_") in defined["SuiteDevice"] and "feedfacecafe" in defined["SuiteDevice"]
    assert "2 repetitions" in defined["SuiteDevice"]
    assert "device_io from the suite run" in report.source and "commit feedfacecafe" in report.source
    assert "feedfacecafe" in (tmp_path / "out" / "Generated" / "numbers.tex").read_text().split("\n\n")[0]
    for table in ("results_files", "versions"):
        assert r"\SuiteDevice" in (tmp_path / "out" / "Tables" / f"{table}.tex").read_text()
    assert r"\DevReps repetitions" in (tmp_path / "out" / "Tables" / "device_io.tex").read_text()
    report = figures.generate(results, tmp_path / "alone", only=only, device_dir=None)
    assert _defined(tmp_path / "alone")["SuiteDevice"] == "" and "device_io from" not in report.source


def _add_gpu_device_io(suite: Path) -> None:
    """Replace the suite's device_io runs with files shaped as device_io.run writes them on
    a GPU (placeholder numbers): GPU-tier puts miss the target in repetition 0 only."""
    from benchmark.workloads.device_io import TARGET

    _keep_runs(suite, lambda r: r["workload"] != "device_io")
    ops = ("gpu_put", "gpu_get", "gpu_put_batch", "gpu_get_batch", "shm_put_from_gpu", "shm_get_into_gpu",
           "shm_put_from_gpu_batch", "shm_get_into_gpu_batch")
    raws = ("raw_d2d", "raw_pinned_h2d", "raw_pinned_d2h", "raw_pageable_h2d", "raw_pageable_d2h")
    for rep in range(3):
        below = TARGET * (0.5 if rep == 0 else 1.5)  # GPU-tier puts miss the target in repetition 0 only
        rows = [{"size": size, "blocks": blocks, "limits": {k: {"gbps": 10.0, "cpu_us": 5.0} for k in raws},
                 "cascade": {k: {"gbps": 9.0 + rep, "cpu_us_per_block": 4.0} for k in ops} | {
                     "wrong_blocks": {"count": 0.0}},
                 "ratios": {"gpu_put_vs_d2d": below, "gpu_get_vs_d2d": 0.9 + rep / 100,
                            "shm_get_into_gpu_vs_pinned_h2d": 0.9, "shm_put_from_gpu_vs_pinned_d2h": 0.9}}
                for size in (64 << 10, 2 << 20) for blocks in (1, 64)]
        _add_to_suite(suite, f"rep{rep}/all_device_io_1n_2099010{rep + 1}T000000.json",
                      {"system": "all", "workload": "device_io", "gpu": "Test GPU", "driver_version": 13000,
                       "runtime_version": 13000, "rows": rows}, rep)


def test_small_blocks_targets_are_judged_in_each_repetition(tmp_path):
    """A target met in one repetition only reads "met in 1 of 3", whatever the median says."""
    from benchmark.workloads.small_blocks import GET_TARGET

    results = _copy_samples(tmp_path)
    values = []
    for rep in range(3):
        path = _sample(results, "small_blocks", rep)
        doc = json.loads(path.read_text())
        row = min(doc["rows"], key=lambda r: r["size"])
        row["get_vs_dict"] = GET_TARGET * (0.5 if rep == 1 else 2.0 + rep)
        values.append(row["get_vs_dict"])
        path.write_text(json.dumps(doc))
    report = figures.generate(results, tmp_path / "out", only=["small_blocks"])
    assert not report.errors and not report.skipped
    defined = _defined(tmp_path / "out")
    assert defined["SbGetMet"] == "met in 1 of 3 repetitions"
    assert defined["SbGetVsDict"] == f"{sig(Spread(values), 2)}$\\times$"


def _per_rep(results: Path, workload: str, edit) -> None:
    """``edit(doc, rep)`` on each repetition's file of ``workload``."""
    for rep in range(3):
        path = _sample(results, workload, rep)
        doc = json.loads(path.read_text())
        edit(doc, rep)
        path.write_text(json.dumps(doc))


def test_every_table_and_macro_shows_a_straddled_target_with_one_more_digit(tmp_path):
    """A value whose range holds its target but rounds to one number gets one more digit in
    every table and macro that prints it, as in the targets table (not only there)."""
    from benchmark.workloads.device_io import TARGET as DEVICE_TARGET
    from benchmark.workloads.queue_hints import ORACLE_SHARE
    from benchmark.workloads.small_blocks import PUT_TARGET

    results = _copy_samples(tmp_path)
    _add_gpu_device_io(_suite(results))

    def near(target: float, step: float, rep: int) -> float:
        """Repetition ``rep``'s value about ``target``: below it once, above twice, all
        three within the last printed digit (``step``: one unit of the next)."""
        return target + step * (-2, 1, 3)[rep]

    def small_blocks(doc, rep):
        row = min(doc["rows"], key=lambda r: r["size"])
        row["put_vs_dict"] = near(PUT_TARGET, 0.01, rep)
        row["hot_get_batch_vs_loop"] = near(1.0, 0.001, rep)

    def file_read_mode(doc, rep):  # buffered: the mode auto chose in the sample
        doc["rows"][0]["buffered_loop"]["vs_best_raw"] = near(doc["target_vs_best_raw"], 0.001, rep)

    def queue_hints(doc, rep):
        cell = doc["rows"][0]["cascade"][0]
        cell["reference_lookahead"] = 0.5
        cell["block_hit_ratio"] = 0.5 * near(ORACLE_SHARE, 0.0001, rep)

    def device_io(doc, rep):
        for row in doc["rows"]:
            row["ratios"]["shm_get_into_gpu_vs_pinned_h2d"] = near(DEVICE_TARGET, 0.001, rep)

    for workload, edit in (("small_blocks", small_blocks), ("file_read_mode", file_read_mode),
                           ("queue_hints", queue_hints), ("device_io", device_io)):
        _per_rep(results, workload, edit)
    only = ["small_blocks", "file_read_mode", "queue_hints", "device_io"]
    report = figures.generate(results, tmp_path / "out", only=only)
    assert not report.errors and not report.skipped
    table = lambda name: (tmp_path / "out" / "Tables" / f"{name}.tex").read_text()  # noqa: E731
    cell = lambda median, lo, hi: f"{median}\\,{{\\scriptsize({lo}--{hi})}}"  # noqa: E731
    assert cell("3.01", "2.98", "3.03") in table("small_blocks")
    assert cell("1.00", "0.998", "1.00") in table("small_blocks")
    assert cell("0.901", "0.898", "0.903") in table("file_read_mode")
    assert cell("0.9501", "0.9498", "0.9503") in table("queue_hints")
    assert cell("0.801", "0.798", "0.803") in table("device_io")
    defined = _defined(tmp_path / "out")
    assert defined["SbPutVsDict"] == "3.01 (2.98--3.03)$\\times$"
    assert defined["FrmAutoLoop"].startswith("0.901 (0.898--0.903)$\\times$ at 64")
    assert "SHM-tier hits into GPU memory at least 0.801 (0.798--0.803)$\\times$" in defined["DevSentence"]


def test_file_read_mode_quotes_the_mode_auto_chose_and_judges_it(built):
    out, _ = built
    defined = _defined(out)
    doc = json.loads(_sample(SAMPLES, "small_blocks").read_text())
    chose = {r["cold_read_mode"] for r in doc["rows"]}
    assert defined["FrmAutoMode"] in chose and len(chose) == 1
    assert defined["FrmAutoMet"].startswith(("met in", "missed in"))
    frm = json.loads(_sample(SAMPLES, "file_read_mode").read_text())
    assert defined["FrmTarget"] == f"{sig(frm['target_vs_best_raw'], 2)}$\\times$"


def test_file_read_mode_takes_the_records_pass_for_no_read_mode(tmp_path):
    """The tier's records read without the store (``records_loop``) is a reference, not
    a read mode: the table neither gains a column for it nor asks for a batch form."""
    results = _copy_samples(tmp_path)
    for rep in range(3):
        path = _sample(results, "file_read_mode", rep)
        doc = json.loads(path.read_text())
        for row in doc["rows"]:
            row["records_loop"] = {"gbps": 2.0, "vs_best_raw": 1.0, "buffered_loop_vs_records": 0.5}
        path.write_text(json.dumps(doc))
    report = figures.generate(results, tmp_path / "out", only=["file_read_mode"])
    assert not report.errors and not report.skipped
    assert "records" not in (tmp_path / "out" / "Tables" / "file_read_mode.tex").read_text()


def test_the_file_read_mode_table_knows_every_read_mode_of_the_file_tier():
    from cascade.tiers.file_reads import READ_MODES
    from paper.plots import file_read_mode

    assert sorted(file_read_mode.MODES) == sorted(READ_MODES)


def test_cluster_serving_renders_a_further_cache_when_the_results_have_one(tmp_path):
    """LMCache's own CPU+disk backends (or any other cache the workload replays beside the
    shared and private ones) become a row and a number, named by the results."""
    results = _copy_samples(tmp_path)
    for rep in range(3):
        path = _sample(results, "cluster_serving", rep)
        doc = json.loads(path.read_text())
        private = doc["serving"]["private"]
        doc["serving"]["lmcache_cpu_disk"] = {"label": "LMCache CPU+disk per worker", "global": private["global"],
                                              "per_client": private["per_client"]}
        path.write_text(json.dumps(doc))
    report = figures.generate(results, tmp_path / "out", only=["cluster_serving"])
    assert not report.errors and not report.skipped
    private = json.loads(_sample(results, "cluster_serving").read_text())["serving"]["private"]["global"]
    assert _defined(tmp_path / "out")["CsOthers"] == f"{pct(private)}\\,\\% with LMCache CPU+disk per worker"
    assert "LMCache CPU+disk per worker & " in (tmp_path / "out" / "Tables" / "cluster_hits.tex").read_text()


def test_queue_hints_without_the_oracle_is_skipped_with_its_reason(tmp_path):
    """A suite whose queue_hints predates the lookahead oracle: n/a, never an error."""
    results = _copy_samples(tmp_path)
    for rep in range(3):
        path = _sample(results, "queue_hints", rep)
        doc = json.loads(path.read_text())
        for row in doc["rows"]:
            for cell in row["cascade"]:
                del cell["reference_lookahead"], cell["vs_lookahead"]
        doc["schema"] = "cascade-bench/queue_hints/1"
        path.write_text(json.dumps(doc))
    report = figures.generate(results, tmp_path / "out", only=["queue_hints"])
    assert not report.errors
    [(name, reason)] = report.skipped
    assert name == "queue_hints" and "no lookahead oracle (schema cascade-bench/queue_hints/1" in reason
    assert _defined(tmp_path / "out")["QhWorst"] == MISSING


def test_queue_hints_counts_cells_against_the_oracle(built):
    out, _ = built
    doc = json.loads(_sample(SAMPLES, "queue_hints").read_text())
    cells = [c for r in doc["rows"] for c in r["cascade"] if c["reference_lookahead"] > 0]
    defined = _defined(out)
    assert defined["QhCells"] == str(len(cells))
    table = (out / "Tables" / "queue_hints.tex").read_text()
    head = table.split(r"\toprule")[1].split(r"\midrule")[0]
    assert head.count("& oracle &") == len(doc["queue_depths"])


# -- thread_scaling, from real tiny runs (the committed sample predates the workload) ----------
TS_BLOCK = 64 << 10
_CELL = re.compile(r"^([0-9.]+)(?:\\,\{\\scriptsize\(([0-9.]+)--([0-9.]+)\)\})?$")


@pytest.fixture(scope="module")
def thread_suite(tmp_path_factory) -> Path:
    """A copy of the sample with three real, tiny ``thread_scaling`` runs as its repetitions."""
    from benchmark import data
    from benchmark.workloads import thread_scaling

    base = tmp_path_factory.mktemp("thread_scaling")
    results = base / "results"
    shutil.copytree(SAMPLES, results)
    blocks = data.generate(base / "data", model="tiny", block_bytes=[TS_BLOCK], blocks=6, seed=0, progress=False)
    for rep in range(3):
        doc = thread_scaling.run({"sizes": [TS_BLOCK], "threads": [1, 2], "blocks": 4, "warmup": 1, "rounds": 1,
                                  "data_dir": str(blocks), "file_dir": str(base / "files")})
        _add_to_suite(_suite(results), f"rep{rep}/cascade_thread_scaling_1n_2099010{rep + 1}T000000.json",
                      {"system": "cascade", **doc}, rep)
    return results


def test_thread_scaling_table_and_numbers_from_a_real_run(thread_suite, tmp_path):
    from paper.macros import size
    from paper.plots.thread_scaling import MACROS

    report = figures.generate(thread_suite, tmp_path, only=["thread_scaling"])
    assert not report.errors and not report.skipped
    text = (tmp_path / "Tables" / "thread_scaling.tex").read_text()
    assert "cascade_thread_scaling_1n_20990103T000000.json" in text.split(r"\begin")[0]  # every repetition named
    head, body = text.split(r"\toprule", 1)[1].split(r"\midrule", 1)
    assert r"GB/s (1) & ratio (1) & GB/s (2) & ratio (2) & $\times$ (2/1)" in head
    rows = [r.removesuffix(r" \\").split(" & ") for r in body.split(r"\bottomrule")[0].strip().splitlines()]
    assert [r[2] for r in rows] == [""] * 4 + [r"\emph{threads}", r"\emph{batch}"] * 4
    assert rows[0][0] == size(TS_BLOCK) and [r[1] for r in rows[:4]] == [
        r"\emph{memcpy}", r"\emph{raw \texttt{O\_DIRECT} read}", r"\emph{raw buffered read, cold}",
        r"\emph{raw buffered read, hot}"]
    labels = [r[1] for r in rows[4::2]]
    assert labels[0] == "SHM, DRAM" and labels[2] == r"file, \texttt{direct}, cold"
    assert re.fullmatch(r"file, \\texttt\{auto\} \((buffered|direct)\), cold", labels[1]), labels[1]
    assert labels[3].startswith(r"file, \texttt{auto} (") and labels[3].endswith(", hot")
    ranges = 0
    for r in rows:
        cells = r[3:] if r[2] else r[3::2]  # limit rows have no ratio
        for cell in cells:
            match = _CELL.match(cell)
            assert match, (r, cell)
            values = [float(v) for v in match.groups() if v is not None]
            assert all(math.isfinite(v) and v > 0 for v in values), (r, cell)
            ranges += match.group(2) is not None
        assert r[2] or r[4] == r[6] == "", r
    assert ranges, "no cell shows a min--max range over the repetitions"
    numbers = (tmp_path / "Generated" / "numbers.tex").read_text()
    defined = dict(re.findall(r"\\newcommand\{\\(Thr[A-Za-z]+)\}\{(.*)\\xspace\}", numbers))
    assert set(defined) == set(MACROS) and defined["ThrTop"] == "2" and defined["ThrBlock"] == size(TS_BLOCK)
    assert defined["ThrAutoMode"] in ("buffered", "direct")
    at = " at " + re.escape(size(TS_BLOCK))  # every number says its block size
    for name, value in defined.items():
        if name not in ("ThrTop", "ThrBlock", "ThrAutoMode"):
            unit = r"(\\,GB/s|\\,\\%|\$\\times\$)?"
            assert re.fullmatch(r"[0-9.]+( \([0-9.]+--[0-9.]+\))?" + unit + at, value), (name, value)


def test_thread_scaling_missing_field_names_file_and_field(thread_suite, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(thread_suite, results)
    [path] = (_suite(results) / "rep1").glob("cascade_thread_scaling_*.json")
    doc = json.loads(path.read_text())
    [i] = [i for i, r in enumerate(doc["rows"]) if (r.get("file_read_mode"), r.get("cache"), r.get("form"),
                                                     r["threads"]) == ("auto", "cold", "threads", 2)]
    # a cold row is compared with the raw read of the mode it read in
    same = "raw_odirect_read" if doc["rows"][i]["effective_read_mode"] == "direct" else "raw_buffered_cold_read"
    del doc["rows"][i]["vs_limit"][same]
    path.write_text(json.dumps(doc))
    report = figures.generate(results, tmp_path / "out", only=["thread_scaling"])
    [error] = report.errors
    assert error.path == str(path) and error.field == f"rows[{i}].vs_limit.{same}"
    assert "NOT GENERATED" in (tmp_path / "out" / "Tables" / "thread_scaling.tex").read_text()


def test_thread_scaling_reads_n_a_without_the_workload(thread_suite, tmp_path):
    from paper.plots.thread_scaling import MACROS

    results = tmp_path / "results"
    shutil.copytree(thread_suite, results)
    _keep_runs(_suite(results), lambda r: r["workload"] != "thread_scaling")
    report = figures.generate(results, tmp_path / "out", only=["thread_scaling"])
    assert not report.errors and report.skipped == [
        ("thread_scaling", "the suite run has no thread_scaling results "
                           "(python -m benchmark.suite --workloads thread_scaling)")]
    table = (tmp_path / "out" / "Tables" / "thread_scaling.tex").read_text()
    assert r"\label{tab:thread_scaling}" in table and r"Not generated: the suite run has no thread\_scaling" in table
    assert r"\toprule" not in table
    numbers = (tmp_path / "out" / "Generated" / "numbers.tex").read_text()
    for name in MACROS:
        assert f"\\newcommand{{\\{name}}}{{{MISSING}\\xspace}}" in numbers, name


# -- the text quotes numbers only through generated macros ----------------------------------
# Names that contain digits but are not quoted numbers.
NAME_TOKENS = re.compile(r"BLAKE3|SHA-256|XXH3-64|XXH3|CRC-32|LLaMA-70B|HDF5|h5py|mpi4py|p50|p99|A100|MPI-3|3FS")
# Commands whose arguments are code, file names or cross-references, not prose.
CODE_ARGS = re.compile(r"\\(?:texttt|path|url|label|ref|input|includegraphics|usepackage|documentclass|"
                       r"cite|begin|end)(?:\[[^\]]*\])?\{(?:[^{}]|\{[^{}]*\})*\}")
LATEX_COMMANDS = {
    "documentclass", "usepackage", "renewcommand", "ttdefault", "xspaceaddexceptions", "input", "title", "author",
    "date", "begin", "end", "maketitle", "section", "subsection", "paragraph", "label", "ref", "texttt", "path",
    "mu", "S", "emph", "textbf", "cite", "url", "footnote", "item", "bibliographystyle", "bibliography",
    "clearpage",
}


def _prose(text: str) -> str:
    text = re.sub(r"(?<!\\)%.*", "", text)  # comments
    text = re.sub(r"\\\\", " ", text)  # line breaks
    text = re.sub(r"\\documentclass\[[^\]]*\]", "", text)
    text = re.sub(r"\\usepackage\[[^\]]*\]", "", text)
    return CODE_ARGS.sub(" ", text)


@pytest.mark.parametrize("path", TEXT_FILES, ids=[p.name for p in TEXT_FILES])
def test_text_types_in_no_numbers(path):
    prose = _prose(path.read_text())
    prose = re.sub(r"\\[A-Za-z]+", " ", prose)  # macros (names have no digits)
    prose = NAME_TOKENS.sub(" ", prose)
    numbers = re.findall(r".{0,30}\d.{0,30}", prose)
    assert not numbers, f"{path.name} types in numbers; use a macro of Generated/numbers.tex: {numbers}"


def test_captions_type_in_no_numbers():
    for spec in figures.all_specs():
        for caption in [spec.caption, *spec.tables.values()]:
            prose = re.sub(r"\\[A-Za-z]+", " ", _prose(caption))
            assert not re.search(r"\d", NAME_TOKENS.sub(" ", prose)), (spec.name, caption)


def test_text_uses_only_generated_macros():
    declared = {m for spec in figures.all_specs() for m in spec.macros}
    for path in TEXT_FILES:
        text = re.sub(r"(?<!\\)%.*", "", path.read_text()).replace("\\\\", " ")
        used = set(re.findall(r"\\([A-Za-z]+)", text))
        unknown = used - declared - LATEX_COMMANDS
        assert not unknown, f"{path.name} uses macros nobody generates: {sorted(unknown)}"
    for spec in figures.all_specs():
        for caption in [spec.caption, *spec.tables.values()]:
            for name in re.findall(r"\\([A-Z][a-z]+[A-Z][A-Za-z]*)", caption):
                assert name in declared, (spec.name, name)


def test_every_generated_number_is_quoted():
    """No orphan macros: each one appears in the text or in a caption (captions live in
    the figure modules)."""
    quoted = "".join(p.read_text() for p in TEXT_FILES)
    quoted += "".join(p.read_text() for p in (PAPER / "plots").glob("*.py"))
    unused = [m for spec in figures.all_specs() for m in spec.macros if f"\\{m}" not in quoted]
    assert not unused, f"generated but never quoted: {unused}"


# -- the PDF (TeX from paper/install-tex.sh; `make test` runs it) -----------------------------
SECTIONS = ("Abstract", "Introduction", "Background and related work", "Design", "Evaluation", "References")


@pytest.mark.slow
@pytest.mark.skipif(any(shutil.which(t) is None for t in ("pdflatex", "bibtex", "pdftotext", "pdfinfo")),
                    reason="no TeX: `make -C paper tex` (paper/install-tex.sh) installs it; `make test` does")
def test_pdf_builds_from_sample_with_every_reference_resolved(built, tmp_path):
    from paper import pdf

    out, _ = built
    paper = tmp_path / "paper"
    shutil.copytree(out, paper)
    made = pdf.build(paper)
    info = subprocess.run(["pdfinfo", str(made)], capture_output=True, text=True, check=True).stdout
    pages = int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))
    assert pages >= 8, f"{pages} pages"
    text = subprocess.run(["pdftotext", "-layout", str(made), "-"], capture_output=True, text=True,
                          check=True).stdout
    flat = re.sub(r"\s+", " ", text)
    for title in SECTIONS:
        assert title in flat, f"section {title!r} not in the PDF"
    assert "??" not in text, "unresolved reference in the PDF"
    assert "[?]" not in text, "unresolved citation in the PDF"
    assert "NOT GENERATED" not in text and "Not generated" not in flat and "[n/a]" not in flat
    # the bibliography holds what the text cites, e.g. the peers compared in the evaluation
    for cited in ("LMCache", "Mooncake", "HiCache", "KVBM", "vLLM", "DAOS", "Lustre", "ADIOS"):
        assert cited in flat.split("References")[-1], f"{cited} missing from the references"
    # a number quoted in the text is there with its range over repetitions
    numbers = (paper / "Generated" / "numbers.tex").read_text()
    quoted = re.search(r"\\newcommand\{\\SysCascadeGetGBps\}\{([0-9.]+) \(([0-9.]+)--([0-9.]+)\)", numbers)
    assert quoted and f"{quoted.group(1)} ({quoted.group(2)}" in flat


def test_pdf_build_reports_an_undefined_reference(built, tmp_path):
    if any(shutil.which(t) is None for t in ("pdflatex", "bibtex")):
        pytest.skip("no TeX: `make -C paper tex` installs it")
    from paper import pdf

    out, _ = built
    paper = tmp_path / "paper"
    shutil.copytree(out, paper)
    with open(paper / "Generated" / "numbers.tex", "a") as f:  # a cross-reference nobody defines
        f.write("\\AtBeginDocument{\\ref{sec:nowhere}}\n")
    with pytest.raises(pdf.PdfError, match="undefined"):
        pdf.build(paper)
