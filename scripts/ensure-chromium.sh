#!/usr/bin/env bash
# Make sure a headless Chromium is installed (Debian package `chromium`), for the live page's
# browser test (tests/ui). Idempotent: does nothing when it is on PATH. Needs root or sudo the
# first time. Playwright drives this browser (executable_path); it never downloads its own.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

echo "ensure-chromium: installing the Debian package chromium" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null

command -v chromium >/dev/null
echo "ensure-chromium: $(chromium --version 2>/dev/null | head -n 1)" >&2
