#!/usr/bin/env bash
# Make sure the Prometheus server and promtool are installed (Debian package `prometheus`), for
# tests/deploy. Idempotent: does nothing when both are on PATH. Needs root or sudo the first time.
#
# The package would normally start a system Prometheus on :9090; the tests run their own on a
# loopback port, so service start-up is suppressed while installing (policy-rc.d, as in Docker
# images) and the recommended node exporter is not installed.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

POLICY=/usr/sbin/policy-rc.d
CREATED_POLICY=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 755 "$POLICY"
    CREATED_POLICY=1
fi
cleanup() {
    if [ "$CREATED_POLICY" = 1 ]; then
        $SUDO rm -f "$POLICY"
    fi
}
trap cleanup EXIT

echo "ensure-prometheus: installing the Debian package prometheus" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null

command -v prometheus >/dev/null && command -v promtool >/dev/null
echo "ensure-prometheus: $(prometheus --version 2>&1 | head -n 1)" >&2
