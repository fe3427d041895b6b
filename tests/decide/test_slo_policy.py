"""The slo policy's choice over the pools' capacities (router.decide.capacity), on plain values:
the sims' presets as the models, a chat-like mix."""

from __future__ import annotations

import dataclasses

import pytest

from router.decide.capacity import Mix, Slo, Surface, surface
from router.decide.params import DEFAULT, Params
from router.decide.policy import BackendView, PoolView, Snapshot, choose, spillover
from router.decide.predict import PoolModel, Request
from router.decide.snapshot import RecentRate
from router.pools import BASELINE, SPECULATIVE, Pool
from router.sim.model import BASELINE as BASE_PRESET
from router.sim.model import EAGLE3, EAGLE3_CHAIN
from tests.support.models import preset_model

SPEC = preset_model(EAGLE3)
BASE = preset_model(BASE_PRESET)
MODELS: dict[Pool, PoolModel] = {SPECULATIVE: SPEC, BASELINE: BASE}
MIX = Mix(400.0, 200.0, 0.5, 0.6)
SLO = Slo(1.0, 0.025)


def surf(params: Params = DEFAULT, models: dict[Pool, PoolModel] = MODELS) -> Surface:
    return surface(models, MIX, SLO, params)


SURFACE = surf()


def req(prompt: float = 400, sampling: bool = False, ttft: float = 1.0) -> Request:
    return Request(prompt, 200.0, sampling, slo_ttft=ttft, slo_tpot=0.025)


def pool(name: Pool, *loads: int, weight: float = 1.0) -> PoolView:
    return PoolView(
        name,
        tuple(BackendView(f"http://{name}/{i}", n, weight=weight) for i, n in enumerate(loads)),
    )


def snap(
    spec: PoolView | int = 0,
    base: PoolView | int = 0,
    r: Request | None = None,
    s: Surface | None = SURFACE,
    offered: float | None = None,
) -> Snapshot:
    sv = spec if isinstance(spec, PoolView) else pool(SPECULATIVE, spec)
    bv = base if isinstance(base, PoolView) else pool(BASELINE, base)
    return Snapshot(sv, bv, 7, request=r or req(), surface=s, offered=offered)


def strict(name: Pool, sampling: bool = False) -> int:
    return SURFACE.pools[name].strict[int(sampling)]


def relaxed(name: Pool, sampling: bool = False) -> int:
    return SURFACE.pools[name].relaxed[int(sampling)]


def test_the_surface_has_room_within_both_targets() -> None:
    # (what the tests below rest on: each pool runs a few requests within the strict target
    # and more within the relaxed one)
    for name in (SPECULATIVE, BASELINE):
        assert 1 <= strict(name) < relaxed(name)


def test_a_lone_request_goes_to_the_speculative_engine() -> None:
    d = choose("slo", snap())[0]
    assert d is not None and (d.pool, d.reason) == (SPECULATIVE, "within_slo")
    # its predicted time per token there: one iteration of a lone request over EAGLE-3's tokens,
    # stretched a little by the prefills of the steady state's arrivals
    alone = SPEC.iteration(1) / EAGLE3.tau
    assert alone <= d.tpot < 1.15 * alone
    assert not d.extrapolated


def test_room_within_the_strict_target_goes_where_the_request_decodes_fastest() -> None:
    # (a request with next to no prompt: its prefill stalls those running next to nothing)
    r = req(prompt=1)
    # the speculative engine is at its strict capacity: the next one goes to the baseline
    full = strict(SPECULATIVE)
    d = choose("slo", snap(full, 0, r))[0]
    assert d is not None and (d.pool, d.reason) == (BASELINE, "within_slo")
    # two short of it: speculation still (its own time per token and the step it adds to the
    # one running there are less than the idle baseline's time per token)
    d = choose("slo", snap(full - 2, 0, r))[0]
    assert d is not None and d.pool == SPECULATIVE


