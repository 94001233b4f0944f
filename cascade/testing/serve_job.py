"""Start and stop a local ``cascade serve`` job (``mpiexec -n N python -m mpi4py -m
cascade serve``) for tests and benchmarks: a private short socket directory, the ranks'
PIDs from their ready lines, stop by PID (SIGTERM to one rank stops them all; mpiexec's
process group is killed if that is not enough). mpiexec gets SIGTERM when the thread that
started the job dies (:func:`~.children.die_with_parent`), and stops its ranks."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence

from . import mpich_segments
from .children import die_with_parent

_READY = re.compile(r"cascade serve: rank (\d+)/\d+ \(pid (\d+)\) on node (\d+) serves")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ServeJob:
    """``ranks`` ranks (as ``nodes`` emulated nodes: MPICH's ``MPIR_CVAR_NUM_CLIQUES``)
    of ``cascade serve --block-bytes block_bytes`` with an SHM tier of ``shm`` per rank in
    ``shm_dir`` (default: under ``workdir``), no file tier; ``settings`` are further ``--set KEY=VALUE``. Returns once
    every rank listens (AssertionError with the job's output if not within ``wait``)."""

    def __init__(self, workdir: str, ranks: int, nodes: int = 1, *, block_bytes: int = 8192, shm: str = "16M",
                 shm_dir: str | None = None, settings: Sequence[str] = (), wait: float = 90) -> None:
        self.ranks = ranks
        self.socket_dir = tempfile.mkdtemp(prefix="cs-", dir="/tmp")  # short: sun_path holds 107 bytes
        if shm_dir is None:
            shm_dir = os.path.join(workdir, "shm")
            os.makedirs(shm_dir, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": ROOT}
        if nodes > 1:
            env["MPIR_CVAR_NUM_CLIQUES"] = str(nodes)
        self._mpich_before = mpich_segments.segments()
        sets = [f"shm_bytes={shm}", "file_bytes=0", f"shm_dir={shm_dir}", f"file_dir={os.path.join(workdir, 'files')}",
                *settings]
        self.proc = subprocess.Popen(
            [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "cascade", "serve",
             "--socket-dir", self.socket_dir, "--block-bytes", str(block_bytes),
             *[arg for s in sets for arg in ("--set", s)]],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
            preexec_fn=die_with_parent)  # a killed test run or benchmark leaves no job behind
        self.lines: list[str] = []
        self.pids: dict[int, int] = {}
        self.nodes: dict[int, int] = {}
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(wait) or len(self.pids) < ranks:
            self.stop()
            raise AssertionError("cascade serve did not come up:\n" + "".join(self.lines[-40:]))

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            # mpiexec interleaves the ranks' output: one rank's newline may come after the
            # next rank's line, so the ready lines are matched in the text without newlines
            for m in _READY.finditer("".join(self.lines).replace("\n", "")):
                rank = int(m.group(1))
                self.pids[rank], self.nodes[rank] = int(m.group(2)), int(m.group(3))
            if len(self.pids) == self.ranks:
                self._ready.set()
        self._ready.set()

    def socket(self, rank: int) -> str:
        return os.path.join(self.socket_dir, f"r{rank}.sock")

    def stop_rank(self, rank: int, timeout: float = 60) -> int:
        """SIGTERM one rank (every rank then stops); the job's exit code."""
        os.kill(self.pids[rank], signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """Stop the job: SIGTERM a rank, and kill mpiexec's session if that is not enough."""
        if self.proc.poll() is None:
            try:
                if self.pids:
                    os.kill(next(iter(self.pids.values())), signal.SIGTERM)
                self.proc.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        mpich_segments.remove_orphans(self._mpich_before)  # what a killed job left
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def __enter__(self) -> "ServeJob":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
