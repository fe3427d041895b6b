#!/usr/bin/env bash
# `make real-engine`: build (the first time; cached) and run both llama-servers in the
# foreground: speculative on 127.0.0.1:30001, baseline on 127.0.0.1:30002 (the router's
# defaults), one core each. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
paths=$(PY="$PY" bash scripts/real-engine/build.sh)
eval "$paths"
export SPEC_ROUTER_LLAMA_SERVER SPEC_ROUTER_REAL_MODELS
exec "$PY" -m router.tools.llamacpp "$@"
