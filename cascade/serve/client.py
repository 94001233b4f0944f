"""``cascade.connect()``: a process that is not an MPI rank (a serving engine's worker)
uses its node's ``cascade serve`` rank as if it held the store itself.

The client has the store's API and raises the store's errors. Block bytes go through
shared memory, never the socket: a put copies key and value into slots of the client's
staging region (:mod:`.staging`) and sends one small request for the whole batch; a get
leases the blocks on the rank and copies them straight out of the rank's SHM slab, mapped
read-only (:mod:`.slab_map`; blocks in slower tiers or on other ranks come through staging
slots). Batches larger than the region (or than :data:`.protocol.MAX_BATCH` blocks, so
that neither a request nor its reply passes the frame limit) go as several requests.

When the rank is gone (stopped, died, or silent for ``timeout`` seconds) every call
raises :class:`~cascade.errors.RankFailure` at once: treat it as a miss and recompute,
or connect again once a new job serves the node.
"""
from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from .. import buffers
from ..errors import CascadeError, InvalidBlock, RankFailure, StoreClosed
from ..store import DEFAULT_NAMESPACE
from ..config import parse_size
from ..models import BlockSpec
from . import protocol
from .paths import resolve_endpoint
from .slab_map import SlabMap
from .staging import DEFAULT_STAGING_BYTES, Staging

DEFAULT_TIMEOUT = 120.0


def connect(endpoint: str = "auto", *, worker: int = 0, socket_dir: str | None = None,
            staging_bytes: int = DEFAULT_STAGING_BYTES, timeout: float = DEFAULT_TIMEOUT) -> "CascadeClient":
    """Attach to a ``cascade serve`` rank: ``endpoint`` is its socket path, or ``"auto"``
    for this node's ranks (in ``socket_dir``, default :func:`.paths.default_socket_dir`;
    worker ``worker`` starts at the ``worker``-th of them and takes the first that
    answers). :class:`RankFailure` when none answers."""
    errors = []
    for path in resolve_endpoint(endpoint, worker=worker, socket_dir=socket_dir):
        try:
            return CascadeClient(path, staging_bytes=staging_bytes, timeout=timeout)
        except RankFailure as exc:
            errors.append(str(exc))
    raise RankFailure("; ".join(errors))


