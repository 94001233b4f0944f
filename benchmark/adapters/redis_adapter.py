"""Redis: a real ``redis-server`` (Debian package) on 127.0.0.1, driven with redis-py.

The adapter starts its own server on a free loopback port with no persistence
(``--save "" --appendonly no``), ``maxmemory`` = the benchmark capacity plus the empty
server's own ``used_memory`` (measured at start) and
``allkeys-lru`` (so Redis evicts on its own: ``has_eviction``), and stops it by PID at
:meth:`close`. The server's launch options live in ``third_party/redis/redis.conf``;
the port, memory limit and directory are given on the command line. With
``unix_socket=True`` (the registry's ``redis_unix``) the client talks to the server over a
Unix socket in a private directory of its own (mode 0700, short enough for a socket
path), which Redis documents as faster than TCP
loopback; the server still listens on loopback TCP, used only to see it come up.

Block layout: one string key per block, ``<prefix><id>``, whose value is
``uint32 key length || key bytes || value bytes``: Redis' LRU evicts whole blocks (two
keys per block let it evict halves independently). A put is one ``SET`` (the header and
the two buffers written to the socket without joining them in Python); a get is one
``GET``.

Copies on the way (what the protocol forces): put writes the caller's two buffers to
the socket as they are (no copy in Python); get receives the value into a new ``bytes``
(hiredis, pinned in third_party/redis, or redis-py's pure-Python parser without it);
``get_into`` then copies the two halves into the caller's buffers (one extra memcpy per
block).
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import uuid
from pathlib import Path

from .base import (AdapterUnavailable, Buffer, StorageAdapter, byte_view, free_loopback_port,
                   start_server, stop_process, wait_for_port, writable_view)

_CONF = Path(__file__).resolve().parents[2] / "third_party" / "redis" / "redis.conf"
# Redis' own bookkeeping (dict entries, SDS headers, jemalloc rounding) counts against
# maxmemory; a block of two large strings costs a few hundred bytes more than its data.
_STARTUP_TIMEOUT_S = 15.0
_HEADER = struct.Struct("<I")  # key length in front of key || value


class RedisAdapter(StorageAdapter):
    """Blocks in a private ``redis-server`` on loopback. Not thread-safe (one client)."""

    name = "redis"
    has_eviction = True

    def __init__(self, server_binary: str | None = None, unix_socket: bool = False,
                 extra_args: tuple[str, ...] = ()) -> None:
        """``server_binary``: path of redis-server (default: found on PATH);
        ``unix_socket``: talk over a Unix socket in the data dir instead of TCP loopback;
        ``extra_args``: more ``--option value`` words for the server."""
        super().__init__()
        self._binary = server_binary
        self._unix_socket = unix_socket
        self._extra_args = tuple(extra_args)
        self._proc: subprocess.Popen | None = None
        self._client = None
        self._port = 0
        self._prefix = b""
        self._workdir = ""
        self._sockdir = ""
        self._server_version = ""
        self._baseline = 0

    @staticmethod
    def probe() -> str | None:
        """Why this adapter cannot start here, or ``None``."""
        try:
            import redis  # noqa: F401
        except ImportError:
            return "python package 'redis' is missing (pip install -r third_party/redis/requirements.txt)"
        if shutil.which("redis-server") is None:
            return "redis-server is not on PATH (apt-get install redis-server; see third_party/install.sh)"
        return None

    def initialize(self, capacity_bytes: int, data_dir: str) -> None:
        super().initialize(capacity_bytes, data_dir)
        reason = None if self._binary else self.probe()
        if reason:
            raise AdapterUnavailable(reason)
        import redis

        binary = self._binary or shutil.which("redis-server")
        self._workdir = os.path.join(self.data_dir, f"redis_{os.getpid()}_{uuid.uuid4().hex[:8]}")
        os.makedirs(self._workdir, exist_ok=True)
        self._port = free_loopback_port()
        log_path = os.path.join(self._workdir, "redis.log")
        args = [binary]
        if _CONF.exists():
            args.append(str(_CONF))
        args += [
            "--bind", "127.0.0.1",
            "--port", str(self._port),
            "--protected-mode", "yes",
            "--save", "",
            "--appendonly", "no",
            "--maxmemory", str(self.capacity_bytes),
            "--maxmemory-policy", "allkeys-lru",
            "--dir", self._workdir,
            "--logfile", log_path,
            "--daemonize", "no",
        ]
        sock_path = ""
        if self._unix_socket:
            # a socket path must fit sun_path (108 bytes): a private short directory
            self._sockdir = tempfile.mkdtemp(prefix="redis-")
            sock_path = os.path.join(self._sockdir, "redis.sock")
            args += ["--unixsocket", sock_path, "--unixsocketperm", "700"]
        args += list(self._extra_args)
        try:
            self._proc = start_server(args, os.path.join(self._workdir, "stdout.log"))
            wait_for_port(self._port, self._proc, _STARTUP_TIMEOUT_S, "redis-server", log_path)
            if self._unix_socket:
                self._client = redis.Redis(unix_socket_path=sock_path)
            else:
                self._client = redis.Redis(host="127.0.0.1", port=self._port)
            info = self._client.info("server")
            # maxmemory counts the server's own start-up footprint too; give the blocks
            # the benchmark's capacity on top of it (per-key overhead stays counted).
            baseline = int(self._client.info("memory")["used_memory"])
            self._client.config_set("maxmemory", str(self.capacity_bytes + baseline))
            self._baseline = baseline
        except BaseException:
            self.close()
            raise
        self._server_version = str(info.get("redis_version", ""))
        self._prefix = f"blk:{uuid.uuid4().hex[:8]}:".encode()

    def _key(self, block_id: str) -> bytes:
        return self._prefix + block_id.encode()

    def put(self, block_id: str, key: Buffer, value: Buffer) -> None:
        kv, vv = byte_view(key, "key"), byte_view(value, "value")
        name = self._key(block_id)
        total = _HEADER.size + kv.nbytes + vv.nbytes
        # One SET in the Redis protocol, written as chunks straight from the caller's
        # buffers (redis-py's encoder would first join header, key and value).
        head = (b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(name), name, total)
                + _HEADER.pack(kv.nbytes))
        pool = self._client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command([head, kv, vv, b"\r\n"])
            reply = conn.read_response()
        except BaseException:
            conn.disconnect()  # a half-written command must not be reused
            raise
        finally:
            pool.release(conn)
        if reply not in (b"OK", "OK", True):
            raise OSError(f"redis: SET of block {block_id} answered {reply!r}")

    def _fetch(self, block_id: str) -> tuple[memoryview, memoryview] | None:
        raw = self._client.get(self._key(block_id))
        if raw is None:
            return None
        view = memoryview(raw)
        (klen,) = _HEADER.unpack_from(view, 0)
        if _HEADER.size + klen > len(view):
            raise OSError(f"redis: block {block_id} has a malformed header")
        return view[_HEADER.size:_HEADER.size + klen], view[_HEADER.size + klen:]

    def get(self, block_id: str) -> tuple[bytes, bytes] | None:
        got = self._fetch(block_id)
        return None if got is None else (bytes(got[0]), bytes(got[1]))

    def get_into(self, block_id: str, key_out: Buffer, value_out: Buffer) -> bool:
        kv = writable_view(key_out, "key_out")
        vv = writable_view(value_out, "value_out")
        got = self._fetch(block_id)
        if got is None:
            return False
        self._check_sizes(block_id, kv, vv, len(got[0]), len(got[1]))
        kv[:] = got[0]
        vv[:] = got[1]
        return True

    def contains(self, block_id: str) -> bool:
        return self._client.exists(self._key(block_id)) == 1

    def delete(self, block_id: str) -> None:
        self._client.delete(self._key(block_id))

    def clear(self) -> None:
        # The server is private to this adapter, so FLUSHDB removes only our blocks.
        self._client.flushdb()

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:
                pass
            self._client = None
        stop_process(self._proc)
        self._proc = None
        for path in (self._workdir, self._sockdir):
            if path:
                shutil.rmtree(path, ignore_errors=True)
        self._workdir = self._sockdir = ""

    def server_pids(self) -> list[int]:
        return [self._proc.pid] if self._proc is not None else []

    def versions(self) -> dict[str, str]:
        import redis
        out = {"redis-server": self._server_version, "redis-py": redis.__version__}
        try:
            import hiredis
            out["hiredis"] = hiredis.__version__
        except ImportError:  # redis-py falls back to its pure-Python reply parser
            out["hiredis"] = "absent"
        return out

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "port": self._port, "unix_socket": self._unix_socket,
                "maxmemory_policy": "allkeys-lru", "persistence": "off",
                "layout": "one key per block: uint32 key length || key || value",
                "maxmemory": self.capacity_bytes + self._baseline, "startup_used_memory": self._baseline}
