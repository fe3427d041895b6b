"""The performance model of a simulated engine: pure functions over frozen presets.

An engine runs a continuous-batching loop. One iteration with ``B`` running requests that hold
``K`` context tokens costs ``a + b*B + c_kv*K`` (where a preset or a setting says so: a cost
proportional to the batch past a compute-bound knee, the eager penalty above
``--cuda-graph-max-bs`` and the cost of a disabled overlap scheduler; see ``step_time``);
requests that join at the start of an iteration add their prefill
``(1 + eps) * (p0 + N_in / R_pre)`` each to that iteration and get their first token at its
end. After that a baseline request gains one token per iteration; a speculative (EAGLE-3-like)
request gains ``1 + j`` tokens, ``j`` being the number of leading accepted drafts
out of ``k``, each accepted independently with probability ``alpha``, which is solved so that
the mean gain ``1 + alpha + ... + alpha**k`` equals ``tau``.

Nothing here does I/O or knows about asyncio: ``router.sim.engine`` runs this model against a
clock, and calibration, routing and the tests compare measurements with the closed-loop curves
below. All durations are seconds of *model* time; a server started with ``--time-scale X``
stretches each of them by ``X``, so rates measured against it equal the model's rates divided
by ``X``.

"Per-request decode tok/s" is always what a client measures on one request:
``(output_tokens - 1) / (t_last_token - t_first_token)``. It leaves out the wait in the queue
and the prefill (those are time to first token), so it only depends on the running batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache

MS = 1e-3

# Engine settings the sims take under SGLang's flag names; each changes the iteration cost by a
# factor that is an assumption, not a fit (docs/regimes.md says where each comes from).
# A batch above --cuda-graph-max-bs runs eagerly: its fixed cost ``a`` (kernel launches, most of
# a small batch's iteration) grows by this factor. xLLM PR #713 (Qwen3-0.6B): TPOT 4.20 ms eager
# vs 2.72 ms with graphs at concurrency 1 (1.54x), 9.85 vs 9.11 ms at 30 -- a near-constant
# extra per iteration rather than a per-request one.
EAGER_FACTOR = 1.5
# SGLang's overlap scheduler hides the CPU's scheduling work behind the GPU's: "1.1x increase in
# throughput" (SGLang v0.4 release blog, 2024-12-04). An engine whose preset was measured with
# it costs this factor more per iteration under --disable-overlap-schedule. The speculative
# presets were measured without it (SGLang turned it off for EAGLE until 0.5.23 made spec v2's
# overlap the default: sg03 server_args.py:1061, 0.5.9 unless SGLANG_ENABLE_SPEC_V2), so the
# flag changes nothing there, and turning it on for them is not modelled.
NO_OVERLAP_FACTOR = 1.1


def check_tau(tau: float, k: int) -> None:
    if not 1.0 <= tau <= 1.0 + k:
        raise ValueError(f"tau must be in [1, {1 + k}] with k={k} drafts, got {tau}")


@dataclass(frozen=True)
class Preset:
    """Parameters of one engine; every duration in seconds of model time."""

    name: str
    a: float  # fixed cost per iteration
    b: float  # cost per running request per iteration
    c_kv: float  # cost per context token held, per iteration
    p0: float  # fixed prefill cost per joining request
    r_pre: float  # prefill speed, prompt tokens per second
    prefill_factor: float  # 1 + eps: the draft model also runs the prefill
    max_running: int  # more requests than this wait in the queue
    spec_k: int  # draft depth (--speculative-num-steps): at most this many accepted per iteration
    tau: float  # mean tokens per iteration per request at temperature 0
    tau_sampling: float  # the same when temperature > 0 (drafts are accepted less often)
    startup: float  # start-up time when a start-up delay is asked for
    # Past ``knee`` running requests the iteration is compute-bound: its cost grows in proportion
    # to the batch, ``(a / knee + b) * B`` (a roofline; the total rate stops growing). A verify
    # batch of many draft tokens per request gets there early (eagle3-tree). 0: never.
    knee: float = 0.0
    # Settings under SGLang's names (``spec-router sim`` flags of the same names)
    cuda_graph_max_bs: int | None = None  # batches above run eagerly; None: all captured
    disable_overlap_schedule: bool = False
    fitted_overlap: bool = True  # the overlap scheduler ran where the costs were measured
    # --speculative-eagle-topk and --speculative-num-draft-tokens (None: a chain's spec_k + 1).
    # Reported, not modelled: a preset's costs were fitted with its own draft shape.
    # (--speculative-num-steps is ``spec_k``.)
    eagle_topk: int = 1
    num_draft_tokens: int | None = None

    def __post_init__(self) -> None:
        if min(self.a, self.b, self.c_kv, self.p0) < 0 or self.r_pre <= 0:
            raise ValueError(f"{self.name}: costs must be >= 0 and r_pre > 0")
        if self.max_running < 1 or self.spec_k < 0 or self.prefill_factor <= 0:
            raise ValueError(f"{self.name}: max_running >= 1, spec_k >= 0, prefill_factor > 0")
        if self.knee < 0 or (self.cuda_graph_max_bs is not None and self.cuda_graph_max_bs < 1):
            raise ValueError(f"{self.name}: knee >= 0 and cuda_graph_max_bs >= 1")
        if self.eagle_topk < 1 or self.draft_tokens < self.spec_k + (1 if self.spec_k else 0):
            raise ValueError(
                f"{self.name}: eagle_topk >= 1 and num_draft_tokens >= spec_k + 1"
                f" (got {self.eagle_topk}, {self.draft_tokens} with spec_k={self.spec_k})"
            )
        for tau in (self.tau, self.tau_sampling):
            check_tau(tau, self.spec_k)

    def replace(self, **changes: object) -> Preset:
        """A copy with some parameters changed (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]

    def tau_for(self, temperature: float) -> float:
        return self.tau if temperature <= 0 else self.tau_sampling

    @property
    def draft_tokens(self) -> int:
        """Tokens verified per request per iteration (SGLang's speculative_num_draft_tokens,
        the root included); 0 without speculation."""
        if not self.spec_k:
            return 0
        return self.spec_k + 1 if self.num_draft_tokens is None else self.num_draft_tokens

    @property
    def overlap_schedule(self) -> bool:
        """Whether the overlap scheduler runs: as where the costs were measured, unless
        disabled."""
        return self.fitted_overlap and not self.disable_overlap_schedule


