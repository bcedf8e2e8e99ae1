# The two set-up commands of a fresh machine: `make demo` and `make test`. Both install into a project venv,
# .venv, that they create: never into the interpreter they are started with (a Debian or Ubuntu Python is
# externally managed, PEP 668, and a tool about clean environments should not install itself globally).
BOOTSTRAP_PYTHON ?= python3
VENV := .venv
PYTHON := $(VENV)/bin/python
PIP := $(PYTHON) -m pip
# The test process imports torch for the trainer's unit tests (the cpu profile's torch) and loads exports
# with Z Lab's reference `dflash`, whose model module needs a transformers with
# DynamicCache.activate_past_recording (5.15); the managed cpu venv keeps its locked 5.6.0, so an export
# made there is read by another transformers, as a serving engine would.
TEST_TRAIN_PINS := torch==2.13.0 transformers==5.15.0 numpy
REFERENCE_DFLASH := dflash==0.1.0

.PHONY: install demo test test-fast bench

# The project venv, made once with the standard library's venv. A setuptools new enough to build a wheel from
# pyproject.toml alone (>= 71) lets the editable install skip pip's isolated build env (3.6 s against 7.4 s).
$(PYTHON):
	$(BOOTSTRAP_PYTHON) -m venv $(VENV)
	$(PIP) install -q 'setuptools>=71'

EDITABLE := $(PIP) install -q --no-build-isolation -e

# An editable install writes no bytecode, and where PYTHONDONTWRITEBYTECODE is set nothing ever does: every
# `envkit` command would compile its ~130 modules from source (25 ms of doctor's 0.3 s). Compile them once.
install: $(PYTHON)
	$(EDITABLE) .
	$(PYTHON) -m compileall -q envkit trainer

# The main job end to end on the embedded `tiny` CPU default: create, doctor, warm-cache, train, summary.
demo: install
	$(PYTHON) -m envkit train --preset tiny

# Every tier, on three pytest-xdist workers that share the session's venv, warm cache and trained runs
# (tests/README.md): on two cores, a third worker runs while another waits on a server, a poll or a child process
# (1,347.5 s against 1,447.9 s for two, back to back from fresh clones, bench/RESULTS.md); the 30 slowest listed
# at the end, so every CI log says where the suite's time goes.
test: $(PYTHON)
	$(EDITABLE) '.[dev]' $(TEST_TRAIN_PINS)
	$(PIP) install -q --no-deps $(REFERENCE_DFLASH)
	$(PYTHON) -m compileall -q envkit trainer
	$(PYTHON) -m pytest -q -ra -n 3 --dist loadgroup --durations=30

# The unit tier only (tests/README.md): in-process and short subprocesses, no venv built, nothing trained. Its
# tests are single-threaded, so two workers nearly halve it (159 s -> 85 s on the 2-core VM, bench/RESULTS.md).
test-fast: $(PYTHON)
	$(EDITABLE) '.[dev]' $(TEST_TRAIN_PINS)
	$(PYTHON) -m pytest -q -ra -m unit -n 2

bench: install
	$(PYTHON) bench/create.py
	$(PYTHON) bench/doctor.py
	$(PYTHON) bench/train_tiny.py
	$(PYTHON) bench/compile_cache.py