def test_with_headroom_the_request_goes_where_it_slows_the_others_least() -> None:
    # (what the test rests on: the idle baseline and the speculative engine one short of its
    # strict capacity both serve the request with headroom below the strict target)
    r = req(prompt=1)
    full = strict(SPECULATIVE)
    spec, base = SURFACE.pools[SPECULATIVE], SURFACE.pools[BASELINE]
    assert max(spec.tpot[0][full], base.tpot[0][1]) <= DEFAULT.headroom * SLO.tpot
    # faster on its own on the speculative engine, but the step it adds there to each of the
    # requests running costs more in all than the baseline's slower token: the baseline
    assert spec.tpot[0][full] < base.tpot[0][1]
    d = choose("slo", snap(full - 1, 0, r))[0]
    assert d is not None and (d.pool, d.reason) == (BASELINE, "within_slo")
    # with no engine with that headroom, by its own time per token alone: speculation
    tight = surf(dataclasses.replace(DEFAULT, headroom=0.5))
    d = choose("slo", snap(full - 1, 0, r, s=tight))[0]
    assert d is not None and (d.pool, d.reason) == (SPECULATIVE, "within_slo")
    # and an engine with headroom goes before one close to the target: with the headroom
    # between the two engines' times per token the baseline (further from it) is not chosen
    between = (spec.tpot[0][full] + base.tpot[0][1]) / 2 / SLO.tpot
    split = surf(dataclasses.replace(DEFAULT, headroom=between))
    d = choose("slo", snap(full - 1, 0, r, s=split))[0]
    assert d is not None and d.pool == SPECULATIVE


def test_a_long_prompt_goes_where_its_prefill_stalls_fewer_requests() -> None:
    # one short of the speculative strict capacity, the baseline idle: a long prompt's prefill
    # would stall those running on the speculative engine, so it goes to the idle baseline
    d = choose("slo", snap(strict(SPECULATIVE) - 1, 0, req(prompt=4000, ttft=3.0)))[0]
    assert d is not None and (d.pool, d.reason) == (BASELINE, "within_slo")


def test_past_both_strict_capacities_the_relaxed_room_is_shared_by_share_of_it() -> None:
    spec_at, base_at = strict(SPECULATIVE), strict(BASELINE)
    d = choose("slo", snap(spec_at, base_at))[0]
    assert d is not None and d.reason == "within_relaxed"
    # the pool filled least against its relaxed capacity takes it
    fill = {
        SPECULATIVE: (spec_at + 1) / relaxed(SPECULATIVE),
        BASELINE: (base_at + 1) / relaxed(BASELINE),
    }
    assert d.pool == min(fill, key=lambda name: fill[name])


# A pair whose speculative engine holds more than twice the baseline's requests within the
# strict target (the chain-draft regime): the speculative pool is the strict pool.
CHAIN = surf(models={SPECULATIVE: preset_model(EAGLE3_CHAIN), BASELINE: BASE})


def chain_cap(name: Pool, tier: str) -> int:
    cap = CHAIN.pools[name]
    return (cap.strict if tier == "strict" else cap.relaxed)[0]


def test_a_pool_with_a_clearly_larger_strict_capacity_is_the_strict_pool() -> None:
    spec, base = chain_cap(SPECULATIVE, "strict"), chain_cap(BASELINE, "strict")
    assert spec >= DEFAULT.reserve * base
    assert CHAIN.strict_pool == (SPECULATIVE, SPECULATIVE)
    # EAGLE-3 with the default cap holds about as many as the baseline: no strict pool
    assert SURFACE.pools[SPECULATIVE].strict[0] < DEFAULT.reserve * strict(BASELINE)
    assert SURFACE.strict_pool == (None, None)


def test_the_strict_pool_stays_within_the_strict_slo_while_the_other_has_relaxed_room() -> None:
    r = req(prompt=1)
    spec_at = chain_cap(SPECULATIVE, "strict")
    base_at = chain_cap(BASELINE, "strict") + 5
    fill = {
        SPECULATIVE: (spec_at + 1) / chain_cap(SPECULATIVE, "relaxed"),
        BASELINE: (base_at + 1) / chain_cap(BASELINE, "relaxed"),
    }
    assert fill[SPECULATIVE] < fill[BASELINE]  # (filled less, yet not chosen)
    d = choose("slo", snap(spec_at, base_at, r, s=CHAIN))[0]
    assert d is not None and (d.pool, d.reason) == (BASELINE, "within_relaxed")
    # without a strict pool, the pool with the larger strict capacity (by params.lead) is still
    # taken last; with neither, the same loads go by fill
    assert spec_at >= chain_cap(BASELINE, "strict") + DEFAULT.lead
    lead = CHAIN._replace(strict_pool=(None, None))
    assert lead.last == (SPECULATIVE, SPECULATIVE)
    d = choose("slo", snap(spec_at, base_at, r, s=lead))[0]
    assert d is not None and (d.pool, d.reason) == (BASELINE, "within_relaxed")
    none = CHAIN._replace(strict_pool=(None, None), last=(None, None))
    d = choose("slo", snap(spec_at, base_at, r, s=none))[0]
    assert d is not None and (d.pool, d.reason) == (SPECULATIVE, "within_relaxed")
    # the baseline at its relaxed capacity: the strict pool takes it
    d = choose("slo", snap(spec_at, chain_cap(BASELINE, "relaxed"), r, s=CHAIN))[0]
    assert d is not None and (d.pool, d.reason) == (SPECULATIVE, "within_relaxed")


