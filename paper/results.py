"""Reading benchmark results files for the paper, with errors that name file and field.

A results file is ``{system}_{workload}_{nodes}n_{timestamp}.json`` (DESIGN.md section 6)
or a ``cascade run`` / ``python -m cascade.app run`` file,
``cascade_run_{nodes}n_{timestamp}.json``. Figures ask a :class:`ResultsFile` for fields
by path (``rf.num("rows", 2, "memcpy", "gbps")``); a missing or malformed field raises
:class:`ResultsError` naming the file and the field (``rows[2].memcpy.gbps``), so a
figure never silently draws from a file that does not hold what it needs.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .spread import MergeError, Spread, merge

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = REPO_ROOT / "benchmark" / "results"
SAMPLE_RESULTS = REPO_ROOT / "paper" / "sample_results"
#: Suite runs of GPU workloads alone, made on a lent GPU machine (the build machines have
#: none): the device_io table reads the newest when the main suite could not run it.
DEVICE_RESULTS = DEFAULT_RESULTS / "device"

#: Workloads whose names may appear in file names (the runner's, mpi_micro and the run).
KNOWN_WORKLOADS = ("tier_bandwidth", "trace_replay", "mpi_micro", "write_throughput", "read_throughput",
                   "read_latency", "scaling", "thread_scaling", "faults", "queue_hints", "cross_node", "stress_mpi",
                   "small_blocks", "file_read_mode", "read_stall", "device_io", "cluster_serving", "restart", "run")
_NAME_RE = re.compile(r"^(?P<head>.+)_(?P<nodes>\d+)n_(?P<stamp>\d{8}[T-]?\d{6})(?:_(?P<seq>\d+))?\.json$")

Key = str | int


class ResultsError(Exception):
    """A results file cannot feed a figure: unreadable, or a needed field is missing or
    has the wrong type. ``path`` and ``field`` say where."""

    def __init__(self, path: Path | str, field: str, problem: str = "is missing") -> None:
        self.path = str(path)
        self.field = field
        self.problem = problem
        super().__init__(f"{self.path}: field {field!r} {problem}")


def field_name(keys: Iterable[Key]) -> str:
    """``("rows", 2, "memcpy")`` -> ``"rows[2].memcpy"``."""
    out = ""
    for k in keys:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out


def display_path(path: Path) -> str:
    """The path relative to the repository when it lies inside it (for provenance)."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


@dataclass(eq=False)
class ResultsFile:
    """One parsed results file and what kind of run produced it."""

    path: Path
    doc: dict[str, Any]
    system: str
    workload: str
    nodes: int
    ranks: int
    stamp: str  # sortable: YYYYMMDDHHMMSS plus a sequence number
    notes: list[str] = field(default_factory=list)
    reps: list["ResultsFile"] = field(default_factory=list)  # the repetitions merged into this one
    rep_numbers: list[int] = field(default_factory=list)  # the suite repetition of each (Spread.index)

    def __post_init__(self) -> None:
        if not self.reps:
            self.reps = [self]
        if not self.rep_numbers:
            self.rep_numbers = list(range(len(self.reps)))

    def _missing(self, walked: list[Key]) -> ResultsError:
        """The error for a field absent from the merged document: named against the
        repetition that lacks it (merging keeps only what every repetition has)."""
        for rep in self.reps:
            if rep is not self and not _present(rep.doc, walked):
                return ResultsError(rep.path, field_name(walked))
        return ResultsError(self.path, field_name(walked))

    @property
    def name(self) -> str:
        return display_path(self.path)

    # -- field access ------------------------------------------------------------------
    def get(self, *keys: Key, within: Any = None, prefix: tuple[Key, ...] = ()) -> Any:
        """The value at ``keys`` (of ``within``, itself at ``prefix``; default the whole
        document). :class:`ResultsError` when a step is missing."""
        node = self.doc if within is None else within
        walked: list[Key] = list(prefix)
        for k in keys:
            walked.append(k)
            if isinstance(k, int):
                if not isinstance(node, list) or not -len(node) <= k < len(node):
                    raise self._missing(walked)
            elif not isinstance(node, dict) or k not in node:
                raise self._missing(walked)
            node = node[k]
        return node

    def has(self, *keys: Key, within: Any = None) -> bool:
        try:
            self.get(*keys, within=within)
        except ResultsError:
            return False
        return True

    def num(self, *keys: Key, within: Any = None, prefix: tuple[Key, ...] = ()) -> float:
        """A finite number at ``keys``; :class:`ResultsError` otherwise."""
        value = self.get(*keys, within=within, prefix=prefix)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ResultsError(self.path, field_name((*prefix, *keys)), f"is {value!r}, not a finite number")
        return value if isinstance(value, Spread) else float(value)

    def seq(self, *keys: Key, within: Any = None, prefix: tuple[Key, ...] = (), nonempty: bool = True) -> list[Any]:
        """A list at ``keys`` (non-empty unless ``nonempty=False``)."""
        value = self.get(*keys, within=within, prefix=prefix)
        if not isinstance(value, list):
            raise ResultsError(self.path, field_name((*prefix, *keys)), f"is {type(value).__name__}, not a list")
        if nonempty and not value:
            raise ResultsError(self.path, field_name((*prefix, *keys)), "is an empty list")
        return value

    def mapping(self, *keys: Key, within: Any = None, prefix: tuple[Key, ...] = ()) -> dict[str, Any]:
        value = self.get(*keys, within=within, prefix=prefix)
        if not isinstance(value, dict):
            raise ResultsError(self.path, field_name((*prefix, *keys)), f"is {type(value).__name__}, not an object")
        return value

    def source(self, *keys: Key) -> str:
        """``file: field`` for provenance comments."""
        where = f"{self.name}: {field_name(keys)}" if keys else self.name
        if len(self.reps) > 1:
            others = ", ".join(f"{r.path.parent.name}/{r.path.name}" for r in self.reps[1:])
            where += f" [median, min-max of {len(self.reps)} repetitions; also {others}]"
        return where

    @property
    def rep_names(self) -> list[str]:
        """Every repetition's file (provenance of merged numbers)."""
        return [r.name for r in self.reps]


