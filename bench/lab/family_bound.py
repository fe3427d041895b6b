"""An upper bound on what any routing of one workload can get of both goodput tiers at once.

Issue 36's "within 5 points on all" clause asks, per drawn workload of ``bench/policy_family.py``,
the default's strict and relaxed goodput each within 5 points of the best simple policy's
(``S*`` and ``R*``, perhaps from two policies). Session 8 found six workloads where no run
measured comes within 5 points of both. This module asks the question of every routing, even
one that knows the future: the largest ``min(strict - S*, relaxed - R*)`` over all placements
of the workload's requests in an *optimistic* model of the lab's engines, found as a linear
program, whose dual gives a certificate (the weight ``lam`` on relaxed against strict).

The model (fluid, in slots of ``slot`` seconds, each engine apart; ``router.sim.model``'s costs):

- An engine spends each slot in batch bands (``(previous top, B]`` for ``B`` on a grid),
  time ``y[B]`` in each, plus the prefills of the requests that join in the slot (through
  which the running requests wait: present, in no iteration). In a band an iteration takes
  ``step_time`` of its smallest batch, it has ``B`` seats, and every running request is in
  every iteration.
- A request placed on an engine, in a tier (strict or relaxed-only), is present in band ``B``
  at most ``y[B]`` of the slot (it is in one seat at a time), at most the part of the slot in
  its window, and the requests present in a band share its ``B`` seats. Its iterations
  (presence over the band's iteration time) times its mean gain (``tau`` at its temperature,
  1 on the baseline) must cover its ``output - 1`` tokens within its window: from arrival to
  ``ttft + tpot * (output - 1)`` later (the tier's SLO), and before the lab's drain ends. Its
  prefill (``prefill_time``) is spent on its engine within ``ttft`` of arrival.
- Any share of a request may be placed on each engine and tier, or dropped (a refused request):
  a linear program. A dropped request takes nothing, which the lab's routers cannot do.

Why it is optimistic (each point a relaxation of the lab's engine, ``bench/lab_sim.Engine``):
the context's cost (``c_kv``) is left out; a batch band has the seats of its largest batch and
the iteration time of its smallest; a request may wait before its TTFT deadline without a
seat, and after it holds one (or waits through a prefill) only until done, at whatever bands
it likes (a whole request held all of a slot is in every band of it, as in the lab; a share of
one is not: shares may take turns in a seat, the relaxation's main slack); it may run anywhere
in its window (the lab's TPOT runs from its first token); the join iteration's own decode step
and the last iteration's overshoot are not charged; requests may be split and dropped. What is
*not* a relaxation: the gains are taken at their mean, where a lab request may be lucky
(``luck`` scales every gain up, to cover it); and the fluid slots (an iteration spans slot
boundaries). Both are checked against the lab: ``accommodate`` asks the model to hold exactly
the outcome of a lab run (which requests met which tier on which pool), so a lab outcome the
model cannot hold shows where it is not optimistic.

For weights ``(1 - lam, lam)`` the program's weighted optimum ``F(lam) = max (1 - lam) *
(strict - S*) + lam * (relaxed - R*)`` bounds ``min(strict - S*, relaxed - R*)`` over every
placement (a mean is at least the least of what it averages); its minimum over ``lam`` is the
max-min (LP duality), which ``bound`` solves directly and then re-evaluates at the rounded
``lam`` (``weighted``), so the certificate is exactly what that ``lam`` gives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from router.sim.model import Preset, prefill_time, step_time

STRICT, RELAXED = 0, 1  # tiers: a request placed "relaxed" meets only the relaxed SLO
SLO = ((1.0, 0.025), (3.0, 0.050))  # (TTFT s, TPOT s) per tier, as bench/policy_lab.py scores


class Job(NamedTuple):
    """One request of the workload."""

    at: float  # arrival, seconds
    prompt: int
    output: int
    hot: bool  # temperature > 0
    scored: bool  # counted in the goodput (arrived after the warm-up)


class Engines(NamedTuple):
    """The pools: each one preset and how many engines run it (alike engines)."""

    presets: tuple[Preset, ...]
    counts: tuple[int, ...]


# The batch grid (the knee and the running cap added, sizes past the cap left out).
GRID = (1, 2, 4, 6, 8, 10, 13, 16, 20, 24, 32, 48, 64, 128, 256)


def levels(p: Preset, grid: Sequence[int] | None = None) -> tuple[int, ...]:
    """The tops of the batch bands an engine's time is spread over: ``grid``, the knee and
    the running cap. A band (previous top, top] has the top's seats and the iteration time of
    its smallest batch, so it serves any batch in it with at least its seats and iterations
    (the model's optimism)."""
    sizes = {*(GRID if grid is None else grid), p.max_running}
    if p.knee:
        sizes.add(int(p.knee))
        assert p.knee == int(p.knee)
    return tuple(sorted(b for b in sizes if b <= p.max_running))


def gain(p: Preset, hot: bool) -> float:
    """Mean tokens per iteration of a request past its first token."""
    return p.tau_for(1.0 if hot else 0.0) if p.spec_k else 1.0


class Program(NamedTuple):
    """The linear program: minimize ``c @ v`` subject to ``A @ v <= b_ub`` and the columns'
    bounds, ``A`` given by its entries ``(rows, cols, vals)``."""

    c: Any
    rows: Any
    cols: Any
    vals: Any
    b_ub: Any
    bounds: list[tuple[float | None, float | None]]
    x: dict[tuple[int, int, int], int]  # (job, engine, tier) -> column of its share
    scored: int  # scored jobs
    t: int  # column of the epigraph variable (-1: none)
    whole: tuple[int, ...] = ()  # integer columns (``whole``): placements and "done"s


def window(job: Job, tier: int, end: float) -> tuple[float, float]:
    ttft, tpot = SLO[tier]
    return job.at, min(end, job.at + ttft + tpot * max(0, job.output - 1))


def build(
    jobs: Sequence[Job],
    engines: Engines,
    end: float,
    slot: float = 2.0,
    luck: float = 1.0,
    objective: tuple[float, float] | None = None,
    targets: tuple[float, float] = (0.0, 0.0),
    keep: dict[tuple[int, int, int], float] | None = None,
    whole: bool = False,
) -> Program:
    """The program over ``jobs`` on ``engines`` until ``end`` (the lab's drain).

    ``objective``: maximize ``w_s * strict + w_r * relaxed`` (shares of the scored jobs) for
    ``(w_s, w_r)``; None: maximize ``min(strict - S*, relaxed - R*)`` (the epigraph variable
    ``t``). ``keep``: only these (job, engine, tier) shares may be placed, each up to its
    value; without an objective, the objective is then their count (``accommodate``).
    ``whole``: every placement and "done" a 0/1 (a mixed-integer program): whole requests,
    which cannot take turns in a seat."""
    import numpy as np

    slots = max(1, math.ceil(end / slot))
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    b_ub: list[float] = []
    bounds: list[tuple[float | None, float | None]] = []
    cost: list[float] = []

    def col(lo: float | None = 0.0, hi: float | None = None, c: float = 0.0) -> int:
        bounds.append((lo, hi))
        cost.append(c)
        return len(bounds) - 1

    def row(entries: Sequence[tuple[int, float]], rhs: float) -> None:
        r = len(b_ub)
        for j, v in entries:
            rows.append(r)
            cols.append(j)
            vals.append(v)
        b_ub.append(rhs)

    grids = [levels(p) for p in engines.presets]
    # a batch band (previous size, size]: its seats at the top, its iteration at the bottom
    steps = [
        [step_time(p, lo + 1, 0.0) for lo, b in zip((0, *g), g, strict=False)]
        for p, g in zip(engines.presets, grids, strict=True)
    ]
    y = [[[col() for _ in g] for _ in range(slots)] for g in grids]  # engine, slot, level
    # each pool-slot's prefill seconds: the running requests wait through them (present, in
    # no iteration), so a held request may spend them there
    z = [[col() for _ in range(slots)] for _ in grids]
    seat_terms: dict[tuple[int, int, int], list[tuple[int, float]]] = {}
    time_terms: dict[tuple[int, int], list[tuple[int, float]]] = {}
    n_scored = sum(1 for j in jobs if j.scored)
    x: dict[tuple[int, int, int], int] = {}
    integer: list[int] = []  # whole requests: their placements and "done by this slot"s
    per_job: dict[int, list[int]] = {}
    scored_x: list[tuple[int, int]] = []  # (column, tier)
    for i, job in enumerate(jobs):
        if not job.scored:
            continue  # worth nothing: the program would drop it
        for e, p in enumerate(engines.presets):
            g = gain(p, job.hot) * luck
            need = max(0, job.output - 1)
            pre = prefill_time(p, job.prompt)
            for tier in (STRICT, RELAXED):
                lo, hi = window(job, tier, end)
                first = job.at + SLO[tier][0]
                if hi <= lo or first > end:
                    continue
                cap = None if keep is None else keep.get((i, e, tier))
                if keep is not None and cap is None:
                    continue
                xc = col(0.0, 1.0 if cap is None else cap)
                integer.append(xc)
                x[(i, e, tier)] = xc
                per_job.setdefault(i, []).append(xc)
                if job.scored:
                    scored_x.append((xc, tier))
                tokens: list[tuple[int, float]] = [(xc, float(need))]
                done = -1  # column of the share done by the end of the last slot (-1: none)
                for s in range(int(lo // slot), min(slots, math.ceil(hi / slot))):
                    overlap = min(hi, (s + 1) * slot) - max(lo, s * slot)
                    if overlap <= 0:
                        continue
                    presence: list[tuple[int, float]] = [(xc, -overlap)]
                    gained: list[tuple[int, float]] = []
                    for k, t in enumerate(steps[e]):
                        o = col()
                        presence.append((o, 1.0))
                        row([(o, 1.0), (y[e][s][k], -slot)], 0.0)  # one seat at a time
                        seat_terms.setdefault((e, s, k), []).append((o, 1.0))
                        tokens.append((o, -g / t))
                        gained.append((o, -g / t / max(1, need)))
                    q = col()
                    presence.append((q, 1.0))
                    row([(q, 1.0), (z[e][s], -1.0)], 0.0)
                    row(presence, 0.0)
                    # Once started it holds its seat until done: the share not done by the
                    # slot's end was present all of it from the TTFT's deadline on (at any
                    # level, or waiting through a prefill).
                    d = col(0.0, 1.0)
                    integer.append(d)
                    row([(d, 1.0), *gained, *([(done, -1.0)] if done >= 0 else [])], 0.0)
                    done = d
                    after = min(hi, (s + 1) * slot) - max(first, s * slot)
                    if after > 0:
                        held = [(c, -v) for c, v in presence[1:]]
                        row([*held, (xc, after), (d, -after)], 0.0)
                join: list[tuple[int, float]] = [(xc, 1.0)]
                for s in range(int(lo // slot), min(slots, math.ceil(first / slot))):
                    f = col()
                    join.append((f, -1.0))
                    time_terms.setdefault((e, s), []).append((f, pre))
                row(join, 0.0)
                if need:
                    row(tokens, 0.0)
    for e, sizes in enumerate(grids):
        for s in range(slots):
            for k, size in enumerate(sizes):
                terms = seat_terms.get((e, s, k))
                if terms:
                    row([*terms, (y[e][s][k], -size * slot)], 0.0)
            row([*time_terms.get((e, s), []), (z[e][s], -1.0)], 0.0)
            row(
                [*((y[e][s][k], slot) for k in range(len(sizes))), (z[e][s], 1.0)],
                engines.counts[e] * slot,
            )
    for cs in per_job.values():
        row([(c, 1.0) for c in cs], 1.0)
    share = 1.0 / max(1, n_scored)
    t = -1
    if keep is not None and objective is None:
        for c in x.values():
            cost[c] = -1.0
    elif objective is None:
        t = col(None, None, -1.0)
        s_target, r_target = targets
        row([(t, 1.0), *((c, -share) for c, tier in scored_x if tier == STRICT)], -s_target)
        row([(t, 1.0), *((c, -share) for c, _ in scored_x)], -r_target)
    else:
        ws, wr = objective
        for c, tier in scored_x:
            cost[c] -= (ws if tier == STRICT else 0.0) * share + wr * share
    return Program(
        np.array(cost),
        np.array(rows),
        np.array(cols),
        np.array(vals),
        np.array(b_ub),
        bounds,
        x,
        n_scored,
        t,
        tuple(integer) if whole else (),
    )


class Solved(NamedTuple):
    value: float  # the program's optimum (maximized)
    strict: float  # the optimum's strict and relaxed shares of the scored jobs
    relaxed: float
    duals: tuple[float, float]  # the epigraph's two rows' multipliers (strict, relaxed)
    columns: int
    rows: int


def solve(
    jobs: Sequence[Job], prog: Program, crossover: bool = False, seconds: float | None = None
) -> Solved:
    """The program's optimum by HiGHS's interior point method (without crossover unless
    asked: its optimum to the solver's tolerance, about 1e-7, far below a point)."""
    import highspy
    import numpy as np

    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    if not prog.whole:
        h.setOptionValue("solver", "ipm")
        h.setOptionValue("run_crossover", "on" if crossover else "off")
    h.setOptionValue("threads", 1)
    if seconds is not None:
        h.setOptionValue("time_limit", float(seconds))
    lp = highspy.HighsLp()
    n_cols, n_rows = len(prog.bounds), len(prog.b_ub)
    lp.num_col_, lp.num_row_ = n_cols, n_rows
    inf = highspy.kHighsInf
    lp.col_cost_ = np.asarray(prog.c, dtype=float)
    lp.col_lower_ = np.array([-inf if lo is None else lo for lo, _ in prog.bounds])
    lp.col_upper_ = np.array([inf if hi is None else hi for _, hi in prog.bounds])
    lp.row_lower_ = np.full(n_rows, -inf)
    lp.row_upper_ = np.asarray(prog.b_ub, dtype=float)
    order = np.lexsort((prog.rows, prog.cols))  # column by column
    cols = prog.cols[order]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.searchsorted(cols, np.arange(n_cols + 1)).astype(np.int32)
    lp.a_matrix_.index_ = prog.rows[order].astype(np.int32)
    lp.a_matrix_.value_ = prog.vals[order].astype(float)
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n_cols, n_rows
    if prog.whole:
        integer = set(prog.whole)
        kinds = highspy.HighsVarType.kInteger, highspy.HighsVarType.kContinuous
        lp.integrality_ = [kinds[0] if j in integer else kinds[1] for j in range(n_cols)]
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    if prog.whole and status == highspy.HighsModelStatus.kTimeLimit:
        # branch and bound stopped: its dual bound still bounds every whole placement
        bound_ = -float(h.getInfo().mip_dual_bound)
        return Solved(bound_, math.nan, math.nan, (0.0, 0.0), n_cols, n_rows)
    if status != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(
            f"family_bound: the program did not solve: {h.modelStatusToString(status)}"
        )
    sol = h.getSolution()
    v = np.asarray(sol.col_value)
    n = max(1, prog.scored)
    strict = sum(v[c] for (i, _, tier), c in prog.x.items() if tier == STRICT and jobs[i].scored)
    relaxed = sum(v[c] for (i, _, _), c in prog.x.items() if jobs[i].scored)
    duals = (0.0, 0.0)
    if prog.t >= 0 and not prog.whole:
        m = np.abs(np.asarray(sol.row_dual))
        duals = (float(m[-2]), float(m[-1]))
    # a mixed-integer program's value: its dual bound (an upper bound, equal when solved)
    info = h.getInfo()
    value = -float(info.mip_dual_bound if prog.whole else info.objective_function_value)
    return Solved(value, float(strict) / n, float(relaxed) / n, duals, n_cols, n_rows)


class Bound(NamedTuple):
    """The max-min and its certificate."""

    bound: float  # max over placements in the model of min(strict - S*, relaxed - R*) (share)
    lam: float  # the certificate: weight on the relaxed tier (1 - lam on strict), rounded
    certified: float  # F(lam): the bound that lam gives (>= bound; equal up to the rounding)
    strict: float  # the max-min placement's strict and relaxed shares
    relaxed: float
    columns: int
    rows: int


def weighted(
    jobs: Sequence[Job],
    engines: Engines,
    end: float,
    lam: float,
    targets: tuple[float, float],
    slot: float = 2.0,
    luck: float = 1.0,
) -> float:
    """``F(lam)``: the most any placement in the model gets of ``(1 - lam) * (strict - S*) +
    lam * (relaxed - R*)``; no placement's ``min(strict - S*, relaxed - R*)`` exceeds it."""
    prog = build(jobs, engines, end, slot, luck, objective=(1 - lam, lam))
    got = solve(jobs, prog)
    return got.value - (1 - lam) * targets[0] - lam * targets[1]


def bound(
    jobs: Sequence[Job],
    engines: Engines,
    end: float,
    targets: tuple[float, float],
    slot: float = 2.0,
    luck: float = 1.0,
    digits: int = 3,
    certify: bool = False,
) -> Bound:
    """The max-min over every placement in the model, and the weight that certifies it."""
    prog = build(jobs, engines, end, slot, luck, targets=targets)
    got = solve(jobs, prog)
    ds, dr = got.duals
    lam = round(dr / (ds + dr), digits) if ds + dr > 0 else 0.5
    # the certificate's own solve: where the bound would prove the claim, or when asked
    proves = certify or got.value < -0.05
    cert = weighted(jobs, engines, end, lam, targets, slot, luck) if proves else math.nan
    return Bound(got.value, lam, cert, got.strict, got.relaxed, got.columns, got.rows)


def whole_bound(
    jobs: Sequence[Job],
    engines: Engines,
    end: float,
    targets: tuple[float, float],
    slot: float = 2.0,
    luck: float = 1.0,
    seconds: float | None = None,
) -> float:
    """The max-min over whole placements in the model (each request on one pool in one tier,
    or dropped): a mixed-integer program, exact in the model where ``bound`` relaxes it; with
    ``seconds``, branch and bound's dual bound when the time is up (still an upper bound)."""
    prog = build(jobs, engines, end, slot, luck, targets=targets, whole=True)
    return solve(jobs, prog, seconds=seconds).value


def most(
    jobs: Sequence[Job],
    engines: Engines,
    end: float,
    tier: int,
    slot: float = 2.0,
    luck: float = 1.0,
) -> float:
    """The most of one tier's share any placement in the model gets."""
    prog = build(
        jobs, engines, end, slot, luck, objective=(1.0, 0.0) if tier == STRICT else (0.0, 1.0)
    )
    return solve(jobs, prog).value


def placed(
    jobs: Sequence[Job],
    engines: Engines,
    end: float,
    pools: Sequence[int],
    tier: int,
    slot: float = 2.0,
    luck: float = 1.0,
) -> float:
    """The most of one tier's share the model gets with each job on the pool a lab run sent it
    to (``pools[job]``): the model's value of that run's placement, to set against the lab's."""
    keep = {(i, p, t): 1.0 for i, p in enumerate(pools) for t in (STRICT, RELAXED)}
    weights = (1.0, 0.0) if tier == STRICT else (0.0, 1.0)
    prog = build(jobs, engines, end, slot, luck, objective=weights, keep=keep)
    return solve(jobs, prog).value


def accommodate(
    jobs: Sequence[Job],
    engines: Engines,
    end: float,
    outcome: dict[int, tuple[int, int]],
    slot: float = 2.0,
    luck: float = 1.0,
) -> float:
    """How many of a lab run's outcome the model can hold at once: ``outcome[job] = (engine,
    tier)`` for each job the run served within a tier (strict also counts as relaxed); the
    model's most of them placed exactly so (their count if the model is optimistic for it)."""
    keep = {(i, e, tier): 1.0 for i, (e, tier) in outcome.items()}
    prog = build(jobs, engines, end, slot, luck, keep=keep)
    return solve(jobs, prog).value


# --- the lab's side: a workload of the family, and what a lab run did with it -----------------


def outcome_of(
    jobs: Sequence[Job], served: Sequence[tuple[int, float | None, float | None]], end: float
) -> dict[int, tuple[int, int]]:
    """Each scored job's (pool, tier) in a lab run, from its (pool, first, last) as scored by
    ``policy_lab.score``: strict if within the strict SLO, else relaxed if within that."""
    out: dict[int, tuple[int, int]] = {}
    for i, (job, (pool, first, last)) in enumerate(zip(jobs, served, strict=True)):
        if not job.scored or first is None or last is None or last > end:
            continue
        t1 = first - job.at
        t2 = (last - first) / (job.output - 1) if job.output > 1 else 0.0
        for tier in (STRICT, RELAXED):
            if t1 <= SLO[tier][0] and t2 <= SLO[tier][1]:
                out[i] = (pool, tier)
                break
    return out


def family_case(seed: int) -> tuple[Any, list[Job], Engines, float, tuple[float, float]]:
    """Workload ``seed`` of ``bench/policy_family.py``: the workload, its jobs, its pools, the
    drain's end, and the best simple policy's strict and relaxed shares from the family's
    cache."""
    import policy_family as family

    from router.sim.model import BASELINE as BASE_PRESET
    from router.sim.model import PRESETS

    w = family.draw(seed)
    arrivals = family.arrivals(w)
    jobs = [
        Job(a.at, a.prompt_tokens, a.output_tokens, a.temperature > 0, a.at >= family.WARMUP)
        for a in arrivals
    ]
    engines = Engines((PRESETS[w.regime], BASE_PRESET), (w.per_pool, w.per_pool))
    end = arrivals[-1].at + family.DRAIN
    rows = family.load_cache(family.ROOT / "bench" / "results" / "policy-family-runs.jsonl")
    simple = [rows[(seed, p, "")] for p in family.SIMPLE]
    targets = (max(r["strict"] for r in simple), max(r["relaxed"] for r in simple))
    return w, jobs, engines, end, targets


def lab_run(
    seed: int, policy: str
) -> tuple[float, float, list[tuple[int, float | None, float | None]]]:
    """A lab run of the family's workload ``seed`` under ``policy`` (a simple policy, ``slo``
    the default as the family runs it, or ``K,M,pool`` a static threshold policy of
    ``bench/policy_frontier.py``): its strict and relaxed shares and each request's (pool,
    first token, last token)."""
    import policy_family as family
    from lab_sim import TABLES, Router, run
    from policy_lab import score

    from router.pools import BASELINE, SPECULATIVE, Pool

    w = family.draw(seed)
    arrivals = family.arrivals(w)
    presets, pools = family.layout(w)
    if "," in policy:
        import policy_frontier as frontier

        k, m, last = policy.split(",")

        def make(urls: dict[Pool, list[str]]) -> Router:
            router = frontier.Thresholds("round_robin", urls, TABLES[w.regime])
            router.limits = (int(k), int(m), SPECULATIVE if last == "speculative" else BASELINE)
            return router
    else:

        def make(urls: dict[Pool, list[str]]) -> Router:
            return Router(policy, urls, TABLES[w.regime])  # type: ignore[arg-type]

    reqs = run(
        arrivals, make, seed=1000 * w.seed + 7, presets=presets, pools=pools, drain=family.DRAIN
    )
    s = score(reqs, arrivals, family.WARMUP, family.DRAIN)
    served = [(0 if r.pool == SPECULATIVE else 1, r.first, r.last) for r in reqs]
    return s.strict, s.relaxed, served


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for p in (root, root / "bench"):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", required=True, help="the family's workloads' seeds, N,N,...")
    ap.add_argument("--slot", type=float, default=3.0)
    ap.add_argument("--luck", type=float, default=1.0)
    ap.add_argument("--bound", action="store_true", help="the max-min and its certificate")
    ap.add_argument("--most", action="store_true", help="the most strict, the most relaxed")
    ap.add_argument(
        "--hold",
        default="",
        help="lab runs whose outcome the model must hold: policies, or K,M,pool "
        "static points, separated by ';'",
    )
    ap.add_argument(
        "--whole",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="the max-min over whole placements (mixed-integer), at most SECONDS of search",
    )
    ap.add_argument(
        "--placed", action="store_true", help="and each held run's placement valued in the model"
    )
    ap.add_argument(
        "--out", type=Path, default=root / "bench" / "results" / "policy-family-bound-runs.jsonl"
    )
    args = ap.parse_args(argv)
    for seed in (int(x) for x in args.only.split(",")):
        w, jobs, engines, end, targets = family_case(seed)
        print(f"{w.name}: best simple {100 * targets[0]:.1f} / {100 * targets[1]:.1f}", flush=True)
        rows: list[dict[str, Any]] = []
        base = {"seed": seed, "slot": args.slot, "luck": args.luck, "grid": list(GRID)}
        if args.bound:
            t0 = time.process_time()
            b = bound(jobs, engines, end, targets, args.slot, args.luck)
            rows.append(
                {
                    **base,
                    "kind": "bound",
                    "best_strict": targets[0],
                    "best_relaxed": targets[1],
                    **{k: None if v != v else v for k, v in b._asdict().items()},
                    "cpu_s": round(time.process_time() - t0, 1),
                }
            )
            print(
                f"  bound {100 * b.bound:+.2f} points (strict {100 * b.strict:.1f}, relaxed "
                f"{100 * b.relaxed:.1f}); lam {b.lam} gives {100 * b.certified:+.2f}",
                flush=True,
            )
        if args.whole:
            t0 = time.process_time()
            v = whole_bound(jobs, engines, end, targets, args.slot, args.luck, args.whole)
            rows.append(
                {
                    **base,
                    "kind": "whole",
                    "bound": v,
                    "seconds": args.whole,
                    "cpu_s": round(time.process_time() - t0, 1),
                }
            )
            print(f"  whole placements: max-min at most {100 * v:+.2f} points", flush=True)
        if args.most:
            for tier, name in ((STRICT, "strict"), (RELAXED, "relaxed")):
                t0 = time.process_time()
                v = most(jobs, engines, end, tier, args.slot, args.luck)
                rows.append(
                    {
                        **base,
                        "kind": f"most {name}",
                        "value": v,
                        "cpu_s": round(time.process_time() - t0, 1),
                    }
                )
                print(f"  most {name} {100 * v:.1f}", flush=True)
        for policy in (p for p in args.hold.split(";") if p):
            t0 = time.process_time()
            s, r, served = lab_run(seed, policy)
            got = outcome_of(jobs, served, end)
            held = accommodate(jobs, engines, end, got, args.slot, args.luck)
            pools = [p for p, _, _ in served]
            ms = mr = math.nan
            if args.placed:
                ms = placed(jobs, engines, end, pools, STRICT, args.slot, args.luck)
                mr = placed(jobs, engines, end, pools, RELAXED, args.slot, args.luck)
            n = sum(1 for j in jobs if j.scored)
            rows.append(
                {
                    **base,
                    "kind": "hold",
                    "policy": policy,
                    "lab_strict": s,
                    "lab_relaxed": r,
                    "outcome": len(got),
                    "outcome_strict": sum(1 for _, t in got.values() if t == STRICT),
                    "held": held,
                    "model_strict": None if ms != ms else ms,
                    "model_relaxed": None if mr != mr else mr,
                    "scored": n,
                    "cpu_s": round(time.process_time() - t0, 1),
                }
            )
            print(
                f"  {policy}: lab {100 * s:.1f} / {100 * r:.1f}; the model holds {held:.2f} of "
                f"its {len(got)} ({100 * (len(got) - held) / n:.2f} points short); the same "
                f"placement in the model: at most {100 * ms:.1f} strict, {100 * mr:.1f} relaxed",
                flush=True,
            )
        with args.out.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
