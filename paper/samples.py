"""Re-measure ``paper/sample_results/``: a small, real suite run for the paper's tests.

    python -m paper.samples [--out DIR] [--reps N] [--allow-dirty]   (or: make -C paper samples)
    python -m paper.samples --from benchmark/results/suite_<commit>_<stamp>   (adopt a finished --quick run)

Runs ``python -m benchmark.suite --quick`` (every workload, ``N`` interleaved repetitions,
one commit; layout in ``benchmark/README.md``) and keeps its ``manifest.json`` and
``rep*/`` results files, with the raw per-call sample lists dropped (the summaries
computed from them are kept; each file says so in ``trimmed``) and without the suite's
logs and ``summary.json`` (the paper computes spreads from the repetitions itself).
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

from .results import REPO_ROOT as ROOT, SAMPLE_RESULTS


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


def _call(cmd: list[str]) -> None:
    """Run ``cmd`` from the repository root; on failure show the end of its stderr."""
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"{cmd[2:5]} failed ({done.returncode}):\n{done.stderr[-4000:]}")


def regenerate(out: Path, reps: int = 3, allow_dirty: bool = False) -> Path:
    """A fresh suite in ``out/suite_<commit12>_<stamp>/`` (older suites in ``out`` removed)."""
    with tempfile.TemporaryDirectory(prefix="cascade-sample-suite-") as tmp:
        _call([sys.executable, "-m", "benchmark.suite", "--quick", "--reps", str(reps), "--out", tmp,
               *(["--allow-dirty"] if allow_dirty else [])])
        [made] = [p for p in Path(tmp).iterdir() if (p / "manifest.json").is_file()]
        return adopt(made, out)


def adopt(made: Path, out: Path) -> Path:
    """Copy the finished suite ``made`` into ``out`` as the sample (see the module doc)."""
    manifest = json.loads((made / "manifest.json").read_text())
    if manifest.get("finished") is None and "seconds" not in manifest:
        raise SystemExit(f"{made}: the suite has not finished (manifest has no 'finished')")
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
    p.add_argument("--out", type=Path, default=SAMPLE_RESULTS, help="where the suite directory goes")
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
