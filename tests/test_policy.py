"""The policy's hint rules: hinted blocks go last, the one needed last first (Belady within
the queue), without breaking pins, reads in progress or leaf-first."""
from __future__ import annotations

import pytest

from cascade import CascadeStore, Config
from cascade.errors import ConfigError
from cascade.models import BlockSpec
from cascade.policy import BlockMeta, Policy


def _blocks(policy: Policy, n: int, *, parent_of=None) -> list[BlockMeta]:
    """``n`` blocks admitted to tier 0 in order (block 0 least recently used)."""
    metas = []
    for i in range(n):
        meta = BlockMeta(("ns", f"b{i}"), 4096, 0)
        metas.append(meta)
        policy.admitted(meta, now=float(i))
    return metas


def _hint(policy: Policy, meta: BlockMeta, position: float | None = None) -> float:
    at = policy.hint_position(position)
    meta.hints += 1
    policy.hinted(meta, at)
    return at


def _drain(policy: Policy) -> list[str]:
    """Victim order of tier 0 until nothing may go (each victim removed as the store would)."""
    order = []
    while (meta := policy.victim(0)) is not None:
        order.append(meta.key[1])
        policy.removed(meta)
    return order


@pytest.mark.parametrize("kind", ["semantic", "lru"])
def test_unhinted_blocks_go_first_then_the_hint_needed_last(kind):
    policy = Policy(1, kind)
    b = _blocks(policy, 6)
    for meta, position in ((b[0], 30), (b[1], 10), (b[2], 20)):
        _hint(policy, meta, position)
    # b3..b5 unhinted (oldest first), then hinted ones by next use, furthest first
    assert _drain(policy) == ["b3", "b4", "b5", "b0", "b2", "b1"]


def test_within_one_position_the_deeper_block_goes_first():
    policy = Policy(1)
    b = _blocks(policy, 3)
    for depth, meta in enumerate(b):
        meta.depth = depth
        _hint(policy, meta, 5)
    assert _drain(policy) == ["b2", "b1", "b0"]  # the request reads b0 first, b2 last


def test_positions_default_to_call_order_and_a_read_uses_the_soonest_hint():
    policy = Policy(1)
    b = _blocks(policy, 3)
    first, second = _hint(policy, b[0]), _hint(policy, b[1])
    assert second > first
    _hint(policy, b[0], second + 5)  # b0 is wanted by a later request too
    assert policy.victim(0) is b[2]  # unhinted first
    policy.removed(b[2])
    assert policy.victim(0) is b[1]  # b0's next use (first) comes before b1's (second)
    b[0].hints -= 1
    policy.hint_released(b[0])  # the read at `first` came: b0 is next wanted at second + 5
    assert _drain(policy) == ["b0", "b1"]


def test_hint_release_follows_the_soonest_or_the_given_position():
    policy = Policy(1)
    b = _blocks(policy, 2)
    _hint(policy, b[0], 1)
    _hint(policy, b[0], 50)
    _hint(policy, b[1], 10)
    assert policy.victim(0) is b[1]  # b1 next at 10, b0 next at 1
    b[0].hints -= 1
    policy.hint_released(b[0])  # the read of position 1 came: b0 is next wanted at 50
    assert policy.victim(0) is b[0]
    b[0].hints -= 1
    policy.hint_released(b[0], 50)  # withdrawn by position: b0 unhinted now
    assert b[0].hint_uses == [] and _drain(policy) == ["b0", "b1"]


def test_pins_reads_and_children_still_hold_hinted_blocks():
    policy = Policy(2)
    head, tail, pinned, read = _blocks(policy, 4)
    head.child_tiers = [1, 0]  # tail is head's cached child in tier 0
    pinned.pins = 1
    read.readers = 1
    for meta, position in ((head, 100), (tail, 1), (pinned, 200), (read, 300)):
        _hint(policy, meta, position)
    assert policy.victim(0) is tail  # head is needed later but must outlive its tail
    policy.removed(tail)
    head.child_tiers[0] = 0
    policy.changed(head)
    assert _drain(policy) == ["b0"]  # the pinned block and the one being read never go


