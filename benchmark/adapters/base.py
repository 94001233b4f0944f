"""The one interface every compared storage system is driven through.

A benchmark block is a pair of byte buffers (the K and the V tensor of a cache column)
stored under a 32-hex-character block id. An adapter drives one real system: it starts
what that system needs in :meth:`StorageAdapter.initialize` (a server on 127.0.0.1, a
file, an in-process store), stores and fetches blocks through the system's own client
API, and stops everything it started in :meth:`StorageAdapter.close`.

Errors: :class:`AdapterUnavailable` means "this system cannot run here" (a missing
package, binary or library, a server that did not come up); runners and tests report
it with its reason and skip the system. It is never a reason to substitute anything
else for the system. Every other exception is a real failure of the system under test.

Adapters are not thread-safe unless their docstring says so; each rank of a benchmark
drives its own adapter instance (local, never collective).
"""
from __future__ import annotations

import abc
import os
import shutil
import signal
import socket
import subprocess
import time
from typing import ClassVar

from cascade import buffers
from cascade.testing.children import die_with_parent

#: A writable buffer (bytearray, numpy array, memoryview of either) or a readable one.
Buffer = bytes | bytearray | memoryview

__all__ = [
    "AdapterUnavailable",
    "die_with_parent",
    "process_rank",
    "start_server",
    "StorageAdapter",
    "byte_view",
    "writable_view",
    "free_loopback_port",
    "stop_process",
    "wait_for_port",
]


class AdapterUnavailable(Exception):
    """The system cannot start on this machine; ``str(exc)`` says why, for a human.

    Raised by :meth:`StorageAdapter.initialize` (and by :func:`benchmark.adapters.load_adapter`
    when the adapter's module cannot even be imported). A test skips with this reason;
    a benchmark records the system as not run, with this reason.
    """


def process_rank() -> int:
    """This process' rank from the launcher's environment (0 without one).

    Adapters use it to name per-rank files without importing MPI.
    """
    for var in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        value = os.environ.get(var)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def byte_view(buf, what: str = "buffer") -> memoryview:
    """A flat, C-contiguous byte view of host buffer ``buf`` (numpy, torch CPU, bytes...)
    without copying; :class:`~cascade.errors.InvalidBlock` otherwise (cascade.buffers)."""
    return buffers.as_byte_view(buf, what)


def writable_view(buf, what: str = "buffer") -> memoryview:
    """Like :func:`byte_view`, and the buffer must be writable."""
    return buffers.as_byte_view(buf, what, writable=True)


