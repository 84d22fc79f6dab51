# The everyday commands. `make test` is what CI runs (through .ci/run).
PYTHON ?= python3

.PHONY: install test test-fast test-gpu lint bench suite benchmarks

install:
	$(PYTHON) -m pip install -e ".[dev]"

test:  # one pytest-xdist worker per CPU
	$(PYTHON) -m pytest -q -n logical

test-fast:
	$(PYTHON) -m pytest -q -n logical -m "not slow"

test-gpu:  # on a machine with a CUDA GPU: the GPU-marked tests only
	$(PYTHON) -m pytest -q -m gpu

lint:
	ruff check .

bench:  # the shipped kernel.py through the five stages and timing
	$(PYTHON) bench.py kernel.py

suite:  # every starter against eager, torch.compile and Liger on the GPU: writes BENCHMARKS.md
	$(PYTHON) bench.py --suite

benchmarks:  # BENCHMARKS.md (and the README's table) from the data under benchmarks/
	$(PYTHON) benchmarks/render.py
