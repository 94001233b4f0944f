"""Benchmark workloads: each module exposes ``run(options) -> dict`` (JSON-able)."""
