"""The small_blocks benchmark workload runs end to end at a tiny size and reports every
figure its targets need (its numbers belong to results JSON, not to this test)."""
from __future__ import annotations

import pytest

from benchmark.workloads import small_blocks


def test_small_blocks_reports_costs_and_ratios(tmp_path):
    result = small_blocks.run({"sizes": [4096, 65536], "rounds": 2, "blocks": 32, "file_dir": str(tmp_path)})
    assert [r["size"] for r in result["rows"]] == [4096, 65536]
    for row in result["rows"]:
        assert row["wrong"] == 0  # every read pass compared with its source
        for figure in ("dict_get_us", "dict_put_us", "get_loop_us", "get_batch_us", "put_loop_us", "put_batch_us", "view_us",
                       "cold_get_loop_us", "cold_get_batch_us"):
            assert row[figure] > 0, figure
        assert row["get_vs_dict"] > 0 and row["cold_get_batch_vs_loop"] > 0
        assert set(row["targets"]) == {"get_vs_dict_le_3", "put_vs_dict_le_3", "batch_never_slower"}
        assert [p["chunks"] for p in row["samples"]] == [1.0, 1.0]  # 32 blocks: one chunk of 64 (a whole pass)
    assert result["rows"][1]["targets"]["get_vs_dict_le_3"] is None  # the 3x targets are set at 4 KiB only
    assert "4 KiB" in small_blocks.table(result)


def test_views_are_timed_over_enough_passes(tmp_path, monkeypatch):
    """A size with few blocks times its views over several passes (VIEWS_TIMED views at
    least), not one pass of a handful: each round takes one untimed pass, then the timed ones."""
    from cascade import CascadeStore

    views = []
    real_view = CascadeStore.view
    monkeypatch.setattr(CascadeStore, "view", lambda self, *a, **k: views.append(1) or real_view(self, *a, **k))
    monkeypatch.setattr(small_blocks, "VIEWS_TIMED", 128)
    small_blocks.run({"sizes": [4096], "rounds": 2, "blocks": 16, "file_dir": str(tmp_path)})
    assert len(views) == 2 * (1 + 128 // 16) * 16


def test_interleaved_forms_take_turns_going_first_over_every_chunk(monkeypatch):
    """Every form runs over every chunk, in order, the form that goes first rotating from
    chunk to chunk and round to round; ``before`` and ``after`` wrap each timed pass."""
    monkeypatch.setattr(small_blocks, "CHUNKS", 4)
    calls = []
    forms = {name: (lambda part, name=name: calls.append((name, part.start))) for name in ("a", "b", "c")}
    hooks = []
    result = small_blocks._interleaved_us(forms, 4 * small_blocks.BATCH, 1,
                                          before=lambda name, part: hooks.append(("before", name)),
                                          after=lambda name, part: hooks.append(("after", name)))
    assert set(result) == {"a", "b", "c"} and all(us >= 0 for us in result.values())
    firsts = [calls[i][0] for i in range(0, len(calls), 3)]
    assert firsts == ["b", "c", "a", "b"]  # round 1: chunk i starts with form (i + 1) % 3
    assert sorted(calls) == sorted((n, c * small_blocks.BATCH) for n in "abc" for c in range(4))
    assert hooks[:2] == [("before", "b"), ("after", "b")] and len(hooks) == 2 * len(calls)


def test_hot_reads_of_few_blocks_are_timed_over_as_many_chunk_passes_as_many_blocks_get(monkeypatch):
    """Blocks that make fewer than CHUNKS chunks (2 and 16 MiB: one) have their hot reads
    gone over again until each form is timed over CHUNKS chunk passes, the form going
    first still rotating; the microseconds are per block read."""
    monkeypatch.setattr(small_blocks, "CHUNKS", 4)
    assert small_blocks._read_repeats(small_blocks.BATCH) == 4  # one chunk
    assert small_blocks._read_repeats(2 * small_blocks.BATCH) == 2
    assert small_blocks._read_repeats(4 * small_blocks.BATCH) == 1
    assert small_blocks._read_repeats(64 * small_blocks.BATCH) == 1
    calls = []
    forms = {name: (lambda part, name=name: calls.append((name, part.start))) for name in ("a", "b")}
    result = small_blocks._interleaved_us(forms, small_blocks.BATCH, 0, repeat=4)
    assert sorted(calls) == sorted([("a", 0)] * 4 + [("b", 0)] * 4)
    assert [calls[i][0] for i in range(0, len(calls), 2)] == ["a", "b", "a", "b"]
    assert set(result) == {"a", "b"}


def test_small_blocks_times_hot_reads_of_one_chunk_sixteen_times(tmp_path):
    """A size whose blocks make one chunk records how often its hot reads went over them."""
    result = small_blocks.run({"sizes": [4096], "rounds": 1, "blocks": 16, "file_dir": str(tmp_path)})
    assert [p["hot_read_repeats"] for p in result["rows"][0]["samples"]] == [float(small_blocks.CHUNKS)]
    assert result["rows"][0]["wrong"] == 0


def test_timed_passes_run_with_the_heap_frozen_and_unfreeze_after(monkeypatch):
    """Every timed pass runs with the objects alive before the passes frozen (its
    gc.collect() walks only what the passes made, not torch's modules); the heap is
    unfrozen once they end, even when a pass raises."""
    import gc

    frozen = []
    small_blocks._interleaved_us({"a": lambda part: frozen.append(gc.get_freeze_count())}, 64, 0)
    assert frozen and all(count > 1000 for count in frozen)
    assert gc.get_freeze_count() == 0

    def fails(part: slice) -> None:
        raise RuntimeError("a pass that fails")

    with pytest.raises(RuntimeError, match="a pass that fails"):
        small_blocks._interleaved_us({"a": fails}, 64, 0)
    assert gc.get_freeze_count() == 0
