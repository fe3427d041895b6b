"""The pools' shortcuts (``PoolView.even`` and ``loads``) decide as the plain pass does.

The decider builds each pool's view with its loads at hand and a flag saying every backend is
usable at full weight; ``pick_backend`` and ``PoolView.load`` then read those instead of the
backends. On random states the answers must be the ones of the same pool without them."""

from __future__ import annotations

import random

import pytest

from router.decide.policy import (
    BackendView,
    PoolView,
    RoutingState,
    Snapshot,
    choose,
    pick_backend,
)
from router.pools import BASELINE, SPECULATIVE, Pool

POLICIES = ("spillover", "crossover", "round_robin", "predictive", "slo")


def pools(rng: random.Random, name: Pool) -> tuple[PoolView, PoolView]:
    """A random pool as the decider builds it (shortcuts on) and the same without them."""
    n = rng.randint(1, 64)
    top = rng.choice([1, 3, 300])  # few distinct loads (many ties) to many
    ramping = rng.random() < 0.3
    views = tuple(
        BackendView(
            f"http://{name}{i}",
            rng.randint(0, top),
            usable=not ramping or rng.random() < 0.8,
            weight=rng.choice([1.0, 0.25, 0.5]) if ramping else 1.0,
        )
        for i in range(n)
    )
    loads = [v.load for v in views]
    even = all(v.usable and v.weight >= 1.0 for v in views)
    return PoolView(name, views, even, loads), PoolView(name, views)


@pytest.mark.parametrize("seed", range(20))
def test_the_fast_pick_is_the_plain_pick_on_random_states(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        fast, plain = pools(rng, rng.choice([SPECULATIVE, BASELINE]))
        rr = rng.randint(0, 10_000)
        assert fast.load == plain.load == sum(b.load for b in plain.backends)
        assert fast.usable_count() == plain.usable_count()
        assert pick_backend(fast, rr) == pick_backend(plain, rr)
        tried = {b.url for b in plain.backends if rng.random() < 0.3}
        assert pick_backend(fast, rr, tried) == pick_backend(plain, rr, tried)


@pytest.mark.parametrize("seed", range(10))
def test_every_policy_decides_the_same_with_and_without_the_shortcuts(seed: int) -> None:
    rng = random.Random(1000 + seed)
    for _ in range(200):
        fast_spec, plain_spec = pools(rng, SPECULATIVE)
        fast_base, plain_base = pools(rng, BASELINE)
        state = RoutingState(rng.randint(0, 10_000), rng.random() < 0.5)
        crossover, hysteresis = rng.randint(1, 64), rng.randint(0, 4)
        for policy in POLICIES:
            fast = choose(policy, Snapshot(fast_spec, fast_base, crossover, hysteresis, state))
            plain = choose(policy, Snapshot(plain_spec, plain_base, crossover, hysteresis, state))
            assert fast == plain, policy