def test_the_clock_rises_when_a_victim_leaves_not_when_it_is_chosen():
    policy = Policy(2)
    b = _blocks(policy, 3)
    policy.touched(b[1], now=5.0)  # value 2: b0 and b2 (value 1) go first
    assert policy.victim(0) is b[0]
    policy.set_aside(b[0])  # another rank keeps it
    assert policy.victim(0) is b[2] and policy._clock == 0.0  # chosen, kept: its copy down failed
    b[2].tier = 1
    policy.moved(b[2], 0)  # demoted now: GreedyDual's clock rises to its score
    assert policy._clock == 1.0
    policy.changed(b[0])
    assert policy.victim(0) is b[0]
    b[0].tier = 1
    policy.moved(b[0], 0)
    assert policy.victim(1) is b[0]
    b[0].tier = 0
    policy.moved(b[0], 1)  # promoted instead: no eviction
    assert policy._clock == 1.0
    policy.touched(b[2], now=6.0)  # score 1 + 2 now
    assert policy.victim(1) is b[2]
    policy.evicted(b[2])  # dropped for room
    policy.removed(b[2])
    assert policy._clock == 3.0


def test_a_victim_that_stays_does_not_raise_the_clock_when_it_leaves_unchosen_later():
    """A victim whose move down failed stays (``kept``): its score then is forgotten, so a
    later departure that no victim() chose (a namespace share's own victim) leaves the
    clock where it was."""
    policy = Policy(2)
    b = _blocks(policy, 2)
    policy.touched(b[1], now=5.0)
    assert policy.victim(0) is b[0]  # score 1
    policy.kept(b[0])  # its copy down failed
    b[0].tier = 1
    policy.moved(b[0], 0)  # demoted later, chosen by no victim() call
    assert policy._clock == 0.0
    assert policy.victim(0) is b[1]
    b[1].tier = 1
    policy.moved(b[1], 0)  # a chosen victim still raises it
    assert policy._clock == 2.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "3", True])
def test_a_bad_position_is_refused_before_anything_changes(tmp_path, bad):
    cfg = Config(shm_bytes=4 * 4096, file_bytes=0, file_dir=str(tmp_path / "f"))
    with CascadeStore(cfg, block_spec=BlockSpec.flat(4096)) as store:
        bid = store.put(*store.spec.empty(), block_id="a" * 32)
        with pytest.raises(ConfigError):
            store.hint([bid], position=bad)
        assert store.stats()["hinted_bytes"] == 0 and store.unhint([bid]) == 0


def test_a_put_into_a_tier_of_hinted_blocks_evicts_the_one_needed_last(tmp_path):
    cfg = Config(shm_bytes=3 * 4096, file_bytes=0, file_dir=str(tmp_path / "f"))
    with CascadeStore(cfg, block_spec=BlockSpec.flat(4096)) as store:
        k, v = store.spec.empty()
        ids = [store.put(k, v, block_id=f"{i:032x}") for i in range(3)]
        for bid, position in zip(ids, (7, 9, 8)):
            assert store.hint([bid], position=position) == 1
        store.put(k, v, block_id="f" * 32)  # every block hinted: no TierFull, the latest use goes
        assert store.contains_many(ids) == [True, False, True]
        assert store.stats()["hinted_bytes"] == 2 * 4096


def _admit_one(policies: list[Policy], metas: list[list[BlockMeta]], live: list[int], tier: int, now: float,
               hits: int = 0) -> None:
    """A random run's step: one new block admitted to ``tier`` of every policy."""
    for p, ms in zip(policies, metas):
        ms.append(BlockMeta(("ns", f"b{len(ms)}"), 4096, tier, hits=hits))
        p.admitted(ms[-1], now)
    live.append(len(metas[0]) - 1)


def _delete_one(rng, policies: list[Policy], metas: list[list[BlockMeta]], live: list[int]) -> None:
    """A random run's step: one live block deleted (not for room) from every policy."""
    i = rng.choice(live)
    for p, ms in zip(policies, metas):
        p.removed(ms[i])
    live.remove(i)


def _take_victims(rng, policies: list[Policy], victims: tuple[list, ...], live: list[int]) -> int:
    """A random run's step: each policy's victim of a random tier, set aside (another
    rank keeps it) or evicted, appended to its list in ``victims``; the tier."""
    tier, keep = rng.randrange(2), rng.random() < 0.2
    for p, out in zip(policies, victims):
        meta = p.victim(tier)
        out.append(None if meta is None else meta.key[1])
        if meta is not None and keep:
            p.set_aside(meta)
        elif meta is not None:
            p.evicted(meta)
            p.removed(meta)
    if victims[0][-1] is not None and not keep:
        live.remove(int(victims[0][-1][1:]))
    return tier


class _EagerAdmission(Policy):
    """A policy that gives each admitted block its heap entry at once."""

    def admitted(self, meta: BlockMeta, now: float) -> None:
        super().admitted(meta, now)
        self._push_fresh(meta.tier)


