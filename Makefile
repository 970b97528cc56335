# The two commands of the quick start: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: serve test test-tools check models bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch is pinned to the CPU build this project's machines keep on disk (pip takes it from
# there in seconds); an unpinned `torch` would pull a multi-GB CUDA build from PyPI.
TORCH ?= torch==2.13.0

# Stamps: reinstall only when pyproject.toml changes.
$(VENV)/.serve-deps: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[examples]' '$(TORCH)'
	touch $@

$(VENV)/.test-deps: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[examples,test]' '$(TORCH)'
	touch $@ $(VENV)/.serve-deps

models: $(VENV)/.serve-deps
	$(BIN)/python examples/build_models.py examples/models

serve: models
	$(BIN)/inferd serve --model-repository examples/models $(ARGS)

# promtool and prometheus, for tests/integration/test_deploy.py, and perf_analyzer (its own
# venv under benchmarks/, about a minute the first time) for test_perf_analyzer.py; a no-op
# once installed.
test-tools:
	sh scripts/install-test-tools.sh
	bash benchmarks/perf_analyzer.sh --install

test: $(VENV)/.test-deps test-tools
	$(BIN)/python -m pytest $(ARGS)

check: $(VENV)/.test-deps
	$(BIN)/ruff format --check src tests examples benchmarks
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
