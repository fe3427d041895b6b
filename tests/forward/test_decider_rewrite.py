"""The decider's hot path, written out for speed (session 13: ``_loads``, ``_offered`` and
``usable_count`` inline, the nearest surface kept per bucket, the named tuples built as
tuples, ``RecentRate.add`` without ``max``, the keeper's sizes read only when a request lacks
one), decides as the rule as first written.

On random runs (pools of one to four engines, leases taken and released, engines failing and
ramping back in, ejections, the clock moving by microseconds to seconds, requests of every
size and class with and without their own sizes, the keeper's timer), at every decision:

- the request is what the keeper's sizes made of it before (``old_request``);
- the decision and the policy's state are those of the ``slo`` policy as first written
  (``tests.decide.slo_reference``) over a snapshot built from scratch out of the same live
  state: views straight from the tracker and the registry, the arrival rate read from the
  decider's ``RecentRate``, the rate bucket and the nearest surface by the helpers as they
  were (``old_bucket``, ``old_nearest``), and the decision's load and prefill the view's and
  the model's;
- the rates the decider keeps (arrivals, and per engine) equal, field for field, shadow copies
  fed by ``RecentRate.add`` as it was (``old_add``).
"""

from __future__ import annotations

import math
import random

import pytest

from router.account.inflight import InflightTracker, Lease
from router.decide.capacity import Surface
from router.decide.policy import BackendView, PoolView, Snapshot
from router.decide.predict import PoolModel, Request
from router.decide.snapshot import LATELY, OFFERED_WINDOW, RecentRate, Traffic
from router.forward.decider import MIN_RATE, RATE_STEP, Decider, _distance
from router.forward.request import RequestInfo
from router.health.state import HealthConfig, HealthRegistry
from router.pools import BASELINE, POOLS, SPECULATIVE, Pool
from router.sim.model import BASELINE as BASE_PRESET
from router.sim.model import EAGLE3, EAGLE3_CHAIN
from tests.decide.slo_reference import reference_slo
from tests.forward.test_decider import Clock, Tuning
from tests.support.models import preset_model


def old_request(d: Decider, info: RequestInfo) -> Request:
    """``Decider.request`` before the rewrite."""
    traffic = d.tuning.traffic
    tokens = info.prompt_tokens
    if tokens is None:
        tokens = round(info.prompt_chars * traffic.tokens_per_char)
    output = info.max_tokens if info.max_tokens else traffic.mean_output
    return Request(float(tokens), float(output), info.sampling, d.slo_ttft, d.slo_tpot)


def old_bucket(engines: int, offered: float | None) -> int | None:
    """``Decider._bucket`` before the rewrite."""
    if offered is None:
        return None
    per_engine = max(MIN_RATE, offered / max(1, engines))
    return round(math.log(per_engine) / math.log(RATE_STEP))


def old_nearest(d: Decider, bucket: int | None) -> Surface:
    """The surface ``Decider._surface_at`` took before the rewrite (its surfaces known)."""
    found = d._surfaces.get(bucket)
    if found is not None:
        return found
    known = d._surfaces or d._stale
    return known[min(known, key=lambda b: _distance(b, bucket))]


def old_add(rate: RecentRate, now: float, prefill: float = 0.0) -> None:
    """``RecentRate.add`` before the rewrite."""
    rate.until = max(rate.until, now) + prefill
    rate.count = (
        rate.count * math.exp(-(now - rate.at) / rate.window) + 1.0
        if now > rate.at
        else rate.count + 1.0
    )
    rate.at = max(rate.at, now)


def fields(rate: RecentRate) -> tuple[float, float, float, float]:
    return rate.count, rate.at, rate.window, rate.until


def built(d: Decider, req: Request) -> Snapshot:
    """The snapshot of this moment, from scratch: the loads from the tracker, health as the
    decider holds it (a ramping engine's weight moves a step at a time: the kept views until
    the registry or the clock says it moved, else the registry's), no surface memoised."""
    now = d.clock()
    pools = []
    for name in POOLS:
        urls = d.pools[name]
        kept = d._backends.get(name)
        valid = (
            kept is not None
            and kept.urls is urls
            and kept.count == len(urls)
            and kept.version == d.health.version
            and now < kept.until
        )
        views = tuple(
            BackendView(
                url,
                d.tracker.by_backend[url] + d.tracker.lingering(url, now),
                kept.views[i].usable if kept and valid else d.health.usable(url, now),
                kept.views[i].weight if kept and valid else d.health.weight(url, now),
            )
            for i, url in enumerate(urls)
        )
        pools.append(PoolView(name, views))
    models = d.tuning.models
    assert models is not None
    arrivals = d._arrivals
    offered = None if arrivals is None else arrivals.rate(now) * models[SPECULATIVE].scale
    engines = sum(1 for pool in pools for b in pool.backends if b.usable)
    surf = old_nearest(d, old_bucket(engines, offered))
    spec, base = pools
    tuning = d.tuning
    return Snapshot(
        spec,
        base,
        tuning.crossover,
        d.hysteresis,
        d._state,
        tuning.gain,
        req,
        surf,
        offered,
        d._recent,
        now,
        tuning.no_crossover,
    )


MODELS: list[dict[Pool, PoolModel]] = [
    {SPECULATIVE: preset_model(EAGLE3), BASELINE: preset_model(BASE_PRESET)},
    {SPECULATIVE: preset_model(EAGLE3_CHAIN), BASELINE: preset_model(BASE_PRESET)},
]