# The presets. Each is fitted to published points, cited by it; ``router.sim.fit.refit``
# reproduces each fit, and bench/sim_fidelity.py's report (bench/results/sim-fidelity.md) sets
# each curve against its points. docs/regimes.md describes the regimes. Costs not named as
# fitted (c_kv, p0, r_pre, prefill_factor, startup) are the seed's, kept for every preset.
#
# tau_sampling: no published curve gives the acceptance at temperature > 0 for these setups
# (../shared/published-spec-curves.md has none), so every speculative preset assumes the seed's
# ratio, tau_sampling / tau = 2.4 / 2.8 (an assumption, not a measurement).
SAMPLING_SHARE = 2.4 / 2.8

# The seed: one 8-GPU Kimi K2.5 INT4 deployment on SGLang (README). The baseline's b is its
# 773 tok/s asymptote; eagle3's a and b give its 80.9 tok/s per request at concurrency 1 and
# 354 tok/s total at SGLang's default cap of 48 running requests, with tau 2.8 over k=3, and
# without the overlap scheduler (SGLang's default for speculation then; the other speculative
# presets' sources, SGLang 0.4.4 and 0.5.9, ran without it too).
BASELINE = Preset(
    name="baseline",
    a=18.71 * MS,
    b=1.294 * MS,
    c_kv=20e-9,
    p0=30 * MS,
    r_pre=2500.0,
    prefill_factor=1.0,
    max_running=256,
    spec_k=0,
    tau=1.0,
    tau_sampling=1.0,
    startup=510.0,
)

EAGLE3 = Preset(
    name="eagle3",
    a=27.27 * MS,
    b=7.341 * MS,
    c_kv=20e-9,
    p0=30 * MS,
    r_pre=2500.0,
    prefill_factor=1.08,
    max_running=48,
    spec_k=3,
    tau=2.8,
    tau_sampling=2.4,  # the assumption above
    startup=550.0,
    fitted_overlap=False,
)

# A healthy chain-draft EAGLE-3 (3 steps, top-1, 4 draft tokens): the EAGLE-3 paper's SGLang
# table (arXiv 2503.01840, Table 3; SGLang 0.4.4, 1x H100, Llama-3.1-8B-Instruct, MT-Bench,
# chain of 3): x1.81, 1.82, 1.62, 1.48, 1.39, 1.32, 1.38, 1.34, 1.38 over the same SGLang
# without speculation at batch 2, 4, 8, 16, 24, 32, 48, 56, 64. Fitted: a and b, by least
# squares on that ratio (decode-bound, against the baseline preset's a and b, which stay);
# tau 2.79 fixed (EAGLE-3 K=3, Llama-3.1-8B, MT-Bench: accept length 2.79, vLLM issue #20780).
# The shape is fitted, not the paper's absolute 8B rates: like the paper, no crossover up to
# 64 (slope ratio b / (tau b_baseline) below 1). Running cap 256, as set explicitly.
EAGLE3_CHAIN = EAGLE3.replace(
    name="eagle3-chain",
    a=26.34 * MS,
    b=2.941 * MS,
    max_running=256,
    tau=2.79,
    tau_sampling=round(2.79 * SAMPLING_SHARE, 2),
)

