"""Cascade's error hierarchy.

Every error derives from :class:`CascadeError` and also from the matching built-in, so
callers can catch what they already know (``KeyError``, ``ValueError``, ``OSError``).

Errors that mean "treat as a cache miss and recompute": :class:`BlockNotFound`,
:class:`CorruptBlock` (the store counts it and drops the record), :class:`TierFull`
(the block stays where it was or is not cached).
"""
from __future__ import annotations


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


class TierFull(CascadeError, OSError):
    """A tier has no room for a block even after eviction (or the device is full)."""


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