class StorageAdapter(abc.ABC):
    """One real storage system behind the benchmark's block interface.

    Life cycle: construct (cheap, starts nothing) -> :meth:`initialize` once ->
    :meth:`prepare` for the block size to come (optional) -> any number of
    put/get/... -> :meth:`close` (idempotent; also run by ``with``).

    Semantics every adapter keeps (``tests/test_adapters.py`` checks them):

    * ``put`` stores the pair under ``block_id``; putting an id that is present leaves
      one copy (content-addressed ids mean the bytes are the same).
    * ``get`` returns ``(key, value)`` byte-exact, or ``None`` on a miss.
    * ``get_into`` fills caller buffers of exactly the stored sizes and returns ``True``,
      or returns ``False`` on a miss; a size mismatch raises ``ValueError``.
    * A system with eviction (``has_eviction``) may forget a block after a put
      that overflowed ``capacity_bytes``; that shows up as a miss, never as wrong bytes.
    """

    #: Registry name of the adapter (``load_adapter(name)``).
    name: ClassVar[str] = ""
    #: True when the system drops blocks by itself once ``capacity_bytes`` is used.
    has_eviction: ClassVar[bool] = False
    #: True when one store holds blocks of one size with key and value of equal size
    #: (a KV-cache store sized for one model); a put of another size starts afresh.
    uniform_blocks: ClassVar[bool] = False

    def __init__(self) -> None:
        self.capacity_bytes: int = 0
        self.data_dir: str = ""
        self._initialized = False

    # -- life cycle -------------------------------------------------------------------
    @abc.abstractmethod
    def initialize(self, capacity_bytes: int, data_dir: str) -> None:
        """Start the system with room for ``capacity_bytes`` of block data.

        ``data_dir`` is the shared benchmark directory; file-backed systems keep their
        files under it (one aggregated file or directory per adapter and rank).
        Raises :class:`AdapterUnavailable` with a human reason when the system cannot
        start. Subclasses call ``super().initialize`` first.
        """
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)
        self.data_dir = os.fspath(data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        self._initialized = True

    def prepare(self, block_bytes: int) -> None:
        """Set up what depends on the block size, before any timed call: blocks of
        ``block_bytes`` (key + value) follow. Nothing to do for most systems (they start
        whole in :meth:`initialize`); one that sizes its store by the first put (Cascade's
        SHM slab, prefaulted) opens it here, so no put pays for it."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop every process and release every file or memory the adapter opened.

        Idempotent; never raises for an adapter that failed half-way through
        :meth:`initialize`.
        """

    def __enter__(self) -> "StorageAdapter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- blocks -----------------------------------------------------------------------
    @abc.abstractmethod
    def put(self, block_id: str, key: Buffer, value: Buffer) -> None:
        """Store the block ``(key, value)`` under ``block_id``."""

    @abc.abstractmethod
    def get(self, block_id: str) -> tuple[bytes, bytes] | None:
        """The stored ``(key, value)`` as bytes, or ``None`` on a miss."""

    @abc.abstractmethod
    def get_into(self, block_id: str, key_out: Buffer, value_out: Buffer) -> bool:
        """Copy the stored block into the caller's buffers; ``False`` on a miss.

        The buffers must be writable, C-contiguous and of exactly the stored sizes
        (``ValueError`` otherwise). This is the read path the benchmark times: each
        adapter documents the copies its system's API forces on the way.
        """

    @abc.abstractmethod
    def contains(self, block_id: str) -> bool:
        """Whether the block is stored now (a lookup only, no data moved)."""

    @abc.abstractmethod
    def delete(self, block_id: str) -> None:
        """Remove the block; a missing id is not an error."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Remove every block this adapter stored (the system keeps running)."""

    def drop_process_cache(self) -> None:
        """Forget what this process itself caches of the stored blocks (e.g. HDF5's chunk
        cache), so that a cold read after the page cache was dropped reaches storage.
        Nothing to do for most systems."""

    def flush(self) -> None:
        """Wait until every completed ``put`` reached the system's lowest tier.

        Systems that write behind (LMCache's disk backend) finish their queued writes
        here; a benchmark's put phase ends with one ``flush`` inside the timed region.
        The default does nothing (the put was already complete).
        """

    # -- reporting --------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        """Versions of the system's parts, for the result file (``{}`` if unknown)."""
        return {}

    def server_pids(self) -> list[int]:
        """PIDs of the server processes this adapter started and will stop (``[]``: none)."""
        return []

    def describe(self) -> dict[str, object]:
        """Configuration worth recording beside a result (no secrets)."""
        return {
            "name": self.name,
            "capacity_bytes": self.capacity_bytes,
            "has_eviction": self.has_eviction,
            "data_dir": self.data_dir,
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} capacity={self.capacity_bytes}>"

    # -- helpers shared by adapters ---------------------------------------------------
    @staticmethod
    def _check_sizes(block_id: str, key_out: memoryview, value_out: memoryview,
                     key_len: int, value_len: int) -> None:
        if key_out.nbytes != key_len or value_out.nbytes != value_len:
            raise ValueError(
                f"block {block_id}: stored sizes are key={key_len} value={value_len} bytes, "
                f"buffers are key={key_out.nbytes} value={value_out.nbytes}"
            )


# ---------------------------------------------------------------------------------------
# Process helpers for adapters that start a server. Servers bind 127.0.0.1 only and are
# stopped by their own PID, never by name.


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the usual bind-0 trick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen | None, timeout: float,
                  what: str, log_path: str | None = None) -> None:
    """Wait until 127.0.0.1:``port`` accepts connections.

    Raises :class:`AdapterUnavailable` (with the tail of ``log_path``) when ``proc``
    exits first or ``timeout`` seconds pass.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AdapterUnavailable(
                f"{what} exited with status {proc.returncode} before listening on "
                f"127.0.0.1:{port}{_log_tail(log_path)}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise AdapterUnavailable(
        f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s{_log_tail(log_path)}"
    )


def _log_tail(log_path: str | None, nbytes: int = 1500) -> str:
    if not log_path or not os.path.exists(log_path):
        return ""
    with open(log_path, "rb") as f:
        f.seek(max(0, os.path.getsize(log_path) - nbytes))
        tail = f.read().decode(errors="replace").strip()
    return f"; its log ends with:\n{tail}" if tail else ""


def start_server(args: list[str], log_path: str, env: dict[str, str] | None = None
                 ) -> subprocess.Popen:
    """Start a server process we own: its output goes to ``log_path``, it gets its own
    session (a terminal's Ctrl-C does not reach it) and SIGTERM when the thread that
    started it dies, so a crashed benchmark does not leave it running. Stop it with
    :func:`stop_process`."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=die_with_parent)


def stop_process(proc: subprocess.Popen | None, timeout: float = 5.0) -> None:
    """Stop a server we started: SIGTERM to its PID, SIGKILL if it lingers, then reap."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        pass


def which(program: str, *extra_dirs: str) -> str | None:
    """``shutil.which`` that also looks in ``extra_dirs`` (e.g. the venv's bin)."""
    found = shutil.which(program)
    if found:
        return found
    for d in extra_dirs:
        cand = os.path.join(d, program)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None
