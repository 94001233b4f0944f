"""PIDs for tests and the fault campaign."""
from __future__ import annotations

import os
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
