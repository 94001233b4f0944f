"""Engines attach to their node's Cascade rank (DESIGN.md section 3b).

``cascade serve`` (:mod:`.rank`) runs the ranks of a Cascade job, each serving local
clients (:mod:`.server`); an engine process calls :func:`connect` (:mod:`.client`) and
gets an object with the store's API. Bytes cross through shared memory (:mod:`.staging`),
requests through a Unix socket (:mod:`.protocol`, paths in :mod:`.paths`).
"""
from .client import CascadeClient, connect

__all__ = ["CascadeClient", "connect"]
