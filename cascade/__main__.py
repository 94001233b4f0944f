"""``python -m cascade ...`` is the ``cascade`` command (ranks run it as
``python -m mpi4py -m cascade serve ...``)."""
import sys

from .cli import main

sys.exit(main())
