"""Private directories: make sure nobody else can plant or swap files in a cache dir.

The default ``file_dir`` (``$TMPDIR/cascade-<uid>``) has a predictable name under a
world-writable ``/tmp``: another user could create it first and fill it with records.
:func:`ensure_private_dir` creates missing components 0700 and refuses a directory that
is not ours, is writable by group or others, or whose ancestors let someone else rename
it away (writable by others without the sticky bit, or owned by another non-root user).
"""
from __future__ import annotations

import os
import stat

from ..errors import ConfigError

_SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH


def ensure_private_dir(path: str, key: str = "file_dir") -> str:
    """Create ``path`` (and missing parents, mode 0700) and check it is private to the
    current user; returns its absolute path. :class:`ConfigError` naming the fix if not."""
    path = os.path.abspath(path)
    uid = os.geteuid()
    missing: list[str] = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = os.path.dirname(probe)
    if missing and os.path.isdir(probe):  # refuse before creating anything under it
        _check_ancestors(probe, uid, key, path)
    for component in reversed(missing):  # parents first, each 0700 (makedirs gives parents 0777-umask)
        try:
            os.mkdir(component, 0o700)
        except FileExistsError:
            pass  # a concurrent rank created it: checked below like any existing directory
        except OSError as exc:
            raise ConfigError(f"{key}: cannot create {component}: {exc.strerror}; choose another directory") from None
    _check_ancestors(os.path.dirname(path), uid, key, path)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{key}: {path} is a symbolic link; point {key} at the real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{key}: {path} exists and is not a directory; choose another path")
    if st.st_uid != uid:
        raise ConfigError(f"{key}: {path} is owned by uid {st.st_uid}, not by you (uid {uid}): another user "
                          f"could have planted blocks there; choose another directory (set {key})")
    if st.st_mode & _SHARED_WRITE:
        raise ConfigError(f"{key}: {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): "
                          f"run `chmod 700 {path}` or choose another directory")
    return path


def _check_ancestors(directory: str, uid: int, key: str, path: str) -> None:
    """Every existing ancestor must be ours or root's, and writable by others only with
    the sticky bit (like /tmp): else someone else could rename our directory away."""
    current = directory
    while True:
        st = os.stat(current)  # ancestors may be symlinks (e.g. /tmp -> /private/tmp)
        if st.st_uid not in (uid, 0):
            raise ConfigError(f"{key}: {path} lies under {current}, owned by uid {st.st_uid} (not you or root); "
                              f"choose a directory under your own home or scratch space")
        if st.st_mode & _SHARED_WRITE and not st.st_mode & stat.S_ISVTX:
            raise ConfigError(f"{key}: {path} lies under {current}, which others can write without the sticky "
                              f"bit; run `chmod go-w {current}` or choose another directory")
        parent = os.path.dirname(current)
        if parent == current:
            return
        current = parent
