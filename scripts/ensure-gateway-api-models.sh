#!/usr/bin/env bash
# The Gateway API's published schemas for tests/deploy: the npm package
# @kubernetes-models/gateway-api (validators compiled from the Gateway API CRDs' OpenAPI schemas)
# in .cache/gateway-api-models, installed once with the machine's npm. Prints the directory.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${GATEWAY_API_MODELS:-.cache/gateway-api-models}
VERSION=2.0.0
if [ ! -f "$DIR/.installed-$VERSION" ]; then
    rm -rf "$DIR"
    mkdir -p "$DIR"
    npm install --prefix "$DIR" --no-audit --no-fund --silent \
        "@kubernetes-models/gateway-api@$VERSION" >&2
    touch "$DIR/.installed-$VERSION"
fi
cd "$DIR" && pwd
