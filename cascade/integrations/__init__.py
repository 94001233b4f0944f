"""Cascade under other serving stacks (optional dependencies, imported on use):
:mod:`cascade.integrations.lmcache_backend` (an LMCache storage plugin)."""
