"""The background demoter: above ``demote_high`` of the fastest tier, a store thread
demotes down to ``demote_low``; puts that find room land without demoting themselves;
its failures are counted, never raised to a caller, and never stop the store."""
from __future__ import annotations

import errno
import threading

import numpy as np
import pytest

from cascade import CascadeStore, Config
from cascade.errors import ConfigError
from test_concurrency import BLOCK, RECORD, SPEC, bid, check_block, check_quiescent, config, put

SHM_BLOCKS = 20


def open_store(tmp_path, **kw) -> CascadeStore:
    cfg = config(tmp_path, **{"shm_bytes": SHM_BLOCKS * BLOCK, "demote_high": 0.8, "demote_low": 0.5, **kw})
    return CascadeStore(cfg, block_spec=SPEC, array_module=np)


def moves_by_thread(store: CascadeStore, monkeypatch) -> list[str]:
    """Record the thread of every demotion move the tier chain runs."""
    names: list[str] = []
    run_move = store._chain.run_move

    def recording(move, **kw):
        names.append(threading.current_thread().name)
        return run_move(move, **kw)

    monkeypatch.setattr(store._chain, "run_move", recording)
    return names


def demotions(store: CascadeStore) -> int:
    return store.stats()["tiers"]["shm"]["demotions"]


def test_puts_past_high_are_demoted_to_low_and_stay_readable(tmp_path):
    store = open_store(tmp_path)
    shm = store.tiers[0]
    ids = [put(store, n) for n in range(17)]  # 17/20 > 0.8
    store.flush()  # waits for the demoter to be idle
    assert shm.used <= 0.5 * shm.capacity
    counters = store.stats()
    assert counters["background_demotions"] == demotions(store) > 0
    assert counters["background_demotion_errors"] == 0
    below = [b for b in ids if store._meta[("default", b)].tier == 1]
    assert len(below) == counters["background_demotions"]
    for b in ids:  # the demoted ones from the file tier, byte-exact
        got = store.get(b)
        assert got is not None
        check_block(b, *got)
    store.close()


def test_a_put_with_room_does_not_demote_on_its_own_thread(tmp_path, monkeypatch):
    store = open_store(tmp_path)
    names = moves_by_thread(store, monkeypatch)
    for n in range(17):  # above high, never full: every put finds room
        put(store, n)
        assert threading.current_thread().name not in names
    store.flush()
    assert names and set(names) == {"cascade-demoter"}
    assert store.stats()["background_demotions"] == demotions(store) == len(names)
    store.close()


def test_a_full_tier_still_makes_room_on_the_put_thread(tmp_path, monkeypatch):
    store = open_store(tmp_path, demote_high=1.0)  # demoter off: the put itself must demote
    names = moves_by_thread(store, monkeypatch)
    ids = [put(store, n) for n in range(SHM_BLOCKS + 3)]
    assert names == [threading.current_thread().name] * 3
    assert store.stats()["background_demotions"] == 0
    for b in ids:
        check_block(b, *store.get(b))
    store.close()


def test_a_failing_background_demotion_is_counted_and_the_store_serves(tmp_path, monkeypatch):
    store = open_store(tmp_path)
    ids = [put(store, n) for n in range(16)]  # 16/20: not above high

    def broken_fill(*args, **kwargs):
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(store.tiers[1], "fill", broken_fill)
    ids.append(put(store, 16))  # 17/20 > 0.8: the demoter's move into the file tier fails
    store.flush()  # returns once the failed round ended
    ids.append(put(store, 17))  # paused: this commit above high starts no round
    store.flush()
    counters = store.stats()
    assert counters["background_demotion_errors"] == 1
    assert counters["background_demotions"] == 0
    monkeypatch.undo()
    for b in ids:  # nothing was lost: every block still in SHM, exact
        assert store._meta[("default", b)].tier == 0
        check_block(b, *store.get(b))
    ids += [put(store, n) for n in (18, 19)]  # the tier is full now: still paused
    store.flush()
    assert store.stats()["background_demotions"] == 0 and store.tiers[0].used == store.tiers[0].capacity
    ids.append(put(store, 20))  # makes room itself: its demotion succeeds, and the demoter resumes
    store.flush()
    assert store.stats()["background_demotions"] > 0
    assert store.tiers[0].used <= 0.5 * store.tiers[0].capacity
    for b in ids:
        check_block(b, *store.get(b))
    store.close(timeout=120.0)  # returns: CloseTimeout would name what is still held


