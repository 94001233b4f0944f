"""Fault-injection campaign: inject each fault many times, count what was lost or served wrong.

``python -m benchmark.fault_campaign [--rounds N] [--out DIR]`` prints a table and writes
``benchmark/results/cascade_faults_1n_{timestamp}.json``. Per fault: how often it was
injected, acknowledged blocks lost (for blocks whose put had reached the file tier: must
be 0), wrong bytes served (must be 0), faults detected, and the time to recover (reopen
and index rebuild, or the end of a job with a dead rank). Mount-based faults need root.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

from cascade import CascadeStore, Config

from .results import write_results


# blocks acknowledged before each fault is injected
FLIP_BLOCKS = 400  # byte_flips: one file-tier store
HEADER_BLOCKS = 150  # header: per round
SHM_BLOCKS = 200  # shm_flips


def _block(spec, seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(spec.shape).astype(spec.dtype), rng.standard_normal(spec.shape).astype(spec.dtype)


def _wrong(got, expected) -> bool:
    return got is not None and not (np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]))


def _file_cfg(d: str, **kw) -> Config:
    return Config(**{"model": "tiny", "shm_bytes": 0, "file_bytes": 1 << 30, "file_dir": d,
                     "file_segment_bytes": 1 << 20, **kw})


_WRITER = textwrap.dedent("""
    import sys, numpy as np
    from cascade import CascadeStore, Config
    s = CascadeStore(Config(model="tiny", shm_bytes=0, file_bytes=1 << 30, file_dir=sys.argv[1], file_segment_bytes=1 << 20))
    i = int(sys.argv[2])
    while True:
        rng = np.random.default_rng(i)
        k = rng.standard_normal(s.spec.shape).astype(s.spec.dtype); v = rng.standard_normal(s.spec.shape).astype(s.spec.dtype)
        print(i, s.put(k, v), flush=True); i += 1
