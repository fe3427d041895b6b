"""``bench/lab/family_select.py``: the replay through the router's model (one request's times
on an idle engine, the rules' placements) and ``pick``'s max-min choice with hysteresis."""

from __future__ import annotations

import math
from pathlib import Path

from router.decide.predict import PoolModel
from router.pools import BASELINE, SPECULATIVE
from tests.support.modules import load_script

fs = load_script(Path(__file__).resolve().parents[2] / "bench" / "lab" / "family_select.py")

# 20 ms an iteration at any batch; the speculative engine yields 2 tokens an iteration
SPEC = PoolModel(
    (0.02,) * 65, tau_greedy=2.0, tau_sampling=2.0, prefill_base=0.1, prefill_per_token=0.0, cap=64
)
BASE = PoolModel((0.02,) * 65, prefill_base=0.1, prefill_per_token=0.0, cap=64)


def setting(engines: int = 1) -> object:
    return fs.Setting(
        {SPECULATIVE: SPEC, BASELINE: BASE},
        {SPECULATIVE: engines, BASELINE: engines},
        None,
        None,
        4,
    )


def test_a_lone_request_takes_its_prefill_then_output_over_tau_iterations() -> None:
    times: list[tuple[float, float, str]] = []
    # spillover below the crossover: the speculative engine
    s, r = fs.replay(
        [fs.Arrived(0.0, 100, 101, False)], "spillover", setting(), 0.0, 30.0, times=times
    )
    first, last, url = times[0]
    assert url.startswith(SPECULATIVE)
    assert math.isclose(first, 0.02 + 0.1)  # its iteration and its prefill
    assert math.isclose(last - first, 50 * 0.02)  # 100 more tokens, 2 an iteration
    # TTFT 0.12 s, TPOT 10 ms: within both SLOs
    assert (s, r) == (1.0, 1.0)


def test_stretched_iterations_and_the_baseline_miss_the_strict_tpot() -> None:
    arrived = [fs.Arrived(0.0, 100, 101, False)]
    # three times slower: 30 ms a token on the speculative engine, within the relaxed 50 ms only
    assert fs.replay(arrived, "spillover", setting(), 0.0, 30.0, slow={SPECULATIVE: 3.0}) == (
        0.0,
        1.0,
    )
    # round robin's first is the speculative engine, its second the baseline (20 ms a token)
    times: list[tuple[float, float, str]] = []
    two = [fs.Arrived(0.0, 100, 101, False), fs.Arrived(0.01, 100, 101, False)]
    fs.replay(two, "round_robin", setting(), 0.0, 30.0, times=times)
    assert [u.split(":")[0] for _, _, u in times] == [SPECULATIVE, BASELINE]


def test_requests_not_done_by_the_drain_miss_both_and_the_warm_ones_are_not_scored() -> None:
    arrived = [fs.Arrived(0.0, 100, 100_001, False), fs.Arrived(5.0, 100, 11, False)]
    # the first is unscored (warm 1 s); the second is done
    assert fs.replay(arrived, "spillover", setting(), 1.0, 30.0) == (1.0, 1.0)
    # both scored: the long one (1000 s of decode) is not done 30 s after the last arrival
    assert fs.replay(arrived, "spillover", setting(), 0.0, 30.0) == (0.5, 0.5)


def test_pick_takes_the_rule_closest_to_both_bests_and_keeps_the_current_within_margin() -> None:
    scores = {"slo": (0.10, 0.90), "predictive": (0.30, 0.60), "round_robin": (0.25, 0.85)}
    # gaps to the bests (0.30, 0.90): slo -0.20, predictive -0.30, round robin -0.05
    assert fs.pick(scores, "slo", 0.0) == "round_robin"
    # round robin is 0.15 better than slo: a margin of 0.2 keeps slo, 0.1 does not
    assert fs.pick(scores, "slo", 0.2) == "slo"
    assert fs.pick(scores, "slo", 0.1) == "round_robin"
    assert fs.pick({}, "slo", 0.0) == "slo"


def test_reruns_measure_how_often_a_rule_is_within_reach_of_its_own_other_draws() -> None:
    # one workload; round robin and the default the same at every sim seed, predictive 10 points
    # of strict goodput apart between seed 0 and the others, spillover far behind everywhere
    strict = {
        "slo": (0.5, 0.5, 0.5),
        "round_robin": (0.5, 0.5, 0.5),
        "predictive": (0.7, 0.6, 0.6),
        "spillover": (0.1, 0.1, 0.1),
    }
    rows = {}
    for rule, each in strict.items():
        for k, s in enumerate(each):
            variant = fs.DEFAULT_ROWS[k] if rule == "slo" else fs._simple_variant(k)
            rows[(1, rule, variant)] = {"strict": s, "relaxed": 0.9}
    found = {name.split(" ")[0]: (two, five) for name, two, five in fs.reruns(rows, [1], (0, 1, 2))}
    assert found["slo"] == found["round_robin"] == (1.0, 1.0)
    # predictive: 0 -> 1 and 0 -> 2 are 10 points up (within), 1 -> 0 and 2 -> 0 are 10 down
    # (beyond 5), 1 <-> 2 equal: 4 of 6 ordered pairs
    assert found["predictive"] == (4 / 6, 4 / 6)
    # the best simple policy is predictive at every choice; a fresh run of it against the
    # reference of draw k: k = 0 (0.7): both fresh runs 10 below; k = 1, 2: within
    assert found["the"] == (4 / 6, 4 / 6)
