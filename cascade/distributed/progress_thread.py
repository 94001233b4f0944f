"""A thread that enters MPI every so often, so that RMA needing this rank's progress
completes while its main thread computes.

Between nodes MPICH (the PyPI wheel: ch4 ucx/ofi) runs ``Compare_and_swap`` and
``Fetch_and_op`` as active messages that the *target* rank serves only when it enters MPI
(:mod:`.progress_check`): directory inserts, pins and releases on a shard whose owner
computes in Python wait for it. :class:`ProgressThread` enters MPI (one ``Iprobe`` that
matches nothing of Cascade's) every ``interval`` seconds. Under the GIL it runs only when
the main thread lets go of it, at the latest after ``sys.getswitchinterval()`` (5 ms by
default) of pure-Python work, which bounds how long an atomic waits for a busy target;
``switch_interval=`` lowers that bound for the whole process while the thread runs.
Measured in benchmark/workloads/cross_node.py (``busy_owner_atomics*`` rows). Needs
``MPI_THREAD_MULTIPLE`` (mpi4py's default). Local; start and stop are thread-safe.
"""
from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING

from .rma import load_mpi

if TYPE_CHECKING:
    from mpi4py import MPI

_TAG = 0x7CA5  # no Cascade message uses it; Iprobe only peeks anyway

_switch_lock = threading.Lock()
_switch_asked: list[float] = []  # the switch intervals of the running threads that set one
_switch_before: float | None = None  # the process's interval before the first of them


def _ask_switch(interval: float) -> None:
    """One more running thread wants ``interval``: the process runs at the smallest asked."""
    global _switch_before
    with _switch_lock:
        if not _switch_asked:
            _switch_before = sys.getswitchinterval()
        _switch_asked.append(interval)
        sys.setswitchinterval(min(_switch_asked))


def _drop_switch(interval: float) -> None:
    """A thread that asked for ``interval`` stopped: the smallest still asked, or, after
    the last, the interval from before the first."""
    with _switch_lock:
        _switch_asked.remove(interval)
        sys.setswitchinterval(min(_switch_asked) if _switch_asked else _switch_before)


class ProgressThread:
    """Drive this rank's MPI progress from a daemon thread until :meth:`stop` (or the
    ``with`` block ends). ``interval``: seconds between visits to MPI (sleeping, GIL
    released, in between). ``switch_interval``: if given, ``sys.setswitchinterval`` for
    the thread's lifetime (several such threads: the smallest of theirs; after the last
    one stops, the interval from before the first started)."""

    def __init__(self, comm: MPI.Comm, interval: float = 1e-3, *, switch_interval: float | None = None) -> None:
        MPI = load_mpi()
        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise RuntimeError("ProgressThread needs MPI initialised with MPI_THREAD_MULTIPLE "
                               "(mpi4py's default; check mpi4py.rc.thread_level)")
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, not {interval!r}")
        self._comm = comm
        self._interval = interval
        self._switch = switch_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.visits = 0

    def start(self) -> ProgressThread:
        with self._lock:
            if self._thread is None:
                if self._switch is not None:
                    _ask_switch(self._switch)
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="cascade-mpi-progress", daemon=True)
                self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (waits up to ``timeout`` s for it; it is a daemon either way)."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._stop.set()
            thread.join(timeout)
            if self._switch is not None:
                _drop_switch(self._switch)

    def _run(self) -> None:
        MPI = load_mpi()
        probe = self._comm.Iprobe
        while not self._stop.wait(self._interval):
            probe(MPI.ANY_SOURCE, _TAG)
            self.visits += 1

    def __enter__(self) -> ProgressThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
