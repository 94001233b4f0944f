"""What a store operation takes and must give back, each taken and given back in one place.

* :class:`InFlight` counts the operations moving data outside the store's lock;
  :meth:`InFlight.drain` (``close()``) waits for them, a bounded time.
* :class:`Reading` counts a reader on a block: the policy neither moves nor drops it.
* :class:`Lease` holds a block's bytes in place in its tier, with a :class:`Reading`.
* :class:`Claim` is room reserved in a tier, filled outside the lock, then committed or
  discarded.
* :class:`Move` is a two-phase move: the block held in its tier and a :class:`Claim`
  below (or above).

Each is a context manager whose exit gives back whatever is still held, on every path
(an exception, KeyboardInterrupt included); the normal path may give it back earlier,
under the store's lock, with :meth:`release` / :meth:`commit`, which are idempotent.
Guards are taken under the store's lock (the ``lock`` passed in) and their exits take
it themselves: thread-safe.
"""
from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import CloseTimeout, StoreClosed

if TYPE_CHECKING:
    from ..policy import BlockMeta
    from ..tiers.base import Tier
    from .index import BlockIndex

CLOSE_WAIT_S = 30.0  # default bound of close()'s wait for operations still moving data


class Op:
    """One operation in flight; :attr:`what` says what it holds (for close()'s error): a
    message, or a ``%`` template and its arguments, formatted only when read (a message
    formatted per get was a tenth of the Python of a cold 64 KiB file-tier get)."""

    __slots__ = ("_template", "_args")

    def __init__(self, template: str, *args: Any) -> None:
        self._template, self._args = template, args

    @property
    def what(self) -> str:
        return self._template % self._args if self._args else self._template

    @what.setter
    def what(self, what: str) -> None:
        self._template, self._args = what, ()


