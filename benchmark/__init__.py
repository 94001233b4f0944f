"""Cascade's benchmark harness: adapters for every compared system, workloads, runner.

``benchmark.adapters`` drives each real system (Cascade, LMCache, Redis, HDF5, Mooncake
Store, PDC) through one small interface; ``python -m benchmark.adapters`` reports which
of them run on this machine. Results go to ``benchmark/results/`` (DESIGN.md section 6).
"""
