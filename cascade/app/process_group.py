"""Commands whose processes all end with them: :func:`run_in_group` (the local launcher
of ``cascade run --ranks``, and the benchmark suite's runs)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence


def run_in_group(cmd: Sequence[str], *, timeout: float | None, grace: float = 10.0, capture_output: bool = False,
                 stop: int = signal.SIGTERM, **popen: object) -> subprocess.CompletedProcess | None:
    """``subprocess.run(cmd, timeout=timeout, **popen)`` whose processes all go with it:
    the command starts a session of its own, and on a timeout (returns None) or an
    exception in the caller (e.g. Ctrl-C, or SIGTERM made a ``SystemExit``: re-raised)
    every process of that session gets ``stop``, then SIGKILL after ``grace`` seconds.
    A plain ``subprocess.run`` timeout kills only the direct child, leaving the ranks of
    an ``mpiexec`` or a server it started running."""
    if capture_output:
        popen.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)  # type: ignore[call-overload]
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_group(proc, grace, stop)
        return None
    except BaseException:
        _end_group(proc, grace, stop)
        raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def _end_group(proc: subprocess.Popen, grace: float, stop: int) -> None:
    """``stop`` to ``proc``'s process group; SIGKILL to what is left of it after ``grace``
    seconds; then reap ``proc`` and close its pipes."""
    _signal_group(proc, stop)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _signal_group(proc, 0):
        time.sleep(0.05)
    _signal_group(proc, signal.SIGKILL)
    proc.communicate()


def _signal_group(proc: subprocess.Popen, sig: int) -> bool:
    """Send ``sig`` to ``proc``'s process group (0: only ask whether one is left);
    False when none of it is left (``proc`` itself reaped first)."""
    proc.poll()
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return False
    return True