def random_info(rng: random.Random) -> RequestInfo:
    tokens = rng.choice([None, None, 1, 300, rng.randint(1, 6000)])
    return RequestInfo(
        stream=True,
        max_tokens=rng.choice([None, 0, 16, 200, rng.randint(1, 2000)]),
        temperature=rng.choice([None, 0.0, 0.7]),
        prompt_chars=rng.choice([0, 40, rng.randint(1, 30000)]),
        prompt_tokens=tokens,
    )


@pytest.mark.parametrize("seed", range(6))
def test_the_written_out_decider_decides_as_first_written(seed: int) -> None:
    rng = random.Random(seed)
    clock = Clock()
    urls: dict[Pool, list[str]] = {
        pool: [f"http://{pool}/{i}" for i in range(rng.randint(1, 4))] for pool in POOLS
    }
    every = [u for pool in POOLS for u in urls[pool]]
    tracker = InflightTracker([(p, u) for p in POOLS for u in urls[p]], clock)
    health = HealthRegistry(every, HealthConfig(ramp_seconds=rng.choice([0.0, 10.0])), clock())
    for url in every:
        health.probe(url, True, clock())
    tuning = Tuning(models=rng.choice(MODELS), traffic=Traffic(180.0, 0.27, 0.8))
    d = Decider(urls, tracker, health, tuning, {}, policy="slo", hysteresis=1, clock=clock)
    d.refresh()  # (something known: the oracle takes the nearest, as the decider does)
    held: list[tuple[float, Lease]] = []
    arrivals: RecentRate | None = None
    sent: dict[str, RecentRate] = {}
    reasons: set[str] = set()
    for step in range(500):
        clock.now += rng.choice([0.0, 1e-6, 0.002, 0.02, 0.3, 2.0])
        for end, lease in list(held):
            if end <= clock.now:
                lease.release()
                held.remove((end, lease))
        if rng.random() < 0.03:  # an engine fails its probes, or comes back (ramping in)
            url = rng.choice(every)
            ok = rng.random() < 0.5
            for _ in range(3):
                health.probe(url, ok, clock.now)
        if rng.random() < 0.01:
            health.eject(rng.choice(every), clock.now, "reset")
        if step % 60 == 59:
            d.refresh()
        if rng.random() < 0.02:
            tracker.linger(rng.choice(every), clock.now + rng.random())
        info = random_info(rng)
        req = d.request(info)
        assert req == old_request(d, info)
        assert req is not None
        snap = built(d, req)
        expected, state = reference_slo(snap)
        got = d.decide(req)
        if expected is None:
            assert got is None
            continue
        assert got is not None
        models = tuning.models
        assert models is not None
        view = next(b for b in snap.pool(expected.pool).backends if b.url == expected.backend)
        prefill = models[expected.pool].prefill(req.prompt_tokens)
        assert got == expected._replace(load=view.load, prefill=prefill), step
        assert d._state == state
        reasons.add(got.reason)
        # the rates the decider keeps, against shadows fed as before
        scale = models[SPECULATIVE].scale
        if arrivals is None:
            arrivals = RecentRate(OFFERED_WINDOW * scale, clock.now)
        old_add(arrivals, clock.now)
        shadow = sent.setdefault(got.backend, RecentRate(LATELY * scale, clock.now))
        old_add(shadow, clock.now, prefill * models[got.pool].scale)
        assert d._arrivals is not None and fields(d._arrivals) == fields(arrivals)
        assert {u: fields(r) for u, r in d._recent.items()} == {
            u: fields(r) for u, r in sent.items()
        }
        held.append((clock.now + rng.choice([0.01, 0.5, 3.0, 20.0]), tracker.acquire(got.backend)))
    for _, lease in held:
        lease.release()
    # (what makes the comparison worth something: the runs reach more than one step)
    assert len(reasons) > 1, reasons


def test_the_nearest_surface_kept_per_bucket_follows_new_surfaces() -> None:
    """The nearest surface the decider keeps for a bucket with none of its own is dropped as
    soon as the surfaces change (a refresh, new models): it never stands for a stale one."""
    clock = Clock()
    urls: dict[Pool, list[str]] = {SPECULATIVE: ["http://s"], BASELINE: ["http://b"]}
    tracker = InflightTracker([(p, u) for p in POOLS for u in urls[p]], clock)
    health = HealthRegistry(["http://s", "http://b"], HealthConfig(), clock())
    for url in ("http://s", "http://b"):
        health.probe(url, True, clock())
    tuning = Tuning(models=MODELS[0])
    d = Decider(urls, tracker, health, tuning, {}, policy="slo", hysteresis=1, clock=clock)
    req = Request(400.0, 200.0, False, 1.0, 0.025)
    d.refresh()
    for i in range(400):  # the arrival rate climbs through buckets no surface was computed for
        decision = d.decide(req)
        assert decision is not None
        tracker.acquire(decision.backend).release()
        clock.now += 0.001
        assert d._surface_at(7) is old_nearest(d, 7)
        if i % 100 == 99:
            d.refresh()
            assert d._surface_at(7) is old_nearest(d, 7)
    tuning.models = MODELS[1]
    assert d._surface_at(7) is old_nearest(d, 7) is d._surfaces[7]