@pytest.mark.parametrize("kind", ["semantic", "lru"])
@pytest.mark.parametrize("seed", range(4))
def test_deferred_admission_keeps_the_victim_order_of_pushing_at_once(kind, seed):
    """The same random run of admits, hits, pins, priority changes, moves, deletes,
    set-asides and evictions on a policy that defers each admitted block's heap entry to the next victim
    and on one that pushes it at once: the same victims in the same order."""
    import random

    rng = random.Random(seed)
    policies = [Policy(2, kind), _EagerAdmission(2, kind)]
    metas: list[list[BlockMeta]] = [[], []]
    live: list[int] = []
    victims: tuple[list, list] = ([], [])
    now = 0.0
    for step in range(3000):
        now += 1.0
        op = rng.random()
        if op < 0.3 or len(live) < 4:
            tier, hits = rng.randrange(2), rng.randrange(3)
            _admit_one(policies, metas, live, tier, now, hits=hits)
        elif op < 0.6:  # hits
            i = rng.choice(live)
            for p, ms in zip(policies, metas):
                p.touched(ms[i], now)
        elif op < 0.7:  # a pin or unpin, or a new priority
            i, pin = rng.choice(live), rng.random() < 0.5
            delta = 1 if metas[0][i].pins == 0 else -1
            for p, ms in zip(policies, metas):
                if pin:
                    ms[i].pins += delta
                else:
                    ms[i].priority = rng.choice([-1, 0, 2]) if p is policies[0] else metas[0][i].priority
                p.changed(ms[i])
        elif op < 0.75:  # a move to the other tier
            i = rng.choice(live)
            for p, ms in zip(policies, metas):
                old, ms[i].tier = ms[i].tier, 1 - ms[i].tier
                p.moved(ms[i], old)
        elif op < 0.8:
            _delete_one(rng, policies, metas, live)
        else:
            _take_victims(rng, policies, victims, live)
        assert victims[0] == victims[1], f"step {step}"
    assert sum(v is not None for v in victims[0]) > 300


class _PushEveryRead(Policy):
    """A policy that pushes a block again at the end of every read (as before read_done)."""

    def read_done(self, meta: BlockMeta) -> None:
        self._push(meta)


@pytest.mark.parametrize("kind", ["semantic", "lru"])
@pytest.mark.parametrize("seed", range(4))
def test_a_read_pushes_a_block_again_only_when_skipped_and_keeps_the_victim_order(kind, seed):
    """The same random run of admits, hits, reads begun and ended, pins, deletes,
    set-asides and evictions on a policy that pushes a block at the end of a read only
    when a victim search skipped it meanwhile (or it was set aside) and on one that
    pushes it at the end of every read: the same victims in the same order, and no block
    that may go is ever passed over."""
    import random

    rng = random.Random(seed)
    policies = [Policy(2, kind), _PushEveryRead(2, kind)]
    metas: list[list[BlockMeta]] = [[], []]
    live: list[int] = []
    victims: tuple[list, list] = ([], [])
    now = 0.0
    for step in range(3000):
        now += 1.0
        op = rng.random()
        if op < 0.25 or len(live) < 4:
            _admit_one(policies, metas, live, rng.randrange(2), now)
        elif op < 0.45:  # hits
            i = rng.choice(live)
            for p, ms in zip(policies, metas):
                p.touched(ms[i], now)
        elif op < 0.55:  # a read begins
            i = rng.choice(live)
            for ms in metas:
                ms[i].readers += 1
        elif op < 0.65:  # a read ends
            reading = [i for i in live if metas[0][i].readers]
            if reading:
                i = rng.choice(reading)
                for p, ms in zip(policies, metas):
                    ms[i].readers -= 1
                    p.read_done(ms[i])
        elif op < 0.7:  # a pin or unpin
            i = rng.choice(live)
            delta = 1 if metas[0][i].pins == 0 else -1
            for p, ms in zip(policies, metas):
                ms[i].pins += delta
                p.changed(ms[i])
        elif op < 0.75:
            _delete_one(rng, policies, metas, live)
        else:
            tier = _take_victims(rng, policies, victims, live)
            if victims[0][-1] is None:  # none may go: every block of the tier is pinned, read or set aside
                held = [metas[0][i] for i in live if metas[0][i].tier == tier]
                assert all(m.pins or m.readers or m.unlisted for m in held), f"step {step}"
        assert victims[0] == victims[1], f"step {step}"
    assert sum(v is not None for v in victims[0]) > 300
