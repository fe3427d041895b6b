"""The objective on the router's surfaces, over a real router and sims: /metrics has the
within-SLO series, /router/status the recent share, and under ``slo`` without curves every
surface says it decides as spillover (issue 34, item 7)."""

from __future__ import annotations

import httpx

from tests.conftest import RouterFactory
from tests.support.http import metric_value, router_status

CHAT = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_within_slo_series_and_deciding_as(start_router: RouterFactory) -> None:
    # a lax SLO the sims meet, and one no request can meet: each request is judged
    router = start_router(policy="slo", slo_ttft_ms="60 s", slo_tpot_ms="10 s")
    n = 6
    with httpx.Client(base_url=router.url, timeout=30) as client:
        for _ in range(n):
            with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
                r.read()
                assert r.status_code == 200
                # no table, nothing learned yet: slo decides as spillover, and says so
                assert r.headers["x-spec-router-deciding-as"] == "spillover"
                assert r.headers["x-spec-router-reason"] in ("below_crossover", "above_crossover")
        strict = {"x-slo-ttft-ms": "0.001", "x-slo-tpot-ms": "0.001"}
        r = client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=strict)
        assert r.status_code == 200
        text = client.get("/metrics").text
        status = router_status(router.url)
    assert metric_value(text, "spec_router_slo_judged_total") == n + 1
    for tier in ("strict", "relaxed"):
        assert metric_value(text, "spec_router_slo_met_total", tier=tier) == n
    assert "# TYPE spec_router_slo_met_total counter" in text
    assert (status["policy"], status["deciding_as"]) == ("slo", "spillover")
    assert "no curves yet" in status["deciding_as_why"]
    within = status["recent"]["within_slo"]["all"]
    assert within["judged"] == n + 1
    assert within["strict"] == round(n / (n + 1), 4)
