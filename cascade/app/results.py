"""The results file of a run (``cascade run`` and the main job write the same kind)."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import CascadeError


def check_results_dir(directory: str | os.PathLike) -> None:
    """Make ``directory`` if needed and write a scratch file into it, so that a
    ``--results`` that cannot take the results fails before a run, not after it.
    :class:`~cascade.errors.CascadeError` when it cannot."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise CascadeError(f"--results {directory}: not a directory this run can write into "
                           f"({exc.strerror or exc})") from None


def write_results(directory: str | os.PathLike, nodes: int, doc: dict[str, Any]) -> Path:
    """Write ``doc`` (with the command line that made it) as
    ``cascade_run_{nodes}n_{UTC timestamp}.json`` in ``directory`` (created if needed;
    ``-1``, ``-2``... added to the name when a run of the same second wrote one already,
    never over it); the path written. Call it on one rank only."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"cascade_run_{nodes}n_{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    text = json.dumps({"system": "cascade", "workload": "run", "command": sys.argv, "nodes": nodes, **doc},
                      indent=1, default=str)
    for n in range(1000):
        path = out / (f"{stem}.json" if n == 0 else f"{stem}-{n}.json")
        try:
            with open(path, "x") as f:
                f.write(text)
            return path
        except FileExistsError:
            continue
    raise CascadeError(f"--results {directory}: 1000 results files of {stem} already there")
