#!/usr/bin/env bash
# `make bench`: every benchmark of the project, from a fresh clone.
#
# Installs what the benchmarks need from the system (nginx as the reference proxy, wrk as the
# standard non-streaming load generator) when missing, then runs each benchmark in turn. A
# benchmark script that does not exist yet is skipped with a note, not an error.
#
# Python: the active virtualenv, else the project's .venv (the Makefile creates it), else
# python3. Extra arguments are passed to bench/overhead.py, e.g. `bash bench/run.sh --reps 3`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${VIRTUAL_ENV:-}" ]]; then
    PY="$VIRTUAL_ENV/bin/python"
elif [[ -x .venv/bin/python ]]; then
    PY=.venv/bin/python
else
    PY=python3
fi

as_root() {
    if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

have_nginx() { command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]]; }

if ! have_nginx || ! command -v wrk >/dev/null || ! command -v taskset >/dev/null; then
    echo "bench: installing nginx and wrk with apt-get" >&2
    as_root apt-get update -qq
    # nginx-light is the smallest build; releases without it have plain nginx.
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light wrk util-linux \
        || as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx wrk util-linux
fi

# run [--cpu N] SCRIPT ARGS...: run a benchmark script, optionally pinned to one CPU.
run() {
    local pin=()
    if [[ $1 == --cpu ]]; then
        pin=(taskset -c "$2")
        shift 2
    fi
    local script=$1
    shift
    if [[ ! -f $script ]]; then
        echo "bench: skipping $script (not written yet)" >&2
        return 0
    fi
    echo "bench: ${pin[*]} $PY $script $*" >&2
    "${pin[@]}" "$PY" "$script" "$@"
}

# 1. Router overhead against direct, nginx and typical Python stacks (issue 3):
#    bench/results/overhead.md and overhead.json. About 15 minutes.
run bench/overhead.py "$@"

# 2. Simulated engines against their presets: bench/results/sim-fidelity.md.
#    It pins the sim to CPU 0 itself and runs its load generator where it is started: CPU 1.
run --cpu 1 bench/sim_fidelity.py --out bench/results/sim-fidelity.md

# 3. Calibration against the sims for 64-, 256- and 2048-token outputs (issue 6):
#    bench/results/calibration.md, tables and plots. About 6 minutes.
run bench/calibration.py

# 4. Every policy against the best static split over real HTTP (issue 6):
#    bench/results/policies.md. About 12 minutes.
run bench/policies.py

# 5. The learned crossover following an acceptance collapse and recovery (issue 6):
#    bench/results/learning.md. About 2 minutes.
run bench/learning.py

# 6. Policies on open-loop traffic, goodput under TTFT/TPOT SLOs (issue "Routing that wins on
#    real traffic"): bench/results/traffic.md, .json, .png. About 15 minutes. It pins its
#    routers to CPU 0 and its sims and replays to CPU 1 itself.
run bench/traffic.py

# 7. The soak (issue 13): 10,000 checked requests through four sims with client aborts, every
#    engine SIGKILLed and restarted, one hanging mid-stream and a slow reader; nothing lost,
#    nothing leaked: bench/results/soak.md. About 6 minutes. The router is pinned to CPU 0 and
#    the sims to CPU 1 by the script; its own load generator runs on CPU 1.
run --cpu 1 bench/soak.py

# 8. The fuzz suite's long run: 20x the examples of `make test`, freshly random (issue 13).
echo "bench: SPEC_ROUTER_FUZZ_PROFILE=long $PY -m pytest -q tests/forward/test_fuzz_e2e.py" >&2
SPEC_ROUTER_FUZZ_PROFILE=long "$PY" -m pytest -q -p no:cacheprovider tests/forward/test_fuzz_e2e.py

# 9. Scale figures, router against nginx (issue 14): SSE events per core, RSS per idle stream,
#    --workers 1 against 2: bench/results/scale.md. About 5 minutes.
run bench/scale.py --reps 3

# 10. What an open live page costs the request path: bench/results/ui-overhead.md.
run bench/ui_overhead.py --reps 3 --duration 2 --retries 1 --quiet-wait 10

# bench/results/README.md lists every result, with the command that makes it; the probes in
# bench/lab/ are run by hand.
# Later benchmarks go here, one `run bench/<name>.py` line each.
