"""Mooncake Store (PyPI wheel ``mooncake-transfer-engine-non-cuda``) over TCP on loopback.

The adapter starts the wheel's own ``mooncake_master`` binary (RPC, HTTP metadata
server and admin/metrics port all on 127.0.0.1, flags in
``third_party/mooncake/mooncake_master.flags``), then creates one in-process
``MooncakeDistributedStore`` client that mounts a global segment of ``capacity_bytes``
(the memory this client contributes to the store) and talks ``protocol="tcp"`` with
``MC_TCP_BIND_ADDRESS=127.0.0.1``. The master evicts on its own when the segments pass
its high watermark (``has_eviction``); a put that finds no space while eviction catches
up is retried for ``put_retry_s`` and then raises ``OSError(ENOSPC)``.

Network isolation: Mooncake 0.3.13 binds three listeners to the wildcard address
whatever it is told (the master's HTTP metadata server, the client's handshake daemon
and its TCP data port). With ``isolate="auto"`` (default) the adapter therefore starts
the master and the client on one worker thread that first moves itself into a private
network namespace holding only a loopback interface (``unshare(CLONE_NEWNET)``, needs
CAP_SYS_ADMIN); block operations run on the caller's own thread, which enters that
namespace with ``setns`` for the call (no thread hop on the timed path). Nothing Mooncake
opens is then reachable from outside the process, and the benchmark's other sockets are
untouched. Without the capability,
``auto`` falls back to the host namespace with a warning recorded in :meth:`describe`;
``isolate="netns"`` makes that fallback an :class:`AdapterUnavailable` instead.

Block layout: one Mooncake object per block, ``key bytes || value bytes``, written with
``batch_put_from_multi_buffers`` straight from the caller's two buffers and read with
``batch_get_into_multi_buffers`` straight into the caller's two buffers (no Python-side
copy), with the sizes of those buffers: a get is one call, without asking the master
for the object's size first (that is asked only after a failed read, to tell a size
mismatch from a miss). Inside Mooncake, a put copies the data into the segment (memcpy when the segment
is local, which Mooncake auto-detects on a TCP-only machine, else a TCP transfer) and a
get copies it out the same way. ``transfer="tcp"`` sets ``MC_STORE_MEMCPY=0`` so even
the local segment is reached over the loopback TCP transport (what a remote node sees).
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import fcntl
import os
import shutil
import socket
import struct
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from .base import (AdapterUnavailable, Buffer, StorageAdapter, byte_view, free_loopback_port,
                   start_server, stop_process, wait_for_port, writable_view)

_FLAGS = Path(__file__).resolve().parents[2] / "third_party" / "mooncake" / "mooncake_master.flags"
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_ERR_NOT_FOUND = -704       # OBJECT_NOT_FOUND
_ERR_NO_SPACE = (-200,)     # NO_AVAILABLE_HANDLE: segments full, eviction pending
_STARTUP_TIMEOUT_S = 20.0
_MIN_SEGMENT = 16 << 20  # client_buffer_allocation: "Total size must be at least 16777216"


def _package_dir() -> str | None:
    try:
        import mooncake
    except ImportError:
        return None
    return os.path.dirname(mooncake.__file__)


def _master_binary() -> str | None:
    pkg = _package_dir()
    if pkg:
        cand = os.path.join(pkg, "mooncake_master")  # the ELF itself, not the pip wrapper
        if os.access(cand, os.X_OK):
            return cand
    return shutil.which("mooncake_master")


def _enter_private_netns() -> None:
    """Move the calling thread into a new network namespace and bring its loopback up."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET): {os.strerror(err)}")


