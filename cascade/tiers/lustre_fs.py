"""Parallel-file-system helpers: detect Lustre and set a directory's striping."""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import shutil
import subprocess

log = logging.getLogger(__name__)
LUSTRE_SUPER_MAGIC = 0x0BD00BD0


def fs_magic(path: str) -> int | None:
    """``statfs(path).f_type`` (the file system's magic number), or None if unknown."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return None
    libc = ctypes.CDLL(libc_name, use_errno=True)
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on x86_64/aarch64
    if libc.statfs(os.fsencode(path), buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def is_lustre(path: str) -> bool:
    """Whether ``path`` lives on a Lustre file system (statfs magic 0x0BD00BD0)."""
    return fs_magic(path) == LUSTRE_SUPER_MAGIC


def set_striping(directory: str, stripe_count: int, stripe_size: int) -> bool:
    """Run ``lfs setstripe -c COUNT -S SIZE directory`` when it is on Lustre.

    Files created afterwards inherit the layout. Returns whether striping was set; on a
    non-Lustre directory it does nothing and returns False.
    """
    if not is_lustre(directory):
        return False
    lfs = shutil.which("lfs")
    if lfs is None:
        log.warning("%s is on Lustre but `lfs` is not on PATH: default striping kept", directory)
        return False
    cmd = [lfs, "setstripe", "-c", str(stripe_count), "-S", str(stripe_size), directory]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        log.warning("`%s` failed: %s", " ".join(cmd), result.stderr.strip())
        return False
    log.info("striped %s: %s", directory, " ".join(cmd[2:]))
    return True
