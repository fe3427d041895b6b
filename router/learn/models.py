"""What the router learns of its engines beyond the decode curves, for the ``slo`` policy. Pure.

- ``PrefillFit``: prefill seconds against prompt tokens, a decayed weighted least-squares line,
  from the time to first token of requests sent to an idle engine, less one iteration;
- ``Ewma``: decayed means, for the output length of recent requests, the share of them at
  temperature > 0, and the tokens per character of prompts (to size a prompt from its text
  before the engine has counted it);
- tokens per iteration of greedy and sampled requests on the speculative pool: the engine's
  reported acceptance length (a mix of both classes), split by the ratio calibration measured
  between them (drafts are accepted less often at temperature > 0);
- ``build_model``: a ``PoolModel`` (``router.decide.predict``) from all of that.

Durations are model time (see ``router.decide.table.Table.time_scale``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple

from router.decide.predict import PoolModel, peak_throughput
from router.decide.table import PoolCurve, Table, Workload
from router.learn.learner import PoolLearner, _Bin
from router.pools import POOLS, SPECULATIVE, Pool

# Largest batch size a model tabulates; past it ``PoolModel.iteration`` extends linearly.
TABLE_LIMIT = 256
# The sims' prefill (30 ms + 2,500 tokens/s): a start for an engine nothing was measured on.
DEFAULT_PREFILL = (0.03, 1 / 2500)
# Characters per token of English text for common tokenizers (OpenAI's rule of thumb).
DEFAULT_TOKENS_PER_CHAR = 0.25
# The spread (sigma of their logarithm) assumed of output lengths before any was seen: about
# the Azure traces' (conversation 0.9, code 1.2).
DEFAULT_OUTPUT_SPREAD = 1.0
# Decode iterations a request must span to count as a whole sample of its concurrency's
# iteration time; shorter ones count in proportion.
FULL_SAMPLE = 16.0


class Sample(NamedTuple):
    """One finished request, as the slo models learn from it (durations in model time)."""

    pool: Pool
    concurrency: float  # mean requests in flight on its backend while it decoded
    spt: float  # seconds per output token after the first (0: not a usable decode sample)
    ttft: float
    sampling: bool
    prompt_tokens: int  # as the engine counted them (usage)
    prompt_chars: int  # as the router sized the prompt from its body
    output_tokens: int
    load_at_start: int  # requests in flight on its backend when it was routed
    prefill_share: float  # the backend's prefill share when it was routed
    # prefill time of the requests sent to its backend while it decoded (their stalls)
    stall: float = 0.0
    # requests sent to its backend after it and before its first token (joined its prefill)
    joined: int = 0


@dataclass(slots=True)
class Ewma:
    """A decayed mean that starts at ``value`` with the weight of ``prior`` samples."""

    value: float
    weight: float = 1.0
    keep: float = 0.98
    samples: int = 0

    def add(self, x: float) -> None:
        if not math.isfinite(x):
            return
        self.weight = self.weight * self.keep + 1.0
        self.value += (x - self.value) / self.weight
        self.samples += 1


@dataclass(slots=True)
class PrefillFit:
    """``seconds = base + tokens * per_token``, refitted as samples arrive."""

    base: float = DEFAULT_PREFILL[0]
    per_token: float = DEFAULT_PREFILL[1]
    keep: float = 0.995
    prior: float = 5.0  # the seed line counts as this many samples at two prompt sizes
    samples: int = 0
    _sw: float = 0.0
    _sx: float = 0.0
    _sy: float = 0.0
    _sxx: float = 0.0
    _sxy: float = 0.0

    def __post_init__(self) -> None:
        # the seed, as pseudo-samples at 100 and 2,000 tokens
        for x in (100.0, 2000.0):
            self._put(x, self.base + x * self.per_token, self.prior / 2, keep=1.0)

    def _put(self, x: float, y: float, w: float, keep: float) -> None:
        self._sw = self._sw * keep + w
        self._sx = self._sx * keep + w * x
        self._sy = self._sy * keep + w * y
        self._sxx = self._sxx * keep + w * x * x
        self._sxy = self._sxy * keep + w * x * y

    def add(self, tokens: float, seconds: float, weight: float = 1.0) -> None:
        if not (math.isfinite(seconds) and tokens >= 0 and seconds > 0 and weight > 0):
            return
        self._put(tokens, seconds, weight, self.keep)
        self.samples += 1
        sw = self._sw
        mx, my = self._sx / sw, self._sy / sw
        var = self._sxx / sw - mx * mx
        if var <= 1e-9:
            return
        slope = (self._sxy / sw - mx * my) / var
        slope = max(0.0, slope)
        self.per_token = slope
        self.base = max(0.0, my - slope * mx)

    def seconds(self, tokens: float) -> float:
        return self.base + tokens * self.per_token


def build_model(
    spi: tuple[float, ...],
    tau_greedy: float,
    tau_sampling: float,
    prefill: PrefillFit,
    measured: int,
    scale: float,
    cap: int | None = None,
    lowest: int = 1,
) -> PoolModel:
    model = PoolModel(
        spi,
        tau_greedy=max(1.0, tau_greedy),
        tau_sampling=max(1.0, tau_sampling),
        prefill_base=prefill.base,
        prefill_per_token=prefill.per_token,
        cap=cap,
        measured=measured,
        lowest=max(1, lowest),
        scale=scale,
    )
    return model._replace(peak=peak_throughput(model))


def decode_only_spi(spi: float, n: int, output_tokens: int, tau: float, prefill: float) -> float:
    """Seconds per iteration at concurrency ``n`` with the prefill stalls of a closed loop taken
    out: a calibration point measured ``n`` clients that each send the next request when the last
    ends, so about ``(n - 1) / (I + 1)`` requests joined per iteration (``I`` iterations per
    request), each stalling the batch for its prefill (``router.sim.model.closed_loop``)."""
    iters = 1.0 + max(1, output_tokens - 1) / tau
    joins = (n - 1) / (iters + 1.0)
    return max(spi * 0.1, spi - joins * prefill)


class EngineModels:
    """The ``slo`` policy's knowledge of both pools, kept current from served requests.

    ``curves`` (``router.learn.learner``) hold decode speed as measured, prefill stalls
    included; here the decode-only iteration time is kept apart from the prefill, because the
    policy adds the stalls of the traffic it actually sees.
    """

    def __init__(
        self, table: Table | None, decay: float = 0.99, prior_weight: float = 10.0
    ) -> None:
        self.decay = decay
        self.pure = {pool: PoolLearner(decay) for pool in POOLS}
        self.prefill = {pool: PrefillFit() for pool in POOLS}
        # tokens per iteration by class (greedy, sampling), and sampling's share of greedy's
        self.tau = {False: 1.0, True: 1.0}
        self.ratio: float | None = None
        # whether ``tau`` is the engine's (a table's or a reading) or a placeholder 1.0
        self.tau_known = False
        self.sampling_share = Ewma(0.5, weight=1.0)  # of the speculative pool's requests
        self.mean_output = Ewma(200.0, weight=1.0)
        # the spread of output lengths: the decayed mean of log(tokens) and of its square
        self.log_output = Ewma(math.log(200.0), weight=1.0)
        self.log_output_sq = Ewma(math.log(200.0) ** 2 + DEFAULT_OUTPUT_SPREAD**2, weight=1.0)
        self.tokens_per_char = Ewma(DEFAULT_TOKENS_PER_CHAR, weight=1.0, keep=0.995)
        self.time_scale = 1.0
        self.caps: dict[Pool, int | None] = dict.fromkeys(POOLS)
        self.seeded = False
        self._table = table  # kept to seed the speculative pool again (``observe_accept``)
        self._prior_weight = prior_weight
        if table is not None:
            self._seed(table)

    def _seed(self, table: Table) -> None:
        self.time_scale = table.time_scale
        w = table.workload
        fit = table.speculative.fit
        tau = fit.tau if fit is not None else 1.0
        sampling = fit.tau_sampling if fit is not None and fit.tau_sampling else None
        self.tau = {False: tau, True: sampling or tau}
        self.tau_known = tau > 1.0
        self.ratio = sampling / tau if sampling else None
        if w.output_tokens:
            self.mean_output = Ewma(float(w.output_tokens), weight=1.0)
            log = math.log(w.output_tokens)
            self.log_output = Ewma(log, weight=1.0)
            self.log_output_sq = Ewma(log * log + DEFAULT_OUTPUT_SPREAD**2, weight=1.0)
        for pool in POOLS:
            self._seed_pool(pool, table.pool(pool), w, tau if pool == SPECULATIVE else 1.0)

    def _seed_pool(self, pool: Pool, curve: PoolCurve, w: Workload, ptau: float) -> None:
        """A pool's prefill line and decode-only iterations from its calibrated points, measured
        at ``ptau`` tokens per iteration."""
        self.caps[pool] = curve.cap
        points = [p for p in curve.points if p.decode_tps_p50 > 0]
        if curve.prefill is not None:
            self.prefill[pool] = PrefillFit(curve.prefill.base, curve.prefill.per_token)
        elif points and points[0].concurrency == 1 and w.prompt_tokens:
            # one prompt length: the time to first token alone, less its join iteration
            first = points[0]
            seconds = max(1e-4, first.ttft_p50 - ptau / first.decode_tps_p50)
            base = min(DEFAULT_PREFILL[0], seconds / 2)
            self.prefill[pool] = PrefillFit(base, (seconds - base) / w.prompt_tokens)
        stall = self.prefill[pool].seconds(w.prompt_tokens or 0)
        for p in points:
            spi = decode_only_spi(
                ptau / p.decode_tps_p50, p.concurrency, w.output_tokens or 200, ptau, stall
            )
            weight = min(float(max(1, p.samples)), self._prior_weight)
            self.pure[pool].bins[p.concurrency] = _Bin(weight, p.samples, spi)
            self.seeded = True

    # -- input ----------------------------------------------------------------------------------
    def record(self, sample: Sample) -> None:
        """One finished request (model time): its traffic, then its curves."""
        s = sample
        self.record_traffic(s.pool, s.sampling, s.prompt_tokens, s.prompt_chars, s.output_tokens)
        self.record_curves(s)

    def record_traffic(
        self, pool: Pool, sampling: bool, prompt_tokens: int, prompt_chars: int, output_tokens: int
    ) -> None:
        """One finished request's part in the traffic averages (a few ``Ewma.add``: what
        routing reads per request, ``Keeper.traffic``, kept current by the keeper at once)."""
        if prompt_chars > 0 and prompt_tokens > 0:
            self.tokens_per_char.add(prompt_tokens / prompt_chars)
        if output_tokens > 0:
            self.mean_output.add(float(output_tokens))
            log = math.log(output_tokens)
            self.log_output.add(log)
            self.log_output_sq.add(log * log)
        if pool == SPECULATIVE:
            self.sampling_share.add(float(sampling))

    def record_curves(self, sample: Sample) -> None:
        """One finished request's part in the pools' curves (``record_traffic`` is the rest)."""
        s = sample
        spec = s.pool == SPECULATIVE
        if not (s.spt > 0 and math.isfinite(s.spt) and s.concurrency >= 1 and s.output_tokens >= 2):
            return
        # Its decode, less the prefills that stalled it, over the iterations it took: the
        # decode-only iteration time at its mean concurrency. (A decode that was mostly stalls
        # says little about the decode itself.)
        decode = s.spt * (s.output_tokens - 1)
        if s.stall >= 0.8 * decode:
            return
        tau = self.tau_of(s.sampling) if spec else 1.0
        iterations = (s.output_tokens - 1) / tau
        spi = (decode - max(0.0, s.stall)) / iterations
        # a short decode is a few iterations, any of which one unseen stall can double (the
        # first of a burst, whose followers' prefills run between its few tokens): worth less
        weight = min(1.0, iterations / FULL_SAMPLE)
        self.pure[s.pool].add(s.concurrency, spi, s.ttft, s.ttft, weight)
        if s.prompt_tokens > 0 and s.load_at_start == s.joined == 0:
            # Sent to an idle engine, it started at once, alone: its time to first token is its
            # prefill and one iteration. (Under load it also waits for the iteration boundary
            # and shares its join iteration with other joiners' prefills, which would read as
            # a prefill many times too long; so does the first of a burst, which the others
            # join before its first token.) The curve is built only then: it runs per request.
            curve = self.pure[s.pool].curve(1.0)
            if curve is not None:
                self.prefill[s.pool].add(s.prompt_tokens, s.ttft - curve.spi(1.0))

    def observe_accept(self, tau: float | None) -> None:
        """The speculative engines' reported acceptance length: tokens per verify step over
        both classes of their requests, split by the calibrated ratio between the classes."""
        if tau is None or not math.isfinite(tau) or tau < 1.0:
            return
        ratio = self.ratio or 1.0
        share = min(1.0, max(0.0, self.sampling_share.value))
        greedy = tau / (1.0 - share + share * ratio)
        if not self.tau_known and greedy > 1.0:
            # The first reading where the table had none (one of 1.0 is no reading of a
            # speculative engine): what was seeded and learned so far took one iteration for one
            # token (``Learner.observe_accept``). The table's points are seeded again at it (the
            # iterations, and the prefill line when it came from the time to first token);
            # without a table the few requests learned before it are rescaled.
            if self._table is not None:
                learned = self.prefill[SPECULATIVE]
                self._seed_pool(SPECULATIVE, self._table.speculative, self._table.workload, greedy)
                if learned.samples:
                    self.prefill[SPECULATIVE] = learned
            else:
                for b in self.pure[SPECULATIVE].bins.values():
                    b.spi *= greedy / self.tau[False]
            self.tau_known = True
        self.tau = {False: max(1.0, greedy), True: max(1.0, greedy * ratio)}

    # -- output ---------------------------------------------------------------------------------
    def output_spread(self) -> float:
        """The sigma of log(output tokens) of recent requests (their lognormal spread)."""
        mean = self.log_output.value
        return math.sqrt(max(0.0, self.log_output_sq.value - mean * mean))

    def tau_of(self, sampling: bool) -> float:
        return self.tau[sampling]

    def models(self) -> dict[Pool, PoolModel] | None:
        out = {}
        for pool in POOLS:
            learner = self.pure[pool]
            curve = learner.curve(1.0)
            if curve is None:
                return None
            # never cheaper with more running (noise in a bin must not promise free capacity)
            spi = tuple(itertools.accumulate(
                (curve.spi(float(max(1, b))) for b in range(TABLE_LIMIT + 1)), max))  # fmt: skip
            spec = pool == SPECULATIVE
            out[pool] = build_model(
                spi,
                self.tau_of(False) if spec else 1.0,
                self.tau_of(True) if spec else 1.0,
                self.prefill[pool],
                max(learner.bins),
                self.time_scale,
                self.caps[pool],
                min(learner.bins),
            )
        return out
