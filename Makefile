# Two commands for a new user: `make demo` and `make test`. Everything else is set up on demand.
SHELL := /bin/bash
# Python 3.12 where the machine has one (on PATH, or pyenv's), else 3.11. Under 3.12 the
# suite's coverage measures with sys.monitoring ([tool.coverage.run] core), which costs a
# process ~10 % of its CPU against ~35 % for 3.11's C tracer (docs/getting-started.md)
# (both recursive: asked only when a target builds the environment, not by every make call)
PYENV_PYTHON_312 = $(shell pyenv prefix 3.12 2>/dev/null)
PYTHON ?= $(or $(shell python3.12 -c 'import sys; print(sys.executable)' 2>/dev/null),$(if $(PYENV_PYTHON_312),$(PYENV_PYTHON_312)/bin/python3.12),python3.11)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export DO_NOT_TRACK := 1
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120
export PREFECT_HOME := $(CURDIR)/.prefect

.PHONY: setup lock bytecode test test-fast demo serve bench fidelity privatekt lint clean wheelhouse docs docs-serve

setup: $(STAMP)

# uv resolves the same versions as pip and installs them in parallel (about 50 s against
# 2.5-4.5 min for pip on 2 cores, docs/getting-started.md), compiled to bytecode as pip does
# (without it every rank of every job compiles torch's modules again where
# PYTHONDONTWRITEBYTECODE is set: 10 s of imports instead of 4.5); pip is the fallback
# where uv cannot be had. Every version is requirements.lock's (make lock): a store records
# its pixel libraries' versions, so a release of one changes the bytes dvc.lock records
# (docs/reproducibility.md, "The same versions").
$(STAMP): pyproject.toml requirements.lock
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.12 or 3.11, or name one: 'make PYTHON=python3.11 ...'"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q uv && $(BIN)/uv pip install --compile-bytecode --python $(BIN)/python \
	    -c requirements.lock -e '.[dev]' \
	  || { $(BIN)/pip install --upgrade pip setuptools wheel \
	       && $(BIN)/pip install -c requirements.lock -e '.[dev]'; }
	touch $(STAMP)

# requirements.lock again from pyproject.toml, keeping its pins where they still hold, for
# Python 3.11 and 3.12 on every platform; `make lock UPGRADE=--upgrade` (or
# UPGRADE='--upgrade-package NAME') takes newer releases. Then `make demo` and commit
# dvc.lock with it: the stores' provenance names the new versions.
# (uv alone is needed: a pyproject.toml the old lock no longer satisfies cannot be installed)
lock:
	@[ -x $(BIN)/uv ] || { $(PYTHON) -m venv $(VENV) && $(BIN)/pip install -q uv; }
	$(BIN)/uv pip compile pyproject.toml --extra dev --universal --python-version 3.11 \
	  --custom-compile-command "make lock" -o requirements.lock --quiet $(UPGRADE)

# The project's own modules as bytecode, as uv compiles the packages it installs (it does not
# compile an editable install's): where PYTHONDONTWRITEBYTECODE is set, every process that
# imports them would compile them again, every command, stage, rank server and pool worker
# (0.15 s of a flow command's start, 0.5 s of flows.pipeline's, on the faster machine kind).
# Only what changed is compiled again; git and DVC ignore __pycache__/.
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q analysis bench camelyon_proxyfl flows plumbing proxyfl tasks wsi

# Every test, in $(WORKERS) pytest-xdist workers (tests/conftest.py: what each has of its
# own, and the clocked tests that share one worker), under coverage of every process the
# tests start ([tool.coverage] in pyproject.toml); the slowest tests' times, then the
# coverage total, checked against its floor (fail_under).
WORKERS ?= 3
test: bytecode
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf build/coverage && mkdir -p build/coverage
	COVERAGE_FILE="$(CURDIR)/build/coverage/.coverage" \
	  CAMELYON_PROXYFL_TEST_COVERAGE="$(CURDIR)/pyproject.toml" \
	  PYTHONPATH="$(CURDIR)/tests/coverage_site$${PYTHONPATH:+:$$PYTHONPATH}" \
	  $(BIN)/python -m pytest -n $(WORKERS) --dist loadgroup --durations=25 --durations-min=5
	@export COVERAGE_FILE="$(CURDIR)/build/coverage/.coverage"; $(BIN)/coverage combine -q \
	  && $(BIN)/coverage report > build/coverage/report.txt; status=$$?; \
	  grep -E "^TOTAL|^Coverage failure" build/coverage/report.txt; \
	  echo "coverage by file: build/coverage/report.txt"; \
	  exit $$status

# The tests that run in one process, in workers, without coverage: the loop while editing
# (README: its time). `make test` (CI's) runs them all.
test-fast: bytecode
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -m "not slow" -n $(WORKERS) --dist loadgroup

# The whole DAG of dvc.yaml with params.yaml (synthetic slides -> stores -> 7 methods ->
# tables); a second run is a no-op. The tables are printed either way, then where each
# run's time went (results/timings.md: not a DVC output, it changes with every launch).
demo: bytecode
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m flows.shared -- dvc repro
	@echo; cat results/tables/accuracy.md; echo; cat results/tables/staging.md
	@echo; cat results/tables/privacy.md; echo; cat results/tables/audit.md
	@[ ! -f results/timings.md ] || { echo; cat results/timings.md; }

# Prefect server (UI on :4200), work pool, deployments and a worker; Ctrl-C stops them all.
serve: bytecode
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m flows.serve

bench: bytecode
	$(BIN)/python -m bench

# The paper's protocol at this machine's size (7 methods x 3 seeds x 15 rounds, ~30 min)
# beside Table 2, with Kendall's tau; the demo's stores first (cached after `make demo`).
fidelity: bytecode
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m flows.server -- dvc repro preprocess
	$(BIN)/python -m bench fidelity

# PrivateKT in its paper's setting on scikit-learn's digits (its defaults, Fig. 3's
# ablations, central training, FedAvg; 3 seeds, ~8 min), then beside ProxyFL, FedAvg and
# Regular on the demo's stores, with each one's ε and its notion (~25 min; stores first).
privatekt: bytecode
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m flows.server -- dvc repro preprocess
	$(BIN)/python -m bench privatekt

# The wheels an offline GPU server needs for training and `python -m bench gpu` (no Prefect,
# DVC or torch: docs/gpu.md), into ./wheelhouse/ with its requirements.txt.
PY ?= 3.12
PLATFORM ?= manylinux_2_28_x86_64
wheelhouse: $(STAMP)
	$(BIN)/python -m bench.wheelhouse --python $(PY) --platform $(PLATFORM)

# The documentation site (docs/, mkdocs.yml) into site/, offline; the tests build it too
# (tests/docs/test_docs.py: --strict, every runnable command, every parameter documented).
export NO_MKDOCS_2_WARNING := 1
docs: $(STAMP)
	$(BIN)/mkdocs build --strict
	@echo "open site/index.html, or: make docs-serve"

docs-serve: $(STAMP)
	$(BIN)/mkdocs serve --strict

# what make test checks first
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .prefect .pytest_cache .ruff_cache site
