"""Re-measure ``paper/sample_results/``: a small, real suite run for the paper's tests.

    python -m paper.samples [--out DIR] [--reps N] [--allow-dirty]   (or: make -C paper samples)
    python -m paper.samples --from benchmark/results/suite_<commit>_<stamp>   (adopt a finished --quick run)

Runs ``python -m benchmark.suite --quick`` (every workload, ``N`` interleaved repetitions,
one commit; layout in ``benchmark/README.md``) and keeps its ``manifest.json`` and
``rep*/`` results files, with the raw per-call sample lists dropped (the summaries
computed from them are kept; each file says so in ``trimmed``) and without the suite's
logs and ``summary.json`` (the paper computes spreads from the repetitions itself).

The suite has no ``cascade run`` workload, which the paper's get-breakdown figure reads;
until it has, each repetition gets one ``cascade run`` on two ranks, run here right after
the suite at the same commit and listed in the manifest with ``"added_by": "paper.samples"``.
Nothing is typed in. Takes ten to twenty minutes on a loaded 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SAMPLE_DIR = Path(__file__).resolve().parent / "sample_results"
ROOT = SAMPLE_DIR.parent.parent


def _raw(key: str) -> bool:
    return key in ("samples", "samples_s") or key.endswith("_samples_s")


def trim(doc: Any) -> Any:
    """``doc`` without raw sample lists (keys ``samples``, ``samples_s``, ``*_samples_s``)."""
    if isinstance(doc, dict):
        return {k: trim(v) for k, v in doc.items() if not _raw(k)}
    if isinstance(doc, list):
        return [trim(v) for v in doc]
    return doc


def _finish(path: Path) -> Path:
    doc = trim(json.loads(path.read_text()))
    doc["trimmed"] = "paper/samples.py: raw per-call sample lists removed; every other field as measured"
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return path


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CASCADE_")}


def _call(cmd: list[str], **kw: Any) -> None:
    """Run ``cmd`` from the repository root; on failure show the end of its stderr."""
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)
    if done.returncode:
        raise SystemExit(f"{cmd[2:5]} failed ({done.returncode}):\n{done.stderr[-4000:]}")


def _python() -> str:
    return sys.executable


def _cascade_run(rep_dir: Path, work: Path) -> Path:
    """One ``cascade run`` on two ranks into ``rep_dir``; its results file."""
    before = set(rep_dir.glob("cascade_run_*.json"))
    _call([_python(), "-m", "cascade.cli", "run", "--ranks", "2", "--blocks", "8", "--requests", "60", "--quiet",
           "--results", str(rep_dir), "--set", "shm_bytes=64M", "--set", "file_bytes=512M",
           "--set", f"file_dir={work}"])
    [made] = set(rep_dir.glob("cascade_run_*.json")) - before
    return made


def _add_runs(suite: Path, manifest: dict[str, Any]) -> None:
    """A ``cascade run`` per repetition, listed in the manifest (see the module doc)."""
    if any(r.get("workload") == "run" for r in manifest["runs"]):
        return
    for rep in range(int(manifest["reps"])):
        with tempfile.TemporaryDirectory(prefix="cascade-sample-run-") as work:
            made = _cascade_run(suite / f"rep{rep}", Path(work) / "files")
        manifest["runs"].append({"rep": rep, "workload": "run", "status": "ok", "file": str(made.relative_to(suite)),
                                 "added_by": "paper.samples", "command": "cascade run --ranks 2 --blocks 8 "
                                 "--requests 60 --set shm_bytes=64M --set file_bytes=512M"})


def regenerate(out: Path, reps: int = 3, allow_dirty: bool = False) -> Path:
    """A fresh suite in ``out/suite_<commit12>_<stamp>/`` (older suites in ``out`` removed)."""
    with tempfile.TemporaryDirectory(prefix="cascade-sample-suite-") as tmp:
        _call([_python(), "-m", "benchmark.suite", "--quick", "--reps", str(reps), "--out", tmp,
               *(["--allow-dirty"] if allow_dirty else [])])
        [made] = [p for p in Path(tmp).iterdir() if (p / "manifest.json").is_file()]
        return adopt(made, out)


def adopt(made: Path, out: Path) -> Path:
    """Copy the finished suite ``made`` into ``out`` as the sample (see the module doc)."""
    manifest = json.loads((made / "manifest.json").read_text())
    if manifest.get("finished") is None and "seconds" not in manifest:
        raise SystemExit(f"{made}: the suite has not finished (manifest has no 'finished')")
    _add_runs(made, manifest)
    for old in out.glob("suite_*"):
        shutil.rmtree(old)
    suite = out / made.name
    suite.mkdir(parents=True)
    for run in manifest["runs"]:
        if run.get("status") == "ok" and run.get("file"):
            target = suite / run["file"]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(made / run["file"], target)
            _finish(target)
    manifest["paper_sample"] = ("paper/samples.py: the suite's logs and summary.json left out, raw sample "
                                "lists trimmed from the results files")
    (suite / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return suite


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper.samples", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=SAMPLE_DIR, help="where the suite directory goes")
    p.add_argument("--reps", type=int, default=3, help="repetitions (default %(default)s)")
    p.add_argument("--allow-dirty", action="store_true", help="passed to benchmark.suite")
    p.add_argument("--from", dest="source", type=Path, help="adopt this finished suite run instead of running one")
    args = p.parse_args(argv)
    suite = adopt(args.source, args.out) if args.source else regenerate(args.out, args.reps, args.allow_dirty)
    for path in sorted(suite.rglob("*.json")):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
