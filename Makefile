# specroute: `make run` starts the whole system on models/demo; `make test` runs every test.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: install run test test-fast bench chaos lint proto chart manifest clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned, so the CPU build on local disk is used and nothing pulls a CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,deploy]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/specroute serve --model models/demo

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -q -m "not e2e and not slow" $(PYTEST_ARGS)

bench: install
	$(BIN)/specroute bench engine --engines ar --out bench/results/

# the chaos suite alone (also part of `make test`), its table written to bench/results/chaos.json
chaos: install
	@mkdir -p bench/results
	SPECROUTE_CHAOS_REPORT=bench/results/chaos.json $(BIN)/python -m pytest -q -p no:cacheprovider -m chaos tests/chaos

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# the Helm chart: helm lint (strict) and a schema check of what `helm template` renders (also in `make test`)
chart: install
	$(BIN)/python deploy/tools/chart.py lint
	$(BIN)/python deploy/tools/chart.py validate

# rewrite deploy/k8s/specroute.yaml from the chart (tests/deploy checks it is current)
manifest: install
	$(BIN)/python deploy/tools/chart.py manifest

proto: install
	$(BIN)/python -m grpc_tools.protoc -I protos --python_out=. --pyi_out=. --grpc_python_out=. protos/specroute/v1/engine.proto

clean:
	rm -rf $(VENV) .pytest_cache
