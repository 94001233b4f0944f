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
"""
from __future__ import annotations

import signal
import threading

_MAIN = threading.main_thread().ident
_guard = threading.Lock()  # guards _stores
_stores = 0  # open stores that count on the handler
_depth = 0  # atomic steps the main thread is in
_pending = False  # a SIGINT came during one


def _on_sigint(signum: int, frame: object) -> None:
    global _pending
    if _depth:
        _pending = True
        return
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
    global _stores
    with _guard:
        _stores = max(0, _stores - 1)
        if (not _stores and threading.get_ident() == _MAIN
                and signal.getsignal(signal.SIGINT) is _on_sigint):
            signal.signal(signal.SIGINT, signal.default_int_handler)
