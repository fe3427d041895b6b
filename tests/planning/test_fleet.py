"""The engines as the planner sees them, a switch followed through the members, and the
sequenced targets (router.planning.fleet)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.planning.fleet import (
    MemberView,
    Switch,
    census,
    follow,
    free_slots,
    running,
    started,
    targets,
)
from router.pools import BASELINE, SPECULATIVE, Pool


def up(url: str, pool: Pool, joined: float = 0.0, inflight: int = 0) -> MemberView:
    return MemberView(url, pool, True, "healthy", joined, joined, False, inflight)


def restart(_mode: Pool) -> float:
    return 100.0


def test_a_switch_is_followed_from_its_drain_to_the_engine_healthy_in_the_other_pool() -> None:
    members = [up("a", SPECULATIVE), up("b", SPECULATIVE), up("c", BASELINE)]
    sw = Switch("a", SPECULATIVE, BASELINE, advised=10.0, id=1)
    assert targets(members, sw) == {SPECULATIVE: 1, BASELINE: 1}  # lower first
    got, landing = follow(sw, members, 11.0)
    assert got == sw and landing is None  # nothing moved yet
    # the actuator drains a
    members[0] = members[0]._replace(active=False)
    sw2, _ = follow(sw, members, 12.0)
    assert sw2 is not None and (sw2.phase, sw2.draining) == ("draining", "a")
    assert [e.status for e in census(members, sw2, restart, 12.0) if e.name == "a"] == ["draining"]
    # drained: removed from the members; it counts as loading into baseline
    members = members[1:]
    sw3, _ = follow(sw2, members, 20.0)
    assert sw3 is not None and (sw3.phase, sw3.left) == ("restarting", 20.0)
    fleet = census(members, sw3, restart, 50.0)
    (a,) = [e for e in fleet if e.name == "a"]
    assert (a.mode, a.status, a.eta) == (BASELINE, "loading", 70.0)
    assert targets(members, sw3) == {SPECULATIVE: 1, BASELINE: 2}  # raise once it is gone
    # it comes back in the baseline pool (the same URL), starting, then healthy
    members.append(MemberView("a", BASELINE, True, "starting", 60.0, 60.0, True))
    sw4, _ = follow(sw3, members, 61.0)
    assert sw4 is not None and (sw4.phase, sw4.landed) == ("loading", "a")
    assert [e.status for e in census(members, sw4, restart, 61.0)].count("loading") == 1
    members[-1] = members[-1]._replace(health="healthy", since=118.0)
    done, landing = follow(sw4, members, 119.0)
    assert done is None and landing is not None
    assert (landing.mode, landing.seconds) == (BASELINE, 98.0)  # removed at 20, healthy at 118


def test_a_scaler_that_drains_a_pod_of_its_own_choosing_is_followed_all_the_same() -> None:
    members = [up("a", SPECULATIVE), up("b", SPECULATIVE), up("c", BASELINE)]
    sw = Switch("a", SPECULATIVE, BASELINE, advised=0.0)
    members[1] = members[1]._replace(active=False)
    got, _ = follow(sw, members, 1.0)
    assert got is not None and got.draining == "b"
    # a new pod of the baseline pool lands for it (another URL)
    members = [members[0], members[2]]
    got, _ = follow(got, members, 2.0)
    assert got is not None and got.phase == "restarting"
    members.append(MemberView("d", BASELINE, True, "starting", 3.0, 3.0, False))
    got, _ = follow(got, members, 4.0)
    assert got is not None and got.landed == "d"


def test_an_engine_drained_and_removed_between_two_looks_counts_as_left() -> None:
    members = [up("b", SPECULATIVE)]
    sw = Switch("a", SPECULATIVE, BASELINE, advised=0.0)
    got, _ = follow(sw, members, 5.0)
    assert got is not None and (got.phase, got.draining, got.left) == ("restarting", "a", 5.0)


def test_a_drain_without_a_switch_is_an_engine_leaving_not_loading() -> None:
    members = [up("a", SPECULATIVE), up("b", BASELINE)._replace(active=False)]
    assert [e.name for e in census(members, None, restart, 0.0)] == ["a"]
    assert running(members) == {SPECULATIVE: 1, BASELINE: 0}
    assert targets(members, None) == {SPECULATIVE: 1, BASELINE: 0}


def test_members_starting_count_as_loading_and_unhealthy_ones_as_down() -> None:
    members = [
        MemberView("a", SPECULATIVE, True, "starting", 0.0, 0.0, True),
        MemberView("b", BASELINE, True, "unhealthy", 0.0, 0.0, False),
    ]
    fleet = census(members, None, restart, 30.0)
    assert [(e.status, e.eta) for e in fleet] == [("loading", 70.0), ("down", 0.0)]
    assert running(members) == {SPECULATIVE: 1, BASELINE: 0}


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    spec=st.integers(0, 4),
    base=st.integers(0, 4),
    into=st.sampled_from([SPECULATIVE, BASELINE]),
    same_url=st.booleans(),
    scaler_picks=st.booleans(),
)
def test_a_switch_never_asks_for_more_engines_than_there_are_gpus(
    spec: int, base: int, into: Pool, same_url: bool, scaler_picks: bool
) -> None:
    """Through every phase of one switch: the targets stay within the engines there were
    (the budget), the engine is counted once, and the switch ends healthy in ``into``."""
    source: Pool = BASELINE if into == SPECULATIVE else SPECULATIVE
    members = [up(f"s{i}", SPECULATIVE, inflight=i) for i in range(spec)]
    members += [up(f"b{i}", BASELINE, inflight=i) for i in range(base)]
    of_source = [m for m in members if m.pool == source]
    if not of_source:
        return
    n = len(members)
    sw: Switch | None = Switch(of_source[0].url, source, into, 0.0)
    leaving = of_source[-1 if scaler_picks else 0].url
    t = 0.0

    def check() -> None:
        assert sum(targets(members, sw).values()) <= n
        fleet = census(members, sw, restart, t)
        assert len(fleet) == n, fleet

    steps = ("drain", "remove", "join", "healthy")
    for step in steps:
        t += 1.0
        check()
        if step == "drain":
            members = [m._replace(active=False) if m.url == leaving else m for m in members]
        elif step == "remove":
            members = [m for m in members if m.url != leaving]
        elif step == "join":
            url = leaving if same_url else "new"
            members.append(MemberView(url, into, True, "starting", t, t, False))
        else:
            members[-1] = members[-1]._replace(health="healthy", since=t)
        assert sw is not None
        sw, landing = follow(sw, members, t)
        if step == "healthy":
            assert sw is None and landing is not None and landing.mode == into
        else:
            assert sw is not None and landing is None
    counts = running(members)
    assert counts[into] == (spec if into == SPECULATIVE else base) + 1
    assert counts[source] == (spec if source == SPECULATIVE else base) - 1


def test_gpus_no_engine_holds_are_engines_that_are_down_and_starting_one_raises_its_pool() -> None:
    members = [up("a", SPECULATIVE), up("b", BASELINE)]
    fleet = census(members, None, restart, 0.0)
    assert free_slots(fleet, None) == [] and free_slots(fleet, 2) == []
    slots = free_slots(fleet, 4)
    assert [(e.name, e.status) for e in slots] == [("gpu-slot-1", "down"), ("gpu-slot-2", "down")]
    sw = started("gpu-slot-1", SPECULATIVE, 10.0, id=3)
    assert sw.phase == "restarting"
    assert targets(members, sw) == {SPECULATIVE: 2, BASELINE: 1}  # raised at once
    # counted as loading, so no second slot is offered for it
    fleet = census(members, sw, restart, 20.0)
    assert [(e.name, e.status, e.eta) for e in fleet if e.status == "loading"] == [
        ("gpu-slot-1", "loading", 90.0)
    ]
    assert len(free_slots(fleet, 4)) == 1
    # a new engine joins the speculative pool: it lands there
    members.append(MemberView("c", SPECULATIVE, True, "starting", 30.0, 30.0, True))
    got, _ = follow(sw, members, 31.0)
    assert got is not None and got.landed == "c"
    members[-1] = members[-1]._replace(health="healthy", since=95.0)
    done, landing = follow(got, members, 96.0)
    assert done is None and landing is not None and landing.seconds == 85.0


def test_an_engine_that_was_down_and_is_started_in_place_lands_when_healthy() -> None:
    members = [MemberView("a", BASELINE, True, "unhealthy", 0.0, 0.0, False)]
    sw = started("a", BASELINE, 5.0, id=1)
    assert [e.status for e in census(members, sw, restart, 6.0)] == ["down"]
    members[0] = members[0]._replace(health="healthy", since=50.0)
    done, landing = follow(sw, members, 51.0)
    assert done is None and landing is not None and landing.mode == BASELINE
