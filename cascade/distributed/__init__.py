"""Cascade across ranks: the sharded global directory and the REMOTE tier's windows.

Every class takes its communicator (``comm=``); nothing here uses ``COMM_WORLD``.
mpi4py is imported only when a window is built (install the ``mpi`` extra).
"""
from .directory import ClaimReclaimed, DirectoryEntry, DirectoryFull, PinUnderflow, Removal, ShardedDirectory

__all__ = ["ClaimReclaimed", "DirectoryEntry", "DirectoryFull", "PinUnderflow", "Removal", "ShardedDirectory"]