class CascadeClient:
    """The store of the rank listening at ``path``, seen from another process.

    ``spec`` is the rank's block spec; ``rank``/``world_size`` where it sits. Calls take
    what the store takes (numpy arrays, torch or cupy tensors of ``spec``'s shape and dtype,
    through :mod:`cascade.buffers`), return numpy arrays, and raise what the store raises. Thread-safe: one
    request at a time per client (open one client per thread for parallel requests). It
    belongs to the process that connected: in a forked child every call raises
    :class:`RankFailure` (connect again there).
    """

    def __init__(self, path: str, *, staging_bytes: int = DEFAULT_STAGING_BYTES,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.path, self.timeout = path, timeout
        staging_bytes = parse_size(staging_bytes, "staging_bytes")  # (inf, "lots": ConfigError)
        self._lock = threading.Lock()
        self._pid = os.getpid()  # a forked child shares the socket and staging region: never used there
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._closed = False
        try:
            info, fds = self._hello(int(staging_bytes))
            try:
                self._map(info, fds)
            finally:
                for fd in fds:
                    os.close(fd)
        except CascadeError:
            self._sock.close()
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._sock.close()
            raise RankFailure(f"cannot attach to the Cascade rank at {path}: {exc}") from exc

    def _hello(self, staging_bytes: int) -> tuple[dict[str, Any], list[int]]:
        """Connect and say hello: the rank's reply and the descriptors it sent (the caller closes them)."""
        self._sock.connect(self.path)
        protocol.send(self._sock, {"op": "hello", "version": protocol.VERSION, "staging_bytes": staging_bytes})
        reply = protocol.recv(self._sock)
        if not reply.get("ok"):
            protocol.raise_error(reply)
        info = reply["result"]
        _, fds, _, _ = socket.recv_fds(self._sock, 1, 2)
        if len(fds) != 1 + bool(info.get("slab_bytes")):
            for fd in fds:
                os.close(fd)
            raise protocol.ChannelClosed(f"the rank sent {len(fds)} descriptors, not the staging region "
                                         "(and its slab)")
        return info, fds

    def _map(self, info: dict[str, Any], fds: list[int]) -> None:
        """Take the rank's spec and place from its hello reply; map the regions of ``fds``
        (kept open: the caller closes them)."""
        self.spec = BlockSpec(tuple(info["shape"]), info["dtype"])
        self.rank, self.world_size = int(info["rank"]), int(info["world_size"])
        self.block_tokens = int(info["block_tokens"])
        self._staging = Staging(fds[0], self.spec, int(info["slots"]))
        try:
            self._slab = SlabMap(fds[1], int(info["slab_bytes"]), self.spec) if len(fds) > 1 else None
        except BaseException:
            self._staging.close()
            raise
        self._batch = min(self._staging.slots, protocol.MAX_BATCH)  # the most blocks of one request

    def __repr__(self) -> str:
        return f"CascadeClient({self.path!r}, rank={self.rank})"

    # -- the channel ----------------------------------------------------------------------
    @contextmanager
    def _held(self) -> Iterator[None]:
        """This client's lock, for one call. :class:`RankFailure` at once, touching neither
        the socket nor the staging region, in a process other than the one that connected
        (a forked child shares both with its parent: replies and blocks would cross)."""
        if os.getpid() != self._pid:
            raise RankFailure(f"this Cascade client belongs to process {self._pid}: connect again in this process")
        with self._lock:
            yield

    def _call(self, op: str, **args: Any) -> Any:
        """One request and its reply (the caller is in :meth:`_held`)."""
        if self._closed:
            raise StoreClosed("this Cascade client is closed")
        if self._sock is None:
            raise RankFailure(f"the Cascade rank at {self.path} is gone (an earlier call failed)")
        frame = protocol.encode({"op": op, **args})  # too big: InvalidBlock, nothing sent, the connection kept
        try:
            self._sock.sendall(frame)
            reply = protocol.recv(self._sock)
        except TimeoutError as exc:
            self._drop()
            raise RankFailure(f"Cascade rank {self.rank} at {self.path} did not answer {op} within "
                              f"{self.timeout:.0f} s") from exc
        except (OSError, ValueError) as exc:  # ChannelClosed included
            self._drop()
            raise RankFailure(f"Cascade rank {self.rank} at {self.path} is gone ({exc or type(exc).__name__}): "
                              "treat as a miss") from exc
        except BaseException:  # e.g. KeyboardInterrupt: its reply, unread, would answer the next call
            self._drop()
            raise
        if not reply.get("ok"):
            protocol.raise_error(reply)
        return reply.get("result")

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _batches(self, n: int) -> Iterable[range]:
        step = self._batch
        return (range(i, min(i + step, n)) for i in range(0, n, step))

    # -- put ------------------------------------------------------------------------------
    def put(self, key: Any, value: Any, *, parent: str | None = None, namespace: str = DEFAULT_NAMESPACE,
            block_id: str | None = None, verify: bool = False, ttl: float | None = None, priority: int = 0) -> str:
        """:meth:`CascadeStore.put <cascade.store.CascadeStore.put>` on the rank."""
        self._check_pair(key, value)
        with self._held():
            self._fill(0, *self._detached((key, value)))
            return self._call("put", ns=namespace, slot=0, parent=parent, block_id=block_id, verify=verify,
                              ttl=ttl, priority=priority)

    def put_many(self, pairs: Iterable[tuple[Any, Any]], *, namespace: str = DEFAULT_NAMESPACE, chain: bool = False,
                 parent: str | None = None, block_ids: Sequence[str] | None = None,
                 max_workers: int | None = None) -> list[str]:
        """:meth:`CascadeStore.put_many <cascade.store.CascadeStore.put_many>` on the rank,
        one request per staging-full of blocks (at most :data:`.protocol.MAX_BATCH`); as
        there, each put is its own operation and the first error is raised after all were
        tried."""
        pairs = list(pairs)
        for key, value in pairs:
            self._check_pair(key, value)
        if block_ids is not None and len(block_ids) != len(pairs):
            raise InvalidBlock(f"put_many: {len(pairs)} blocks but {len(block_ids)} block_ids")
        ids: list[str] = []
        first_error: CascadeError | None = None
        with self._held():
            several = len(pairs) > self._batch  # the first request gives back the leases of views()
            pairs = [self._detached(pair, slab=several) for pair in pairs]
            for batch in self._batches(len(pairs)):
                for slot, i in enumerate(batch):
                    self._fill(slot, *pairs[i])
                try:
                    ids += self._call("put_many", ns=namespace, slots=list(range(len(batch))), chain=chain,
                                      parent=ids[-1] if chain and ids else parent,
                                      block_ids=None if block_ids is None else list(block_ids[batch.start:batch.stop]),
                                      max_workers=max_workers)
                except RankFailure:
                    raise
                except CascadeError as exc:  # later batches still go, as in the store
                    first_error = first_error or exc
                    if chain:  # the next batch's parent is unknown now
                        break
                    ids += [None] * len(batch)  # type: ignore[list-item]
        if first_error is not None:
            raise first_error
        return ids

    def _detached(self, pair: tuple[Any, Any], *, slab: bool = False) -> tuple[Any, Any]:
        """``pair`` with any part that lies in the staging region (an array of an earlier
        ``views()``) copied out first: filling the slots could overwrite it before it is
        read. With ``slab``, parts in the rank's slab too (arrays of ``views()``, leased only
        until the next request: a later batch could read bytes the rank gave another block)."""
        key, value = (np.array(part, copy=True) if self._shared(part, slab) else part for part in pair)
        return key, value

    def _shared(self, part: Any, slab: bool) -> bool:
        """Whether ``part`` may lie in the staging region (or, with ``slab``, the slab)."""
        return self._staging.holds(part) or (slab and self._slab is not None and self._slab.holds(part))

    def _check_pair(self, key: Any, value: Any) -> None:
        self.spec.check(key, "key")
        self.spec.check(value, "value")

    def _fill(self, slot: int, key: Any, value: Any) -> None:
        """Copy a block into staging ``slot`` (callers first take :meth:`_detached` parts)."""
        k, v = self._staging.pair(slot)
        buffers.copy(k, key, what="staging slot")
        buffers.copy(v, value, what="staging slot")

    # -- get ------------------------------------------------------------------------------
    def get(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> tuple[np.ndarray, np.ndarray] | None:
        """(key, value) copies of a cached block, or None on a miss."""
        key_out, value_out = self.spec.empty()
        return (key_out, value_out) if self.get_into(block_id, key_out, value_out, namespace=namespace) else None

    def get_into(self, block_id: str, key_out: Any, value_out: Any, *, namespace: str = DEFAULT_NAMESPACE) -> bool:
        """Read a block into ``key_out`` and ``value_out``; True on a hit."""
        return self.get_many_into([block_id], [(key_out, value_out)], namespace=namespace)[0]

    def get_many(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE,
                 max_workers: int | None = None) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """``get`` of each id, in order (one request per staging-full)."""
        block_ids = list(block_ids)
        outs = [self.spec.empty() for _ in block_ids]
        hits = self.get_many_into(block_ids, outs, namespace=namespace, max_workers=max_workers)
        return [out if hit else None for out, hit in zip(outs, hits)]

    def get_many_into(self, block_ids: Sequence[str], outs: Sequence[tuple[Any, Any]], *,
                      namespace: str = DEFAULT_NAMESPACE, max_workers: int | None = None) -> list[bool]:
        """:meth:`CascadeStore.get_many_into <cascade.store.CascadeStore.get_many_into>`:
        one copy from the rank's slab per block (:meth:`views`), or, when the rank has no
        SHM tier, the rank reads into staging slots and the client copies out."""
        block_ids, outs = list(block_ids), list(outs)
        if len(block_ids) != len(outs):
            raise InvalidBlock(f"get_many_into: {len(block_ids)} ids but {len(outs)} output pairs")
        for key_out, value_out in outs:  # all checked before anything is read
            self.spec.check(key_out, "key_out", writable=True)
            self.spec.check(value_out, "value_out", writable=True)
        hits: list[bool] = []
        with self._held():
            for batch in self._batches(len(block_ids)):
                ids = block_ids[batch.start:batch.stop]
                if self._slab is not None:
                    blocks = self._views(ids, namespace)
                else:
                    got = self._call("get_many_into", ns=namespace, ids=ids, slots=list(range(len(batch))),
                                     max_workers=max_workers)
                    blocks = [self._staging.pair(slot) if hit else None for slot, hit in enumerate(got)]
                for i, block in zip(batch, blocks):
                    if block is not None:
                        buffers.copy(outs[i][0], block[0], what="key_out")
                        buffers.copy(outs[i][1], block[1], what="value_out")
                    hits.append(block is not None)
        return hits

    def views(self, block_ids: Sequence[str], *, namespace: str = DEFAULT_NAMESPACE
              ) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """Read-only (key, value) arrays over each block's bytes (None for a miss), valid
        until this client's next request: in the rank's SHM slab, leased there (an evicted
        or deleted block's bytes stay in place until then), or a staged copy. No copy on
        this side; at most one staging-full of ids, and :data:`.protocol.MAX_BATCH`
        (:class:`InvalidBlock` else)."""
        block_ids = list(block_ids)
        if len(block_ids) > self._batch:
            raise InvalidBlock(f"views: at most {self._batch} ids at once, got {len(block_ids)}")
        if not block_ids:
            return []
        with self._held():
            if self._slab is None:
                got = self._call("get_many_into", ns=namespace, ids=block_ids, slots=list(range(len(block_ids))))
                return [_read_only(self._staging.pair(i)) if hit else None for i, hit in enumerate(got)]
            return self._views(block_ids, namespace)

    def _views(self, block_ids: list[str], namespace: str) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """``view_many`` on the rank (the caller is in :meth:`_held`)."""
        where = self._call("view_many", ns=namespace, ids=block_ids)
        return [None if w is None else _read_only(self._staging.pair(i)) if w == "staged" else self._slab.pair(*w)
                for i, w in enumerate(where)]

    # -- lookups, pins, hints -------------------------------------------------------------
    def contains(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> bool:
        return self.contains_many([block_id], namespace=namespace)[0]

    def contains_many(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE) -> list[bool]:
        """Cached here or anywhere in the cluster (one batched directory lookup)."""
        with self._held():
            return self._call("contains_many", ns=namespace, ids=list(block_ids))

    def longest_prefix(self, block_ids: Sequence[str] | None = None, *, tokens: Any = None,
                       model_fingerprint: Any = None, namespace: str = DEFAULT_NAMESPACE) -> int:
        """How many leading blocks of a chain are cached cluster-wide (as the store's)."""
        if (block_ids is None) == (tokens is None):
            raise InvalidBlock("longest_prefix: pass either block_ids or tokens (with model_fingerprint)")
        if tokens is not None:
            from ..prefix import prefix_ids

            block_ids = prefix_ids(tokens, block_tokens=self.block_tokens, model_fingerprint=model_fingerprint)
        found = self.contains_many(block_ids, namespace=namespace)
        return found.index(False) if False in found else len(found)

    def pin(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Pin a block for this client; released at :meth:`unpin`, or when this client's
        connection ends (also if its process dies)."""
        with self._held():
            self._call("pin", ns=namespace, id=block_id)

    def unpin(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        """Drop one of this client's pins (:class:`BlockPinned` if it holds none)."""
        with self._held():
            self._call("unpin", ns=namespace, id=block_id)

    def hint(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE) -> int:
        """:meth:`CascadeStore.hint <cascade.store.CascadeStore.hint>`; hints this client
        still holds are withdrawn when its connection ends."""
        with self._held():
            return self._call("hint", ns=namespace, ids=list(block_ids))

    def unhint(self, block_ids: Iterable[str], *, namespace: str = DEFAULT_NAMESPACE) -> int:
        """Withdraw hints this client took (others' hints are left alone)."""
        with self._held():
            return self._call("unhint", ns=namespace, ids=list(block_ids))

    def delete(self, block_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        with self._held():
            self._call("delete", ns=namespace, id=block_id)

    def stats(self) -> dict[str, Any]:
        """The rank's store stats, plus ``serve``: its clients, their staging bytes,
        pins and hints (:meth:`.server.RankServer.serve_stats`)."""
        with self._held():
            return self._call("stats")

    def __len__(self) -> int:
        return int(self.stats()["blocks"])

    # -- life cycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Detach (the rank gives back this client's pins and hints). Idempotent. In a
        forked child, only closes the child's copies (the parent stays attached)."""
        if os.getpid() != self._pid:  # (its lock may have been held at the fork: never taken here)
            self._unmap()
            return
        with self._lock:
            self._unmap()

    def _unmap(self) -> None:
        """Close this process's socket and mappings, once."""
        if self._closed:
            return
        self._closed = True
        self._drop()
        self._staging.close()
        if self._slab is not None:
            self._slab.close()

    def __enter__(self) -> "CascadeClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _read_only(pair: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    key, value = pair[0].view(), pair[1].view()
    key.flags.writeable = value.flags.writeable = False
    return key, value
