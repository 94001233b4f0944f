"""Child processes that do not outlive whoever started them."""
from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for a server or job we start: it gets SIGTERM when the thread that
    started it dies (Linux ``PR_SET_PDEATHSIG``), so a test run or benchmark killed from
    outside (SIGKILL, a CI timeout) leaves nothing running. A no-op where ``prctl`` is
    missing."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
