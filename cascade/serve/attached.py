"""A node's Cascade rank for a cache user that must never fail because of it.

:class:`AttachedStore` wraps a :class:`~.client.CascadeClient` for callers such as the
LMCache plugin, for which a lost rank means "recompute", never an engine crash: while the
rank is gone, lookups and reads are misses, pins and deletes find nothing
(:class:`BlockNotFound`), and puts raise :class:`RankFailure` (a :class:`CascadeError`,
which such callers already log and skip). It tries to attach again at most every
``retry_seconds`` (counted from the end of the last try), so a restarted Cascade job is
picked up without restarting the engine; one thread tries, and other threads' calls are
served as misses meanwhile instead of waiting for a rank that may not answer (a try lasts
up to the client's ``timeout``).

Its ``spec`` is flat (two halves of raw bytes, ``BlockSpec.flat``): puts and reads take
``uint8`` halves and are viewed as the rank's spec on the way. Thread-safe.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import BlockNotFound, CascadeError, ConfigError, RankFailure, StoreClosed
from ..models import BlockSpec
from ..store import DEFAULT_NAMESPACE
from .client import CascadeClient, connect

log = logging.getLogger(__name__)


class AttachedStore:
    """The store of this node's rank at ``endpoint`` (see :func:`.client.connect`);
    :class:`RankFailure` from the constructor when no rank answers."""

    def __init__(self, endpoint: str, *, worker: int = 0, socket_dir: str | None = None,
                 retry_seconds: float = 5.0, **client_args: Any) -> None:
        self._attach_args = dict(endpoint=endpoint, worker=worker, socket_dir=socket_dir, **client_args)
        self.retry_seconds = retry_seconds
        self._lock = threading.Lock()  # the client reference and the retry state only
        self._client: CascadeClient | None = connect(**self._attach_args)
        self._lost_at = 0.0  # when the rank was lost or the last try failed (inf: closed)
        self._reattaching = False
        self.rank_spec = self._client.spec
        self.spec = BlockSpec.flat(self.rank_spec.block_bytes)
        self.endpoint = self._client.path

    def _current(self) -> CascadeClient | None:
        """The client, or None while the rank is gone. Once it was lost ``retry_seconds``
        ago, the calling thread attaches again outside the lock; other threads get None
        meanwhile."""
        with self._lock:
            if (self._client is not None or self._reattaching
                    or time.monotonic() - self._lost_at < self.retry_seconds):
                return self._client
            self._reattaching = True
        client, kept = None, False
        try:
            client = self._attach()
        finally:
            with self._lock:
                self._reattaching = False
                kept = client is not None and self._lost_at != math.inf  # (inf: closed meanwhile)
                if kept:
                    self._client = client
                else:  # the next try retry_seconds from now
                    self._lost_at = max(self._lost_at, time.monotonic())
        if kept:
            log.warning("attached again to Cascade rank %d at %s", client.rank, client.path)
            return client
        if client is not None:  # closed meanwhile
            client.close()
        return None

    def _attach(self) -> CascadeClient | None:
        """A new client of the rank, or None (logged) when none answers or it serves
        another spec. Slow while the rank does not answer: called outside the lock."""
        try:
            client = connect(**self._attach_args)
        except (RankFailure, ConfigError) as exc:  # gone, or refusing us now (another spec or version)
            if isinstance(exc, ConfigError):
                log.warning("the Cascade rank at %s refused to attach again (%s): not attached", self.endpoint, exc)
            return None
        if client.spec != self.rank_spec:
            client.close()
            log.warning("the Cascade rank at %s now serves blocks of %s, not %s: not attached",
                        client.path, client.spec, self.rank_spec)
            return None
        return client

    def _lost(self, client: CascadeClient, exc: CascadeError) -> None:
        with self._lock:
            if self._client is client:
                self._client = None
                self._lost_at = time.monotonic()
                log.warning("%s; served as misses until it is back", exc)
        client.close()

    def _as_rank(self, half: Any) -> Any:
        return np.asarray(half).view(self.rank_spec.np_dtype).reshape(self.rank_spec.shape)

    def _run(self, miss: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        client = self._current()
        if client is None:
            return miss()
        try:
            return getattr(client, method)(*args, **kwargs)
        except (RankFailure, StoreClosed) as exc:  # StoreClosed: another thread lost this client meanwhile
            self._lost(client, exc)
            return miss()

    # -- what the LMCache plugin calls ----------------------------------------------------
    def contains(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> bool:
        return self._run(lambda: False, "contains", block_id, namespace=namespace)

    def contains_many(self, block_ids: Sequence[str], *, namespace: str = DEFAULT_NAMESPACE) -> list[bool]:
        """Which of ``block_ids`` are cached (one request); all False while the rank is gone."""
        return self._run(lambda: [False] * len(block_ids), "contains_many", list(block_ids), namespace=namespace)

    def get_into(self, block_id: str, key_out: Any, value_out: Any, *, namespace: str = DEFAULT_NAMESPACE) -> bool:
        self.spec.check(key_out, "key_out")
        self.spec.check(value_out, "value_out")
        return self._run(lambda: False, "get_into", block_id, self._as_rank(key_out), self._as_rank(value_out),
                         namespace=namespace)

    def get_many_into(self, block_ids: Sequence[str], outs: Sequence[tuple[Any, Any]], *,
                      namespace: str = DEFAULT_NAMESPACE) -> list[bool]:
        block_ids, outs = list(block_ids), list(outs)  # (iterators: checked, then sent)
        for key_out, value_out in outs:
            self.spec.check(key_out, "key_out")
            self.spec.check(value_out, "value_out")
        return self._run(lambda: [False] * len(block_ids), "get_many_into", block_ids,
                         [(self._as_rank(k), self._as_rank(v)) for k, v in outs], namespace=namespace)

    def put(self, key: Any, value: Any, **kwargs: Any) -> str:
        self.spec.check(key, "key")
        self.spec.check(value, "value")

        def gone() -> str:
            raise RankFailure(f"no Cascade rank at {self.endpoint}: block not stored")
        return self._run(gone, "put", self._as_rank(key), self._as_rank(value), **kwargs)

    def put_many(self, pairs: Sequence[tuple[Any, Any]], *, block_ids: Sequence[str] | None = None,
                 namespace: str = DEFAULT_NAMESPACE) -> list[str]:
        """:meth:`put` of every pair, one request per staging-full; as the store's, each
        put is its own and the first error is raised after all were tried."""
        pairs = list(pairs)  # (an iterator: checked, then sent)
        for key, value in pairs:
            self.spec.check(key, "key")
            self.spec.check(value, "value")

        def gone() -> list[str]:
            raise RankFailure(f"no Cascade rank at {self.endpoint}: blocks not stored")
        return self._run(gone, "put_many", [(self._as_rank(k), self._as_rank(v)) for k, v in pairs],
                         block_ids=None if block_ids is None else list(block_ids), namespace=namespace)

    def put_pending(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Always False: an attached put is done when :meth:`put` / :meth:`put_many` returns."""
        return False

    def pin(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        self._run(lambda: _not_found(block_id), "pin", block_id, namespace=namespace)

    def unpin(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        self._run(lambda: _not_found(block_id), "unpin", block_id, namespace=namespace)

    def delete(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        self._run(lambda: _not_found(block_id), "delete", block_id, namespace=namespace)

    def stats(self) -> dict[str, Any]:
        return self._run(lambda: {}, "stats")

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            self._lost_at = float("inf")  # never attach again
        if client is not None:
            client.close()


def _not_found(block_id: str) -> None:
    raise BlockNotFound(f"block {block_id}: the Cascade rank is gone")
