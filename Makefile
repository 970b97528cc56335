# The two commands of the quick start: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: serve test check models bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Stamps: reinstall only when pyproject.toml changes.
$(VENV)/.serve-deps: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[examples]'
	touch $@

$(VENV)/.test-deps: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[examples,test]'
	touch $@ $(VENV)/.serve-deps

models: $(VENV)/.serve-deps
	$(BIN)/python examples/build_models.py examples/models

serve: models
	$(BIN)/inferd serve --model-repository examples/models $(ARGS)

test: $(VENV)/.test-deps
	$(BIN)/python -m pytest $(ARGS)

check: $(VENV)/.test-deps
	$(BIN)/ruff format --check src tests examples benchmarks
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
