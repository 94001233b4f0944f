"""Applications built on the library: the multi-rank main job (``python -m mpi4py -m
cascade.app run``), its local launcher (``cascade run --ranks N``) and the results files
both write. Nothing in the library imports this package."""
