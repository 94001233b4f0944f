"""Ctrl-C without torn state: a KeyboardInterrupt that arrives while the main thread runs
a step that changes a tier and the index together (a move's commit, a drop) is raised
when the step ends, not inside it.

Python's own SIGINT handler raises KeyboardInterrupt between any two bytecodes of the
main thread, so such a step could stop half way: e.g. a demotion that freed the block's
SHM copy but had not yet pointed the index at its new one left the index naming a tier
without the block (a get or close() then raised ``BlockNotFound``). While a store is
open (:func:`held`), a handler that does what Python's does replaces it, except inside
:func:`atomic`, where it only notes the signal: the step's end raises it. Only Python's
own handler is replaced, and it is put back when the last store closes; a handler of the
application's stays (its steps are then not shielded). Other threads never get
KeyboardInterrupt: :func:`atomic` does nothing there. Thread-safe.

Outside :func:`atomic` the handler does not raise while the main thread runs the
store's own code (:data:`STORE_CODE`: a guard taken but not yet entered in its ``with``,
a count given back in a ``finally``, a tier written and the index not yet): it sends
the signal again :data:`RETRY_S` later, and the KeyboardInterrupt is raised at the
first try that finds the main thread back in its caller's code (found by sweeping a
Ctrl-C over every line of a put, a get and a batch get: tests/test_interrupt_sweep.py).
A call that stays in the store longer than :data:`DEFER_LIMIT_S` (a wait on a stopped
rank, say), or a second Ctrl-C meanwhile, is interrupted where it is, as Python does.
"""
from __future__ import annotations

import os
import signal
import threading
import time

_MAIN = threading.main_thread().ident
_guard = threading.Lock()  # guards _stores
_stores = 0  # open stores that count on the handler
_depth = 0  # atomic steps the main thread is in
_pending = False  # a SIGINT came during one
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
    signal.default_int_handler(signum, frame)


class _Atomic:
    """The ``with`` block runs whole on the main thread; a SIGINT meanwhile raises
    KeyboardInterrupt at its end."""

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
            raise KeyboardInterrupt


_ATOMIC = _Atomic()


def atomic() -> _Atomic:
    """A context manager: its block is not cut by Ctrl-C (raised at its end instead)."""
    return _ATOMIC


def held() -> None:
    """A store opened: install the handler (on the main thread, over Python's own)."""
    global _stores
    with _guard:
        _stores += 1
        if threading.get_ident() == _MAIN and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_sigint)


def released() -> None:
    """A store closed: with no store open, put Python's own handler back (if ours is
    still installed and this is the main thread)."""
    global _stores, _deferred_since
    with _guard:
        _stores = max(0, _stores - 1)
        if not _stores:
            _deferred_since = None  # a Ctrl-C sent again now meets Python's own handler
        if (not _stores and threading.get_ident() == _MAIN
                and signal.getsignal(signal.SIGINT) is _on_sigint):
            signal.signal(signal.SIGINT, signal.default_int_handler)
