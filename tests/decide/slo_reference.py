"""The ``slo`` policy as it was written before its hot-path rewrite (commit db610d3, verbatim
but for this docstring and one deliberate change of the rule since: step 2's pool taken last
without a strict pool, ``params.lead``, session 8): the oracle ``test_slo_rewrite.py`` holds
``router.decide.policy.slo`` to, decision for decision, on random states."""

from __future__ import annotations

import math

from router.decide.capacity import RELAXED_TPOT, RELAXED_TTFT
from router.decide.policy import (
    CLOSE,
    BackendView,
    Decision,
    PoolView,
    Reason,
    RoutingState,
    Snapshot,
    _effective,
    _tpot_at,
    pick_backend,
    spillover,
)
from router.pools import BASELINE, SPECULATIVE


def reference_slo(snap: Snapshot) -> tuple[Decision | None, RoutingState]:
    """``router.decide.policy.slo`` before the rewrite."""
    req, surf = snap.request, snap.surface
    if req is None or surf is None:
        return spillover(snap)
    params = surf.params
    state = snap.state
    rr = state.rr
    c = 1 if req.sampling else 0
    ttft, tpot = req.slo_ttft / surf.scale, req.slo_tpot / surf.scale
    prompt = req.prompt_tokens
    pools = surf.pools
    picks: list[tuple[PoolView, BackendView, int]] = []
    for view in (snap.speculative, snap.baseline):
        b = pick_backend(view, rr)
        if b is not None:
            picks.append((view, b, _effective(b)))
    if not picks:
        return None, state
    # each candidate: its time per token and to first token, as busy as it has been lately,
    # and what its prefill adds to the time per token of each request running there (spread
    # over a request of the mix's length)
    recent = snap.recent
    mix_tokens = max(1.0, surf.mix.output - 1.0)
    seen: list[tuple[float, float]] = []
    harms: list[float] = []
    for view, b, n in picks:
        cap = pools[view.name]
        harms.append(
            (cap.prefill_base + prompt * cap.prefill_per_token) / mix_tokens if n > 1 else 0.0
        )
        if recent is not None:
            sent = recent.get(b.url)
            if sent is None:
                seen.append((cap.own_tpot(c, n, 0.0), cap.ttft(prompt, n)))
                continue
            busy = cap.busy(sent.rate(snap.now) * surf.scale)
            # (its prefill waits for those sent there lately that have not ended yet)
            ahead = sent.ahead(snap.now) / surf.scale
            seen.append((cap.own_tpot(c, n, busy), cap.ttft(prompt, n) + ahead))
        else:
            seen.append((_tpot_at(cap, c, n), cap.ttft(prompt, n)))
    # 1. room within the strict SLO, its prefill keeping those there within it too: where the
    # time per token it sees and adds to the others is lowest; first among the engines with
    # headroom below the target (``params.headroom``), counting the step it adds to the time per
    # token of each request running there, then the others (without the step)
    best: tuple[PoolView, BackendView, int] | None = None
    best_cost = math.inf
    headroom = params.headroom * tpot
    for (view, b, n), (own, first), harm in zip(picks, seen, harms, strict=True):
        cap = pools[view.name]
        if n > cap.strict[c] or own + harm > tpot or first > ttft:
            continue
        row = cap.tpot[c]
        table = row[n] if n < len(row) else row[-1]
        cost = own + (n - 1) * harm
        if (own if own > table else table) + harm > headroom:
            cost += CLOSE  # (after every engine with headroom; a plain float: no allocation)
        elif n > 1:
            before = row[n - 1] if n - 1 < len(row) else row[-1]
            if table > before:
                cost += (n - 1) * (table - before)
        if cost < best_cost:
            best, best_cost = (view, b, n), cost
    reason: Reason = "within_slo"
    keep = surf.strict_pool[c]

    def fill(p: tuple[PoolView, BackendView, int]) -> float:
        """How full the engine is against its relaxed capacity."""
        return p[2] / max(1, pools[p[0].name].relaxed[c])

    if best is None:
        # 2. room within the relaxed SLO
        reason = "within_relaxed"
        fits = [
            p
            for p, (own, first), harm in zip(picks, seen, harms, strict=True)
            if p[2] <= pools[p[0].name].relaxed[c]
            and own + harm <= tpot * RELAXED_TPOT
            and first <= ttft * RELAXED_TTFT
        ]
        if fits:
            if all(p[2] < pools[p[0].name].lowest for p in fits):
                # quieter than anything measured on either pool (the curves are held flat
                # below their lowest point, which says nothing of how they compare there): by
                # its own time per token, as with room under the strict capacity
                best = min(fits, key=lambda p: seen[picks.index(p)][0])
            else:
                # the other pool before the one taken last (the strict pool, or with none the
                # pool whose strict capacity is params.lead requests larger: it keeps its
                # requests within the strict SLO), then the engine filled least against its
                # relaxed capacity
                spec_s, base_s = pools[SPECULATIVE].strict[c], pools[BASELINE].strict[c]
                last = keep
                if last is None and spec_s >= base_s + surf.params.lead:
                    last = SPECULATIVE
                elif last is None and base_s >= spec_s + surf.params.lead:
                    last = BASELINE
                best = min(fits, key=lambda p: (p[0].name == last, fill(p)))
    if best is None:
        # 3. no engine has room for it within the relaxed SLO: it overflows (the router's
        # queue, when on, holds it until one has), unless it would miss that SLO even alone
        alone = any(
            pools[v.name].ttft(prompt, 1) <= ttft * RELAXED_TTFT
            and pools[v.name].own_tpot(c, 1, 0.0) <= tpot * RELAXED_TPOT
            for v, _, _ in picks
        )
        # what a queued request waits for is a place: an engine whose load keeps it within
        # the relaxed targets; with one left (it missed on its own prefill's harm or the
        # prefills sent there lately), a release would not bring the room it lacks, so it is
        # not held either
        place = any(
            p[2] <= pools[p[0].name].relaxed[c]
            and _tpot_at(pools[p[0].name], c, p[2]) <= tpot * RELAXED_TPOT
            for p in picks
        )
        reason = "overflow" if alone and not place else "beyond_slo"
        # sustained overload: requests arrive faster than the engines serve within the relaxed SLO
        served = sum(pools[v.name].relaxed_rate * v.usable_count() for v, _, _ in picks)
        overloaded = snap.offered is not None and snap.offered > served * params.overload
        if overloaded and keep is not None:
            # away from the strict pool, so that it keeps serving within the strict SLO
            best = min(picks, key=lambda p: (p[0].name == keep, fill(p)))
        elif overloaded:
            best = next((p for p in picks if p[0].name == surf.most), picks[0])
        else:
            best = min(picks, key=fill)
    view, b, n = best
    cap = pools[view.name]
    decision = Decision(
        view.name,
        b.url,
        reason,
        ttft=cap.ttft(prompt, n) * surf.scale,
        tpot=_tpot_at(cap, c, n) * surf.scale,
        extrapolated=n > max(1, cap.measured) or n < cap.lowest,
    )
    return decision, state._replace(rr=rr + 1)
