"""Fault-injection campaign: inject each fault many times, count what was lost or served wrong.

``python -m benchmark.fault_campaign [--rounds N] [--out DIR]`` prints a table and writes
``benchmark/results/cascade_faults_1n_{timestamp}.json``. Per fault: how often it was
injected, faults detected, acknowledged blocks lost (for blocks whose put had reached the
file tier, or that the store said it held: must be 0), wrong bytes served (must be 0),
hangs (a call or job that did not end within its time limit: must be 0), and the time
to recover (reopen and index rebuild, or the end of a job with a dead rank). Mount-based
faults need root. Ctrl-C during a get is not in the campaign yet: it needs the store's
resource guards (issue 18), which are not on main.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from cascade import CascadeStore, Config, block_id
from cascade.errors import BlockNotFound, TierFull
from cascade.testing import interrupted_reader, mpich_segments
from cascade.testing.pids import invisible_pid
from cascade.tiers.shm import ShmPeerSlabs

from .results import results_dir, write_results


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


def _torn_records(d: str) -> int:
    """Torn records the file tier in ``d`` finds when it opens (a torn record stays in its
    file: every later open finds it again)."""
    with CascadeStore(_file_cfg(d)) as s:
        return s.stats()["tiers"]["file"]["torn_records"]


def sigkill_mid_put(rounds: int, rnd: random.Random, d: str) -> dict[str, Any]:
    """SIGKILL a writer of the file-tier store in ``d`` mid-put, ``rounds`` times, each
    followed by a reopen that checks every acknowledged block; ``detected`` sums the torn
    records each kill left (those found at its reopen and not before its writer started)."""
    acked: dict[str, int] = {}
    lost = wrong = torn = 0
    recover = []
    seed = 0
    for _ in range(rounds):
        before = _torn_records(d)
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
            torn += s.stats()["tiers"]["file"]["torn_records"] - before
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


_CALL_LIMIT_S = 60.0  # a single store call (close included) past this counts as a hang
_JOB_LIMIT_S = 120  # a multi-rank job past this counts as a hang


def _ends(fn, limit: float = _CALL_LIMIT_S) -> bool:
    """Run ``fn`` in a thread; False when it did not return within ``limit`` (a hang)."""
    worker = threading.Thread(target=fn, daemon=True)
    worker.start()
    worker.join(limit)
    return not worker.is_alive()


def full_disk_churn(rounds: int, rnd: random.Random, base: str, ops_per_round: int = 600) -> dict[str, Any]:
    """Per round: a store whose file tier sits on a 512 KiB tmpfs churns (puts that
    evict and demote, gets that promote, deletes) until and while the disk is full, then
    restarts. Counted: gets and deletes that raised, blocks the store said it held but
    could not serve (lost), wrong bytes (a deleted block served counts too), closes that
    hung, deleted or evicted blocks served again after the restart (resurrected)."""
    name = "full disk mid-churn (file tier on a 512 KiB tmpfs)"
    if os.geteuid() != 0:
        return {"fault": name, "skipped": "needs root to mount a small tmpfs"}
    lost = wrong = raised = hangs = resurrected = detected = ops = rejected = 0
    recover = []
    for _ in range(rounds):
        mnt = tempfile.mkdtemp(prefix="fault-full-", dir=base)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", mnt], check=True)
        try:
            cfg = Config(model="tiny", shm_bytes=8 * 4096, file_bytes=56 * 8192, file_dir=mnt + "/agg",
                         shm_dir=mnt + "/shm", file_segment_bytes=1 << 20)
            s = CascadeStore(cfg)
            data: dict[str, int] = {}
            gone: set[str] = set()
            seed = 0
            for _ in range(ops_per_round):
                ops += 1
                roll = rnd.random()
                if roll < 0.6 or not data:
                    try:
                        data[s.put(*_block(s.spec, seed))] = seed
                    except TierFull:  # allowed: nothing stored, nothing lost
                        rejected += 1
                    seed += 1
                    continue
                bid = rnd.choice(list(data))
                try:
                    if roll < 0.85:
                        held = s.contains(bid)
                        got = s.get(bid)
                        lost += held and got is None
                        wrong += _wrong(got, _block(s.spec, data[bid])) or (bid in gone and got is not None)
                    elif s.contains(bid):
                        s.delete(bid)
                        gone.add(bid)
                except Exception:  # a get or delete must never fail on a full disk
                    raised += 1
            lustre = s.stats()["tiers"]["file"]
            detected += int(lustre["full_events"] + lustre.get("compactions_deferred", 0) > 0)
            gone |= {bid for bid in data if not s.contains(bid)}  # evicted: must stay gone
            hangs += not _ends(s.close)
            t0 = time.perf_counter()
            with CascadeStore(cfg) as again:
                recover.append(time.perf_counter() - t0)
                for bid in data:
                    got = again.get(bid)
                    resurrected += bid in gone and got is not None
                    wrong += _wrong(got, _block(again.spec, data[bid]))
        finally:
            subprocess.run(["umount", "-l", mnt], check=False)
    return {"fault": name, "injected": rounds, "operations": ops, "acked_blocks": None, "acked_lost": lost,
            "wrong_served": wrong, "detected": detected, "hangs": hangs, "raised": raised,
            "resurrected": resurrected, "puts_rejected": rejected, "recover_s": max(recover)}


_HOLDER = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); "
           "print('locked', flush=True); sys.stdin.read()")


def foreign_slab_owner(rounds: int, base: str) -> dict[str, Any]:
    """Per round: a live SHM slab whose owner's PID is not visible here (a store of
    another PID namespace sharing the directory; its lock held by another process) sits
    beside a store that opens: the store must keep it (removed counts as lost, changed
    bytes as wrong). Then the owner goes: the next store removes the slab as stale, and
    a peer read of it is a miss (an exception, or a slab left behind, counts as raised)."""
    kept = lost = wrong = raised = hangs = 0
    for _ in range(rounds):
        d = tempfile.mkdtemp(prefix="fault-slab-", dir=base)
        slab = os.path.join(d, f"cascade-{invisible_pid()}-{secrets.token_hex(16)}")
        content = secrets.token_bytes(1 << 16)
        Path(slab).write_bytes(content)
        holder = subprocess.Popen([sys.executable, "-c", _HOLDER, slab], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        cfg = Config(model="tiny", shm_bytes=64 * 4096, file_bytes=0, shm_dir=d)
        try:
            holder.stdout.readline()
            with CascadeStore(cfg) as s:
                s.put(*_block(s.spec, 1))
            present = os.path.exists(slab)
            kept += present
            lost += not present
            wrong += present and Path(slab).read_bytes() != content
        finally:
            holder.stdin.close()
            try:
                holder.wait(timeout=_CALL_LIMIT_S)
            except subprocess.TimeoutExpired:
                hangs += 1
                holder.kill()
        with CascadeStore(cfg):
            pass  # its owner is gone: the slab is stale now
        peers = ShmPeerSlabs()
        try:
            peers.read_into(slab, 0, [bytearray(64)])
            raised += 1  # read a slab that should have been cleaned up
        except BlockNotFound:
            pass
        except Exception:
            raised += 1
        finally:
            peers.close()
    return {"fault": "a foreign SHM slab owner (PID of another namespace, flock held)", "injected": rounds,
            "acked_blocks": rounds, "acked_lost": lost, "wrong_served": wrong, "detected": kept, "hangs": hangs,
            "raised": raised, "recover_s": 0.0}


def ctrl_c_mid_get(rounds: int, rnd: random.Random, base: str) -> dict[str, Any]:
    """Per round: a process reading in a loop inside ``with CascadeStore(...)`` (blocks
    moving between SHM and file tiers) gets SIGINT at a random moment: it must end (a
    hang is a process still alive after the call limit) with KeyboardInterrupt as its last
    error (another one, e.g. ``BlockNotFound`` from a torn move, counts as raised), its
    slab must go, and a store opened afterwards must serve only correct bytes (its file
    tier kept what close kept)."""
    detected = hangs = raised = wrong = 0
    started = time.perf_counter()
    for _ in range(rounds):
        d = tempfile.mkdtemp(prefix="fault-sigint-", dir=base)
        files, shm = os.path.join(d, "files"), os.path.join(d, "shm")
        os.makedirs(shm, mode=0o700)
        proc = subprocess.Popen([sys.executable, "-m", "cascade.testing.interrupted_reader", files, shm],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdout.readline()
        time.sleep(rnd.uniform(0.0, 0.2))
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=_CALL_LIMIT_S)
            detected += "KeyboardInterrupt" in err
            raised += not err.rstrip().endswith("KeyboardInterrupt")
        except subprocess.TimeoutExpired:
            hangs += 1
            proc.kill()
            proc.communicate()
        raised += bool(os.listdir(shm))  # a slab left behind
        with CascadeStore(interrupted_reader.config(files, shm)) as s:
            for i in range(interrupted_reader.BLOCKS):
                expected = interrupted_reader.block(s.spec, i)
                got = s.get(block_id(*expected))
                wrong += got is not None and _wrong(got, expected)
    return {"fault": "Ctrl-C (SIGINT) during gets inside with CascadeStore", "injected": rounds, "acked_blocks": 0,
            "acked_lost": 0, "wrong_served": wrong, "detected": detected, "hangs": hangs, "raised": raised,
            "recover_s": (time.perf_counter() - started) / rounds}


def _mpi_job(cmd: list[str], timeout: float) -> subprocess.CompletedProcess | None:
    """Run an mpiexec job; None when it hangs past ``timeout``. The MPICH segments a rank
    it killed left in ``/dev/shm`` are removed (2 per suite repetition were left before)."""
    before = mpich_segments.segments()
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        mpich_segments.remove_orphans(before)


def _rank_job(d: str, module: str, phase: str) -> tuple[subprocess.CompletedProcess | None, float]:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = [mpiexec, "-n", "4", sys.executable, "-m", "mpi4py", "-m", module, d, phase]
    t0 = time.perf_counter()
    return _mpi_job(cmd, _JOB_LIMIT_S), time.perf_counter() - t0  # (None: a hang)


def rank_open_failure(rounds: int) -> dict[str, Any]:
    """Per round: in a 4-rank job one rank's part of the collective open fails (another
    tier holds its file-tier lock). Detected: every rank raised, each naming the failing
    rank or the cause; then the same job opens the store and reads back what it puts."""
    detected = wrong = hangs = 0
    end_s = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="fault-open-") as d:
            out, took = _rank_job(d, "benchmark.fault_rank_job", "open_fail")
            end_s.append(took)
            if out is None:
                hangs += 1
                continue
            lines = out.stdout.strip().splitlines()
            if out.returncode != 0 or not lines:
                raise RuntimeError(f"open_fail job failed ({out.returncode}): {out.stderr[-800:]}")
            report = json.loads(lines[-1])
            detected += report["raised"] == report["named"] == report["reopened"] == 4
            wrong += report["wrong"]
    return {"fault": "a rank failing at the collective open (4 ranks)", "injected": rounds, "acked_blocks": None,
            "acked_lost": None, "wrong_served": wrong, "detected": detected, "hangs": hangs,
            "recover_s": max(end_s)}


def rank_close_death(rounds: int) -> dict[str, Any]:
    """Per round: a 4-rank job puts into the file tier, then rank 2 SIGKILLs itself just
    before the collective close. Detected: the job ends with an error (no hang); a fresh
    job then reads every acknowledged block."""
    detected = hangs = acked = missing = wrong = 0
    end_s, restart_s = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="fault-close-") as d:
            out, took = _rank_job(d, "benchmark.fault_rank_job", "close_death")
            end_s.append(took)
            hangs += out is None
            detected += out is not None and out.returncode != 0
            ids_path = Path(d) / "ids.json"
            acked += sum(len(ids) for ids in json.loads(ids_path.read_text())) if ids_path.exists() else 0
            back, took = _rank_job(d, "cascade.testing.rank_failure_job", "read")
            restart_s.append(took)
            if back is None or back.returncode != 0:
                raise RuntimeError(f"restart job failed: {back.stderr[-800:] if back else 'hung'}")
            report = json.loads(back.stdout.strip().splitlines()[-1])
            missing += report["missing"]
            wrong += report["wrong"]
    return {"fault": "a rank SIGKILLed just before the collective close (4 ranks)", "injected": rounds,
            "acked_blocks": acked, "acked_lost": missing, "wrong_served": wrong, "detected": detected,
            "hangs": hangs, "job_end_s": max(end_s), "recover_s": max(restart_s)}


def dead_rank(rounds: int) -> dict[str, Any]:
    """Per round: a 4-rank job writes, rank 2 SIGKILLs itself; a fresh job reads back.
    Counted, not assumed: acknowledged blocks are the ids the job saved after every put
    returned; a fault is detected when the job ends with an error instead of hanging."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    fail_s, restart_s, codes = [], [], []
    wrong = missing = acked = detected = recovered = 0
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="fault-rank-") as d:
            cmd = [mpiexec, "-n", "4", sys.executable, "-m", "mpi4py", "-m", "cascade.testing.rank_failure_job", d]
            t0 = time.perf_counter()
            crashed = _mpi_job([*cmd, "write"], 120)
            codes.append(None if crashed is None else crashed.returncode)  # None: a hang, an undetected failure
            detected += crashed is not None and crashed.returncode != 0
            fail_s.append(time.perf_counter() - t0)
            ids_path = Path(d) / "ids.json"
            saved = json.loads(ids_path.read_text()) if ids_path.exists() else []
            acked += sum(len(ids) for ids in saved)
            t0 = time.perf_counter()
            out = _mpi_job([*cmd, "read"], 120)
            restart_s.append(time.perf_counter() - t0)
            lines = out.stdout.strip().splitlines() if out is not None else []
            if out is None or out.returncode != 0 or not lines:
                raise RuntimeError(f"restart job failed: {out.stderr[-800:] if out else 'hung'}")
            report = json.loads(lines[-1])
        wrong += report["wrong"]
        missing += report["missing"]
        recovered += report["recovered"]
    return {"fault": "a rank SIGKILLed in a 4-rank job, then a restart", "injected": rounds,
            "acked_blocks": acked, "acked_lost": missing, "wrong_served": wrong, "detected": detected,
            "hangs": codes.count(None),
            "recovered_records": recovered, "job_returncodes": codes,
            "job_end_s": max(fail_s), "recover_s": max(restart_s)}