def test_a_failed_background_demotion_leaves_the_policy_clock_as_it_was(tmp_path, monkeypatch):
    """GreedyDual's clock rises to the score of a block evicted: the demoter's victim
    whose copy down failed stayed in SHM, so the clock must not have risen to it."""
    store = open_store(tmp_path)
    ids = [put(store, n) for n in range(16)]
    for b in ids:
        store.get(b)  # worth more than the next block: that one is the victim

    def broken_fill(*args, **kwargs):
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(store.tiers[1], "fill", broken_fill)
    ids.append(put(store, 16))  # 17/20 > 0.8: the demoter's move of its victim fails
    store.flush()
    assert store.stats()["background_demotion_errors"] == 1 and demotions(store) == 0
    assert all(store._meta[("default", b)].tier == 0 for b in ids)
    assert not store.policy._chosen  # the victim stayed: no score is kept for it (Policy.kept)
    monkeypatch.undo()
    newer = put(store, 17)  # paused: nothing moves; a new block reads the clock
    assert store._meta[("default", newer)].base == 0.0
    store.close()


def test_a_tier_below_that_fails_is_passed_over_for_the_next_one_down(tmp_path, monkeypatch):
    """Three tiers (GPU over host memory, SHM, file) and every copy into SHM failing, as
    moves into the REMOTE tier fail when every lending rank is full while this rank's
    accounting still shows room: the demoter's blocks go on to the file tier, with no
    error counted and no pause, and every block reads back exact."""
    store = open_store(tmp_path, gpu_bytes=SHM_BLOCKS * BLOCK, shm_bytes=4 * BLOCK)
    gpu, shm = store.tiers[0], store.tiers[1]
    assert [t.name for t in store.tiers] == ["gpu", "shm", "file"]

    def no_room(*args, **kwargs):
        raise OSError(errno.ENOSPC, "injected: no room")

    monkeypatch.setattr(shm, "fill", no_room)
    ids = [put(store, n) for n in range(17)]  # 17/20 > 0.8
    store.flush()
    stats = store.stats()
    assert stats["background_demotion_errors"] == 0 and stats["tiers"]["shm"]["full_events"] >= 1
    assert gpu.used <= 0.5 * gpu.capacity and shm.used == 0
    tiers = [store._meta[("default", b)].tier for b in ids]
    assert tiers.count(2) == stats["background_demotions"] == len(ids) - tiers.count(0) > 0
    ids += [put(store, n) for n in range(17, 30)]  # not paused: later rounds keep the GPU tier below high
    store.flush()
    assert store.stats()["background_demotion_errors"] == 0 and gpu.used <= 0.8 * gpu.capacity
    monkeypatch.undo()
    for b in ids:
        check_block(b, *store.get(b))
    store.close(timeout=120.0)


def test_a_full_lower_tier_costs_the_oldest_blocks_not_the_newest(tmp_path, monkeypatch):
    """The slower tier's disk is full (every copy into it fails with ENOSPC): each failed
    background demotion leaves its block in place and in its place in the eviction order,
    and pauses the demoter, so the puts that then make room themselves drop the oldest
    blocks, never the newest (a failed move used to rank its block as just used: the
    untried newest went first; a retried one was leased, and the puts passed it over)."""
    store = open_store(tmp_path)

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.tiers[1], "fill", disk_full)
    ids = []
    for n in range(2 * SHM_BLOCKS):
        ids.append(put(store, n))
        store.flush()  # this put's round (above high: a failed move) ended before the next put
    counters = store.stats()
    assert counters["background_demotion_errors"] == 1 and counters["background_demotions"] == 0  # paused
    assert counters["rejected"] == 0
    assert [b for b in ids[:SHM_BLOCKS] if store.contains(b)] == []  # the oldest went
    for b in ids[SHM_BLOCKS:]:  # every one of the newest is still in SHM, exact
        assert store._meta[("default", b)].tier == 0
        check_block(b, *store.get(b))
    store.close(timeout=120.0)


