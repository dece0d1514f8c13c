# compass: the two commands a newcomer needs are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The CPU build of torch is installed first, from local disk where it lies there, so that the
# project's `torch` requirement is met and pip never pulls a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
# `make test` runs the suite on this many processes (pytest-xdist); tests/conftest.py keeps
# together the tests that must share one. TEST_JOBS=0 runs it in this process alone. The tests
# marked solo (how a worker copes with a burst, its CPU) run after, alone.
TEST_JOBS ?= 2

.PHONY: install test lint demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.cfg
	$(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

test: install
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadgroup -m "not solo" --durations=25
	$(PY) -m pytest -m solo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

demo: install
	$(VENV)/bin/compass demo

bench: install
	$(VENV)/bin/compass bench wire --json results/wire.json
	$(VENV)/bin/compass bench job --json results/job.json
	$(VENV)/bin/compass bench cache --json results/cache.json
	$(VENV)/bin/compass bench plan --json results/plan.json
	$(VENV)/bin/compass bench chain --json results/chain.json
	$(VENV)/bin/compass bench e2e --json results/e2e.json --plot results/e2e.png

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis results
