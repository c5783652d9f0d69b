# The two set-up commands of the README: `make run` and `make test`; `make check` is the fast inner loop.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: run test check check-types check-tests bench install clean mutate

# Python may keep what it compiles (__pycache__, ignored by git) whatever the shell says: pytest keeps its rewritten
# test modules there, and without them every pytest process (each xdist worker) rewrites them all again, eight
# seconds of a core each on two cores.
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/mm-bot dev

# The static checks come first and stop the run: ruff (lint, then formatting) and basedpyright, as pyproject.toml
# configures them.
# pytest runs over several processes (pytest-xdist): most tests wait on the processes they start, so more of them
# than cores keep the cores busy. worksteal: the slow thread tests are spread as they come. PYTEST_WORKERS=0 runs
# it in one process. The tests marked `alone` (a race against time or bytes) then run one at a time, on idle cores.
# Exit code 5 (PYTEST_ARGS chose no test of that part) is not a failure.
PYTEST_WORKERS ?= 4
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/basedpyright
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist worksteal -m "not alone" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The fast inner loop (under two minutes on two cores): the same static checks, then only the tests that start no
# process (`pytest --no-process`, mm_testkit/process_guard.py: a test that starts one there fails, naming the fix).
# basedpyright (one core, most of a minute) runs beside pytest rather than before it.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(MAKE) --no-print-directory -j2 check-types check-tests

check-types: $(STAMP)
	$(VENV)/bin/basedpyright

check-tests: $(STAMP)
	$(PY) -m pytest --no-process -n auto $(PYTEST_ARGS)

# Mutation testing of the modules that decide, the core's and the service's (scripts/mutate.py says how): about
# 35 minutes on two cores, so it is not part of `make test`. MUTATE_ARGS narrows it to what a change touches, e.g.
# MUTATE_ARGS="--module chatops/inbox.py --max 20" (a few minutes); `--list` shows the mutants without running them.
mutate: $(STAMP)
	$(PY) scripts/mutate.py $(MUTATE_ARGS)

bench: $(STAMP)
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) var .pytest_cache