def _present(doc: Any, keys: list[Key]) -> bool:
    node = doc
    for k in keys:
        if isinstance(k, int):
            if not isinstance(node, list) or not -len(node) <= k < len(node):
                return False
        elif not isinstance(node, dict) or k not in node:
            return False
        node = node[k]
    return True


def _split_head(head: str) -> tuple[str, str] | None:
    for workload in sorted(KNOWN_WORKLOADS, key=len, reverse=True):
        if head.endswith("_" + workload) and len(head) > len(workload) + 1:
            return head[: -len(workload) - 1], workload
    return None


def _stamp(doc: dict[str, Any], match: re.Match[str] | None) -> str:
    if match:
        digits = re.sub(r"\D", "", match.group("stamp"))
        return f"{digits}{int(match.group('seq') or 0):04d}"
    ts = doc.get("timestamp")
    if isinstance(ts, str):
        digits = re.sub(r"\D", "", ts)[:14]
        if len(digits) == 14:
            return digits + "0000"
    return "0" * 18


def _file_tier_as_lustre(node: Any) -> None:
    """Store stats name the file tier ``file`` (``lustre`` before 2026-11-25): every
    ``tiers`` mapping of ``doc`` names it ``lustre``, as the figures do, either way."""
    if isinstance(node, dict):
        tiers = node.get("tiers")
        if isinstance(tiers, dict) and "file" in tiers and "lustre" not in tiers:
            tiers["lustre"] = tiers.pop("file")
        for value in node.values():
            _file_tier_as_lustre(value)
    elif isinstance(node, list):
        for value in node:
            _file_tier_as_lustre(value)