FAULTS = ("sigkill", "byte_flips", "header", "shm_flips", "enospc", "full_disk_churn", "foreign_slab",
          "ctrl_c", "dead_rank", "rank_open_failure", "rank_close_death")


def campaign(rounds: int, faults: tuple[str, ...] = FAULTS, seed: int = 2026) -> list[dict[str, Any]]:
    """Run the selected faults ``rounds`` times each (byte flips 4x; ENOSPC, full-disk
    churn and the multi-rank faults rounds/5, at least once), with a progress bar naming
    the fault that runs; every temporary file is removed afterwards."""
    rnd = random.Random(seed)
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}; choose from {', '.join(FAULTS)}")
    few = max(1, rounds // 5)
    runs = {"sigkill": lambda b: sigkill_mid_put(rounds, rnd, tempfile.mkdtemp(prefix="fault-kill-", dir=b)),
            "byte_flips": lambda b: byte_flips(4 * rounds, rnd, b),
            "header": lambda b: header_and_truncation(rounds, rnd, b), "shm_flips": lambda b: shm_flips(rounds, rnd),
            "enospc": lambda b: enospc(few, b), "full_disk_churn": lambda b: full_disk_churn(few, rnd, b),
            "foreign_slab": lambda b: foreign_slab_owner(rounds, b), "ctrl_c": lambda b: ctrl_c_mid_get(few, rnd, b),
            "dead_rank": lambda b: dead_rank(few),
            "rank_open_failure": lambda b: rank_open_failure(few), "rank_close_death": lambda b: rank_close_death(few)}
    selected = [name for name in FAULTS if name in faults]
    rows = []
    with tempfile.TemporaryDirectory(prefix="fault-campaign-") as base, \
            tqdm(selected, desc="faults", unit="fault") as bar:
        for name in bar:
            bar.set_postfix_str(name)
            rows.append(runs[name](base))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma list of {', '.join(FAULTS)}")
    p.add_argument("--out", help="results directory (default benchmark/results)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    if not faults:
        p.error(f"--faults names no fault; choose from {', '.join(FAULTS)}")
    try:
        out = results_dir(args.out)
    except OSError as exc:
        p.error(f"--out {args.out}: cannot write results there ({exc.strerror or exc})")
    try:
        rows = campaign(args.rounds, faults)
    except ValueError as exc:
        p.error(str(exc))
    path = write_results("cascade", "faults", {"rows": rows}, config={"rounds": args.rounds, "faults": args.faults}, directory=out)
    print("| fault | injected | detected | acked blocks lost | wrong bytes served | hangs | calls raised "
          "| deleted blocks back after restart | time to recover |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['fault']} | skipped: {r['skipped']} | | | | | | | |")
            continue
        lost = "n/a" if r["acked_lost"] is None else r["acked_lost"]
        detected = r["detected"] if "expected_detections" not in r else f"{r['detected']} of {r['expected_detections']} records hit"
        print(f"| {r['fault']} | {r['injected']} | {detected} | {lost} | {r['wrong_served']} | {r.get('hangs', 0)} "
              f"| {r.get('raised', 'n/a')} | {r.get('resurrected', 'n/a')} | {r['recover_s']:.3f} s |")
    print(f"results: {path}")
    clean = all(r.get("wrong_served", 0) == 0 and not r.get("acked_lost") and not r.get("hangs")
                and not r.get("raised") and not r.get("resurrected") for r in rows)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