# A wide draft tree (EAGLE-3, depth 3, top-4, 21 drafts + the root verified per request):
# SpecDecode-Bench (arXiv 2601.11580, Fig. 2, read off the chart; SGLang 0.5.9, 1x H100,
# Qwen3-8B, ShareGPT, tree k=21): x1.58 at batch 1, 1.13 at 16, 0.52 at 64, 0.49 at 128 over
# no speculation, crossing near 20. Fitted: a and b, by least squares on that ratio against
# the baseline preset, held to cross at 20. Fixed: tau 2.92 (the paper's accept length for
# k=21 on GSM8K; ShareGPT's is not given) and the compute-bound knee at 13 requests, where 22
# verified tokens per request reach the 280 batched tokens at which SpecDecode-Bench's fitted
# H100 step cost turns compute-bound. Past the crossover the model stays above the published
# ratio (docs/regimes.md says why). Running cap 256 (the paper ran batch 128).
EAGLE3_TREE = EAGLE3.replace(
    name="eagle3-tree",
    a=33.00 * MS,
    b=3.974 * MS,
    knee=13.0,
    max_running=256,
    tau=2.92,
    tau_sampling=round(2.92 * SAMPLING_SHARE, 2),
    eagle_topk=4,
    num_draft_tokens=22,
)

PRESETS: dict[str, Preset] = {p.name: p for p in (EAGLE3, EAGLE3_CHAIN, EAGLE3_TREE, BASELINE)}
# An engine regime: a speculative preset, paired with the baseline preset (docs/regimes.md)
REGIMES: tuple[str, ...] = tuple(name for name, p in PRESETS.items() if p.spec_k)


# --- one iteration -----------------------------------------------------------------------------


def step_time(p: Preset, batch: float, context_tokens: float) -> float:
    """Decode cost of one iteration with ``batch`` running requests holding ``context_tokens``:
    ``a + b*B + c_kv*K``; past the knee ``a / knee`` more per request beyond it (so that
    ``a + b*B`` becomes ``(a / knee + b) * B``); ``a`` times ``EAGER_FACTOR - 1`` more for a
    batch above ``cuda_graph_max_bs``; all times ``NO_OVERLAP_FACTOR`` when the overlap
    scheduler was turned off."""
    t = p.a + p.b * batch + p.c_kv * context_tokens
    if p.knee or p.cuda_graph_max_bs is not None:
        # A fractional batch is a mean (the closed loop's): take the stepped costs as the mean
        # over the two whole batches around it, as the engine alternates between them.
        lo = math.floor(batch)
        share = batch - lo
        t += (1 - share) * _stepped(p, lo) + (share * _stepped(p, lo + 1) if share else 0.0)
    if p.fitted_overlap and p.disable_overlap_schedule:
        t *= NO_OVERLAP_FACTOR
    return t


def _stepped(p: Preset, batch: int) -> float:
    extra = p.a / p.knee * max(0.0, batch - p.knee) if p.knee else 0.0
    if p.cuda_graph_max_bs is not None and batch > p.cuda_graph_max_bs:
        extra += (EAGER_FACTOR - 1) * p.a
    return extra


def prefill_time(p: Preset, prompt_tokens: float) -> float:
    """What one joining request adds to its join iteration."""
    return p.prefill_factor * (p.p0 + prompt_tokens / p.r_pre)


# --- speculative acceptance --------------------------------------------------------------------


def solve_alpha(tau: float, k: int) -> float:
    """Per-draft acceptance probability whose mean gain ``1 + sum(alpha**j, j=1..k)`` is tau."""
    check_tau(tau, k)
    if k == 0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):  # the mean gain is increasing in alpha; 2**-60 is below float noise
        mid = (lo + hi) / 2
        if mean_gain(mid, k) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def mean_gain(alpha: float, k: int) -> float:
    return 1.0 + sum(alpha**j for j in range(1, k + 1))


def gain_pmf(alpha: float, k: int) -> tuple[float, ...]:
    """``pmf[j]`` = probability that one iteration yields ``j + 1`` tokens."""
    return tuple(alpha**j * (1 - alpha) for j in range(k)) + (alpha**k,)


