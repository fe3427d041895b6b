"""``spec-router doctor`` against llama.cpp's own llama-server (``/props``, ``/slots``, the
``/metrics`` header): what the sims copy, read from the real engine."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.real.conftest import Engines


def doctor(spec: str, base: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "router", "doctor", "--speculative", spec, "--baseline", base,
         "--json", "--timeout", "20"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout)


def test_the_pair_is_read_from_the_engines_and_has_no_finding(engines: Engines) -> None:
    status, doc = doctor(engines.speculative.url, engines.baseline.url)
    assert status == 0 and doc["findings"] == [], doc["findings"]
    spec, base = doc["engines"]
    assert (spec["flavor"], spec["speculative"], base["speculative"]) == ("llamacpp", True, False)
    assert spec["spec_evidence"] == "/slots speculative=true"
    assert spec["running_cap"] == base["running_cap"] > 0  # --parallel, from /props
    assert spec["model_path"] == base["model_path"] and spec["metrics"] and base["metrics"]
    # each launch has its own start time (the /metrics header): two engines, not one
    assert spec["identity"] != base["identity"] and spec["identity"]


def test_swapped_and_one_engine_under_two_names(engines: Engines) -> None:
    spec, base = engines.speculative.url, engines.baseline.url
    status, doc = doctor(base, spec)
    assert status == 1 and [f["code"] for f in doc["findings"]] == ["pools-swapped"]
    twice = spec.replace("127.0.0.1", "localhost")
    status, doc = doctor(f"{spec},{twice}", base)
    (same,) = [f for f in doc["findings"] if f["code"] == "same-engine"]
    assert same["level"] == "warning" and set(same["urls"]) == {spec, twice}
