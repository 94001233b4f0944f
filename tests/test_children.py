"""CleanupIfKilled: a stop command runs when its starter is killed, and never after a disarm;
run_in_group: a command that times out or is interrupted takes its whole process group with it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cascade.app.process_group import run_in_group
from cascade.testing.children import CleanupIfKilled
from cascade.testing.pids import SLEEPING_GRANDCHILD, gone, written_pid

ROOT = Path(__file__).resolve().parents[1]


def _starter(marker: Path, body: str) -> subprocess.Popen:
    code = ("import sys, time\n"
            "from cascade.testing.children import CleanupIfKilled\n"
            f"guard = CleanupIfKilled(['touch', {str(marker)!r}])\n"
            f"{body}\n")
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_the_command_runs_when_the_starter_is_killed(tmp_path):
    marker = tmp_path / "stopped"
    starter = _starter(marker, "print('armed', flush=True)\ntime.sleep(120)")
    try:
        assert starter.stdout.readline().strip() == "armed"
        assert not marker.exists()
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=30)
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists()
    finally:
        starter.kill()
        starter.wait()


def test_a_disarmed_guard_never_runs_the_command(tmp_path):
    marker = tmp_path / "stopped"
    starter = _starter(marker, "with guard:\n    print('armed', flush=True)\nprint('disarmed', flush=True)")
    out, _ = starter.communicate(timeout=60)
    assert starter.returncode == 0 and out.split() == ["armed", "disarmed"]
    assert not marker.exists()  # disarm() waited for the watcher: it is gone, the command not run


def test_disarming_after_the_watcher_died_is_quiet(tmp_path):
    marker = tmp_path / "stopped"
    guard = CleanupIfKilled(["touch", str(marker)])
    guard._watcher.kill()
    guard._watcher.wait(timeout=30)
    guard.disarm()  # no BrokenPipeError
    guard.disarm()  # idempotent
    assert not marker.exists()


def test_a_command_that_times_out_takes_its_grandchildren_with_it(tmp_path):
    pid_file = tmp_path / "pid"
    assert run_in_group([sys.executable, "-c", SLEEPING_GRANDCHILD, str(pid_file)], timeout=3, grace=2) is None
    assert gone(written_pid(pid_file))


def test_a_command_that_ends_gives_its_output_and_status():
    done = run_in_group([sys.executable, "-c", "print('hi'); raise SystemExit(3)"], timeout=30,
                        capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (3, "hi\n")
