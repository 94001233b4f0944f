"""The README's examples run as written: its Python blocks, its command lines and the
trace format it shows. Each runs in a subprocess whose HOME, TMPDIR and SCRATCH are the
test's own directory, so the default file_dir lands there."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cascade

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.S | re.M)


def _env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, HOME=str(tmp_path), TMPDIR=str(tmp_path), SCRATCH=str(tmp_path / "scratch"),
                PYTHONPATH=str(ROOT))


def _python(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=300)


def test_readme_python_blocks_run_in_order(tmp_path):
    blocks = _blocks("python")
    assert len(blocks) >= 2
    # Later blocks use names earlier ones define (cfg), like a reader following along.
    done = _python(tmp_path, "\n".join(blocks))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "../shared" not in README  # no paths a reader does not have
    files = list((tmp_path / "scratch" / "cascade").glob("agg_rank000_*.bin"))
    assert files, "the default file_dir ($SCRATCH/cascade) was not used"


def test_package_docstring_quick_start_runs(tmp_path):
    code = "\n".join(line[4:] for line in cascade.__doc__.splitlines() if line.startswith("    "))
    assert "CascadeStore" in code
    done = _python(tmp_path, code + "\nassert key.tobytes() == k.tobytes()")
    assert done.returncode == 0, done.stderr[-3000:]


def _cascade(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cascade.cli", *args], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)


def test_readme_command_lines_use_real_options(tmp_path):
    lines = [line.split("#")[0].strip() for block in _blocks("sh") for line in block.splitlines()]
    commands = [line.split()[1:] for line in lines if line.startswith("cascade ")]
    assert {c[0] for c in commands} >= {"info", "run", "stats"}
    for words in commands:
        help_text = _cascade(tmp_path, words[0], "--help").stdout
        for option in re.findall(r"--[a-z-]+", " ".join(words)):
            assert option in help_text, f"README shows `cascade {words[0]} {option}`, which does not exist"
    assert _cascade(tmp_path, "info").returncode == 0


def test_readme_trace_example_replays(tmp_path):
    example = re.search(r'`(\{"timestamp".*?\})`', README.replace("\n", " "))
    assert example, "the README shows no trace line"
    record = json.loads(example.group(1))
    trace = tmp_path / "trace.jsonl"
    with trace.open("w") as f:  # a few requests sharing the example's prefix, as the example says
        for i in range(4):
            f.write(json.dumps({**record, "timestamp": i}) + "\n")
    done = _cascade(tmp_path, "run", "--trace", str(trace), "--quiet", "--set", "model=tiny",
                    "--set", "stats_dir=" + str(tmp_path / "stats"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "4 requests from" in done.stdout and "fresh directory" in done.stdout
    stats = _cascade(tmp_path, "stats", str(tmp_path / "stats"))
    assert stats.returncode == 0 and "1 rank(s)" in stats.stdout


@pytest.mark.parametrize("snippet", ["make run", "make test"])
def test_readme_make_targets_exist(snippet):
    target = snippet.split()[1]
    assert snippet in README
    assert re.search(rf"^{target}:", (ROOT / "Makefile").read_text(), flags=re.M)
