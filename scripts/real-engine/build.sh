#!/usr/bin/env bash
# Build a real speculative engine for CPU: llama.cpp's `llama-server`, from the llama.cpp source
# that the llama-cpp-python sdist on PyPI vendors, and a synthetic target/draft GGUF model pair
# (mkmodel.py). Registry packages only: no model hub, nothing downloaded at run time.
#
# Cached per machine under $SPEC_ROUTER_REAL_ENGINE_CACHE (default
# ${XDG_CACHE_HOME:-~/.cache}/spec-router/real-engine):
#   server-<version>-<arch>/bin/llama-server     keyed by the llama-cpp-python version
#   models-<version>-<hash>/{target,draft}.gguf  keyed by the version, mkmodel.py and its arguments
# Each is built in a temporary directory and renamed into place when complete, so an interrupted
# build is never mistaken for a finished one. A second run finds both and only prints.
#
# Output (stdout, for `eval`): SPEC_ROUTER_LLAMA_SERVER=... and SPEC_ROUTER_REAL_MODELS=...;
# progress goes to stderr. Installs cmake, ninja-build and g++ with apt-get when missing.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
PY=${PY:-python3}
CACHE=${SPEC_ROUTER_REAL_ENGINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spec-router/real-engine}
# The model pair: see mkmodel.py. F32 target (decode stays memory-bound, where speculation pays
# on one core), q8_0 one-layer draft; eps 0.05 gives greedy acceptance ~0.67 per draft token.
MODEL_ARGS=(--eps 0.05 --n-layer 10 --n-embd 1024 --n-ff 2816 --seed 1234)

say() { echo "real-engine: $*" >&2; }

ensure_tools() {
    local missing=()
    command -v cmake >/dev/null || missing+=(cmake)
    command -v ninja >/dev/null || missing+=(ninja-build)
    command -v g++ >/dev/null || missing+=(g++)
    [ ${#missing[@]} -eq 0 ] && return 0
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    say "installing the Debian packages ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

SRC="$CACHE/src-$VERSION"
LLAMA="$SRC/llama_cpp_python-$VERSION/vendor/llama.cpp"

fetch_source() {
    [ -f "$SRC/.done" ] && return 0
    local tmp="$SRC.tmp.$$"
    rm -rf "$tmp" && mkdir -p "$tmp"
    say "downloading the llama-cpp-python $VERSION sdist from PyPI"
    "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$tmp" >&2
    tar xzf "$tmp/llama_cpp_python-$VERSION.tar.gz" -C "$tmp"
    rm -f "$tmp/llama_cpp_python-$VERSION.tar.gz"
    touch "$tmp/.done"
    rm -rf "$SRC" && mv "$tmp" "$SRC"
}

SERVER="$CACHE/server-$VERSION-$(uname -m)"

build_server() {
    [ -x "$SERVER/bin/llama-server" ] && return 0
    fetch_source
    ensure_tools
    local tmp="$SERVER.tmp.$$" began=$SECONDS
    rm -rf "$tmp" && mkdir -p "$tmp"
    say "building llama-server (CPU, static; several minutes on 2 cores; log: $tmp/build.log)"
    # The UI options off: otherwise the build tries to download the web UI. No curl, no OpenSSL:
    # nothing is fetched at run time.
    cmake -S "$LLAMA" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=OFF >"$tmp/build.log"
    cmake --build "$tmp/build" --target llama-server -j "$(nproc)" >>"$tmp/build.log"
    mkdir -p "$tmp/bin"
    cp "$tmp/build/bin/llama-server" "$tmp/bin/"
    rm -rf "$tmp/build"
    rm -rf "$SERVER" && mv "$tmp" "$SERVER"
    say "llama-server built in $((SECONDS - began)) s"
}

model_key() {
    { echo "$VERSION"; echo "${MODEL_ARGS[*]}"; cat "$HERE/mkmodel.py"; } | sha256sum | cut -c1-12
}

MODELS="$CACHE/models-$VERSION-$(model_key)"
TOOLS="$CACHE/venv-$VERSION"

build_models() {
    [ -f "$MODELS/target.gguf" ] && [ -f "$MODELS/draft.gguf" ] && return 0
    local began=$SECONDS
    if [ ! -f "$TOOLS/.done" ]; then
        fetch_source
        say "making a venv with numpy and llama.cpp's gguf-py for the model writer"
        rm -rf "$TOOLS"
        "$PY" -m venv "$TOOLS"
        "$TOOLS/bin/pip" install -q numpy "$LLAMA/gguf-py" >&2
        touch "$TOOLS/.done"
    fi
    local tmp="$MODELS.tmp.$$"
    rm -rf "$tmp"
    say "writing the target/draft model pair"
    "$TOOLS/bin/python" "$HERE/mkmodel.py" --out "$tmp" "${MODEL_ARGS[@]}" >&2
    rm -rf "$MODELS" && mv "$tmp" "$MODELS"
    # Pairs of earlier parameters are 450 MB each: keep only the current one.
    find "$CACHE" -maxdepth 1 -name 'models-*' ! -path "$MODELS" -exec rm -rf {} +
    say "models written in $((SECONDS - began)) s"
}

mkdir -p "$CACHE"
began=$SECONDS
build_server
build_models
say "ready after $((SECONDS - began)) s: $SERVER/bin/llama-server, $MODELS"
echo "SPEC_ROUTER_LLAMA_SERVER=$SERVER/bin/llama-server"
echo "SPEC_ROUTER_REAL_MODELS=$MODELS"