def test_under_sustained_overload_the_excess_goes_away_from_the_strict_pool() -> None:
    pools = CHAIN.pools
    served = pools[SPECULATIVE].relaxed_rate + pools[BASELINE].relaxed_rate
    spec_at, base_at = chain_cap(SPECULATIVE, "relaxed"), chain_cap(BASELINE, "relaxed")
    for loads in ((spec_at, base_at), (spec_at, base_at + 20)):
        over = snap(*loads, s=CHAIN, offered=served * DEFAULT.overload * 1.5)
        d = choose("slo", over)[0]
        assert d is not None and (d.pool, d.reason) == (BASELINE, "overflow")
    assert CHAIN.most == SPECULATIVE  # (not the rule without a strict pool)
    # short of sustained overload (a burst), spread by fill as before
    d = choose("slo", snap(spec_at, base_at + 20, s=CHAIN, offered=0.0))[0]
    assert d is not None and (d.pool, d.reason) == (SPECULATIVE, "overflow")


def test_a_request_whose_first_token_cannot_come_in_time_is_not_within_slo() -> None:
    # a 1 ms TTFT target: no engine meets it even alone
    d = choose("slo", snap(r=req(ttft=0.001)))[0]
    assert d is not None and d.reason != "within_slo"


def test_past_the_relaxed_capacities_a_burst_is_spread() -> None:
    spec_at, base_at = relaxed(SPECULATIVE), relaxed(BASELINE)
    d = choose("slo", snap(spec_at, base_at, offered=0.0))[0]
    assert d is not None and d.reason == "overflow"
    fill = {SPECULATIVE: (spec_at + 1) / spec_at, BASELINE: (base_at + 1) / base_at}
    assert d.pool == min(fill, key=lambda name: fill[name])
    # a longer way past the speculative pool's: the baseline
    d = choose("slo", snap(spec_at + 10, base_at, offered=0.0))[0]
    assert d is not None and (d.pool, d.reason) == (BASELINE, "overflow")


def test_only_a_request_short_of_a_place_by_load_overflows_into_the_queue() -> None:
    # a long prompt, both engines one request below their relaxed capacity: there is a place
    # by load, but its prefill's harm to those running there misses the relaxed target; a
    # release would not bring that room, so it is not held (``beyond_slo``), and it is placed
    # as an overflow would be
    long = req(prompt=4000)
    assert SURFACE.pools[SPECULATIVE].ttft(4000, 1) <= 3 * 1.0  # (it fits alone)
    spec_at, base_at = relaxed(SPECULATIVE) - 1, relaxed(BASELINE) - 1
    d = choose("slo", snap(spec_at, base_at, r=long, offered=0.0))[0]
    assert d is not None and d.reason == "beyond_slo"
    # a short prompt at the same loads fits within the relaxed SLO
    d = choose("slo", snap(spec_at, base_at, offered=0.0))[0]
    assert d is not None and d.reason == "within_relaxed"
    # at their relaxed capacities it waits for a place: an overflow (queued when the queue is on)
    d = choose("slo", snap(spec_at + 1, base_at + 1, r=long, offered=0.0))[0]
    assert d is not None and d.reason == "overflow"


def test_under_sustained_overload_the_excess_goes_to_the_pool_with_the_most_throughput() -> None:
    # requests arriving faster than both engines serve within the relaxed SLO
    served = SURFACE.pools[SPECULATIVE].relaxed_rate + SURFACE.pools[BASELINE].relaxed_rate
    spec_at, base_at = relaxed(SPECULATIVE), relaxed(BASELINE)
    for loads in ((spec_at, base_at), (spec_at + 20, base_at), (spec_at, base_at + 20)):
        over = snap(*loads, offered=served * DEFAULT.overload * 1.5)
        d = choose("slo", over)[0]
        assert d is not None and (d.pool, d.reason) == (SURFACE.most, "overflow")
    assert SURFACE.most == BASELINE  # (so the case above is not the burst's choice)
    # just below that rate it is a burst, spread: the speculative pool far past its capacity
    # no longer takes it
    burst = snap(spec_at + 20, base_at, offered=served * DEFAULT.overload * 0.9)
    d = choose("slo", burst)[0]
    assert d is not None and (d.pool, d.reason) == (BASELINE, "overflow")


