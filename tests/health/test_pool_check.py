"""The pool checks as the router keeps them: each backend's latest description, the findings
over all of them, logged once when they appear and when they go (no sockets)."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from router.health.info import EngineInfo
from router.health.pool_check import PoolCheck
from router.pools import BASELINE, SPECULATIVE

S1, S2, B1 = "http://127.0.0.1:1", "http://localhost:1", "http://127.0.0.1:2"
SPEC = EngineInfo(S1, "sglang", "0.5.23", served_model="m", model_path="m", speculative=True,
                  identity=(("sglang.random_seed", "1"),))  # fmt: skip
BASE = EngineInfo(B1, "sglang", "0.5.23", served_model="m", model_path="m", speculative=False,
                  identity=(("sglang.random_seed", "2"),))  # fmt: skip


def test_findings_follow_the_latest_descriptions_and_are_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check = PoolCheck({SPECULATIVE: [S1], BASELINE: [B1]})
    caplog.set_level(logging.INFO, "spec_router.health")
    assert check.update(SPEC) == [] and check.status() == []
    # the baseline answers serving another model: an error, logged at ERROR
    new = check.update(replace(BASE, served_model="other", model_path="other"))
    assert [f.code for f in new] == ["different-models", "different-model-names"]
    assert check.status()[0]["level"] == "error"
    assert check.status()[0]["kind"] == "pools"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and "pools: different-models" in errors[0].getMessage()
    # it rejoins (restarted) with the same answer: nothing new is logged
    caplog.clear()
    assert len(check.update(replace(BASE, served_model="other", model_path="other"))) == 0
    assert not caplog.records
    # ... then with the right model: resolved
    assert check.update(BASE) == [] and check.status() == []
    assert all("pools: resolved" in r.getMessage() for r in caplog.records)
    assert check.reported(B1) == {"flavor": "sglang", "version": "0.5.23", "model": "m",
                                  "speculative": False, "running_cap": None}  # fmt: skip
    assert check.reported("http://nowhere") is None


def test_one_engine_under_two_names_in_the_speculative_pool(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check = PoolCheck({SPECULATIVE: [S1, S2], BASELINE: [B1]}, quiet=True)
    check.update(SPEC)
    check.update(BASE)
    (new,) = check.update(replace(SPEC, url=S2))
    assert (new.code, new.level, new.urls) == ("same-engine", "warning", (S1, S2))
    assert not caplog.records  # quiet: another worker logs it


def test_a_model_map_allows_other_names_for_the_same_weights() -> None:
    renamed = replace(BASE, served_model="base-name", model_path="/data/m")
    assert PoolCheck({SPECULATIVE: [S1], BASELINE: [B1]}, mapped=True).update(SPEC) == []
    check = PoolCheck({SPECULATIVE: [S1], BASELINE: [B1]}, mapped=True)
    check.update(SPEC)
    assert check.update(renamed) == []
    check = PoolCheck({SPECULATIVE: [S1], BASELINE: [B1]})
    check.update(SPEC)
    assert [f.code for f in check.update(renamed)] == ["different-model-names"]
