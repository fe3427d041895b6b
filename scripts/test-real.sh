#!/usr/bin/env bash
# `make test-real`: the real-engine tier. Builds llama.cpp's llama-server and the model pair
# (scripts/real-engine/build.sh; cached, so only the first run on a machine builds), then runs
# tests/real against a speculative and a baseline server, one core each. Prints the wall time of
# both parts. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
began=$SECONDS
paths=$(PY="$PY" bash scripts/real-engine/build.sh)
eval "$paths"
export SPEC_ROUTER_LLAMA_SERVER SPEC_ROUTER_REAL_MODELS
built=$SECONDS
status=0
"$PY" -m pytest -q tests/real "$@" || status=$?
echo "test-real: build $((built - began)) s (0 when cached), tests $((SECONDS - built)) s," \
    "total $((SECONDS - began)) s"
exit $status
