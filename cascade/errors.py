"""Cascade's error hierarchy.

Every error derives from :class:`CascadeError` and also from the matching built-in, so
callers can catch what they already know (``KeyError``, ``ValueError``, ``OSError``).

Errors that mean "treat as a cache miss and recompute": :class:`BlockNotFound`,
:class:`CorruptBlock` (the store counts it and drops the record; an
:class:`UnreadableBlock`, a read that failed, it counts and keeps), :class:`TierFull`
(the block stays where it was or is not cached).
"""
from __future__ import annotations

import errno


class CascadeError(Exception):
    """Base class of every error Cascade raises on purpose."""


class ConfigError(CascadeError, ValueError):
    """An unknown configuration key, a value of the wrong type, or an invalid value."""


class BlockNotFound(CascadeError, KeyError):
    """No block with this id in this namespace (a cache miss: recompute)."""

    def __str__(self) -> str:  # KeyError quotes its argument; a message reads better
        return str(self.args[0]) if self.args else "block not found"


class InvalidBlock(CascadeError, ValueError):
    """A key or value of the wrong dtype, shape, layout or size, or a malformed id."""


class CorruptBlock(CascadeError, OSError):
    """A stored record failed its checksum or was truncated (served as a miss)."""


class UnreadableBlock(CorruptBlock):
    """A tier's read of a block failed with an I/O error (EIO and the like): served as a
    miss, as a corrupt block is, but kept (counted in ``read_errors``, not dropped): its
    bytes were not found bad, and a later read may succeed."""


class TierFull(CascadeError, OSError):
    """A tier has no room for a block even after eviction (or the device is full)."""


class TierWriteError(TierFull):
    """A tier's write failed with an I/O error other than a full device (EIO and the
    like): the put stored nothing, as with :class:`TierFull` (a subclass: callers that
    take TierFull as "not cached" need no change), but no room is lacking."""


#: The errnos of a full device: a write failing with one is :class:`TierFull`.
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def put_error(exc: BaseException, where: str) -> BaseException:
    """What a failed put raises for ``exc``: an ``OSError`` not ours as :class:`TierFull`
    (a full device) or :class:`TierWriteError` (any other I/O error), naming ``where``;
    anything else as it is."""
    if not isinstance(exc, OSError) or isinstance(exc, TierFull):
        return exc
    kind = TierFull if exc.errno in FULL_ERRNOS else TierWriteError
    error = kind(f"{where}: {exc}")
    error.__cause__ = exc
    return error


def lacks_room(exc: BaseException) -> bool:
    """Whether a failed write's ``exc`` says that room is lacking (counted as a full event)."""
    return (isinstance(exc, TierFull) and not isinstance(exc, TierWriteError)) or (
        isinstance(exc, OSError) and exc.errno in FULL_ERRNOS)


class BlockPinned(CascadeError, RuntimeError):
    """An operation needs a block unpinned (e.g. delete of a pinned block)."""


class RankFailure(CascadeError, RuntimeError):
    """Another rank of the job died or stopped answering; the job must stop."""


class LaunchError(CascadeError, RuntimeError):
    """The process layout is wrong (e.g. SLURM_NTASKS != MPI world size)."""


class StoreClosed(CascadeError, RuntimeError):
    """The store was closed: open a new one to use it again."""


class CloseTimeout(CascadeError, TimeoutError):
    """``close()`` waited its bound for operations still moving data; the message names
    them. The store stays closed to new calls; call ``close()`` again once they end."""
