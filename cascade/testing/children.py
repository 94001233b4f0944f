"""Child processes that do not outlive whoever started them."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

_PR_SET_PDEATHSIG = 1
# The watcher: one byte on stdin disarms it; end of file (every writer gone, the
# starter killed) runs the command.
_WATCHER = "import subprocess, sys\nif not sys.stdin.buffer.read(1):\n    subprocess.run(sys.argv[1:])\n"


def die_with_parent() -> None:
    """``preexec_fn`` for a server or job we start: it gets SIGTERM when the thread that
    started it dies (Linux ``PR_SET_PDEATHSIG``), so a test run or benchmark killed from
    outside (SIGKILL, a CI timeout) leaves nothing running. A no-op where ``prctl`` is
    missing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class CleanupIfKilled:
    """Runs ``argv`` (e.g. a stop script) if this process ends before :meth:`disarm`:
    for servers that daemonize, which :func:`die_with_parent` cannot reach. A watcher
    process in its own session waits on a pipe only this process holds open; a SIGKILL
    closes it, and the watcher runs the command. Use as a context manager around the
    start and the normal stop: leaving the ``with`` block disarms it."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        read_end, self._write_end = os.pipe()  # (not inherited by other children: only the watcher reads it)
        try:
            self._watcher = subprocess.Popen([sys.executable, "-c", _WATCHER, *argv], stdin=read_end,
                                             env=None if env is None else dict(env), start_new_session=True,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)

    def disarm(self) -> None:
        """Stop the watcher without running the command (idempotent)."""
        if self._write_end < 0:
            return
        try:
            os.write(self._write_end, b"0")
        except BrokenPipeError:
            pass  # the watcher is gone already (killed): nothing left to stop
        finally:
            os.close(self._write_end)
            self._write_end = -1
        self._watcher.wait(timeout=30)

    def __enter__(self) -> "CleanupIfKilled":
        return self

    def __exit__(self, *exc: object) -> None:
        self.disarm()