""")


def sigkill_mid_put(rounds: int, rnd: random.Random, base: str) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix="fault-kill-", dir=base)
    acked: dict[str, int] = {}
    lost = wrong = 0
    recover = []
    seed = 0
    for _ in range(rounds):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, d, str(seed)], stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + rnd.uniform(0.3, 1.0)
        for line in proc.stdout:
            i, bid = line.split()
            acked[bid] = int(i)
            if time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for line in proc.stdout:
            if len(parts := line.split()) == 2:
                acked[parts[1]] = int(parts[0])
        seed = max(acked.values()) + 1
        t0 = time.perf_counter()
        with CascadeStore(_file_cfg(d)) as s:
            recover.append(time.perf_counter() - t0)
            for bid, i in acked.items():
                got = s.get(bid)
                lost += got is None
                wrong += _wrong(got, _block(s.spec, i))
            torn = s.stats()["tiers"]["file"]["torn_records"]
    return {"fault": "SIGKILL of a writer mid-put", "injected": rounds, "acked_blocks": len(acked),
            "acked_lost": lost, "wrong_served": wrong, "detected": torn, "recover_s": max(recover)}


def _filled_store(d: str, n: int):
    s = CascadeStore(_file_cfg(d))
    ids = {s.put(*_block(s.spec, i)): i for i in range(n)}
    return s, ids


def byte_flips(rounds: int, rnd: random.Random, base: str) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix="fault-flip-", dir=base)
    s, ids = _filled_store(d, FLIP_BLOCKS)
    files = sorted(Path(d).glob("agg_rank000_*.bin"))
    flipped_records = set()
    for _ in range(rounds):  # flip one payload byte of a random record
        f = rnd.choice([p for p in files if p.stat().st_size])
        record = rnd.randrange(f.stat().st_size // 8192)
        flipped_records.add((f.name, record))
        with open(f, "r+b") as fh:
            fh.seek(record * 8192 + 4096 + rnd.randrange(4096))
            b = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([b[0] ^ (1 << rnd.randrange(8))]))
    wrong = sum(_wrong(s.get(bid), _block(s.spec, i)) for bid, i in ids.items())
    detected = s.stats()["tiers"]["file"]["corruptions"]
    s.close()
    return {"fault": "bit flip in an aggregated file's payload", "injected": rounds, "acked_blocks": len(ids),
            "acked_lost": None, "wrong_served": wrong, "detected": detected,
            "expected_detections": len(flipped_records), "recover_s": 0.0}


def header_and_truncation(rounds: int, rnd: random.Random, base: str) -> dict[str, Any]:
    wrong = detected = acked = 0
    recover = []
    for _ in range(rounds):
        d = tempfile.mkdtemp(prefix="fault-hdr-", dir=base)
        s, ids = _filled_store(d, HEADER_BLOCKS)
        acked += len(ids)
        s.close()
        files = [p for p in sorted(Path(d).glob("agg_rank000_*.bin")) if p.stat().st_size]
        f = rnd.choice(files)
        with open(f, "r+b") as fh:  # break one header
            fh.seek(rnd.randrange(f.stat().st_size // 8192) * 8192 + rnd.randrange(80))
            fh.write(b"\xff")
        g = rnd.choice(files)
        os.truncate(g, g.stat().st_size - rnd.randrange(1, 8192))  # tear the tail
        t0 = time.perf_counter()
        with CascadeStore(_file_cfg(d)) as s:
            recover.append(time.perf_counter() - t0)
            st = s.stats()["tiers"]["file"]
            detected += st["bad_headers"] + st["torn_records"]
            wrong += sum(_wrong(s.get(bid), _block(s.spec, i)) for bid, i in ids.items())
            detected += s.stats()["tiers"]["file"]["corruptions"]
    return {"fault": "broken header + torn tail, index rebuilt at reopen", "injected": 2 * rounds,
            "acked_blocks": acked, "acked_lost": None, "wrong_served": wrong, "detected": detected,
            "recover_s": max(recover)}


def shm_flips(rounds: int, rnd: random.Random) -> dict[str, Any]:
    cfg = Config(model="tiny", shm_bytes=256 * 4096, file_bytes=0, verify_dram_reads=True)
    with CascadeStore(cfg) as s:
        ids = {s.put(*_block(s.spec, i)): i for i in range(SHM_BLOCKS)}
        victims = rnd.sample(list(ids), rounds)
        with open(s.tiers[0].path, "r+b") as fh:
            for bid in victims:
                fh.seek(s.tiers[0].offset(("default", bid)) + rnd.randrange(4096))
                b = fh.read(1)
                fh.seek(-1, 1)
                fh.write(bytes([b[0] ^ 0x10]))
        wrong = sum(_wrong(s.get(bid), _block(s.spec, i)) for bid, i in ids.items())
        detected = s.stats()["tiers"]["shm"]["corruptions"]
    return {"fault": "bit flip in the SHM slab (verify_dram_reads)", "injected": rounds, "acked_blocks": len(ids),
            "acked_lost": None, "wrong_served": wrong, "detected": detected, "recover_s": 0.0}


def enospc(rounds: int, base: str) -> dict[str, Any]:
    if os.geteuid() != 0:
        return {"fault": "ENOSPC on the file tier", "skipped": "needs root to mount a small tmpfs"}
    wrong = rejected = full = 0
    recover = []
    for _ in range(rounds):
        mnt = tempfile.mkdtemp(prefix="fault-enospc-", dir=base)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", mnt], check=True)
        try:
            cfg = Config(model="tiny", shm_bytes=8 * 4096, file_bytes=64 << 20, file_dir=mnt + "/agg")
            with CascadeStore(cfg) as s:
                ids = {}
                for i in range(200):
                    ids[s.put(*_block(s.spec, i))] = i
                full += s.stats()["tiers"]["file"]["full_events"]
                rejected += s.stats()["rejected"]
                subprocess.run(["mount", "-o", "remount,size=16m", mnt], check=True)
                t0 = time.perf_counter()
                before = s.stats()["tiers"]["file"]["blocks"]
                i = 200
                while s.stats()["tiers"]["file"]["blocks"] <= before:  # first demotion that lands
                    ids[s.put(*_block(s.spec, i))] = i
                    i += 1
                recover.append(time.perf_counter() - t0)
                wrong += sum(_wrong(s.get(bid), _block(s.spec, k)) for bid, k in ids.items())
        finally:
            subprocess.run(["umount", "-l", mnt], check=False)
    return {"fault": "ENOSPC on the file tier (tmpfs of 512 KiB)", "injected": rounds, "acked_blocks": None,
            "acked_lost": None, "puts_rejected": rejected, "wrong_served": wrong, "detected": full,
            "recover_s": max(recover)}


def dead_rank(rounds: int) -> dict[str, Any]:
    """Per round: a 4-rank job writes, rank 2 SIGKILLs itself; a fresh job reads back.
    Counted, not assumed: acknowledged blocks are the ids the job saved after every put
    returned; a fault is detected when the job ends with an error instead of hanging."""
    import json

    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    fail_s, restart_s, codes = [], [], []
    wrong = missing = acked = detected = recovered = 0
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="fault-rank-") as d:
            cmd = [mpiexec, "-n", "4", sys.executable, "-m", "mpi4py", "-m", "cascade.testing.rank_failure_job", d]
            t0 = time.perf_counter()
            try:
                crashed = subprocess.run([*cmd, "write"], capture_output=True, text=True, timeout=120)
                codes.append(crashed.returncode)
                detected += crashed.returncode != 0
            except subprocess.TimeoutExpired:  # a hang is an undetected failure
                codes.append(None)
            fail_s.append(time.perf_counter() - t0)
            ids_path = Path(d) / "ids.json"
            saved = json.loads(ids_path.read_text()) if ids_path.exists() else []
            acked += sum(len(ids) for ids in saved)
            t0 = time.perf_counter()
            out = subprocess.run([*cmd, "read"], capture_output=True, text=True, timeout=120)
            restart_s.append(time.perf_counter() - t0)
            lines = out.stdout.strip().splitlines()
            if out.returncode != 0 or not lines:
                raise RuntimeError(f"restart job failed ({out.returncode}): {out.stderr[-800:]}")
            report = json.loads(lines[-1])
        wrong += report["wrong"]
        missing += report["missing"]
        recovered += report["recovered"]
    return {"fault": "a rank SIGKILLed in a 4-rank job, then a restart", "injected": rounds,
            "acked_blocks": acked, "acked_lost": missing, "wrong_served": wrong, "detected": detected,
            "recovered_records": recovered, "job_returncodes": codes,
            "job_end_s": max(fail_s), "recover_s": max(restart_s)}


FAULTS = ("sigkill", "byte_flips", "header", "shm_flips", "enospc", "dead_rank")


def campaign(rounds: int, faults: tuple[str, ...] = FAULTS, seed: int = 2026) -> list[dict[str, Any]]:
    """Run the selected faults ``rounds`` times each (byte flips 4x, ENOSPC and a dead
    rank rounds/5, at least once); every temporary file is removed afterwards."""
    rnd = random.Random(seed)
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}; choose from {', '.join(FAULTS)}")
    few = max(1, rounds // 5)
    runs = {"sigkill": lambda b: sigkill_mid_put(rounds, rnd, b), "byte_flips": lambda b: byte_flips(4 * rounds, rnd, b),
            "header": lambda b: header_and_truncation(rounds, rnd, b), "shm_flips": lambda b: shm_flips(rounds, rnd),
            "enospc": lambda b: enospc(few, b), "dead_rank": lambda b: dead_rank(few)}
    with tempfile.TemporaryDirectory(prefix="fault-campaign-") as base:
        return [runs[name](base) for name in FAULTS if name in faults]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma list of {', '.join(FAULTS)}")
    p.add_argument("--out", help="results directory (default benchmark/results)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    try:
        rows = campaign(args.rounds, tuple(f.strip() for f in args.faults.split(",") if f.strip()))
    except ValueError as exc:
        p.error(str(exc))
    path = write_results("cascade", "faults", {"rows": rows}, config={"rounds": args.rounds, "faults": args.faults}, directory=args.out)
    print("| fault | injected | acked blocks lost | wrong bytes served | detected | time to recover |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['fault']} | skipped: {r['skipped']} | | | | |")
            continue
        lost = "n/a" if r["acked_lost"] is None else r["acked_lost"]
        detected = r["detected"] if "expected_detections" not in r else f"{r['detected']} of {r['expected_detections']} records hit"
        print(f"| {r['fault']} | {r['injected']} | {lost} | {r['wrong_served']} | {detected} | {r['recover_s']:.3f} s |")
    print(f"results: {path}")
    return 0 if all(r.get("wrong_served", 0) == 0 and not r.get("acked_lost") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
