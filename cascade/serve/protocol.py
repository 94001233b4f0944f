"""The local channel between a ``cascade serve`` rank and its clients.

One Unix stream socket per client. Every message is a frame: 4 bytes little-endian
length, then a UTF-8 JSON object. Block bytes never travel here: they sit in the
client's staging region (:mod:`.staging`), and requests name slots of it.

* The client opens with ``{"op": "hello", "version", "staging_bytes"}``; the rank replies
  with its block spec, rank, world size, ``block_tokens``, slot layout and ``slab_bytes``,
  then sends one byte carrying the staging region's file descriptor and, when
  ``slab_bytes`` is not 0, a read-only one of its SHM slab (``SCM_RIGHTS``).
* A request is ``{"op": ..., args}``; its reply ``{"ok": true, "result": ...}`` or
  ``{"ok": false, "error": <CascadeError subclass name>, "message": ...}``, which the
  client raises as that same class. One request at a time per connection.

Ops: ``put`` (one slot), ``put_many`` (slots), ``get_many_into`` (slots), ``view_many``
(ids: leased slab offsets, ``"staged"`` into slot i, or None; the leases last until the
next request), ``contains_many``, ``pin``, ``unpin``, ``hint``, ``unhint``, ``delete``,
``stats``.
"""
from __future__ import annotations

import json
import socket
import struct
from typing import Any

from .. import errors
from ..distributed.agree import PeerStepFailed
from ..distributed.directory import DirectoryFull, PinUnderflow

VERSION = 2
MAX_FRAME = 16 << 20  # a request names at most a few thousand 32-hex ids
# A block adds at most 64 bytes to a frame (a quoted 32-hex id and a slot number to a
# request; an id, two slab offsets or a bool to its reply): a batch of at most MAX_BATCH
# blocks passes MAX_FRAME neither in its request nor in its reply.
MAX_BATCH = MAX_FRAME // 64
_LEN = struct.Struct("<I")
_ERRORS: dict[str, type[errors.CascadeError]] = {
    cls.__name__: cls for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, errors.CascadeError)
}
_ERRORS.update({cls.__name__: cls for cls in (PeerStepFailed, DirectoryFull, PinUnderflow)})


class ChannelClosed(ConnectionError):
    """The other end closed the socket (or it broke) mid-conversation."""


def encode(message: dict[str, Any]) -> bytes:
    """One frame of ``message``. :class:`~cascade.errors.InvalidBlock` when it would pass
    :data:`MAX_FRAME` (the peer would refuse it and hang up): nothing is sent then."""
    body = json.dumps(message, separators=(",", ":"), default=str).encode()
    if len(body) > MAX_FRAME:
        raise errors.InvalidBlock(f"a message of {len(body)} bytes passes the {MAX_FRAME}-byte frame limit: "
                                  f"split it into smaller calls")
    return _LEN.pack(len(body)) + body


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    """Send one frame (the whole of it, or raise ``OSError``; see :func:`encode`)."""
    sock.sendall(encode(message))


def recv(sock: socket.socket) -> dict[str, Any]:
    """Receive one frame. :class:`ChannelClosed` on EOF (also mid-frame: a partial
    request is never acted on); ``ValueError`` for a malformed one."""
    (length,) = _LEN.unpack(_recv_exactly(sock, _LEN.size))
    if length > MAX_FRAME:
        raise ValueError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    try:
        message = json.loads(_recv_exactly(sock, length))
    except RecursionError:  # nested past the parser's depth: no request of ours is
        raise ValueError("a frame nested too deeply") from None
    if not isinstance(message, dict):
        raise ValueError("a frame must hold a JSON object")
    return message


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ChannelClosed("end of stream")
        got += k
    return bytes(buf)


def error_reply(exc: BaseException) -> dict[str, Any]:
    """The reply carrying ``exc`` (a non-Cascade error travels as plain CascadeError)."""
    name = type(exc).__name__ if isinstance(exc, errors.CascadeError) else "CascadeError"
    return {"ok": False, "error": name if name in _ERRORS else "CascadeError", "message": str(exc)}


def raise_error(reply: dict[str, Any]) -> None:
    """Raise the error a reply carries, as the same :class:`CascadeError` subclass."""
    cls = _ERRORS.get(str(reply.get("error")), errors.CascadeError)
    raise cls(str(reply.get("message", "")))
