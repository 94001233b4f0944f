"""Ctrl-C without torn state: a KeyboardInterrupt that arrives while the main thread runs
a step that changes a tier and the index together (a move's commit, a drop) is raised
when the step ends, not inside it.

Python's own SIGINT handler raises KeyboardInterrupt between any two bytecodes of the
main thread, so such a step could stop half way: e.g. a demotion that freed the block's
SHM copy but had not yet pointed the index at its new one left the index naming a tier
without the block (a get or close() then raised ``BlockNotFound``). While a store is
open (:func:`held`), the store's handler sits in front of the one installed before it
(Python's own, the application's, or the one ``asyncio.run`` installs to cancel its main
task) and hands each Ctrl-C on to it, except inside :func:`atomic`, where it only notes
the signal: the step's end hands it on. The handler before it is put back when the last
store closes. A handler that is SIG_IGN or SIG_DFL (or not Python's) is left alone, and
so is one installed over the store's (its Ctrl-Cs are then not held). Other threads never
get KeyboardInterrupt: :func:`atomic` does nothing there. Thread-safe.

``asyncio.run`` installs its handler only over Python's own: a store opened before
``asyncio.run`` starts leaves its Ctrl-C as Python's (KeyboardInterrupt inside the event
loop); a store opened inside the coroutine keeps asyncio's (the main task is cancelled).

Outside :func:`atomic` the handler does not hand a Ctrl-C on while the main thread runs the
store's own code (:data:`STORE_CODE`: a guard taken but not yet entered in its ``with``,
a count given back in a ``finally``, a tier written and the index not yet): it sends
the signal again :data:`RETRY_S` later, and hands it on at the first try that finds
the main thread back in its caller's code (found by sweeping a
Ctrl-C over every line of a put, a get and a batch get: tests/test_interrupt_sweep.py).
A call that stays in the store longer than :data:`DEFER_LIMIT_S` (a wait on a stopped
rank, say), or a second Ctrl-C meanwhile, is interrupted where it is, as Python does.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

_MAIN = threading.main_thread().ident
_guard = threading.Lock()  # guards _stores
_stores = 0  # open stores that count on the handler
_depth = 0  # atomic steps the main thread is in
_pending = False  # a SIGINT came during one
_installed = False  # the store's handler was put in front of _previous (and not yet taken away)
_previous: Callable[[int, Any], Any] = signal.default_int_handler  # the handler the store's stands in front of
_CASCADE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The store's own code, by path: a Ctrl-C is not raised while the main thread runs it.
STORE_CODE = tuple(os.path.join(_CASCADE, name) for name in (
    "core", "tiers", "buffers", "distributed", "store.py", "async_ops.py", "policy.py",
    "namespace_victims.py", "stats.py", "histogram.py", "checksum.py", "identity.py", "prefix.py"))
RETRY_S = 0.001  # how soon a Ctrl-C deferred out of the store's code is sent again
DEFER_LIMIT_S = 2.0  # how long a Ctrl-C waits for the main thread to leave the store's code
_deferred_since: float | None = None  # when the Ctrl-C being deferred came
_resent = False  # the next SIGINT is our own, sent again


def _in_store_code(frame: object) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith(STORE_CODE):
            return True
        frame = frame.f_back
    return False


def _send_again() -> None:
    global _resent
    _resent = True
    os.kill(os.getpid(), signal.SIGINT)


def _on_sigint(signum: int, frame: object) -> None:
    global _pending, _deferred_since, _resent
    if _depth:
        _pending = True
        return
    resent, _resent = _resent, False
    now = time.monotonic()
    if _deferred_since is not None and now - _deferred_since > 2 * DEFER_LIMIT_S:
        _deferred_since = None  # a deferral whose resent signal never came back: over
    if _deferred_since is None or resent:
        if _deferred_since is None:
            _deferred_since = now
        if now - _deferred_since < DEFER_LIMIT_S and _in_store_code(frame):
            timer = threading.Timer(RETRY_S, _send_again)
            timer.daemon = True
            timer.start()
            return
    _deferred_since = None  # back in the caller's code, past the limit, or a second Ctrl-C
    _previous(signum, frame)


class _Atomic:
    """The ``with`` block runs whole on the main thread; a SIGINT meanwhile is handed on
    (Python's own handler: KeyboardInterrupt) at its end."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _depth
        if threading.get_ident() == _MAIN:
            _depth += 1

    def __exit__(self, *exc: object) -> None:
        global _depth, _pending
        if threading.get_ident() != _MAIN:
            return
        pending = False
        if _depth == 1:
            pending, _pending = _pending, False
        _depth -= 1
        if pending:
            _previous(signal.SIGINT, sys._getframe(1))


_ATOMIC = _Atomic()


def atomic() -> _Atomic:
    """A context manager: its block is not cut by Ctrl-C (handed on at its end instead)."""
    return _ATOMIC


def held() -> None:
    """A store opened: on the main thread, put the handler in front of the Python
    handler installed now (see the module's docstring)."""
    global _stores, _previous, _installed
    with _guard:
        _stores += 1
        if threading.get_ident() != _MAIN or _installed:
            return  # (once: a handler installed over the store's may hand Ctrl-C back to it)
        current = signal.getsignal(signal.SIGINT)
        if current is not _on_sigint and callable(current):
            _previous, _installed = current, True
            signal.signal(signal.SIGINT, _on_sigint)


def released() -> None:
    """A store closed: with no store open, put back the handler the store's stood in
    front of (if the store's is still installed and this is the main thread)."""
    global _stores, _deferred_since, _previous, _installed
    with _guard:
        _stores = max(0, _stores - 1)
        if _stores:
            return
        _deferred_since = None  # a Ctrl-C sent again now meets the handler put back
        if threading.get_ident() != _MAIN:
            return  # (signal.signal works on the main thread only: its next close puts it back)
        if _installed and signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.signal(signal.SIGINT, _previous)
        _installed, _previous = False, signal.default_int_handler
