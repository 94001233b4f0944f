"""The results file of a run (``cascade run`` and the main job write the same kind)."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def write_results(directory: str | os.PathLike, nodes: int, doc: dict[str, Any]) -> Path:
    """Write ``doc`` (with the command line that made it) as
    ``cascade_run_{nodes}n_{UTC timestamp}.json`` in ``directory`` (created if needed);
    the path written. Call it on one rank only."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"cascade_run_{nodes}n_{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps({"system": "cascade", "workload": "run", "command": sys.argv, "nodes": nodes, **doc},
                               indent=1, default=str))
    return path
