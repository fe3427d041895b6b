"""The poller reads each engine's mode where the engine says it (SGLang's /server_info, vLLM's
spec-decode counters) and flags an engine in the wrong pool: in /router/status, in a metric,
and (the pool checks: router.health.pool_check) in one log line. Real sims of both engines, in
swapped pools."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import RouterFactory
from tests.support.http import metric_value, router_status, wait_for
from tests.support.processes import Proc


def modes(url: str) -> dict[str, dict[str, Any]]:
    """Each backend's engine mode, once every backend's has been read (else empty)."""
    pools = router_status(url)["pools"]
    read = {b["url"]: b["engine_mode"] for pool in pools.values() for b in pool["backends"]}
    return read if all(read.values()) else {}


def test_an_engine_in_the_other_pools_mode_is_flagged(
    start_router: RouterFactory, engine_sims: dict[str, Proc], engine: str
) -> None:
    spec, base = engine_sims["speculative"].url, engine_sims["baseline"].url
    # as configured right: each engine's mode is read, and fits
    right = start_router(spec, base)
    seen = wait_for(lambda: modes(right.url))
    evidence = "/server_info" if engine == "sglang" else "/metrics vllm:spec_decode_"
    assert (seen[spec]["mode"], seen[spec]["mismatch"]) == ("speculative", None)
    assert (seen[base]["mode"], seen[base]["mismatch"]) == ("baseline", None)
    assert str(seen[spec]["evidence"]).startswith(evidence)
    # swapped: both flagged, each said once in the log
    wrong = start_router(base, spec, log_level="warning")
    flagged = wait_for(lambda: modes(wrong.url))
    assert str(flagged[base]["mismatch"]).startswith("in the speculative pool but runs without")
    assert str(flagged[spec]["mismatch"]).startswith("in the baseline pool but runs speculative")
    text = httpx.get(f"{wrong.url}/metrics", timeout=5).text
    assert metric_value(text, "spec_router_backend_mode_mismatch", backend=spec) == 1
    assert metric_value(text, "spec_router_backend_mode_mismatch", backend=base) == 1
    # (checked as each engine answers: the first alone may be said as misplaced before both
    # are said as swapped, once)
    said = wait_for(lambda: [line for line in wrong.output if "pools: pools-swapped" in line])
    assert len(said) == 1 and "ERROR spec_router.health: pools: pools-swapped" in said[0], said