def test_a_demoter_bug_is_counted_and_close_returns(tmp_path, monkeypatch):
    store = open_store(tmp_path)

    def bug(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(store._chain, "start_demotion", bug)
    ids = [put(store, n) for n in range(17)]
    store.flush()
    assert store.stats()["background_demotion_errors"] >= 1
    monkeypatch.undo()
    for b in ids:
        check_block(b, *store.get(b))
    store.close(timeout=120.0)
    assert not store._demoter._thread.is_alive()


def test_one_tier_starts_no_demoter(tmp_path):
    store = open_store(tmp_path, file_bytes=0)
    for n in range(SHM_BLOCKS):
        put(store, n)
    store.flush()
    assert store._demoter._thread is None
    assert len(store) == SHM_BLOCKS  # nothing dropped early
    store.close()


@pytest.mark.parametrize("high, low", [(0.5, 0.8), (1.5, 0.5), (0.9, -0.1), (float("nan"), 0.5)])
def test_bad_watermarks_are_refused(tmp_path, high, low):
    with pytest.raises(ConfigError, match="demote_low"):
        Config(model="tiny", demote_high=high, demote_low=low)


def test_threads_putting_and_reading_while_the_demoter_runs(tmp_path):
    store = open_store(tmp_path, file_bytes=200 * RECORD)
    errors: list[BaseException] = []

    def worker(first: int) -> None:
        try:
            for n in range(first, first + 30):
                b = put(store, n)
                check_block(b, *store.get(b))
        except BaseException as exc:  # raised in the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(100 * w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120.0)
    assert not errors, errors
    store.flush()
    check_quiescent(store)
    assert store.stats()["background_demotions"] > 0
    assert store.stats()["background_demotion_errors"] == 0
    for w in range(4):
        for n in range(100 * w, 100 * w + 30):
            got = store.get(bid(n))
            assert got is not None
            check_block(bid(n), *got)
    store.close(timeout=120.0)


def test_close_while_demoting_stops_the_thread(tmp_path):
    store = open_store(tmp_path)
    ids = [put(store, n) for n in range(SHM_BLOCKS)]  # the last puts poke the demoter; no flush
    store.close(timeout=120.0)
    assert not store._demoter._thread.is_alive()
    with CascadeStore(config(tmp_path), block_spec=SPEC, array_module=np) as again:  # close kept them all
        for b in ids:
            check_block(b, *again.get(b))


def test_a_block_hinted_while_the_demoter_copies_it_stays_in_the_fastest_tier(tmp_path, monkeypatch):
    """A hint that arrives after a background demotion began (its copy under way) keeps
    the block where it is: the move is abandoned, not committed."""
    store = open_store(tmp_path)
    run_move, moving, entered, go = store._chain.run_move, [], threading.Event(), threading.Event()

    def paused(move, **kw):
        if threading.current_thread().name == "cascade-demoter" and not moving:
            moving.append(move.meta.key[1])
            entered.set()
            go.wait(10)
        return run_move(move, **kw)

    monkeypatch.setattr(store._chain, "run_move", paused)
    ids = [put(store, n) for n in range(17)]  # above 0.8 of 20: the demoter starts
    assert entered.wait(10)
    [victim] = moving
    assert store.hint([victim]) == 1
    go.set()
    store.flush()
    assert store._meta[("default", victim)].tier == 0  # still in SHM, not demoted
    got = store.get(victim)
    assert got is not None
    check_block(victim, *got)
    assert store.stats()["background_demotion_errors"] == 0
    assert victim in ids
    store.close()