class _Runner:
    """Runs Mooncake calls in the adapter's network namespace.

    Start-up and shut-down run on one dedicated thread (which, when ``isolate``, moved
    itself into a private namespace first: the master and Mooncake's own threads are
    born there). Block operations (:meth:`direct`) run on the caller's thread, which
    enters that namespace with ``setns`` for the call and returns to its own after it:
    two system calls instead of a hop to another thread and back per operation.
    """

    def __init__(self, isolate: bool) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="mooncake",
            initializer=_enter_private_netns if isolate else None)
        self._netns_fd: int | None = None
        self._home = threading.local()
        if isolate:
            try:
                self._netns_fd = self(lambda: os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC))
            except BaseException:
                self._pool.shutdown(wait=False)
                raise

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._pool.submit(fn, *args).result()

    def direct(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on this thread, inside the runner's network namespace."""
        if self._netns_fd is None:
            return fn(*args)
        home = getattr(self._home, "fd", None)
        if home is None:
            home = self._home.fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        _setns(self._netns_fd)
        try:
            return fn(*args)
        finally:
            _setns(home)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


# Mooncake keeps process-wide RPC client pools whose I/O threads live in the network
# namespace they were started in, so every Mooncake client of this process must run in
# the same namespace: one isolated runner per process, created on first use and kept.
_isolated_runner: _Runner | None = None
_isolated_error: Exception | None = None
_isolated_lock = threading.Lock()


def _shared_isolated_runner() -> _Runner:
    """The process' runner thread in its private netns; raises the setup error if any."""
    global _isolated_runner, _isolated_error
    with _isolated_lock:
        if _isolated_runner is None and _isolated_error is None:
            try:  # runs the initializer; fails without CAP_SYS_ADMIN
                _isolated_runner = _Runner(isolate=True)
            except Exception as exc:  # BrokenThreadPool carrying the OSError
                _isolated_error = exc
        if _isolated_runner is None:
            raise _isolated_error  # type: ignore[misc]
        return _isolated_runner


class MooncakeAdapter(StorageAdapter):
    """Blocks in a Mooncake Store with a private master. Not thread-safe."""

    name = "mooncake"
    has_eviction = True

    def __init__(self, local_buffer_bytes: int = 64 << 20, transfer: str = "auto",
                 isolate: str = "auto", put_retry_s: float = 2.0,
                 extra_master_flags: tuple[str, ...] = ()) -> None:
        """``local_buffer_bytes``: the client's registered transfer buffer;
        ``transfer``: ``"auto"`` (Mooncake's choice: memcpy for a local segment) or
        ``"tcp"`` (force the TCP transport, ``MC_STORE_MEMCPY=0``); ``isolate``:
        ``"auto"``, ``"netns"`` or ``"none"`` (see the module doc); ``put_retry_s``: how
        long a put waits for eviction to free space; ``extra_master_flags``: more
        ``--flag=value`` words for ``mooncake_master``."""
        super().__init__()
        if transfer not in ("auto", "tcp"):
            raise ValueError(f"transfer must be 'auto' or 'tcp', got {transfer!r}")
        if isolate not in ("auto", "netns", "none"):
            raise ValueError(f"isolate must be 'auto', 'netns' or 'none', got {isolate!r}")
        self._buffer_bytes = int(local_buffer_bytes)
        self._transfer = transfer
        self._isolate = isolate
        self._put_retry_s = float(put_retry_s)
        self._extra_flags = tuple(extra_master_flags)
        self._run: _Runner | None = None
        self._own_runner = False
        self._isolation = "none"
        self._proc = None
        self._store = None
        self._workdir = ""
        self._ports: dict[str, int] = {}
        self._key_len: dict[str, int] = {}
        self._prefix = ""
        self._version = ""

    @staticmethod
    def probe() -> str | None:
        pkg = _package_dir()
        if pkg is None:
            return ("python package 'mooncake' is missing (pip install -r "
                    "third_party/mooncake/requirements.txt)")
        if _master_binary() is None:
            return f"mooncake_master is neither in {pkg} nor on PATH"
        import ctypes.util
        if ctypes.util.find_library("ibverbs") is None:
            return ("libibverbs is missing (apt-get install libibverbs1): the Mooncake "
                    "transfer engine loads it even for TCP")
        try:
            from mooncake.store import MooncakeDistributedStore  # noqa: F401
        except ImportError as exc:
            return f"mooncake.store does not import: {exc}"
        return None

    # -- life cycle -------------------------------------------------------------------
    def initialize(self, capacity_bytes: int, data_dir: str) -> None:
        super().initialize(capacity_bytes, data_dir)
        reason = self.probe()
        if reason:
            raise AdapterUnavailable(reason)
        if self.capacity_bytes < _MIN_SEGMENT:
            raise AdapterUnavailable(f"Mooncake mounts segments of at least {_MIN_SEGMENT >> 20} MiB; "
                                     f"capacity {self.capacity_bytes} bytes is below that")
        # Read by the transfer engine when the client is set up (in this process).
        os.environ["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"
        if self._transfer == "tcp":
            os.environ["MC_STORE_MEMCPY"] = "0"
        else:
            os.environ.pop("MC_STORE_MEMCPY", None)
        self._workdir = os.path.join(self.data_dir, f"mooncake_{os.getpid()}_{uuid.uuid4().hex[:8]}")
        os.makedirs(self._workdir, exist_ok=True)
        try:
            self._start_runner()
            self._run(self._start)
        except BaseException:
            self.close()
            raise
        self._prefix = f"b{uuid.uuid4().hex[:6]}:"

    def _start_runner(self) -> None:
        self._own_runner = False
        if self._isolate != "none":
            try:
                self._run = _shared_isolated_runner()
                self._isolation = "private network namespace (loopback only)"
                return
            except Exception as exc:
                if self._isolate == "netns":
                    raise AdapterUnavailable(
                        f"cannot create a private network namespace for Mooncake ({exc}); "
                        "Mooncake 0.3.13 listens on the wildcard address") from exc
                self._isolation = (f"none: {exc}; Mooncake's metadata, handshake and data "
                                   "ports listen on the wildcard address")
        self._run = _Runner(isolate=False)
        self._own_runner = True

    def _start(self) -> None:
        """On the runner thread: start the master, then set up the client."""
        from mooncake.store import MooncakeDistributedStore

        ports = self._ports = {k: free_loopback_port() for k in ("rpc", "http", "metrics")}
        log_path = os.path.join(self._workdir, "mooncake_master.log")
        args = [_master_binary()]
        if _FLAGS.exists():
            args.append(f"--flagfile={_FLAGS}")
        args += [
            "--rpc_address=127.0.0.1", f"--rpc_port={ports['rpc']}",
            "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={ports['http']}",
            "--metrics_host=127.0.0.1", f"--metrics_port={ports['metrics']}",
            *self._extra_flags,
        ]
        self._proc = start_server(args, log_path)
        wait_for_port(ports["rpc"], self._proc, _STARTUP_TIMEOUT_S, "mooncake_master", log_path)
        wait_for_port(ports["http"], self._proc, _STARTUP_TIMEOUT_S, "mooncake_master", log_path)
        store = MooncakeDistributedStore()
        rc = store.setup("127.0.0.1", f"http://127.0.0.1:{ports['http']}/metadata",
                         self.capacity_bytes, self._buffer_bytes, "tcp", "",
                         f"127.0.0.1:{ports['rpc']}")
        if rc != 0:
            raise AdapterUnavailable(f"MooncakeDistributedStore.setup returned {rc} "
                                     f"(master log: {log_path})")
        self._store = store

    def close(self) -> None:
        run = self._run
        if run is not None:
            def _stop() -> None:
                if self._store is not None:
                    try:
                        self._store.remove_all(True)
                        self._store.close()
                    finally:
                        self._store = None
                stop_process(self._proc)
                self._proc = None
            try:
                run(_stop)
            finally:
                if self._own_runner:
                    run.shutdown()
                self._run = None
        stop_process(self._proc)  # a master left by a failed start
        self._proc = None
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = ""
        self._key_len.clear()

    # -- blocks -----------------------------------------------------------------------
    def _name(self, block_id: str) -> str:
        return self._prefix + block_id

    def put(self, block_id: str, key: Buffer, value: Buffer) -> None:
        kv = byte_view(key, "key")
        vv = byte_view(value, "value")
        bufs = [kv, vv] if kv.nbytes else [vv]
        # Pointers of the caller's buffers; the views keep them alive for the call.
        ptrs = [_address(b) for b in bufs]
        sizes = [b.nbytes for b in bufs]
        name = self._name(block_id)
        deadline = time.monotonic() + self._put_retry_s
        delay = 1e-3
        while True:
            rc = self._run.direct(self._store.batch_put_from_multi_buffers, [name], [ptrs], [sizes])[0]
            if rc == 0:
                self._key_len[block_id] = kv.nbytes
                return
            if rc not in _ERR_NO_SPACE or time.monotonic() > deadline:
                break
            time.sleep(delay)  # the master evicts in the background
            delay = min(delay * 2, 50e-3)
        if rc in _ERR_NO_SPACE:
            raise OSError(errno.ENOSPC, f"mooncake: no space for block {block_id} "
                                        f"after {self._put_retry_s} s (error {rc})")
        raise OSError(errno.EIO, f"mooncake: put of block {block_id} failed with error {rc}")

    def _split(self, block_id: str) -> tuple[int, int] | None:
        """(key, value) sizes of a stored block from the master (one RPC), or None."""
        total = self._run.direct(self._store.get_size, self._name(block_id))
        if total < 0:
            return None
        klen = self._key_len.get(block_id, total // 2)
        return klen, total - klen

    def get(self, block_id: str) -> tuple[bytes, bytes] | None:
        sizes = self._split(block_id)
        if sizes is None:
            return None
        key, value = bytearray(sizes[0]), bytearray(sizes[1])
        return (bytes(key), bytes(value)) if self._read(block_id, key, value) else None

    def get_into(self, block_id: str, key_out: Buffer, value_out: Buffer) -> bool:
        """One ``batch_get_into_multi_buffers`` call with the sizes the caller already
        knows (its buffers); only a failed read asks the master for the stored size, to
        tell a size mismatch (``ValueError``) from a miss."""
        kv = writable_view(key_out, "key_out")
        vv = writable_view(value_out, "value_out")
        rc = self._read_rc(block_id, kv, vv)
        if rc >= 0:
            if rc != kv.nbytes + vv.nbytes:
                raise ValueError(f"block {block_id}: read {rc} bytes into buffers of {kv.nbytes + vv.nbytes}")
            return True
        sizes = self._split(block_id)
        if sizes is None:
            return False
        self._check_sizes(block_id, kv, vv, *sizes)
        if rc == _ERR_NOT_FOUND:
            return False
        raise OSError(errno.EIO, f"mooncake: get of block {block_id} failed with error {rc}")

    def _read_rc(self, block_id: str, kv: memoryview, vv: memoryview) -> int:
        bufs = [kv, vv] if kv.nbytes else [vv]
        return self._run.direct(self._store.batch_get_into_multi_buffers, [self._name(block_id)],
                                [[_address(b) for b in bufs]], [[b.nbytes for b in bufs]])[0]

    def _read(self, block_id: str, key_out, value_out) -> bool:
        rc = self._read_rc(block_id, memoryview(key_out), memoryview(value_out))
        if rc == _ERR_NOT_FOUND:  # evicted between the size lookup and the read
            return False
        if rc < 0:
            raise OSError(errno.EIO, f"mooncake: get of block {block_id} failed with error {rc}")
        return True

    def contains(self, block_id: str) -> bool:
        return self._run.direct(self._store.is_exist, self._name(block_id)) == 1

    def delete(self, block_id: str) -> None:
        # force: skip the read lease, as a cache's explicit invalidation does
        self._run.direct(self._store.remove, self._name(block_id), True)
        self._key_len.pop(block_id, None)

    def clear(self) -> None:
        self._run.direct(self._store.remove_all, True)
        self._key_len.clear()

    # -- reporting --------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        from importlib import metadata
        try:
            return {"mooncake-transfer-engine-non-cuda":
                    metadata.version("mooncake-transfer-engine-non-cuda")}
        except metadata.PackageNotFoundError:
            return {}

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "protocol": "tcp", "transfer": self._transfer,
                "local_buffer_bytes": self._buffer_bytes, "ports": dict(self._ports),
                "network_isolation": self._isolation, "master_flags": str(_FLAGS)}

    def server_pids(self) -> list[int]:
        return [self._proc.pid] if self._proc is not None else []


def _address(view: memoryview) -> int:
    """Address of a C-contiguous buffer's first byte (no copy)."""
    if view.nbytes == 0:
        return 0
    if view.readonly:
        # ctypes refuses read-only buffers; the store only reads from put's sources.
        import numpy as np
        return int(np.frombuffer(view, np.uint8).ctypes.data)
    return ctypes.addressof(ctypes.c_char.from_buffer(view))