def sample_gain(alpha: float, k: int, u: float) -> int:
    """Tokens one iteration yields, from one uniform ``u`` in [0, 1) (inverse CDF).

    ``P(gain > j) = alpha**j`` (the first ``j`` drafts all accepted), so the gain is
    ``1 + #{j in 1..k : u < alpha**j}``.
    """
    gain = 1
    threshold = alpha
    while gain <= k and u < threshold:
        gain += 1
        threshold *= alpha
    return gain


@lru_cache(maxsize=4096)
def _expected_steps(tokens: int, pmf: tuple[float, ...]) -> float:
    # E[N(m)] = 1 + sum_g p_g E[N(m - g)], N(m <= 0) = 0: the last iteration is cut short.
    exact = min(tokens, 20_000)
    e = [0.0] * (exact + 1)
    for m in range(1, exact + 1):
        e[m] = 1.0 + sum(pg * e[m - g] for g, pg in enumerate(pmf, start=1) if m - g > 0)
    if tokens == exact:
        return e[exact]
    mu = sum(g * pg for g, pg in enumerate(pmf, start=1))
    return e[exact] + (tokens - exact) / mu  # renewal: the slope settles to 1/mu


def expected_steps(tokens: int, tau: float, k: int) -> float:
    """Expected iterations for a running request to gain ``tokens`` more tokens."""
    if tokens <= 0:
        return 0.0
    if k == 0:
        return float(tokens)
    return _expected_steps(tokens, gain_pmf(solve_alpha(tau, k), k))


# --- the closed loop ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadPoint:
    """Steady state of ``concurrency`` clients that each send the next request when the last
    one ends (prompt ``prompt_tokens``, exactly ``output_tokens`` generated), in model time."""

    concurrency: float
    prompt_tokens: int
    output_tokens: int
    tau: float
    iterations: float  # per request, the join iteration included
    batch: float  # mean running requests per iteration
    joins: float  # mean requests joining per iteration
    iteration_time: float  # mean iteration duration
    decode_iteration_time: float  # mean duration of the iterations one request decodes in
    per_request_tps: float  # (output_tokens - 1) / (t_last - t_first) of one request
    total_tps: float  # output tokens per second, all requests
    client_tps: float  # output tokens per second seen by one client, queueing included
    ttft: float = field(default=0.0)  # rough: see closed_loop()


def closed_loop(
    p: Preset,
    n: float,
    prompt_tokens: int,
    output_tokens: int,
    *,
    temperature: float = 0.0,
    tau: float | None = None,
) -> LoadPoint:
    """The steady state of a closed loop of ``n`` clients against one engine.

    Derivation (``L`` = output tokens, ``D`` = expected decode iterations for ``L - 1`` tokens
    with the last one cut short, ``I = 1 + D`` iterations per request):

    * ``n <= max_running``: a finished client's next request arrives during the following
      iteration and joins at the boundary after it, so each client sits out ``g = 1`` iteration
      per request (``g = 0`` for one client: the engine is idle and starts at once). A cycle is
      ``I + g`` iterations; the mean batch is ``n I / (I + g)``, joins ``n / (I + g)``.
    * ``n > max_running``: the queue refills every free slot at the next boundary, so the batch
      stays at ``M = max_running`` and ``M / I`` requests join per iteration.

    A decoding request sees itself plus the others, and only the others' prefills:
    ``B_dec = 1 + (n - 1) I / (I + g)`` and ``J_dec = (n - 1) / (I + g)`` (``M`` and
    ``(M - 1) / I`` when queueing). Then ``per_request_tps = (L - 1) / (D * T_dec)`` and
    ``total_tps = n L / ((I + g) * T)`` (``M L / (I T)``). ``ttft`` is a rough estimate (the
    wait for the boundary, the queue, and the join iteration), not a fitted quantity.
    """
    if n < 1:
        raise ValueError(f"concurrency must be >= 1, got {n}")
    if output_tokens < 2:
        raise ValueError("output_tokens must be >= 2: a decode speed needs two tokens")
    if prompt_tokens < 0:
        raise ValueError("prompt_tokens must be >= 0")
    tau = p.tau_for(temperature) if tau is None else tau
    length = output_tokens
    decode = expected_steps(length - 1, tau, p.spec_k)
    iters = 1.0 + decode
    t_pre = prefill_time(p, prompt_tokens)
    # Mean tokens a request holds over its iterations: the prompt, plus on average about half
    # of what it generates (none in the join iteration).
    per_iter = (length - 1) / decode
    context = prompt_tokens + decode * (1 + (length - 1 - per_iter) / 2) / iters
    m = p.max_running
    if n <= m:
        gap = min(1.0, n - 1.0)
        cycle = iters + gap
        batch, joins = n * iters / cycle, n / cycle
        batch_dec, joins_dec = 1 + (n - 1) * iters / cycle, (n - 1) / cycle
        queue_wait = 0.0
    else:
        gap, cycle = 0.0, iters
        batch, joins = float(m), m / iters
        batch_dec, joins_dec = float(m), (m - 1) / iters
        queue_wait = (n - m) * iters / m  # iterations until a slot frees up for us
    t_iter = step_time(p, batch, batch * context) + joins * t_pre
    t_dec = step_time(p, batch_dec, batch_dec * context) + joins_dec * t_pre
    served = min(n, m)
    total = served * length / (cycle * t_iter)
    t_join = step_time(p, batch_dec, batch_dec * context) + t_pre + joins_dec * t_pre
    return LoadPoint(
        concurrency=n,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        tau=tau,
        iterations=iters,
        batch=batch,
        joins=joins,
        iteration_time=t_iter,
        decode_iteration_time=t_dec,
        per_request_tps=(length - 1) / (decode * t_dec),
        total_tps=total,
        client_tps=total / n,
        ttft=(gap + queue_wait) * t_iter + t_join,
    )


