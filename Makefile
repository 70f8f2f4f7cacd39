# The two set-up commands of the README: `make demo` and `make test`.
# Each creates .venv (Python 3.11) and installs the project with what it needs, once.
PY ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "need $(PY) on PATH"; exit 1; }
	@test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -qq --upgrade pip
	$(VENV)/bin/pip install -qq -e '.[test,bench,docs]'
	@touch $(STAMP)

.PHONY: env demo test lint bench docs
env: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python examples/quickstart.py

# Two pytest workers, each a whole module at a time (module fixtures stay one Ray engine and one
# Spark session per module; each worker has its own local Ray): the suite waits on actor starts
# and timers far more than it computes, and one worker kept this 2-core machine 40% busy. Modules
# go longest first (tests/conftest.py), not in xdist's most-tests-first order.
test: $(STAMP)
	$(VENV)/bin/ruff check actors runtime connectors examples tests
	$(MAKE) --no-print-directory docs
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

lint: $(STAMP)
	$(VENV)/bin/ruff check actors runtime connectors examples tests

# The docs site into build/site: --strict fails on any warning (a broken link, a missing API
# object). mkdocs-material's banner about its successor is not a warning of this site's.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

bench: $(STAMP)
	$(VENV)/bin/python examples/benchmark.py ledger
