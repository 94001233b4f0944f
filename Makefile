# Cascade: `make run` runs the main job, `make test` runs the test suite.
# Both create .venv and install everything they need on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.cascade-installed

.PHONY: install run test test-unit test-mpi bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[mpi,test,bench]'
	touch $(STAMP)

install: $(STAMP)

# The main job on the embedded default: the built-in workload replayed against the
# four-tier store (file tier in $TMPDIR), with a per-tier report.
run: install
	$(VENV)/bin/cascade run --requests 400 --set file_bytes=2G

test: test-unit

test-unit: install
	$(PY) -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