def load_file(path: Path) -> ResultsFile:
    """Parse one results file. :class:`ResultsError` if it is not a JSON object."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(path, "<file>", f"cannot be read as JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ResultsError(path, "<file>", "is not a JSON object")
    _file_tier_as_lustre(doc)
    match = _NAME_RE.match(path.name)
    split = _split_head(match.group("head")) if match else None
    system = doc.get("system") or (split[0] if split else "")
    workload = doc.get("workload") or (split[1] if split else "")
    if not workload and ("per_rank_stats" in doc or ("store_stats" in doc and "references" in doc)):
        workload = "run"
    nodes = doc.get("nodes") if isinstance(doc.get("nodes"), int) else int(match.group("nodes")) if match else 1
    ranks = doc.get("ranks") if isinstance(doc.get("ranks"), int) else 1
    return ResultsFile(path, doc, str(system), str(workload), nodes, ranks, _stamp(doc, match))


SUITE_FORMAT = "cascade-bench-suite/1"
MANIFEST = "manifest.json"


def find_suite(path: Path) -> Path | None:
    """The suite directory ``path`` names: ``path`` itself (or its directory, for a
    ``manifest.json``) when it holds a manifest, else the newest ``*/manifest.json`` under
    ``path`` (by the manifest's ``started`` time, then the directory name); None if none."""
    path = Path(path)
    if path.is_file() and path.name == MANIFEST:
        return path.parent
    if (path / MANIFEST).is_file():
        return path
    found = []
    for manifest in path.glob(f"*/{MANIFEST}"):
        try:
            started = str(json.loads(manifest.read_text()).get("started", ""))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            started = ""
        found.append((re.sub(r"\D", "", started), manifest.parent.name, manifest.parent))
    return max(found)[2] if found else None


def default_results() -> Path:
    """Where the paper reads by default: ``benchmark/results`` when it holds a suite run
    (the newest is read), else the committed sample ``paper/sample_results``."""
    return DEFAULT_RESULTS if find_suite(DEFAULT_RESULTS) else SAMPLE_RESULTS


def _suite_files(suite: Path, manifest: dict[str, Any]) -> list[Path]:
    """The results files a suite's manifest lists as run successfully (``runs[*].file``)."""
    runs = manifest.get("runs")
    if not isinstance(runs, list):
        raise ResultsError(suite / MANIFEST, "runs")
    out = []
    for k, run in enumerate(runs):
        if not isinstance(run, dict):
            raise ResultsError(suite / MANIFEST, f"runs[{k}]", "is not an object")
        if run.get("status", "ok") == "ok" and isinstance(run.get("file"), str):
            out.append(suite / run["file"])
    return out


def _rep_number(path: Path, default: int) -> int:
    """The suite repetition a file belongs to (its ``rep<k>/`` directory), else ``default``."""
    match = re.fullmatch(r"rep(\d+)", path.parent.name)
    return int(match.group(1)) if match else default


def merge_files(reps: list[ResultsFile]) -> ResultsFile:
    """One :class:`ResultsFile` for the repetitions of one workload (numbers that differ
    become :class:`~paper.spread.Spread`, indexed by suite repetition); it is named after
    the first repetition's file and a missing field is reported against the repetition
    that lacks it. :class:`ResultsError` naming the file when the repetitions hold lists
    that cannot be matched."""
    reps = sorted(reps, key=lambda f: (f.stamp, str(f.path)))
    first = reps[0]
    numbers = [_rep_number(f.path, k) for k, f in enumerate(reps)]
    if len(set(numbers)) < len(numbers):  # not laid out one repetition per directory
        numbers = list(range(len(reps)))
    try:
        doc = merge([f.doc for f in reps], numbers) if len(reps) > 1 else first.doc
    except MergeError as exc:
        raise ResultsError(reps[numbers.index(exc.rep)].path, field_name(exc.keys), exc.problem) from exc
    merged = ResultsFile(first.path, doc, first.system, first.workload, first.nodes, first.ranks, first.stamp,
                         reps=reps, rep_numbers=numbers)
    return merged


@dataclass
class Results:
    """One suite run: for each workload (and system, nodes, ranks) the merge of its
    repetitions. Only the files of that one suite are ever read."""

    directory: Path
    files: list[ResultsFile]
    unreadable: list[ResultsError]
    suite: Path | None = None
    manifest: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | str) -> "Results":
        """Read the suite at ``path`` (a suite directory, its ``manifest.json``, or a
        directory of suites: the newest). No suite: no files (every figure is skipped).
        Files that are not JSON objects, and repetitions that cannot be merged, are kept
        aside in :attr:`unreadable`."""
        path = Path(path)
        suite = find_suite(path)
        if suite is None:
            return cls(path, [], [])
        bad: list[ResultsError] = []
        try:
            manifest = json.loads((suite / MANIFEST).read_text())
            if not isinstance(manifest, dict):
                raise ValueError("not a JSON object")
            paths = _suite_files(suite, manifest)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return cls(suite, [], [ResultsError(suite / MANIFEST, "<file>", f"cannot be read ({exc})")], suite)
        except ResultsError as exc:
            return cls(suite, [], [exc], suite)
        groups: dict[tuple, list[ResultsFile]] = {}
        for p in paths:
            try:
                f = load_file(p)
            except ResultsError as exc:
                bad.append(exc)
                continue
            groups.setdefault((f.workload, f.system, f.nodes, f.ranks), []).append(f)
        files = []
        for reps in groups.values():
            try:
                files.append(merge_files(reps))
            except ResultsError as exc:
                bad.append(exc)
        return cls(suite, files, bad, suite, manifest)

    def describe(self) -> str:
        """Which suite run this is: directory, commit, size and repetitions (for provenance)."""
        if self.suite is None:
            return f"no suite run under {display_path(self.directory)}"
        m = self.manifest
        commit = m.get("commit") if isinstance(m.get("commit"), str) and m.get("commit") else "unknown"
        dirty = ", uncommitted changes" if m.get("dirty") else ""
        return (f"suite run {display_path(self.suite)} (commit {commit[:12]}{dirty}, size {m.get('size', '?')}, "
                f"{m.get('reps', self.repetitions)} repetitions)")

    @property
    def repetitions(self) -> int:
        """The most repetitions any workload of the suite has (0 without a suite)."""
        return max((len(f.reps) for f in self.files), default=0)

    def of(self, workload: str, system: str | None = None) -> list[ResultsFile]:
        """Files of ``workload`` (and ``system``), oldest first."""
        found = [f for f in self.files if f.workload == workload and (system is None or f.system == system)]
        return sorted(found, key=lambda f: (f.stamp, f.path.name))

    def newest(self, workload: str, system: str | None = None) -> ResultsFile | None:
        found = self.of(workload, system)
        return found[-1] if found else None

    def newest_per_system(self, workload: str) -> dict[str, ResultsFile]:
        """The newest file of ``workload`` for each system."""
        out: dict[str, ResultsFile] = {}
        for f in self.of(workload):
            out[f.system] = f
        return out
