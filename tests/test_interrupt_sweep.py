"""A Ctrl-C at every third line the store runs during a put, a get, a batch get, a view
and a put that demotes: the KeyboardInterrupt is raised (never lost), and the store is left whole: no
reader, lease or in-flight count held, each tier's bytes those the index places there,
every block stored reads back byte-exact, and close() ends at once.

Before the store deferred a Ctrl-C out of its own code (:mod:`cascade.core.interrupts`),
this sweep found a count or room left held at 16 to 100 of the lines of each operation
(a hot put's room written but not yet indexed, a lease taken but not yet in its ``with``,
an in-flight count not yet given back in its ``finally``), and a batch get whose close()
then waited out its whole timeout."""
from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable

import numpy as np
import pytest

from cascade import CascadeStore, Config
from cascade.core import interrupts
from cascade.models import BlockSpec

pytestmark = pytest.mark.skipif(signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
                                reason="Python's own SIGINT handler is not installed here")


def _blocks(spec: BlockSpec, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for i in range(n):
        key, value = spec.empty()
        key[...], value[...] = i + 1, 101 + i
        out.append((key, value))
    return out


def _sigint_at_line(k: int) -> dict[str, int]:
    """Send SIGINT once, at the ``k``-th line run in the store's own code from now on."""
    seen = {"lines": 0}

    def local(frame, event, arg):
        if event == "line":
            seen["lines"] += 1
            if seen["lines"] == k:
                sys.settrace(None)
                signal.raise_signal(signal.SIGINT)
                return None
        return local

    def trace(frame, event, arg):
        return local(frame, event, arg) if frame.f_code.co_filename.startswith(interrupts.STORE_CODE) else None

    sys.settrace(trace)
    return seen


def _whole(store: CascadeStore, blocks, ids) -> list[str]:
    """What is wrong with the store after an interrupted operation (empty: nothing)."""
    wrong = []
    with store._lock:
        metas = list(store._meta.values())
        wrong += [f"{m.key[1]} still has {m.readers} reader(s)" for m in metas if m.readers]
        if len(store._inflight):
            wrong.append(f"{len(store._inflight)} operation(s) still in flight")
        for t, tier in enumerate(store.tiers):
            placed = sum(m.nbytes for m in metas if m.tier == t)
            if tier.used != placed:
                wrong.append(f"tier {tier.name} holds {tier.used} bytes, the index places {placed} there")
    for bid, (key, value) in zip(ids, blocks):
        got = store.get(bid)
        if got is not None and not (np.array_equal(got[0], key) and np.array_equal(got[1], value)):
            wrong.append(f"{bid} read back other bytes")
    return wrong


def _view(store: CascadeStore, bid: str) -> None:
    with store.view(bid) as block:
        assert block is not None


def _put_all(store, blocks, ids) -> None:
    for (key, value), bid in zip(blocks, ids):
        store.put(key, value, block_id=bid)


SCENARIOS: dict[str, tuple[int, int, bool, Callable]] = {
    # name: (block bytes, blocks, stored before, operation)
    "hot put 4 KiB": (4096, 3, False, _put_all),
    "put 1 MiB": (1 << 20, 2, False, _put_all),
    "get 1 MiB": (1 << 20, 2, True, lambda store, blocks, ids: store.get_into(ids[0], *store.spec.empty())),
    "batch get 1 MiB": (1 << 20, 2, True,
                        lambda store, blocks, ids: store.get_many_into(ids, [store.spec.empty() for _ in ids])),
    "demoting put 64 KiB": (64 << 10, 6, False, _put_all),
    "view 4 KiB": (4096, 2, True, lambda store, blocks, ids: _view(store, ids[0])),
}
STRIDE = 3  # every third line: each scenario in a few seconds, every step of it still hit


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_ctrl_c_at_any_line_is_raised_and_leaves_the_store_whole(tmp_path, name):
    nbytes, count, stored_before, operation = SCENARIOS[name]
    spec = BlockSpec.flat(nbytes)
    blocks, ids = _blocks(spec, count), [f"{i + 1:032x}" for i in range(count)]
    shm = 4 * 2 * nbytes if name.startswith("demoting") else 8 * 2 * nbytes
    cfg = Config(shm_bytes=shm, file_bytes=64 << 20, file_dir=str(tmp_path / "files"), shm_dir=str(tmp_path),
                 remote_bytes=0, demote_high=1.0, promote_on_hit=False)
    k, swept = 1, 0
    while True:
        with CascadeStore(cfg, block_spec=spec) as store:
            if stored_before:
                _put_all(store, blocks, ids)
            seen = _sigint_at_line(k)
            interrupted = False
            try:
                operation(store, blocks, ids)
                time.sleep(0.2)  # a Ctrl-C deferred out of the store's code lands here (at once)
            except KeyboardInterrupt:
                interrupted = True
            finally:
                sys.settrace(None)
            if seen["lines"] < k:  # the operation ran fewer lines: the sweep is over
                assert not interrupted
                break
            assert interrupted, f"{name}: the Ctrl-C at line {k} was lost"
            assert _whole(store, blocks, ids) == [], f"{name}: Ctrl-C at line {k}"
            started = time.monotonic()
        assert time.monotonic() - started < 5, f"{name}: close() after a Ctrl-C at line {k} waited"
        k, swept = k + STRIDE, swept + 1
    assert swept > 50, f"{name}: only {swept} lines swept"
