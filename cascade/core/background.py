"""One daemon thread of a store's own that runs rounds of background work asked for
under the store's lock: the base of the demoter (:mod:`.demoter`) and the housekeeper
(:mod:`.housekeeper`).

A subclass asks for a round with :meth:`BackgroundWorker._ask` (under its ``_state``)
and does the work in :meth:`BackgroundWorker._round`. The thread starts at the first
round asked for; a round that raises is logged (and passed to ``_failed``), never
reaches a caller, and the thread lives on. ``wait_idle()`` (``flush()``) waits for the
rounds asked for before it; ``stop()`` (``close()``) sets ``_stop``, which a round checks
between its steps, and joins the thread, a bounded wait. Thread-safe.
"""
from __future__ import annotations

import logging
import threading

from ..errors import StoreClosed

log = logging.getLogger(__name__)

JOIN_S = 5.0  # stop(): most seconds to wait for the thread once its round saw the stop


class BackgroundWorker:
    """Rounds of ``what`` (e.g. "demotion", for the log) on a thread named ``name``."""

    def __init__(self, name: str, what: str) -> None:
        self._name, self._what = name, what
        self._state = threading.Condition(threading.Lock())  # guards _asked, _done, _thread and a subclass's requests
        self._asked = self._done = 0  # rounds asked for, and asked for before the last one ended
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _ask(self) -> None:
        """Under ``_state``: one more round (none once stopped); the thread starts at
        the first (recorded once started: stop() cannot join one that never started)."""
        if self._stop.is_set():
            return
        self._asked += 1
        if self._thread is None:
            thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            thread.start()
            self._thread = thread
        self._state.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait (not holding the store's lock) until every round asked for before this
        call has ended; False when ``timeout`` seconds passed first."""
        with self._state:
            asked = self._asked
            return self._state.wait_for(lambda: self._stop.is_set() or self._done >= asked, timeout)

    def stop(self) -> None:
        """Stop the thread once its round sees the stop (``close()``; not holding the
        store's lock): a bounded wait."""
        with self._state:
            self._stop.set()
            self._state.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_S)
            if thread.is_alive():
                log.warning("close: the background %s did not stop within %.0f s", self._what, JOIN_S)

    def _run(self) -> None:
        while True:
            with self._state:
                self._state.wait_for(lambda: self._done < self._asked or self._stop.is_set())
                if self._stop.is_set():
                    self._state.notify_all()
                    return
                asked = self._asked
            try:
                self._round()
            except StoreClosed:
                pass
            except BaseException:  # never lost, never fatal (the thread lives on): the next round tries again
                log.exception("background %s failed", self._what)
                self._failed()
            finally:
                with self._state:
                    self._done = asked
                    self._state.notify_all()

    def _round(self) -> None:
        """One round of the work (on the thread, not holding the store's lock)."""
        raise NotImplementedError

    def _failed(self) -> None:
        """After a round that raised (logged already): count it, if the subclass does."""
