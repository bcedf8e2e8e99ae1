# The two set-up commands of a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# The test process imports torch for the trainer's unit tests: the cpu profile's versions.
TEST_TRAIN_PINS := torch==2.13.0 transformers==5.6.0 numpy

.PHONY: install demo test test-fast bench

install:
	$(PIP) install -q -e .

demo: install
	$(PYTHON) -m envkit create --profile cpu
	$(PYTHON) -m envkit doctor --profile cpu


test:
	$(PIP) install -q -e '.[dev]' $(TEST_TRAIN_PINS)
	$(PYTHON) -m pytest -q -ra

test-fast:
	$(PYTHON) -m pytest -q -ra -m "not slow"

bench:
	$(PYTHON) bench/create.py
