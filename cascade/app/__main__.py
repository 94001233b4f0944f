"""``python -m mpi4py -m cascade.app run ...``: the main job on every rank."""
import sys

from ..errors import CascadeError
from .main_job import run

try:
    sys.exit(run(sys.argv[1:]))
except CascadeError as exc:
    print(f"cascade.app: error: {exc}", file=sys.stderr, flush=True)
    sys.exit(2)
except KeyboardInterrupt:  # Ctrl-C, or the launcher stopping the run: the store was closed on the way out
    print("cascade.app: interrupted", file=sys.stderr, flush=True)
    sys.exit(130)
