"""PIDs for tests and the fault campaign."""
from __future__ import annotations

import os
import time
from pathlib import Path


def invisible_pid() -> int:
    """A PID no process of this PID namespace has: how a store in another container looks."""
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


#: ``python -c SLEEPING_GRANDCHILD PIDFILE``: starts a child that sleeps 120 s, writes
#: that child's PID to PIDFILE, then sleeps 120 s itself (a job with a process below it).
SLEEPING_GRANDCHILD = ("import subprocess, sys, time\n"
                       "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
                       "open(sys.argv[1], 'w').write(str(child.pid))\n"
                       "time.sleep(120)\n")


def written_pid(path: Path, timeout: float = 30.0) -> int:
    """The PID written to ``path`` (waits up to ``timeout`` seconds for it)."""
    end = time.monotonic() + timeout
    while not (path.exists() and path.read_text()) and time.monotonic() < end:
        time.sleep(0.05)
    return int(path.read_text())


def gone(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` has ended (a zombie counts as ended) within ``within`` seconds."""
    end = time.monotonic() + within
    while True:
        try:
            os.kill(pid, 0)
            ended = Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        except (ProcessLookupError, FileNotFoundError):
            ended = True
        if ended or time.monotonic() > end:
            return ended
        time.sleep(0.05)
