# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv (Python 3.11) and installs the project with what it needs, once, at the
# versions pinned in constraints.txt (pyproject.toml holds ranges; the pins keep runs reproducible).
PY ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
CONSTRAINTS := constraints.txt

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@command -v $(PY) >/dev/null || { echo "need $(PY) on PATH"; exit 1; }
	@test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -qq --upgrade pip
	$(VENV)/bin/pip install -qq -c $(CONSTRAINTS) -e '.[test,bench,docs]'
	@touch $(STAMP)

.PHONY: env demo test test-extended test-install lint typecheck bench constraints docs
env: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python examples/quickstart.py

# Two pytest workers, each a whole module at a time (module fixtures stay one Ray engine and one
# Spark session per module; each worker has its own local Ray): the suite waits on actor starts
# and timers far more than it computes, and one worker kept this 2-core machine 40% busy. Modules
# go longest first (tests/conftest.py), not in xdist's most-tests-first order.
test: $(STAMP)
	$(VENV)/bin/ruff check actors runtime connectors examples tests
	$(VENV)/bin/python tests/typecheck.py
	$(MAKE) --no-print-directory docs
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --ignore=tests/install -m "not extended"

# The long runs the suite holds short versions of (pyproject.toml's `extended` marker): CI's
# second job, so the suite stays under 30 minutes on 2 cores.
test-extended: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --ignore=tests/install -m extended

# raytxn installed as a user installs it (tests/install/): the core install with no extra, then
# '.[spark]', and an environment holding the oldest Ray the range allows. Each test makes its own
# venvs and spends minutes in pip, so they are a job of their own (CI runs it after the suite).
test-install: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 --dist load tests/install

lint: $(STAMP)
	$(VENV)/bin/ruff check actors runtime connectors examples tests

# The docs site into build/site: --strict fails on any warning (a broken link, a missing API
# object, one object documented on two pages). Not --quiet: it drops the plugins' warnings before
# --strict counts them. mkdocs-material's banner about its successor is not a warning of this site's.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The public API's types (the modules and settings are in pyproject.toml's [tool.mypy]).
typecheck: $(STAMP)
	$(VENV)/bin/python tests/typecheck.py

bench: $(STAMP)
	$(VENV)/bin/python examples/benchmark.py ledger

# Re-resolve constraints.txt from pyproject.toml (every extra, Python 3.11): versions already
# pinned stay unless UPGRADE=1, which takes the newest each range allows.
constraints: $(STAMP)
	$(VENV)/bin/pip install -qq -c $(CONSTRAINTS) -e '.[lock]'
	$(VENV)/bin/uv pip compile pyproject.toml --all-extras --python-version 3.11 --no-annotate \
		--custom-compile-command "make constraints" $(if $(UPGRADE),--upgrade) -o $(CONSTRAINTS)
