# Cascade: `make run` runs the main job, `make test` runs the test suite.
# Both create .venv and install everything they need on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.cascade-installed
PEERS  := $(VENV)/.peers-installed
RANKS  ?= 4

.PHONY: install peers tex run test test-unit test-mpi bench clean

$(STAMP): pyproject.toml cascade/_ids.c cascade/buffers/_hostcopy.c cascade/tiers/_recordread.c cascade/tiers/_firstfit.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[mpi,test,bench]' -c third_party/constraints.txt
	touch $(STAMP)

install: $(STAMP)

# The compared systems (LMCache + CPU torch, Redis, HDF5, Mooncake): see third_party/.
$(PEERS): $(STAMP) third_party/install.sh third_party/constraints.txt $(wildcard third_party/*/requirements.txt)
	bash third_party/install.sh $(VENV)
	touch $(PEERS)

peers: $(PEERS)

# TeX for the paper's PDF test (tests/test_paper.py): Debian texlive packages via apt-get,
# a quick no-op once installed (paper/install-tex.sh).
tex:
	sh paper/install-tex.sh

# The main job on the embedded default: the built-in workload on $(RANKS) local MPI
# ranks sharing one four-tier store (file tier in $$TMPDIR), with a per-tier report.
run: install
	$(VENV)/bin/cascade run --ranks $(RANKS) --requests 200 --set shm_bytes=256M --set file_bytes=2G

test: test-unit test-mpi

test-unit: install peers tex
	$(PY) -m pytest -q -p no:cacheprovider --ignore=tests/mpi

# The multi-rank suite: the same test bodies at one rank, at $(RANKS) ranks on one node,
# and at $(RANKS) ranks as 2 emulated nodes (MPICH's MPIR_CVAR_NUM_CLIQUES splits the
# ranks into "nodes" whose traffic goes through the network module; CASCADE_TEST_NODES
# makes tests/mpi/test_nodes_mpi.py fail if the split did not happen).
test-mpi: install
	$(PY) -m pytest -q -p no:cacheprovider tests/mpi
	$(VENV)/bin/mpiexec -n $(RANKS) $(PY) -m mpi4py -m pytest -q -p no:cacheprovider tests/mpi tests/test_launch.py
	MPIR_CVAR_NUM_CLIQUES=2 CASCADE_TEST_NODES=2 $(VENV)/bin/mpiexec -n $(RANKS) $(PY) -m mpi4py -m pytest -q -p no:cacheprovider tests/mpi

# Every benchmark workload at this commit, 3 repetitions interleaved, spread recorded
# (benchmark/README.md, "The suite"). BENCH="--quick" for a short run.
bench: install peers
	$(PY) -m benchmark.suite $(BENCH)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