class InFlight:
    """The operations moving data outside the store's lock. Once :attr:`closing` is set,
    new ones are refused (:class:`StoreClosed`)."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._idle = threading.Condition(lock)
        self._ops: dict[int, Op] = {}
        self._ids = itertools.count()
        self.closing = False

    def check_open(self) -> None:
        if self.closing:
            raise StoreClosed("this CascadeStore is closed")

    @contextmanager
    def hold(self, what: str) -> Iterator[Op]:
        """Count an operation for the ``with`` block; :class:`StoreClosed` once closing."""
        op, token = Op(what), None
        try:  # entered first: a KeyboardInterrupt right after the count still ends it
            with self._lock:
                token = self.enter(op)
            yield op
        finally:
            if token is not None:
                with self._lock:
                    self.leave(token)

    def enter(self, op: Op) -> int:
        """Under the lock: count ``op`` (:class:`StoreClosed` once closing); the token
        to :meth:`leave` with. For a caller that counts and ends an operation inside its
        own locked steps (:meth:`~cascade.core.reads.ReadPath.read_leased`); else :meth:`hold`."""
        if self.closing:  # check_open(), written out: per get
            raise StoreClosed("this CascadeStore is closed")
        token = next(self._ids)
        self._ops[token] = op
        return token

    def leave(self, token: int) -> None:
        """Under the lock: end the operation counted as ``token`` (idempotent)."""
        self._ops.pop(token, None)
        if self.closing and not self._ops:  # only close() waits (drain, after closing is set)
            self._idle.notify_all()

    def drain(self, timeout: float) -> None:
        """Under the store's lock: wait up to ``timeout`` seconds until no operation is in
        flight. The wait gives the lock up (the operations need it to end).
        :class:`CloseTimeout` naming what is still held when they do not end in time."""
        if not self._idle.wait_for(lambda: not self._ops, timeout):
            held = "; ".join(op.what for op in self._ops.values())
            raise CloseTimeout(f"close: after {timeout:g} s, {len(self._ops)} operation(s) still hold "
                               f"store resources: {held}")

    def __len__(self) -> int:
        return len(self._ops)


class Reading:
    """A reader counted on ``meta`` (taken under the lock): the policy neither moves nor
    drops it until :meth:`release`, after which it is a candidate again."""

    __slots__ = ("_lock", "_index", "meta", "_held")

    def __init__(self, lock: threading.RLock, index: BlockIndex, meta: BlockMeta) -> None:
        self._lock, self._index, self.meta = lock, index, meta
        meta.readers += 1
        self._held = True

    @property
    def held(self) -> bool:
        """Whether the count is still held (not yet released)."""
        return self._held

    def release(self) -> None:
        """Under the lock: end the count (idempotent)."""
        if self._held:
            self._held = False
            self.meta.readers -= 1
            self._index.read_done(self.meta)  # a candidate again (the policy may have skipped it meanwhile)

    def __enter__(self) -> "Reading":
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.release()


class Lease(Reading):
    """``meta``'s bytes held in tier ``t`` (taken under the lock; :class:`BlockNotFound`
    when absent), and a reader counted on it. Deleted or replaced meanwhile, the bytes
    stay until the lease ends."""

    __slots__ = ("t", "tier", "handle")

    def __init__(self, lock: threading.RLock, index: BlockIndex, meta: BlockMeta, t: int, tier: Tier) -> None:
        self.t, self.tier = t, tier
        self.handle = tier.lease(meta.key)
        self._lock, self._index, self.meta = lock, index, meta  # Reading's, written out: per get
        meta.readers += 1
        self._held = True

    def read(self, outs: Sequence[Any]) -> None:
        """Copy the leased bytes into ``outs`` (outside the lock on a concurrent tier)."""
        self.tier.read_leased(self.handle, outs)

    def current(self) -> bool:
        """Under the lock: whether the block is still cached as these bytes in tier ``t``."""
        return (self._index.get(self.meta.key) is self.meta and self.meta.tier == self.t
                and self.tier.current(self.meta.key, self.handle))

    def release(self) -> None:
        if self._held:  # (Reading.release() written out: per get)
            self._held = False
            self.tier.release(self.handle)
            self.meta.readers -= 1
            self._index.read_done(self.meta)


class Claim:
    """Room reserved in tier ``t`` (under the lock; :class:`TierFull` if none), filled
    outside the lock, then committed or, at the latest when the ``with`` block ends,
    discarded."""

    __slots__ = ("_lock", "tier", "t", "handle", "filled", "_open", "on_end")

    def __init__(self, lock: threading.RLock, tier: Tier, t: int, key: Any, nbytes: int,
                 parent: str | None = None) -> None:
        self._lock, self.tier, self.t = lock, tier, t
        self.handle = tier.reserve(key, nbytes, parent=parent)
        self.filled = False
        self._open = True
        #: Called under the lock once the room is committed or given back (or None).
        self.on_end: Callable[[], None] | None = None

    def fill(self, parts: Sequence[Any]) -> None:
        """Copy ``parts`` in (outside the lock on a concurrent tier)."""
        self.tier.fill(self.handle, parts)
        self.filled = True

    def commit(self, key: Any) -> None:
        """Under the lock: publish the room under ``key``. A tier's commit is all or
        nothing: after a failed one the room is still claimed (and discarded on exit)."""
        self.tier.commit(key, self.handle)
        self._open = False
        if self.on_end is not None:
            self.on_end()

    def discard(self) -> None:
        """Under the lock: give the room back (idempotent; nothing after a commit)."""
        if self._open:
            self._open = False
            try:
                self.tier.discard(self.handle)
            finally:
                if self.on_end is not None:
                    self.on_end()

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._open:
            with self._lock:
                self.discard()


class Move:
    """A two-phase move of ``source.meta`` out of tier ``src``: the block held where it
    is (a :class:`Lease` on its bytes for a demotion; a :class:`Reading` for a promotion,
    whose bytes were just read), and room claimed in tier ``dst.t``. Exiting gives back
    both, whatever is left of them."""

    __slots__ = ("source", "dst", "src")

    def __init__(self, source: Reading, dst: Claim, src: int) -> None:
        self.source, self.dst, self.src = source, dst, src

    @property
    def meta(self) -> BlockMeta:
        return self.source.meta

    def __enter__(self) -> "Move":
        return self

    def __exit__(self, *exc: object) -> None:
        self.dst.__exit__(*exc)
        self.source.__exit__(*exc)