def per_request_tps(p: Preset, n: float, prompt_tokens: int, output_tokens: int) -> float:
    """Decode tok/s of one request with ``n`` concurrent clients (temperature 0)."""
    return closed_loop(p, n, prompt_tokens, output_tokens).per_request_tps


def total_tps(p: Preset, n: float, prompt_tokens: int, output_tokens: int) -> float:
    """Output tok/s of the whole engine with ``n`` concurrent clients (temperature 0)."""
    return closed_loop(p, n, prompt_tokens, output_tokens).total_tps


def curve(
    p: Preset, concurrencies: Iterable[float], prompt_tokens: int, output_tokens: int
) -> list[LoadPoint]:
    return [closed_loop(p, n, prompt_tokens, output_tokens) for n in concurrencies]


def decode_bound_tps(p: Preset, n: float) -> tuple[float, float]:
    """(per-request, total) tok/s with no prefill, no context cost and no re-join gap: the
    numbers the presets were fitted to (eagle3: 80.9 at n=1, 354 at saturation)."""
    batch = min(n, p.max_running)
    t = step_time(p, batch, 0)
    return p.tau / t, batch * p.tau / t


def crossover(
    fast: Preset,
    slow: Preset,
    prompt_tokens: int | None,
    output_tokens: int | None,
    *,
    metric: str = "per_request",
    hi: float | None = None,
) -> float | None:
    """First concurrency at which ``fast`` (the speculative engine) stops being faster.

    ``metric`` is ``"per_request"`` (decode tok/s of one request) or ``"client"`` (tok/s one
    client gets, queueing included). Scans ``n`` from 1 to ``hi`` (default: the larger
    ``max_running``) and bisects the first sign change of ``fast - slow`` on real ``n``;
    ``None`` if there is none. With ``prompt_tokens`` and ``output_tokens`` both ``None`` it
    uses the decode-bound rates.

    Beyond ``fast.max_running`` the per-request decode speed of ``fast`` stops falling (the
    extra requests wait in its queue, which is time to first token), so the per-request curves
    can cross a second time; a router deciding there should compare ``"client"`` rates.
    """
    if metric not in ("per_request", "client"):
        raise ValueError(f"metric must be 'per_request' or 'client', got {metric!r}")

    def rate(q: Preset, n: float) -> float:
        if prompt_tokens is None or output_tokens is None:
            per, total = decode_bound_tps(q, n)
            return per if metric == "per_request" else total / n
        point = closed_loop(q, n, prompt_tokens, output_tokens)
        return point.per_request_tps if metric == "per_request" else point.client_tps

    def diff(n: float) -> float:
        return rate(fast, n) - rate(slow, n)

    top = float(max(fast.max_running, slow.max_running)) if hi is None else hi
    lo = 1.0
    if diff(lo) <= 0:
        return None
    hi_ = lo
    while diff(hi_) > 0:
        lo = hi_
        hi_ = min(top, hi_ + 0.5)
        if lo >= top:
            return None
    for _ in range(60):
        mid = (lo + hi_) / 2
        if diff(mid) > 0:
            lo = mid
        else:
            hi_ = mid
        if hi_ - lo < 1e-9:
            break
    return (lo + hi_) / 2
