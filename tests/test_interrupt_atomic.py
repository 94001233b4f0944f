"""A Ctrl-C that lands inside a move's commit (a tier changed, the index not yet) is
raised when the step ends: the index and the tiers still agree, so every block stays
readable (before, a demotion cut between freeing the SHM copy and repointing the index
left a block the index placed in SHM that SHM no longer held: ``BlockNotFound``)."""
from __future__ import annotations

import asyncio
import signal
import sys
import threading

import numpy as np
import pytest

from cascade import CascadeStore, Config
from cascade.core import interrupts
from cascade.core.index import BlockIndex


def _block(spec, i: int):
    key, value = spec.empty()
    key[...], value[...] = i, -i
    return key, value


def _sigint_on_entry(code) -> None:
    """Send SIGINT to this process once, when ``code`` is first called (its handler then
    runs inside that call)."""
    def trace(frame, event, arg):
        if event == "call" and frame.f_code is code:
            sys.settrace(None)
            signal.raise_signal(signal.SIGINT)
        return None
    sys.settrace(trace)


def test_ctrl_c_inside_a_demotions_commit_leaves_index_and_tiers_agreeing(tmp_path):
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("Python's own SIGINT handler is not installed here")
    cfg = Config(model="tiny", shm_bytes=8 * 4096, file_bytes=4 << 20, file_dir=str(tmp_path / "files"),
                 shm_dir=str(tmp_path), demote_high=1.0)  # the put demotes (Ctrl-C reaches the main thread only)
    with CascadeStore(cfg) as store:
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # the store's, while open
        blocks = [_block(store.spec, i) for i in range(40)]
        ids = [store.put(*b) for b in blocks[:8]]  # the SHM tier is full
        _sigint_on_entry(BlockIndex.moved.__code__)  # after the SHM copy went, before the index follows
        with pytest.raises(KeyboardInterrupt):
            for b in blocks[8:]:  # a put demotes to make room
                ids.append(store.put(*b))
        sys.settrace(None)
        for i, bid in enumerate(ids):
            got = store.get(bid)
            assert got is not None, i
            assert np.array_equal(got[0], blocks[i][0]) and np.array_equal(got[1], blocks[i][1]), i
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back at close


def test_atomic_raises_a_ctrl_c_that_came_inside_it_at_its_end():
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("Python's own SIGINT handler is not installed here")
    done = []
    interrupts.held()
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupts.atomic():
                signal.raise_signal(signal.SIGINT)
                for step in range(3):  # many eval-loop checks: the interrupt waits anyway
                    done.append(step)
        assert done == [0, 1, 2]
        with pytest.raises(KeyboardInterrupt):  # outside a step: raised at once, as Python's own handler does
            signal.raise_signal(signal.SIGINT)
            done.append("not reached")
        assert done == [0, 1, 2]
    finally:
        interrupts.released()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class _AppInterrupt(Exception):
    """What an application's own SIGINT handler raises."""


def test_an_applications_handler_is_held_out_of_a_step_and_put_back_at_close(tmp_path):
    """The store's handler stands in front of the application's: its Ctrl-C inside a
    demotion's commit comes at the step's end, so the index and tiers still agree."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("Python's own SIGINT handler is not installed here")
    calls = []

    def app_handler(signum, frame):
        calls.append(signum)
        raise _AppInterrupt

    signal.signal(signal.SIGINT, app_handler)
    try:
        cfg = Config(model="tiny", shm_bytes=8 * 4096, file_bytes=4 << 20, file_dir=str(tmp_path / "files"),
                     shm_dir=str(tmp_path), demote_high=1.0)
        with CascadeStore(cfg) as store:
            assert signal.getsignal(signal.SIGINT) is not app_handler
            blocks = [_block(store.spec, i) for i in range(40)]
            ids = [store.put(*b) for b in blocks[:8]]
            _sigint_on_entry(BlockIndex.moved.__code__)
            with pytest.raises(_AppInterrupt):
                for b in blocks[8:]:
                    ids.append(store.put(*b))
            sys.settrace(None)
            assert calls == [signal.SIGINT]
            for i, bid in enumerate(ids):
                got = store.get(bid)
                assert got is not None, i
                assert np.array_equal(got[0], blocks[i][0]) and np.array_equal(got[1], blocks[i][1]), i
        assert signal.getsignal(signal.SIGINT) is app_handler  # given back at close
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_store_opened_inside_asyncio_run_keeps_its_ctrl_c_cancelling_the_main_task(tmp_path):
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("Python's own SIGINT handler is not installed here")
    seen = []

    async def serve() -> None:
        with CascadeStore(Config(model="tiny", shm_bytes=1 << 20, file_bytes=0, shm_dir=str(tmp_path))) as store:
            key, value = _block(store.spec, 1)
            bid = store.put(key, value)
            threading.Timer(0.2, signal.raise_signal, (signal.SIGINT,)).start()
            try:
                while True:  # an engine's loop: store calls between awaits
                    assert store.get(bid) is not None
                    await asyncio.sleep(0.001)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

    with pytest.raises(KeyboardInterrupt):  # asyncio.run's own: after the main task was cancelled
        asyncio.run(serve())
    assert seen == ["cancelled"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