def test_a_request_that_meets_nothing_even_alone_is_beyond_slo_under_overload() -> None:
    served = SURFACE.pools[SPECULATIVE].relaxed_rate + SURFACE.pools[BASELINE].relaxed_rate
    far = snap(relaxed(SPECULATIVE), relaxed(BASELINE), r=req(ttft=0.001), offered=served * 9)
    d = choose("slo", far)[0]
    assert d is not None and d.reason == "beyond_slo"


def test_beyond_the_measured_batch_sizes_is_flagged() -> None:
    small: dict[Pool, PoolModel] = {name: m._replace(measured=2) for name, m in MODELS.items()}
    s = surf(models=small)
    d = choose("slo", snap(5, 5, s=s))[0]
    assert d is not None and d.extrapolated
    d = choose("slo", snap(0, 0, s=s))[0]
    assert d is not None and not d.extrapolated


def test_below_the_measured_batch_sizes_is_flagged_and_decided_by_speed() -> None:
    # curves measured only from 4 up, held flat below it; the baseline's iteration made slow
    # enough that neither engine is within the strict target alone
    high: dict[Pool, PoolModel] = {
        SPECULATIVE: SPEC._replace(lowest=4, spi=tuple(x * 2.5 for x in SPEC.spi)),
        BASELINE: BASE._replace(lowest=4, spi=tuple(x * 1.6 for x in BASE.spi)),
    }
    s = surf(models=high)
    d = choose("slo", snap(s=s))[0]
    assert d is not None and d.extrapolated
    # the lone request goes where it decodes fastest, not by the capacities' shares
    assert d.pool == SPECULATIVE


def test_the_wall_clock_scale() -> None:
    scaled = {name: m._replace(scale=0.1) for name, m in MODELS.items()}
    s = surface(scaled, MIX, Slo(SLO.ttft / 0.1, SLO.tpot / 0.1), DEFAULT)._replace(scale=0.1)
    d = choose("slo", snap(s=s, r=Request(400, 200, False, 0.1, 0.0025)))[0]
    assert d is not None and d.pool == SPECULATIVE
    unscaled = choose("slo", snap())[0]
    assert unscaled is not None
    assert d.tpot == pytest.approx(0.1 * unscaled.tpot)
    assert d.ttft == pytest.approx(0.1 * unscaled.ttft)


def test_without_a_surface_it_decides_as_spillover() -> None:
    for loads in ((0, 0), (6, 0), (7, 3), (12, 12)):
        s = snap(*loads, s=None)
        assert choose("slo", s) == spillover(s)


def test_no_usable_backend_no_decision() -> None:
    down = PoolView(SPECULATIVE, (BackendView("http://s", 0, usable=False),))
    gone = PoolView(BASELINE, (BackendView("http://b", 0, usable=False),))
    assert choose("slo", snap(down, gone))[0] is None
    d = choose("slo", snap(down, 0))[0]
    assert d is not None and d.pool == BASELINE


def test_a_ramping_backend_counts_as_more_loaded() -> None:
    # two requests short of the strict capacity, at half weight it counts as past it
    # (a request with next to no prompt: its prefill stalls those running next to nothing)
    at, r = strict(SPECULATIVE) - 2, req(prompt=1)
    d = choose("slo", snap(pool(SPECULATIVE, at, weight=0.5), 0, r))[0]
    assert d is not None and d.pool == BASELINE
    d = choose("slo", snap(pool(SPECULATIVE, at), 0, r))[0]
    assert d is not None and d.pool == SPECULATIVE


def test_the_least_loaded_replica_of_the_chosen_pool() -> None:
    d = choose("slo", snap(pool(SPECULATIVE, 2, 0, 1), pool(BASELINE, 0)))[0]
    assert d is not None and d.backend == "http://speculative/1"


def test_recent_traffic_to_a_backend_counts_as_its_prefill_stalls() -> None:
    # lately busy prefilling (many requests a second sent there): slower per token than idle
    hot = RecentRate(5.0, 0.0)
    for i in range(50):
        hot.add(i * 0.1)
    s = snap(1, 1)
    quiet = choose("slo", s)[0]
    busy = choose("slo", s._replace(recent={"http://speculative/0": hot}, now=5.0))[0]
    assert quiet is not None and busy is not None
    assert (quiet.pool, busy.pool) == (SPECULATIVE, BASELINE)


def test_params_name_their_provenance() -> None:
    for name, (value, why) in DEFAULT.provenance().items():
        assert why, name
        assert value == getattr(DEFAULT, name)
    assert {f.name for f in dataclasses.fields(Params)} == set(DEFAULT.provenance())
