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

# Stamps: reinstall only when pyproject.toml (what each extra holds) or this file (which
# extras) changes. `make serve` installs what every command the README and docs show after
# it needs: inferd (the server, and bench, tune and optimize: src/inferd_tools), the example
# models' builders, the `bench` extra (matplotlib, for `inferd bench --plot` and `inferd
# optimize --plot`), the `optimize` extra (onnx, for `inferd optimize`), the `monitoring`
# extra (scipy, for models with a drift reference: docs/monitoring.md), and the `redis` extra
# (the response cache's Redis tier, --cache-config redis: docs/cache.md).
# tests/unit/test_dependencies.py checks it.
SERVE_EXTRAS := examples,bench,optimize,monitoring,redis
$(VENV)/.serve-deps: pyproject.toml Makefile | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[$(SERVE_EXTRAS)]' '$(TORCH)'
	touch $@

$(VENV)/.test-deps: pyproject.toml Makefile | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[$(SERVE_EXTRAS),test]' '$(TORCH)'
	touch $@ $(VENV)/.serve-deps

models: $(VENV)/.serve-deps
	$(BIN)/python examples/build_models.py examples/models
	$(BIN)/python examples/build_models.py --config-reference examples/config-reference

serve: models
	$(BIN)/inferd serve --model-repository examples/models $(ARGS)

# promtool and prometheus, for tests/integration/deploy/test_deploy.py, nginx, for
# test_replicas.py, and Chromium with chromedriver, for test_docs_page.py: Debian's
# `prometheus`, `nginx`, `chromium` and `chromium-driver` packages through apt-get, with sudo
# when not root; and perf_analyzer (its own venv under benchmarks/,
# about a minute the first time) for test_perf_analyzer.py. A no-op once installed. If they
# cannot be installed the run goes on and those tests are skipped, saying why (CI makes the
# Prometheus, nginx and Chromium ones fail instead).
test-tools:
	@sh scripts/install-test-tools.sh || echo "make test: promtool/prometheus/nginx/chromium not installed" \
	  "(see above); the tests that need them will be skipped" >&2
	@bash benchmarks/perf_analyzer.sh --install || echo "make test: perf_analyzer not" \
	  "installed (see above); the tests that need it will be skipped" >&2

# The suite runs under coverage (servers and worker processes the tests start included:
# pyproject.toml's [tool.coverage.run]); `make check` then holds the line count it reached.
test: $(VENV)/.test-deps test-tools
	@rm -f .coverage .coverage.*
	@status=0; $(BIN)/coverage run -m pytest $(ARGS) || status=$$?; \
	  $(BIN)/coverage combine -q >/dev/null 2>&1 || true; exit $$status

# The coverage gate reads what the last `make test` measured: run the whole suite first.
check: $(VENV)/.test-deps
	$(BIN)/ruff format --check src tests examples benchmarks
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/mypy
	@test -f .coverage || { echo "make check: no coverage data; run the whole suite first" \
	  "(make test), then make check" >&2; exit 1; }
	@total=$$($(BIN)/coverage report --format=total 2>&1) || { echo "make check: $$total" \
	  "(src/inferd's lines; a partial run, make test ARGS=..., measures less: run the whole" \
	  "suite)" | tr '\n' ' ' >&2; echo >&2; exit 1; }; \
	  echo "coverage of src/inferd: $$total% (gate: $$(sed -n 's/^fail_under = //p' pyproject.toml)%)"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .coverage .coverage.*
