"""Reading benchmark results files for the paper, with errors that name file and field.

A results file is ``{system}_{workload}_{nodes}n_{timestamp}.json`` (DESIGN.md section 6)
or a ``cascade run`` / ``python -m cascade.distributed run`` file,
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

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = REPO_ROOT / "benchmark" / "results"

#: Workloads whose names may appear in file names (the runner's, mpi_micro and the run).
KNOWN_WORKLOADS = ("tier_bandwidth", "trace_replay", "mpi_micro", "write_throughput", "read_throughput",
                   "read_latency", "scaling", "faults", "run")
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
                    raise ResultsError(self.path, field_name(walked))
            elif not isinstance(node, dict) or k not in node:
                raise ResultsError(self.path, field_name(walked))
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
        return float(value)

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
        return f"{self.name}: {field_name(keys)}" if keys else self.name


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


def load_file(path: Path) -> ResultsFile:
    """Parse one results file. :class:`ResultsError` if it is not a JSON object."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(path, "<file>", f"cannot be read as JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ResultsError(path, "<file>", "is not a JSON object")
    match = _NAME_RE.match(path.name)
    split = _split_head(match.group("head")) if match else None
    system = doc.get("system") or (split[0] if split else "")
    workload = doc.get("workload") or (split[1] if split else "")
    if not workload and ("per_rank_stats" in doc or ("store_stats" in doc and "references" in doc)):
        workload = "run"
    nodes = doc.get("nodes") if isinstance(doc.get("nodes"), int) else int(match.group("nodes")) if match else 1
    ranks = doc.get("ranks") if isinstance(doc.get("ranks"), int) else 1
    return ResultsFile(path, doc, str(system), str(workload), nodes, ranks, _stamp(doc, match))


@dataclass
class Results:
    """Every results file of a directory, by workload."""

    directory: Path
    files: list[ResultsFile]
    unreadable: list[ResultsError]

    @classmethod
    def load(cls, directory: Path | str) -> "Results":
        """Read ``directory/*.json``. Files that are not JSON objects are kept aside in
        :attr:`unreadable` (reported by the driver); nothing else is skipped."""
        directory = Path(directory)
        files, bad = [], []
        for path in sorted(directory.glob("*.json")):
            try:
                files.append(load_file(path))
            except ResultsError as exc:
                bad.append(exc)
        return cls(directory, files, bad)

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
