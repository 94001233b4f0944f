"""Where a node's rank sockets live, and which one a client attaches to.

Each ``cascade serve`` rank listens on ``<socket dir>/r<rank>.sock``. The socket
directory is node-local and private (0700, owned by the user, checked like every other
Cascade directory): ``/tmp/cascade-<uid>``, plus ``/j<SLURM_JOB_ID>`` inside a SLURM job so
two jobs of one user on a node never share sockets. (Not ``$XDG_RUNTIME_DIR``: batch steps
and engine workers often lack it, and every process of the job must derive one path.) A Unix socket path must fit ``sun_path`` (108 bytes
with its NUL on Linux): a longer one is refused with :class:`ConfigError` naming a
shorter place, never silently truncated. Pure functions, no MPI.
"""
from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping

from ..errors import ConfigError, RankFailure
from ..tiers.private_dir import ensure_private_dir

#: Longest usable socket path in bytes (Linux ``sun_path`` is 108 bytes with the NUL).
MAX_SOCKET_PATH = 107
_SOCKET_RE = re.compile(r"^r(\d+)\.sock$")


def default_socket_dir(env: Mapping[str, str] = os.environ) -> str:
    """The socket directory ``cascade serve`` and ``connect("auto")`` use by default."""
    base = f"/tmp/cascade-{os.getuid()}"
    job = env.get("SLURM_JOB_ID")
    return os.path.join(base, f"j{job}") if job else base


def socket_path(socket_dir: str, rank: int) -> str:
    """``<socket_dir>/r<rank>.sock``; :class:`ConfigError` if it cannot fit ``sun_path``."""
    path = os.path.join(os.path.abspath(socket_dir), f"r{rank}.sock")
    check_length(path)
    return path


def check_length(path: str) -> None:
    """:class:`ConfigError` when ``path`` is too long for a Unix socket address."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ConfigError(
            f"socket path {path} is {len(os.fsencode(path))} bytes; Unix sockets allow at most "
            f"{MAX_SOCKET_PATH}: pass a shorter --socket-dir (e.g. /tmp/cascade-{os.getuid()})")


def prepare_socket_dir(socket_dir: str) -> str:
    """Create ``socket_dir`` 0700 (or check an existing one is private); its absolute path."""
    return ensure_private_dir(socket_dir, key="socket_dir")


def rank_sockets(socket_dir: str) -> list[str]:
    """The ``r<rank>.sock`` paths in ``socket_dir``, by rank (live or stale)."""
    try:
        names = os.listdir(socket_dir)
    except OSError:
        return []
    found = sorted((int(m.group(1)), name) for name in names if (m := _SOCKET_RE.match(name)))
    return [os.path.join(socket_dir, name) for _, name in found]


def is_listening(path: str) -> bool:
    """Whether a process accepts connections on the Unix socket ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def resolve_endpoint(endpoint: str, *, worker: int = 0, socket_dir: str | None = None) -> list[str]:
    """Socket paths to try, in order, for ``endpoint``: a path is itself; ``"auto"`` is
    every rank socket of this node's job, starting at number ``worker`` (mod their count)
    so the workers of an engine spread over the node's ranks. :class:`RankFailure` when
    ``auto`` finds no socket (no ``cascade serve`` rank on this node)."""
    if endpoint != "auto":
        check_length(os.path.abspath(endpoint))
        return [endpoint]
    directory = socket_dir or default_socket_dir()
    paths = rank_sockets(directory)
    if not paths:
        raise RankFailure(f"no Cascade rank socket (r<rank>.sock) in {directory}: is `cascade serve` running "
                          "on this node (same SLURM job), or is its --socket-dir another one?")
    start = worker % len(paths)
    return paths[start:] + paths[:start]
