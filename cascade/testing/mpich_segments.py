"""Shared-memory segments that MPICH leaves in ``/dev/shm`` when a job dies or is killed
before its ranks have all attached (``mpich_shm_*``; a later job that drew the same name
would attach to the stale one). Tests that kill jobs remove what nobody uses any more."""
from __future__ import annotations

import glob
import os
import time

PATTERN = "/dev/shm/mpich_shm_*"


def segments() -> set[str]:
    """The MPICH segments in ``/dev/shm`` now."""
    return set(glob.glob(PATTERN))


def _in_use() -> set[str]:
    """Paths under ``/dev/shm`` that a live process (one this user may inspect) maps or holds open."""
    used: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                used.update(line.split(None, 5)[5].strip() for line in maps if "/dev/shm/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("/dev/shm/"):
                    used.add(target)
        except (OSError, IndexError):
            continue  # ended meanwhile, or not ours to read
    return {p.removesuffix(" (deleted)") for p in used}


def remove_orphans(before: set[str], *, wait_s: float = 5.0) -> list[str]:
    """Remove the segments that appeared since ``before`` (:func:`segments`) and that no
    live process maps or holds open, waiting up to ``wait_s`` for those still in use to
    be let go (the ranks of a job that just ended may still be exiting); a job still
    running keeps its own. The removed paths."""
    new = segments() - before
    deadline = time.monotonic() + wait_s
    while new and new & _in_use() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not new:
        return []
    removed = []
    for path in sorted(new - _in_use()):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed
