"""The rank side of ``cascade serve``: accept local clients and run their requests on
this rank's :class:`~cascade.store.CascadeStore`.

One thread per client connection, each blocking only on its own socket: the store is
thread-safe, so one client's requests never wait for another's I/O (no lock of this
module is held across a socket call or a store call). What a client takes is tied to its
connection: its staging region, the pins and hints it holds, and the leases of the blocks
it last read in place (:mod:`.slab_map`; given back at its next request) are given back
when the connection ends for any reason (close, crash, SIGKILL). A put acts only on a whole
request, and a client sends one only after its staging slots are written, so a client
killed mid-put leaves either a complete block or none.
"""
from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import threading
from collections import Counter
from contextlib import ExitStack
from typing import Any

from .. import buffers
from ..errors import BlockPinned, CascadeError, ConfigError, InvalidBlock, RankFailure
from ..store import CascadeStore
from . import protocol
from .paths import is_listening, prepare_socket_dir, socket_path
from .slab_map import SlabWindow
from .staging import Staging, check_size

log = logging.getLogger(__name__)
_UCRED = struct.Struct("3i")  # pid, uid, gid of the peer (SO_PEERCRED)


class _Session:
    """One client connection: its socket, staging region, and what it holds."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock, self.pid = sock, pid
        self.staging: Staging | None = None
        self.pins: Counter[tuple[str, str]] = Counter()
        self.hints: Counter[tuple[str, str]] = Counter()
        self.thread: threading.Thread | None = None
        self.leases = ExitStack()  # views of the blocks of its last view_many
        self.leased = 0


class RankServer:
    """Serve ``store`` to local clients on ``<socket_dir>/r<rank>.sock`` (mode 0600 in a
    0700 directory; only processes of this user are accepted). Starts listening in the
    constructor; :meth:`close` stops. Thread-safe."""

    def __init__(self, store: CascadeStore, socket_dir: str, rank: int, *, world_size: int = 1) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self._slab = SlabWindow(store)
        self.path = socket_path(socket_dir, rank)  # too long: refused before anything is made
        prepare_socket_dir(socket_dir)
        if os.path.lexists(self.path):
            if is_listening(self.path):
                raise ConfigError(f"another process already serves {self.path}; stop it or pass another --socket-dir")
            if not stat.S_ISSOCK(os.lstat(self.path).st_mode):  # never remove what is not a socket
                raise ConfigError(f"{self.path} exists and is not a socket; remove it or pass another --socket-dir")
            os.unlink(self.path)  # left by a rank that died
        self._lock = threading.Lock()  # the session registry and counters only
        self._sessions: set[_Session] = set()
        self._counts = Counter[str]()
        self._closing = False
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(self.path)
            os.chmod(self.path, 0o600)
            self._listener.listen(128)
        except BaseException:
            self._listener.close()
            raise
        self._acceptor = threading.Thread(target=self._accept, name=f"cascade-serve-r{rank}", daemon=True)
        self._acceptor.start()

    # -- connections ----------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:  # closed by close()
                return
            try:
                pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            except OSError:  # it hung up already
                sock.close()
                continue
            if uid != os.geteuid():
                log.warning("refused a client of uid %d (pid %d): only uid %d may attach", uid, pid, os.geteuid())
                sock.close()
                continue
            session = _Session(sock, pid)
            with self._lock:
                if self._closing:
                    sock.close()
                    return
                self._sessions.add(session)
                self._counts["clients_total"] += 1
            session.thread = threading.Thread(target=self._serve, args=(session,), daemon=True,
                                              name=f"cascade-client-{pid}")
            session.thread.start()

    def _serve(self, session: _Session) -> None:
        """One client's conversation, until it hangs up; then give back what it held."""
        try:
            self._hello(session)
            while True:
                request = protocol.recv(session.sock)
                session.sock.sendall(self._reply(session, request))
        except (protocol.ChannelClosed, OSError):
            pass  # the client left (or died), or close() shut the socket
        except ValueError as exc:  # a malformed frame: the stream cannot be trusted any more
            log.warning("client pid %d sent a malformed frame (%s): connection closed", session.pid, exc)
        finally:
            self._release(session)

    def _hello(self, session: _Session) -> None:
        hello = protocol.recv(session.sock)
        spec = self.store.spec
        try:
            if hello.get("op") != "hello" or hello.get("version") != protocol.VERSION:
                raise ConfigError(f"expected hello of protocol version {protocol.VERSION}, got "
                                  f"{hello.get('op')!r} version {hello.get('version')!r}")
            slots = check_size(int(hello.get("staging_bytes", 0)), spec)
        except (CascadeError, TypeError, ValueError, OverflowError) as exc:  # (int(Infinity): OverflowError)
            protocol.send(session.sock, protocol.error_reply(exc if isinstance(exc, CascadeError) else ConfigError(str(exc))))
            raise protocol.ChannelClosed("refused hello") from exc
        try:
            fds = self._client_fds(session, slots)
        except OSError as exc:  # e.g. out of memory or descriptors: say so to both sides
            log.warning("rank %d cannot attach client pid %d: %s", self.rank, session.pid, exc)
            protocol.send(session.sock, protocol.error_reply(RankFailure(f"rank {self.rank} cannot attach a client: "
                                                                         f"{exc}")))
            raise protocol.ChannelClosed("failed hello") from exc
        try:
            protocol.send(session.sock, {"ok": True, "result": {
                "rank": self.rank, "world_size": self.world_size, "shape": list(spec.shape), "dtype": spec.dtype,
                "slots": slots, "stride": session.staging.stride, "block_tokens": self.store.config.block_tokens,
                "slab_bytes": self._slab.nbytes if len(fds) > 1 else 0}})
            socket.send_fds(session.sock, [b"F"], fds)
        finally:
            for sent in fds:
                os.close(sent)  # the client has its own descriptors now; the mappings stay

    def _client_fds(self, session: _Session, slots: int) -> list[int]:
        """Map ``session``'s staging region of ``slots`` slots; its descriptor and, with an
        SHM tier, a read-only one of the slab (the caller closes them)."""
        session.staging, fd = Staging.create(self.store.spec, slots)
        try:
            slab_fd = self._slab.read_only_fd()
        except BaseException:
            os.close(fd)
            raise
        return [fd] if slab_fd is None else [fd, slab_fd]

    def _release(self, session: _Session) -> None:
        """Give back every lease, pin and hint ``session`` holds, unmap its staging region."""
        self._give_back_leases(session)
        for (namespace, block_id), n in session.pins.items():
            for _ in range(n):
                try:
                    self.store.unpin(block_id, namespace=namespace)
                except CascadeError as exc:  # e.g. the store is closing
                    log.warning("releasing pin of %s for client pid %d: %s", block_id, session.pid, exc)
        for (namespace, block_id), n in session.hints.items():
            try:
                self.store.unhint([block_id] * n, namespace=namespace)
            except CascadeError as exc:
                log.warning("releasing hint of %s for client pid %d: %s", block_id, session.pid, exc)
        session.pins.clear()
        session.hints.clear()
        if session.staging is not None:
            session.staging.close()
        session.sock.close()
        with self._lock:
            self._sessions.discard(session)

    def _give_back_leases(self, session: _Session) -> None:
        try:
            session.leases.close()
        except CascadeError as exc:  # e.g. the store is closing
            log.warning("releasing leases of client pid %d: %s", session.pid, exc)
        session.leases, session.leased = ExitStack(), 0

    # -- requests -------------------------------------------------------------------------
    def _reply(self, session: _Session, request: dict[str, Any]) -> bytes:
        """The frame answering ``request``: an error reply when the answer passes the frame
        limit (the request has run; the client is not dropped for the rank's reply)."""
        try:
            return protocol.encode(self._answer(session, request))
        except InvalidBlock as exc:  # (its message is short: no part of the request)
            log.warning("rank %d: the reply to a request of client pid %d cannot be sent (%s): sent an error",
                        self.rank, session.pid, exc)
            return protocol.encode(protocol.error_reply(InvalidBlock(f"rank {self.rank} ran the request but cannot "
                                                                     f"send its reply: {exc}")))

    def _answer(self, session: _Session, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        handler = _OPS.get(op) if isinstance(op, str) else None
        with self._lock:
            self._counts["requests"] += 1
        self._give_back_leases(session)  # the client is done with what it last read in place
        try:
            if handler is None:
                raise InvalidBlock(f"unknown request {op!r}")
            return {"ok": True, "result": handler(self, session, request)}
        except CascadeError as exc:
            return protocol.error_reply(exc)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            return protocol.error_reply(InvalidBlock(f"malformed {op} request: {exc!r}"))
        except Exception as exc:  # a bug here must not end the client's connection silently
            log.exception("rank %d: %s request of client pid %d failed", self.rank, op, session.pid)
            return protocol.error_reply(CascadeError(f"rank {self.rank} failed the {op} request: {exc!r}"))

    def _put(self, s: _Session, a: dict[str, Any]) -> str:
        key, value = s.staging.pair(_slot(a["slot"]))
        return self.store.put(key, value, parent=a.get("parent"), namespace=a["ns"], block_id=a.get("block_id"),
                              verify=bool(a.get("verify")), ttl=a.get("ttl"), priority=a.get("priority", 0))

    def _put_many(self, s: _Session, a: dict[str, Any]) -> list[str]:
        return self.store.put_many(s.staging.pairs([_slot(i) for i in a["slots"]]), namespace=a["ns"],
                                   chain=bool(a.get("chain")), parent=a.get("parent"),
                                   block_ids=a.get("block_ids"), max_workers=a.get("max_workers"))

    def _get_many_into(self, s: _Session, a: dict[str, Any]) -> list[bool]:
        slots = [_slot(i) for i in a["slots"]]
        if len(set(slots)) != len(slots):
            raise InvalidBlock("get_many_into: two blocks read into one staging slot")
        hits = self.store.get_many_into(a["ids"], s.staging.pairs(slots), namespace=a["ns"],
                                        max_workers=a.get("max_workers"))
        _hints_used(s, a["ns"], a["ids"], hits)
        return hits

    def _view_many(self, s: _Session, a: dict[str, Any]) -> list[Any]:
        """Lease each block and say where it is: ``[key_offset, value_offset]`` in the
        slab, ``"staged"`` (not in the slab: copied into staging slot ``i``) or None (a
        miss). The leases last until the session's next request."""
        ids = a["ids"]
        if not 0 < len(ids) <= s.staging.slots:
            raise InvalidBlock(f"view_many: 1..{s.staging.slots} ids per request, got {len(ids)}")
        where: list[Any] = []
        for slot, block_id in enumerate(ids):
            block = s.leases.enter_context(self.store.view(block_id, namespace=a["ns"]))
            offsets = None if block is None else [self._slab.offset(half) for half in block]
            if block is None or None not in offsets:
                s.leased += block is not None
                where.append(offsets)
                continue
            for out, half in zip(s.staging.pair(slot), block):
                buffers.copy(out, half, what="staging slot")  # host or device (GPU tier) bytes
            where.append("staged")
        _hints_used(s, a["ns"], ids, [w is not None for w in where])
        return where

    def _contains_many(self, s: _Session, a: dict[str, Any]) -> list[bool]:
        return self.store.contains_many(a["ids"], namespace=a["ns"])

    def _pin(self, s: _Session, a: dict[str, Any]) -> None:
        self.store.pin(a["id"], namespace=a["ns"])
        s.pins[(a["ns"], a["id"])] += 1

    def _unpin(self, s: _Session, a: dict[str, Any]) -> None:
        held = (a["ns"], a["id"])
        if not s.pins[held]:
            raise BlockPinned(f"block {a['id']} is not pinned by this client")
        self.store.unpin(a["id"], namespace=a["ns"])
        _take(s.pins, held, 1)

    def _hint(self, s: _Session, a: dict[str, Any]) -> int:
        taken = 0
        for block_id in a["ids"]:  # one at a time: we must know which hints we hold
            if self.store.hint([block_id], namespace=a["ns"]):
                s.hints[(a["ns"], block_id)] += 1
                taken += 1
        return taken

    def _unhint(self, s: _Session, a: dict[str, Any]) -> int:
        """Withdraw this session's hints only: an id named more often than the session
        hinted it withdraws no more than it took (others' hints are left alone)."""
        ns, mine, taken = a["ns"], [], Counter()
        for block_id in a["ids"]:
            if s.hints[(ns, block_id)] > taken[block_id]:
                taken[block_id] += 1
                mine.append(block_id)
        withdrawn = self.store.unhint(mine, namespace=ns)
        for block_id, count in taken.items():
            _take(s.hints, (ns, block_id), count)
        return withdrawn

    def _delete(self, s: _Session, a: dict[str, Any]) -> None:
        self.store.delete(a["id"], namespace=a["ns"])

    def _stats(self, s: _Session, a: dict[str, Any]) -> dict[str, Any]:
        return {**self.store.stats(), "serve": self.serve_stats()}

    def serve_stats(self) -> dict[str, Any]:
        """Clients attached now and in all, staging bytes mapped, pins, hints and slab
        leases clients hold, requests answered."""
        with self._lock:
            sessions = list(self._sessions)
            counts = dict(self._counts)
        return {"clients": len(sessions), "clients_total": counts.get("clients_total", 0),
                "requests": counts.get("requests", 0),
                "staging_bytes": sum(s.staging.nbytes for s in sessions if s.staging is not None),
                "client_pins": sum(sum(list(s.pins.values())) for s in sessions),
                "client_hints": sum(sum(list(s.hints.values())) for s in sessions),
                "client_leases": sum(s.leased for s in sessions)}

    # -- shutdown -------------------------------------------------------------------------
    def close(self, timeout: float = 30.0) -> None:
        """Stop accepting, hang up on every client (each sees the rank gone at once) and
        wait up to ``timeout`` seconds for their threads to give back what they held.
        Local; idempotent. Call it before closing the store."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            sessions = list(self._sessions)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        for session in sessions:
            try:
                session.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._acceptor.join(timeout)
        for session in sessions:
            if session.thread is not None:
                session.thread.join(timeout)
        still = [s.pid for s in sessions if s.thread is not None and s.thread.is_alive()]
        if still:
            log.warning("rank %d: requests of client(s) %s still running after %.0f s", self.rank, still, timeout)


def _hints_used(s: _Session, namespace: str, block_ids: list[str], hits: list[bool]) -> None:
    """A read uses up a hint of the block (ours, if we hold one)."""
    for block_id, hit in zip(block_ids, hits):
        if hit and s.hints[(namespace, block_id)]:
            _take(s.hints, (namespace, block_id), 1)


def _take(held: Counter[tuple[str, str]], block: tuple[str, str], n: int) -> None:
    """Take ``n`` off a session's count of ``block``, forgetting it at zero (a long-lived
    session keeps no entry for every block it ever pinned or hinted)."""
    held[block] -= n
    if held[block] <= 0:
        del held[block]


def _slot(value: Any) -> int:
    """A staging slot named in a request: an int (a float such as 1.7 is refused, not cut)."""
    if type(value) is not int:
        raise InvalidBlock(f"a staging slot is an integer, got {value!r}")
    return value


_OPS = {
    "put": RankServer._put, "put_many": RankServer._put_many, "get_many_into": RankServer._get_many_into,
    "view_many": RankServer._view_many,
    "contains_many": RankServer._contains_many, "pin": RankServer._pin, "unpin": RankServer._unpin,
    "hint": RankServer._hint, "unhint": RankServer._unhint, "delete": RankServer._delete,
    "stats": RankServer._stats,
}
